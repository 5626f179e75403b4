//! The machine-wide device state: one file, `mmap`ed `MAP_SHARED` by every
//! process that uses the simulated GPU.
//!
//! Protocol (no lock that anyone waits on, so a SIGKILLed process can block
//! nobody):
//! - The file is created complete under a temporary name and published with
//!   `link(2)`, which fails if another process published first; the loser
//!   unlinks its copy and attaches to the winner's. The header (magic, ABI
//!   version, canonical spec) is therefore immutable once visible.
//! - Each process claims a [`Slot`] by CAS on `owner` (pid + state), then
//!   records its start time. All its charges live in its slot.
//! - Device memory in use is the sum of the slots' charges. A charge is
//!   admitted by add-then-check: add to my slot, sum all slots, and back out
//!   if the sum exceeds the device. Two racing allocators can both back out
//!   near the limit (then retry), but can never both succeed past it.
//! - Each process holds a non-blocking open-file-description lock on one byte
//!   per slot it owns ([`live::SlotLocks`]); the kernel drops it when the
//!   process dies. A taken slot whose byte a sweeper can lock is dead,
//!   whatever pid namespace its owner was in, and is reclaimed by that
//!   sweeper: CAS the owner to `RECLAIM(me)`, zero the counters, free it,
//!   unlock. A sweeper that dies mid-way leaves `RECLAIM(dead pid)` with an
//!   unlocked byte, which the next sweeper takes over.
//! - Kernel time: per device an atomic `busy_until` (CLOCK_MONOTONIC ns);
//!   a launch CASes it forward. See [`timing`].

pub mod live;
mod slots;
pub mod timing;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

pub use slots::{ProcUsage, SlotState};

pub const MAGIC: u64 = u64::from_le_bytes(*b"EGPUSIM\0");
/// Bumped whenever the layout below or the protocol changes (3: slot
/// liveness is a lock, not a pid).
pub const ABI_VERSION: u32 = 3;
pub const MAX_DEVS: usize = 64;
pub const MAX_SLOTS: usize = 512;
const SPEC_BYTES: usize = 8192;
const TEXT_BYTES: usize = 256;
/// Utilisation buckets per device (see [`timing`]).
pub const NBUCKETS: usize = 32;
/// Recently queued kernels remembered per device (see [`timing`]).
pub const NSPANS: usize = 1024;

/// One queued kernel in a device's span log (see [`timing`]).
#[repr(C)]
pub struct Span {
    /// `2·n + 2` once entry `n` of the log is complete, odd while written.
    pub seq: AtomicU64,
    /// CLOCK_MONOTONIC ns at which the kernel ends.
    pub end: AtomicU64,
    /// Its duration, ns.
    pub dur: AtomicU64,
    /// `slot << 32 | pid` of the process it is charged to.
    pub owner: AtomicU64,
}

/// Per-device shared counters.
#[repr(C)]
pub struct Dev {
    /// Device memory in bytes (immutable after publication).
    pub total: u64,
    /// CLOCK_MONOTONIC ns at which the last queued kernel ends.
    pub busy_until: AtomicU64,
    /// Sum of the durations of every kernel ever queued, ns.
    pub busy_total: AtomicU64,
    /// Packed (epoch, busy ns) per 100 ms bucket, ring of [`NBUCKETS`].
    pub buckets: [AtomicU64; NBUCKETS],
    /// Entries ever appended to `spans`.
    pub span_cursor: AtomicU64,
    /// The last [`NSPANS`] kernels queued, a ring indexed by `span_cursor`.
    pub spans: [Span; NSPANS],
}

/// One process's record.
#[repr(C)]
pub struct Slot {
    /// `pid << 8 | state` (see [`SlotState`]); 0 = free.
    pub owner: AtomicU64,
    /// The owner's start time (`/proc/<pid>/stat` field 22).
    pub start: AtomicU64,
    /// Device memory charged to this process, per physical device.
    pub mem: [AtomicU64; MAX_DEVS],
    /// Kernel time queued by this process, per physical device, ns. What has
    /// *run* by a given time is [`Shared::executed`].
    pub busy: [AtomicU64; MAX_DEVS],
}

/// The whole file.
#[repr(C)]
pub struct Shared {
    magic: u64,
    abi: u32,
    ndev: u32,
    spec_len: u32,
    text_len: u32,
    spec: [u8; SPEC_BYTES],
    text: [u8; TEXT_BYTES],
    pub devs: [Dev; MAX_DEVS],
    pub slots: [Slot; MAX_SLOTS],
}

/// Size of the state file.
pub const STATE_SIZE: usize = size_of::<Shared>();

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn cpath(p: &Path) -> Result<CString, String> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| format!("{}: path contains a NUL byte", p.display()))
}

/// Maps `fd` (already `STATE_SIZE` long) shared and read-write, forever.
fn map_raw(fd: i32) -> Result<*mut Shared, String> {
    // SAFETY: a fresh shared mapping of a file we own an fd to; no existing
    // memory is affected.
    let p = unsafe {
        libc::mmap(std::ptr::null_mut(), STATE_SIZE, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0)
    };
    if p == libc::MAP_FAILED {
        return Err(format!("mmap of the state file failed: {}", std::io::Error::last_os_error()));
    }
    Ok(p as *mut Shared)
}

fn map(fd: i32) -> Result<&'static Shared, String> {
    let p = map_raw(fd)?;
    // SAFETY: the mapping is STATE_SIZE bytes, page-aligned (so aligned for
    // Shared), never unmapped (hence 'static), and every field is either
    // immutable after publication or an atomic, so shared references are
    // sound even though other processes write the file.
    Ok(unsafe { &*p })
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").field("ndev", &self.ndev).field("spec", &self.spec_text()).finish_non_exhaustive()
    }
}

impl Shared {
    pub fn ndev(&self) -> usize {
        self.ndev as usize
    }

    /// The canonical spec this file was made for.
    pub fn spec(&self) -> &str {
        std::str::from_utf8(&self.spec[..(self.spec_len as usize).min(SPEC_BYTES)]).unwrap_or("?")
    }

    /// The `EGPU_SIM_GPUS` text of the process that made this file.
    pub fn spec_text(&self) -> &str {
        std::str::from_utf8(&self.text[..(self.text_len as usize).min(TEXT_BYTES)]).unwrap_or("?")
    }

    /// Attaches to (creating if needed) the state file at `path` for devices
    /// of `totals` bytes described by `canonical` (see
    /// [`crate::config::canonical`]). `text` is the user's spec, for messages.
    pub fn attach(path: &Path, canonical: &str, text: &str, totals: &[u64]) -> Result<&'static Shared, String> {
        let (s, fd) = Self::attach_fd(path, canonical, text, totals)?;
        // SAFETY: fd is ours; the mapping stays valid after close.
        unsafe { libc::close(fd) };
        Ok(s)
    }

    /// [`Shared::attach`], also returning a descriptor of the very file that
    /// was mapped (the caller owns it), for [`live::SlotLocks`].
    pub fn attach_fd(path: &Path, canonical: &str, text: &str, totals: &[u64]) -> Result<(&'static Shared, i32), String> {
        if canonical.len() > SPEC_BYTES || totals.len() > MAX_DEVS {
            return Err(format!("simulated-GPU spec {text:?} is too large"));
        }
        let c = cpath(path)?;
        for _ in 0..100 {
            // SAFETY: c is a NUL-terminated path.
            let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
            if fd >= 0 {
                let r = Self::open_existing(fd, path, canonical, text);
                if r.is_err() {
                    // SAFETY: fd is ours.
                    unsafe { libc::close(fd) };
                }
                return r.map(|s| (s, fd));
            }
            if errno() != libc::ENOENT {
                return Err(format!("cannot open simulated-GPU state {}: {}", path.display(), std::io::Error::last_os_error()));
            }
            match Self::create(path, &c, canonical, text, totals)? {
                Some(made) => return Ok(made),
                None => continue, // somebody else published first: attach to theirs
            }
        }
        Err(format!("simulated-GPU state {}: could not create or open it", path.display()))
    }

    fn open_existing(fd: i32, path: &Path, canonical: &str, text: &str) -> Result<&'static Shared, String> {
        // SAFETY: all-zero is a valid libc::stat.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fd is open and st is a valid out-pointer.
        if unsafe { libc::fstat(fd, &mut st) } != 0 || st.st_size as usize != STATE_SIZE {
            return Err(format!(
                "{} is not a simulated-GPU state file of ABI version {ABI_VERSION} (size {} != {STATE_SIZE}); remove it when no process uses it",
                path.display(),
                st.st_size
            ));
        }
        let s = map(fd)?;
        if s.magic != MAGIC || s.abi != ABI_VERSION {
            return Err(format!(
                "{} is not a simulated-GPU state file of ABI version {ABI_VERSION}; remove it when no process uses it",
                path.display()
            ));
        }
        if s.spec() != canonical {
            return Err(format!(
                "simulated-GPU state {} was made for EGPU_SIM_GPUS={:?} but this process has EGPU_SIM_GPUS={:?}; use the same spec, another EGPU_SIM_STATE, or remove the file when no process uses it",
                path.display(),
                s.spec_text(),
                text
            ));
        }
        Ok(s)
    }

    /// Creates and publishes a new state file (and a descriptor of it);
    /// `Ok(None)` if another process published one first.
    fn create(path: &Path, c: &CString, canonical: &str, text: &str, totals: &[u64]) -> Result<Option<(&'static Shared, i32)>, String> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let tmp = format!("{}.tmp.{}.{}", path.display(), live::my_pid(), SEQ.fetch_add(1, Ordering::Relaxed));
        let ctmp = CString::new(tmp.clone()).map_err(|_| "bad temp path".to_string())?;
        let fail = |what: &str| format!("cannot create simulated-GPU state {tmp}: {what}: {}", std::io::Error::last_os_error());
        // SAFETY: ctmp is NUL-terminated.
        let fd = unsafe { libc::open(ctmp.as_ptr(), libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC, 0o666) };
        if fd < 0 {
            return Err(fail("open"));
        }
        let cleanup = |fd: i32| {
            // SAFETY: fd is ours and ctmp NUL-terminated.
            unsafe {
                libc::close(fd);
                libc::unlink(ctmp.as_ptr());
            }
        };
        // SAFETY: fd is an open regular file we created.
        if unsafe { libc::fchmod(fd, 0o666) } != 0 || unsafe { libc::ftruncate(fd, STATE_SIZE as libc::off_t) } != 0 {
            let e = fail("ftruncate");
            cleanup(fd);
            return Err(e);
        }
        let raw = match map_raw(fd) {
            Ok(p) => p,
            Err(e) => {
                cleanup(fd);
                return Err(e);
            }
        };
        {
            // SAFETY: the file is not yet published, so this process is the
            // only user of the mapping and this is the only reference to it.
            let h = unsafe { &mut *raw };
            h.magic = MAGIC;
            h.abi = ABI_VERSION;
            h.ndev = totals.len() as u32;
            h.spec_len = canonical.len() as u32;
            h.spec[..canonical.len()].copy_from_slice(canonical.as_bytes());
            let t = &text.as_bytes()[..text.len().min(TEXT_BYTES)];
            h.text_len = t.len() as u32;
            h.text[..t.len()].copy_from_slice(t);
            for (d, &total) in totals.iter().enumerate() {
                h.devs[d].total = total;
            }
        }
        // SAFETY: both paths are NUL-terminated; link fails if c exists.
        let linked = unsafe { libc::link(ctmp.as_ptr(), c.as_ptr()) } == 0;
        let e = errno();
        // SAFETY: fd is open; the duplicate is the caller's.
        let kept = if linked { unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) } } else { -1 };
        cleanup(fd);
        if linked {
            if kept < 0 {
                return Err(format!("cannot keep a descriptor of simulated-GPU state {}: {}", path.display(), std::io::Error::last_os_error()));
            }
            // SAFETY: as in `map`: published, immutable header, atomics.
            return Ok(Some((unsafe { &*raw }, kept)));
        }
        // SAFETY: s maps STATE_SIZE bytes and we drop our only reference.
        unsafe { libc::munmap(raw as *mut libc::c_void, STATE_SIZE) };
        if e == libc::EEXIST { Ok(None) } else { Err(format!("cannot publish simulated-GPU state {}: errno {e}", path.display())) }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Test threads of this process that spawn a child hold this for
    /// reading; a test that needs its dropped lock description released at
    /// once holds it for writing. A child shares this process's descriptions
    /// from its clone to its exec (`posix_spawn` runs no `pthread_atfork`
    /// handler), so a sibling test's spawn could keep a dropped
    /// description's locks a moment longer (seen: 4 failures in 8 runs of
    /// `cargo test`, none with one test thread).
    pub static SPAWNS: std::sync::RwLock<()> = std::sync::RwLock::new(());

    /// Runs `true` and reaps it; its pid.
    pub fn spawn_true() -> u32 {
        let _g = SPAWNS.read().unwrap_or_else(|e| e.into_inner());
        let mut c = std::process::Command::new("true").spawn().unwrap();
        let pid = c.id();
        c.wait().unwrap();
        pid
    }

    /// A fresh state for `n` devices of `gib` GiB in a temp dir (leaked).
    pub fn fresh(n: usize, gib: u64) -> &'static Shared {
        fresh_at(n, gib).0
    }

    /// [`fresh`], with the state file's path (for [`live::SlotLocks`]).
    pub fn fresh_at(n: usize, gib: u64) -> (&'static Shared, std::path::PathBuf) {
        let path = tempfile::tempdir().unwrap().keep().join("state");
        let totals = vec![gib << 30; n];
        (Shared::attach(&path, &format!("test{n}x{gib}"), "test", &totals).unwrap(), path)
    }

    #[test]
    fn create_then_attach_same_file_and_reject_other_spec() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s");
        let a = Shared::attach(&p, "A", "1xA", &[1 << 30]).unwrap();
        let b = Shared::attach(&p, "A", "1xA", &[1 << 30]).unwrap();
        assert_eq!(a.ndev(), 1);
        a.devs[0].busy_total.store(7, Ordering::SeqCst);
        assert_eq!(b.devs[0].busy_total.load(Ordering::SeqCst), 7, "two mappings of one file");
        let e = Shared::attach(&p, "B", "2xB", &[1 << 30, 1 << 30]).unwrap_err();
        assert!(e.contains("1xA") && e.contains("2xB") && e.contains(&p.display().to_string()), "{e}");
        // No temp files are left behind.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn concurrent_creation_yields_one_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s");
        let states: Vec<usize> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..8).map(|_| sc.spawn(|| Shared::attach(&p, "X", "x", &[1 << 30]).unwrap())).collect();
            hs.into_iter().map(|h| h.join().unwrap() as *const Shared as usize).collect()
        });
        let first = states[0] as *const Shared;
        // SAFETY: every pointer came from a live 'static mapping.
        let first = unsafe { &*first };
        first.devs[0].busy_total.fetch_add(1, Ordering::SeqCst);
        for s in &states {
            // SAFETY: as above.
            let s = unsafe { &*(*s as *const Shared) };
            assert_eq!(s.devs[0].busy_total.load(Ordering::SeqCst), 1);
        }
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn garbage_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s");
        std::fs::write(&p, b"hello").unwrap();
        let e = Shared::attach(&p, "X", "x", &[1 << 30]).unwrap_err();
        assert!(e.contains("not a simulated-GPU state file"), "{e}");
    }
}
