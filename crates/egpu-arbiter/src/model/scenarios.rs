//! The scenarios of the "Must show" list, on the model. Each returns plain
//! numbers; the tests assert on them and `examples/model-report.rs` prints them.

use super::engine::{Model, ModelConfig, Pattern, SliceSpec};
use egpu_core::Priority;

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000 * MS;
const US: u64 = 1_000;

/// Achieved fraction (percent of device time) of each slice between two
/// virtual times, measured at the ticks at or after them.
pub fn fractions(m: &Model, from_ns: u64, to_ns: u64) -> Vec<f64> {
    let at = |t: u64| m.ticks.iter().find(|(tt, _)| *tt >= t).or(m.ticks.last()).expect("ticks");
    let (t0, a) = at(from_ns);
    let (t1, b) = at(to_ns);
    let span = (t1 - t0).max(1) as f64;
    a.iter().zip(b).map(|(x, y)| (y - x) as f64 * 100.0 / span).collect()
}

/// Nearest-rank percentile of `v` (copied and sorted), `q` in 0..=100.
pub fn percentile(v: &[u64], q: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    let mut s = v.to_vec();
    s.sort_unstable();
    let rank = ((q / 100.0) * s.len() as f64).ceil().max(1.0) as usize;
    s[rank.min(s.len()) - 1]
}

/// Kernel lengths cycled through the slices of the accuracy runs, so that
/// slices differ in more than their share.
const KERNELS: [u64; 4] = [100 * US, 250 * US, 400 * US, 150 * US];

/// Saturating slices with limit = share (percent); the first one launches
/// far ahead (100 000 kernels). Achieved percent of each over `window_s`
/// seconds after one second of warm-up.
pub fn accuracy(cfg: ModelConfig, shares: &[u32], window_s: u64) -> Vec<f64> {
    let specs = shares
        .iter()
        .enumerate()
        .map(|(i, &s)| {
            let ahead = if i == 0 { 100_000 } else { 8 };
            SliceSpec::one(s, s, Priority::Normal, Pattern::Saturate { kernel_ns: KERNELS[i % KERNELS.len()], ahead })
        })
        .collect();
    let mut m = Model::new(cfg, specs);
    m.run_until((1 + window_s) * SEC + MS);
    fractions(&m, SEC, (1 + window_s) * SEC)
}

/// One saturating slice with a 30% share and `limit` percent, beside an idle
/// slice holding the other 70%. Achieved percent over `window_s` seconds.
pub fn work_conservation(cfg: ModelConfig, limit: u32, window_s: u64) -> f64 {
    let busy = SliceSpec::one(30, limit, Priority::Normal, Pattern::Saturate { kernel_ns: 200 * US, ahead: 8 });
    let idle = SliceSpec { share_bps: 7000, limit_bps: 10_000, priority: Priority::Normal, procs: vec![] };
    let mut m = Model::new(cfg, vec![busy, idle]);
    m.run_until((1 + window_s) * SEC + MS);
    fractions(&m, SEC, (1 + window_s) * SEC)[0]
}

/// Result of a priority run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PriorityResult {
    pub p50_alone_ns: u64,
    pub p99_alone_ns: u64,
    pub p50_shared_ns: u64,
    pub p99_shared_ns: u64,
    /// What the three best-effort slices achieved together, percent.
    pub best_effort_pct: f64,
}

impl PriorityResult {
    /// p99 shared over p99 alone.
    pub fn p99_ratio(&self) -> f64 {
        self.p99_shared_ns as f64 / self.p99_alone_ns as f64
    }
}

/// A high-priority slice (25% share, 100% limit) running a latency loop
/// (4 kernels of 250 µs, sync, 3 ms think: 24% of the device on average)
/// alone, then beside three saturating best-effort slices (no share, 100%
/// limit) whose kernels last
/// `be_kernel_ns`. Latencies over `window_s` seconds after warm-up.
pub fn priority(cfg: ModelConfig, be_kernel_ns: u64, window_s: u64) -> PriorityResult {
    priority_beside(cfg, be_kernel_ns, 1, window_s)
}

/// The high slice of the priority runs: 25% share, 100% limit, a latency
/// loop of 4 kernels of 250 µs, a synchronise and 3 ms of think time.
fn high_loop() -> SliceSpec {
    SliceSpec::one(25, 100, Priority::High, Pattern::Latency { kernels: 4, kernel_ns: 250 * US, think_ns: 3 * MS })
}

/// Runs `specs` for one second of warm-up, then `window_s` seconds: the
/// model, and what each slice's latency-pattern processes recorded in the
/// window.
fn windowed(cfg: ModelConfig, specs: Vec<SliceSpec>, window_s: u64) -> (Model, Vec<Vec<u64>>) {
    let n = specs.len();
    let mut m = Model::new(cfg, specs);
    m.run_until(SEC);
    let skip: Vec<usize> = (0..n).map(|s| m.latencies(s).len()).collect();
    m.run_until((1 + window_s) * SEC);
    let lat = skip.iter().enumerate().map(|(s, &k)| m.latencies(s)[k..].to_vec()).collect();
    (m, lat)
}

/// [`priority`] with `be_procs` saturating processes in each best-effort slice.
pub fn priority_beside(cfg: ModelConfig, be_kernel_ns: u64, be_procs: usize, window_s: u64) -> PriorityResult {
    let run = |specs: Vec<SliceSpec>| {
        let (m, mut lat) = windowed(cfg, specs, window_s);
        let f = fractions(&m, SEC, (1 + window_s) * SEC);
        (lat.swap_remove(0), f[1..].iter().sum::<f64>())
    };
    let (alone, _) = run(vec![high_loop()]);
    let mut specs = vec![high_loop()];
    for _ in 0..3 {
        let be = Pattern::Saturate { kernel_ns: be_kernel_ns, ahead: 64 };
        specs.push(SliceSpec { share_bps: 0, limit_bps: 10_000, priority: Priority::BestEffort, procs: vec![be; be_procs] });
    }
    let (shared, be) = run(specs);
    PriorityResult {
        p50_alone_ns: percentile(&alone, 50.0),
        p99_alone_ns: percentile(&alone, 99.0),
        p50_shared_ns: percentile(&shared, 50.0),
        p99_shared_ns: percentile(&shared, 99.0),
        best_effort_pct: be,
    }
}

/// Result of a [`turns`] run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TurnsResult {
    /// The high slice's p99 over its p99 alone.
    pub high_p99_ratio: f64,
    /// Iterations the best-effort latency loop completed, and their p99.
    pub loop_iterations: usize,
    pub loop_p99_ns: u64,
    /// What the best-effort slice achieved, percent.
    pub best_effort_pct: f64,
}

/// The high slice of [`priority`] beside one best-effort slice of two
/// processes: one saturating with `be_kernel_ns` kernels, one a latency
/// loop (one 50 µs kernel, sync, 1 ms think). The high slice keeps the
/// best-effort slice's queue bound at one launch; over `window_s` seconds
/// after warm-up, can the loop get its turns beside a process that
/// relaunches the moment its kernel is done?
pub fn turns(cfg: ModelConfig, be_kernel_ns: u64, window_s: u64) -> TurnsResult {
    let be = SliceSpec {
        share_bps: 0,
        limit_bps: 10_000,
        priority: Priority::BestEffort,
        procs: vec![Pattern::Saturate { kernel_ns: be_kernel_ns, ahead: 64 }, Pattern::Latency { kernels: 1, kernel_ns: 50 * US, think_ns: MS }],
    };
    let p99_alone = percentile(&windowed(cfg, vec![high_loop()], window_s).1[0], 99.0);
    let (m, lat) = windowed(cfg, vec![high_loop(), be], window_s);
    TurnsResult {
        high_p99_ratio: percentile(&lat[0], 99.0) as f64 / p99_alone.max(1) as f64,
        loop_iterations: lat[1].len(),
        loop_p99_ns: percentile(&lat[1], 99.0),
        best_effort_pct: fractions(&m, SEC, (1 + window_s) * SEC)[1],
    }
}

/// Two saturating slices alternate between 30/70 and 60/40 (limit = share),
/// `resizes` times, each at a different phase of the arbiter period. For each
/// resize: the number of periods, counted from the resize (its partial period
/// is period 1), until the first period from which both slices achieve the
/// new shares within 3 points, measured over five periods (a single 10 ms
/// period holds only 30-50 kernels, so one period alone is quantised to
/// 2-3 points).
pub fn resize_convergence(cfg: ModelConfig, resizes: usize) -> Vec<u64> {
    let p = cfg.arbiter.period_ns;
    let specs = vec![
        SliceSpec::one(30, 30, Priority::Normal, Pattern::Saturate { kernel_ns: 200 * US, ahead: 8 }),
        SliceSpec::one(70, 70, Priority::Normal, Pattern::Saturate { kernel_ns: 300 * US, ahead: 8 }),
    ];
    let mut m = Model::new(cfg, specs);
    let mut out = Vec::with_capacity(resizes);
    let mut t = SEC;
    let mut lcg: u64 = 0x2545_f491_4f6c_dd1d;
    for i in 0..resizes {
        lcg = lcg.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        let at = t + (lcg >> 33) % p;
        m.run_until(at);
        let target = if i % 2 == 0 { [60.0, 40.0] } else { [30.0, 70.0] };
        m.resize(0, target[0] as u32, target[0] as u32);
        m.resize(1, target[1] as u32, target[1] as u32);
        let horizon = 20;
        m.run_until(at + (horizon + 6) * p);
        // Period boundaries after the resize: the ticks at or after `at`.
        let ticks: Vec<u64> = m.ticks.iter().map(|(tt, _)| *tt).filter(|&tt| tt >= at).collect();
        // Period k runs from ticks[k] to ticks[k+1]; the resize fell in the
        // partial period before ticks[0], which counts as period 1. Converged
        // at k: the five periods from k achieve the new shares within 3 points.
        let ok = |k: usize| {
            let f = fractions(&m, ticks[k], ticks[k + 5]);
            (f[0] - target[0]).abs() <= 3.0 && (f[1] - target[1]).abs() <= 3.0
        };
        let first = (0..horizon as usize).find(|&k| ok(k)).map_or(horizon + 1, |k| k as u64 + 2);
        out.push(first);
        t = at + (horizon + 6) * p + 200 * MS;
    }
    out
}

/// A 10%-capped slice of `n` saturating processes with `kernel_ns` kernels
/// beside a 90% slice of one process (400 µs kernels): both slices'
/// fractions (%) over `window_s` seconds after a 1 s warm-up.
pub fn many_processes(cfg: ModelConfig, n: usize, kernel_ns: u64, window_s: u64) -> Vec<f64> {
    let many = SliceSpec { share_bps: 1000, limit_bps: 1000, priority: Priority::Normal, procs: vec![Pattern::Saturate { kernel_ns, ahead: 64 }; n] };
    let one = SliceSpec::one(90, 90, Priority::Normal, Pattern::Saturate { kernel_ns: 400_000, ahead: 64 });
    let mut m = Model::new(cfg, vec![many, one]);
    let end = (1 + window_s) * 1_000_000_000;
    m.run_until(end);
    fractions(&m, 1_000_000_000, end)
}
