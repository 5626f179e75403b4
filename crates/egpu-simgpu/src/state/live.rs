//! Process liveness. Slots: [`SlotLocks`], which works across pid
//! namespaces. IPC handles (same namespace only, as they open
//! `/proc/<pid>/fd`): a pid plus its start time (field 22 of
//! `/proc/<pid>/stat`, clock ticks since boot), which survives pid reuse.

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

/// Slot liveness that works across pid namespaces (a container's processes
/// and the host's share one state file): a process holds an open file
/// description lock (`F_OFD_SETLK`) on one byte per slot it owns, at
/// [`LOCK_BASE`] + slot, past the end of the state file. The kernel drops
/// the lock when the process dies, however it dies, so "nobody else holds
/// the byte" means "the owner is gone", whatever pid the owner had and
/// whichever namespace the sweeper sees pids in. A forked child shares its
/// parent's description until it attaches (then it closes it): until then
/// the parent's slot counts as live.
pub struct SlotLocks {
    fd: std::sync::atomic::AtomicI32,
    /// The slots this description holds (a sweep must skip them: a lock never
    /// conflicts with its own description).
    held: std::sync::Mutex<Vec<usize>>,
}

impl Drop for SlotLocks {
    fn drop(&mut self) {
        self.close();
    }
}

/// Offset of slot 0's lock byte: the end of the state file.
pub const LOCK_BASE: i64 = super::STATE_SIZE as i64;

impl SlotLocks {
    /// Opens a new description of the state file at `path`.
    pub fn open(path: &std::path::Path) -> Result<SlotLocks, String> {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| format!("{}: path contains a NUL byte", path.display()))?;
        // SAFETY: c is a NUL-terminated path.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(format!("cannot open simulated-GPU state {} for its slot locks: {}", path.display(), std::io::Error::last_os_error()));
        }
        Ok(SlotLocks { fd: fd.into(), held: std::sync::Mutex::new(Vec::new()) })
    }

    fn lock(&self, slot: usize, kind: libc::c_short) -> bool {
        let fd = self.fd.load(std::sync::atomic::Ordering::SeqCst);
        if fd < 0 {
            return false;
        }
        // SAFETY: all-zero is a valid flock.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = kind;
        fl.l_whence = libc::SEEK_SET as libc::c_short;
        fl.l_start = LOCK_BASE + slot as i64;
        fl.l_len = 1;
        // SAFETY: fd is open (or closed, and fcntl fails with EBADF); fl is a valid flock.
        unsafe { libc::fcntl(fd, libc::F_OFD_SETLK, &mut fl) == 0 }
    }

    /// Takes slot `slot`'s byte; false when another description holds it (its
    /// owner is alive).
    pub fn hold(&self, slot: usize) -> bool {
        if !self.lock(slot, libc::F_WRLCK as libc::c_short) {
            return false;
        }
        let mut h = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if !h.contains(&slot) {
            h.push(slot);
        }
        true
    }

    /// Gives slot `slot`'s byte back.
    pub fn release(&self, slot: usize) {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).retain(|&s| s != slot);
        self.lock(slot, libc::F_UNLCK as libc::c_short);
    }

    /// Whether this description holds slot `slot`.
    pub fn holds(&self, slot: usize) -> bool {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).contains(&slot)
    }

    /// Closes this process's reference to the description (a fork child
    /// drops its parent's; the parent keeps its locks).
    pub fn close(&self) {
        let fd = self.fd.swap(-1, std::sync::atomic::Ordering::SeqCst);
        if fd >= 0 {
            // SAFETY: fd was ours and is closed once (swapped out above).
            unsafe { libc::close(fd) };
        }
    }
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
