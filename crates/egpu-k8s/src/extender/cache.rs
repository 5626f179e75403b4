//! The node cache: the eGPU nodes' annotations, followed from the API
//! server.

use crate::annotation::{AnnotationError, NodeGpus};
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// The eGPU nodes' `egpu.io/gpus` annotations, followed from the API server
/// (metadata only), for a scheduler that sends node names
/// (`nodeCacheCapable: true`) instead of whole Node objects.
#[derive(Debug, Default)]
pub struct NodeCache {
    /// The label selector followed, for the reason a node is unknown.
    pub(super) selector: String,
    /// Each node's annotation, parsed when it arrives (a filter then reads
    /// no JSON), or why it cannot be used.
    pub(super) annotations: RwLock<HashMap<String, Result<Arc<NodeGpus>, AnnotationError>>>,
    /// Whether a list has filled it yet.
    synced: std::sync::atomic::AtomicBool,
}

impl NodeCache {
    /// An empty cache of the nodes `selector` (a label selector) picks.
    pub fn new(selector: &str) -> NodeCache {
        NodeCache { selector: selector.into(), annotations: RwLock::default(), synced: std::sync::atomic::AtomicBool::new(false) }
    }

    /// The whole set, from a list.
    pub fn replace(&self, nodes: Vec<kube::api::ObjectMeta>) {
        let map = nodes.into_iter().filter_map(|m| Some((m.name.clone()?, annotation_of(&m)))).collect();
        *self.annotations.write().expect("node cache lock") = map;
        self.synced.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether a list has filled it yet.
    pub fn synced(&self) -> bool {
        self.synced.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// One node changed (`present` false: deleted, or no longer selected).
    pub fn update(&self, node: kube::api::ObjectMeta, present: bool) {
        let Some(name) = node.name.clone() else { return };
        let mut map = self.annotations.write().expect("node cache lock");
        if present {
            map.insert(name, annotation_of(&node));
        } else {
            map.remove(&name);
        }
    }

    /// Nodes known.
    pub fn len(&self) -> usize {
        self.annotations.read().expect("node cache lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A node's annotation, parsed whole (with its pod lists).
pub(super) fn annotation_of(m: &kube::api::ObjectMeta) -> Result<Arc<NodeGpus>, AnnotationError> {
    NodeGpus::parse(m.annotations.as_ref().and_then(|a| a.get(crate::annotation::ANNOTATION)).map(String::as_str)).map(Arc::new)
}
