//! How many GPUs a set of pods needs under three sharing strategies, with
//! violation accounting, and the lower bound.
//!
//! - **Exclusive**: one whole GPU per live pod.
//! - **Static peak**: a fixed slice per pod, sized to the pod's peak duty
//!   cycle and peak memory over its whole life (an oracle: it knows the peak
//!   in advance), packed first-fit onto GPUs.
//! - **Elastic**: every `resize_every` minutes each slice is resized from
//!   the pod's last `window` minutes: memory to the peak times
//!   `1 + headroom` plus a floor, compute share to a quantile (or the mean)
//!   of the duty cycle, likewise. It is online: a slice that serves minute
//!   t is decided from samples up to t − 1 (at a pod's first minute, its
//!   own first sample stands for its request). [`Moves`] says how slices
//!   move at a resize (never, on overflow, or re-packed); every move is a
//!   migration. [`GpuRisk`] optionally packs compute by the quantile of
//!   each GPU's summed recent duty instead of the sum of the shares.
//! - **Elastic, no migration** and an **oracle** that knows the coming
//!   period's peak memory and mean duty (a bound on what prediction buys).
//!
//! Memory limits are hard. Compute is shared the way eGPU's arbiter shares
//! it (guaranteed share, work-conserving up to the whole GPU), so a pod
//! above its compute share is only short-changed, and counted as a
//! violation, in minutes when its GPU's total demand exceeds the GPU. The
//! work it was not given is delayed, not dropped: it waits for the next
//! minute on top of that minute's duty ([`Backlog`]), unless
//! [`ElasticConfig::carry_unserved`] is off.
//!
//! Slices are placed first-fit at arrival; the GPUs needed is the peak
//! over minutes of the GPUs in use. A
//! violation minute is a pod-minute whose duty cycle or memory exceeded its
//! slice; refused memory is what it used beyond its slice.

use super::fleet::{self, FleetConfig, FleetSearch};
use super::load::Usage;
use serde::Serialize;

pub(super) const GIB: f64 = (1u64 << 30) as f64;

/// Live minutes from which a pod's own violation fraction is reported.
pub const LONG_LIVED: u32 = 60;

/// Elastic policy and GPU size.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ElasticConfig {
    pub gpu_mem_gib: f64,
    pub resize_every: usize,
    pub window: usize,
    pub headroom: f64,
    pub compute_floor: f64,
    pub mem_floor_gib: f64,
    /// How the elastic strategy moves slices at a resize.
    pub moves: Moves,
    /// Compute share from this quantile of the window's duty cycle
    /// (1.0 = its peak); `None`: from its mean.
    pub compute_quantile: Option<f64>,
    /// Window for the compute share, minutes (`None`: `window`).
    pub compute_window: Option<usize>,
    /// Correlation-aware compute check: `None` packs compute by the sum of
    /// the pods' shares (≤ 1 GPU). `Some` instead admits a pod to a GPU
    /// when the [`GpuRisk::quantile`] of the GPU's *summed* duty trace over
    /// the last [`GpuRisk::window`] minutes (its pods' traces added minute
    /// by minute, the candidate's included) is at most one GPU: pods whose
    /// bursts do not coincide share a GPU. Shares are then scaled down on a
    /// GPU whose shares sum above 1 (guarantees never over-commit).
    pub gpu_risk: Option<GpuRisk>,
    /// Headroom for memory only (`None`: `headroom`).
    pub mem_headroom: Option<f64>,
    /// Adopt a first-fit-decreasing re-pack only when it needs at least
    /// this many fewer GPUs than the current placement (1: any saving).
    pub repack_gain: usize,
    /// Also evaluate a fixed fleet with pooled headroom
    /// ([`super::fleet`]), searching for the smallest fleet within its
    /// violation budget between the lower bound and exclusive's GPUs.
    pub fleet: Option<FleetConfig>,
    /// Compute work a pod was not given in its minute waits for the next
    /// minute, added to that minute's duty ([`Backlog`]); false drops it
    /// (the accounting before this was added, kept for comparison). Every
    /// strategy, the fleet's included (it overrides
    /// [`FleetConfig::carry_unserved`]).
    pub carry_unserved: bool,
}

/// The per-GPU compute check of [`ElasticConfig::gpu_risk`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct GpuRisk {
    /// Minutes of history summed.
    pub window: usize,
    /// Quantile of the summed trace that must fit in one GPU (1 = its max).
    pub quantile: f64,
}

impl Default for ElasticConfig {
    fn default() -> Self {
        ElasticConfig { gpu_mem_gib: 80.0, resize_every: 1, window: 5, headroom: 0.0, compute_floor: 0.0, mem_floor_gib: 0.0, moves: Moves::Repack, compute_quantile: Some(0.8), compute_window: None, gpu_risk: None, repack_gain: 1, mem_headroom: None, fleet: None, carry_unserved: true }
    }
}

/// One strategy's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub strategy: String,
    pub gpus: usize,
    /// Mean over minutes of summed duty cycle ÷ GPUs.
    pub utilization: f64,
    pub violation_minutes: u64,
    /// Violation minutes with memory over the slice (the rest are compute).
    pub mem_violation_minutes: u64,
    pub pod_minutes: u64,
    pub refused_mem_gib_minutes: f64,
    pub max_refused_gib: f64,
    pub migrations: u64,
    pub saving_vs_exclusive: f64,
    /// GPU time the live pods asked for (Σ duty over pod-minutes), and the
    /// part of it the arbiter could not give them in the minute they asked
    /// (GPU-minutes): how much work compute violations delayed. With the
    /// unserved work carried over ([`Backlog`]), work that waits several
    /// minutes counts once for each minute it waits.
    pub demand_gpu_minutes: f64,
    pub short_gpu_minutes: f64,
    /// Over the pod-minutes cut on compute: what the pod got, as a fraction
    /// of what it asked for (median and 10th percentile; 1 if none).
    pub cut_served_p50: f64,
    pub cut_served_p10: f64,
    /// Pods with at least one violation minute, and over the pods that
    /// lived at least an hour ([`LONG_LIVED`]: a pod of 5 minutes with 2
    /// bad ones would say little), the 90th percentile and the largest
    /// fraction of a pod's live minutes that were violations (`None`,
    /// `null` in JSON, when no pod lived that long).
    pub pods_violated: usize,
    pub pod_violation_p90: Option<f64>,
    pub pod_violation_max: Option<f64>,
    /// GPUs in use at each minute.
    #[serde(skip)]
    pub in_use: Vec<u32>,
    /// Served ÷ demanded of each pod-minute cut on compute.
    #[serde(skip)]
    served_when_cut: Vec<f32>,
    /// Per pod: live minutes and violation minutes.
    #[serde(skip)]
    per_pod: Vec<(u32, u32)>,
}

/// Memory refused to a pod that uses `used` bytes under a hard limit of
/// `limit_gib`, GiB (0: none; a byte of slack for rounding).
pub(super) fn refused_gib(used: f64, limit_gib: f64) -> f64 {
    if used > limit_gib * GIB + 1.0 { (used - limit_gib * GIB) / GIB } else { 0.0 }
}

impl Outcome {
    /// An empty outcome for `strategy` on `gpus` GPUs.
    pub fn new(strategy: &str, gpus: usize, minutes: usize) -> Outcome {
        Outcome {
            strategy: strategy.into(),
            gpus,
            utilization: 0.0,
            violation_minutes: 0,
            mem_violation_minutes: 0,
            pod_minutes: 0,
            refused_mem_gib_minutes: 0.0,
            max_refused_gib: 0.0,
            migrations: 0,
            saving_vs_exclusive: 0.0,
            demand_gpu_minutes: 0.0,
            short_gpu_minutes: 0.0,
            cut_served_p50: 1.0,
            cut_served_p10: 1.0,
            pods_violated: 0,
            pod_violation_p90: None,
            pod_violation_max: None,
            in_use: Vec::with_capacity(minutes),
            served_when_cut: Vec::new(),
            per_pod: Vec::new(),
        }
    }

    /// Counts one live pod-minute of pod `pod`: the one definition of a
    /// violation. Memory `used` bytes over the slice's `limit_gib` is always
    /// one (with the refused GiB); so is compute when the pod was `served`
    /// less GPU time than it `asked` (its `duty` of the minute plus any work
    /// still waiting from earlier minutes, [`Backlog`]), which only happens
    /// while its GPU is saturated.
    pub fn count(&mut self, pod: usize, used: f64, limit_gib: f64, duty: f64, asked: f64, served: f64) {
        self.count_refused(pod, refused_gib(used, limit_gib), duty, asked, served);
    }

    /// [`Outcome::count`] where the caller worked out the refused memory
    /// (GiB; 0: none), as a burst pool does.
    pub fn count_refused(&mut self, pod: usize, refused_gib: f64, duty: f64, asked: f64, served: f64) {
        self.pod_minutes += 1;
        self.demand_gpu_minutes += duty;
        let compute_over = compute_cut(asked, served);
        if compute_over {
            self.short_gpu_minutes += asked - served;
            self.served_when_cut.push((served / asked) as f32);
        }
        let over_m = refused_gib > 0.0;
        if self.per_pod.len() <= pod {
            self.per_pod.resize(pod + 1, (0, 0));
        }
        self.per_pod[pod].0 += 1;
        if over_m || compute_over {
            self.violation_minutes += 1;
            self.per_pod[pod].1 += 1;
        }
        if over_m {
            self.mem_violation_minutes += 1;
            self.refused_mem_gib_minutes += refused_gib;
            self.max_refused_gib = self.max_refused_gib.max(refused_gib);
        }
    }

    /// Fill in the severity summaries (`cut_served_*`, `pod*`) from what
    /// [`Outcome::count`] saw.
    pub fn summarize(&mut self) {
        let served: Vec<f64> = self.served_when_cut.iter().map(|&x| f64::from(x)).collect();
        if !served.is_empty() {
            self.cut_served_p50 = quantile(&served, 0.5);
            self.cut_served_p10 = quantile(&served, 0.1);
        }
        let frac: Vec<f64> = self.per_pod.iter().filter(|p| p.0 >= LONG_LIVED).map(|&(live, bad)| f64::from(bad) / f64::from(live)).collect();
        self.pods_violated = self.per_pod.iter().filter(|p| p.1 > 0).count();
        if !frac.is_empty() {
            self.pod_violation_p90 = Some(quantile(&frac, 0.9));
            self.pod_violation_max = Some(frac.iter().copied().fold(0.0, f64::max));
        }
    }
}

/// All strategies for one GPU size.
#[derive(Debug, Clone, Serialize)]
pub struct Evaluation {
    pub config: ElasticConfig,
    pub pods: usize,
    /// Sampling periods evaluated (called minutes throughout), and their
    /// length in seconds.
    pub minutes: usize,
    pub step_s: f64,
    pub lower_bound: usize,
    pub lower_bound_exact: f64,
    pub outcomes: Vec<Outcome>,
    /// The fleet sizes tried for `elastic-fleet`, if evaluated.
    pub fleet: Option<FleetSearch>,
    /// The fleet sizes tried for `fleet-hindsight-static`, if evaluated.
    pub hindsight: Option<FleetSearch>,
    /// The fleet sizes tried for `fleet-foresight`, if evaluated.
    pub foresight: Option<FleetSearch>,
    /// What `--lenient` left out of the input files.
    pub left_out: super::load::LeftOut,
    /// Absences longer than `--max-gap` the pods were cut at (each cut makes
    /// one pod more: [`super::Usage::split_absences`]).
    pub absences: usize,
    #[serde(skip)]
    pub lower_bound_series: Vec<f64>,
}

/// Usage with gaps filled: within a pod's life a missing sample repeats the
/// last one (0 before the first); outside its life the pod is absent.
pub(super) struct Filled {
    pub(super) duty: Vec<Vec<f64>>,
    pub(super) mem: Vec<Vec<f64>>,
    pub(super) life: Vec<Option<(usize, usize)>>,
}

pub(super) fn fill(u: &Usage) -> Filled {
    let n = u.pods.len();
    let mut f = Filled { duty: vec![vec![0.0; u.minutes]; n], mem: vec![vec![0.0; u.minutes]; n], life: vec![None; n] };
    for i in 0..n {
        let seen = |t: usize| !u.duty[i][t].is_nan() || !u.mem[i][t].is_nan();
        let first = (0..u.minutes).find(|&t| seen(t));
        let last = (0..u.minutes).rev().find(|&t| seen(t));
        let (Some(a), Some(b)) = (first, last) else { continue };
        f.life[i] = Some((a, b));
        let (mut d, mut m) = (0.0, 0.0);
        for t in a..=b {
            if !u.duty[i][t].is_nan() {
                // The grid keeps duty as f32: 0.6 + 0.4 would sum to
                // 1.00000003 and look like a saturated GPU. Samples are
                // rounded back to a millionth of a GPU.
                d = (f64::from(u.duty[i][t]) * 1e6).round() / 1e6;
            }
            if !u.mem[i][t].is_nan() {
                m = f64::from(u.mem[i][t]);
            }
            f.duty[i][t] = d;
            f.mem[i][t] = m;
        }
    }
    f
}

pub(super) fn alive(f: &Filled, i: usize, t: usize) -> bool {
    f.life[i].is_some_and(|(a, b)| a <= t && t <= b)
}

/// How slices move between GPUs when they are resized.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Moves {
    /// Never move a pod: a slice grows only into what its GPU has free;
    /// the rest of the growth is refused (and shows up as violations).
    None,
    /// A pod whose GPU no longer holds its grown slice moves (first fit).
    Evict,
    /// Evict as above, and at every resize also re-pack all slices
    /// first-fit-decreasing when that needs fewer GPUs; the new bins are
    /// matched to the old GPUs to keep as many pods in place as possible
    /// and every pod that still changes GPU counts as a migration.
    Repack,
}

/// Sizes of a slice: compute share (GPU) and memory (GiB).
#[derive(Clone, Copy, Default)]
struct Slice {
    c: f64,
    m: f64,
}

struct Packer {
    gpu_mem: f64,
    gpus: Vec<Vec<usize>>,
    gpu_of: Vec<Option<usize>>,
    /// With a per-GPU risk check: its quantile, and each pod's recent duty
    /// trace (oldest first, the same length for every pod).
    risk: Option<f64>,
    trace: Vec<Vec<f64>>,
    repack_gain: usize,
}

impl Packer {
    fn load(&self, g: usize, sl: &[Slice]) -> (f64, f64) {
        self.gpus[g].iter().fold((0.0, 0.0), |(c, m), &p| (c + sl[p].c, m + sl[p].m))
    }
    /// Summed duty trace of `pods`.
    fn sum_trace(&self, pods: impl Iterator<Item = usize>) -> Vec<f64> {
        let mut sum = vec![0.0; self.trace.first().map_or(0, Vec::len)];
        for p in pods {
            for (a, b) in sum.iter_mut().zip(&self.trace[p]) {
                *a += b;
            }
        }
        sum
    }
    /// Whether a GPU holding `pods` (shares `c` and memory `m` summed) is
    /// within one GPU: memory always; compute by the shares or, with a risk
    /// check, by the quantile of the summed trace.
    fn within(&self, pods: &[usize], c: f64, m: f64) -> bool {
        if m > self.gpu_mem + 1e-3 {
            return false;
        }
        match self.risk {
            None => c <= 1.0 + 1e-9,
            Some(q) => quantile(&self.sum_trace(pods.iter().copied()), q) <= 1.0 + 1e-9,
        }
    }
    fn fits(&self, g: usize, p: usize, sl: &[Slice]) -> bool {
        let (c, m) = self.load(g, sl);
        let mut pods = self.gpus[g].clone();
        pods.push(p);
        self.within(&pods, c + sl[p].c, m + sl[p].m)
    }
    fn overflows(&self, g: usize, sl: &[Slice]) -> bool {
        let (c, m) = self.load(g, sl);
        !self.within(&self.gpus[g], c, m)
    }
    fn put(&mut self, p: usize, sl: &[Slice]) {
        let g = match (0..self.gpus.len()).find(|&g| self.fits(g, p, sl)) {
            Some(g) => g,
            None => {
                self.gpus.push(Vec::new());
                self.gpus.len() - 1
            }
        };
        self.gpus[g].push(p);
        self.gpu_of[p] = Some(g);
    }
    fn remove(&mut self, p: usize) {
        if let Some(g) = self.gpu_of[p].take() {
            self.gpus[g].retain(|&q| q != p);
        }
    }
    fn in_use(&self) -> usize {
        self.gpus.iter().filter(|g| !g.is_empty()).count()
    }
    /// First-fit-decreasing bins of all placed pods, adopted if they need
    /// fewer GPUs than now. Returns the pods that changed GPU.
    fn repack(&mut self, sl: &[Slice]) -> Vec<usize> {
        let mut pods: Vec<usize> = self.gpus.iter().flatten().copied().collect();
        let size = |p: usize| (sl[p].m / self.gpu_mem).max(sl[p].c);
        pods.sort_by(|&a, &b| size(b).total_cmp(&size(a)).then(a.cmp(&b)));
        let mut bins: Vec<(f64, f64, Vec<usize>)> = Vec::new();
        for p in pods {
            let fit = |b: &(f64, f64, Vec<usize>)| {
                let mut with = b.2.clone();
                with.push(p);
                self.within(&with, b.0 + sl[p].c, b.1 + sl[p].m)
            };
            match bins.iter_mut().find(|b| fit(b)) {
                Some(b) => {
                    b.0 += sl[p].c;
                    b.1 += sl[p].m;
                    b.2.push(p);
                }
                None => bins.push((sl[p].c, sl[p].m, vec![p])),
            }
        }
        if bins.len() + self.repack_gain.max(1) > self.in_use() {
            return Vec::new();
        }
        // Give each bin the old GPU that already holds most of its pods.
        bins.sort_by_key(|b| std::cmp::Reverse(b.2.len()));
        let mut claimed = vec![false; self.gpus.len()];
        let mut next = vec![Vec::new(); self.gpus.len()];
        let mut unmatched = Vec::new();
        for (_, _, b) in bins {
            let mut votes: Vec<(usize, usize)> = Vec::new();
            for &p in &b {
                if let Some(g) = self.gpu_of[p].filter(|&g| !claimed[g]) {
                    match votes.iter_mut().find(|v| v.0 == g) {
                        Some(v) => v.1 += 1,
                        None => votes.push((g, 1)),
                    }
                }
            }
            match votes.iter().max_by_key(|v| (v.1, std::cmp::Reverse(v.0))) {
                Some(&(g, _)) => {
                    claimed[g] = true;
                    next[g] = b;
                }
                None => unmatched.push(b),
            }
        }
        for b in unmatched {
            let g = (0..claimed.len()).find(|&g| !claimed[g]).unwrap_or(claimed.len());
            if g == claimed.len() {
                claimed.push(false);
                next.push(Vec::new());
            }
            claimed[g] = true;
            next[g] = b;
        }
        let mut moved = Vec::new();
        for (g, b) in next.iter().enumerate() {
            for &p in b {
                if self.gpu_of[p] != Some(g) {
                    moved.push(p);
                    self.gpu_of[p] = Some(g);
                }
            }
        }
        self.gpus = next;
        moved
    }
}

/// Pack slices that may change at resize points (every `every` minutes).
/// `slice(i, t, end)` sizes pod `i`'s slice for minutes `t..end`.
// `i` indexes the usage, the slices and the packer together.
#[allow(clippy::needless_range_loop)]
#[allow(clippy::too_many_arguments)]
fn run_slices(f: &Filled, minutes: usize, gpu_mem: f64, every: usize, moves: Moves, carry: bool, mut slice: impl FnMut(usize, usize, usize) -> Slice, name: &str) -> Outcome {
    run_slices_with(f, minutes, gpu_mem, every, moves, None, 1, carry, &mut slice, name)
}

/// [`run_slices`] with an optional per-GPU risk check and re-pack gain.
// `i` indexes the usage, the slices and the packer together.
#[allow(clippy::needless_range_loop, clippy::too_many_arguments)]
fn run_slices_with(f: &Filled, minutes: usize, gpu_mem: f64, every: usize, moves: Moves, risk: Option<GpuRisk>, repack_gain: usize, carry: bool, slice: &mut dyn FnMut(usize, usize, usize) -> Slice, name: &str) -> Outcome {
    let n = f.life.len();
    let mut backlog = Backlog::new(n, carry);
    let mut sl = vec![Slice::default(); n];
    let w = risk.map_or(0, |r| r.window.max(1));
    let mut pk = Packer { gpu_mem, gpus: Vec::new(), gpu_of: vec![None; n], risk: risk.map(|r| r.quantile), trace: vec![vec![0.0; w]; n], repack_gain };
    let mut out = Outcome::new(name, 0, minutes);
    for t in 0..minutes {
        let resize = t % every == 0;
        if w > 0 {
            // Online: the last `w` minutes before t (a pod's first minute
            // stands in at its arrival); minutes before the pod started
            // repeat the largest sample seen so far.
            for i in 0..n {
                let Some((a, _)) = f.life[i].filter(|_| alive(f, i, t)) else { continue };
                let now = t.saturating_sub(1).max(a);
                let seen = &f.duty[i][a.max((now + 1).saturating_sub(w))..=now];
                let pad = seen.iter().copied().fold(0.0, f64::max);
                let tr = &mut pk.trace[i];
                let k = w - seen.len();
                tr[..k].fill(pad);
                tr[k..].copy_from_slice(seen);
            }
        }
        let end = if every == usize::MAX { minutes } else { (t / every + 1) * every };
        let mut to_place = Vec::new();
        let mut grown = Vec::new();
        for i in 0..n {
            match (pk.gpu_of[i], alive(f, i, t)) {
                (Some(_), false) => pk.remove(i),
                (None, true) => {
                    sl[i] = slice(i, t, end);
                    to_place.push(i);
                }
                (Some(_), true) if resize => {
                    let new = slice(i, t, end);
                    if moves == Moves::None && (new.c > sl[i].c || new.m > sl[i].m) {
                        // Shrink now, grow below once every shrink is done.
                        grown.push((i, new));
                        sl[i] = Slice { c: new.c.min(sl[i].c), m: new.m.min(sl[i].m) };
                    } else {
                        sl[i] = new;
                    }
                }
                _ => {}
            }
        }
        for (i, new) in grown {
            let Some(g) = pk.gpu_of[i] else { continue };
            let (c, m) = pk.load(g, &sl);
            sl[i] = Slice { c: new.c.min(sl[i].c + (1.0 - c).max(0.0)), m: new.m.min(sl[i].m + (gpu_mem - m).max(0.0)) };
        }
        if moves != Moves::None {
            // Pods whose GPU no longer holds its slices move elsewhere.
            for g in 0..pk.gpus.len() {
                loop {
                    if !pk.overflows(g, &sl) {
                        break;
                    }
                    let Some(&p) = pk.gpus[g].iter().max_by(|&&a, &&b| (sl[a].c + sl[a].m / gpu_mem).total_cmp(&(sl[b].c + sl[b].m / gpu_mem))) else { break };
                    pk.remove(p);
                    out.migrations += 1;
                    to_place.push(p);
                }
            }
        }
        for &p in &to_place {
            pk.put(p, &sl);
        }
        if moves == Moves::Repack && resize {
            // Pods placed this minute (arrivals, already-counted evictions)
            // are not moved twice.
            out.migrations += pk.repack(&sl).iter().filter(|p| !to_place.contains(p)).count() as u64;
        }
        out.in_use.push(pk.in_use() as u32);
        // Compute is work-conserving: a pod only loses out when its GPU's
        // total demand exceeds the whole GPU, and then only if it wants
        // more than its weighted fair part (`fair_split`).
        // Guaranteed shares never over-commit a GPU: scaled down where
        // they sum above one (only possible with a per-GPU risk check).
        let scale: Vec<f64> = (0..pk.gpus.len()).map(|g| 1.0 / pk.load(g, &sl).0.max(1.0)).collect();
        let asked = backlog.asked(f, t);
        let mut served = vec![0.0; n];
        for (g, ps) in pk.gpus.iter().enumerate() {
            fair_split(ps, |p| asked[p], |p| sl[p].c * scale[g], &mut served);
        }
        for i in 0..n {
            if !alive(f, i, t) {
                continue;
            }
            out.count(i, f.mem[i][t], sl[i].m, f.duty[i][t], asked[i], served[i]);
        }
        backlog.settle(f, t, &asked, &served);
    }
    out
}

/// What each of `pods`, sharing one GPU, gets (`served[p]`, GPU) under the
/// arbiter's weighted max-min fair split: weights are the guaranteed
/// shares, and a pod that demands no more than its part of what the others
/// leave gets all of it (work-conserving, up to the whole GPU); the pods
/// that want more split the rest by weight. Everybody gets its demand when
/// the demands fit.
pub(super) fn fair_split(pods: &[usize], demand: impl Fn(usize) -> f64, weight: impl Fn(usize) -> f64, served: &mut [f64]) {
    for &p in pods {
        served[p] = demand(p);
    }
    if pods.iter().map(|&p| demand(p)).sum::<f64>() <= 1.0 + 1e-9 {
        return;
    }
    // A pod with no guarantee still gets what is left over.
    let w = |p: usize| weight(p).max(1e-6);
    let mut fed = vec![false; pods.len()];
    let (left, wsum) = loop {
        let left = 1.0 - pods.iter().zip(&fed).filter(|x| *x.1).map(|(&p, _)| demand(p)).sum::<f64>();
        let wsum: f64 = pods.iter().zip(&fed).filter(|x| !*x.1).map(|(&p, _)| w(p)).sum();
        let mut more = false;
        for (k, &p) in pods.iter().enumerate() {
            if !fed[k] && demand(p) <= left * w(p) / wsum + 1e-9 {
                fed[k] = true;
                more = true;
            }
        }
        if !more {
            break (left, wsum);
        }
    };
    for (k, &p) in pods.iter().enumerate() {
        if !fed[k] {
            served[p] = (left * w(p) / wsum).min(demand(p));
        }
    }
}

/// Compute work waiting for a GPU: what the arbiter did not give a pod in
/// a saturated minute is delayed, not dropped (a kernel that did not run
/// runs later), so it is added to what the pod asks in the next minute,
/// and again until it is served or the pod ends. The trace's duty cycle is
/// what the pod did with a GPU of its own; sharing only delays it. With
/// carrying off, unserved work is dropped (the accounting before this).
pub(super) struct Backlog {
    waiting: Vec<f64>,
    carry: bool,
}

impl Backlog {
    pub(super) fn new(pods: usize, carry: bool) -> Backlog {
        Backlog { waiting: vec![0.0; pods], carry }
    }

    /// What each pod asks at minute `t`: its duty plus its waiting work (0
    /// for a pod not alive).
    pub(super) fn asked(&self, f: &Filled, t: usize) -> Vec<f64> {
        (0..self.waiting.len()).map(|p| if alive(f, p, t) { f.duty[p][t] + self.waiting[p] } else { 0.0 }).collect()
    }

    /// After minute `t`'s split: what each live pod asked and was not
    /// `served` waits (if carrying); a pod that is not alive has none.
    pub(super) fn settle(&mut self, f: &Filled, t: usize, asked: &[f64], served: &[f64]) {
        for (p, w) in self.waiting.iter_mut().enumerate() {
            let left = asked[p] - served[p];
            *w = if self.carry && alive(f, p, t) && compute_cut(asked[p], served[p]) { left } else { 0.0 };
        }
    }
}

/// Whether a pod that asked `demand` of a GPU and was `served` is a
/// compute violation.
pub(super) fn compute_cut(demand: f64, served: f64) -> bool {
    served < demand - 1e-9
}

/// The `q` quantile (0..=1, nearest rank) of `xs`.
pub(super) fn quantile(xs: &[f64], q: f64) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let k = ((q.clamp(0.0, 1.0) * v.len() as f64).ceil() as usize).clamp(1, v.len().max(1));
    v.get(k - 1).copied().unwrap_or(0.0)
}

fn finish(mut o: Outcome, total_duty: &[f64]) -> Outcome {
    o.summarize();
    o.gpus = o.in_use.iter().copied().max().unwrap_or(0) as usize;
    let minutes = total_duty.len().max(1) as f64;
    o.utilization = if o.gpus > 0 { total_duty.iter().sum::<f64>() / minutes / o.gpus as f64 } else { 0.0 };
    o
}

/// Evaluate the three strategies and the lower bound for one GPU size.
pub fn evaluate(u: &Usage, cfg: ElasticConfig) -> Evaluation {
    evaluate_with(u, cfg, &|_| {})
}

/// [`evaluate`], telling `note` what it is doing: each strategy as it
/// starts, and each fleet size as the search tries it (for a progress
/// line; a long trace takes minutes).
pub fn evaluate_with(u: &Usage, cfg: ElasticConfig, note: &dyn Fn(&str)) -> Evaluation {
    let f = fill(u);
    let n = f.life.len();
    let g = cfg.gpu_mem_gib;
    let total_duty: Vec<f64> = (0..u.minutes).map(|t| (0..n).filter(|&i| alive(&f, i, t)).map(|i| f.duty[i][t]).sum()).collect();
    let lb_series: Vec<f64> = (0..u.minutes)
        .map(|t| {
            let m: f64 = (0..n).filter(|&i| alive(&f, i, t)).map(|i| f.mem[i][t]).sum();
            total_duty[t].max(m / GIB / g)
        })
        .collect();
    let lb_exact = lb_series.iter().copied().fold(0.0, f64::max);

    let carry = cfg.carry_unserved;
    note(&format!("{g} GiB: exclusive and static-peak"));
    let exclusive = run_slices(&f, u.minutes, g, usize::MAX, Moves::Evict, carry, |_, _, _| Slice { c: 1.0, m: g }, "exclusive");
    let peak: Vec<Slice> = (0..n)
        .map(|i| match f.life[i] {
            Some((a, b)) => Slice { c: f.duty[i][a..=b].iter().copied().fold(0.0, f64::max), m: (f.mem[i][a..=b].iter().copied().fold(0.0, f64::max) / GIB).min(g) },
            None => Slice::default(),
        })
        .collect();
    let static_peak = run_slices(&f, u.minutes, g, usize::MAX, Moves::Evict, carry, |i, _, _| peak[i], "static-peak");
    let every = cfg.resize_every.max(1);
    let window = cfg.window.max(1);
    // A slice for minute t is decided before minute t's sample exists: it
    // sees samples up to t − 1. Only at a pod's first minute, when it has
    // none, does its own first sample stand for the request it arrives with.
    let online = |i: usize, t: usize, _end: usize| {
        let start = f.life[i].map_or(t, |(a, _)| a);
        let now = t.saturating_sub(1).max(start);
        let a = start.max(now.saturating_sub(window - 1));
        let span = &f.duty[i][start.max(now.saturating_sub(cfg.compute_window.unwrap_or(window).max(1) - 1))..=now];
        let c = match cfg.compute_quantile {
            None => span.iter().sum::<f64>() / span.len() as f64,
            Some(q) => quantile(span, q),
        };
        let m = f.mem[i][a..=now].iter().copied().fold(0.0, f64::max) / GIB;
        Slice { c: (c * (1.0 + cfg.headroom) + cfg.compute_floor).min(1.0), m: (m * (1.0 + cfg.mem_headroom.unwrap_or(cfg.headroom)) + cfg.mem_floor_gib).min(g) }
    };
    let mut online = online;
    note(&format!("{g} GiB: elastic and elastic-no-migration"));
    let elastic = run_slices_with(&f, u.minutes, g, every, cfg.moves, cfg.gpu_risk, cfg.repack_gain, carry, &mut online, "elastic");
    let pinned = run_slices(&f, u.minutes, g, every, Moves::None, carry, online, "elastic-no-migration");
    // Not a policy: it sees the coming period. Memory exactly its peak,
    // compute its mean, re-packed like (c).
    note(&format!("{g} GiB: oracle-next-period"));
    let oracle = run_slices(
        &f,
        u.minutes,
        g,
        every,
        Moves::Repack,
        carry,
        |i, t, end| {
            let b = f.life[i].map_or(t, |(_, b)| b).min(end.saturating_sub(1)).max(t);
            let span = &f.duty[i][t..=b];
            Slice { c: span.iter().sum::<f64>() / span.len() as f64, m: (f.mem[i][t..=b].iter().copied().fold(0.0, f64::max) / GIB).min(g) }
        },
        "oracle-next-period",
    );
    let lb = lb_exact.ceil() as usize;
    let exclusive = finish(exclusive, &total_duty);
    let top = exclusive.gpus.max(lb);
    let fleet_cfg = cfg.fleet.map(|fc| FleetConfig { carry_unserved: carry, ..fc });
    let (fleet_outcome, fleet_search) = fleet_cfg.map(|fc| fleet::evaluate(&f, u.minutes, g, every, lb, top, &fc, None, note)).unzip();
    // The same fleet with a placement chosen knowing the whole day.
    let hindsight = fleet_cfg.filter(|fc| fc.hindsight).map(|fc| fleet::evaluate(&f, u.minutes, g, every, lb, top, &fc, Some(fleet::Reference::Hindsight), note));
    let (hindsight_outcome, hindsight_search) = hindsight.unzip();
    // And re-placed knowing the coming minutes.
    let foresight = fleet_cfg.and_then(|fc| fc.foresight.map(|window| fleet::evaluate(&f, u.minutes, g, every, lb, top, &fc, Some(fleet::Reference::Foresight { window, shuffled: fc.foresight_shuffled.then_some(fc.foresight_draws) }), note)));
    let (foresight_outcome, foresight_search) = foresight.unzip();
    let mut outcomes: Vec<Outcome> = [exclusive, static_peak, elastic, pinned, oracle].into_iter().chain(fleet_outcome).chain(hindsight_outcome).chain(foresight_outcome).map(|o| finish(o, &total_duty)).collect();
    let base = outcomes[0].gpus as f64;
    for o in &mut outcomes {
        o.saving_vs_exclusive = if o.gpus > 0 { base / o.gpus as f64 } else { 0.0 };
    }
    Evaluation { config: cfg, pods: n, minutes: u.minutes, step_s: u.step_s, lower_bound: lb, lower_bound_exact: lb_exact, outcomes, fleet: fleet_search, hindsight: hindsight_search, foresight: foresight_search, left_out: u.left_out, absences: u.absences, lower_bound_series: lb_series }
}

#[cfg(test)]
mod tests {
    use super::fair_split;
    use proptest::prelude::*;

    proptest! {
        /// The split is the arbiter's: nobody gets more than it asks, the
        /// GPU is never over-served and never idles while somebody waits,
        /// every pod gets at least the lesser of its demand and its
        /// guarantee, and the pods that wait all stand at one level of
        /// served ÷ weight, which no fully served pod exceeds.
        #[test]
        fn fair_split_is_weighted_max_min(pods in proptest::collection::vec((0.0f64..1.0, 0.01f64..1.0), 1..8)) {
            let ids: Vec<usize> = (0..pods.len()).collect();
            let wsum: f64 = pods.iter().map(|p| p.1).sum();
            let mut served = vec![f64::NAN; pods.len()];
            fair_split(&ids, |p| pods[p].0, |p| pods[p].1 / wsum, &mut served);
            let demand: f64 = pods.iter().map(|p| p.0).sum();
            let total: f64 = served.iter().sum();
            prop_assert!((total - demand.min(1.0)).abs() < 1e-6, "{pods:?} -> {served:?}");
            let mut level = None;
            for (p, &(d, w)) in pods.iter().enumerate() {
                let g = w / wsum;
                prop_assert!(served[p] <= d + 1e-12 && served[p] >= d.min(g) - 1e-9, "{pods:?} -> {served:?}");
                if served[p] < d - 1e-9 {
                    let l = served[p] / g;
                    prop_assert!(level.is_none_or(|x: f64| (x - l).abs() < 1e-6), "{pods:?} -> {served:?}");
                    level = Some(l);
                }
            }
            if let Some(l) = level {
                for (p, &(d, w)) in pods.iter().enumerate() {
                    prop_assert!(served[p] < d - 1e-9 || d / (w / wsum) <= l + 1e-6, "{pods:?} -> {served:?}");
                }
            }
        }
    }
}
