//! GPU fragmentation measured against a target workload, as defined by
//! Fragmentation Gradient Descent (Weng et al., USENIX ATC'23).
//!
//! The target workload is the set of pod shapes (CPU, per-GPU milli, GPU
//! count, allowed GPU types) that cover a given share of the trace's pods,
//! most popular first, each weighted by its popularity. A node's
//! fragmentation for one shape is the free GPU compute the shape cannot use
//! there:
//! - if the shape cannot run on the node at all (too little CPU, too few
//!   GPUs with enough free, a disallowed GPU type), all free GPU compute;
//! - if it can, the free compute on GPUs that have less free than the
//!   shape's per-GPU share;
//! - a CPU-only shape counts all free GPU compute (it never uses any).
//!
//! The node's fragmentation is the popularity-weighted sum over shapes.

use crate::model::{GpuTypeId, Node, Pod, TypeSet};
use std::collections::HashMap;

/// A pod shape of the target workload and its popularity (weights sum to 1).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TargetShape {
    pub cpu_milli: u64,
    pub gpu_milli: u32,
    pub gpu_count: u32,
    pub gpu_types: TypeSet,
    pub weight: f64,
}

/// The target workload: the popular pod shapes of a trace.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TargetWorkload {
    shapes: Vec<TargetShape>,
    /// Every shape of the trace and its pod count, and the coverage asked
    /// for (for [`TargetWorkload::ignoring_types`]; empty from shapes).
    counts: Vec<(ShapeKey, u64)>,
    coverage: f64,
}

/// CPU, per-GPU milli, GPU count, allowed types.
type ShapeKey = (u64, u32, u32, TypeSet);

impl TargetWorkload {
    /// The most popular shapes of `pods` that together cover at least
    /// `coverage` (e.g. 0.95) of them, re-weighted to sum to 1. CPU-only
    /// pods are included. Ties in popularity put the larger shape first.
    pub fn from_pods<'a>(pods: impl IntoIterator<Item = &'a Pod>, coverage: f64) -> TargetWorkload {
        let mut counts: HashMap<ShapeKey, u64> = HashMap::new();
        for p in pods {
            *counts.entry((p.cpu_milli(), p.gpu_milli(), p.gpu_count(), p.gpu_types())).or_default() += 1;
        }
        Self::from_counts(counts.into_iter().collect(), coverage)
    }

    fn from_counts(mut list: Vec<(ShapeKey, u64)>, coverage: f64) -> TargetWorkload {
        list.sort_by(|a, b| b.1.cmp(&a.1).then(b.0.cmp(&a.0)));
        let total: u64 = list.iter().map(|x| x.1).sum();
        let want = coverage.clamp(0.0, 1.0) * total as f64;
        let mut cum = 0u64;
        let mut shapes = Vec::new();
        for &((cpu_milli, gpu_milli, gpu_count, gpu_types), n) in &list {
            if cum as f64 >= want && !shapes.is_empty() {
                break;
            }
            cum += n;
            shapes.push(TargetShape { cpu_milli, gpu_milli, gpu_count, gpu_types, weight: n as f64 });
        }
        for s in &mut shapes {
            s.weight /= cum as f64;
        }
        TargetWorkload { shapes, counts: list, coverage }
    }

    /// The target the same pods give with their GPU-type constraints
    /// dropped: shapes that differ only in allowed types are counted as
    /// one, then the coverage is applied again. On a trace without type
    /// constraints it is the same target. (From explicit shapes, which
    /// carry no counts, the shapes are merged as they are.)
    pub fn ignoring_types(&self) -> TargetWorkload {
        let strip = |k: &ShapeKey| (k.0, k.1, k.2, TypeSet::ANY);
        if self.counts.is_empty() {
            let mut merged: Vec<TargetShape> = Vec::new();
            for s in &self.shapes {
                match merged.iter_mut().find(|m| (m.cpu_milli, m.gpu_milli, m.gpu_count) == (s.cpu_milli, s.gpu_milli, s.gpu_count)) {
                    Some(m) => m.weight += s.weight,
                    None => merged.push(TargetShape { gpu_types: TypeSet::ANY, ..*s }),
                }
            }
            return TargetWorkload { shapes: merged, counts: Vec::new(), coverage: self.coverage };
        }
        let mut counts: HashMap<ShapeKey, u64> = HashMap::new();
        for (k, n) in &self.counts {
            *counts.entry(strip(k)).or_default() += n;
        }
        Self::from_counts(counts.into_iter().collect(), self.coverage)
    }

    /// A target workload from explicit shapes; weights are normalised.
    pub fn from_shapes(mut shapes: Vec<TargetShape>) -> TargetWorkload {
        let sum: f64 = shapes.iter().map(|s| s.weight.max(0.0)).sum();
        for s in &mut shapes {
            s.weight = if sum > 0.0 { s.weight.max(0.0) / sum } else { 0.0 };
        }
        TargetWorkload { shapes, counts: Vec::new(), coverage: 1.0 }
    }

    pub fn shapes(&self) -> &[TargetShape] {
        &self.shapes
    }

    /// Fragmentation, in milli-GPU, of a node state: `cpu_free` CPU left,
    /// GPUs of type `gpu_type` with `free` milli-GPU free each.
    pub fn frag(&self, cpu_free: u64, gpu_type: Option<GpuTypeId>, free: &[u32]) -> f64 {
        let total: u32 = free.iter().sum();
        if total == 0 {
            return 0.0;
        }
        let mut frag = 0.0;
        for s in &self.shapes {
            frag += s.weight * f64::from(shape_frag(s, cpu_free, gpu_type, free, total));
        }
        frag
    }

    /// Fragmentation of `node` as it is now.
    pub fn node_frag(&self, node: &Node) -> f64 {
        let mut buf = [0u32; crate::model::MAX_GPUS_PER_NODE];
        let n = node.free_milli_into(&mut buf);
        self.frag(node.cpu_free(), node.gpu_type(), &buf[..n])
    }
}

/// Free compute on a node that shape `s` cannot use.
fn shape_frag(s: &TargetShape, cpu_free: u64, gpu_type: Option<GpuTypeId>, free: &[u32], total: u32) -> u32 {
    if s.gpu_milli == 0 || !s.gpu_types.allows(gpu_type) {
        return total;
    }
    let mut fitting = 0u32;
    let mut unusable = 0u32;
    for &f in free {
        if f >= s.gpu_milli {
            fitting += 1;
        } else {
            unusable += f;
        }
    }
    if fitting >= s.gpu_count && cpu_free >= s.cpu_milli { unusable } else { total }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Qos;

    fn pod(cpu: u64, n: u32, m: u32) -> Pod {
        Pod::new(cpu, 0, n, m, TypeSet::ANY, Qos::Be).unwrap()
    }

    #[test]
    fn ignoring_types_counts_constrained_variants_as_their_shape_then_covers_again() {
        // Shape A: 60 pods of any type and 50 confined to type 0; shape B:
        // 80 pods. With types, covering half the pods keeps B and
        // A-any; without, A (110 pods) alone covers half.
        let a = pod(1000, 1, 500);
        let a0 = Pod::new(1000, 0, 1, 500, TypeSet::only(GpuTypeId(0)), Qos::Be).unwrap();
        let b = pod(2000, 1, 1000);
        let mut pods = vec![a.clone(); 60];
        pods.extend(vec![a0; 50]);
        pods.extend(vec![b.clone(); 80]);
        let t = TargetWorkload::from_pods(&pods, 0.5);
        assert_eq!(t.shapes().len(), 2);
        assert!(t.shapes().iter().all(|s| s.gpu_types == TypeSet::ANY));
        let u = t.ignoring_types();
        assert_eq!(u.shapes().len(), 1, "{u:?}");
        assert_eq!((u.shapes()[0].cpu_milli, u.shapes()[0].gpu_milli, u.shapes()[0].weight), (1000, 500, 1.0));
        // Without constraints it is the same target.
        let plain: Vec<Pod> = pods.iter().map(|p| Pod::new(p.cpu_milli(), 0, p.gpu_count(), p.gpu_milli(), TypeSet::ANY, Qos::Be).unwrap()).collect();
        let t = TargetWorkload::from_pods(&plain, 0.95);
        assert_eq!(t.ignoring_types(), t);
    }

    #[test]
    fn coverage_keeps_the_popular_shapes() {
        let mut pods = vec![pod(1000, 1, 500); 90];
        pods.extend(vec![pod(2000, 1, 1000); 8]);
        pods.extend(vec![pod(3000, 2, 1000); 2]);
        let t = TargetWorkload::from_pods(&pods, 0.95);
        assert_eq!(t.shapes().len(), 2);
        assert!((t.shapes()[0].weight - 90.0 / 98.0).abs() < 1e-12);
        let all = TargetWorkload::from_pods(&pods, 1.0);
        assert_eq!(all.shapes().len(), 3);
    }

    #[test]
    fn frag_counts_gpus_a_shape_cannot_use() {
        let t = TargetWorkload::from_shapes(vec![TargetShape { cpu_milli: 1000, gpu_milli: 500, gpu_count: 1, gpu_types: TypeSet::ANY, weight: 1.0 }]);
        // 300 free on GPU 0 is too little for a 500 share; GPU 1 is fine.
        assert_eq!(t.frag(4000, Some(GpuTypeId(0)), &[300, 1000]), 300.0);
        // Without CPU the whole node is fragment.
        assert_eq!(t.frag(500, Some(GpuTypeId(0)), &[300, 1000]), 1300.0);
        // A disallowed type makes everything fragment.
        let typed = TargetWorkload::from_shapes(vec![TargetShape { gpu_types: TypeSet::only(GpuTypeId(1)), ..t.shapes()[0] }]);
        assert_eq!(typed.frag(4000, Some(GpuTypeId(0)), &[300, 1000]), 1300.0);
    }
}
