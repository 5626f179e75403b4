//! Identity of a process across pid reuse and reboots: pid plus start time
//! from `/proc`, and the boot's id.

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

/// This boot's id (`/proc/sys/kernel/random/boot_id`), if the kernel says.
pub fn boot_id() -> Option<String> {
    static ID: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    ID.get_or_init(|| std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty())).clone()
}

/// The owner record of a live process.
pub fn owner_of(pid: u32) -> Option<Owner> {
    start_ticks(pid).map(|start_ticks| Owner { pid, start_ticks, boot_id: boot_id() })
}

/// Whether the process `owner` describes still runs: same boot (when the
/// record and the kernel both say), same pid, same start time.
pub fn is_alive(owner: &Owner) -> bool {
    if let (Some(then), Some(now)) = (&owner.boot_id, boot_id())
        && then != &now
    {
        return false;
    }
    start_ticks(owner.pid) == Some(owner.start_ticks)
}

fn pid_ns(pid: u32) -> Option<std::path::PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok()
}

/// The last `NSpid:` entry of `/proc/<pid>/status`: the pid as the process's
/// own pid namespace sees it.
fn innermost_pid(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("NSpid:"))?.split_whitespace().last()?.parse().ok()
}

/// Why a caller's pid could not be translated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TranslateError {
    #[error("the caller is in a pid namespace egpud cannot see (egpud runs in a container of its own?), so its pids mean nothing here: run egpud in the host's pid namespace, or the CLI in egpud's")]
    CallerInvisible,
    #[error("no process of the caller's pid namespace has that pid (a process in a namespace nested inside the caller's is not looked for)")]
    NoSuchProcess,
}

/// `pid` as the API caller `peer` (its pid in egpud's namespace, from
/// `SO_PEERCRED`: `Some(0)` when egpud cannot see the caller) sees it,
/// translated into egpud's pid namespace: the CLI in a container sends its
/// own pid, or its child's, as its namespace numbers them. Unchanged when
/// the caller shares egpud's namespace, or when nothing tells (no peer
/// credentials; `/proc` not readable, e.g. `hidepid`, logged). Only the
/// caller's own namespace is searched, not namespaces nested inside it.
pub fn translate(peer: Option<u32>, pid: u32) -> Result<u32, TranslateError> {
    let Some(peer) = peer else { return Ok(pid) };
    if peer == 0 {
        return Err(TranslateError::CallerInvisible);
    }
    let (Some(theirs), Some(ours)) = (pid_ns(peer), pid_ns(std::process::id())) else {
        tracing::warn!(peer, pid, "cannot read the caller's pid namespace in /proc; taking its pid as egpud's");
        return Ok(pid);
    };
    if theirs == ours {
        return Ok(pid);
    }
    if innermost_pid(peer) == Some(pid) {
        return Ok(peer);
    }
    let procs = std::fs::read_dir("/proc").map_err(|_| TranslateError::NoSuchProcess)?;
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .find(|&p| innermost_pid(p) == Some(pid) && pid_ns(p).as_ref() == Some(&theirs))
        .ok_or(TranslateError::NoSuchProcess)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pids_from_a_caller_in_another_pid_namespace_are_translated() {
        let me = std::process::id();
        assert_eq!(translate(Some(me), 4242), Ok(4242), "same namespace: unchanged");
        assert_eq!(translate(None, 4242), Ok(4242));
        assert_eq!(translate(Some(0), 4242), Err(TranslateError::CallerInvisible));
        let probe = std::process::Command::new("unshare").args(["-Urp", "--fork", "true"]).output();
        if !probe.as_ref().is_ok_and(|o| o.status.success()) {
            eprintln!("skipped the namespace half: `unshare -Urp --fork` does not work here: {probe:?}");
            return;
        }
        // unshare (our namespace) forks the caller, pid 1 of a new
        // namespace, which runs a child of its own (pid 2 there).
        let mut u = std::process::Command::new("unshare")
            .args(["-Urp", "--fork", "sh", "-c", "sleep 30 & wait"])
            .spawn()
            .unwrap();
        let children = |p: u32| -> Vec<u32> {
            std::fs::read_to_string(format!("/proc/{p}/task/{p}/children")).unwrap_or_default().split_whitespace().filter_map(|s| s.parse().ok()).collect()
        };
        let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let (caller, sleeper) = loop {
            if let Some(&c) = children(u.id()).first()
                && let Some(&s) = children(c).first()
            {
                break (c, s);
            }
            assert!(std::time::Instant::now() < end, "the namespace's processes did not start");
            std::thread::yield_now();
        };
        assert_eq!(translate(Some(caller), 1), Ok(caller), "the caller's own pid");
        assert_eq!(translate(Some(caller), 2), Ok(sleeper), "another process of its namespace");
        assert_eq!(translate(Some(caller), 3), Err(TranslateError::NoSuchProcess), "no such process there");
        // SIGKILL to a namespace's pid 1 ends every process in it.
        let _ = std::process::Command::new("kill").args(["-9", &caller.to_string()]).status();
        u.wait().unwrap();
    }

    #[test]
    fn self_is_alive_and_changed_start_is_not() {
        let me = owner_of(std::process::id()).unwrap();
        assert!(is_alive(&me));
        assert!(!is_alive(&Owner { start_ticks: me.start_ticks + 1, ..me.clone() }));
        // Another boot: the same pid and start time are another process.
        assert!(!is_alive(&Owner { boot_id: Some("another-boot".into()), ..me.clone() }));
        // A record from before boot ids were kept: pid and start time decide.
        assert!(is_alive(&Owner { boot_id: None, ..me }));
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
