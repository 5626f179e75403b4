//! Whole-process behaviour of libegpu.so on the simulated GPU: fail-closed,
//! the slice's view in CUDA and NVML, live resize, lowered limits, deleted
//! slices, fork, and reclaiming a crashed process's charges.

mod common;

use common::*;

const CTX: u64 = 32 * MIB;
const WAYS: &[&str] = &["direct", "dlopen", "procaddr"];

#[test]
fn fails_closed_without_a_slice_table() {
    let w = World::new("1x4GiB");
    let s = w.slice("x", &[(0, GIB)]);
    for way in WAYS {
        let mut c = w.probe(&s, &["--via", way, "alloc"]);
        c.env("EGPU_SLICE_DIR", w.tmp.path().join("no-such-slice"));
        let d = run(c);
        assert_eq!(d.code, 4, "{way}: exit code says initialisation was refused: {:?}", d.lines);
        assert_eq!(d.event("error")["code"], 3, "{way}: CUDA_ERROR_NOT_INITIALIZED");
        let lines: Vec<&str> = d.stderr.lines().filter(|l| l.starts_with("libegpu:")).collect();
        assert_eq!(lines.len(), 1, "{way}: exactly one message: {}", d.stderr);
        assert!(lines[0].contains("does not exist") && lines[0].contains("egpu run"), "{way}: says what and what to do: {}", lines[0]);
    }
    assert_eq!(w.sim_used(0), 0, "nothing was allocated");
}

#[test]
fn fails_closed_on_another_abi_version() {
    let w = World::new("1x4GiB");
    let s = w.slice("v", &[(0, GIB)]);
    let p = s.dir.join("limits");
    let mut b = std::fs::read(&p).unwrap();
    b[8] = 99;
    std::fs::write(&p, &b).unwrap();
    let d = run(w.probe(&s, &["info"]));
    assert_eq!(d.code, 4);
    assert!(d.stderr.contains("ABI version 99"), "{}", d.stderr);
    // NVML is refused as well (nvmlInit fails with NVML_ERROR_UNINITIALIZED).
    let d = run(w.probe(&s, &["--via", "dlopen", "info"]));
    assert_eq!(d.code, 4);
}

#[test]
fn cuda_and_nvml_report_the_slice_view() {
    let w = World::new("2x4GiB");
    // Slice order is (host 1, host 0): ordinal 0 is host device 1 everywhere.
    let s = w.slice("view", &[(1, GIB), (0, 512 * MIB)]);
    for way in WAYS {
        let d = run(w.probe(&s, &["--via", way, "info"]));
        assert_eq!(d.code, 0, "{way}: {}", d.stderr);
        let v = d.event("info");
        assert_eq!(v["device_count"], 2);
        assert_eq!(v["devices"][0]["uuid"], sim_uuid(1), "{way}: CUDA ordinal 0 is the slice's first device");
        assert_eq!(v["devices"][0]["total_mem"], GIB, "{way}: cuDeviceTotalMem = limit");
        assert_eq!(v["devices"][1]["total_mem"], 512 * MIB);
        assert_eq!(v["mem_get_info"]["total"], GIB, "{way}: cuMemGetInfo total = limit");
        assert_eq!(v["mem_get_info"]["free"], GIB - CTX, "{way}: free = limit - slice usage (the context)");
        let n = &v["nvml"];
        assert_eq!(n["count"], 2, "{way}: NVML shows only slice devices");
        for (i, (uuid, limit)) in [(sim_uuid(1), GIB), (sim_uuid(0), 512 * MIB)].iter().enumerate() {
            let dev = &n["devices"][i];
            assert_eq!(dev["uuid"], *uuid, "{way}: NVML index {i} is slice device {i}");
            assert_eq!(dev["nvml_index"], i, "{way}");
            assert_eq!(dev["memory"]["total"], *limit, "{way}");
            assert_eq!(dev["memory_v2"]["total"], *limit, "{way}");
        }
    }
    // While a process holds memory, NVML lists exactly the slice's processes with their charges.
    let mut p = Running::start(w.probe(&s, &["alloc", "--size", "256MiB", "--hold"]));
    let pid = p.wait_for("holding")["pid"].as_u64().unwrap();
    let d = run(w.probe(&s, &["info"]));
    let dev0 = &d.event("info")["nvml"]["devices"][0];
    let procs = dev0["processes"].as_array().unwrap();
    let holder = procs.iter().find(|x| x["pid"] == pid).unwrap_or_else(|| panic!("holder not listed: {procs:?}"));
    assert_eq!(holder["used"], 256 * MIB + CTX);
    assert_eq!(dev0["memory"]["used"], 256 * MIB + CTX, "the holder's context and allocation (NVML is asked before the query process has a context)");
    assert_eq!(dev0["memory"]["free"], GIB - 256 * MIB - CTX);
    // A process of another slice on the same device is not listed.
    let other = w.slice("other", &[(1, GIB)]);
    let mut q = Running::start(w.probe(&other, &["alloc", "--size", "64MiB", "--hold"]));
    let qpid = q.wait_for("holding")["pid"].as_u64().unwrap();
    let d = run(w.probe(&s, &["info"]));
    assert!(d.event("info")["nvml"]["devices"][0]["processes"].as_array().unwrap().iter().all(|x| x["pid"] != qpid));
    assert_eq!(q.finish().0, 0);
    assert_eq!(p.finish().0, 0);
}

#[test]
fn live_resize_unblocks_a_blocked_allocation() {
    let w = World::new("1x4GiB");
    let s = w.slice("grow", &[(0, 256 * MIB)]);
    let mut p = Running::start(w.probe(&s, &["grow", "--step", "64MiB", "--until", "512MiB"]));
    let b = p.wait_for("blocked");
    assert_eq!(b["total"], 192 * MIB, "192MiB + the context fill 256MiB: {b}");
    assert!(s.used(0) <= 256 * MIB);
    s.set_limits(&[GIB]);
    let u = p.wait_for("unblocked");
    assert!(u["waited_ns"].as_u64().unwrap() > 0);
    let done = p.wait_for("done");
    assert_eq!(done["total"], 512 * MIB);
    assert_eq!(p.finish().0, 0);
    assert_eq!(s.used(0), 0);
}

#[test]
fn a_lowered_limit_refuses_new_allocations_but_kills_nothing() {
    let w = World::new("1x4GiB");
    let s = w.slice("shrink", &[(0, GIB)]);
    let mut p = Running::start(w.probe(&s, &["alloc", "--size", "512MiB", "--hold"]));
    p.wait_for("holding");
    s.set_limits(&[256 * MIB]);
    // Over the limit now: queries clamp (no underflow, no failure); new allocations fail.
    let d = run(w.probe(&s, &["alloc", "--size", "1MiB"]));
    assert_eq!(d.code, 4, "even a context no longer fits: {:?}", d.lines);
    assert_eq!(d.event("error")["code"], 2, "CUDA_ERROR_OUT_OF_MEMORY");
    assert!(p.child.try_wait().unwrap().is_none(), "the holder keeps running");
    let (code, rest) = p.finish();
    assert_eq!(code, 0, "frees work over the limit: {rest:?}");
    let after = &rest.iter().find(|v| v["event"] == "summary").unwrap()["mem_after_free"];
    assert_eq!(after["free"], 256 * MIB - CTX);
    assert_eq!(s.used(0), 0);
}

#[test]
#[allow(non_snake_case)]
fn cuMemGetInfo_and_nvml_never_underflow_over_the_limit() {
    let w = World::new("1x4GiB");
    let s = w.slice("under", &[(0, GIB)]);
    let mut p = Running::start(w.probe(&s, &["grow", "--step", "256MiB", "--until", "768MiB", "--hold"]));
    p.wait_for("holding");
    s.set_limits(&[512 * MIB]);
    p.write("info\n");
    let m = p.wait_for("mem");
    assert_eq!(m["mem"]["total"], 512 * MIB, "{m}");
    assert_eq!(m["mem"]["free"], 0, "over the limit: free is 0, not a wrapped-around number: {m}");
    let d = run(w.probe(&s, &["info"]));
    let nv = &d.event("nvml")["nvml"]["devices"][0]["memory"];
    assert_eq!(nv["total"], 512 * MIB);
    assert_eq!(nv["free"], 0, "{nv}");
    assert_eq!(nv["used"], 512 * MIB, "used is clamped to total: {nv}");
    assert_eq!(p.finish().0, 0);
    assert_eq!(s.used(0), 0);
}

#[test]
fn a_deleted_slice_refuses_new_allocations() {
    let w = World::new("1x4GiB");
    let s = w.slice("del", &[(0, GIB)]);
    let mut p = Running::start(w.probe(&s, &["alloc", "--size", "64MiB", "--hold", "--wait-go"]));
    p.wait_for("ready");
    s.writer.mark_deleted();
    p.write("go\n");
    let (code, lines) = p.finish();
    assert_eq!(code, 3, "{lines:?}");
    assert!(lines.iter().any(|v| v["event"] == "oom"), "{lines:?}");
}

#[test]
fn a_fork_child_claims_its_own_record() {
    let w = World::new("1x4GiB");
    let s = w.slice("fork", &[(0, GIB)]);
    let d = run(w.probe(&s, &["fork", "--size", "128MiB"]));
    assert_eq!(d.code, 0, "{:?} {}", d.lines, d.stderr);
    let child = d.event("child");
    assert_eq!(child["ok"], true);
    assert_ne!(child["pid"], d.event("parent-alloc")["pid"]);
    // The child's slice view counts the parent's allocation and its own, and both contexts.
    assert_eq!(child["mem"]["free"], GIB - 2 * 128 * MIB - 2 * CTX, "{child}");
    assert_eq!(s.used(0), 0);
}

// Racing attachments need the debug-only hold of libegpu.so
// (EGPU_HOOK_TEST_INIT_DELAY_MS / _MARK); release builds have no such hook.
/// `egpu-probe ARGS` in `s` with the k-th attachment held k × `delay_ms`
/// and marked under the world's temp dir.
#[cfg(debug_assertions)]
fn held_attach_probe(w: &World, s: &Slice, args: &[&str], delay_ms: u64) -> std::process::Command {
    let mut c = w.probe(s, args);
    c.env("EGPU_HOOK_TEST_INIT_DELAY_MS", delay_ms.to_string()).env("EGPU_HOOK_TEST_INIT_MARK", w.tmp.path().join("attach"));
    c
}

#[cfg(debug_assertions)]
#[test]
fn a_child_forked_while_the_parent_attaches_does_not_block() {
    // Another thread of the parent is inside its first driver call (the
    // debug libegpu.so holds its attachment for 1 s, and says when it has
    // begun) when the process forks. The child has no such thread: with a
    // blocking once-cell it would wait for it forever.
    let w = World::new("1x4GiB");
    let s = w.slice("forkinit", &[(0, GIB)]);
    let d = run(held_attach_probe(&w, &s, &["fork", "--size", "64MiB", "--during-init", "--child-timeout-s", "20"], 1000));
    assert_eq!(d.event("init-entered")["inside"], true, "forked inside the attachment: {:?} {}", d.lines, d.stderr);
    let done = d.event("parent-done");
    assert_eq!(done["child_blocked"], false, "{:?} {}", d.lines, d.stderr);
    assert_eq!(d.code, 0, "{:?} {}", d.lines, d.stderr);
    assert_eq!(d.event("child")["ok"], true);
    assert_eq!(done["first_call_ok"], true);
    assert_eq!(s.used(0), 0);
}

#[cfg(debug_assertions)]
#[test]
fn a_losing_racing_attachment_keeps_the_record_owned() {
    // Two threads attach at once; the first finishes, claims this process's
    // record and allocates; the second finishes later and loses. Dropping
    // the loser closed its descriptor of the usage file, which released the
    // process's record lock: a sweep by anyone else then took the live
    // process's record and its charges.
    let w = World::new("1x4GiB");
    let s = w.slice("race", &[(0, GIB)]);
    let mut p = Running::start(held_attach_probe(&w, &s, &["alloc", "--size", "256MiB", "--racing-init", "--hold"], 300));
    assert_eq!(p.wait_for("racer-done")["ok"], true);
    p.wait_for("holding");
    assert!(s.used(0) >= 256 * MIB);
    let reclaimed = s.usage.sweep(None);
    assert!(reclaimed.is_empty(), "a live process's record was swept: {reclaimed:?}");
    assert!(s.used(0) >= 256 * MIB, "charges of a live process lost");
    assert_eq!(p.finish().0, 0);
    assert_eq!(s.used(0), 0);
}

#[test]
fn a_crashed_process_is_swept_when_memory_runs_short() {
    let w = World::new("1x4GiB");
    let s = w.slice("crash", &[(0, 512 * MIB)]);
    let d = run(w.probe(&s, &["alloc", "--size", "384MiB", "--no-free"]));
    assert_eq!(d.code, 0);
    // The dead process's record still holds its charges (nobody swept yet).
    assert!(s.used(0) >= 384 * MIB);
    // The next process would not fit; the hook sweeps the dead record and succeeds.
    let d = run(w.probe(&s, &["alloc", "--size", "384MiB"]));
    assert_eq!(d.code, 0, "{:?}", d.lines);
    assert_eq!(s.used(0), 0);
}

/// `cuMemAllocAsync` takes memory from the pool of the *stream's* device. A
/// stream of device 1 used while device 0's context is current is charged
/// to slice device 1, where the simulated driver puts the memory.
#[test]
fn an_async_allocation_is_charged_to_its_streams_device_not_the_current_one() {
    let w = World::new("2x4GiB");
    let s = w.slice("streams", &[(0, GIB), (1, GIB)]);
    for way in WAYS {
        let args = ["--via", way, "--device", "1", "alloc", "--family", "async", "--size", "256MiB", "--count", "2", "--current-device", "0", "--hold"];
        let mut p = Running::start(w.probe(&s, &args));
        p.wait_for("holding");
        let (on0, on1) = (s.used(0), s.used(1));
        assert_eq!(on1, 512 * MIB + CTX, "{way}: slice device 1 holds the allocations and its context");
        assert_eq!(on0, CTX, "{way}: slice device 0 holds only the current context");
        assert!(w.sim_used(1) >= 512 * MIB, "{way}: the simulated driver put them on device 1");
        let (code, rest) = p.finish();
        assert_eq!(code, 0, "{way}: {rest:?}");
        // The frees went to device 1; device 0's context was never released,
        // so its charge goes when the dead process's record is swept (egpud's job).
        assert_eq!((s.used(0), s.used(1)), (CTX, 0), "{way}: after the frees: {rest:?}");
        s.usage.sweep(None);
        assert_eq!(s.used(0), 0, "{way}");
    }
}

/// A pool the program never created (a device's default pool, from
/// `cuDeviceGetDefaultMemPool`) is charged to the device it belongs to,
/// found by asking the driver, even from a stream of another device.
#[test]
fn a_default_pool_of_another_device_is_charged_to_that_device() {
    let w = World::new("2x4GiB");
    let s = w.slice("defpool", &[(0, GIB), (1, GIB)]);
    for way in WAYS {
        let args = ["--via", way, "--device", "0", "alloc", "--family", "defaultpool", "--pool-device", "1", "--size", "256MiB", "--count", "2", "--hold"];
        let mut p = Running::start(w.probe(&s, &args));
        p.wait_for("holding");
        assert_eq!(s.used(1), 512 * MIB, "{way}: slice device 1's pool holds the allocations");
        assert_eq!(s.used(0), CTX, "{way}: slice device 0 holds only the context");
        assert!(w.sim_used(1) >= 512 * MIB, "{way}: the simulated driver reserved it on device 1");
        let (code, rest) = p.finish();
        assert_eq!(code, 0, "{way}: {rest:?}");
        // The pool keeps its reservation until a synchronisation on its own
        // device, which the program never makes: still charged, and gone
        // with the dead process's record.
        assert!(s.used(1) <= 512 * MIB, "{way}: {rest:?}");
        s.usage.sweep(None);
        assert_eq!((s.used(0), s.used(1)), (0, 0), "{way}: usage must return to zero: {rest:?}");
    }
}
