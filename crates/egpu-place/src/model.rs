//! The cluster model: nodes, GPUs, pods and placements, with exact
//! milli-GPU accounting.
//!
//! Every GPU tracks its free compute and free memory in milli-GPU
//! (1000 = one whole GPU). [`Cluster::apply`] and [`Cluster::release`] are
//! the only ways to change the free amounts, and both refuse anything that
//! would over-allocate or under-flow, so the accounting stays exact whatever
//! a policy returns.

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};

/// One whole GPU in milli-GPU.
pub const MILLI: u32 = 1000;
/// The most GPUs one node may have.
pub const MAX_GPUS_PER_NODE: usize = 64;
/// The most distinct GPU types one cluster may have (they fit a `u64` mask).
pub const MAX_GPU_TYPES: usize = 64;
/// Number of pod classes tracked per node (see [`Pod::class`]).
pub const CLASS_COUNT: usize = 11;

/// Process-wide source of node versions: every change anywhere gets a new
/// number, so a cache keyed by version is never fooled by a clone.
static NEXT_VERSION: AtomicU64 = AtomicU64::new(1);

fn next_version() -> u64 {
    NEXT_VERSION.fetch_add(1, Ordering::Relaxed)
}

/// Errors from building or changing the model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    #[error("too many GPU types (at most {MAX_GPU_TYPES})")]
    TooManyGpuTypes,
    #[error("node {0} has more than {MAX_GPUS_PER_NODE} GPUs")]
    TooManyGpus(String),
    #[error("node {0} has GPUs but no GPU type")]
    GpusWithoutType(String),
    #[error("invalid pod: {0}")]
    InvalidPod(&'static str),
    #[error("node {0} does not exist")]
    NoSuchNode(usize),
    #[error("GPU {gpu} does not exist on node {node}")]
    NoSuchGpu { node: usize, gpu: usize },
    #[error("GPU {gpu} is listed twice in one placement")]
    DuplicateGpu { gpu: usize },
    #[error("placement does not fit node {node}: {what}")]
    DoesNotFit { node: usize, what: &'static str },
    #[error("release does not match what node {node} holds: {what}")]
    ReleaseMismatch { node: usize, what: &'static str },
}

/// Index of a GPU type in the cluster's catalog.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct GpuTypeId(pub u8);

/// A set of allowed GPU types. The empty set means "any type".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TypeSet(pub u64);

impl TypeSet {
    /// Any GPU type is allowed.
    pub const ANY: TypeSet = TypeSet(0);

    /// The set holding one type.
    pub fn only(t: GpuTypeId) -> Self {
        TypeSet(1u64 << t.0)
    }
    /// This set plus `t`.
    pub fn with(self, t: GpuTypeId) -> Self {
        TypeSet(self.0 | (1u64 << t.0))
    }
    /// Whether this set allows any type.
    pub fn is_any(self) -> bool {
        self.0 == 0
    }
    /// Whether a node whose GPUs are of type `t` (None: no GPUs) is allowed.
    pub fn allows(self, t: Option<GpuTypeId>) -> bool {
        match t {
            _ if self.is_any() => true,
            None => false,
            Some(t) => self.0 & (1u64 << t.0) != 0,
        }
    }
}

/// A GPU type: its name (e.g. `V100M32`) and memory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuTypeInfo {
    pub name: String,
    pub memory_mib: u64,
}

/// One physical GPU and what is left of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gpu {
    /// Free compute, milli-GPU.
    pub free_milli: u32,
    /// Free memory, milli-GPU of this GPU's memory.
    pub free_mem_milli: u32,
    /// GPUs with the same group number are joined by NVLink.
    pub nvlink_group: u8,
}

/// What a node is made of, to add it to a [`Cluster`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSpec {
    pub name: String,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub gpu_type: Option<GpuTypeId>,
    /// NVLink group of each GPU; its length is the GPU count.
    pub nvlink_groups: Vec<u8>,
    /// The most pods the node accepts (Kubernetes `pods` allocatable).
    pub max_pods: u32,
}

/// Index of a node in its cluster.
pub type NodeId = usize;

/// A node with its capacity and free resources.
#[derive(Clone, Debug)]
pub struct Node {
    name: String,
    gpu_type: Option<GpuTypeId>,
    cpu_capacity: u64,
    cpu_free: u64,
    mem_capacity_mib: u64,
    mem_free_mib: u64,
    max_pods: u32,
    pods: u32,
    gpus: Vec<Gpu>,
    class_counts: [u32; CLASS_COUNT],
    version: u64,
}

impl Node {
    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn gpu_type(&self) -> Option<GpuTypeId> {
        self.gpu_type
    }
    pub fn cpu_capacity(&self) -> u64 {
        self.cpu_capacity
    }
    pub fn cpu_free(&self) -> u64 {
        self.cpu_free
    }
    pub fn mem_capacity_mib(&self) -> u64 {
        self.mem_capacity_mib
    }
    pub fn mem_free_mib(&self) -> u64 {
        self.mem_free_mib
    }
    pub fn pods(&self) -> u32 {
        self.pods
    }
    pub fn gpus(&self) -> &[Gpu] {
        &self.gpus
    }
    /// Number of pods of each [`Pod::class`] on this node.
    pub fn class_counts(&self) -> &[u32; CLASS_COUNT] {
        &self.class_counts
    }
    /// Changes whenever the node's free resources change; unique process-wide.
    pub fn version(&self) -> u64 {
        self.version
    }
    /// Sum of free compute over the node's GPUs, milli-GPU.
    pub fn gpu_free_milli(&self) -> u32 {
        self.gpus.iter().map(|g| g.free_milli).sum()
    }
    /// Number of GPUs with nothing allocated.
    pub fn idle_gpus(&self) -> usize {
        self.gpus.iter().filter(|g| g.free_milli == MILLI && g.free_mem_milli == MILLI).count()
    }
    /// Free compute of each GPU, in index order, written into `out`.
    pub fn free_milli_into(&self, out: &mut [u32; MAX_GPUS_PER_NODE]) -> usize {
        for (o, g) in out.iter_mut().zip(&self.gpus) {
            *o = g.free_milli;
        }
        self.gpus.len()
    }
    /// Whether GPU `g` can take `pod`'s per-GPU share.
    pub fn gpu_fits(&self, g: usize, pod: &Pod) -> bool {
        self.gpus.get(g).is_some_and(|g| g.free_milli >= pod.gpu_milli && g.free_mem_milli >= pod.gpu_mem_milli)
    }
    /// Whether `pod` fits this node: CPU, memory, pod count, GPU type and
    /// enough GPUs each with the per-GPU share free.
    pub fn fits(&self, pod: &Pod) -> bool {
        if self.cpu_free < pod.cpu_milli || self.mem_free_mib < pod.mem_mib || self.pods >= self.max_pods {
            return false;
        }
        if pod.gpu_count == 0 {
            return true;
        }
        if !pod.gpu_types.allows(self.gpu_type) || self.gpu_type.is_none() {
            return false;
        }
        let ok = (0..self.gpus.len()).filter(|&g| self.gpu_fits(g, pod)).count();
        ok >= pod.gpu_count as usize
    }
}

/// Kubernetes QoS class of a pod.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Qos {
    /// Latency sensitive.
    Ls,
    Burstable,
    /// Best effort.
    #[default]
    Be,
    Guaranteed,
    Other,
}

/// A pod's request. Build it with [`Pod::new`], which checks the
/// invariants the policies rely on.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Pod {
    cpu_milli: u64,
    mem_mib: u64,
    gpu_count: u32,
    gpu_milli: u32,
    gpu_mem_milli: u32,
    gpu_types: TypeSet,
    qos: Qos,
}

impl Pod {
    /// A pod asking for `gpu_count` GPUs with `gpu_milli` of each (compute
    /// and memory alike). A CPU-only pod has `gpu_count == 0` and
    /// `gpu_milli == 0`; a sharing pod has one GPU and `gpu_milli < 1000`; a
    /// pod with several GPUs takes them whole.
    pub fn new(cpu_milli: u64, mem_mib: u64, gpu_count: u32, gpu_milli: u32, gpu_types: TypeSet, qos: Qos) -> Result<Pod, ModelError> {
        if gpu_count == 0 && gpu_milli != 0 {
            return Err(ModelError::InvalidPod("gpu_milli must be 0 when no GPU is requested"));
        }
        if gpu_count > 0 && !(1..=MILLI).contains(&gpu_milli) {
            return Err(ModelError::InvalidPod("gpu_milli must be within 1..=1000"));
        }
        if gpu_count > 1 && gpu_milli != MILLI {
            return Err(ModelError::InvalidPod("a pod with several GPUs must take them whole"));
        }
        if gpu_count as usize > MAX_GPUS_PER_NODE {
            return Err(ModelError::InvalidPod("more GPUs than any node can have"));
        }
        Ok(Pod { cpu_milli, mem_mib, gpu_count, gpu_milli, gpu_mem_milli: gpu_milli, gpu_types, qos })
    }
    /// The same pod, with a per-GPU memory share different from its compute share.
    pub fn with_gpu_mem_milli(mut self, mem_milli: u32) -> Result<Pod, ModelError> {
        if self.gpu_count == 0 || !(1..=MILLI).contains(&mem_milli) {
            return Err(ModelError::InvalidPod("gpu memory share must be within 1..=1000 on a GPU pod"));
        }
        self.gpu_mem_milli = mem_milli;
        Ok(self)
    }
    pub fn cpu_milli(&self) -> u64 {
        self.cpu_milli
    }
    pub fn mem_mib(&self) -> u64 {
        self.mem_mib
    }
    pub fn gpu_count(&self) -> u32 {
        self.gpu_count
    }
    /// Per-GPU compute share, milli-GPU.
    pub fn gpu_milli(&self) -> u32 {
        self.gpu_milli
    }
    /// Per-GPU memory share, milli-GPU.
    pub fn gpu_mem_milli(&self) -> u32 {
        self.gpu_mem_milli
    }
    pub fn gpu_types(&self) -> TypeSet {
        self.gpu_types
    }
    pub fn qos(&self) -> Qos {
        self.qos
    }
    /// Total compute requested, milli-GPU.
    pub fn total_gpu_milli(&self) -> u64 {
        u64::from(self.gpu_count) * u64::from(self.gpu_milli)
    }
    /// Whether the pod shares one GPU with others.
    pub fn is_sharing(&self) -> bool {
        self.gpu_count == 1 && self.gpu_milli < MILLI
    }
    /// Pod class: 0 CPU-only, 1 sharing, 1+k for k whole GPUs (k ≤ 8), 10 otherwise.
    pub fn class(&self) -> usize {
        match self.gpu_count {
            0 => 0,
            1 if self.gpu_milli < MILLI => 1,
            k @ 1..=8 => 1 + k as usize,
            _ => CLASS_COUNT - 1,
        }
    }
}

/// One GPU's share in a placement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuShare {
    pub index: u8,
    pub milli: u32,
    pub mem_milli: u32,
}

/// Where a pod goes: the node, the exact GPUs and the share of each. The
/// simulator commits it as is; the Kubernetes extender takes its node and
/// hands its GPUs to the device plugin on the pod, which falls back to
/// best fit where it cannot follow them ([`crate::policy::BestFitInside`]
/// measures that). [`Cluster::release`]
/// takes it back.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    pub node: NodeId,
    pub gpus: Vec<GpuShare>,
    pub cpu_milli: u64,
    pub mem_mib: u64,
    pub class: u8,
}

impl Placement {
    /// `pod` on `node`, using the GPUs at `indices`.
    pub fn new(node: NodeId, pod: &Pod, indices: &[u8]) -> Placement {
        Placement {
            node,
            gpus: indices.iter().map(|&index| GpuShare { index, milli: pod.gpu_milli, mem_milli: pod.gpu_mem_milli }).collect(),
            cpu_milli: pod.cpu_milli,
            mem_mib: pod.mem_mib,
            class: pod.class() as u8,
        }
    }
    /// Total compute placed, milli-GPU.
    pub fn gpu_milli(&self) -> u64 {
        self.gpus.iter().map(|g| u64::from(g.milli)).sum()
    }
    /// Whether this is exactly what `pod` asks for on `node`: its CPU,
    /// memory and class, and its per-GPU share on `gpu_count` GPUs of a
    /// type it allows. [`Cluster::apply`] only checks that a placement
    /// fits; this checks that it is the pod's.
    pub fn serves(&self, pod: &Pod, node: &Node) -> bool {
        self.cpu_milli == pod.cpu_milli
            && self.mem_mib == pod.mem_mib
            && usize::from(self.class) == pod.class()
            && self.gpus.len() == pod.gpu_count as usize
            && self.gpus.iter().all(|g| g.milli == pod.gpu_milli && g.mem_milli == pod.gpu_mem_milli)
            && (pod.gpu_count == 0 || (node.gpu_type.is_some() && pod.gpu_types.allows(node.gpu_type)))
    }
}

/// A cluster: GPU-type catalog and nodes.
#[derive(Clone, Debug, Default)]
pub struct Cluster {
    types: Vec<GpuTypeInfo>,
    nodes: Vec<Node>,
    gpu_capacity_milli: u64,
    gpu_allocated_milli: u64,
    gpu_count: usize,
}

impl Cluster {
    pub fn new() -> Cluster {
        Cluster::default()
    }
    /// The id of GPU type `name`, adding it to the catalog if new.
    pub fn gpu_type_or_insert(&mut self, name: &str, memory_mib: u64) -> Result<GpuTypeId, ModelError> {
        if let Some(t) = self.gpu_type(name) {
            return Ok(t);
        }
        if self.types.len() >= MAX_GPU_TYPES {
            return Err(ModelError::TooManyGpuTypes);
        }
        self.types.push(GpuTypeInfo { name: name.to_string(), memory_mib });
        Ok(GpuTypeId((self.types.len() - 1) as u8))
    }
    /// The id of GPU type `name`, if the catalog has it.
    pub fn gpu_type(&self, name: &str) -> Option<GpuTypeId> {
        self.types.iter().position(|t| t.name == name).map(|i| GpuTypeId(i as u8))
    }
    pub fn gpu_types(&self) -> &[GpuTypeInfo] {
        &self.types
    }
    /// Add a node; all its GPUs start free.
    pub fn add_node(&mut self, spec: NodeSpec) -> Result<NodeId, ModelError> {
        if spec.nvlink_groups.len() > MAX_GPUS_PER_NODE {
            return Err(ModelError::TooManyGpus(spec.name));
        }
        if !spec.nvlink_groups.is_empty() && spec.gpu_type.is_none() {
            return Err(ModelError::GpusWithoutType(spec.name));
        }
        let gpus: Vec<Gpu> = spec.nvlink_groups.iter().map(|&nvlink_group| Gpu { free_milli: MILLI, free_mem_milli: MILLI, nvlink_group }).collect();
        self.gpu_capacity_milli += gpus.len() as u64 * u64::from(MILLI);
        self.gpu_count += gpus.len();
        self.nodes.push(Node {
            name: spec.name,
            gpu_type: spec.gpu_type,
            cpu_capacity: spec.cpu_milli,
            cpu_free: spec.cpu_milli,
            mem_capacity_mib: spec.memory_mib,
            mem_free_mib: spec.memory_mib,
            max_pods: spec.max_pods,
            pods: 0,
            gpus,
            class_counts: [0; CLASS_COUNT],
            version: next_version(),
        });
        Ok(self.nodes.len() - 1)
    }
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }
    /// Rename node `id`. Names only break ties between equal scores; the
    /// node's version changes so that no cached decision outlives it.
    pub fn rename_node(&mut self, id: NodeId, name: String) -> Result<(), ModelError> {
        let node = self.nodes.get_mut(id).ok_or(ModelError::NoSuchNode(id))?;
        node.name = name;
        node.version = next_version();
        Ok(())
    }
    pub fn node(&self, id: NodeId) -> Option<&Node> {
        self.nodes.get(id)
    }
    /// Number of GPUs in the cluster.
    pub fn gpu_count(&self) -> usize {
        self.gpu_count
    }
    /// Total GPU compute, milli-GPU.
    pub fn gpu_capacity_milli(&self) -> u64 {
        self.gpu_capacity_milli
    }
    /// GPU compute allocated to pods, milli-GPU.
    pub fn gpu_allocated_milli(&self) -> u64 {
        self.gpu_allocated_milli
    }

    /// Commit a placement, or refuse it whole if any part does not fit.
    pub fn apply(&mut self, p: &Placement) -> Result<(), ModelError> {
        let node = self.nodes.get_mut(p.node).ok_or(ModelError::NoSuchNode(p.node))?;
        let fail = |what| Err(ModelError::DoesNotFit { node: p.node, what });
        if node.cpu_free < p.cpu_milli {
            return fail("cpu");
        }
        if node.mem_free_mib < p.mem_mib {
            return fail("memory");
        }
        if node.pods >= node.max_pods {
            return fail("pod count");
        }
        check_gpus(node, p)?;
        for s in &p.gpus {
            let g = &node.gpus[usize::from(s.index)];
            if g.free_milli < s.milli || g.free_mem_milli < s.mem_milli {
                return fail("gpu share");
            }
        }
        for s in &p.gpus {
            let g = &mut node.gpus[usize::from(s.index)];
            g.free_milli -= s.milli;
            g.free_mem_milli -= s.mem_milli;
        }
        node.cpu_free -= p.cpu_milli;
        node.mem_free_mib -= p.mem_mib;
        node.pods += 1;
        if let Some(c) = node.class_counts.get_mut(usize::from(p.class)) {
            *c += 1;
        }
        node.version = next_version();
        self.gpu_allocated_milli += p.gpu_milli();
        Ok(())
    }

    /// Take back a placement made by [`Cluster::apply`].
    pub fn release(&mut self, p: &Placement) -> Result<(), ModelError> {
        let node = self.nodes.get_mut(p.node).ok_or(ModelError::NoSuchNode(p.node))?;
        let fail = |what| Err(ModelError::ReleaseMismatch { node: p.node, what });
        if node.cpu_free + p.cpu_milli > node.cpu_capacity {
            return fail("cpu");
        }
        if node.mem_free_mib + p.mem_mib > node.mem_capacity_mib {
            return fail("memory");
        }
        if node.pods == 0 {
            return fail("pod count");
        }
        check_gpus(node, p)?;
        for s in &p.gpus {
            let g = &node.gpus[usize::from(s.index)];
            if g.free_milli + s.milli > MILLI || g.free_mem_milli + s.mem_milli > MILLI {
                return fail("gpu share");
            }
        }
        for s in &p.gpus {
            let g = &mut node.gpus[usize::from(s.index)];
            g.free_milli += s.milli;
            g.free_mem_milli += s.mem_milli;
        }
        node.cpu_free += p.cpu_milli;
        node.mem_free_mib += p.mem_mib;
        node.pods -= 1;
        if let Some(c) = node.class_counts.get_mut(usize::from(p.class)) {
            *c = c.saturating_sub(1);
        }
        node.version = next_version();
        self.gpu_allocated_milli -= p.gpu_milli();
        Ok(())
    }
}

fn check_gpus(node: &Node, p: &Placement) -> Result<(), ModelError> {
    let mut seen = 0u64;
    for s in &p.gpus {
        let i = usize::from(s.index);
        if i >= node.gpus.len() {
            return Err(ModelError::NoSuchGpu { node: p.node, gpu: i });
        }
        if seen & (1u64 << i) != 0 {
            return Err(ModelError::DuplicateGpu { gpu: i });
        }
        seen |= 1u64 << i;
        if s.milli > MILLI || s.mem_milli > MILLI {
            return Err(ModelError::DoesNotFit { node: p.node, what: "share above one GPU" });
        }
    }
    if (p.class as usize) >= CLASS_COUNT {
        return Err(ModelError::DoesNotFit { node: p.node, what: "pod class" });
    }
    Ok(())
}
