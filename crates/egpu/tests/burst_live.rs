//! Burst memory end to end: egpud, libegpu.so and egpu-probe on the
//! simulated GPU. A slice with `--gpu-memory-burst` grows past its guarantee
//! while the device has unreserved memory; a second bursting slice is held
//! at what is left; when the first one exits, its grant comes back and the
//! second one gets it, all without a resize.

mod common;
use common::*;
use std::time::Duration;

const T: Duration = Duration::from_secs(30);
const GIB: u64 = 1 << 30;

fn grow(node: &Node, slice: &str, until: &str) -> Lines {
    let mut cmd = node.cli();
    cmd.args(["exec", slice, "--"]).arg(probe_path()).args(["grow", "--step", "256MiB", "--until", until, "--hold"]);
    Lines::spawn(cmd)
}

fn dev(node: &Node, slice: &str) -> serde_json::Value {
    node.slice(slice)["devices"][0].clone()
}

#[test]
fn bursting_slices_share_the_unreserved_memory() {
    let node = Node::start("1x4GiB");
    // Guarantees 1 + 1 of 4 GiB: 2 GiB are unreserved, the burst pool.
    node.ok(&["create", "--name", "a", "--gpu-memory", "1GiB", "--gpu-memory-burst", "3GiB"]);
    node.ok(&["create", "--name", "b", "--gpu-memory", "1GiB", "--gpu-memory-burst", "3GiB"]);
    let d = dev(&node, "a");
    assert_eq!(d["memory_limit_bytes"], GIB, "{d}");
    assert_eq!(d["memory_burst_bytes"], 3 * GIB, "{d}");

    let mut a = grow(&node, "a", "2GiB");
    a.wait_event("holding", T).unwrap_or_else(|| panic!("a never got past its 1 GiB guarantee: {:?}", a.seen));
    let d = dev(&node, "a");
    let granted = d["memory_granted_bytes"].as_u64().unwrap();
    assert!(granted >= GIB && d["used_bytes"].as_u64().unwrap() <= GIB + granted, "{d}");
    let table = node.ok(&["ls"]);
    assert!(table.contains("1GiB (+") && table.contains("burst 3GiB)"), "{table}");

    // b can borrow only what a left of the pool: it blocks below 2 GiB.
    let mut b = grow(&node, "b", "2GiB");
    let blocked = b.wait_event("blocked", T).unwrap_or_else(|| panic!("b was never held: {:?}", b.seen));
    let total = blocked["total"].as_u64().unwrap();
    assert!(total < 2 * GIB, "{blocked}");
    let (da, db) = (dev(&node, "a"), dev(&node, "b"));
    let lent = da["memory_granted_bytes"].as_u64().unwrap() + db["memory_granted_bytes"].as_u64().unwrap();
    assert!(lent <= 2 * GIB, "more lent than the pool: {da} {db}");
    assert!(db["refused_allocations"].as_u64().unwrap() >= 1, "{db}");
    // `egpu devices` shows what is lent; FREE is what a new guarantee can get now.
    let devs = node.json(&["devices", "-o", "json"]);
    let d0 = &devs["devices"][0];
    assert_eq!(d0["lent_memory_bytes"].as_u64().unwrap(), lent, "{d0}");
    assert_eq!(d0["free_memory_bytes"].as_u64().unwrap(), 4 * GIB - 2 * GIB - lent, "{d0}");
    // Guarantees stay reserved: a third slice may only take what no one reserved or borrowed.
    assert_fails(&node.egpu(&["create", "--name", "c", "--gpu-memory", "1GiB"]), 4, &["lent out"]);

    // a exits: its memory and then its grant come back; b gets them.
    let st = a.finish(T).expect("a exits when stdin closes");
    assert!(st.success(), "{st}");
    b.wait_event("unblocked", T).unwrap_or_else(|| panic!("b never got a's returned memory: {:?}", b.seen));
    b.wait_event("holding", T).expect("b reaches 2 GiB");
    assert!(wait_until(T, || dev(&node, "a")["memory_granted_bytes"] == 0), "a's grant is taken back");
    let st = b.finish(T).expect("b exits");
    assert!(st.success(), "{st}");
}

#[test]
fn a_killed_egpud_leaves_grants_in_place_and_a_restarted_one_adopts_them() {
    let mut node = Node::start("1x4GiB");
    node.ok(&["create", "--name", "a", "--gpu-memory", "1GiB", "--gpu-memory-burst", "3GiB"]);
    let mut a = grow(&node, "a", "2GiB");
    a.wait_event("holding", T).unwrap_or_else(|| panic!("a never got past its guarantee: {:?}", a.seen));
    let granted = dev(&node, "a")["memory_granted_bytes"].as_u64().unwrap();
    assert!(granted >= GIB, "{granted}");

    // egpud dies: the workload keeps running with its limit (guarantee + grant).
    node.kill9();
    assert!(a.child.try_wait().unwrap().is_none(), "the workload must survive egpud");
    node.restart();
    let d = dev(&node, "a");
    assert_eq!(d["memory_granted_bytes"].as_u64().unwrap(), granted, "the restarted egpud adopts the grant: {d}");
    assert!(d["used_bytes"].as_u64().unwrap() >= 2 * GIB, "{d}");
    // What is lent still counts against new guarantees: 4 GiB − 1 GiB − the grant.
    let devs = node.json(&["devices", "-o", "json"]);
    assert_eq!(devs["devices"][0]["lent_memory_bytes"].as_u64().unwrap(), granted, "{devs}");
    let free = 4 * GIB - GIB - granted;
    let too_big = format!("{}MiB", free / (1 << 20) + 1);
    assert_fails(&node.egpu(&["create", "--name", "c", "--gpu-memory", &too_big]), 4, &["lent out"]);

    // The workload exits; its memory comes back, then (after the linger) the grant.
    let st = a.finish(T).expect("a exits when stdin closes");
    assert!(st.success(), "{st}");
    assert!(wait_until(T, || dev(&node, "a")["memory_granted_bytes"] == 0), "the grant is taken back");
    // Lent until egpud has confirmed the lowered limit (a tick later).
    assert!(wait_until(T, || node.json(&["devices", "-o", "json"])["devices"][0]["lent_memory_bytes"] == 0), "nothing stays lent");
    node.ok(&["create", "--name", "c", "--gpu-memory", &too_big]);
}
