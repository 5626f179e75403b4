//! A state-store write that fails on I/O fails alone. redb refuses every
//! transaction after an I/O error until the database is opened again; the
//! store does that at once (or at the next call), so a full disk that is freed again
//! does not leave egpud unable to create, resize or delete a slice until
//! it restarts. A test binary of its own: it lowers the process's file-size
//! limit, which would touch any other test running in the same process.

use egpu_core::{Bytes, DeviceShare, Percent, Priority, SliceSpec};
use egpu_node::store::{SliceRecord, Store};

fn rec(name: &str, uuid_len: usize) -> SliceRecord {
    SliceRecord {
        id: format!("id-{name}"),
        spec: SliceSpec {
            name: name.into(),
            priority: Priority::High,
            devices: vec![DeviceShare { device: 0, memory: Bytes::gib(1), memory_burst: Bytes(0), compute_share: Percent(2500), compute_limit: Percent::FULL }],
        },
        device_uuids: vec!["G".repeat(uuid_len)],
        ephemeral: false,
        owner: None,
        created_unix: 1,
        workload: None,
        rev: 1,
    }
}

fn fsize_limit(cur: libc::rlim_t) -> libc::rlim_t {
    let mut old = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit only read and write the rlimit
    // structs passed, which live on this stack frame.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_FSIZE, &mut old), 0);
        assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &libc::rlimit { rlim_cur: cur.min(old.rlim_max), rlim_max: old.rlim_max }), 0);
    }
    old.rlim_cur
}

#[test]
fn a_write_that_fails_on_io_does_not_break_the_writes_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    store.put(&rec("a", 8)).unwrap();
    let len = std::fs::metadata(store.path()).unwrap().len();
    // Past the limit a write fails with EFBIG, as one fails with ENOSPC on
    // a full disk; SIGXFSZ, which would end the process, is ignored.
    // SAFETY: setting a signal's disposition to SIG_IGN installs no handler.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    let old = fsize_limit(len);
    let e = store.put(&rec("big", 16 << 20)).expect_err("a record that grows the file past the limit");
    fsize_limit(old);
    let chain = format!("{:?}", anyhow_like(&e));
    assert!(chain.contains("File too large") || chain.contains("os error 27"), "{chain}");
    // Space is back: the next writes work, and the failed one left nothing.
    store.put(&rec("c", 8)).unwrap();
    store.remove("a").unwrap();
    let names = |s: &Store| s.load_all().unwrap().into_iter().map(|r| r.spec.name).collect::<Vec<_>>();
    assert_eq!(names(&store), ["c"]);
    drop(store);
    assert_eq!(names(&Store::open(dir.path()).unwrap()), ["c"], "as stored, after a restart");
}

/// The error and its sources, one after another.
fn anyhow_like(e: &dyn std::error::Error) -> Vec<String> {
    let mut out = vec![e.to_string()];
    let mut s = e.source();
    while let Some(x) = s {
        out.push(x.to_string());
        s = x.source();
    }
    out
}
