//! eGPU's placement policy.
//!
//! It descends the same fragmentation gradient as FGD, measured against the
//! same target workload, but:
//! - it compares the exact fragmentation growth instead of a sigmoid
//!   squeezed onto 101 integer levels, so nodes FGD would call equal (and
//!   pick among at random) are told apart;
//! - among truly equal nodes it prefers the one left with the least free GPU
//!   and then CPU (best fit), so idle capacity stays together;
//! - inside a node, a sharing pod goes to the GPU with the least growth and
//!   then the least free compute; whole GPUs stay inside one NVLink group
//!   when they can.
//!
//! It is deterministic: the same cluster and pod always give the same
//! placement, which the live scheduler and the simulator both rely on.

use super::cache::{EvalCache, FragCache};
use super::fgd::frag_after;
use super::{Policy, gpusel};
use crate::frag::TargetWorkload;
use crate::model::{Cluster, MAX_GPUS_PER_NODE, Node, Placement, Pod};

/// Fragmentation growth is compared in units of 1e-6 milli-GPU.
const SCALE: f64 = 1e6;

/// eGPU's policy.
pub struct EgpuPolicy {
    target: TargetWorkload,
    evals: EvalCache<(i64, u8)>,
    frag: FragCache,
}

impl EgpuPolicy {
    pub fn new(target: TargetWorkload) -> Self {
        EgpuPolicy { target, evals: EvalCache::new(), frag: FragCache::new() }
    }
}

fn growth(before: f64, after: f64) -> i64 {
    ((after - before) * SCALE).round() as i64
}

fn eval(target: &TargetWorkload, node: &Node, pod: &Pod, before: f64) -> (i64, u8) {
    if !pod.is_sharing() {
        return (growth(before, frag_after(target, node, pod, None)), u8::MAX);
    }
    let mut best: Option<(i64, u32, u8)> = None;
    let mut tried = [u32::MAX; MAX_GPUS_PER_NODE];
    for (i, g) in node.gpus().iter().enumerate() {
        if !node.gpu_fits(i, pod) || tried[..i].contains(&g.free_milli) {
            continue;
        }
        tried[i] = g.free_milli;
        let key = (growth(before, frag_after(target, node, pod, Some(i))), g.free_milli, i as u8);
        if best.is_none_or(|b| key < b) {
            best = Some(key);
        }
    }
    best.map_or((i64::MAX, u8::MAX), |(d, _, i)| (d, i))
}

impl Policy for EgpuPolicy {
    fn name(&self) -> &str {
        "egpu"
    }
    fn place(&mut self, cluster: &Cluster, pod: &Pod) -> Option<Placement> {
        let nodes = cluster.nodes();
        let row = self.evals.row(pod, nodes.len());
        let mut best: Option<((i64, u64, u64, usize), u8)> = None;
        for (id, node) in nodes.iter().enumerate() {
            if !node.fits(pod) {
                continue;
            }
            if row[id].0 != node.version() {
                let before = self.frag.get(&self.target, id, node, nodes.len());
                row[id] = (node.version(), eval(&self.target, node, pod, before));
            }
            let (d, gpu) = row[id].1;
            let gpu_left = u64::from(node.gpu_free_milli()) - pod.total_gpu_milli();
            let key = (d, gpu_left, node.cpu_free() - pod.cpu_milli(), id);
            if best.is_none_or(|(b, _)| key < b) {
                best = Some((key, gpu));
            }
        }
        let ((.., id), gpu) = best?;
        let node = &nodes[id];
        let gpus = if pod.is_sharing() { vec![gpu] } else { gpusel::nvlink_whole(node, pod)? };
        Some(Placement::new(id, pod, &gpus))
    }
}
