//! The compute arbiter in `egpud`: every period (10 ms) it reads every
//! slice's limits and usage tables, integrates the device's per-process
//! utilisation samples into each slice's true GPU time, calls
//! [`Arbiter::tick_tables`] (which publishes budgets, allowances and queue
//! bounds into the limits files) and keeps what it computed in
//! [`ComputeStats`] for the metrics endpoint, `egpu ls` and `egpu top`.
//!
//! It runs on its own thread with a current-thread tokio runtime (an
//! `interval` with [`MissedTickBehavior::Skip`]), so a slow gRPC request or
//! a store fsync never shifts the gRPC server's workers and the loop's CPU
//! time is its thread's. A resize publishes the new limits and wakes the
//! loop ([`ComputeStats::resized`]), which re-plans the period in progress
//! at once ([`Arbiter::replan_tables`]; the tick phase is unchanged), so the
//! new shares apply from the resize rather than from the next tick (0–10 ms
//! later); the arbiter clears the slice's correction when its share or
//! limit changed.
//!
//! True GPU time: `nvmlDeviceGetProcessUtilization` samples (the simulated
//! GPU implements it from its per-process busy time) give each process's
//! SM utilisation over an interval; `util × interval` is added to the slice
//! that owns the pid, so a slice's total only grows, across process exits.
//! Pids are mapped to slices from the usage records, refreshed when an
//! unknown pid shows up (at most every 100 ms) and every second.

use crate::agent::Node;
use egpu_arbiter::{Arbiter, ArbiterConfig, Budget, TableRef};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::time::MissedTickBehavior;

/// Upper bounds (seconds) of the tick-duration histogram buckets.
pub const TICK_BUCKETS: [f64; 10] = [10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3];

/// One slice device as the last tick saw it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeviceCompute {
    /// Physical device index.
    pub device: u32,
    /// Budget of the last period, true ns.
    pub budget_ns: u64,
    /// Published cumulative allowance, measured ns.
    pub allowance_ns: u64,
    /// Cumulative true GPU time (device accounting; the measured time where there is none).
    pub used_ns_total: u64,
    /// Whether `used_ns_total` comes from the device's accounting.
    pub true_time: bool,
    /// Cumulative measured time (the hook's `consumed_ns`).
    pub measured_ns_total: u64,
    /// Launches that found the allowance spent, cumulative.
    pub throttle_waits: u64,
    /// Time processes slept waiting for budget, cumulative since egpud started.
    pub throttled_ns_total: u64,
    pub hungry: bool,
    pub scale_ppm: u64,
    /// Recent compute use, basis points of the device (moving average over ~0.5 s).
    pub usage_bps: u32,
}

/// What the arbiter loop publishes for observers.
#[derive(Debug, Clone, Default)]
pub struct ComputeSnapshot {
    pub period_ns: u64,
    pub ticks: u64,
    /// Per slice name, per slice device.
    pub slices: BTreeMap<String, Vec<DeviceCompute>>,
    /// Tick durations: how many ticks fell in each [`TICK_BUCKETS`] bucket (per bucket, not
    /// cumulative: the metrics encoder makes them cumulative; last = above the last bound, +Inf).
    /// Their sum is `tick_sum_s`.
    pub tick_buckets: [u64; TICK_BUCKETS.len() + 1],
    pub tick_sum_s: f64,
    /// Moving average of the time between ticks, seconds.
    pub achieved_period_s: f64,
    /// Ticks of the interval that were skipped because the loop fell behind.
    pub missed_ticks: u64,
    /// CPU time of the loop's thread, seconds.
    pub cpu_s: f64,
}

/// Shared between the loop and its observers; also wakes the loop on a resize.
#[derive(Debug, Default)]
pub struct ComputeStats(Mutex<ComputeSnapshot>, tokio::sync::Notify);

impl ComputeStats {
    /// A slice's limits were republished (a resize): the loop re-plans the
    /// period in progress as soon as it can. Several resizes before it runs
    /// are one re-plan (of the newest limits).
    pub fn resized(&self) {
        self.1.notify_one();
    }

    pub fn snapshot(&self) -> ComputeSnapshot {
        self.lock().clone()
    }

    /// The last tick's view of one slice.
    pub fn slice(&self, name: &str) -> Option<Vec<DeviceCompute>> {
        self.lock().slices.get(name).cloned()
    }

    fn lock(&self) -> MutexGuard<'_, ComputeSnapshot> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Integrates per-process utilisation samples into per-slice true GPU time.
#[derive(Debug, Default)]
struct Truth {
    /// Per physical device: newest sample timestamp seen (0: not sampled yet).
    last_seen_us: Vec<u64>,
    /// Per physical device: whether the driver gives samples.
    supported: Vec<bool>,
    /// (device, pid) -> timestamp of its previous sample.
    prev_us: HashMap<(u32, u32), u64>,
    /// pid -> slice id.
    pids: HashMap<u32, String>,
    /// Sampled pids that were in no slice at the last refresh (not a reason to refresh again).
    strangers: std::collections::HashSet<u32>,
    pids_at: Option<Instant>,
    /// Slice id -> cumulative true ns per physical device.
    totals: HashMap<String, HashMap<u32, u64>>,
}

/// The loop's state: the arbiter and everything it remembers between ticks.
///
/// Everything remembered about a slice is keyed by its id, not its name: a
/// slice deleted and made again under the same name between two ticks starts
/// afresh (no arbiter deficit, throttled time or usage rate of the old one).
pub struct ComputeLoop {
    arbiter: Arbiter,
    /// Slice id -> the arbiter's key.
    ids: HashMap<String, u64>,
    next_id: u64,
    truth: Truth,
    last_tick: Option<Instant>,
    /// (slice id, device index in slice) -> (last sum of attached records' throttled_ns, running total).
    throttled: HashMap<(String, usize), (u64, u64)>,
    usage_bps: HashMap<(String, usize), f64>,
    /// (slice id, device index in slice) -> the published used time (since egpud started).
    used: HashMap<(String, usize), UsedCounter>,
}

impl ComputeLoop {
    pub fn new(cfg: ArbiterConfig) -> ComputeLoop {
        ComputeLoop {
            arbiter: Arbiter::new(cfg),
            ids: HashMap::new(),
            next_id: 1,
            truth: Truth::default(),
            last_tick: None,
            throttled: HashMap::new(),
            usage_bps: HashMap::new(),
            used: HashMap::new(),
        }
    }

    pub fn period(&self) -> Duration {
        Duration::from_nanos(self.arbiter.config().period_ns)
    }

    /// One period: sample the devices, tick, publish, record.
    pub fn tick(&mut self, node: &Node, now_ns: u64) -> Vec<Budget> {
        let started = Instant::now();
        // The slices of the first tick were there when egpud started.
        let first_tick = self.last_tick.is_none();
        let ndev = node.inventory.devices.len();
        self.truth.last_seen_us.resize(ndev, 0);
        self.truth.supported.resize(ndev, true);
        // Ask the driver before taking the slices lock.
        let mut samples = Vec::new();
        for d in 0..ndev {
            if !self.truth.supported[d] {
                continue;
            }
            match node.gpus.process_samples(d as u32, self.truth.last_seen_us[d]) {
                Ok(Some(v)) => samples.push((d as u32, v)),
                Ok(None) => {
                    tracing::info!(device = d, "the driver gives no per-process utilisation; the arbiter enforces measured time only");
                    self.truth.supported[d] = false;
                }
                Err(e) => tracing::debug!(device = d, error = %e, "per-process utilisation"),
            }
        }
        let mut m = node.slices();
        // Burst memory: answer the slices' requests for more.
        crate::burst::tick(&mut m, Instant::now());
        self.refresh_pids(&m, &samples);
        for (d, v) in &samples {
            self.truth.add(*d, v);
        }
        // Stable arbiter ids; forget removed slices.
        let mut names: Vec<&str> = Vec::new();
        let mut trues: Vec<Vec<Option<u64>>> = Vec::new();
        for s in m.slices() {
            let id = s.record.id.as_str();
            if !self.ids.contains_key(id) {
                self.ids.insert(id.to_string(), self.next_id);
                self.next_id += 1;
            }
            let totals = self.truth.totals.get(id);
            trues.push(
                s.record
                    .spec
                    .devices
                    .iter()
                    .map(|d| {
                        let dev = d.device as usize;
                        // Truth once a sample of one of the slice's processes
                        // was seen on the device. Before that (an idle slice,
                        // or pids NVML reports from another pid namespace than
                        // egpud's, which then never match) the measured time.
                        (dev < ndev && self.truth.supported[dev]).then(|| totals.and_then(|t| t.get(&d.device)).copied()).flatten()
                    })
                    .collect(),
            );
            names.push(s.name());
        }
        let refs: Vec<TableRef<'_>> = m
            .slices()
            .zip(&trues)
            .map(|(s, t)| TableRef { slice: self.ids[s.record.id.as_str()], limits: &s.limits, usage: &s.usage, true_ns: t })
            .collect();
        let (budgets, errors) = self.arbiter.tick_tables(now_ns, &refs);
        for e in errors {
            tracing::warn!(error = %e, "compute arbiter skipped a slice");
        }
        // What observers see.
        let by_id: HashMap<u64, usize> = refs.iter().enumerate().map(|(i, r)| (r.slice, i)).collect();
        let period = self.arbiter.config().period_ns.max(1) as f64;
        let mut view: BTreeMap<String, Vec<DeviceCompute>> = BTreeMap::new();
        let all: Vec<&crate::slices::Slice> = m.slices().collect();
        for b in &budgets {
            let Some(&i) = by_id.get(&b.key.slice) else { continue };
            let s = all[i];
            let dev = b.key.dev as usize;
            let u = s.usage.region();
            let throttled_sum = attached_throttled_ns(&s.usage, dev);
            let th = self.throttled.entry((s.record.id.clone(), dev)).or_insert((throttled_sum, 0));
            th.1 += throttled_sum.saturating_sub(th.0);
            th.0 = throttled_sum;
            let rate = self.usage_bps.entry((s.record.id.clone(), dev)).or_insert(0.0);
            *rate += (b.used_ns as f64 / period * 10_000.0 - *rate) * 0.02;
            let measured = u.consumed_ns[dev].load(Ordering::Relaxed);
            let truth = trues[i].get(dev).copied().flatten();
            let used = self.used.entry((s.record.id.clone(), dev)).or_insert_with(|| UsedCounter::new(first_tick));
            let used_total = used.advance(truth.is_some(), truth.unwrap_or(measured));
            tracing::trace!(slice = names[i], dev, budget_ns = b.budget_ns, used_ns = b.used_ns, scale_ppm = b.scale_ppm, hungry = b.hungry, "compute tick");
            let e = view.entry(names[i].to_string()).or_default();
            e.push(DeviceCompute {
                device: s.record.spec.devices.get(dev).map(|d| d.device).unwrap_or(0),
                budget_ns: b.budget_ns,
                allowance_ns: b.allowance_ns,
                used_ns_total: used_total,
                true_time: truth.is_some(),
                measured_ns_total: measured,
                throttle_waits: u.throttle_waits[dev].load(Ordering::Relaxed),
                throttled_ns_total: th.1,
                hungry: b.hungry,
                scale_ppm: b.scale_ppm,
                usage_bps: rate.round().clamp(0.0, 10_000.0) as u32,
            });
        }
        let live: std::collections::HashSet<&str> = m.slices().map(|s| s.record.id.as_str()).collect();
        self.ids.retain(|k, _| live.contains(k.as_str()));
        self.throttled.retain(|k, _| live.contains(k.0.as_str()));
        self.usage_bps.retain(|k, _| live.contains(k.0.as_str()));
        self.used.retain(|k, _| live.contains(k.0.as_str()));
        self.truth.totals.retain(|k, _| live.contains(k.as_str()));
        drop(refs);
        drop(m);
        let took = started.elapsed().as_secs_f64();
        let interval = self.last_tick.map(|t| started.duration_since(t).as_secs_f64());
        self.last_tick = Some(started);
        let mut st = node.compute.lock();
        st.period_ns = self.arbiter.config().period_ns;
        st.ticks += 1;
        st.slices = view;
        let b = TICK_BUCKETS.iter().position(|&ub| took <= ub).unwrap_or(TICK_BUCKETS.len());
        st.tick_buckets[b] += 1;
        st.tick_sum_s += took;
        if let Some(i) = interval {
            st.achieved_period_s = if st.achieved_period_s == 0.0 { i } else { st.achieved_period_s + (i - st.achieved_period_s) * 0.01 };
        }
        st.cpu_s = thread_cpu_s();
        budgets
    }

    /// A resize between ticks: re-plans the period in progress under the
    /// slices' new limits and publishes it ([`Arbiter::replan_tables`]).
    /// Nothing is sampled or measured (that is the next tick's); slices
    /// created since the last tick wait for it. The observers' view gets the
    /// new budgets and allowances.
    pub fn replan(&mut self, node: &Node) -> Vec<Budget> {
        let m = node.slices();
        let none: [Option<u64>; 0] = [];
        let refs: Vec<TableRef<'_>> = m
            .slices()
            .filter_map(|s| self.ids.get(s.record.id.as_str()).map(|&id| TableRef { slice: id, limits: &s.limits, usage: &s.usage, true_ns: &none }))
            .collect();
        let (budgets, errors) = self.arbiter.replan_tables(&refs);
        for e in errors {
            tracing::warn!(error = %e, "compute arbiter skipped a slice");
        }
        let names: HashMap<u64, &str> = m.slices().filter_map(|s| self.ids.get(s.record.id.as_str()).map(|&id| (id, s.name()))).collect();
        drop(refs);
        let mut st = node.compute.lock();
        for b in &budgets {
            let Some(d) = names.get(&b.key.slice).and_then(|n| st.slices.get_mut(*n)).and_then(|v| v.get_mut(b.key.dev as usize)) else { continue };
            d.budget_ns = b.budget_ns;
            d.allowance_ns = b.allowance_ns;
        }
        budgets
    }

    fn refresh_pids(&mut self, m: &crate::slices::SliceManager, samples: &[(u32, Vec<crate::devices::ProcSample>)]) {
        let t = &self.truth;
        let unknown = samples.iter().flat_map(|(_, v)| v).any(|s| !t.pids.contains_key(&s.pid) && !t.strangers.contains(&s.pid));
        let age = self.truth.pids_at.map(|t| t.elapsed());
        let due = match age {
            None => true,
            Some(a) => a >= Duration::from_secs(1) || (unknown && a >= Duration::from_millis(100)),
        };
        if !due {
            return;
        }
        self.truth.pids.clear();
        for s in m.slices() {
            for p in s.usage.processes().into_iter().filter(|p| p.alive) {
                self.truth.pids.insert(p.pid, s.record.id.clone());
            }
        }
        let pids = &self.truth.pids;
        self.truth.strangers = samples.iter().flat_map(|(_, v)| v).map(|s| s.pid).filter(|p| !pids.contains_key(p)).collect();
        self.truth.prev_us.retain(|(_, pid), _| pids.contains_key(pid));
        self.truth.pids_at = Some(Instant::now());
    }
}

/// A slice device's published GPU time (`egpu_slice_compute_used_seconds_total`,
/// a counter) since egpud started: the measured time until the device's truth
/// for the slice starts, then the truth. A switch of source adds nothing that
/// tick and then follows the new source's increase, so the counter never goes
/// back (the truth starts near zero where the measured time may be far along).
///
/// The truth lives in egpud's memory, the measured time (the hook's
/// `consumed_ns`) in the slice's usage file, which outlives egpud: a slice
/// that was there when egpud started counts from 0, not from its measured
/// time, which holds GPU time from before the start (an earlier egpud may
/// have published less of it, from the truth). A slice made since counts its
/// measured time from its creation.
#[derive(Debug, Default, Clone, Copy)]
struct UsedCounter {
    total: u64,
    /// The source of the last tick (true: device truth) and its raw value.
    last: Option<(bool, u64)>,
    /// The slice was there when egpud started: its first raw value is a baseline.
    from_start: bool,
}

impl UsedCounter {
    fn new(from_start: bool) -> UsedCounter {
        UsedCounter { from_start, ..UsedCounter::default() }
    }

    fn advance(&mut self, truth: bool, raw: u64) -> u64 {
        match self.last {
            None if self.from_start => {}
            None => self.total = raw,
            Some((was, prev)) if was == truth => self.total = self.total.saturating_add(raw.saturating_sub(prev)),
            Some(_) => {}
        }
        self.last = Some((truth, raw));
        self.total
    }
}

impl Truth {
    /// Integrates one batch of NVML samples of device `dev`. A batch may hold
    /// several samples of a pid, in any order: each is counted over the time
    /// since the newest one before it, and one no newer than what was
    /// already counted for its pid adds nothing (counted once, never twice).
    fn add(&mut self, dev: u32, samples: &[crate::devices::ProcSample]) {
        let last = &mut self.last_seen_us[dev as usize];
        let base = *last;
        let mut ordered: Vec<&crate::devices::ProcSample> = samples.iter().collect();
        ordered.sort_by_key(|s| s.timestamp_us);
        for s in ordered {
            let prev = self.prev_us.get(&(dev, s.pid)).copied().unwrap_or(base);
            if prev != 0 && s.timestamp_us <= prev {
                continue;
            }
            self.prev_us.insert((dev, s.pid), s.timestamp_us);
            *last = (*last).max(s.timestamp_us);
            if prev == 0 {
                continue; // first sample ever: a baseline
            }
            let ns = u64::from(s.sm_util.min(100)) * s.timestamp_us.saturating_sub(prev) * 10;
            if let Some(id) = self.pids.get(&s.pid) {
                *self.totals.entry(id.clone()).or_default().entry(dev).or_insert(0) += ns;
            }
        }
    }
}

/// Sum of `throttled_ns[dev]` over the attached records (no system call).
fn attached_throttled_ns(u: &egpu_abi::UsageFile, dev: usize) -> u64 {
    let r = u.region();
    let hw = (r.high_water.load(Ordering::Acquire) as usize).min(egpu_abi::MAX_PROCS);
    r.procs[..hw]
        .iter()
        .filter(|p| p.state.load(Ordering::Acquire) != 0)
        .map(|p| p.throttled_ns[dev].load(Ordering::Relaxed))
        .fold(0u64, u64::saturating_add)
}

/// CLOCK_MONOTONIC, ns (the clock of the slice table's epoch words).
pub fn monotonic_ns() -> u64 {
    egpu_abi::monotonic_ns()
}

/// CPU time of the calling thread, seconds (0 when unavailable).
pub fn thread_cpu_s() -> f64 {
    std::fs::read_to_string("/proc/thread-self/stat")
        .ok()
        .and_then(|s| {
            let rest = s.rsplit_once(')')?.1;
            let f: Vec<&str> = rest.split_whitespace().collect();
            // Fields after the command: state is field 3, utime 14, stime 15.
            let ut: f64 = f.get(11)?.parse().ok()?;
            let st: f64 = f.get(12)?.parse().ok()?;
            Some((ut + st) / 100.0)
        })
        .unwrap_or(0.0)
}

/// Runs the loop on its own thread until `stop` is set.
pub fn spawn(node: Arc<Node>, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name("egpud-arbiter".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread().enable_time().build() {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!(error = %e, "cannot start the compute arbiter's runtime; compute is not arbitrated");
                    return;
                }
            };
            rt.block_on(run(node, stop));
        })
        .expect("spawning a thread")
}

async fn run(node: Arc<Node>, stop: Arc<AtomicBool>) {
    let mut lp = ComputeLoop::new(ArbiterConfig::default());
    let period = lp.period();
    tracing::info!(period_ms = period.as_secs_f64() * 1e3, "compute arbiter running");
    let mut iv = tokio::time::interval(period);
    iv.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let mut expected = tokio::time::Instant::now();
    // At most one re-plan between two ticks: after one, the loop waits for
    // the tick (later resizes are applied by it), so a client resizing
    // without pause cannot starve the ticks.
    let mut replanned = false;
    while !stop.load(Ordering::Acquire) {
        let at = match next_wake(&mut iv, &node.compute, !replanned).await {
            Wake::Tick(at) => at,
            Wake::Resized => {
                lp.replan(&node);
                replanned = true;
                continue;
            }
        };
        replanned = false;
        let missed = at.saturating_duration_since(expected).as_nanos() / period.as_nanos().max(1);
        expected = at + period;
        lp.tick(&node, monotonic_ns());
        if missed > 0 {
            node.compute.lock().missed_ticks += missed as u64;
        }
    }
}

/// What the loop wakes up for.
#[derive(Debug, PartialEq, Eq)]
enum Wake {
    Tick(tokio::time::Instant),
    Resized,
}

/// The next periodic tick, or (if `resizes`) a resize
/// ([`ComputeStats::resized`]) before it.
async fn next_wake(iv: &mut tokio::time::Interval, stats: &ComputeStats, resizes: bool) -> Wake {
    tokio::select! {
        biased;
        () = stats.1.notified(), if resizes => Wake::Resized,
        at = iv.tick() => Wake::Tick(at),
    }
}

#[cfg(test)]
mod tests;
