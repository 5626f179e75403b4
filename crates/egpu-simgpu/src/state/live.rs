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
/// whichever namespace the sweeper sees pids in. A forked child closes its
/// inherited reference at fork (`pthread_atfork`), so a dead parent's slot
/// is not kept alive by its children.
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

/// Every live [`SlotLocks`] descriptor of this process, closed in a fork
/// child (see [`SlotLocks::from_fd`]).
static ALL_FDS: std::sync::Mutex<Vec<i32>> = std::sync::Mutex::new(Vec::new());
static ATFORK: std::sync::Once = std::sync::Once::new();

extern "C" fn close_inherited_locks() {
    // In the fork child, before anything else runs: the parent's lock
    // descriptions stay the parent's. try_lock: another thread may have held
    // the mutex at fork; then the fds stay open in the child, and the
    // parent's slots count as live for as long as the child lives.
    if let Ok(mut fds) = ALL_FDS.try_lock() {
        for fd in fds.drain(..) {
            // SAFETY: fd was one of ours at fork; close is async-signal-safe.
            unsafe { libc::close(fd) };
        }
    }
}

impl SlotLocks {
    /// Takes over `fd`, a read-write descriptor of the state file that no
    /// mapping uses, as this process's lock description. Fails when the file
    /// system has no open-file-description locks.
    fn from_fd(fd: i32, path: &std::path::Path) -> Result<SlotLocks, String> {
        ATFORK.call_once(|| {
            // SAFETY: registers a plain extern "C" handler; no other precondition.
            unsafe { libc::pthread_atfork(None, None, Some(close_inherited_locks)) };
        });
        ALL_FDS.lock().unwrap_or_else(|e| e.into_inner()).push(fd);
        let l = SlotLocks { fd: fd.into(), held: std::sync::Mutex::new(Vec::new()) };
        // A probe byte past every slot's: locks must work here at all.
        let probe = super::MAX_SLOTS;
        match l.lock(probe, libc::F_WRLCK as libc::c_short) {
            Ok(_) => {
                let _ = l.lock(probe, libc::F_UNLCK as libc::c_short);
                Ok(l)
            }
            Err(e) => Err(format!("simulated-GPU state {}: its file system has no open-file-description locks (fcntl F_OFD_SETLK: {e}); put EGPU_SIM_STATE on a local file system such as /dev/shm", path.display())),
        }
    }

    /// A new lock description of the file `mapped` (a descriptor of the
    /// mapped state file, which this closes) refers to. Not `mapped` itself:
    /// a mapping holds its description open, and a fork child inherits the
    /// mapping, so locks on it would outlive their process. Reopened through
    /// `/proc/self/fd`, so it is the same file even if the path was replaced
    /// meanwhile (the path itself without `/proc`).
    pub fn reopen(mapped: i32, path: &std::path::Path) -> Result<SlotLocks, String> {
        let again = std::path::PathBuf::from(format!("/proc/self/fd/{mapped}"));
        let l = SlotLocks::open(&again).or_else(|_| SlotLocks::open(path));
        // SAFETY: mapped is the caller's descriptor, handed to us to close.
        unsafe { libc::close(mapped) };
        l
    }

    /// A new description of the state file at `path`.
    pub fn open(path: &std::path::Path) -> Result<SlotLocks, String> {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| format!("{}: path contains a NUL byte", path.display()))?;
        // SAFETY: c is a NUL-terminated path.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(format!("cannot open simulated-GPU state {} for its slot locks: {}", path.display(), std::io::Error::last_os_error()));
        }
        SlotLocks::from_fd(fd, path)
    }

    /// Sets a lock of `kind` on slot `slot`'s byte: Ok(true) when set,
    /// Ok(false) when another description holds it, Err for anything else.
    fn lock(&self, slot: usize, kind: libc::c_short) -> Result<bool, std::io::Error> {
        let fd = self.fd.load(std::sync::atomic::Ordering::SeqCst);
        if fd < 0 {
            return Err(std::io::Error::from_raw_os_error(libc::EBADF));
        }
        // SAFETY: all-zero is a valid flock.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = kind;
        fl.l_whence = libc::SEEK_SET as libc::c_short;
        fl.l_start = LOCK_BASE + slot as i64;
        fl.l_len = 1;
        // SAFETY: fd is open (or closed, and fcntl fails with EBADF); fl is a valid flock.
        if unsafe { libc::fcntl(fd, libc::F_OFD_SETLK, &mut fl) } == 0 {
            return Ok(true);
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EAGAIN | libc::EACCES) => Ok(false),
            _ => Err(e),
        }
    }

    /// Takes slot `slot`'s byte: false when another description holds it
    /// (its owner is alive) or this one already does (another thread of this
    /// process owns or is reclaiming the slot: a lock never conflicts with
    /// its own description, so the set of held slots decides, under its
    /// mutex).
    pub fn hold(&self, slot: usize) -> bool {
        let mut h = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if h.contains(&slot) || !matches!(self.lock(slot, libc::F_WRLCK as libc::c_short), Ok(true)) {
            return false;
        }
        h.push(slot);
        true
    }

    /// Gives slot `slot`'s byte back.
    pub fn release(&self, slot: usize) {
        let mut h = self.held.lock().unwrap_or_else(|e| e.into_inner());
        h.retain(|&s| s != slot);
        let _ = self.lock(slot, libc::F_UNLCK as libc::c_short);
    }

    /// Whether this description holds slot `slot`.
    pub fn holds(&self, slot: usize) -> bool {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).contains(&slot)
    }

    /// Closes this description (its locks go with it).
    pub fn close(&self) {
        let fd = self.fd.swap(-1, std::sync::atomic::Ordering::SeqCst);
        if fd >= 0 {
            ALL_FDS.lock().unwrap_or_else(|e| e.into_inner()).retain(|&f| f != fd);
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
        let pid = crate::state::tests::spawn_true();
        assert!(!is_alive(pid, 0) || start_time(pid).is_some(), "pid was reused immediately");
        assert!(!is_alive(0, 0));
    }

    #[test]
    fn zombie_is_dead() {
        let spawning = crate::state::tests::SPAWNS.read().unwrap_or_else(|e| e.into_inner());
        let mut c = std::process::Command::new("true").spawn().unwrap();
        drop(spawning);
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
