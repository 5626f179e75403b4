//! eGPU cluster placement: a cluster model and placement policies.
//!
//! Contract:
//! - Pure: no IO, no clock, no global state other than a version counter;
//!   `#![forbid(unsafe_code)]`. The simulator (`egpu-sim`) and the
//!   Kubernetes scheduler extender (`egpu-k8s`) call exactly this code.
//! - [`Cluster`] keeps exact milli-GPU accounting: every GPU tracks free
//!   compute and memory in milli-GPU, and [`Cluster::apply`] /
//!   [`Cluster::release`] refuse anything that would over-allocate.
//! - Every [`Policy`] answers one pod at a time with a [`Placement`]: the
//!   node, the exact GPU indices and the milli-GPU on each, which always
//!   fits the cluster it was computed on. Policies may keep incremental
//!   state (caches keyed by [`Node::version`]) but never change the cluster.
//! - Policies honour GPU-type constraints ([`Pod::gpu_types`]), CPU, memory
//!   and pod-count limits.
//!
//! Modules: [`model`] (cluster, nodes, pods, placements), [`frag`]
//! (fragmentation against a target workload), [`policy`] (Random, DotProd,
//! GpuClustering, GpuPacking, BestFit, FGD and eGPU's own policy).
#![forbid(unsafe_code)]

pub mod frag;
pub mod model;
pub mod pack;
pub mod policy;

pub use frag::{TargetShape, TargetWorkload};
pub use model::{Cluster, Gpu, GpuShare, GpuTypeId, GpuTypeInfo, MILLI, ModelError, Node, NodeId, NodeSpec, Placement, Pod, Qos, TypeSet};
pub use policy::{Policy, PolicyKind};
