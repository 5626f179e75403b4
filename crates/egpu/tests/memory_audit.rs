//! egpud's memory audit finds memory the hook cannot follow: a VMM
//! allocation exported, imported back into the same process, mapped, and
//! its original handle released. The hook uncharged it at the release; the
//! driver still holds it for the process. With `--memory-audit charge` the
//! slice cannot allocate past its limit through it; by default it is only
//! reported.

mod common;
use common::*;
use std::time::Duration;

const T: Duration = Duration::from_secs(30);
const MIB: u64 = 1 << 20;
/// The audit's default slack.
const SLACK: u64 = 64 * MIB;

fn device(node: &Node, slice: &str) -> serde_json::Value {
    node.slice(slice)["devices"][0].clone()
}

fn untracked(node: &Node, slice: &str) -> u64 {
    device(node, slice)["untracked_bytes"].as_u64().unwrap()
}

/// A probe in slice `slice` holding `size` of re-imported memory; its
/// `alloc` command asks for `alloc` more.
fn reimport(node: &Node, slice: &str, size: &str, alloc: &str) -> (Lines, serde_json::Value) {
    let mut cmd = node.cli();
    cmd.args(["exec", slice, "--"]).arg(probe_path()).args(["vmm-reimport", "--size", size, "--alloc", alloc]);
    let mut p = Lines::spawn(cmd);
    let ev = p.wait_event("reimported", T).unwrap_or_else(|| panic!("probe did not re-import: {:?}", p.seen));
    (p, ev)
}

fn say(p: &mut Lines, line: &str, event: &str) -> serde_json::Value {
    use std::io::Write;
    let stdin = p.child.stdin.as_mut().unwrap();
    writeln!(stdin, "{line}").unwrap();
    stdin.flush().unwrap();
    p.wait_event(event, T).unwrap_or_else(|| panic!("no {event} after {line}: {:?}", p.seen))
}

#[test]
fn charge_mode_counts_memory_the_hook_cannot_follow_against_the_limit() {
    let node = Node::start_with("1x16GiB", &["--memory-audit", "charge"]);
    node.ok(&["create", "--name", "a", "--gpu-memory", "1GiB"]);
    let (mut p, ev) = reimport(&node, "a", "512MiB", "768MiB");
    assert_eq!(ev["bytes"].as_u64(), Some(512 * MIB));
    let charged = device(&node, "a")["used_bytes"].as_u64().unwrap();
    assert!(charged < 512 * MIB, "the hook uncharged the released original (the gap under test): {charged}");

    // Three audits a second apart, then the gap is counted.
    assert!(wait_until(T, || untracked(&node, "a") > 0), "no untracked memory found; log:\n{}", node.log());
    let d = device(&node, "a");
    let found = d["untracked_bytes"].as_u64().unwrap();
    assert_eq!(found, 512 * MIB - SLACK, "the whole re-imported allocation, less the slack: {d}");
    assert!(d["driver_used_bytes"].as_u64().unwrap() >= 512 * MIB, "{d}");
    assert!(node.log().contains("more memory for the slice's processes than they were charged"), "no warning; log:\n{}", node.log());
    assert!(node.ok(&["ls"]).contains("untracked"), "{}", node.ok(&["ls"]));

    // 768 MiB fits what the records charge (< 1 GiB) but not what the
    // driver holds: refused, and the slice's free memory says so.
    let a = say(&mut p, "alloc", "alloc");
    assert_eq!(a["ok"], false, "an allocation past the limit through untracked memory was allowed: {a}");
    let free = a["mem"]["free"].as_u64().unwrap();
    assert!(free + found <= 1024 * MIB, "cuMemGetInfo's free does not count the untracked memory: {a}");

    // Released: the gap goes at the next audit, and the allocation fits.
    say(&mut p, "release", "released");
    assert!(wait_until(T, || untracked(&node, "a") == 0), "untracked memory stayed after the release; log:\n{}", node.log());
    let a = say(&mut p, "alloc", "alloc");
    assert_eq!(a["ok"], true, "{a}");
    assert!(p.finish(T).expect("probe exits").success());
}

#[test]
fn by_default_the_audit_reports_and_a_restart_in_report_mode_takes_the_charge_back() {
    let mut node = Node::start_with("1x16GiB", &["--memory-audit", "charge"]);
    node.ok(&["create", "--name", "b", "--gpu-memory", "1GiB"]);
    let (mut p, _) = reimport(&node, "b", "512MiB", "768MiB");
    assert!(wait_until(T, || untracked(&node, "b") > 0), "log:\n{}", node.log());
    assert_eq!(say(&mut p, "alloc", "alloc")["ok"], false);

    // A crash, and egpud comes back with the default (report): what the
    // earlier one counted against the limit is taken back at once, and the
    // gap is still reported.
    node.kill9();
    node.extra = vec!["--metrics-addr".into(), "127.0.0.1:0".into()];
    node.restart();
    let a = say(&mut p, "alloc", "alloc");
    assert_eq!(a["ok"], true, "report mode left the charge in the limits file: {a}");
    assert!(wait_until(T, || untracked(&node, "b") == 512 * MIB - SLACK), "not reported: {}", device(&node, "b"));
    let addr_file = node.run_dir().join("metrics.addr");
    assert!(wait_until(T, || addr_file.exists()), "log:\n{}", node.log());
    let addr = std::fs::read_to_string(addr_file).unwrap().trim().to_string();
    let scrape = http_get(&addr, "/metrics").2;
    assert_eq!(
        sample(&scrape, r#"egpu_slice_memory_untracked_bytes{slice="b",device="0"}"#),
        Some((512 * MIB - SLACK) as f64),
        "{scrape}"
    );
    assert!(p.finish(T).expect("probe exits").success());
}

#[test]
fn a_process_in_no_slice_shows_as_unmanaged_and_ordinary_workloads_as_tracked() {
    let node = Node::start("1x16GiB");
    node.ok(&["create", "--name", "c", "--gpu-memory", "2GiB"]);
    let mut cmd = node.cli();
    cmd.args(["exec", "c", "--"]).arg(probe_path()).args(["grow", "--step", "256MiB", "--until", "512MiB", "--hold"]);
    let mut inside = Lines::spawn(cmd);
    inside.wait_event("holding", T).unwrap_or_else(|| panic!("{:?}", inside.seen));
    // A process on the simulated GPU without the hook: no slice, no record.
    let mut outside = Lines::spawn({
        let mut c = std::process::Command::new(probe_path());
        c.args(["grow", "--step", "128MiB", "--until", "128MiB", "--hold"]);
        for (k, v) in node.slice_env("c") {
            if k != "LD_PRELOAD" && !k.starts_with("EGPU_SLICE") {
                c.env(k, v);
            }
        }
        c.env_remove("LD_PRELOAD");
        c
    });
    outside.wait_event("holding", T).unwrap_or_else(|| panic!("{:?}", outside.seen));
    let unmanaged = || node.json(&["devices", "-o", "json"])["devices"][0]["unmanaged_bytes"].as_u64();
    assert!(wait_until(T, || unmanaged().is_some_and(|b| b >= 128 * MIB)), "{:?}; log:\n{}", unmanaged(), node.log());
    // The slice's own workload: everything it holds is charged.
    assert!(wait_until(T, || device(&node, "c")["driver_used_bytes"].as_u64().is_some_and(|b| b >= 512 * MIB)), "{}", device(&node, "c"));
    // A slice beside it with memory the hook lost: once that is found
    // (three audits after it was made, so at least three since `c` held its
    // memory), `c` must still have nothing untracked.
    node.ok(&["create", "--name", "e", "--gpu-memory", "1GiB"]);
    let (mut lost, _) = reimport(&node, "e", "256MiB", "64MiB");
    assert!(wait_until(T, || untracked(&node, "e") > 0), "{}; log:\n{}", device(&node, "e"), node.log());
    assert_eq!(untracked(&node, "c"), 0, "a workload the hook follows has nothing untracked: {}", device(&node, "c"));
    assert!(lost.finish(T).expect("probe exits").success());
    for l in [&mut inside, &mut outside] {
        assert!(l.finish(T).expect("probe exits").success());
    }
}

#[test]
fn untracked_memory_past_the_guarantee_is_counted_as_lent_in_the_burst_pool() {
    let node = Node::start("1x16GiB");
    node.ok(&["create", "--name", "d", "--gpu-memory", "512MiB"]);
    // Each fits the limit when it is made, and is then lost to the hook:
    // by default (report) nothing stops the second, and the slice ends up
    // holding more than its guarantee.
    let (mut p, _) = reimport(&node, "d", "448MiB", "64MiB");
    let (mut q, _) = reimport(&node, "d", "448MiB", "64MiB");
    assert!(wait_until(T, || untracked(&node, "d") > 512 * MIB), "{}; log:\n{}", device(&node, "d"), node.log());
    let d = device(&node, "d");
    let held = d["used_bytes"].as_u64().unwrap() + d["untracked_bytes"].as_u64().unwrap();
    // The device's burst pool counts what the slice really occupies beyond
    // its guarantee as lent: new guarantees and grants do not use it.
    let lent = node.json(&["devices", "-o", "json"])["devices"][0]["lent_memory_bytes"].as_u64().unwrap();
    assert_eq!(lent, held - 512 * MIB, "{d}");
    for l in [&mut p, &mut q] {
        assert!(l.finish(T).expect("probe exits").success());
    }
}
