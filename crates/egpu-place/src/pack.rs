//! Packing prices of GPU capacity for sharing pods.
//!
//! Sharing pods (one GPU, less than a whole one) are items of a bin-packing
//! problem whose bins are GPUs of [`MILLI`] milli-GPU. Given how often each
//! item size arrives (the target workload), the linear relaxation of "pack
//! these items into as few GPUs as possible" (the cutting-stock LP: choose
//! how often to use each *pattern*, a multiset of sizes that fits one GPU)
//! has a dual: a price `y(s)` per size with `Σ y ≤ 1` over every pattern,
//! maximising `Σ demand·y`. The price says how much of a GPU an item is
//! worth in an optimal packing: sizes that are cheap to combine get less
//! than their size, sizes that force waste (an 810-milli pod nothing else
//! can join) get a whole GPU.
//!
//! [`Prices::value`] extends the prices to any free capacity `g`: the most
//! that items of the workload can be worth inside `g` milli (an unbounded
//! knapsack). Putting an item of size `m` into a GPU with `f` free then
//! *loses* `value(f) − value(m) − value(f − m) ≥ 0` of GPU: zero when the
//! item takes its place in an optimal pattern, more when it spoils a hole
//! that a better combination could have filled. eGPU's policy adds this
//! loss to its cost (see [`crate::policy::EgpuPolicy`]).
//!
//! The dual is solved by a cutting-plane loop: start with single-size
//! patterns, solve the LP over the patterns known so far (`microlp`), find the most valuable pattern at the current prices with the
//! knapsack, and add it while it is worth more than one GPU.

use crate::frag::TargetWorkload;
use crate::model::MILLI;

const EPS: f64 = 1e-9;
/// Cutting-plane rounds before the prices are used as they are.
const MAX_ROUNDS: usize = 500;

/// Prices of free GPU capacity (see the module documentation).
#[derive(Clone, Debug, PartialEq)]
pub struct Prices {
    /// `value[g]`: the most the workload's sharing items are worth in `g` milli, in GPUs.
    value: Vec<f64>,
}

impl Prices {
    /// Prices for the sharing shapes of `target` (one GPU, less than a
    /// whole one), their weights summed per size.
    pub fn for_target(target: &TargetWorkload) -> Prices {
        let mut items: Vec<(u32, f64)> = Vec::new();
        for s in target.shapes() {
            if s.gpu_count != 1 || s.gpu_milli == 0 || s.gpu_milli >= MILLI {
                continue;
            }
            match items.iter_mut().find(|(m, _)| *m == s.gpu_milli) {
                Some((_, w)) => *w += s.weight,
                None => items.push((s.gpu_milli, s.weight)),
            }
        }
        Prices::new(&items)
    }

    /// Prices for items `(size milli, demand)`; sizes outside `1..1000` and
    /// non-positive demands are ignored.
    pub fn new(items: &[(u32, f64)]) -> Prices {
        let items: Vec<(u32, f64)> = items.iter().copied().filter(|&(m, d)| (1..MILLI).contains(&m) && d > 0.0).collect();
        if items.is_empty() {
            return Prices { value: vec![0.0; MILLI as usize + 1] };
        }
        let sizes: Vec<u32> = items.iter().map(|i| i.0).collect();
        let demand: Vec<f64> = items.iter().map(|i| i.1).collect();
        // Single-size patterns: as many copies as fit one GPU.
        let mut patterns: Vec<Vec<f64>> = (0..sizes.len())
            .map(|i| {
                let mut p = vec![0.0; sizes.len()];
                p[i] = f64::from(MILLI / sizes[i]);
                p
            })
            .collect();
        let mut y = vec![0.0; sizes.len()];
        for _ in 0..MAX_ROUNDS {
            // A solver failure keeps the prices of the last round that
            // solved (all 0 if none did: the packing loss is then off).
            let Some(next) = max_lp(&demand, &patterns) else { break };
            y = next;
            let (best, pattern) = knapsack(&sizes, &y, MILLI);
            if best <= 1.0 + 1e-7 {
                break;
            }
            patterns.push(pattern);
        }
        // Rounding noise of the simplex must not make a pattern worth more
        // than a GPU: scale down if it does.
        let (best, _) = knapsack(&sizes, &y, MILLI);
        if best > 1.0 {
            for v in &mut y {
                *v /= best;
            }
        }
        Prices { value: values(&sizes, &y, MILLI) }
    }

    /// The most the workload's items are worth inside `free` milli, in GPUs.
    pub fn value(&self, free: u32) -> f64 {
        self.value[free.min(MILLI) as usize]
    }

    /// GPU lost by putting `milli` into a GPU with `free` milli free:
    /// `value(free) − value(milli) − value(free − milli)`, never negative.
    pub fn loss(&self, free: u32, milli: u32) -> f64 {
        if milli > free {
            return 0.0;
        }
        (self.value(free) - self.value(milli) - self.value(free - milli)).max(0.0)
    }
}

/// `value[g]` for g in 0..=cap: unbounded knapsack of the priced sizes.
fn values(sizes: &[u32], y: &[f64], cap: u32) -> Vec<f64> {
    let mut v = vec![0.0f64; cap as usize + 1];
    for g in 1..=cap as usize {
        let mut b = v[g - 1];
        for (&s, &p) in sizes.iter().zip(y) {
            if s as usize <= g {
                b = b.max(v[g - s as usize] + p);
            }
        }
        v[g] = b;
    }
    v
}

/// The most valuable pattern at prices `y` within `cap`: (value, counts).
fn knapsack(sizes: &[u32], y: &[f64], cap: u32) -> (f64, Vec<f64>) {
    let n = cap as usize;
    let mut v = vec![0.0f64; n + 1];
    let mut pick: Vec<Option<usize>> = vec![None; n + 1];
    for g in 1..=n {
        v[g] = v[g - 1];
        for (i, (&s, &p)) in sizes.iter().zip(y).enumerate() {
            if s as usize <= g && v[g - s as usize] + p > v[g] + EPS {
                v[g] = v[g - s as usize] + p;
                pick[g] = Some(i);
            }
        }
    }
    let mut counts = vec![0.0; sizes.len()];
    let mut g = n;
    while g > 0 {
        match pick[g] {
            Some(i) => {
                counts[i] += 1.0;
                g -= sizes[i] as usize;
            }
            None => g -= 1,
        }
    }
    (v[n], counts)
}

/// Maximise `c·y` subject to `p·y ≤ 1` for every row `p` of `rows`, `y ≥
/// 0` (rows and `c` non-negative, so the LP is feasible at 0 and bounded
/// when every variable appears in some row), with the `microlp` solver.
/// `None` if the solver fails.
fn max_lp(c: &[f64], rows: &[Vec<f64>]) -> Option<Vec<f64>> {
    use microlp::{ComparisonOp, OptimizationDirection, Problem};
    let mut lp = Problem::new(OptimizationDirection::Maximize);
    let vars: Vec<_> = c.iter().map(|&w| lp.add_var(w, (0.0, f64::INFINITY))).collect();
    for row in rows {
        let terms: Vec<_> = vars.iter().zip(row).filter(|(_, a)| **a != 0.0).map(|(&v, &a)| (v, a)).collect();
        lp.add_constraint(terms.as_slice(), ComparisonOp::Le, 1.0);
    }
    lp.solve().ok().and_then(|o| o.solution().map(|sol| vars.iter().map(|&v| sol.var_value(v).max(0.0)).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves_and_big_items() {
        // 500s pair perfectly; 810s leave a hole only 150s can use.
        let p = Prices::new(&[(500, 10.0), (810, 10.0), (150, 1.0)]);
        assert!((p.value(500) - 0.5).abs() < 1e-6);
        assert!((p.value(810) - 1.0).abs() < 1e-6);
        assert!((p.value(1000) - 1.0).abs() < 1e-6);
        // A 150 in an 810's hole costs nothing; in half a GPU it spoils it.
        assert!(p.loss(190, 150) < 1e-9);
        assert!(p.loss(500, 150) > 0.4);
        // A 500 into an idle GPU or another 500's hole loses nothing.
        assert!(p.loss(1000, 500) < 1e-9 && p.loss(500, 500) < 1e-9);
    }

    #[test]
    fn prices_are_dual_feasible_and_bound_the_packing() {
        let items = [(320, 3.0), (470, 7.0), (650, 2.5), (230, 1.4), (810, 10.0), (160, 0.7)];
        let p = Prices::new(&items);
        // Every pattern is worth at most one GPU...
        assert!(p.value(1000) <= 1.0 + 1e-9);
        // ...so the dual objective is a lower bound on the GPUs any packing
        // needs; it must be at least the plain size bound (the prices are
        // not all zero or tiny) and see that every 810 needs its own GPU.
        let dual: f64 = items.iter().map(|&(m, d)| d * p.value(m)).sum();
        let size_bound: f64 = items.iter().map(|&(m, d)| d * f64::from(m) / 1000.0).sum();
        assert!(dual >= size_bound - 1e-6, "dual {dual} below the size bound {size_bound}");
        // 810s alone need one GPU each, which the prices must see.
        assert!(dual >= 10.0 - 1e-6);
    }

    #[test]
    fn lp_solves_a_small_dual() {
        // max 3a + 2b, a + b <= 1, 2a <= 1 -> a = 0.5, b = 0.5.
        let y = max_lp(&[3.0, 2.0], &[vec![1.0, 1.0], vec![2.0, 0.0]]).expect("solvable");
        assert!((y[0] - 0.5).abs() < 1e-9 && (y[1] - 0.5).abs() < 1e-9);
    }
}
