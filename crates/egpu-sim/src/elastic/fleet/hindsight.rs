//! The hindsight placement: a reference for what placement alone can buy.

use super::{Filled, GIB, alive};

/// **Hindsight placement** (not a policy: a reference for what placement
/// alone can buy): one GPU per pod for the whole trace, chosen *knowing the
/// whole trace*, by local search on the GPU-minutes that cannot be served
/// whatever the shares: minutes where a GPU's summed duty exceeds it, plus
/// twice the minutes where its summed memory use does. Pods are first
/// placed in order of decreasing peak memory on the GPU whose cost grows
/// least (ties: the lower index); then, in sweeps, each pod moves to the
/// GPU, or swaps with the pod of another GPU, that lowers the cost most,
/// until a sweep changes nothing (at most 50 sweeps). Deterministic.
pub(super) fn hindsight_placement(f: &Filled, minutes: usize, gpu_mem: f64, n: usize) -> Vec<usize> {
    let n = n.max(1);
    let pods = f.life.len();
    let (mut duty, mut mem) = (vec![vec![0.0f64; minutes]; n], vec![vec![0.0f64; minutes]; n]);
    let span = |p: usize| f.life[p].map(|(a, b)| (a, b.min(minutes.saturating_sub(1))));
    let over = |d: f64, m: f64| i64::from(d > 1.0 + 1e-9) + 2 * i64::from(m > gpu_mem + 1e-9);
    // Change in the cost of GPU `g` if pod `out` leaves it and pod `inn` joins it.
    let delta = |duty: &[Vec<f64>], mem: &[Vec<f64>], g: usize, out: Option<usize>, inn: Option<usize>| -> i64 {
        let (lo, hi) = [out, inn].into_iter().flatten().filter_map(span).fold((usize::MAX, 0), |(l, h), (a, b)| (l.min(a), h.max(b)));
        let live = |p: Option<usize>, t: usize| p.filter(|&p| alive(f, p, t));
        (lo..=hi)
            .map(|t| {
                let (mut d, mut m) = (duty[g][t], mem[g][t]);
                let before = over(d, m);
                if let Some(p) = live(out, t) {
                    d -= f.duty[p][t];
                    m -= f.mem[p][t] / GIB;
                }
                if let Some(p) = live(inn, t) {
                    d += f.duty[p][t];
                    m += f.mem[p][t] / GIB;
                }
                over(d, m) - before
            })
            .sum()
    };
    let add = |duty: &mut [Vec<f64>], mem: &mut [Vec<f64>], g: usize, p: usize, sign: f64| {
        if let Some((a, b)) = span(p) {
            for t in a..=b {
                duty[g][t] += sign * f.duty[p][t];
                mem[g][t] += sign * f.mem[p][t] / GIB;
            }
        }
    };
    let peak = |p: usize| f.mem[p].iter().copied().fold(0.0, f64::max);
    let placed: Vec<usize> = (0..pods).filter(|&p| span(p).is_some()).collect();
    let mut order = placed.clone();
    order.sort_by(|&a, &b| peak(b).total_cmp(&peak(a)).then(a.cmp(&b)));
    let mut at = vec![0usize; pods];
    for &p in &order {
        let g = (0..n).min_by_key(|&g| (delta(&duty, &mem, g, None, Some(p)), g)).unwrap_or(0);
        add(&mut duty, &mut mem, g, p, 1.0);
        at[p] = g;
    }
    for _ in 0..50 {
        let mut changed = false;
        for &p in &placed {
            let s = at[p];
            let gain = -delta(&duty, &mem, s, Some(p), None);
            // The best move, then the best swap; the better of them if it lowers the cost.
            let mv = (0..n).filter(|&h| h != s).map(|h| (delta(&duty, &mem, h, None, Some(p)) - gain, h, None)).min();
            let sw = placed.iter().copied().filter(|&q| at[q] != s).map(|q| (delta(&duty, &mem, s, Some(p), Some(q)) + delta(&duty, &mem, at[q], Some(q), Some(p)), at[q], Some(q))).min();
            let Some((d, h, q)) = [mv, sw].into_iter().flatten().min() else { continue };
            if d >= 0 {
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
