//! CPU cost of the arbiter and of the gate's fast path.
//!
//! `cargo bench -p egpu-arbiter --bench tick`
//!
//! - `tick_tables/64x2`: one period of `egpud`'s work for 64 slices on one
//!   device, each with 2 attached processes, on real slice-table files. The
//!   Scale figure is this time divided by the period (10 ms).
//! - `tick/N`: [`Arbiter::tick`] alone for N slice devices spread over 8
//!   physical devices, every one hungry. Its time must stay linear in N: at
//!   10,000 slice devices it was 42–53 ms (the period is 10 ms) while
//!   forgetting absent slices and finding active high slices were O(N²).
//! - `gate/fast_path`: `before_launch` + `launched` + `completed` when the
//!   allowance is not exhausted — the hook's added work per launch, apart
//!   from the event record/query it also makes.
//! - `gate/fast_path_records_N`: the same with the slice's N process
//!   records, N − 1 of them peers with unfinished work: what publishing
//!   one's own and counting the peers' costs.

use criterion::{Criterion, criterion_group, criterion_main};
use egpu_abi::limits::DeviceInit;
use egpu_abi::usage::CAP_PEER_INFLIGHT;
use egpu_abi::{DeviceLimitsSnapshot, LimitsWriter, ProcRecord, UsageFile};
use egpu_arbiter::gate::{GateWords, Peers};
use egpu_arbiter::{Arbiter, ArbiterConfig, GateView, ProcGate, SliceInput, SliceKey, TableRef};
use egpu_core::Priority;
use std::hint::black_box;
use std::sync::atomic::AtomicU32;
use std::sync::atomic::Ordering::Relaxed;

fn tick_tables(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut tables = Vec::new();
    for i in 0..64u32 {
        let d = dir.path().join(format!("s{i}"));
        std::fs::create_dir(&d).expect("mkdir");
        let init = DeviceInit {
            uuid: "GPU-bench".into(),
            host_index: 0,
            limits: DeviceLimitsSnapshot { host_index: 0, mem_limit: 1 << 30, compute_share_bps: 150, compute_limit_bps: 10_000 },
        };
        let l = LimitsWriter::create(&d.join("limits"), &format!("s{i}"), i % 3, &[init]).expect("limits");
        let u = UsageFile::create(&d.join("usage"), 1).expect("usage");
        let a = u.claim(1000 + i).expect("claim");
        let b = u.claim(2000 + i).expect("claim");
        tables.push((l, u, a, b));
    }
    let mut arb = Arbiter::new(ArbiterConfig::default());
    let mut now = 0u64;
    let truth: Vec<[Option<u64>; 1]> = vec![[Some(0)]; 64];
    c.bench_function("tick_tables/64x2", |bch| {
        bch.iter(|| {
            now += 10_000_000;
            for (i, (_, u, a, b)) in tables.iter().enumerate() {
                // Both processes report work, as the hooks would between ticks.
                let r = u.region();
                r.consumed_ns[0].fetch_add(100_000 + i as u64, Relaxed);
                u.record(a).gpu_time_ns[0].fetch_add(50_000, Relaxed);
                u.record(b).gpu_time_ns[0].fetch_add(50_000, Relaxed);
            }
            let refs: Vec<TableRef<'_>> = tables
                .iter()
                .zip(&truth)
                .enumerate()
                .map(|(i, ((l, u, _, _), t))| TableRef { slice: i as u64, limits: l, usage: u, true_ns: t })
                .collect();
            black_box(arb.tick_tables(now, &refs))
        })
    });
}

fn tick_many(c: &mut Criterion) {
    let mut g = c.benchmark_group("tick");
    g.sample_size(10);
    for n in [1_000usize, 10_000] {
        let mut arb = Arbiter::new(ArbiterConfig::default());
        let mut t = 0u64;
        // One high slice in sixteen, so that best-effort queue bounds look them up.
        let priority = |i: usize| match i % 16 {
            0 => Priority::High,
            1..=7 => Priority::BestEffort,
            _ => Priority::Normal,
        };
        let mut inputs: Vec<SliceInput> = (0..n)
            .map(|i| SliceInput {
                key: SliceKey { slice: i as u64, dev: 0 },
                device: (i % 8) as u32,
                share_bps: 10,
                limit_bps: 10_000,
                priority: priority(i),
                consumed_ns: 0,
                throttle_waits: 0,
                true_ns: Some(0),
            })
            .collect();
        g.bench_function(format!("{n}"), |bch| {
            bch.iter(|| {
                t += 1;
                for (i, inp) in inputs.iter_mut().enumerate() {
                    inp.consumed_ns += 1000 + i as u64;
                    inp.throttle_waits = t;
                    inp.true_ns = Some(t * 900);
                }
                black_box(arb.tick(black_box(&inputs)))
            })
        });
    }
    g.finish();
}

fn gate_fast_path(c: &mut Criterion) {
    let w = GateWords::default();
    w.period_ns.store(10_000_000, Relaxed);
    w.allowance_ns.store(u64::MAX / 2, Relaxed);
    w.queue_launches.store(4, Relaxed);
    let v: GateView<'_> = w.view(10_000);
    let g = ProcGate::new();
    c.bench_function("gate/fast_path", |b| {
        b.iter(|| {
            let d = g.before_launch(black_box(&v), black_box(1));
            let e = g.launched(&v);
            g.completed(&v, e, black_box(1000), None);
            d
        })
    });
    // The same with the slice's process records: this process alone (it
    // publishes its own unfinished work), and beside 7 peers that each have
    // work unfinished (the scan reads every record's word).
    for n in [1usize, 8] {
        let records: Vec<ProcRecord> = (0..n).map(|_| ProcRecord::default()).collect();
        for (i, r) in records.iter().enumerate() {
            r.state.store(1, Relaxed);
            r.caps.store(CAP_PEER_INFLIGHT, Relaxed);
            r.gate_ns.store(1, Relaxed);
            if i > 0 {
                r.inflight_us[0].store(5, Relaxed);
            }
        }
        let hw = AtomicU32::new(n as u32);
        let v = GateView { peers: Some(Peers { records: &records, high_water: &hw, own: Some(0), dev: 0, publish: true }), ..w.view(10_000) };
        let g = ProcGate::new();
        c.bench_function(&format!("gate/fast_path_records_{n}"), |b| {
            b.iter(|| {
                let d = g.before_launch(black_box(&v), black_box(1));
                let e = g.launched(&v);
                g.completed(&v, e, black_box(1000), None);
                d
            })
        });
    }
}

criterion_group!(benches, tick_tables, tick_many, gate_fast_path);
criterion_main!(benches);
