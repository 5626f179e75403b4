//! A slice table on disk may be anything: truncated, of another version, or
//! overwritten. Opening it must refuse it with an error or, if it passes the
//! header checks, every reader must stay within bounds. Never a panic: the
//! reader is `egpud`, or the hook inside a user's CUDA program.

use egpu_abi::{LimitsReader, LimitsWriter, UsageFile};
use egpu_abi::limits::{DeviceInit, DeviceLimitsSnapshot};
use proptest::prelude::*;

fn valid_files(dir: &std::path::Path) -> (Vec<u8>, Vec<u8>) {
    let d = DeviceInit { uuid: "GPU-x".into(), host_index: 0, limits: DeviceLimitsSnapshot { host_index: 0, mem_limit: 1 << 30, compute_share_bps: 0, compute_limit_bps: 10_000 } };
    LimitsWriter::create(&dir.join("limits"), "s", 1, &[d]).unwrap();
    UsageFile::create(&dir.join("usage"), 1).unwrap();
    (std::fs::read(dir.join("limits")).unwrap(), std::fs::read(dir.join("usage")).unwrap())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    /// Random edits of valid files (words anywhere, the header included) and
    /// truncation: open refuses or the file reads within bounds.
    #[test]
    fn edited_or_truncated_tables_are_refused_or_read_safely(
        edits in prop::collection::vec((prop_oneof![16usize..4096, 0usize..1 << 20], any::<u64>()), 0..24),
        header in prop::collection::vec((0usize..24, any::<u8>()), 0..4),
        cut in prop::option::of(0usize..1 << 20),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let (mut l, mut u) = valid_files(dir.path());
        for bytes in [&mut l, &mut u] {
            let len = bytes.len();
            for &(off, v) in &edits {
                let off = off % len;
                let n = (len - off).min(8);
                bytes[off..off + n].copy_from_slice(&v.to_le_bytes()[..n]);
            }
            for &(off, v) in &header {
                bytes[off] = v;
            }
            if let Some(c) = cut {
                bytes.truncate(c % (len + 1));
            }
        }
        std::fs::write(dir.path().join("limits"), &l).unwrap();
        std::fs::write(dir.path().join("usage"), &u).unwrap();
        if let Ok(r) = LimitsReader::open(&dir.path().join("limits")) {
            let s = r.snapshot();
            prop_assert!(s.n_devices >= 1 && s.n_devices <= egpu_abi::MAX_DEVICES);
            let _ = r.region().name();
            for i in 0..s.n_devices {
                let _ = r.region().device_uuid(i);
            }
        }
        if let Ok(f) = UsageFile::open(&dir.path().join("usage")) {
            let n = f.n_devices();
            prop_assert!((1..=egpu_abi::MAX_DEVICES).contains(&n));
            for d in 0..n {
                let _ = f.used(d);
                let _ = f.wanted_memory(d);
                let _ = f.charge_lock_free(d);
            }
            let _ = f.processes();
            let _ = f.sweep(None);
        }
    }
}
