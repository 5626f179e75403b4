//! The baseline policies of the FGD evaluation, re-implemented from their
//! published definitions. Each scores every node that fits on the integer
//! 0..=100 scale of the Kubernetes scheduler framework and keeps the
//! highest; ties go to the node with the smallest name, as in the FGD
//! authors' simulator (the framework itself breaks them at random; see
//! docs/placement.md).
//!
//! - Random: a node that fits, uniformly; a random fitting GPU.
//! - DotProd: the smallest dot product of the node's free (CPU, GPU) and the
//!   pod's request, both normalised by the largest node (128 CPUs, 8 GPUs).
//! - GpuClustering: nodes already running pods of the same GPU class first,
//!   then idle nodes, then mixed nodes; fuller nodes first within a band.
//! - GpuPacking: partly used GPUs first, then idle GPUs of used nodes, then
//!   idle nodes.
//! - BestFit: the node left with the least free CPU and GPU (weighted
//!   equally, normalised by the largest node), min–max normalised.
//!
//! All but Random put a sharing pod on the fitting GPU with the least free
//! compute.

use super::{MaxPicker, Policy, gpusel};
use crate::model::{Cluster, MILLI, Node, Placement, Pod};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// CPU of the largest node, milli-CPU (normalisation constant).
pub const MAX_SPEC_CPU: f64 = 128_000.0;
/// GPUs of the largest node, milli-GPU (normalisation constant).
pub const MAX_SPEC_GPU: i64 = 8_000;
const MAX_SCORE: i64 = 100;

fn place_best(cluster: &Cluster, pod: &Pod, score: impl Fn(&Node) -> i64) -> Option<Placement> {
    let mut pick = MaxPicker::new();
    for (id, node) in cluster.nodes().iter().enumerate() {
        if node.fits(pod) {
            pick.offer(score(node), node.name(), id);
        }
    }
    let id = pick.take()?;
    let gpus = gpusel::best_fit(&cluster.nodes()[id], pod)?;
    Some(Placement::new(id, pod, &gpus))
}

/// Random fit.
pub struct RandomFit {
    rng: ChaCha8Rng,
}

impl RandomFit {
    /// A stream of its own: the simulator shuffles the arrivals with a
    /// ChaCha8 stream seeded by the same seed, and a policy drawing the
    /// same numbers would be correlated with the order it is fed.
    pub fn new(seed: u64) -> Self {
        RandomFit { rng: ChaCha8Rng::seed_from_u64(seed ^ RANDOM_FIT_STREAM) }
    }
}

/// XORed into the seed of [`RandomFit`]'s generator ("randomfi").
const RANDOM_FIT_STREAM: u64 = 0x7261_6e64_6f6d_6669;

impl Policy for RandomFit {
    fn name(&self) -> &str {
        "random"
    }
    fn place(&mut self, cluster: &Cluster, pod: &Pod) -> Option<Placement> {
        // Uniform over the nodes that fit (reservoir sampling).
        let mut seen = 0u32;
        let mut pick = None;
        for (id, node) in cluster.nodes().iter().enumerate() {
            if node.fits(pod) {
                seen += 1;
                if self.rng.random_range(0..seen) == 0 {
                    pick = Some(id);
                }
            }
        }
        let id = pick?;
        let gpus = gpusel::random_fit(&cluster.nodes()[id], pod, &mut self.rng)?;
        Some(Placement::new(id, pod, &gpus))
    }
}

/// Dot product (Tetris-style alignment).
#[derive(Default)]
pub struct DotProd;

impl DotProd {
    pub fn new() -> Self {
        DotProd
    }
}

/// DotProd score of `pod` on `node` (higher is better).
pub fn dotprod_score(node: &Node, pod: &Pod) -> i64 {
    let g = MAX_SPEC_GPU as f64;
    let dot = (node.cpu_free() as f64 / MAX_SPEC_CPU) * (pod.cpu_milli() as f64 / MAX_SPEC_CPU)
        + (f64::from(node.gpu_free_milli()) / g) * (pod.total_gpu_milli() as f64 / g);
    (MAX_SCORE as f64 * (1.0 - dot / 2.0)) as i64
}

impl Policy for DotProd {
    fn name(&self) -> &str {
        "dotprod"
    }
    fn place(&mut self, cluster: &Cluster, pod: &Pod) -> Option<Placement> {
        place_best(cluster, pod, |n| dotprod_score(n, pod))
    }
}

/// GPU clustering: keep pods of one GPU class together.
#[derive(Default)]
pub struct GpuClustering;

impl GpuClustering {
    pub fn new() -> Self {
        GpuClustering
    }
}

/// GpuClustering score of `pod` on `node` (higher is better).
pub fn clustering_score(node: &Node, pod: &Pod) -> i64 {
    let class = pod.class();
    if class == 0 {
        return 0;
    }
    let counts = node.class_counts();
    let classes_present = counts[1..].iter().filter(|&&c| c > 0).count();
    // Clamped at zero: a node with more than eight GPUs (the published
    // constant's largest node) would otherwise score below its band.
    let fill = (MAX_SCORE / 4 * (MAX_SPEC_GPU - i64::from(node.gpu_free_milli())) / MAX_SPEC_GPU).max(0);
    let band = if counts[class] > 0 {
        if classes_present == 1 { 3 } else { 2 }
    } else if classes_present == 0 {
        1
    } else {
        0
    };
    fill + MAX_SCORE * band / 4
}

impl Policy for GpuClustering {
    fn name(&self) -> &str {
        "clustering"
    }
    fn place(&mut self, cluster: &Cluster, pod: &Pod) -> Option<Placement> {
        place_best(cluster, pod, |n| clustering_score(n, pod))
    }
}

/// GPU packing: fill used GPUs, then used nodes, then idle nodes.
#[derive(Default)]
pub struct GpuPacking;

impl GpuPacking {
    pub fn new() -> Self {
        GpuPacking
    }
}

/// GpuPacking score of `pod` on `node` (higher is better).
pub fn packing_score(node: &Node, pod: &Pod) -> i64 {
    if pod.gpu_count() == 0 {
        return 0;
    }
    let gpus = node.gpus();
    let idle = gpus.iter().filter(|g| g.free_milli == MILLI).count() as i64;
    if idle == gpus.len() as i64 {
        // At most a third: an idle node with more than 16 GPUs would
        // otherwise outscore the used nodes' bands.
        return (MAX_SCORE / 3 - idle).max(idle).min(MAX_SCORE / 3);
    }
    let mut order: Vec<usize> = (0..gpus.len()).collect();
    order.sort_by_key(|&i| gpus[i].free_milli);
    let mut want = pod.gpu_count();
    let mut idle_used = 0i64;
    let mut free_pct_on_used = 0i64;
    for i in order {
        if want == 0 {
            break;
        }
        if node.gpu_fits(i, pod) {
            want -= 1;
            if gpus[i].free_milli == MILLI {
                idle_used += 1;
            }
            free_pct_on_used += i64::from(gpus[i].free_milli) * 100 / i64::from(MILLI);
        }
    }
    if want != 0 {
        return 0;
    }
    if idle_used > 0 {
        return (MAX_SCORE / 2 - idle_used).max(MAX_SCORE / 3);
    }
    (MAX_SCORE - free_pct_on_used / 10).max(MAX_SCORE / 2)
}

impl Policy for GpuPacking {
    fn name(&self) -> &str {
        "packing"
    }
    fn place(&mut self, cluster: &Cluster, pod: &Pod) -> Option<Placement> {
        place_best(cluster, pod, |n| packing_score(n, pod))
    }
}

/// Best fit on CPU and GPU.
#[derive(Default)]
pub struct BestFit {
    scratch: Vec<(usize, i64)>,
}

impl BestFit {
    pub fn new() -> Self {
        BestFit { scratch: Vec::new() }
    }
}

/// BestFit raw score of `pod` on `node`, before normalisation (higher is better).
pub fn bestfit_raw_score(node: &Node, pod: &Pod) -> i64 {
    let cpu_left = node.cpu_free().saturating_sub(pod.cpu_milli()) as f64 / MAX_SPEC_CPU;
    let gpu_left = (u64::from(node.gpu_free_milli()).saturating_sub(pod.total_gpu_milli())) as f64 / MAX_SPEC_GPU as f64;
    ((1.0 - 0.5 * cpu_left - 0.5 * gpu_left) * MAX_SCORE as f64) as i64
}

impl Policy for BestFit {
    fn name(&self) -> &str {
        "bestfit"
    }
    fn place(&mut self, cluster: &Cluster, pod: &Pod) -> Option<Placement> {
        self.scratch.clear();
        for (id, node) in cluster.nodes().iter().enumerate() {
            if node.fits(pod) {
                self.scratch.push((id, bestfit_raw_score(node, pod)));
            }
        }
        let lo = self.scratch.iter().map(|s| s.1).min()?;
        let hi = self.scratch.iter().map(|s| s.1).max()?;
        let mut pick = MaxPicker::new();
        for &(id, s) in &self.scratch {
            let norm = if hi == lo { 0 } else { (s - lo) * MAX_SCORE / (hi - lo) };
            pick.offer(norm, cluster.nodes()[id].name(), id);
        }
        let id = pick.take()?;
        let gpus = gpusel::best_fit(&cluster.nodes()[id], pod)?;
        Some(Placement::new(id, pod, &gpus))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{NodeSpec, Qos, TypeSet};

    fn idle_node(gpus: u8) -> Cluster {
        let mut c = Cluster::new();
        let t = c.gpu_type_or_insert("A", 80).unwrap();
        let spec = NodeSpec { name: "n".into(), cpu_milli: 256_000, memory_mib: 1 << 20, gpu_type: Some(t), nvlink_groups: vec![0; usize::from(gpus)], max_pods: 110 };
        c.add_node(spec).unwrap();
        c
    }

    #[test]
    fn idle_nodes_larger_than_eight_gpus_keep_their_band() {
        let pod = Pod::new(1000, 1024, 1, 500, TypeSet::ANY, Qos::Be).unwrap();
        for gpus in [8, 16, 64] {
            let c = idle_node(gpus);
            let n = c.node(0).unwrap();
            // Clustering: an idle node is band 1 (a quarter), whatever its size.
            assert_eq!(clustering_score(n, &pod), MAX_SCORE / 4, "{gpus} GPUs");
            // Packing: an idle node is never above a third (used nodes score more).
            let p = packing_score(n, &pod);
            assert!((0..=MAX_SCORE / 3).contains(&p), "{gpus} GPUs: {p}");
        }
    }
}
