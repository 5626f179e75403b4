//! **Elastic fleet**: a fixed number of GPUs, with the capacity the pods'
//! base slices leave free handed out to them as headroom.
//!
//! The window-peak strategy of [`super::eval`] needs as many GPUs as its
//! busiest minute, and every pod carries its own memory margin at all
//! times. An operator's cluster instead has a fixed number N of GPUs, and
//! whatever the base slices leave free on a GPU is idle anyway: here it
//! becomes headroom, shared by the pods of that GPU.
//!
//! At every resize point (each `resize_every` minutes), decided only from
//! samples up to t − 1 (a pod's first minute uses its first sample as its
//! arrival request, as everywhere else):
//!
//! 1. each live pod gets a **base slice**: memory = peak of its last
//!    [`FleetConfig::mem_window`] minutes × (1 + headroom) + floor (so never
//!    below its last sample), compute = a quantile of its last
//!    [`FleetConfig::compute_window`] minutes of duty;
//! 2. base slices are **packed into the N GPUs**: a pod stays where it is
//!    while its GPU holds the base slices; a GPU that no longer does sheds
//!    the smallest pod whose departure makes it fit (else its largest, and
//!    again), and shed pods and arrivals go to the GPU with the most room
//!    left (balanced, so that every GPU keeps some spare). Optionally, up
//!    to [`FleetConfig::rebalance`] pods a resize move from the GPU with the
//!    least spare memory to the one with the most while its spare is below
//!    [`FleetConfig::min_spare_gib`]. Optionally, every
//!    [`FleetConfig::replan`] minutes the pods are re-placed by the
//!    foresight planner (`foresight`) fed their last
//!    [`FleetConfig::replan_lookback`] minutes, as if the coming minutes
//!    would repeat them (a pod whose base slice does not fit the GPU the
//!    plan gives it goes back where it was, or where there is the most
//!    room). Every move of a placed pod is a migration;
//! 3. compute shares: with [`Share::Even`] (the default) every pod of a
//!    GPU gets the same share, so a saturated GPU is split max-min fairly
//!    and only pods above the common level are cut; otherwise the compute
//!    (and, without the burst pool, the memory) each GPU has left after
//!    its base slices is **handed out** to its pods on top of their bases:
//!    equally, in proportion to the base, to the pod's recent volatility
//!    (largest one-minute memory rise, largest duty above its base share)
//!    or to its recent reach. The limits on a GPU sum to exactly its
//!    capacity, never more.
//!
//! A GPU whose base slices do not fit (no GPU had room) has its limits
//! scaled down to its capacity; the pods stay and their misses count.
//! Violations are counted against the final limits exactly as for the
//! other strategies. [`search_fleet`] finds the smallest N whose violation
//! pod-minutes are within a budget.
//!
//! The parts: `config` (the policy's settings and what a run reports),
//! `foresight` (placements chosen knowing the coming minutes or the whole
//! trace: references, not policies; and the planner the re-planning uses);
//! the run and the search are here.

use super::eval::{Backlog, Filled, GIB, Outcome, alive, compute_cut, fair_split, quantile, refused_gib};

mod config;
mod foresight;

pub use config::{FleetConfig, FleetRun, FleetSearch, Share};
use foresight::{Plan, View, foresight_plan, place_window, shuffled};

#[derive(Clone, Copy, Default)]
struct Slice {
    c: f64,
    m: f64,
}

/// Base slice and volatility weights of pod `i` for minute `t`, from
/// samples up to t − 1 (its first sample at its first minute).
fn size(f: &Filled, cfg: &FleetConfig, gpu_mem: f64, i: usize, t: usize) -> (Slice, Slice) {
    let start = f.life[i].map_or(t, |(a, _)| a);
    let now = t.saturating_sub(1).max(start);
    let from = |w: usize| start.max((now + 1).saturating_sub(w.max(1)));
    let m = f.mem[i][from(cfg.mem_window)..=now].iter().copied().fold(0.0, f64::max) / GIB;
    let span = &f.duty[i][from(cfg.compute_window)..=now];
    let c = quantile(span, cfg.compute_quantile).min(1.0);
    let base = Slice { c, m: (m * (1.0 + cfg.mem_headroom) + cfg.mem_floor_gib).min(gpu_mem) };
    let v0 = from(cfg.vol_window);
    let rise = (v0 + 1..=now).map(|s| f.mem[i][s] - f.mem[i][s - 1]).fold(0.0, f64::max) / GIB;
    let burst = f.duty[i][v0..=now].iter().map(|d| d - c).fold(0.0, f64::max);
    let weight = match cfg.share {
        Share::Equal | Share::Even => Slice { c: 1.0, m: 1.0 },
        // A small constant so that empty slices still get something.
        Share::Base => Slice { c: base.c + 0.01, m: base.m + 0.25 },
        Share::Volatility => Slice { c: burst + 0.01, m: rise + 0.25 },
        Share::Reach => {
            let pm = f.mem[i][v0..=now].iter().copied().fold(0.0, f64::max) / GIB;
            let pc = f.duty[i][v0..=now].iter().copied().fold(0.0, f64::max);
            Slice { c: (pc - base.c).max(0.0), m: (pm - base.m).max(0.0) }
        }
    };
    (base, weight)
}

struct Fleet {
    gpu_mem: f64,
    gpus: Vec<Vec<usize>>,
    gpu_of: Vec<Option<usize>>,
}

impl Fleet {
    fn load(&self, g: usize, base: &[Slice]) -> Slice {
        self.gpus[g].iter().fold(Slice::default(), |s, &p| Slice { c: s.c + base[p].c, m: s.m + base[p].m })
    }
    fn holds(&self, l: Slice) -> bool {
        l.m <= self.gpu_mem + 1e-9 && l.c <= 1.0 + 1e-9
    }
    /// Room left after adding `s` (normalised; negative if it does not fit).
    fn room(&self, l: Slice, s: Slice) -> f64 {
        ((self.gpu_mem - l.m - s.m) / self.gpu_mem).min(1.0 - l.c - s.c)
    }
    /// GPU `g` holds pod `p`'s base slice beside those it has.
    fn fits(&self, g: usize, base: &[Slice], p: usize) -> bool {
        self.room(self.load(g, base), base[p]) >= -1e-9
    }
    fn size(&self, s: Slice) -> f64 {
        (s.m / self.gpu_mem).max(s.c)
    }
    fn remove(&mut self, p: usize) {
        if let Some(g) = self.gpu_of[p].take() {
            self.gpus[g].retain(|&q| q != p);
        }
    }
    /// The GPU with the most room left after taking `p`, less the compute
    /// risk it would then carry (`risk(g)`: saturated fraction of the risk
    /// window with `p` added, times the risk weight). A GPU that holds `p`'s
    /// base slice wins over one that does not.
    fn best(&self, p: usize, base: &[Slice], risk: &dyn Fn(usize) -> f64) -> usize {
        let mut best = (false, f64::NEG_INFINITY, 0);
        for g in 0..self.gpus.len() {
            let r = self.room(self.load(g, base), base[p]);
            let key = (r >= -1e-9, r - risk(g));
            if (key.0 && !best.0) || (key.0 == best.0 && key.1 > best.1 + 1e-12) {
                best = (key.0, key.1, g);
            }
        }
        best.2
    }
}

/// Summed duty of `pods` (and `extra`) over minutes `t − w .. t`, and the
/// number of those minutes above one GPU. Only past samples are used.
fn saturated(f: &Filled, pods: &[usize], extra: Option<usize>, without: Option<usize>, t: usize, w: usize) -> u32 {
    let from = t.saturating_sub(w);
    (from..t).filter(|&s| pods.iter().copied().chain(extra).filter(|&p| Some(p) != without).map(|p| f.duty[p][s]).sum::<f64>() > 1.0 + 1e-9).count() as u32
}

/// Hand out `cap − Σ base` to the pods in proportion to `w`; scale the
/// bases down to `cap` when they exceed it.
fn hand_out(pods: &[usize], base: impl Fn(usize) -> f64, w: impl Fn(usize) -> f64, cap: f64, reach: bool, out: &mut dyn FnMut(usize, f64)) {
    let sum: f64 = pods.iter().map(|&p| base(p)).sum();
    if sum > cap {
        for &p in pods {
            out(p, base(p) * cap / sum);
        }
        return;
    }
    let spare = cap - sum;
    if reach {
        // Water-fill the needs `w` up to a common level λ, then the rest equally.
        let need_sum: f64 = pods.iter().map(|&p| w(p)).sum();
        let level = if need_sum <= spare {
            f64::INFINITY
        } else {
            let mut needs: Vec<f64> = pods.iter().map(|&p| w(p)).collect();
            needs.sort_by(f64::total_cmp);
            let (mut left, mut level) = (spare, 0.0);
            for (k, &d) in needs.iter().enumerate() {
                let rest = (needs.len() - k) as f64;
                if d * rest >= left {
                    level = left / rest;
                    break;
                }
                left -= d;
            }
            level
        };
        let given: f64 = pods.iter().map(|&p| w(p).min(level)).sum();
        let extra = (spare - given).max(0.0) / pods.len().max(1) as f64;
        for &p in pods {
            out(p, base(p) + w(p).min(level) + extra);
        }
        return;
    }
    let wsum: f64 = pods.iter().map(|&p| w(p)).sum();
    for &p in pods {
        let extra = if wsum > 0.0 { spare * w(p) / wsum } else { spare / pods.len() as f64 };
        out(p, base(p) + extra);
    }
}

/// Run the fixed fleet of `n` GPUs over the whole trace.
pub(super) fn run(f: &Filled, minutes: usize, gpu_mem: f64, every: usize, n: usize, cfg: &FleetConfig) -> FleetRun {
    run_placed(f, minutes, gpu_mem, every, n, cfg, None)
}

/// [`run`], or with `fixed` the same fleet where every pod runs where the
/// plan puts it, moved only at the start of the plan's windows (bases,
/// pools and shares as in [`run`]).
// `i` indexes the usage, the slices and the fleet together.
#[allow(clippy::needless_range_loop)]
fn run_placed(f: &Filled, minutes: usize, gpu_mem: f64, every: usize, n: usize, cfg: &FleetConfig, fixed: Option<&Plan>) -> FleetRun {
    let pods = f.life.len();
    let n = n.max(1);
    let every = every.max(1);
    let mut fl = Fleet { gpu_mem, gpus: vec![Vec::new(); n], gpu_of: vec![None; pods] };
    let (mut base, mut weight, mut limit) = (vec![Slice::default(); pods], vec![Slice::default(); pods], vec![Slice::default(); pods]);
    let mut out = Outcome::new("elastic-fleet", n, minutes);
    let mut backlog = Backlog::new(pods, cfg.carry_unserved);
    let mut held_cache: Option<Vec<Vec<f64>>> = None;
    let mut run = FleetRun {
        outcome: Outcome::new("elastic-fleet", n, 0),
        max_gpu_mem_limits_gib: 0.0,
        max_gpu_shares: 0.0,
        overflow_minutes: 0,
        saturated_gpu_minutes: 0,
        floor_pod_minutes: 0,
        first_come_violation_minutes: (cfg.burst && !cfg.first_come).then_some(0),
    };
    for t in 0..minutes {
        let resize = t % every == 0;
        let mut to_place: Vec<(usize, Option<usize>)> = Vec::new();
        for i in 0..pods {
            match (fl.gpu_of[i], alive(f, i, t)) {
                (Some(_), false) => fl.remove(i),
                (None, true) => {
                    (base[i], weight[i]) = size(f, cfg, gpu_mem, i, t);
                    to_place.push((i, None));
                }
                (Some(_), true) if resize => (base[i], weight[i]) = size(f, cfg, gpu_mem, i, t),
                _ => {}
            }
        }
        if let Some(plan) = fixed {
            // At the start of each of the plan's windows, pods go where it
            // says (a move is a migration); arrivals go there at once.
            if t % plan.window.max(1) == 0 {
                for p in 0..pods {
                    if let Some(g) = fl.gpu_of[p].filter(|&g| g != plan.gpu(p, t) % n) {
                        fl.remove(p);
                        to_place.push((p, Some(g)));
                    }
                }
            }
            for &(p, from) in &to_place {
                let g = plan.gpu(p, t) % n;
                if from.is_some_and(|h| h != g) {
                    out.migrations += 1;
                }
                fl.gpus[g].push(p);
                fl.gpu_of[p] = Some(g);
            }
            to_place.clear();
        }
        // A GPU that no longer holds its base slices sheds pods: the
        // smallest one whose departure is enough, else its largest.
        for g in (0..n).filter(|_| fixed.is_none()) {
            loop {
                let l = fl.load(g, &base);
                if fl.holds(l) || fl.gpus[g].len() <= 1 {
                    break;
                }
                let mut by_size = fl.gpus[g].clone();
                by_size.sort_by(|&a, &b| fl.size(base[a]).total_cmp(&fl.size(base[b])).then(a.cmp(&b)));
                let enough = by_size.iter().copied().find(|&p| fl.holds(Slice { c: l.c - base[p].c, m: l.m - base[p].m }));
                let Some(p) = enough.or(by_size.last().copied()) else { break };
                fl.remove(p);
                to_place.push((p, Some(g)));
            }
        }
        to_place.sort_by(|a, b| fl.size(base[b.0]).total_cmp(&fl.size(base[a.0])).then(a.0.cmp(&b.0)));
        for &(p, from) in &to_place {
            // Shed pods that fit nowhere go back where they were (no move).
            let rw = cfg.risk_window;
            let risk = |g: usize| if rw == 0 { 0.0 } else { cfg.risk_weight * f64::from(saturated(f, &fl.gpus[g], Some(p), None, t, rw)) / rw as f64 };
            let g = fl.best(p, &base, &risk);
            let g = match from {
                Some(h) if !fl.fits(g, &base, p) => h,
                _ => g,
            };
            if from.is_some_and(|h| h != g) {
                out.migrations += 1;
            }
            fl.gpus[g].push(p);
            fl.gpu_of[p] = Some(g);
        }
        if resize && cfg.risk_window > 0 && fixed.is_none() {
            let rw = cfg.risk_window;
            for _ in 0..cfg.risk_moves {
                let risks: Vec<u32> = (0..n).map(|g| saturated(f, &fl.gpus[g], None, None, t, rw)).collect();
                let Some(worst) = (0..n).max_by_key(|&g| (risks[g], std::cmp::Reverse(g))) else { break };
                if risks[worst] == 0 {
                    break;
                }
                // The move off the riskiest GPU that lowers the summed risk most.
                let mut pick: Option<(i64, usize, usize)> = None;
                for &p in &fl.gpus[worst] {
                    let left = i64::from(saturated(f, &fl.gpus[worst], None, Some(p), t, rw));
                    for h in (0..n).filter(|&h| h != worst) {
                        // Never at the cost of memory balance: the target
                        // keeps at least the room the source had.
                        if fl.room(fl.load(h, &base), base[p]) < fl.room(fl.load(worst, &base), Slice::default()).max(0.0) {
                            continue;
                        }
                        let delta = left + i64::from(saturated(f, &fl.gpus[h], Some(p), None, t, rw)) - i64::from(risks[worst]) - i64::from(risks[h]);
                        if delta < 0 && pick.is_none_or(|(d, _, _)| delta < d) {
                            pick = Some((delta, p, h));
                        }
                    }
                }
                let Some((_, p, h)) = pick else { break };
                fl.remove(p);
                fl.gpus[h].push(p);
                fl.gpu_of[p] = Some(h);
                out.migrations += 1;
            }
        }
        if resize && fixed.is_none() {
            for _ in 0..cfg.rebalance {
                let spare = |fl: &Fleet, g: usize| gpu_mem - fl.load(g, &base).m;
                let lo = (0..n).min_by(|&a, &b| spare(&fl, a).total_cmp(&spare(&fl, b))).unwrap_or(0);
                let hi = (0..n).max_by(|&a, &b| spare(&fl, a).total_cmp(&spare(&fl, b)).then(b.cmp(&a))).unwrap_or(0);
                let (s_lo, s_hi) = (spare(&fl, lo), spare(&fl, hi));
                if s_lo >= cfg.min_spare_gib || lo == hi {
                    break;
                }
                // The pod whose move best raises the smaller of the two spares.
                let hi_c = fl.load(hi, &base).c;
                let cand = fl.gpus[lo].iter().copied().filter(|&p| hi_c + base[p].c <= 1.0 + 1e-9).map(|p| (p, (s_lo + base[p].m).min(s_hi - base[p].m))).max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0)));
                match cand {
                    Some((p, after)) if after > s_lo + 1e-9 => {
                        fl.remove(p);
                        fl.gpus[hi].push(p);
                        fl.gpu_of[p] = Some(hi);
                        out.migrations += 1;
                    }
                    _ => break,
                }
            }
        }
        if cfg.replan > 0 && fixed.is_none() && t > 0 && t % cfg.replan == 0 {
            // Re-plan on the last minutes: the foresight placement, fed the
            // past instead of the future (samples up to t − 1 only).
            let held = held_cache.get_or_insert_with(|| held(f, cfg, gpu_mem));
            let at = place_window(&[(f, held)], (t.saturating_sub(cfg.replan_lookback.max(1)), t), gpu_mem, n, &fl.gpu_of, false);
            // Every pod that moves leaves first (a swap frees the room it
            // needs), then each goes where the plan says if its base slice
            // fits there, else back where it was if it fits there, else to
            // the GPU with the most room.
            let movers: Vec<(usize, usize)> = (0..pods).filter_map(|p| fl.gpu_of[p].filter(|&g| g != at[p]).map(|g| (p, g))).collect();
            for &(p, _) in &movers {
                fl.remove(p);
            }
            for &(p, from) in &movers {
                let g = if fl.fits(at[p], &base, p) { at[p] } else if fl.fits(from, &base, p) { from } else { fl.best(p, &base, &|_| 0.0) };
                out.migrations += u64::from(g != from);
                fl.gpus[g].push(p);
                fl.gpu_of[p] = Some(g);
            }
        }
        // Limits: base plus a share of what the GPU has left.
        for g in 0..n {
            let ps = &fl.gpus[g];
            let l = fl.load(g, &base);
            if !fl.holds(l) {
                run.overflow_minutes += ps.len() as u64;
            }
            let reach = cfg.share == Share::Reach;
            hand_out(ps, |p| base[p].m, |p| weight[p].m, gpu_mem, reach, &mut |p, v| limit[p].m = v);
            if cfg.share == Share::Even {
                for &p in ps {
                    limit[p].c = 1.0 / ps.len() as f64;
                }
            } else {
                hand_out(ps, |p| base[p].c, |p| weight[p].c, 1.0, reach, &mut |p, v| limit[p].c = v);
            }
            let (sm, sc) = ps.iter().fold((0.0, 0.0), |(m, c), &p| (m + limit[p].m, c + limit[p].c));
            if !cfg.burst {
                run.max_gpu_mem_limits_gib = run.max_gpu_mem_limits_gib.max(sm);
            }
            run.max_gpu_shares = run.max_gpu_shares.max(sc);
        }
        out.in_use.push(n as u32);
        let demand: Vec<f64> = fl.gpus.iter().map(|g| g.iter().map(|&p| f.duty[p][t]).sum()).collect();
        run.saturated_gpu_minutes += demand.iter().filter(|&&d| d > 1.0 + 1e-9).count() as u64;
        let asked = backlog.asked(f, t);
        let mut served = vec![0.0; pods];
        for ps in &fl.gpus {
            fair_split(ps, |p| asked[p], |p| limit[p].c, &mut served);
        }
        // Burst pool: a GPU's pods borrow above their base from what the
        // base slices leave; when the borrows exceed it, every borrower of
        // that minute counts as refused (which of them asked last is not in
        // a one-minute sample), its share of the excess as refused memory;
        // or, with `first_come`, the borrowers take what is left in a
        // seeded random order and those that fall short are refused.
        let mut refused = vec![0.0f64; pods];
        let mut refused_fc = vec![0.0f64; pods];
        if cfg.burst {
            for g in 0..n {
                let ps = &fl.gpus[g];
                // Base slices that do not fit are scaled down to the GPU, as above.
                let sum: f64 = ps.iter().map(|&p| base[p].m).sum();
                let guar = |p: usize| if sum > gpu_mem { base[p].m * gpu_mem / sum } else { base[p].m };
                let pool = (gpu_mem - sum).max(0.0);
                let borrow = |p: usize| (f.mem[p][t] / GIB - guar(p)).max(0.0);
                let borrowed: f64 = ps.iter().map(|&p| borrow(p)).sum();
                let over = borrowed - pool;
                let mut sm = 0.0;
                if over > 1e-9 && cfg.first_come {
                    for &p in ps {
                        limit[p].m = guar(p);
                    }
                    first_come(ps, &borrow, pool, t, g, &mut |p, got, short| {
                        limit[p].m += got;
                        refused[p] = short;
                    });
                    sm = ps.iter().map(|&p| limit[p].m).sum();
                } else {
                    if over > 1e-9 {
                        // The estimate beside the bound (FleetRun::first_come_violation_minutes).
                        first_come(ps, &borrow, pool, t, g, &mut |p, _, short| refused_fc[p] = short);
                    }
                    for &p in ps {
                        let b = borrow(p);
                        limit[p].m = guar(p) + if over > 1e-9 { b * pool / borrowed } else { b };
                        sm += limit[p].m;
                        if over > 1e-9 && b > 0.0 {
                            refused[p] = over * b / borrowed;
                        }
                    }
                }
                run.max_gpu_mem_limits_gib = run.max_gpu_mem_limits_gib.max(sm);
            }
        } else {
            // Fixed per-pod limits: usage over the limit is refused.
            for ps in &fl.gpus {
                for &p in ps {
                    refused[p] = refused_gib(f.mem[p][t], limit[p].m);
                }
            }
        }
        // Whatever the compute split, each saturated GPU-minute cuts at
        // least one of its pods, which may be one already refused memory.
        for (g, ps) in fl.gpus.iter().enumerate() {
            let mem_short = ps.iter().filter(|&&p| refused[p] > 0.0).count() as u64;
            run.floor_pod_minutes += mem_short.max(u64::from(demand[g] > 1.0 + 1e-9));
        }
        for i in 0..pods {
            if alive(f, i, t) {
                out.count_refused(i, refused[i], f.duty[i][t], asked[i], served[i]);
                if let Some(v) = run.first_come_violation_minutes.as_mut() {
                    *v += u64::from(refused_fc[i] > 0.0 || compute_cut(asked[i], served[i]));
                }
            }
        }
        backlog.settle(f, t, &asked, &served);
    }
    out.summarize();
    run.outcome = out;
    run
}

/// An overflowing burst pool served first come, first served in a seeded
/// random order ([`mix`] of the minute `t`, the GPU `g` and the pod): each
/// borrower gets what is left of `pool`, up to its `borrow`, and
/// `out(pod, got, refused)` is called for every borrower, `refused` 0 for
/// those that fit.
fn first_come(ps: &[usize], borrow: &dyn Fn(usize) -> f64, pool: f64, t: usize, g: usize, out: &mut dyn FnMut(usize, f64, f64)) {
    let mut order: Vec<usize> = ps.iter().copied().filter(|&p| borrow(p) > 0.0).collect();
    order.sort_by_key(|&p| (mix(t as u64, g as u64, p as u64), p));
    let mut left = pool;
    for p in order {
        let b = borrow(p);
        let got = b.min(left);
        left -= got;
        out(p, got, if b - got > 1e-9 { b - got } else { 0.0 });
    }
}

/// A fixed pseudo-random order key for pod `p` on GPU `g` at minute `t`
/// (splitmix64 of the three), so first-come refusals are reproducible.
fn mix(t: u64, g: u64, p: u64) -> u64 {
    let mut z = t.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ g.wrapping_mul(0xbf58_476d_1ce4_e5b9) ^ p.wrapping_mul(0x94d0_49bb_1331_11eb);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The memory each pod holds on its GPU at each minute, GiB: the larger of
/// what it uses and its base slice (a guarantee no other pod may borrow),
/// so a GPU's pods overflow it exactly when their burst pool does.
fn held(f: &Filled, cfg: &FleetConfig, gpu_mem: f64) -> Vec<Vec<f64>> {
    let minutes = f.mem.first().map_or(0, Vec::len);
    (0..f.life.len()).map(|p| (0..minutes).map(|t| if alive(f, p, t) { (f.mem[p][t] / GIB).max(size(f, cfg, gpu_mem, p, t).0.m) } else { 0.0 }).collect()).collect()
}

/// A placement chosen knowing the future (a reference, not a policy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reference {
    /// One GPU per pod for its whole life, chosen knowing the whole trace.
    Hindsight,
    /// Re-placed every this many minutes knowing the next this many
    /// exactly (`shuffled` None), or knowing each pod's levels in them but
    /// not which minutes they fall in (`Some(draws)`: planned against that
    /// many draws of [`shuffled`] timing at once).
    Foresight { window: usize, shuffled: Option<usize> },
}

impl Reference {
    fn name(self) -> &'static str {
        match self {
            Reference::Hindsight => "fleet-hindsight-static",
            Reference::Foresight { shuffled: None, .. } => "fleet-foresight",
            Reference::Foresight { shuffled: Some(_), .. } => "fleet-foresight-shuffled",
        }
    }
}

/// The seed of the first draw of [`shuffled`] timing (draw k: this + k).
const SHUFFLE_SEED: u64 = 0x5eed;

/// The fleet of `n` GPUs with pods placed by [`foresight_plan`] as
/// `reference` says, and that plan.
fn run_planned(f: &Filled, minutes: usize, gpu_mem: f64, every: usize, n: usize, cfg: &FleetConfig, reference: Reference) -> (FleetRun, Plan) {
    let held = held(f, cfg, gpu_mem);
    let plan = match reference {
        Reference::Hindsight => foresight_plan(&[(f, &held)], minutes, gpu_mem, n, minutes),
        Reference::Foresight { window, shuffled: None } => foresight_plan(&[(f, &held)], minutes, gpu_mem, n, window),
        Reference::Foresight { window, shuffled: Some(draws) } => {
            let drawn: Vec<(Filled, Vec<Vec<f64>>)> = (0..draws.max(1) as u64).map(|k| shuffled(f, &held, window, SHUFFLE_SEED + k)).collect();
            let views: Vec<View> = drawn.iter().map(|(g, h)| (g, &h[..])).collect();
            foresight_plan(&views, minutes, gpu_mem, n, window)
        }
    };
    let mut r = run_placed(f, minutes, gpu_mem, every, n, cfg, Some(&plan));
    r.outcome.strategy = reference.name().into();
    (r, plan)
}

/// The smallest fleet in `from..=to` whose violation pod-minutes are at
/// most `cfg.budget` of all pod-minutes (every size is tried in order, so
/// the answer is the smallest even where violations are not monotone in
/// N); `to` if none is. Returns that size's run and the sizes tried.
pub(super) fn search(f: &Filled, minutes: usize, gpu_mem: f64, every: usize, from: usize, to: usize, cfg: &FleetConfig) -> (FleetRun, FleetSearch) {
    search_with(from, to, cfg, &|_, _| {}, |n| run(f, minutes, gpu_mem, every, n, cfg))
}

/// The fleet at `cfg.gpus` GPUs, or the smallest in `from..=to` within
/// budget, as [`search`] finds it, telling `note` each size as it tries
/// it; with a `reference` the same fleet placed by [`run_planned`]
/// instead (not a policy).
#[allow(clippy::too_many_arguments)]
pub(super) fn evaluate(f: &Filled, minutes: usize, gpu_mem: f64, every: usize, from: usize, to: usize, cfg: &FleetConfig, reference: Option<Reference>, note: &dyn Fn(&str)) -> (Outcome, FleetSearch) {
    let (from, to) = cfg.gpus.map_or((from, to), |n| (n, n));
    let name = reference.map_or("elastic-fleet", Reference::name);
    let (r, s) = search_with(from, to, cfg, &|n, last| note(&format!("{name}: {n} GPUs of {gpu_mem} GiB{last}")), |n| match reference {
        Some(r) => run_planned(f, minutes, gpu_mem, every, n, cfg, r).0,
        None => run(f, minutes, gpu_mem, every, n, cfg),
    });
    (r.outcome, s)
}

/// Try each size from `from` up; `note(n, what the last size gave)` is
/// told each size before its run.
fn search_with(from: usize, to: usize, cfg: &FleetConfig, note: &dyn Fn(usize, &str), run: impl Fn(usize) -> FleetRun) -> (FleetRun, FleetSearch) {
    let (mut tried, mut floors, mut first_come_tried, mut first_come_gpus) = (Vec::new(), Vec::new(), Vec::new(), None);
    let to = to.max(from.max(1));
    for n in from.max(1)..=to {
        note(n, &tried.last().map_or(String::new(), |&(m, v): &(usize, f64)| format!(" ({m}: {:.3}% violations, budget {:.3}%)", 100.0 * v, 100.0 * cfg.budget)));
        let r = run(n);
        let pod_minutes = r.outcome.pod_minutes.max(1) as f64;
        let frac = r.outcome.violation_minutes as f64 / pod_minutes;
        tried.push((n, frac));
        floors.push(r.floor_pod_minutes as f64 / pod_minutes);
        if let Some(v) = r.first_come_violation_minutes {
            let fc = v as f64 / pod_minutes;
            first_come_tried.push(fc);
            if fc <= cfg.budget && first_come_gpus.is_none() {
                first_come_gpus = Some(n);
            }
        }
        if frac <= cfg.budget || n == to {
            let (overflow_pod_minutes, saturated_gpu_minutes, floor_pod_minutes) = (r.overflow_minutes, r.saturated_gpu_minutes, r.floor_pod_minutes);
            return (r, FleetSearch { gpus: n, overflow_pod_minutes, saturated_gpu_minutes, floor_pod_minutes, met: frac <= cfg.budget, tried, floors, first_come_tried, first_come_gpus });
        }
    }
    unreachable!("the loop returns at n == to")
}

/// The fleet (`run`) on a usage trace: a fleet of `n` GPUs of `gpu_mem_gib`, resized
/// every `every` minutes.
pub fn run_fleet(u: &super::Usage, gpu_mem_gib: f64, every: usize, n: usize, cfg: &FleetConfig) -> FleetRun {
    run(&super::eval::fill(u), u.minutes, gpu_mem_gib, every, n, cfg)
}

/// [`run_fleet`] with every pod held where the hindsight placement puts
/// it (never moved), and that placement.
pub fn run_fleet_hindsight(u: &super::Usage, gpu_mem_gib: f64, every: usize, n: usize, cfg: &FleetConfig) -> (FleetRun, Vec<usize>) {
    let (r, mut plan) = run_planned(&super::eval::fill(u), u.minutes, gpu_mem_gib, every, n, cfg, Reference::Hindsight);
    (r, plan.at.pop().unwrap_or_default())
}

/// [`run_fleet`] with pods placed every `window` minutes knowing the next
/// `window` minutes of usage (with `shuffled` = Some(draws), each pod's
/// levels in them but not their timing, planned against that many draws),
/// and the placement of each window (`[k][p]`: pod `p`'s GPU in minutes
/// `k·window ..`).
pub fn run_fleet_foresight(u: &super::Usage, gpu_mem_gib: f64, every: usize, n: usize, cfg: &FleetConfig, window: usize, shuffled: Option<usize>) -> (FleetRun, Vec<Vec<usize>>) {
    let (r, plan) = run_planned(&super::eval::fill(u), u.minutes, gpu_mem_gib, every, n, cfg, Reference::Foresight { window, shuffled });
    (r, plan.at)
}

/// [`search_fleet`] on a usage trace, over fleets of `from..=to` GPUs.
pub fn search_fleet(u: &super::Usage, gpu_mem_gib: f64, every: usize, from: usize, to: usize, cfg: &FleetConfig) -> (FleetRun, FleetSearch) {
    search(&super::eval::fill(u), u.minutes, gpu_mem_gib, every, from, to, cfg)
}
