//! The trace-driven simulator: schedule an arrival sequence one pod at a
//! time with one policy (a pod that fails is not retried) and record, after
//! every pod, the GPU allocation ratio and the fragmentation ratio against
//! the arrived GPU request.
//!
//! Curves are binned like the FGD artifact: each event's arrived request is
//! rounded to a whole percent of cluster GPU capacity (ties to even), each
//! bin holds the mean of its events, and an empty bin takes the mean of the
//! events in its two neighbours.

use egpu_place::{Cluster, Policy, Pod, TargetWorkload};
use serde::Serialize;

/// Highest arrived percentage recorded.
pub const MAX_ARRIVED_PCT: usize = 130;

/// What one run produced.
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    pub policy: String,
    pub seed: u64,
    pub pods: usize,
    pub placed: usize,
    pub failed: usize,
    /// Placements the cluster refused (a policy bug; always 0 in tests).
    pub invalid: usize,
    /// Allocated GPU, % of capacity, at arrived 0..=130 % (None: no event near).
    pub alloc_pct: Vec<Option<f64>>,
    /// Fragmented share of idle GPU, %, at the same points.
    pub frag_pct: Vec<Option<f64>>,
}

impl RunResult {
    /// Unallocated GPU (% of capacity) when arrived request reaches `pct` %.
    pub fn unallocated_at(&self, pct: usize) -> Option<f64> {
        self.alloc_pct.get(pct).copied().flatten().map(|a| 100.0 - a)
    }
}

#[derive(Default, Clone, Copy)]
struct Bin {
    alloc: f64,
    frag: f64,
    n: u32,
}

/// Run `policy` over `arrivals` (indices into `pods`) on a copy of `cluster`.
/// `target` is used to report the fragmentation ratio.
pub fn run(cluster: &Cluster, pods: &[Pod], arrivals: &[usize], policy: &mut dyn Policy, target: &TargetWorkload, seed: u64) -> RunResult {
    let mut cluster = cluster.clone();
    let capacity = cluster.gpu_capacity_milli().max(1) as f64;
    let mut node_frag: Vec<f64> = cluster.nodes().iter().map(|n| target.node_frag(n)).collect();
    let mut frag_total: f64 = node_frag.iter().sum();
    let mut bins = vec![Bin::default(); MAX_ARRIVED_PCT + 1];
    let mut arrived = 0u64;
    let (mut placed, mut failed, mut invalid) = (0, 0, 0);
    for &i in arrivals {
        let Some(pod) = pods.get(i) else { continue };
        arrived += pod.total_gpu_milli();
        // A placement must be the pod's (its GPUs, shares, type, CPU and
        // memory), not just fit: anything else counts as invalid.
        let placement = policy.place(&cluster, pod);
        let mismatch = placement.as_ref().is_some_and(|p| !cluster.node(p.node).is_some_and(|n| p.serves(pod, n)));
        match placement {
            Some(_) if mismatch => invalid += 1,
            Some(p) => match cluster.apply(&p) {
                Ok(()) => {
                    placed += 1;
                    if let Some(node) = cluster.node(p.node) {
                        let f = target.node_frag(node);
                        frag_total += f - node_frag[p.node];
                        node_frag[p.node] = f;
                    }
                }
                Err(_) => invalid += 1,
            },
            None => failed += 1,
        }
        let pct = bin_of(arrived as f64, capacity);
        if pct <= MAX_ARRIVED_PCT as f64 {
            let idle = capacity - cluster.gpu_allocated_milli() as f64;
            let b = &mut bins[pct as usize];
            b.alloc += cluster.gpu_allocated_milli() as f64 / capacity * 100.0;
            b.frag += if idle > 0.0 { (frag_total / idle * 100.0).clamp(0.0, 100.0) } else { 0.0 };
            b.n += 1;
        }
    }
    let (alloc_pct, frag_pct) = curves(&bins);
    RunResult { policy: policy.name().to_string(), seed, pods: arrivals.len(), placed, failed, invalid, alloc_pct, frag_pct }
}

/// The bin of an arrived GPU request: a whole percent of capacity, ties to
/// even (as the published analysis script's `round`).
fn bin_of(arrived: f64, capacity: f64) -> f64 {
    (arrived / capacity * 100.0).round_ties_even()
}

/// Mean allocation and fragmentation per bin; an empty bin takes the
/// events of its two neighbours.
fn curves(bins: &[Bin]) -> (Vec<Option<f64>>, Vec<Option<f64>>) {
    let mut alloc = Vec::with_capacity(bins.len());
    let mut frag = Vec::with_capacity(bins.len());
    for x in 0..bins.len() {
        let mut b = bins[x];
        if b.n == 0 {
            for y in [x.wrapping_sub(1), x + 1] {
                if let Some(o) = bins.get(y) {
                    b.alloc += o.alloc;
                    b.frag += o.frag;
                    b.n += o.n;
                }
            }
        }
        let n = f64::from(b.n);
        alloc.push((b.n > 0).then(|| b.alloc / n));
        frag.push((b.n > 0).then(|| b.frag / n));
    }
    (alloc, frag)
}

#[cfg(test)]
mod tests {
    use super::{Bin, bin_of, curves};

    #[test]
    fn arrivals_bin_to_whole_percents_ties_to_even() {
        assert_eq!((bin_of(25.0, 1000.0), bin_of(35.0, 1000.0), bin_of(35.1, 1000.0), bin_of(1000.0, 1000.0)), (2.0, 4.0, 4.0, 100.0));
    }

    #[test]
    fn an_empty_bin_takes_its_neighbours_events_and_a_lone_gap_stays_empty() {
        let b = |alloc: f64, n: u32| Bin { alloc, frag: alloc / 2.0, n };
        // Bins 0..=4: events in 0 (one at 10%), 2 (two, 20% and 40%), none in 1, 3 or 4.
        let bins = [b(10.0, 1), b(0.0, 0), b(60.0, 2), b(0.0, 0), b(0.0, 0)];
        let (alloc, frag) = curves(&bins);
        assert_eq!(alloc, vec![Some(10.0), Some(70.0 / 3.0), Some(30.0), Some(30.0), None]);
        assert_eq!(frag[1], Some(35.0 / 3.0));
    }
}
