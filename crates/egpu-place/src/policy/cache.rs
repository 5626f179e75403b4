//! Per-node evaluation caches, invalidated by [`crate::Node::version`].
//!
//! A node's score for a pod depends only on the node's state and the pod's
//! shape, so a policy that keeps scores per (shape, node) only recomputes
//! the nodes that changed since it last saw that shape. This is what keeps
//! per-pod decisions fast on a large live cluster: each placement changes
//! one node.

use crate::frag::TargetWorkload;
use crate::model::{Node, Pod, TypeSet};
use std::collections::HashMap;

/// Shapes remembered before the cache starts over (bounds memory on a live
/// cluster that sees endless distinct requests).
const MAX_SHAPES: usize = 512;

type ShapeKey = (u64, u32, u32, u32, TypeSet);

fn key(pod: &Pod) -> ShapeKey {
    (pod.cpu_milli(), pod.gpu_count(), pod.gpu_milli(), pod.gpu_mem_milli(), pod.gpu_types())
}

/// Cached values per (pod shape, node).
pub(crate) struct EvalCache<T: Copy> {
    shapes: HashMap<ShapeKey, usize>,
    rows: Vec<Vec<(u64, T)>>,
}

impl<T: Copy + Default> EvalCache<T> {
    pub(crate) fn new() -> Self {
        EvalCache { shapes: HashMap::new(), rows: Vec::new() }
    }

    /// The row of `pod`'s shape, one slot per node: (node version, value).
    /// A slot is valid only if its version equals the node's version.
    pub(crate) fn row(&mut self, pod: &Pod, nodes: usize) -> &mut Vec<(u64, T)> {
        if self.shapes.len() >= MAX_SHAPES && !self.shapes.contains_key(&key(pod)) {
            self.shapes.clear();
            self.rows.clear();
        }
        let next = self.rows.len();
        let idx = *self.shapes.entry(key(pod)).or_insert(next);
        if idx == self.rows.len() {
            self.rows.push(Vec::new());
        }
        let row = &mut self.rows[idx];
        if row.len() != nodes {
            row.clear();
            row.resize(nodes, (0, T::default()));
        }
        row
    }
}

/// Each node's current fragmentation, recomputed only when the node changes.
pub(crate) struct FragCache {
    slots: Vec<(u64, f64)>,
}

impl FragCache {
    pub(crate) fn new() -> Self {
        FragCache { slots: Vec::new() }
    }
    pub(crate) fn get(&mut self, target: &TargetWorkload, id: usize, node: &Node, nodes: usize) -> f64 {
        if self.slots.len() != nodes {
            self.slots.clear();
            self.slots.resize(nodes, (0, 0.0));
        }
        let slot = &mut self.slots[id];
        if slot.0 != node.version() {
            *slot = (node.version(), target.node_frag(node));
        }
        slot.1
    }
}
