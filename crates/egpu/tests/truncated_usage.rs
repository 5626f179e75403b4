//! A workload that truncates its slice's usage file (it is writable by the
//! slice's processes) does not stop egpud: the running agent extends the file
//! back (its SIGBUS guard or its sweep), and a restarted one adopts the cut
//! file in place instead of recreating it, so the processes still attached
//! keep what was not cut.

mod common;
use common::*;
use std::fs::OpenOptions;
use std::time::Duration;

const T: Duration = Duration::from_secs(30);
const MIB: u64 = 1 << 20;

fn cut(path: &std::path::Path, len: u64) {
    OpenOptions::new().write(true).open(path).unwrap().set_len(len).unwrap();
}

#[test]
fn a_truncated_usage_file_neither_stops_egpud_nor_loses_the_slice() {
    let mut node = Node::start("1x16GiB");
    node.ok(&["create", "--name", "t", "--gpu-memory", "2GiB"]);
    let usage = node.run_dir().join("slices/t/usage");
    let full = std::fs::metadata(&usage).unwrap().len();
    let mut cmd = node.cli();
    cmd.args(["exec", "t", "--"]).arg(probe_path()).args(["grow", "--step", "256MiB", "--until", "256MiB", "--hold"]);
    let mut p = Lines::spawn(cmd);
    p.wait_event("holding", T).unwrap_or_else(|| panic!("probe did not allocate: {:?}", p.seen));
    let used = |node: &Node| node.slice("t")["devices"][0]["used_bytes"].as_u64().unwrap();
    // The probe's allocation and its context.
    let before = used(&node);
    assert!(before >= 256 * MIB, "{before}");

    // Past the first records: the probe's record (index 0) and the header survive.
    cut(&usage, 8192);
    assert!(
        wait_until(T, || std::fs::metadata(&usage).unwrap().len() == full),
        "egpud did not extend the usage file back; log:\n{}",
        node.log()
    );
    assert!(wait_until(T, || node.log().contains("usage file was truncated")), "no warning; log:\n{}", node.log());
    assert_eq!(used(&node), before, "egpud still answers and still counts the probe's charge");

    // Through the header: every record is lost, the slice is not.
    cut(&usage, 0);
    assert!(wait_until(T, || std::fs::metadata(&usage).unwrap().len() == full), "log:\n{}", node.log());
    assert!(wait_until(T, || used(&node) == 0), "the cut records read as zero");
    // The sweep writes the header back; then a new process attaches.
    assert!(wait_until(T, || egpu_abi::UsageFile::open(&usage).is_ok()), "header not written back; log:\n{}", node.log());
    let o = node
        .cli()
        .args(["exec", "t", "--"])
        .arg(probe_path())
        .args(["alloc", "--family", "mem", "--size", "64MiB"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}\n{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));

    // Cut while egpud is down: the restarted agent extends the file in place.
    let mut q = Lines::spawn({
        let mut c = node.cli();
        c.args(["exec", "t", "--"]).arg(probe_path()).args(["grow", "--step", "128MiB", "--until", "128MiB", "--hold"]);
        c
    });
    q.wait_event("holding", T).unwrap_or_else(|| panic!("probe did not allocate: {:?}", q.seen));
    node.kill9();
    cut(&usage, 8192);
    node.restart();
    assert_eq!(std::fs::metadata(&usage).unwrap().len(), full);
    assert!(node.log().contains("extended it back"), "log:\n{}", node.log());
    assert!(!node.log().contains("recreated it from the store"), "the cut file was recreated; log:\n{}", node.log());
    let s = node.slice("t");
    assert!(s["devices"][0]["used_bytes"].as_u64().unwrap() >= 128 * MIB, "the attached probe's charge survives the restart: {s}");
    assert_eq!(live_pids(std::slice::from_ref(&s)).len(), 1, "the probe attached before the restart is still in the slice (the first one's record was cut): {s}");

    for l in [&mut p, &mut q] {
        let st = l.finish(T).expect("probe exits when stdin closes");
        assert!(st.success(), "{st}");
    }
}
