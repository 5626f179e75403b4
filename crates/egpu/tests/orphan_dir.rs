//! A crash in the middle of a delete (limits marked deleted, store entry
//! gone, directory still there) leaves no orphan behind: the restarted egpud
//! removes the directory at once when nothing is attached, and otherwise once
//! the attached process has exited. A directory whose limits are still live
//! is a slice the store lost (another `--state-dir`, a store rolled back):
//! egpud refuses to start and changes nothing. A resize the store lost comes
//! back from the slice's limits file, and its workload keeps the new limits.

mod common;
use common::*;
use egpu_abi::{LimitsReader, SliceState};
use std::time::Duration;

const T: Duration = Duration::from_secs(30);

/// A node with the slices `names` (the first of 2 GiB, the others 1 GiB)
/// and a probe holding 256 MiB in the first.
fn busy_node(names: &[&str]) -> (Node, Lines) {
    let node = Node::start("1x16GiB");
    for (i, name) in names.iter().enumerate() {
        node.ok(&["create", "--name", name, "--gpu-memory", if i == 0 { "2GiB" } else { "1GiB" }]);
    }
    let mut cmd = node.cli();
    cmd.args(["exec", names[0], "--"]).arg(probe_path()).args(["grow", "--step", "256MiB", "--until", "256MiB", "--hold"]);
    let mut p = Lines::spawn(cmd);
    p.wait_event("holding", T).unwrap_or_else(|| panic!("probe did not allocate: {:?}", p.seen));
    (node, p)
}

#[test]
fn slice_directories_without_a_stored_slice_are_marked_deleted_and_removed() {
    let (mut node, mut p) = busy_node(&["busy", "idle"]);

    // A crash after the delete marked the limits deleted and removed the
    // store entries, before the directories went.
    node.kill9();
    let (busy, idle) = (node.run_dir().join("slices/busy"), node.run_dir().join("slices/idle"));
    for d in [&busy, &idle] {
        egpu_abi::LimitsWriter::open(&d.join("limits")).unwrap().mark_deleted();
    }
    {
        let store = egpu_node::store::Store::open(&node.state_dir()).unwrap();
        store.remove("busy").unwrap();
        store.remove("idle").unwrap();
    }
    node.restart();

    assert!(node.slices().is_empty());
    assert!(!idle.exists(), "orphaned directory with nothing attached must go at start-up");
    assert!(busy.exists(), "orphaned directory must stay while a live process is attached");

    let st = p.finish(T).expect("probe exits when stdin closes");
    assert!(st.success(), "{st}");
    assert!(wait_until(T, || !busy.exists()), "orphaned directory not removed after its process exited; log:\n{}", node.log());
}

#[test]
fn live_slices_the_store_lost_keep_egpud_from_starting_and_are_left_as_they_are() {
    let (mut node, mut p) = busy_node(&["busy", "idle", "kept"]);

    // The store loses two live slices (as a store rolled back to an older
    // commit does, or another --state-dir), keeping the third.
    node.kill9();
    let saved = {
        let store = egpu_node::store::Store::open(&node.state_dir()).unwrap();
        let all = store.load_all().unwrap();
        store.remove("busy").unwrap();
        store.remove("idle").unwrap();
        all
    };
    let mut d = node.daemon_cmd().stdout(std::process::Stdio::null()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    let mut st = None;
    let exited = wait_until(T, || {
        st = d.try_wait().unwrap();
        st.is_some()
    });
    if !exited {
        d.kill().unwrap();
        d.wait().unwrap();
    }
    assert!(exited && !st.unwrap().success(), "egpud started on top of a store that lost live slices");
    let mut err = String::new();
    std::io::Read::read_to_string(&mut d.stderr.take().unwrap(), &mut err).unwrap();
    assert!(err.contains("live slices that the store has no record of: busy, idle") && err.contains("--state-dir") && err.contains("changed nothing") && err.contains("--drop-unstored-slices") && err.contains("--adopt-unstored-slices"), "{err}");
    // Nothing changed: the slices are live, their processes keep their limits.
    for name in ["busy", "idle", "kept"] {
        let lim = LimitsReader::open(&node.run_dir().join("slices").join(name).join("limits")).unwrap();
        assert_eq!(lim.snapshot().state, SliceState::Active, "{name}");
    }
    // With the store whole again, egpud adopts all three and the workload.
    {
        let store = egpu_node::store::Store::open(&node.state_dir()).unwrap();
        for r in &saved {
            store.put(r).unwrap();
        }
    }
    node.restart();
    let names: Vec<String> = node.slices().iter().map(|s| s["name"].as_str().unwrap().to_string()).collect();
    assert_eq!(names, ["busy", "idle", "kept"]);
    let busy = node.slice("busy");
    assert_eq!(live_pids(std::slice::from_ref(&busy)).len(), 1, "{busy}");
    assert!(busy["devices"][0]["used_bytes"].as_u64().unwrap() >= 256 << 20, "the workload's memory is still charged: {busy}");
    let st = p.finish(T).expect("probe exits when stdin closes");
    assert!(st.success(), "{st}");

    // Dropping them is asked for: the store loses `idle` again, and egpud
    // started with --drop-unstored-slices marks it deleted and removes it.
    node.kill9();
    egpu_node::store::Store::open(&node.state_dir()).unwrap().remove("idle").unwrap();
    let idle = node.run_dir().join("slices/idle");
    node.extra.push("--drop-unstored-slices".into());
    node.restart();
    let names: Vec<String> = node.slices().iter().map(|s| s["name"].as_str().unwrap().to_string()).collect();
    assert_eq!(names, ["busy", "kept"]);
    assert!(!idle.exists(), "a dropped slice with nothing attached goes at start-up");
}

#[test]
fn a_resize_the_store_lost_comes_back_from_the_limits_file_and_the_workload_keeps_it() {
    let (mut node, mut p) = busy_node(&["busy"]);
    // The store as it is before the resize: what redb falls back to when a
    // damaged store's last commit does not check.
    node.kill9();
    let store = node.state_dir().join(egpu_node::store::STORE_FILE);
    let before = node.state_dir().join("before-resize");
    std::fs::copy(&store, &before).unwrap();
    node.restart();
    node.ok(&["resize", "busy", "--gpu-memory", "3GiB", "--gpu-memory-burst", "5GiB", "--gpu-compute", "20%", "--priority", "high"]);
    let resized = node.slice("busy");
    node.kill9();
    std::fs::copy(&before, &store).unwrap();
    node.restart();

    let s = node.slice("busy");
    for key in ["memory_limit_bytes", "memory_burst_bytes", "compute_share_percent", "compute_limit_percent"] {
        assert_eq!(s["devices"][0][key], resized["devices"][0][key], "{key}: {s}\nwas {resized}");
    }
    assert_eq!(s["priority"], "high", "{s}");
    assert_eq!(s["devices"][0]["memory_limit_bytes"].as_u64(), Some(3 << 30), "{s}");
    assert!(node.log().contains("the store lost its last commit"), "{}", node.log());
    // The workload's table says the resized limit, and the probe is still there with its memory.
    let lim = LimitsReader::open(&node.run_dir().join("slices/busy/limits")).unwrap();
    assert_eq!(lim.snapshot().devices()[0].mem_limit, 3 << 30);
    assert_eq!(live_pids(std::slice::from_ref(&s)).len(), 1, "{s}");
    // Taken back into the store: a restart from it alone gives the same.
    node.kill9();
    let stored = egpu_node::store::Store::open(&node.state_dir()).unwrap().load_all().unwrap();
    assert_eq!(stored[0].spec.devices[0].memory.0, 3 << 30);
    assert_eq!(stored[0].rev, 2);
    node.restart();
    assert_eq!(node.slice("busy")["devices"][0]["memory_limit_bytes"].as_u64(), Some(3 << 30));
    let st = p.finish(T).expect("probe exits when stdin closes");
    assert!(st.success(), "{st}");
}

#[test]
fn live_slices_the_store_lost_are_taken_back_with_adopt_unstored_slices_and_their_workload_runs_on() {
    let (mut node, mut p) = busy_node(&["busy", "kept"]);
    node.ok(&["resize", "busy", "--gpu-compute", "30%", "--gpu-memory-burst", "4GiB"]);
    let before = node.slice("busy");
    node.kill9();
    egpu_node::store::Store::open(&node.state_dir()).unwrap().remove("busy").unwrap();
    node.extra.push("--adopt-unstored-slices".into());
    node.restart();

    let s = node.slice("busy");
    for key in ["memory_limit_bytes", "memory_burst_bytes", "compute_share_percent", "compute_limit_percent", "uuid"] {
        assert_eq!(s["devices"][0][key], before["devices"][0][key], "{key}: {s}\nwas {before}");
    }
    assert_ne!(s["id"], before["id"], "a new slice record");
    assert_eq!(live_pids(std::slice::from_ref(&s)).len(), 1, "the workload is still in its slice: {s}");
    assert!(s["devices"][0]["used_bytes"].as_u64().unwrap() >= 256 << 20, "its memory is still charged: {s}");
    assert!(node.log().contains("taken back from its limits file"), "{}", node.log());
    let names: Vec<String> = node.slices().iter().map(|s| s["name"].as_str().unwrap().to_string()).collect();
    assert_eq!(names, ["busy", "kept"]);
    // The flag cannot be given with --drop-unstored-slices.
    let o = node.daemon_cmd().arg("--drop-unstored-slices").output().unwrap();
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("cannot be used with"), "{}", String::from_utf8_lossy(&o.stderr));
    let st = p.finish(T).expect("probe exits when stdin closes");
    assert!(st.success(), "{st}");
}
