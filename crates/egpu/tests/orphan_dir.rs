//! A crash in the middle of a delete (store entry gone, directory still there)
//! leaves no orphan behind: the restarted egpud marks the directory's limits
//! deleted, removes it at once when nothing is attached, and otherwise once the
//! attached process has exited.

mod common;
use common::*;
use egpu_abi::{LimitsReader, SliceState};
use std::time::Duration;

const T: Duration = Duration::from_secs(30);

#[test]
fn slice_directories_without_a_stored_slice_are_marked_deleted_and_removed() {
    let mut node = Node::start("1x16GiB");
    node.ok(&["create", "--name", "busy", "--gpu-memory", "2GiB"]);
    node.ok(&["create", "--name", "idle", "--gpu-memory", "1GiB"]);
    let mut cmd = node.cli();
    cmd.args(["exec", "busy", "--"]).arg(probe_path()).args(["grow", "--step", "256MiB", "--until", "256MiB", "--hold"]);
    let mut p = Lines::spawn(cmd);
    p.wait_event("holding", T).unwrap_or_else(|| panic!("probe did not allocate: {:?}", p.seen));

    // A crash after the store entries went, before the directories did.
    node.kill9();
    {
        let store = egpu_node::store::Store::open(&node.state_dir()).unwrap();
        store.remove("busy").unwrap();
        store.remove("idle").unwrap();
    }
    let (busy, idle) = (node.run_dir().join("slices/busy"), node.run_dir().join("slices/idle"));
    let lim = LimitsReader::open(&busy.join("limits")).unwrap();
    assert_eq!(lim.snapshot().state, SliceState::Active);
    node.restart();

    assert!(node.slices().is_empty());
    assert!(!idle.exists(), "orphaned directory with nothing attached must go at start-up");
    assert!(busy.exists(), "orphaned directory must stay while a live process is attached");
    assert_eq!(lim.snapshot().state, SliceState::Deleted, "attached processes must stop allocating");

    let st = p.finish(T).expect("probe exits when stdin closes");
    assert!(st.success(), "{st}");
    assert!(wait_until(T, || !busy.exists()), "orphaned directory not removed after its process exited; log:\n{}", node.log());
}
