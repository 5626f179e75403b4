//! Placements chosen knowing the future: references for what placement
//! alone can buy, and for how far ahead a policy would have to see.

use super::{Filled, alive};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

/// What the planner sees of the usage: a trace (duty and memory) and the
/// memory each pod holds at each minute; the trace itself, or one draw of
/// its [`shuffled`] timing. Every view of one plan has the same lives.
pub(super) type View<'a> = (&'a Filled, &'a [Vec<f64>]);

/// Where every pod runs, window by window: `at[k][p]` is the GPU of pod
/// `p` during minutes `k·window .. (k+1)·window` (meaningless where the
/// pod is not alive then).
#[derive(Debug, Clone)]
pub(super) struct Plan {
    pub(super) window: usize,
    pub(super) at: Vec<Vec<usize>>,
}

impl Plan {
    /// The GPU of pod `p` at minute `t`.
    pub(super) fn gpu(&self, p: usize, t: usize) -> usize {
        self.at.get(t / self.window.max(1)).and_then(|w| w.get(p)).copied().unwrap_or(0)
    }
}

/// A move must lower the cost by more than this to take a pod off the GPU
/// it had in the window before (the cost counts GPU-minutes, so a move is
/// worth making only for a GPU-minute's gain).
const STAY: f64 = 1.0;

/// **Foresight placement** (not a policy: a reference). The trace is cut
/// into windows of `window` minutes; at the start of each, every live pod
/// gets a GPU chosen *knowing that window's usage* as the `views` show it
/// (the trace itself: exactly; draws of its [`shuffled`] timing: each
/// pod's levels), by local search on the mean over the views of the
/// GPU-minutes that cannot be served whatever the shares: each
/// minute where a GPU's summed duty exceeds it (1, plus 2 × the excess)
/// and each where its pods hold more memory than it has (2, plus a quarter
/// per GiB over). A pod holds `held[p][t]`: the larger of what it uses and
/// its base slice, which the burst pool cannot lend, so a GPU is over
/// exactly when its pool overflows. Pods new to a window are first placed in order
/// of decreasing peak memory in it on the GPU whose cost grows least (ties:
/// the lower index); pods already placed start where they were. Then, in
/// sweeps, each pod moves to the GPU, or swaps with the pod of another GPU,
/// that lowers the cost most, until a sweep changes nothing (at most 50
/// sweeps); taking a pod off the GPU it had in the window before must gain
/// more than [`STAY`] (in the mean over the views). A `window` of the
/// whole trace is the **hindsight placement**: one GPU per pod for its
/// whole life, never moved.
/// Deterministic.
pub(super) fn foresight_plan(views: &[View], minutes: usize, gpu_mem: f64, n: usize, window: usize) -> Plan {
    let n = n.max(1);
    let window = window.clamp(1, minutes.max(1));
    let life = views.first().map_or(&[][..], |v| &v.0.life[..]);
    let mut prev: Vec<Option<usize>> = vec![None; life.len()];
    let mut at = Vec::with_capacity(minutes.div_ceil(window));
    for lo in (0..minutes).step_by(window) {
        let hi = (lo + window).min(minutes);
        let now = place_window(views, (lo, hi), gpu_mem, n, &prev, true);
        for (p, g) in now.iter().enumerate() {
            if life[p].is_some_and(|(a, b)| a < hi && b >= lo) {
                prev[p] = Some(*g);
            }
        }
        at.push(now);
    }
    Plan { window, at }
}

/// The usage a [`foresight_plan`] with shuffled timing sees: each pod's
/// samples (duty, memory and held memory together) permuted at random
/// within each window of `window` minutes, so that the plan knows every
/// pod's levels in the coming window but not which minutes they fall in.
/// Seeded (a fixed seed: reproducible).
pub(super) fn shuffled(f: &Filled, held: &[Vec<f64>], window: usize, seed: u64) -> (Filled, Vec<Vec<f64>>) {
    let (mut duty, mut mem, mut kept) = (f.duty.clone(), f.mem.clone(), held.to_vec());
    let minutes = f.duty.first().map_or(0, Vec::len);
    let window = window.max(1);
    // A ChaCha8 stream, as the placement simulator's seeded shuffles use.
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for (p, life) in f.life.iter().enumerate() {
        let Some((a, b)) = *life else { continue };
        for lo in (0..minutes).step_by(window) {
            let (x, y) = (a.max(lo), b.min(lo + window - 1));
            if x > y {
                continue;
            }
            // The pod's minutes x..=y in a random order, the same for all three.
            let mut order: Vec<usize> = (x..=y).collect();
            order.shuffle(&mut rng);
            for (series, from) in [(&mut duty[p], &f.duty[p]), (&mut mem[p], &f.mem[p]), (&mut kept[p], &held[p])] {
                for (t, &s) in (x..=y).zip(&order) {
                    series[t] = from[s];
                }
            }
        }
    }
    (Filled { duty, mem, life: f.life.clone() }, kept)
}

/// One window of [`foresight_plan`]: minutes `lo..hi`, starting from
/// `prev`, as it describes; the cost is summed over the `views` (and the
/// [`STAY`] penalty counted once in each), so it is their mean. With `arrivals` false (the fleet's
/// re-planning, `FleetConfig::replan`), only the pods that `prev` places
/// are placed; the result leaves the others where `prev` has them (GPU 0
/// for none).
pub(super) fn place_window(views: &[View], (lo, hi): (usize, usize), gpu_mem: f64, n: usize, prev: &[Option<usize>], arrivals: bool) -> Vec<usize> {
    let Some(&(f, _)) = views.first() else { return prev.iter().map(|g| g.map_or(0, |g| g % n.max(1))).collect() };
    let pods = f.life.len();
    let len = hi - lo;
    let k = views.len();
    let (mut duty, mut mem) = (vec![vec![vec![0.0f64; len]; n]; k], vec![vec![vec![0.0f64; len]; n]; k]);
    // A pod's minutes inside the window, relative to `lo`.
    let span = |p: usize| f.life[p].and_then(|(a, b)| (a < hi && b >= lo).then(|| (a.max(lo) - lo, b.min(hi - 1) - lo)));
    // One per saturated GPU-minute and two per GPU-minute short of memory,
    // plus how far over it is (a quarter per GiB, two per GPU of duty), so
    // that a GPU already over is not a free place to put more.
    let over = |d: f64, m: f64| if d > 1.0 + 1e-9 { 1.0 + 2.0 * (d - 1.0) } else { 0.0 } + if m > gpu_mem + 1e-9 { 2.0 + (m - gpu_mem) / 4.0 } else { 0.0 };
    // Change in the cost of GPU `g` if pod `out` leaves it and pod `inn` joins it.
    let delta = |duty: &[Vec<Vec<f64>>], mem: &[Vec<Vec<f64>>], g: usize, out: Option<usize>, inn: Option<usize>| -> f64 {
        let (a, b) = [out, inn].into_iter().flatten().filter_map(span).fold((usize::MAX, 0), |(l, h), (a, b)| (l.min(a), h.max(b)));
        let live = |p: Option<usize>, t: usize| p.filter(|&p| alive(f, p, lo + t));
        let mut sum = 0.0;
        for (v, &(vf, held)) in views.iter().enumerate() {
            for t in a..=b {
                let (mut d, mut m) = (duty[v][g][t], mem[v][g][t]);
                let before = over(d, m);
                if let Some(p) = live(out, t) {
                    d -= vf.duty[p][lo + t];
                    m -= held[p][lo + t];
                }
                if let Some(p) = live(inn, t) {
                    d += vf.duty[p][lo + t];
                    m += held[p][lo + t];
                }
                sum += over(d, m) - before;
            }
        }
        sum
    };
    let add = |duty: &mut [Vec<Vec<f64>>], mem: &mut [Vec<Vec<f64>>], g: usize, p: usize, sign: f64| {
        if let Some((a, b)) = span(p) {
            for (v, &(vf, held)) in views.iter().enumerate() {
                for t in a..=b {
                    duty[v][g][t] += sign * vf.duty[p][lo + t];
                    mem[v][g][t] += sign * held[p][lo + t];
                }
            }
        }
    };
    // What leaving the GPU it had before costs pod `p` on GPU `g` (a
    // GPU-minute in each view).
    let stay = |p: usize, g: usize| if prev[p].is_some_and(|h| h % n != g) { STAY * k as f64 } else { 0.0 };
    let peak = |p: usize| span(p).map_or(0.0, |(a, b)| views.iter().flat_map(|(_, held)| held[p][lo + a..=lo + b].iter().copied()).fold(0.0, f64::max));
    let placed: Vec<usize> = (0..pods).filter(|&p| span(p).is_some() && (arrivals || prev[p].is_some())).collect();
    let mut at: Vec<usize> = prev.iter().map(|g| g.map_or(0, |g| g % n)).collect();
    for &p in placed.iter().filter(|&&p| prev[p].is_some()) {
        add(&mut duty, &mut mem, at[p], p, 1.0);
    }
    let mut order: Vec<usize> = placed.iter().copied().filter(|&p| prev[p].is_none()).collect();
    order.sort_by(|&a, &b| peak(b).total_cmp(&peak(a)).then(a.cmp(&b)));
    for &p in &order {
        let g = (0..n).map(|g| (delta(&duty, &mem, g, None, Some(p)), g)).min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1))).map_or(0, |x| x.1);
        add(&mut duty, &mut mem, g, p, 1.0);
        at[p] = g;
    }
    // The lowest cost change, then the lower GPU and pod.
    let best = |a: &(f64, usize, Option<usize>), b: &(f64, usize, Option<usize>)| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2));
    for _ in 0..50 {
        let mut changed = false;
        for &p in &placed {
            let s = at[p];
            let gain = -delta(&duty, &mem, s, Some(p), None) + stay(p, s);
            // The best move, then the best swap; the better of them if it lowers the cost.
            let mv = (0..n).filter(|&h| h != s).map(|h| (delta(&duty, &mem, h, None, Some(p)) + stay(p, h) - gain, h, None)).min_by(best);
            let sw = placed
                .iter()
                .copied()
                .filter(|&q| at[q] != s)
                .map(|q| {
                    let h = at[q];
                    let moved = stay(p, h) - stay(p, s) + stay(q, s) - stay(q, h);
                    (delta(&duty, &mem, s, Some(p), Some(q)) + delta(&duty, &mem, h, Some(q), Some(p)) + moved, h, Some(q))
                })
                .min_by(best);
            let Some((d, h, q)) = [mv, sw].into_iter().flatten().min_by(best) else { continue };
            if d >= -1e-9 {
                continue;
            }
            add(&mut duty, &mut mem, s, p, -1.0);
            add(&mut duty, &mut mem, h, p, 1.0);
            at[p] = h;
            if let Some(q) = q {
                add(&mut duty, &mut mem, h, q, -1.0);
                add(&mut duty, &mut mem, s, q, 1.0);
                at[q] = s;
            }
            changed = true;
        }
        if !changed {
            break;
        }
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shuffled_timing_keeps_each_pods_levels_in_each_window_and_nothing_else() {
        // Pod 0 lives minutes 3–44, pod 1 all 50, pod 2 never; every sample
        // is distinct, so where each one went can be told.
        let minutes = 50;
        let series = |p: usize| (0..minutes).map(|t| (p * 1000 + t) as f64).collect::<Vec<f64>>();
        let life = vec![Some((3, 44)), Some((0, 49)), None];
        let f = Filled { duty: (0..3).map(series).collect(), mem: (0..3).map(|p| series(p).iter().map(|x| x * 2.0).collect()).collect(), life: life.clone() };
        let held: Vec<Vec<f64>> = (0..3).map(|p| series(p).iter().map(|x| x * 3.0).collect()).collect();
        let (g, h) = shuffled(&f, &held, 20, 1);
        assert_eq!(g.life, life);
        for p in 0..3 {
            for (t, &d) in g.duty[p].iter().enumerate() {
                // Duty, memory and held memory move together.
                assert_eq!((g.mem[p][t], h[p][t]), (2.0 * d, 3.0 * d), "pod {p} minute {t}");
            }
            for lo in (0..minutes).step_by(20) {
                let hi = (lo + 20).min(minutes);
                let (mut was, mut now) = (f.duty[p][lo..hi].to_vec(), g.duty[p][lo..hi].to_vec());
                was.sort_by(f64::total_cmp);
                now.sort_by(f64::total_cmp);
                assert_eq!(was, now, "pod {p}, window {lo}: the same samples");
            }
            // Outside its life a pod's minutes stay as they were.
            if let Some((a, b)) = life[p] {
                assert!((0..a).chain(b + 1..minutes).all(|t| g.duty[p][t] == f.duty[p][t]), "pod {p}");
            }
        }
        assert_ne!(g.duty[1], f.duty[1], "the order changed");
        assert_eq!(shuffled(&f, &held, 20, 1).0.duty, g.duty, "seeded");
        assert_ne!(shuffled(&f, &held, 20, 2).0.duty, g.duty, "another seed, another order");
    }
}
