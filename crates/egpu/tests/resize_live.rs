//! A live resize reaches a running workload: egpu-probe (under libegpu.so on
//! the simulated GPU) blocks at its limit, `egpu resize` raises it, and the
//! probe's next allocation succeeds. Lowering a limit below usage kills nothing.

mod common;
use common::*;
use std::time::Duration;

const T: Duration = Duration::from_secs(30);

#[test]
fn resize_unblocks_a_running_process() {
    let node = Node::start("1x16GiB");
    node.ok(&["create", "--name", "grow", "--gpu-memory", "1GiB"]);
    let mut cmd = node.cli();
    cmd.args(["exec", "grow", "--"]).arg(probe_path()).args(["grow", "--step", "256MiB", "--until", "2GiB", "--hold"]);
    let mut p = Lines::spawn(cmd);
    let blocked = p.wait_event("blocked", T).unwrap_or_else(|| panic!("probe never blocked: {:?}", p.seen));
    assert!(blocked["total"].as_u64().unwrap() < 1 << 30);

    // Usage as egpud reports it: the probe's allocations plus its context, within the limit.
    let s = node.slice("grow");
    let used = s["devices"][0]["used_bytes"].as_u64().unwrap();
    assert!(used >= blocked["total"].as_u64().unwrap() && used <= 1 << 30, "{s}");
    assert!(s["devices"][0]["refused_allocations"].as_u64().unwrap() >= 1);
    assert_eq!(s["processes"].as_array().unwrap().len(), 1);

    node.ok(&["resize", "grow", "--gpu-memory", "3GiB"]);
    let un = p.wait_event("unblocked", T).unwrap_or_else(|| panic!("probe not unblocked by the resize: {:?}", p.seen));
    assert!(un["t_ns"].as_u64().unwrap() > blocked["t_ns"].as_u64().unwrap());
    p.wait_event("holding", T).expect("probe reaches --until after the resize");
    assert!(node.slice("grow")["devices"][0]["used_bytes"].as_u64().unwrap() >= 2 << 30);

    // Lowering below usage: nothing is killed, the process keeps what it has.
    node.ok(&["resize", "grow", "--gpu-memory", "512MiB"]);
    assert!(p.child.try_wait().unwrap().is_none(), "a lower limit must not kill the workload");
    assert!(node.slice("grow")["devices"][0]["used_bytes"].as_u64().unwrap() >= 2 << 30);

    // `rm` refuses while it is attached; after it exits, usage returns to zero and rm works.
    assert_fails(&node.egpu(&["rm", "grow"]), 4, &["live processes attached", "--force"]);
    let st = p.finish(T).expect("probe exits when stdin closes");
    assert!(st.success(), "{st}");
    assert!(wait_until(T, || node.slice("grow")["devices"][0]["used_bytes"] == 0));
    node.ok(&["rm", "grow"]);
}

#[test]
fn run_slice_limits_a_probe_and_reports_its_exit() {
    let node = Node::start("1x16GiB");
    // The probe stops at the limit (exit 3 = out of memory) and egpu run passes that on.
    let mut cmd = node.cli();
    cmd.args(["run", "--gpu-memory", "512MiB", "--"]).arg(probe_path()).args(["alloc", "--family", "mem", "--size", "64MiB", "--count", "100"]);
    let o = cmd.output().unwrap();
    assert_eq!(o.status.code(), Some(3), "{}", String::from_utf8_lossy(&o.stdout));
    assert!(node.slices().is_empty());
}
