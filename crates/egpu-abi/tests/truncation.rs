//! The truncation guard: a usage file that a process of the slice truncates
//! must not kill the node agent with SIGBUS (`map::install_truncation_guard`).
//!
//! Its own test binary: the guard installs a process-wide SIGBUS handler.

use egpu_abi::map::{self, MAX_REPAIRS};
use egpu_abi::{AbiError, UsageFile};
use std::fs::OpenOptions;
use std::path::Path;

/// Truncates `path` through a descriptor of its own, as a workload would.
fn cut(path: &Path, len: u64) {
    OpenOptions::new().write(true).open(path).unwrap().set_len(len).unwrap();
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().len()
}

#[test]
fn a_truncated_usage_file_is_restored_instead_of_raising_sigbus() {
    map::install_truncation_guard().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("usage");
    let u = UsageFile::create(&path, 2).unwrap();
    let full = file_len(&path);
    let slot = u.claim(4242).unwrap();
    u.try_charge(&slot, 1, 1 << 20, 1 << 30).unwrap();
    assert_eq!(u.used(1), 1 << 20);

    cut(&path, 0);
    // Without the guard this read of the records raises SIGBUS and the test process dies.
    assert_eq!(u.used(1), 0, "the cut pages read back as zeros");
    assert_eq!(file_len(&path), full, "the handler extended the file back");

    let r = u.restore_length().unwrap().expect("the fault is reported");
    assert!(r.faults >= 1, "{r:?}");
    assert!(r.header, "the cut reached the header: {r:?}");
    assert_eq!(r.cut_to, None, "the handler had already restored the length");
    assert!(!r.detached);
    assert_eq!(u.restore_length().unwrap(), None, "reported once");

    // A device count overwritten (no cut) is put back too.
    u.region().n_devices.store(0, std::sync::atomic::Ordering::Relaxed);
    assert!(u.restore_length().unwrap().expect("found").header);
    // A new process can open and attach again: the header is back.
    let again = UsageFile::open(&path).unwrap();
    assert_eq!(again.n_devices(), 2);
    let s2 = again.claim(4343).unwrap();
    again.try_charge(&s2, 0, 4096, 1 << 30).unwrap();
    // The file is shared: the agent's mapping sees the new charge (scans
    // cover every record after a repair).
    assert_eq!(u.used(0), 4096);
}

#[test]
fn a_cut_found_at_the_sweep_is_restored_before_any_access_faults() {
    map::install_truncation_guard().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("usage");
    let u = UsageFile::create(&path, 1).unwrap();
    let full = file_len(&path);
    // Past the header and the first records: the header stays valid.
    cut(&path, 8192);
    let r = u.restore_length().unwrap().expect("the cut is found");
    assert_eq!(r.cut_to, Some(8192));
    assert_eq!(r.faults, 0);
    assert!(!r.header);
    assert_eq!(file_len(&path), full);
    assert_eq!(u.used(0), 0);
    assert_eq!(u.restore_length().unwrap(), None);
}

#[test]
fn a_file_cut_again_and_again_is_given_up_and_then_never_faults() {
    map::install_truncation_guard().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("usage");
    let u = UsageFile::create(&path, 1).unwrap();
    for i in 0..MAX_REPAIRS {
        cut(&path, 0);
        let _ = u.used(0);
        assert!(!u.detached(), "given up after only {i} repairs");
    }
    cut(&path, 0);
    assert_eq!(u.used(0), 0);
    assert!(u.detached(), "a file cut more than {MAX_REPAIRS} times is given up");
    // The range now holds private zeros: no more faults, whatever the file does.
    cut(&path, 0);
    assert_eq!(u.used(0), 0);
    assert_eq!(u.processes(), vec![]);
    let r = u.restore_length().unwrap().expect("reported");
    assert!(r.detached);
    assert_eq!(r.cut_to, Some(0), "the file itself is still extended back, for the slice's processes");
    assert!(file_len(&path) > 0);
    assert_eq!(u.restore_length().unwrap(), None, "detachment is reported once");
}

#[test]
fn adoption_extends_a_cut_file_and_keeps_what_was_not_cut() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("usage");
    let full;
    {
        let u = UsageFile::create(&path, 3).unwrap();
        full = file_len(&path);
        let slot = u.claim(7).unwrap();
        u.try_charge(&slot, 2, 12345, 1 << 30).unwrap();
    }
    // Record 0 lies in the first two pages.
    cut(&path, 8192);
    let (u, cut_to) = UsageFile::open_restoring(&path, 3).unwrap();
    assert_eq!(cut_to, Some(8192));
    assert_eq!(file_len(&path), full);
    assert_eq!(u.used(2), 12345, "a record before the cut keeps its charge");

    // Cut through the header: it is written again from the store's device count.
    drop(u);
    cut(&path, 5);
    let (u, cut_to) = UsageFile::open_restoring(&path, 3).unwrap();
    assert_eq!(cut_to, Some(5));
    assert_eq!(u.n_devices(), 3);
    assert_eq!(u.used(2), 0);
    assert!(UsageFile::open(&path).is_ok());

    // Cut between the header and the device count: the count is written again.
    drop(u);
    cut(&path, 18);
    let (u, cut_to) = UsageFile::open_restoring(&path, 3).unwrap();
    assert_eq!((cut_to, u.n_devices()), (Some(18), 3));

    // A whole file is opened as it is.
    drop(u);
    let (_, cut_to) = UsageFile::open_restoring(&path, 3).unwrap();
    assert_eq!(cut_to, None);
}

#[test]
fn adoption_refuses_what_is_not_a_cut_usage_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("usage");
    std::fs::write(&path, vec![0xabu8; 100]).unwrap();
    let e = UsageFile::open_restoring(&path, 1).err().expect("refused");
    assert!(matches!(e, AbiError::Corrupt(..)), "{e}");
    assert_eq!(file_len(&path), 100, "a file that is not a usage file is left as it was");

    UsageFile::create(&path, 1).unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[0] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    assert!(matches!(UsageFile::open_restoring(&path, 1), Err(AbiError::Corrupt(..))));
    assert!(matches!(UsageFile::open_restoring(&path, 0), Err(AbiError::BadDevice(0))));
}

#[test]
fn a_fault_outside_every_guarded_mapping_still_kills_the_process() {
    map::install_truncation_guard().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plain");
    std::fs::write(&path, vec![1u8; 8192]).unwrap();
    let file = OpenOptions::new().read(true).write(true).open(&path).unwrap();
    // SAFETY: a fresh read-only shared mapping of 8192 bytes of `file`, never unmapped (the test ends).
    let p = unsafe { libc::mmap(std::ptr::null_mut(), 8192, libc::PROT_READ, libc::MAP_SHARED, std::os::fd::AsRawFd::as_raw_fd(&file), 0) };
    assert_ne!(p, libc::MAP_FAILED);
    cut(&path, 0);
    // SAFETY: fork in a test process; the child only reads memory and
    // calls _exit, both async-signal-safe.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // An unguarded mapping past the end of its file: SIGBUS, which the
        // guard passes on to the previous disposition.
        // SAFETY: the page is mapped; with the file cut, the read is meant
        // to fault, and the child exits at once if it does not.
        unsafe { libc::_exit(i32::from(std::ptr::read_volatile((p as *const u8).add(8191))) + 10) };
    }
    let mut status = 0;
    // SAFETY: waits for the child forked above.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFSIGNALED(status), "the child exited normally: {status:#x}");
    assert_eq!(libc::WTERMSIG(status), libc::SIGBUS);
}

#[test]
fn a_sigbus_sent_with_kill_takes_the_default_action() {
    map::install_truncation_guard().unwrap();
    // SAFETY: fork in a test process; the child only raises a signal and
    // calls _exit, both async-signal-safe.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // SAFETY: raise and _exit are async-signal-safe.
        unsafe {
            libc::raise(libc::SIGBUS);
            libc::_exit(7);
        }
    }
    let mut status = 0;
    // SAFETY: waits for the child forked above.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFSIGNALED(status), "the child survived a SIGBUS: {status:#x}");
    assert_eq!(libc::WTERMSIG(status), libc::SIGBUS);
}
