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

/// An owned shared mapping of a whole file.
pub struct Mapping {
    ptr: *mut libc::c_void,
    len: usize,
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
        Ok(Mapping { ptr, len })
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
        // SAFETY: ptr/len came from a successful mmap and are unmapped once.
        unsafe {
            libc::munmap(self.ptr, self.len);
        }
    }
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
        file.set_len(len as u64)?;
        // set_len respects the umask-free mode only at creation; make it explicit.
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(std::fs::Permissions::from_mode(mode))?;
        let m = Mapping::map(&file, len, true)?;
        init(&m);
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
