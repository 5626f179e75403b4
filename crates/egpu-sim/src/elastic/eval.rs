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
//!   of the duty cycle, likewise. It is online: a slice decided at minute t
//!   uses samples up to t only. [`Moves`] says how slices move at a resize
//!   (never, on overflow, or re-packed); every move is a migration.
//! - **Elastic, no migration** and an **oracle** that knows the coming
//!   period's peak memory and mean duty (a bound on what prediction buys).
//!
//! Memory limits are hard. Compute is shared the way eGPU's arbiter shares
//! it (guaranteed share, work-conserving up to the whole GPU), so a pod
//! above its compute share is only short-changed, and counted as a
//! violation, in minutes when its GPU's total demand exceeds the GPU.
//!
//! Slices are placed first-fit at arrival; the GPUs needed is the peak
//! over minutes of the GPUs in use. A
//! violation minute is a pod-minute whose duty cycle or memory exceeded its
//! slice; refused memory is what it used beyond its slice.

use super::load::Usage;
use serde::Serialize;

const GIB: f64 = (1u64 << 30) as f64;

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
}

impl Default for ElasticConfig {
    fn default() -> Self {
        ElasticConfig { gpu_mem_gib: 80.0, resize_every: 1, window: 5, headroom: 0.0, compute_floor: 0.0, mem_floor_gib: 0.0, moves: Moves::Repack, compute_quantile: Some(0.8), compute_window: None }
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
    pub pod_minutes: u64,
    pub refused_mem_gib_minutes: f64,
    pub max_refused_gib: f64,
    pub migrations: u64,
    pub saving_vs_exclusive: f64,
    /// GPUs in use at each minute.
    #[serde(skip)]
    pub in_use: Vec<u32>,
}

/// All strategies for one GPU size.
#[derive(Debug, Clone, Serialize)]
pub struct Evaluation {
    pub config: ElasticConfig,
    pub pods: usize,
    pub minutes: usize,
    pub lower_bound: usize,
    pub lower_bound_exact: f64,
    pub outcomes: Vec<Outcome>,
    #[serde(skip)]
    pub lower_bound_series: Vec<f64>,
}

/// Usage with gaps filled: within a pod's life a missing sample repeats the
/// last one (0 before the first); outside its life the pod is absent.
struct Filled {
    duty: Vec<Vec<f64>>,
    mem: Vec<Vec<f64>>,
    life: Vec<Option<(usize, usize)>>,
}

fn fill(u: &Usage) -> Filled {
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
                d = f64::from(u.duty[i][t]);
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

fn alive(f: &Filled, i: usize, t: usize) -> bool {
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
}

impl Packer {
    fn load(&self, g: usize, sl: &[Slice]) -> (f64, f64) {
        self.gpus[g].iter().fold((0.0, 0.0), |(c, m), &p| (c + sl[p].c, m + sl[p].m))
    }
    fn fits(&self, g: usize, s: Slice, sl: &[Slice]) -> bool {
        let (c, m) = self.load(g, sl);
        c + s.c <= 1.0 + 1e-9 && m + s.m <= self.gpu_mem + 1e-3
    }
    fn put(&mut self, p: usize, sl: &[Slice]) {
        let g = match (0..self.gpus.len()).find(|&g| self.fits(g, sl[p], sl)) {
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
            match bins.iter_mut().find(|b| b.0 + sl[p].c <= 1.0 + 1e-9 && b.1 + sl[p].m <= self.gpu_mem + 1e-3) {
                Some(b) => {
                    b.0 += sl[p].c;
                    b.1 += sl[p].m;
                    b.2.push(p);
                }
                None => bins.push((sl[p].c, sl[p].m, vec![p])),
            }
        }
        if bins.len() >= self.in_use() {
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
fn run_slices(f: &Filled, minutes: usize, gpu_mem: f64, every: usize, moves: Moves, mut slice: impl FnMut(usize, usize, usize) -> Slice, name: &str) -> Outcome {
    let n = f.life.len();
    let mut sl = vec![Slice::default(); n];
    let mut pk = Packer { gpu_mem, gpus: Vec::new(), gpu_of: vec![None; n] };
    let mut out = Outcome { strategy: name.into(), gpus: 0, utilization: 0.0, violation_minutes: 0, pod_minutes: 0, refused_mem_gib_minutes: 0.0, max_refused_gib: 0.0, migrations: 0, saving_vs_exclusive: 0.0, in_use: Vec::with_capacity(minutes) };
    for t in 0..minutes {
        let resize = t % every == 0;
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
                    let (c, m) = pk.load(g, &sl);
                    if c <= 1.0 + 1e-9 && m <= gpu_mem + 1e-3 {
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
        // Compute is work-conserving: a pod above its share only loses out
        // when its GPU's total demand exceeds the whole GPU.
        let demand: Vec<f64> = pk.gpus.iter().map(|g| g.iter().map(|&p| f.duty[p][t]).sum()).collect();
        for i in 0..n {
            if !alive(f, i, t) {
                continue;
            }
            out.pod_minutes += 1;
            let saturated = pk.gpu_of[i].is_some_and(|g| demand[g] > 1.0 + 1e-9);
            let over_c = saturated && f.duty[i][t] > sl[i].c + 1e-9;
            let over_m = f.mem[i][t] > sl[i].m * GIB + 1.0;
            if over_c || over_m {
                out.violation_minutes += 1;
            }
            if over_m {
                let r = (f.mem[i][t] - sl[i].m * GIB) / GIB;
                out.refused_mem_gib_minutes += r;
                out.max_refused_gib = out.max_refused_gib.max(r);
            }
        }
    }
    out
}

/// The `q` quantile (0..=1, nearest rank) of `xs`.
fn quantile(xs: &[f64], q: f64) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let k = ((q.clamp(0.0, 1.0) * v.len() as f64).ceil() as usize).clamp(1, v.len().max(1));
    v.get(k - 1).copied().unwrap_or(0.0)
}

fn finish(mut o: Outcome, total_duty: &[f64]) -> Outcome {
    o.gpus = o.in_use.iter().copied().max().unwrap_or(0) as usize;
    let minutes = total_duty.len().max(1) as f64;
    o.utilization = if o.gpus > 0 { total_duty.iter().sum::<f64>() / minutes / o.gpus as f64 } else { 0.0 };
    o
}

/// Evaluate the three strategies and the lower bound for one GPU size.
pub fn evaluate(u: &Usage, cfg: ElasticConfig) -> Evaluation {
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

    let exclusive = run_slices(&f, u.minutes, g, usize::MAX, Moves::Evict, |_, _, _| Slice { c: 1.0, m: g }, "exclusive");
    let peak: Vec<Slice> = (0..n)
        .map(|i| match f.life[i] {
            Some((a, b)) => Slice { c: f.duty[i][a..=b].iter().copied().fold(0.0, f64::max), m: f.mem[i][a..=b].iter().copied().fold(0.0, f64::max) / GIB },
            None => Slice::default(),
        })
        .collect();
    let static_peak = run_slices(&f, u.minutes, g, usize::MAX, Moves::Evict, |i, _, _| peak[i], "static-peak");
    let every = cfg.resize_every.max(1);
    let window = cfg.window.max(1);
    let online = |i: usize, t: usize, _end: usize| {
        let a = f.life[i].map_or(t, |(a, _)| a).max(t.saturating_sub(window - 1));
        let start = f.life[i].map_or(t, |(a, _)| a);
        let span = &f.duty[i][start.max(t.saturating_sub(cfg.compute_window.unwrap_or(window).max(1) - 1))..=t];
        let c = match cfg.compute_quantile {
            None => span.iter().sum::<f64>() / span.len() as f64,
            Some(q) => quantile(span, q),
        };
        let m = f.mem[i][a..=t].iter().copied().fold(0.0, f64::max) / GIB;
        Slice { c: (c * (1.0 + cfg.headroom) + cfg.compute_floor).min(1.0), m: (m * (1.0 + cfg.headroom) + cfg.mem_floor_gib).min(g) }
    };
    let elastic = run_slices(&f, u.minutes, g, every, cfg.moves, online, "elastic");
    let pinned = run_slices(&f, u.minutes, g, every, Moves::None, online, "elastic-no-migration");
    // Not a policy: it sees the coming period. Memory exactly its peak,
    // compute its mean, re-packed like (c).
    let oracle = run_slices(
        &f,
        u.minutes,
        g,
        every,
        Moves::Repack,
        |i, t, end| {
            let b = f.life[i].map_or(t, |(_, b)| b).min(end.saturating_sub(1)).max(t);
            let span = &f.duty[i][t..=b];
            Slice { c: span.iter().sum::<f64>() / span.len() as f64, m: f.mem[i][t..=b].iter().copied().fold(0.0, f64::max) / GIB }
        },
        "oracle-next-period",
    );
    let mut outcomes: Vec<Outcome> = [exclusive, static_peak, elastic, pinned, oracle].into_iter().map(|o| finish(o, &total_duty)).collect();
    let base = outcomes[0].gpus as f64;
    for o in &mut outcomes {
        o.saving_vs_exclusive = if o.gpus > 0 { base / o.gpus as f64 } else { 0.0 };
    }
    Evaluation { config: cfg, pods: n, minutes: u.minutes, lower_bound: lb_exact.ceil() as usize, lower_bound_exact: lb_exact, outcomes, lower_bound_series: lb_series }
}
