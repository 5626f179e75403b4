//! On a full filesystem, making a slice table's file fails with the
//! filesystem's error, not with a file that is then read as corrupt (a
//! sparse file's pages used to fail only when the mapping touched them,
//! and the guard turned that into a header of zeros). It mounts a small
//! tmpfs, so it needs root: elsewhere it says it is skipped, and in CI as
//! root (`EGPU_REQUIRE_RUNC`, set by `.ci/run`) a failed mount fails it.

use egpu_abi::limits::{DeviceInit, LimitsWriter};
use egpu_abi::{AbiError, DeviceLimitsSnapshot, UsageFile};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

struct Mounted(PathBuf);
impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

fn fill(dir: &Path) -> PathBuf {
    let p = dir.join("fill");
    let mut f = std::fs::File::create(&p).unwrap();
    let block = vec![1u8; 4096];
    while f.write_all(&block).is_ok() {}
    // Whatever a partial block left: the filesystem is full.
    assert!(std::fs::File::create(dir.join("probe")).and_then(|mut g| g.write_all(&block)).is_err(), "the tmpfs is not full");
    let _ = std::fs::remove_file(dir.join("probe"));
    p
}

#[test]
fn a_full_filesystem_is_said_to_be_full_and_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let mounted = Command::new("mount").args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"]).arg(dir.path()).output();
    if !mounted.as_ref().is_ok_and(|o| o.status.success()) {
        assert!(std::env::var_os("EGPU_REQUIRE_RUNC").is_none(), "cannot mount a tmpfs as root: {mounted:?}");
        eprintln!("skipped: mounting a tmpfs needs root ({mounted:?})");
        return;
    }
    let _m = Mounted(dir.path().to_path_buf());
    let filler = fill(dir.path());
    let usage = dir.path().join("usage");
    let limits = dir.path().join("limits");
    let dev = DeviceInit { uuid: "GPU-x".into(), host_index: 0, limits: DeviceLimitsSnapshot { host_index: 0, mem_limit: 1 << 30, compute_share_bps: 0, compute_limit_bps: 10_000 } };
    let full = |e: AbiError| {
        assert!(matches!(e, AbiError::Io(..)) && e.to_string().contains("No space left on device"), "{e}");
    };
    full(UsageFile::create(&usage, 2).err().expect("no space for a usage file"));
    full(LimitsWriter::create(&limits, "s", 1, std::slice::from_ref(&dev)).err().expect("no space for a limits file"));
    let left: Vec<String> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(left, ["fill"], "no file, and no temporary, is left");
    // Space back: both are made, and read back whole.
    std::fs::remove_file(filler).unwrap();
    UsageFile::create(&usage, 2).unwrap();
    LimitsWriter::create(&limits, "s", 1, std::slice::from_ref(&dev)).unwrap();
    assert!(UsageFile::open(&usage).is_ok() && egpu_abi::LimitsReader::open(&limits).is_ok());
}
