//! `cargo +nightly fuzz run fuzz_trace_usage`: the genai-2026 usage loader
//! (gzip or plain CSV) and the minute alignment must never panic.
#![no_main]
use egpu_sim::elastic::load;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = load::maybe_gunzip("fuzz", data) else { return };
    if let Ok((rows, _)) = load::parse_metric("fuzz", &text, true) {
        let _ = load::align(&rows, &rows);
    }
});
