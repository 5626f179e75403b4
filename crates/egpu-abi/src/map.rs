//! File-backed shared mappings and POSIX record locks: all of the slice
//! table's unsafe code.
//!
//! [`Mapping`] owns an `mmap` of a whole file and unmaps it on drop. The typed
//! views hand out `&T` only for `#[repr(C)]` region types made entirely of
//! atomics and plain integers that are never written after publication, so
//! shared references to memory that other processes mutate are sound: every
//! mutable field is an atomic.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, AtomicU32, AtomicUsize, Ordering};

/// An owned shared mapping of a whole file.
pub struct Mapping {
    ptr: *mut libc::c_void,
    len: usize,
    /// The slot of [`GUARDS`] that covers this mapping, if any.
    guard: Option<usize>,
}

// SAFETY: the mapping is plain shared memory; all access to mutable data in it
// goes through atomics in the region types, so it may move between threads.
unsafe impl Send for Mapping {}
// SAFETY: as above: concurrent access is only through atomics.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `file` shared, read-write if `writable`.
    pub fn map(file: &File, len: usize, writable: bool) -> io::Result<Mapping> {
        let prot = if writable { libc::PROT_READ | libc::PROT_WRITE } else { libc::PROT_READ };
        // SAFETY: a fresh mapping at a kernel-chosen address; no existing memory is affected.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, file.as_raw_fd(), 0) };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping { ptr, len, guard: None })
    }

    /// Like [`Mapping::map`] (shared, read-write), and, in a process that
    /// called [`install_truncation_guard`], covered by it: an access past
    /// the end of the file that another process truncated restores the
    /// file's length instead of killing this process with `SIGBUS`.
    ///
    /// The guard keeps `file`'s descriptor number (never a duplicate: closing
    /// a duplicate would drop this process's record locks on the file), so
    /// the caller must drop the mapping before it closes `file`.
    pub fn map_guarded(file: &File, len: usize) -> io::Result<Mapping> {
        let mut m = Mapping::map(file, len, true)?;
        if GUARD_INSTALLED.load(Ordering::Acquire) {
            m.guard = Some(register_guard(m.ptr as usize, len, file.as_raw_fd())?);
        }
        Ok(m)
    }

    /// How many faults past the end of this mapping's file the truncation
    /// guard caught (0 for an unguarded mapping).
    pub fn guard_faults(&self) -> u32 {
        self.guard.map_or(0, |i| GUARDS[i].faults.load(Ordering::Acquire))
    }

    /// Whether the guard gave up on this mapping's file (it was truncated
    /// again and again, or could not be restored): the mapping then holds
    /// private zeros, no longer the file's contents.
    pub fn guard_detached(&self) -> bool {
        self.guard.is_some_and(|i| GUARDS[i].detached.load(Ordering::Acquire))
    }

    /// A typed view of the start of the mapping.
    ///
    /// Callers must only use this for the region types of this crate, whose
    /// size they have checked against the mapping length.
    pub(crate) fn view<T>(&self) -> &T {
        assert!(std::mem::size_of::<T>() <= self.len, "mapping smaller than region");
        assert_eq!(self.ptr as usize % std::mem::align_of::<T>(), 0);
        // SAFETY: the mapping is page-aligned (checked above), at least
        // size_of::<T>() long, lives as long as &self, and T is a region type
        // whose mutable fields are all atomics, so a shared reference is sound
        // even while other processes write through their own mappings.
        unsafe { &*(self.ptr as *const T) }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The mapping's bytes, for validation of headers before a typed view is taken.
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: the range is mapped for len bytes for the lifetime of &self.
        // Concurrent writers may change bytes under us; callers only read
        // header words that are immutable after publication.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // The handler stops matching the range before it is unmapped.
        if let Some(i) = self.guard {
            GUARDS[i].state.store(SLOT_BUSY, Ordering::Release);
        }
        // SAFETY: ptr/len came from a successful mmap and are unmapped once.
        unsafe {
            libc::munmap(self.ptr, self.len);
        }
        if let Some(i) = self.guard {
            GUARDS[i].state.store(SLOT_FREE, Ordering::Release);
        }
    }
}

// The truncation guard.
//
// A file mapped `MAP_SHARED` that another process truncates makes every
// access past its new end raise `SIGBUS`, which kills the process. The usage
// file is writable by every process of its slice, so without a guard any of
// them could stop `egpud` (whose sweep reads every record). Seals
// (`F_SEAL_SHRINK`) exist only for memfds, which have no path a workload or
// a container mount could open, so the agent instead catches the fault: the
// handler finds the mapping that holds the faulting address, extends the file
// back to the mapping's length with `ftruncate` (async-signal-safe), and
// returns; the faulting instruction runs again and reads zeros where the cut
// pages were. A file that is cut again and again (a process truncating in a
// loop could otherwise win the race every time) is given up after
// `MAX_REPAIRS`: its range is replaced with private zeros, so the agent stops
// faulting on it and sees an empty table. Faults elsewhere go to the previous
// handler (Rust's stack-overflow handler, or the default action).

const GUARD_SLOTS: usize = 4096;
/// Repairs of one mapping before the guard gives up on its file.
pub const MAX_REPAIRS: u32 = 64;
const SLOT_FREE: u8 = 0;
const SLOT_BUSY: u8 = 1;
const SLOT_LIVE: u8 = 2;

struct GuardSlot {
    state: AtomicU8,
    start: AtomicUsize,
    len: AtomicUsize,
    fd: AtomicI32,
    /// Faults caught past the end of the file.
    faults: AtomicU32,
    detached: AtomicBool,
}

static GUARDS: [GuardSlot; GUARD_SLOTS] = [const {
    GuardSlot {
        state: AtomicU8::new(SLOT_FREE),
        start: AtomicUsize::new(0),
        len: AtomicUsize::new(0),
        fd: AtomicI32::new(-1),
        faults: AtomicU32::new(0),
        detached: AtomicBool::new(false),
    }
}; GUARD_SLOTS];
/// One past the highest slot ever used: the handler scans no further.
static GUARD_HIGH: AtomicUsize = AtomicUsize::new(0);
static GUARD_INSTALLED: AtomicBool = AtomicBool::new(false);

/// The `SIGBUS` disposition before the guard's, written once before the
/// guard's handler is installed and only read after.
struct Previous(std::cell::UnsafeCell<std::mem::MaybeUninit<libc::sigaction>>);
// SAFETY: written once, by the thread that wins `GUARD_INSTALLED`, before the
// handler that reads it exists; never written again.
unsafe impl Sync for Previous {}
static PREVIOUS: Previous = Previous(std::cell::UnsafeCell::new(std::mem::MaybeUninit::uninit()));

/// Installs the process-wide `SIGBUS` handler of the truncation guard, for
/// mappings made from now on with [`Mapping::map_guarded`]. For the node
/// agent; a workload's hook never installs it (the signal dispositions are
/// the application's). Idempotent.
pub fn install_truncation_guard() -> io::Result<()> {
    static INSTALLING: AtomicBool = AtomicBool::new(false);
    if GUARD_INSTALLED.load(Ordering::Acquire) || INSTALLING.swap(true, Ordering::AcqRel) {
        return Ok(());
    }
    // SAFETY: sigaction reads and writes plain C structs that outlive the
    // calls; PREVIOUS is written here only (INSTALLING admits one thread),
    // before the handler that reads it is installed.
    unsafe {
        let prev = (*PREVIOUS.0.get()).as_mut_ptr();
        if libc::sigaction(libc::SIGBUS, std::ptr::null(), prev) != 0 {
            INSTALLING.store(false, Ordering::Release);
            return Err(io::Error::last_os_error());
        }
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = on_sigbus as *const () as usize;
        act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        libc::sigemptyset(&mut act.sa_mask);
        if libc::sigaction(libc::SIGBUS, &act, std::ptr::null_mut()) != 0 {
            INSTALLING.store(false, Ordering::Release);
            return Err(io::Error::last_os_error());
        }
    }
    GUARD_INSTALLED.store(true, Ordering::Release);
    Ok(())
}

fn register_guard(start: usize, len: usize, fd: i32) -> io::Result<usize> {
    for (i, g) in GUARDS.iter().enumerate() {
        if g.state.compare_exchange(SLOT_FREE, SLOT_BUSY, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            g.start.store(start, Ordering::Relaxed);
            g.len.store(len, Ordering::Relaxed);
            g.fd.store(fd, Ordering::Relaxed);
            g.faults.store(0, Ordering::Relaxed);
            g.detached.store(false, Ordering::Relaxed);
            GUARD_HIGH.fetch_max(i + 1, Ordering::AcqRel);
            g.state.store(SLOT_LIVE, Ordering::Release);
            return Ok(i);
        }
    }
    Err(io::Error::other(format!("more than {GUARD_SLOTS} usage files mapped at once; delete unused slices")))
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo_t to an SA_SIGINFO handler.
    let (addr, code) = unsafe { ((*info).si_addr() as usize, (*info).si_code) };
    // si_code > 0: raised by a fault (BUS_ADRERR for a page past the end of
    // a file), not sent by kill(2), so si_addr is the faulting address.
    if code > 0 {
        let high = GUARD_HIGH.load(Ordering::Acquire).min(GUARD_SLOTS);
        for g in &GUARDS[..high] {
            if g.state.load(Ordering::Acquire) != SLOT_LIVE {
                continue;
            }
            let (start, len) = (g.start.load(Ordering::Relaxed), g.len.load(Ordering::Relaxed));
            if addr >= start && addr - start < len {
                repair(g, start, len);
                return;
            }
        }
    }
    // SAFETY: PREVIOUS was initialised before this handler was installed.
    let prev = unsafe { (*PREVIOUS.0.get()).assume_init_ref() };
    if code <= 0 {
        // Sent (kill(2)), not a fault: the default action, termination,
        // whatever handler was there before (Rust's stack-overflow handler
        // would reset the disposition and return, leaving the process
        // running without this guard).
        // SAFETY: an all-zero sigaction is SIG_DFL with no flags; sigaction
        // and raise are async-signal-safe.
        unsafe {
            let dfl: libc::sigaction = std::mem::zeroed();
            libc::sigaction(sig, &dfl, std::ptr::null_mut());
            libc::raise(sig);
        }
        return;
    }
    // A fault outside every guarded mapping: the previous handler's to
    // handle, called here (this guard stays installed); the default action
    // is taken by restoring it, and the faulting instruction runs again.
    match prev.sa_sigaction {
        libc::SIG_IGN => {}
        libc::SIG_DFL => {
            // SAFETY: sigaction is async-signal-safe; `prev` is a valid disposition.
            unsafe { libc::sigaction(sig, prev, std::ptr::null_mut()) };
        }
        h if prev.sa_flags & libc::SA_SIGINFO != 0 => {
            // SAFETY: an SA_SIGINFO handler installed by this process takes these three arguments.
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) = unsafe { std::mem::transmute(h) };
            f(sig, info, ctx);
        }
        h => {
            // SAFETY: a plain handler installed by this process takes the signal number.
            let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(h) };
            f(sig);
        }
    }
}

/// In the signal handler: only async-signal-safe calls.
fn repair(g: &GuardSlot, start: usize, len: usize) {
    let fd = g.fd.load(Ordering::Relaxed);
    if g.faults.fetch_add(1, Ordering::AcqRel) < MAX_REPAIRS && !g.detached.load(Ordering::Acquire) {
        // SAFETY: an all-zero stat is valid; fstat and ftruncate are
        // async-signal-safe and touch no memory of ours but `st`.
        let outcome = unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            if libc::fstat(fd, &mut st) != 0 {
                None
            } else if (st.st_size as u64) < len as u64 {
                (libc::ftruncate(fd, len as libc::off_t) == 0).then_some(())
            } else {
                // Already long enough: another thread's fault restored it
                // first, or this is no truncation (no room for the page on a
                // full tmpfs, an I/O error). Run the access again; the count
                // bounds how often a fault that retrying cannot cure comes back.
                Some(())
            }
        };
        if outcome.is_some() {
            return;
        }
    }
    // SAFETY: replaces exactly the range of this live mapping (its Mapping
    // cannot be dropped while one of its accesses faults) with private
    // anonymous zeros; mmap is a plain system call.
    let p = unsafe { libc::mmap(start as *mut libc::c_void, len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED, -1, 0) };
    if p == libc::MAP_FAILED {
        // Nothing left to make the access succeed: the default action
        // (the faulting instruction runs again and the process dies), not
        // a loop of faults.
        // SAFETY: an all-zero sigaction is SIG_DFL; sigaction is async-signal-safe.
        unsafe {
            let dfl: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut());
        }
        return;
    }
    g.detached.store(true, Ordering::Release);
}

fn flock_struct(kind: libc::c_short, offset: u64) -> libc::flock {
    // SAFETY: flock is a plain C struct for which all-zero bytes are valid.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = offset as libc::off_t;
    fl.l_len = 1;
    fl
}

/// Tries to take the process's POSIX write lock on byte `offset` of `file`.
/// Returns `Ok(false)` if another process holds it.
pub fn try_lock_byte(file: &File, offset: u64) -> io::Result<bool> {
    let fl = flock_struct(libc::F_WRLCK as libc::c_short, offset);
    // SAFETY: fcntl with F_SETLK reads a valid flock struct that outlives the call.
    let r = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLK, &fl) };
    if r == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EACCES) => Ok(false),
        _ => Err(e),
    }
}

/// Releases this process's lock on byte `offset` of `file`.
pub fn unlock_byte(file: &File, offset: u64) -> io::Result<()> {
    let fl = flock_struct(libc::F_UNLCK as libc::c_short, offset);
    // SAFETY: as in try_lock_byte.
    let r = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLK, &fl) };
    if r == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// Whether another process holds a lock on byte `offset` of `file`.
/// Locks held by the calling process are not reported (POSIX semantics).
pub fn byte_locked_by_other(file: &File, offset: u64) -> io::Result<bool> {
    Ok(byte_lock_owner(file, offset)?.is_some())
}

/// The process that holds a lock on byte `offset` of `file`, if another
/// does: `Some(pid)` with the pid as the *calling* process's pid namespace
/// sees it (the kernel translates it; 0 when the owner is outside that
/// namespace's view). Locks held by the calling process are not reported.
pub fn byte_lock_owner(file: &File, offset: u64) -> io::Result<Option<u32>> {
    let mut fl = flock_struct(libc::F_WRLCK as libc::c_short, offset);
    // SAFETY: F_GETLK writes into the valid, exclusively borrowed flock struct.
    let r = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETLK, &mut fl) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((fl.l_type != libc::F_UNLCK as libc::c_short).then(|| u32::try_from(fl.l_pid).unwrap_or(0)))
}

/// Whether another process holds a lock on any byte of `file` (the record
/// locks of a usage file, whatever its layout: an ABI version this build
/// cannot read still has its attached processes' locks). Locks held by
/// the calling process are not reported.
pub fn any_lock_by_other(file: &File) -> io::Result<bool> {
    let mut fl = flock_struct(libc::F_WRLCK as libc::c_short, 0);
    fl.l_len = 0; // to the end of the file, however long
    // SAFETY: F_GETLK writes into the valid, exclusively borrowed flock struct.
    let r = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETLK, &mut fl) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fl.l_type != libc::F_UNLCK as libc::c_short)
}

pub(crate) fn monotonic_ns() -> u64 {
    // SAFETY: all-zero is a valid timespec.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: clock_gettime writes into the valid timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Writes `len` zero bytes as a new file at `tmp`, fills its start with
/// `init`, then renames it to `path`, so readers never see a partial file.
/// A `tmp` left by a process of the same pid that was killed half-way (a
/// restarted agent in a container is pid 1 again) is removed first.
pub(crate) fn create_atomically(path: &std::path::Path, len: usize, mode: u32, init: impl FnOnce(&Mapping)) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let file = std::fs::OpenOptions::new().read(true).write(true).create_new(true).mode(mode).open(&tmp)?;
    let res = (|| {
        // Written, not just sized: on a full filesystem a sparse file's
        // pages fail only when the mapping below touches them (SIGBUS,
        // caught by the guard into private zeros), and the file would be
        // renamed into place with no header, to be read as corrupt. A
        // write says ENOSPC here instead.
        io::Write::write_all(&mut &file, &vec![0u8; len])?;
        // The mode given at creation is cut by the umask; make it explicit.
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(std::fs::Permissions::from_mode(mode))?;
        // Guarded: a usage file's temporary is writable by everyone (0666)
        // while it is filled, and must not bring `egpud` down either.
        let m = Mapping::map_guarded(&file, len)?;
        init(&m);
        if m.guard_faults() > 0 || m.guard_detached() {
            return Err(io::Error::other("the new file's pages could not be written (is the filesystem full?)"));
        }
        drop(m);
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_temporary_file_left_by_a_killed_writer_of_the_same_pid_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("limits");
        let stale = path.with_extension(format!("tmp.{}", std::process::id()));
        std::fs::write(&stale, b"half-written").unwrap();
        super::create_atomically(&path, 4096, 0o644, |_| {}).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 4096);
        assert!(!stale.exists());
    }
}
