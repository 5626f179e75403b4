//! Fragmentation Gradient Descent (Weng et al., USENIX ATC'23), as
//! published.
//!
//! For each node that fits, FGD computes how much the node's
//! fragmentation (see [`crate::frag`]) would grow if the pod went there. A
//! sharing pod tries every fitting GPU and keeps the one with the best
//! score (the lowest index on ties); whole GPUs are the lowest-indexed idle
//! ones. The score is `sigmoid((before − after) / 1000)` on the scheduler
//! framework's integer 0..=100 scale, and equal scores go to the node with
//! the smallest name, exactly as in the published scheduler: that integer
//! scale and tie-break are part of FGD's measured behaviour.

use super::cache::{EvalCache, FragCache};
use super::{MaxPicker, Policy, gpusel};
use crate::frag::TargetWorkload;
use crate::model::{Cluster, MAX_GPUS_PER_NODE, Node, Placement, Pod};

/// FGD as published.
pub struct Fgd {
    target: TargetWorkload,
    evals: EvalCache<(i64, u8)>,
    frag: FragCache,
}

impl Fgd {
    pub fn new(target: TargetWorkload) -> Self {
        Fgd { target, evals: EvalCache::new(), frag: FragCache::new() }
    }
}

fn score(before: f64, after: f64) -> i64 {
    let x = (before - after) / 1000.0;
    (100.0 / (1.0 + (-x).exp())) as i64
}

/// Free milli-GPU of each of `node`'s GPUs (and their count) after `pod`
/// takes the GPUs `take` (for a sharing pod: one index) or, when `take` is
/// None, its lowest fitting GPUs.
pub(crate) fn free_after(node: &Node, pod: &Pod, take: Option<usize>) -> ([u32; MAX_GPUS_PER_NODE], usize) {
    let mut free = [0u32; MAX_GPUS_PER_NODE];
    let n = node.free_milli_into(&mut free);
    match take {
        Some(i) => free[i] -= pod.gpu_milli(),
        None => {
            let mut want = pod.gpu_count();
            for (i, f) in free[..n].iter_mut().enumerate() {
                if want == 0 {
                    break;
                }
                if node.gpu_fits(i, pod) {
                    *f -= pod.gpu_milli();
                    want -= 1;
                }
            }
        }
    }
    (free, n)
}

/// Fragmentation of `node` after `pod` takes the GPUs `take` (see [`free_after`]).
pub(crate) fn frag_after(target: &TargetWorkload, node: &Node, pod: &Pod, take: Option<usize>) -> f64 {
    let (free, n) = free_after(node, pod, take);
    target.frag(node.cpu_free() - pod.cpu_milli(), node.gpu_type(), &free[..n])
}

fn eval(target: &TargetWorkload, node: &Node, pod: &Pod, before: f64) -> (i64, u8) {
    if !pod.is_sharing() {
        return (score(before, frag_after(target, node, pod, None)), u8::MAX);
    }
    let mut best: Option<(i64, u8)> = None;
    let mut tried = [u32::MAX; MAX_GPUS_PER_NODE];
    for (i, g) in node.gpus().iter().enumerate() {
        // GPUs with the same free amount give the same score; the first wins.
        if !node.gpu_fits(i, pod) || tried[..i].contains(&g.free_milli) {
            continue;
        }
        tried[i] = g.free_milli;
        let s = score(before, frag_after(target, node, pod, Some(i)));
        if best.is_none_or(|(b, _)| s > b) {
            best = Some((s, i as u8));
        }
    }
    best.unwrap_or((i64::MIN, u8::MAX))
}

impl Policy for Fgd {
    fn name(&self) -> &str {
        "fgd"
    }
    fn place(&mut self, cluster: &Cluster, pod: &Pod) -> Option<Placement> {
        let nodes = cluster.nodes();
        let row = self.evals.row(pod, nodes.len());
        let mut pick = MaxPicker::new();
        for (id, node) in nodes.iter().enumerate() {
            if !node.fits(pod) {
                continue;
            }
            if row[id].0 != node.version() {
                let before = self.frag.get(&self.target, id, node, nodes.len());
                row[id] = (node.version(), eval(&self.target, node, pod, before));
            }
            let (s, gpu) = row[id].1;
            pick.offer(s, node.name(), (id, gpu));
        }
        let (id, gpu) = pick.take()?;
        let node = &nodes[id];
        let gpus = if pod.is_sharing() { vec![gpu] } else { gpusel::lowest_fitting(node, pod)? };
        Some(Placement::new(id, pod, &gpus))
    }
}
