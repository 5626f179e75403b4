//! The "Must show" properties of compute isolation, on the model (virtual
//! time: deterministic, no wall clock). Numbers for docs/benchmarks.md come
//! from `cargo run --release -p egpu-arbiter --example model-report`.

use egpu_arbiter::ArbiterConfig;
use egpu_arbiter::model::scenarios::{accuracy, many_processes, percentile, priority, priority_beside, resize_convergence, turns, work_conservation};
use egpu_arbiter::model::{Model, ModelConfig, Pattern, SliceSpec};
use egpu_core::Priority;

fn within(got: &[f64], want: &[u32], pts: f64) {
    for (g, w) in got.iter().zip(want) {
        assert!((g - f64::from(*w)).abs() <= pts, "achieved {got:?}, shares {want:?}");
    }
}

#[test]
fn accuracy_within_three_points_over_ten_seconds() {
    for shares in [&[30, 70][..], &[20, 30, 50], &[10, 20, 30, 40]] {
        within(&accuracy(ModelConfig::default(), shares, 10), shares, 3.0);
    }
}

#[test]
fn without_reconciliation_backlog_time_is_not_gpu_time() {
    // The negative control: enforcing in measured (backlog) units alone misses the shares.
    let got = accuracy(ModelConfig { reconcile: false, ..ModelConfig::default() }, &[20, 30, 50], 2);
    assert!(got.iter().zip([20.0, 30.0, 50.0]).any(|(g, w)| (g - w).abs() > 3.0), "{got:?}");
}

#[test]
fn work_conservation_lone_slice() {
    let cfg = ModelConfig::default();
    assert!(work_conservation(cfg, 100, 10) >= 95.0);
    let capped = work_conservation(cfg, 40, 10);
    assert!((capped - 40.0).abs() <= 3.0, "{capped}");
}

#[test]
fn high_priority_latency_survives_best_effort_neighbours() {
    let cfg = ModelConfig::default();
    let r = priority(cfg, 25_000, 10);
    assert!(r.p99_ratio() <= 1.10, "{r:?}");
    assert!(r.best_effort_pct > 50.0, "best-effort must still get the idle time: {r:?}");
    // Negative controls: without gating, or with a deep best-effort queue, it fails.
    assert!(priority(ModelConfig { gate: false, ..cfg }, 25_000, 2).p99_ratio() > 2.0);
    let deep = ModelConfig { arbiter: ArbiterConfig { best_effort_queue_under_high: 16, ..cfg.arbiter }, ..cfg };
    assert!(priority(deep, 25_000, 2).p99_ratio() > 1.5);
}

#[test]
fn resize_converges_within_two_periods() {
    let periods = resize_convergence(ModelConfig::default(), 60);
    assert!(percentile(&periods, 99.0) <= 2, "{periods:?}");
}

#[test]
fn far_ahead_launcher_is_bounded_and_still_held_to_its_share() {
    let cfg = ModelConfig::default();
    let specs = vec![
        SliceSpec::one(30, 30, Priority::Normal, Pattern::Saturate { kernel_ns: 100_000, ahead: 1_000_000 }),
        SliceSpec::one(70, 70, Priority::Normal, Pattern::Saturate { kernel_ns: 100_000, ahead: 4 }),
    ];
    let mut m = Model::new(cfg, specs);
    m.run_until(3_000_000_000);
    // Unfinished launches never exceed the queue bound (4) of the first tick onwards.
    assert!(m.max_outstanding(0) <= cfg.arbiter.queue_launches as u32, "{}", m.max_outstanding(0));
    let f = egpu_arbiter::model::scenarios::fractions(&m, 1_000_000_000, 3_000_000_000);
    within(&f, &[30, 70], 3.0);
}

#[test]
fn idle_slice_wakes_to_its_share_within_one_period() {
    // A high slice idles while a best-effort slice takes the device, then
    // saturates: from the first full period after it wakes it holds ≥ its share.
    let cfg = ModelConfig::default();
    let p = cfg.arbiter.period_ns;
    let specs = vec![
        SliceSpec::one(40, 100, Priority::High, Pattern::OnOff { kernel_ns: 200_000, ahead: 4, on_ns: 500_000_000, off_ns: 500_000_000 }),
        SliceSpec::one(0, 100, Priority::BestEffort, Pattern::Saturate { kernel_ns: 300_000, ahead: 64 }),
    ];
    let mut m = Model::new(cfg, specs);
    m.run_until(2_600_000_000);
    for wake in [1_000_000_000u64, 2_000_000_000] {
        let ticks: Vec<u64> = m.ticks.iter().map(|t| t.0).filter(|&t| t > wake).collect();
        for k in 0..20 {
            let f = egpu_arbiter::model::scenarios::fractions(&m, ticks[k], ticks[k + 1]);
            assert!(f[0] >= 37.0, "period {k} after wake at {wake}: {f:?}");
        }
        // And while it is off, the best-effort slice has the device.
        let off = egpu_arbiter::model::scenarios::fractions(&m, wake - 400 * p / 10, wake - p);
        assert!(off[1] >= 95.0, "{off:?}");
    }
}

#[test]
fn a_cap_holds_for_a_slice_of_many_processes() {
    // Each process used to check the allowance against its own unfinished
    // work only, so 16 of them had 16 kernels in flight when it ran out.
    let cfg = ModelConfig::default();
    for (n, kernel_ns) in [(4, 2_000_000), (16, 2_000_000), (8, 5_000_000), (16, 5_000_000)] {
        let f = many_processes(cfg, n, kernel_ns, 4);
        eprintln!("{n} processes, {} ms kernels: {f:?}", kernel_ns / 1_000_000);
        assert!(f[0] <= 11.5, "{n} processes of {kernel_ns} ns kernels in a 10%-capped slice: {f:?}");
        assert!(f[1] >= 87.0, "the 90% slice lost its guarantee beside {n} processes: {f:?}");
    }
    // The negative control: gates blind to their peers overshoot.
    let blind = many_processes(ModelConfig { peers: false, ..cfg }, 16, 5_000_000, 4);
    eprintln!("blind: {blind:?}");
    assert!(blind[0] >= 20.0, "{blind:?}");
}

#[test]
fn best_effort_slices_of_several_processes_take_turns_at_their_one_launch() {
    // Beside an active high slice a best-effort slice may keep one launch
    // unfinished. Held per process, a high kernel waited behind one
    // best-effort kernel per process (4 a slice here).
    let cfg = ModelConfig::default();
    let r = priority_beside(cfg, 25_000, 4, 10);
    eprintln!("turns: {r:?}");
    assert!(r.p99_ratio() <= 1.10, "{r:?}");
    assert!(r.best_effort_pct > 50.0, "best-effort must still get the idle time: {r:?}");
    let per_process = priority_beside(ModelConfig { turns: false, ..cfg }, 25_000, 4, 10);
    eprintln!("per process: {per_process:?}");
    assert!(per_process.p99_ratio() >= 1.2, "{per_process:?}");
    // Held for the slice without turns, a process that relaunches the
    // moment its kernel is done starved its peer (0 iterations in 5 s). With
    // turns the peer's loop runs as often as when the bound was per process.
    let t = turns(cfg, 100_000, 5);
    let free = turns(ModelConfig { turns: false, ..cfg }, 100_000, 5);
    eprintln!("turns {t:?}, per process {free:?}");
    assert!(t.loop_iterations * 10 >= free.loop_iterations * 9 && t.loop_iterations > 2_500, "{t:?} against {free:?}");
    assert!(t.high_p99_ratio <= 1.15, "{t:?}");
}
