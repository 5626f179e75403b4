use super::*;
use crate::NodeConfig;
use crate::agent::Agent;
use crate::devices::{FakeGpus, ProcSample};
use crate::slices::{CreateRequest, ResizeRequest};
use egpu_abi::{LimitsReader, paths};
use egpu_core::{Bytes, DeviceShare, Percent, Priority, SliceSpec};

fn agent(dir: &std::path::Path) -> Agent {
    let cfg = NodeConfig {
        run_dir: dir.join("run"),
        state_dir: dir.join("state"),
        socket: None,
        simulate: None,
        hook_lib: dir.join("libegpu.so"),
        sim_lib: dir.join("libegpu_simgpu.so"),
        sweep_period_ms: 200,
        cdi_dir: None,
        cdi_hook: "/t/egpu-cdi-hook".into(),
        memory_audit: Default::default(),
        memory_audit_slack: crate::audit::DEFAULT_SLACK,
        drop_unstored_slices: false,
        adopt_unstored_slices: false,
        sysfs: None,
    };
    Agent::start_with(cfg, Box::new(FakeGpus::new(1, 16 * Bytes::GIB))).unwrap()
}

fn create(node: &Node, name: &str, share: u32, limit: u32) {
    let d = DeviceShare { device: 0, memory: Bytes::gib(1), memory_burst: Bytes(0), compute_share: Percent(share), compute_limit: Percent(limit) };
    let spec = SliceSpec { name: name.into(), priority: Priority::Normal, devices: vec![d] };
    node.slices().create(CreateRequest { spec, ephemeral: false, owner_pid: None }).unwrap();
}

#[test]
fn a_tick_publishes_budgets_and_a_resize_shows_at_the_next_tick() {
    let dir = tempfile::tempdir().unwrap();
    let a = agent(dir.path());
    let node = a.node();
    create(node, "a", 3000, 3000);
    create(node, "b", 7000, 10_000);
    let mut lp = ComputeLoop::new(ArbiterConfig::default());
    let p = lp.period().as_nanos() as u64;
    let b = lp.tick(node, 1_000);
    assert_eq!(b.len(), 2);
    let lim = LimitsReader::open(&paths::limits_path(&node.slices().get("a").unwrap().dir)).unwrap();
    assert_eq!(lim.region().arbiter_period_ns.load(Ordering::Relaxed), p);
    assert_eq!(lim.region().devices[0].allowance_ns.load(Ordering::Relaxed), 3 * p / 10);
    let snap = node.compute.snapshot();
    assert_eq!(snap.ticks, 1);
    assert_eq!(snap.period_ns, p);
    assert_eq!(snap.slices["a"][0].budget_ns, 3 * p / 10);
    assert!(!snap.slices["a"][0].true_time, "FakeGpus gives no samples");
    assert_eq!(snap.tick_buckets.iter().sum::<u64>(), 1);

    // Resize 30/70 -> 60/40: the share sum stays <= 100%, so shrink b first.
    let r = |s: u32, l: u32| ResizeRequest { compute_share: Some(Percent(s)), compute_limit: Some(Percent(l)), ..Default::default() };
    node.slices().resize("b", r(4000, 4000)).unwrap();
    node.slices().resize("a", r(6000, 6000)).unwrap();
    lp.tick(node, 1_000 + p);
    let snap = node.compute.snapshot();
    assert_eq!(snap.slices["a"][0].budget_ns, 6 * p / 10);
    assert_eq!(snap.slices["b"][0].budget_ns, 4 * p / 10);
    assert_eq!(lim.region().devices[0].epoch_start_ns.load(Ordering::Relaxed), 1_000 + p);

    // A deleted slice is forgotten.
    node.slices().delete("b", false).unwrap();
    lp.tick(node, 1_000 + 2 * p);
    assert_eq!(node.compute.snapshot().slices.keys().collect::<Vec<_>>(), ["a"]);
}

#[test]
fn a_resize_is_applied_before_the_next_periodic_tick() {
    let dir = tempfile::tempdir().unwrap();
    let a = agent(dir.path());
    let node = a.node();
    create(node, "a", 3000, 3000);
    create(node, "b", 7000, 7000);
    let mut lp = ComputeLoop::new(ArbiterConfig::default());
    let p = lp.period().as_nanos() as u64;
    lp.tick(node, 1_000);
    let lim = |n: &str| LimitsReader::open(&paths::limits_path(&node.slices().get(n).unwrap().dir)).unwrap();
    let (la, lb) = (lim("a"), lim("b"));
    let allowance = |l: &LimitsReader| l.region().devices[0].allowance_ns.load(Ordering::Relaxed);
    assert_eq!((allowance(&la), allowance(&lb)), (3 * p / 10, 7 * p / 10));

    // The Resize RPC wakes the loop: the wake-up comes before a periodic
    // tick (the interval's first tick is an hour away; nothing sleeps).
    let r = |s: u32| ResizeRequest { compute_share: Some(Percent(s)), compute_limit: Some(Percent(s)), ..Default::default() };
    node.slices().resize("b", r(4000)).unwrap();
    node.compute.resized();
    node.slices().resize("a", r(6000)).unwrap();
    node.compute.resized();
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    let wake = rt.block_on(async {
        let mut iv = tokio::time::interval_at(tokio::time::Instant::now() + Duration::from_secs(3600), lp.period());
        next_wake(&mut iv, &node.compute, true).await
    });
    assert_eq!(wake, Wake::Resized);
    // Two resizes before the loop ran are one wake-up, re-planning both.
    let b = lp.replan(node);
    assert_eq!(b.iter().map(|b| b.budget_ns).collect::<Vec<_>>(), [6 * p / 10, 4 * p / 10]);
    assert_eq!((allowance(&la), allowance(&lb)), (6 * p / 10, 4 * p / 10), "the period in progress, re-planned");
    let d = &la.region().devices[0];
    assert_eq!(d.epoch_start_ns.load(Ordering::Relaxed), 1_000, "no tick: the period and its phase go on");
    assert_eq!(d.budget_epoch.load(Ordering::Relaxed), 1);
    let snap = node.compute.snapshot();
    assert_eq!((snap.ticks, snap.slices["a"][0].budget_ns), (1, 6 * p / 10));
    // The next tick closes the whole period under the new budgets.
    lp.tick(node, 1_000 + p);
    assert_eq!(allowance(&la), 6 * p / 10);
    assert_eq!(d.epoch_start_ns.load(Ordering::Relaxed), 1_000 + p);

    // After a re-plan the loop listens for the tick only (no second re-plan
    // before it, so resizes cannot starve the ticks): a pending resize is
    // not taken, and the tick comes.
    node.compute.resized();
    let wake = rt.block_on(async {
        let mut iv = tokio::time::interval_at(tokio::time::Instant::now() + Duration::from_millis(1), Duration::from_secs(3600));
        next_wake(&mut iv, &node.compute, false).await
    });
    assert!(matches!(wake, Wake::Tick(_)), "{wake:?}");
}

#[test]
fn share_sums_above_100_percent_are_refused_on_create_and_resize() {
    let dir = tempfile::tempdir().unwrap();
    let a = agent(dir.path());
    let node = a.node();
    create(node, "a", 3000, 10_000);
    create(node, "b", 7000, 10_000);
    let d = DeviceShare { device: 0, memory: Bytes::gib(1), memory_burst: Bytes(0), compute_share: Percent(1), compute_limit: Percent(10_000) };
    let spec = SliceSpec { name: "c".into(), priority: Priority::Normal, devices: vec![d] };
    assert!(node.slices().create(CreateRequest { spec, ephemeral: false, owner_pid: None }).is_err());
    let e = node.slices().resize("a", ResizeRequest { compute_share: Some(Percent(3001)), ..Default::default() }).err().unwrap();
    assert!(matches!(e, crate::slices::SliceOpError::Capacity(_)), "{e}");
    assert_eq!(node.slices().get("a").unwrap().record.spec.devices[0].compute_share, Percent(3000), "refused resize changes nothing");
}

fn sample(pid: u32, ts: u64, util: u32) -> ProcSample {
    ProcSample { pid, timestamp_us: ts, sm_util: util }
}

#[test]
fn samples_integrate_into_monotonic_per_slice_time() {
    let mut t = Truth { last_seen_us: vec![0], supported: vec![true], ..Truth::default() };
    t.pids.insert(10, "a".into());
    t.pids.insert(11, "a".into());
    t.pids.insert(20, "b".into());
    // First call: baseline only.
    t.add(0, &[sample(10, 1_000, 100), sample(20, 1_000, 50)]);
    assert!(t.totals.is_empty());
    assert_eq!(t.last_seen_us[0], 1_000);
    // 10 ms later: a at 30%, b at 70%; a new pid of a counts from last_seen.
    t.add(0, &[sample(10, 11_000, 30), sample(20, 11_000, 70), sample(11, 11_000, 10)]);
    assert_eq!(t.totals["a"][&0], 3_000_000 + 1_000_000);
    assert_eq!(t.totals["b"][&0], 7_000_000);
    // pid 10 exits: a's total keeps what it had.
    t.pids.remove(&10);
    t.add(0, &[sample(11, 21_000, 0), sample(10, 21_000, 100)]);
    assert_eq!(t.totals["a"][&0], 4_000_000);
    // Utilisation above 100% is clamped.
    t.add(0, &[sample(20, 31_000, 250)]);
    assert_eq!(t.totals["b"][&0], 7_000_000 + 20_000_000, "20 ms since its last sample, at most 100%");
}

/// NVML may hand several samples of one pid in a batch, in any order, and
/// repeat one it gave before: each interval is counted once.
#[test]
fn samples_out_of_order_or_repeated_count_each_interval_once() {
    let mut t = Truth { last_seen_us: vec![0], supported: vec![true], ..Truth::default() };
    t.pids.insert(10, "a".into());
    t.add(0, &[sample(10, 1_000, 100)]);
    // Two samples in one batch, newest first: 10 ms at 50%, then 10 ms at 100%.
    t.add(0, &[sample(10, 21_000, 100), sample(10, 11_000, 50)]);
    assert_eq!(t.totals["a"][&0], 5_000_000 + 10_000_000);
    // The newest again, and an old one: nothing more.
    t.add(0, &[sample(10, 21_000, 100), sample(10, 11_000, 50)]);
    assert_eq!(t.totals["a"][&0], 15_000_000);
    // Then 10 ms more at 100%: counted from 21 ms, not from the old 11 ms.
    t.add(0, &[sample(10, 31_000, 100)]);
    assert_eq!(t.totals["a"][&0], 25_000_000);
}

/// The usage file is the workloads' to write (mode 0666; `docs/threat-model.md`).
/// Whatever a hostile process of slice `a` writes there, anywhere and at any
/// alignment, `egpud`'s readers of it (sweep, orphan collection, the burst
/// and compute ticks, listings, metrics) must not panic, and must not hand
/// `a` memory past its burst cap or change another slice's limits.
#[test]
fn hostile_writes_to_a_usage_file_never_panic_egpud_nor_leak_past_caps() {
    use proptest::prelude::*;
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let a = agent(dir.path());
    let node = a.node().clone();
    let share = |gib: u64, burst: u64, pct: u32| DeviceShare {
        device: 0,
        memory: Bytes::gib(gib),
        memory_burst: Bytes::gib(burst),
        compute_share: Percent(pct),
        compute_limit: Percent(10_000),
    };
    for (name, d) in [("a", share(1, 4, 3000)), ("b", share(2, 0, 7000))] {
        let spec = SliceSpec { name: name.into(), priority: Priority::Normal, devices: vec![d] };
        node.slices().create(CreateRequest { spec, ephemeral: false, owner_pid: None }).unwrap();
    }
    let (usage, limits) = {
        let m = node.slices();
        let s = m.get("a").unwrap();
        (paths::usage_path(&s.dir), (LimitsReader::open(&paths::limits_path(&s.dir)).unwrap(), LimitsReader::open(&paths::limits_path(&m.get("b").unwrap().dir)).unwrap()))
    };
    let file = std::fs::OpenOptions::new().write(true).open(&usage).unwrap();
    let len = file.metadata().unwrap().len();
    let registry = crate::metrics::registry(node.clone());
    let lp = std::cell::RefCell::new(ComputeLoop::new(ArbiterConfig::default()));
    let now = std::cell::Cell::new(1_000u64);
    let words = prop_oneof![Just(0u64), Just(u64::MAX), Just(1u64 << 40), any::<u64>(), 0u64..64];
    // Anywhere, and most often on the words egpud reads: the header, the
    // per-device words of device 0 and 1, and the first records.
    use egpu_abi::usage::{ProcRecord, UsageRegion};
    use std::mem::{offset_of, size_of};
    let rec = |i: usize, field: usize| (offset_of!(UsageRegion, procs) + i * size_of::<ProcRecord>() + field) as u64;
    let mut hot: Vec<u64> = [
        offset_of!(UsageRegion, n_devices),
        offset_of!(UsageRegion, high_water),
        offset_of!(UsageRegion, charge_locks),
        offset_of!(UsageRegion, refused),
        offset_of!(UsageRegion, consumed_ns),
        offset_of!(UsageRegion, throttle_waits),
        offset_of!(UsageRegion, mem_want),
    ]
    .iter()
    .flat_map(|&o| [o as u64, o as u64 + 8])
    .collect();
    for i in 0..3 {
        for f in [offset_of!(ProcRecord, pid), offset_of!(ProcRecord, state), offset_of!(ProcRecord, charged), offset_of!(ProcRecord, gpu_time_ns), offset_of!(ProcRecord, caps)] {
            hot.push(rec(i, f));
        }
    }
    let offsets = prop_oneof![0..len, prop::sample::select(hot)];
    let writes = prop::collection::vec((offsets, words), 1..48);
    proptest!(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() }, |(w in writes)| {
        for (off, v) in &w {
            let bytes = v.to_le_bytes();
            let n = (len - off).min(8) as usize;
            file.write_at(&bytes[..n], *off).unwrap();
        }
        {
            let mut m = node.slices();
            m.sweep();
            m.collect_orphans();
        }
        let mut lp = lp.borrow_mut();
        now.set(now.get() + lp.period().as_nanos() as u64);
        lp.tick(&node, now.get());
        for s in node.slices().slices() {
            let _ = crate::wire::slice_to_wire(s);
        }
        let _ = crate::metrics::render(&registry);
        let (la, lb) = (limits.0.snapshot(), limits.1.snapshot());
        let a_limit = la.devices()[0].mem_limit;
        prop_assert!((1u64 << 30..=4u64 << 30).contains(&a_limit), "a's limit {a_limit} left [guarantee, burst cap]");
        prop_assert_eq!(lb.devices()[0].mem_limit, 2u64 << 30, "b's limit changed");
        // Nor can a's demand words take b's guaranteed compute.
        let period = lp.period().as_nanos() as u64;
        let b_allowance = limits.1.region().devices[0].allowance_ns.load(Ordering::Relaxed);
        prop_assert!(b_allowance >= 7 * period / 10, "b's allowance {b_allowance} ns fell below its 70% share of {period} ns");
    });
}

#[test]
fn the_published_used_time_never_goes_back_when_device_truth_starts() {
    let mut c = UsedCounter::default();
    // Measured time since the slice began, then the device's truth, which
    // starts from its first sample (near zero), then measured again.
    let steps = [(false, 100), (false, 250), (true, 5), (true, 40), (true, 40), (false, 900), (false, 910)];
    let out: Vec<u64> = steps.iter().map(|&(t, raw)| c.advance(t, raw)).collect();
    assert_eq!(out, [100, 250, 250, 285, 285, 285, 295]);
    assert!(out.windows(2).all(|w| w[0] <= w[1]), "{out:?}");
}

#[test]
fn a_slice_made_again_by_name_starts_afresh() {
    let dir = tempfile::tempdir().unwrap();
    let a = agent(dir.path());
    let node = a.node();
    let mut lp = ComputeLoop::new(ArbiterConfig::default());
    let p = lp.period().as_nanos() as u64;
    let view = || node.compute.slice("a").unwrap()[0].clone();
    create(node, "a", 3000, 10_000);
    let consumed = |ns: u64| node.slices().get("a").unwrap().usage.region().consumed_ns[0].store(ns, Ordering::Relaxed);
    lp.tick(node, 1_000);
    // The hook's measured time, as if the slice's processes had kept the
    // GPU busy for the whole period.
    consumed(p);
    lp.tick(node, 1_000 + p);
    let old = view();
    assert_eq!(old.used_ns_total, p);
    assert!(old.usage_bps > 0, "{old:?}");
    // Deleted and made again between two ticks: nothing of the old slice
    // is the new one's (its time, its usage rate, the arbiter's state).
    node.slices().delete("a", false).unwrap();
    create(node, "a", 3000, 10_000);
    lp.tick(node, 1_000 + 2 * p);
    let new = view();
    assert_eq!(new.used_ns_total, 0, "the new slice's time is its own");
    assert_eq!(new.usage_bps, 0, "the old slice's usage rate is not carried: {new:?}");
    assert!(!new.hungry);
}

#[test]
fn the_published_used_time_counts_from_zero_when_egpud_starts() {
    let dir = tempfile::tempdir().unwrap();
    let a = agent(dir.path());
    let node = a.node();
    let p = ComputeLoop::new(ArbiterConfig::default()).period().as_nanos() as u64;
    let consumed = |name: &str, ns: u64| node.slices().get(name).unwrap().usage.region().consumed_ns[0].store(ns, Ordering::Relaxed);
    let used = |name: &str| node.compute.slice(name).unwrap()[0].used_ns_total;
    create(node, "a", 3000, 10_000);
    // The hook's measured time survives egpud in the usage file: 50 periods
    // of it before this egpud started, of which an earlier egpud may have
    // published less (from the device's truth, which lived in its memory).
    consumed("a", 50 * p);
    let mut lp = ComputeLoop::new(ArbiterConfig::default());
    lp.tick(node, 1_000);
    assert_eq!(used("a"), 0, "GPU time from before egpud started is not published again");
    consumed("a", 51 * p);
    lp.tick(node, 1_000 + p);
    assert_eq!(used("a"), p);
    // A slice made since egpud started counts its measured time from its
    // creation, all of it since the start.
    create(node, "b", 3000, 10_000);
    consumed("b", p / 2);
    lp.tick(node, 1_000 + 2 * p);
    assert_eq!(used("b"), p / 2);
}
