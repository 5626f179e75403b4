//! Prints the compute-isolation figures of the model (`docs/benchmarks.md`).
//!
//! `cargo run --release -p egpu-arbiter --example model-report`

use egpu_arbiter::model::ModelConfig;
use egpu_arbiter::model::scenarios::{accuracy, many_processes, percentile, priority, priority_beside, resize_convergence, turns, work_conservation};

fn main() {
    let cfg = ModelConfig::default();
    println!("model: FIFO device, period {} ms, virtual time", cfg.arbiter.period_ns / 1_000_000);
    for shares in [&[30, 70][..], &[20, 30, 50], &[10, 20, 30, 40]] {
        let got = accuracy(cfg, shares, 10);
        let worst = shares.iter().zip(&got).map(|(&s, g)| (g - f64::from(s)).abs()).fold(0.0, f64::max);
        let no_rec = accuracy(ModelConfig { reconcile: false, ..cfg }, shares, 10);
        println!("accuracy {shares:?}: achieved {} (worst error {worst:.2} pts); without reconciliation {}", fmt(&got), fmt(&no_rec));
    }
    println!("work conservation: 30%/100% lone: {:.2}%   30%/40% lone: {:.2}%", work_conservation(cfg, 100, 10), work_conservation(cfg, 40, 10));
    for be_us in [25, 50, 100, 250] {
        let r = priority(cfg, be_us * 1_000, 10);
        let nq = priority(ModelConfig { arbiter: egpu_arbiter::ArbiterConfig { best_effort_queue_under_high: 16, ..cfg.arbiter }, ..cfg }, be_us * 1_000, 10);
        let ng = priority(ModelConfig { gate: false, ..cfg }, be_us * 1_000, 10);
        println!(
            "priority, best-effort kernels {be_us} µs: high p99 alone {:.0} µs, shared {:.0} µs (x{:.3}), best-effort got {:.1}%; without the best-effort queue bound x{:.3}; without gating x{:.2}",
            r.p99_alone_ns as f64 / 1e3,
            r.p99_shared_ns as f64 / 1e3,
            r.p99_ratio(),
            r.best_effort_pct,
            nq.p99_ratio(),
            ng.p99_ratio()
        );
    }
    for kernel_ms in [2, 5] {
        for n in [4, 8, 16] {
            let f = many_processes(cfg, n, kernel_ms * 1_000_000, 4);
            let blind = many_processes(ModelConfig { peers: false, ..cfg }, n, kernel_ms * 1_000_000, 4);
            println!("10%-capped slice of {n} processes, {kernel_ms} ms kernels, beside a 90% slice: {}; gates blind to their peers {}", fmt(&f), fmt(&blind));
        }
    }
    for be_us in [25, 50, 100] {
        let r = priority_beside(cfg, be_us * 1_000, 4, 10);
        let nt = priority_beside(ModelConfig { turns: false, ..cfg }, be_us * 1_000, 4, 10);
        println!(
            "priority, best-effort slices of 4 processes, kernels {be_us} µs: high p99 x{:.3}, best-effort got {:.1}%; without turns x{:.3}, {:.1}%",
            r.p99_ratio(),
            r.best_effort_pct,
            nt.p99_ratio(),
            nt.best_effort_pct
        );
    }
    for be_us in [25, 100, 250] {
        for (name, c) in [("turns", cfg), ("without turns", ModelConfig { turns: false, ..cfg })] {
            let r = turns(c, be_us * 1_000, 5);
            println!(
                "best-effort loop beside a saturating peer ({be_us} µs kernels) under a high slice, {name}: {} iterations in 5 s, p99 {:.2} ms; best-effort {:.1}%, high p99 x{:.3}",
                r.loop_iterations,
                r.loop_p99_ns as f64 / 1e6,
                r.best_effort_pct,
                r.high_p99_ratio
            );
        }
    }
    let periods = resize_convergence(cfg, 200);
    println!(
        "resize 30/70 <-> 60/40, 200 resizes: periods to within 3 points: median {}, p99 {}, max {}",
        percentile(&periods, 50.0),
        percentile(&periods, 99.0),
        periods.iter().max().unwrap_or(&0)
    );
}

fn fmt(v: &[f64]) -> String {
    v.iter().map(|x| format!("{x:.2}")).collect::<Vec<_>>().join("/")
}
