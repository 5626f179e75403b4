//! Identity of a process across pid reuse: pid plus start time from `/proc`.

use crate::store::Owner;

/// Start time of `pid` in clock ticks since boot, or `None` if no such process
/// runs (a zombie, exited but not yet reaped, counts as none).
pub fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses: parse after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    // rest starts with field 3 (state); starttime is field 22.
    let mut fields = rest.split_whitespace();
    if matches!(fields.next()?, "Z" | "X") {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

/// The owner record of a live process.
pub fn owner_of(pid: u32) -> Option<Owner> {
    start_ticks(pid).map(|start_ticks| Owner { pid, start_ticks })
}

/// Whether the process `owner` describes still runs (same pid, same start time).
pub fn is_alive(owner: &Owner) -> bool {
    start_ticks(owner.pid) == Some(owner.start_ticks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_is_alive_and_changed_start_is_not() {
        let me = owner_of(std::process::id()).unwrap();
        assert!(is_alive(&me));
        assert!(!is_alive(&Owner { start_ticks: me.start_ticks + 1, ..me }));
        assert!(owner_of(u32::MAX - 1).is_none());
    }

    #[test]
    fn an_unreaped_zombie_is_not_alive() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        // Not reaped yet: the process stays a zombie until wait() below.
        let zombie = || std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.rsplit(')').next().is_some_and(|r| r.trim_start().starts_with('Z')));
        let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !zombie() && std::time::Instant::now() < end {
            std::thread::yield_now();
        }
        assert!(zombie(), "child did not become a zombie");
        assert_eq!(start_ticks(pid), None);
        child.wait().unwrap();
    }
}
