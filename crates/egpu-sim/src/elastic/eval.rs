//! How many GPUs a set of pods needs under three sharing strategies, with
//! violation accounting, and the lower bound.
//!
//! - **Exclusive**: one whole GPU per live pod.
//! - **Static peak**: a fixed slice per pod, sized to the pod's peak duty
//!   cycle and peak memory over its whole life (an oracle: it knows the peak
//!   in advance), packed first-fit onto GPUs.
//! - **Elastic**: every `resize_every` minutes each slice is resized from
//!   the pod's last `window` minutes: memory to the highest use times
//!   `1 + headroom` plus a floor, compute share to the mean duty cycle times
//!   `1 + headroom` plus a floor. It is online: a slice decided at minute t
//!   uses samples up to t only. A pod that no longer fits its GPU after a
//!   resize moves to another (counted as a migration).
//!
//! Memory limits are hard. Compute is shared the way eGPU's arbiter shares
//! it (guaranteed share, work-conserving up to the whole GPU), so a pod
//! above its compute share is only short-changed, and counted as a
//! violation, in minutes when its GPU's total demand exceeds the GPU.
//!
//! Both slice strategies keep pods on their GPU (first-fit at arrival) and
//! count the GPUs in use at each minute; the GPUs needed is the peak. A
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
}

impl Default for ElasticConfig {
    fn default() -> Self {
        ElasticConfig { gpu_mem_gib: 80.0, resize_every: 5, window: 60, headroom: 0.15, compute_floor: 0.02, mem_floor_gib: 0.5 }
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

#[derive(Clone, Copy, Default)]
struct Slice {
    c: f64,
    m: f64,
}

/// Sticky first-fit packing of slices that may change at resize points.
fn run_slices(f: &Filled, minutes: usize, gpu_mem: f64, every: usize, mut slice: impl FnMut(usize, usize) -> Slice, name: &str) -> Outcome {
    let n = f.life.len();
    let mut gpu_of: Vec<Option<usize>> = vec![None; n];
    let mut sl = vec![Slice::default(); n];
    let mut gpus: Vec<Vec<usize>> = Vec::new();
    let load = |g: &[usize], sl: &[Slice]| g.iter().fold((0.0, 0.0), |(c, m), &p| (c + sl[p].c, m + sl[p].m));
    let fits = |g: &[usize], s: Slice, sl: &[Slice]| {
        let (c, m) = load(g, sl);
        c + s.c <= 1.0 + 1e-9 && m + s.m <= gpu_mem + 1e-3
    };
    let mut out = Outcome { strategy: name.into(), gpus: 0, utilization: 0.0, violation_minutes: 0, pod_minutes: 0, refused_mem_gib_minutes: 0.0, max_refused_gib: 0.0, migrations: 0, saving_vs_exclusive: 0.0, in_use: Vec::with_capacity(minutes) };
    for t in 0..minutes {
        let mut to_place = Vec::new();
        for i in 0..n {
            let live = alive(f, i, t);
            match (gpu_of[i], live) {
                (Some(g), false) => {
                    gpus[g].retain(|&p| p != i);
                    gpu_of[i] = None;
                }
                (None, true) => {
                    sl[i] = slice(i, t);
                    to_place.push(i);
                }
                (Some(_), true) if t % every == 0 => sl[i] = slice(i, t),
                _ => {}
            }
        }
        // Pods whose GPU no longer holds its slices move elsewhere.
        for g in gpus.iter_mut() {
            loop {
                let (c, m) = load(g, &sl);
                if c <= 1.0 + 1e-9 && m <= gpu_mem + 1e-3 {
                    break;
                }
                let Some(&p) = g.iter().max_by(|&&a, &&b| (sl[a].c + sl[a].m / gpu_mem).total_cmp(&(sl[b].c + sl[b].m / gpu_mem))) else { break };
                g.retain(|&q| q != p);
                gpu_of[p] = None;
                out.migrations += 1;
                to_place.push(p);
            }
        }
        for p in to_place {
            let g = match (0..gpus.len()).find(|&g| fits(&gpus[g], sl[p], &sl)) {
                Some(g) => g,
                None => {
                    gpus.push(Vec::new());
                    gpus.len() - 1
                }
            };
            gpus[g].push(p);
            gpu_of[p] = Some(g);
        }
        out.in_use.push(gpus.iter().filter(|g| !g.is_empty()).count() as u32);
        // Compute is work-conserving: a pod above its share only loses out
        // when its GPU's total demand exceeds the whole GPU.
        let demand: Vec<f64> = gpus.iter().map(|g| g.iter().map(|&p| f.duty[p][t]).sum()).collect();
        for i in 0..n {
            if !alive(f, i, t) {
                continue;
            }
            out.pod_minutes += 1;
            let saturated = gpu_of[i].is_some_and(|g| demand[g] > 1.0 + 1e-9);
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

    let exclusive = run_slices(&f, u.minutes, g, usize::MAX, |_, _| Slice { c: 1.0, m: g }, "exclusive");
    let peak: Vec<Slice> = (0..n)
        .map(|i| match f.life[i] {
            Some((a, b)) => Slice { c: f.duty[i][a..=b].iter().copied().fold(0.0, f64::max), m: f.mem[i][a..=b].iter().copied().fold(0.0, f64::max) / GIB },
            None => Slice::default(),
        })
        .collect();
    let static_peak = run_slices(&f, u.minutes, g, usize::MAX, |i, _| peak[i], "static-peak");
    let every = cfg.resize_every.max(1);
    let window = cfg.window.max(1);
    let elastic = run_slices(
        &f,
        u.minutes,
        g,
        every,
        |i, t| {
            let a = f.life[i].map_or(t, |(a, _)| a).max(t.saturating_sub(window - 1));
            let span = &f.duty[i][a..=t];
            let c = span.iter().sum::<f64>() / span.len() as f64;
            let m = f.mem[i][a..=t].iter().copied().fold(0.0, f64::max) / GIB;
            Slice { c: (c * (1.0 + cfg.headroom) + cfg.compute_floor).min(1.0), m: (m * (1.0 + cfg.headroom) + cfg.mem_floor_gib).min(g) }
        },
        "elastic",
    );
    let mut outcomes: Vec<Outcome> = [exclusive, static_peak, elastic].into_iter().map(|o| finish(o, &total_duty)).collect();
    let base = outcomes[0].gpus as f64;
    for o in &mut outcomes {
        o.saving_vs_exclusive = if o.gpus > 0 { base / o.gpus as f64 } else { 0.0 };
    }
    Evaluation { config: cfg, pods: n, minutes: u.minutes, lower_bound: lb_exact.ceil() as usize, lower_bound_exact: lb_exact, outcomes, lower_bound_series: lb_series }
}
