//! egpud killed between the durable steps of a create, a resize and a
//! delete (`EGPU_CRASH_AT`, crash points of debug builds), with a workload
//! holding memory in the slice: the restarted egpud adopts a state that is
//! one of the two the request could lead to, the workload keeps its slice
//! and its charges, and nothing is left half done.

mod common;
use common::*;
use egpu_abi::{LimitsReader, SliceState};
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

const T: Duration = Duration::from_secs(30);

/// A node with slice `a` (2 GiB) and a probe holding 256 MiB in it, whose
/// egpud is killed at `point` while it serves `egpu args`; egpud is then
/// started again, without the crash point.
fn crashed_at(point: &str, args: &[&str]) -> (Node, Lines) {
    let mut node = Node::start("1x16GiB");
    node.ok(&["create", "--name", "a", "--gpu-memory", "2GiB"]);
    let mut cmd = node.cli();
    cmd.args(["exec", "a", "--"]).arg(probe_path()).args(["grow", "--step", "256MiB", "--until", "256MiB", "--hold"]);
    let mut p = Lines::spawn(cmd);
    p.wait_event("holding", T).unwrap_or_else(|| panic!("probe did not allocate: {:?}", p.seen));

    node.kill9();
    node.env.push(("EGPU_CRASH_AT".into(), point.into()));
    node.restart();
    let o = node.egpu(args);
    assert!(!o.status.success(), "{point}: egpu {args:?} answered although egpud was killed: {}", String::from_utf8_lossy(&o.stdout));
    let mut d = node.daemon.take().expect("started");
    let st = d.wait().unwrap();
    assert_eq!(st.signal(), Some(libc::SIGKILL), "{point}: egpud was not killed at the crash point ({st}); log:\n{}", node.log());
    assert!(node.log().lines().any(|l| l.contains("EGPU_CRASH_AT: killing egpud here") && l.contains(point)), "{point}: log:\n{}", node.log());
    node.env.clear();
    node.restart();
    (node, p)
}

fn limits(node: &Node, name: &str) -> egpu_abi::LimitsSnapshot {
    LimitsReader::open(&node.run_dir().join("slices").join(name).join("limits")).unwrap().snapshot()
}

/// The workload is still in slice `a` with its memory charged, and exits cleanly.
fn workload_ran_on(node: &Node, mut p: Lines, point: &str) {
    let a = node.slice("a");
    assert_eq!(live_pids(std::slice::from_ref(&a)).len(), 1, "{point}: {a}");
    assert!(a["devices"][0]["used_bytes"].as_u64().unwrap() >= 256 << 20, "{point}: {a}");
    let st = p.finish(T).expect("probe exits when stdin closes");
    assert!(st.success(), "{point}: {st}");
}

#[test]
fn a_create_cut_short_leaves_a_whole_slice() {
    for point in ["create-stored", "create-published"] {
        let (node, p) = crashed_at(point, &["create", "--name", "b", "--gpu-memory", "1GiB"]);
        // Stored before its files, so adopted, its files made again where
        // the kill came before them.
        assert_eq!(node.slice("b")["devices"][0]["memory_limit_bytes"], 1u64 << 30, "{point}");
        assert_eq!(limits(&node, "b").devices()[0].mem_limit, 1 << 30, "{point}");
        assert_eq!(limits(&node, "b").state, SliceState::Active, "{point}");
        assert_fails(&node.egpu(&["create", "--name", "b", "--gpu-memory", "1GiB"]), 4, &["already exists"]);
        workload_ran_on(&node, p, point);
    }
}

#[test]
fn a_resize_cut_short_after_its_commit_is_published_by_the_next_egpud() {
    for point in ["resize-stored", "resize-published"] {
        let (node, p) = crashed_at(point, &["resize", "a", "--gpu-memory", "3GiB"]);
        assert_eq!(node.slice("a")["devices"][0]["memory_limit_bytes"], 3u64 << 30, "{point}");
        assert_eq!(limits(&node, "a").devices()[0].mem_limit, 3 << 30, "{point}: the workload's table");
        workload_ran_on(&node, p, point);
    }
}

#[test]
fn a_delete_cut_short_leaves_the_slice_or_removes_it_once_its_workload_is_gone() {
    // Marked deleted but still stored: the slice is still there, live again.
    let (node, p) = crashed_at("delete-marked", &["rm", "--force", "a"]);
    assert_eq!(limits(&node, "a").state, SliceState::Active);
    workload_ran_on(&node, p, "delete-marked");

    // Out of the store: gone, its directory kept (marked deleted) until the
    // workload exits.
    let (node, mut p) = crashed_at("delete-unstored", &["rm", "--force", "a"]);
    assert!(node.slices().is_empty(), "{:?}", node.slices());
    let dir = node.run_dir().join("slices/a");
    assert_eq!(limits(&node, "a").state, SliceState::Deleted);
    let st = p.finish(T).expect("probe exits when stdin closes");
    assert!(st.success(), "{st}");
    assert!(wait_until(T, || !dir.exists()), "the directory of a deleted slice outlived its workload; log:\n{}", node.log());
}
