//! JSON-lines output: one object per event, flushed at once so a test can
//! react to it (e.g. `holding`) while the probe waits.

use std::io::Write;

pub fn emit(v: serde_json::Value) {
    let mut o = std::io::stdout().lock();
    let _ = writeln!(o, "{v}");
    let _ = o.flush();
}
