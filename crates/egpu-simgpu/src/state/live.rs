//! Process liveness that survives pid reuse: a pid plus its start time
//! (field 22 of `/proc/<pid>/stat`, clock ticks since boot).

/// Start time of `pid`, or `None` if it does not exist or `/proc` says nothing.
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may contain spaces or
    // ')' itself: fields after it start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    // rest starts with " <state> <ppid> ..."; state is field 3, starttime 22.
    rest.split_ascii_whitespace().nth(22 - 3)?.parse().ok()
}

/// Whether a process with this pid exists (zombies count as existing until
/// reaped, but their start time still matches; see [`is_alive`]).
fn pid_exists(pid: u32) -> bool {
    if pid == 0 || pid > i32::MAX as u32 {
        return false;
    }
    // SAFETY: kill with signal 0 only checks for existence/permission; it
    // sends nothing and has no memory-safety preconditions.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Whether the process `pid` that started at `start` (0 = unknown) is alive.
/// A zombie (exited, not yet reaped) counts as dead.
pub fn is_alive(pid: u32, start: u64) -> bool {
    if !pid_exists(pid) {
        return false;
    }
    if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        && let Some(i) = stat.rfind(')')
        && stat[i + 1..].trim_start().starts_with(['Z', 'X'])
    {
        return false;
    }
    match (start, start_time(pid)) {
        (0, _) | (_, None) => true,
        (s, Some(now)) => s == now,
    }
}

/// This process's pid.
pub fn my_pid() -> u32 {
    std::process::id()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_is_alive_and_start_time_matters() {
        let me = my_pid();
        let st = start_time(me).expect("/proc/self/stat");
        assert!(is_alive(me, st));
        assert!(is_alive(me, 0));
        assert!(!is_alive(me, st + 12345), "a different start time is a reused pid");
    }

    #[test]
    fn reaped_child_is_dead() {
        let mut c = std::process::Command::new("true").spawn().unwrap();
        let pid = c.id();
        c.wait().unwrap();
        assert!(!is_alive(pid, 0) || start_time(pid).is_some(), "pid was reused immediately");
        assert!(!is_alive(0, 0));
    }

    #[test]
    fn zombie_is_dead() {
        let mut c = std::process::Command::new("true").spawn().unwrap();
        let pid = c.id();
        // Wait until it has exited but do not reap it.
        loop {
            let mut info: libc::siginfo_t = unsafe_zeroed();
            // SAFETY: waitid writes into `info`, a valid siginfo_t; WNOWAIT
            // leaves the child as a zombie.
            let r = unsafe { libc::waitid(libc::P_PID, pid, &mut info, libc::WEXITED | libc::WNOWAIT) };
            if r == 0 {
                break;
            }
        }
        assert!(!is_alive(pid, 0));
        c.wait().unwrap();
    }

    fn unsafe_zeroed() -> libc::siginfo_t {
        // SAFETY: siginfo_t is plain old data; all-zero is a valid value.
        unsafe { std::mem::zeroed() }
    }
}
