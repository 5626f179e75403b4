//! Placement policies behind one trait.
//!
//! Every policy returns a [`Placement`]: the node, the exact GPU indices and
//! the milli-GPU of each, which the simulator commits with
//! [`Cluster::apply`] as is. The Kubernetes extender scores nodes with the
//! policy and hands the policy's GPU inside the chosen node to the device
//! plugin on the pod (`egpu.io/gpu-hint`); where the plugin cannot follow
//! it, the GPU is its best fit, which [`BestFitInside`] reproduces. A policy may keep state between calls
//! (caches keyed by [`crate::Node::version`], a seeded random stream), so one
//! instance can follow a live cluster one pod at a time; it never changes
//! the cluster itself.

mod baselines;
mod cache;
mod egpu;
mod fgd;
mod gpusel;

pub use baselines::{BestFit, DotProd, GpuClustering, GpuPacking, RandomFit};
pub use egpu::EgpuPolicy;
pub use fgd::Fgd;

use crate::frag::TargetWorkload;
use crate::model::{Cluster, Placement, Pod};
use serde::{Deserialize, Serialize};

/// A placement policy.
pub trait Policy: Send {
    /// Short name, as used on the command line and in reports.
    fn name(&self) -> &str;
    /// Where `pod` should go on `cluster` as it is now, or `None` if it fits
    /// nowhere. The result always fits: `cluster.apply(&p)` succeeds.
    fn place(&mut self, cluster: &Cluster, pod: &Pod) -> Option<Placement>;
}

/// The policies this crate provides.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum PolicyKind {
    Random,
    DotProd,
    GpuClustering,
    GpuPacking,
    BestFit,
    Fgd,
    Egpu,
}

impl PolicyKind {
    /// All policies, baselines first.
    pub const ALL: [PolicyKind; 7] = [
        PolicyKind::Random,
        PolicyKind::DotProd,
        PolicyKind::GpuClustering,
        PolicyKind::GpuPacking,
        PolicyKind::BestFit,
        PolicyKind::Fgd,
        PolicyKind::Egpu,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Random => "random",
            PolicyKind::DotProd => "dotprod",
            PolicyKind::GpuClustering => "clustering",
            PolicyKind::GpuPacking => "packing",
            PolicyKind::BestFit => "bestfit",
            PolicyKind::Fgd => "fgd",
            PolicyKind::Egpu => "egpu",
        }
    }

    /// Parse a policy name (case-insensitive; `gpuclustering`, `gpupacking` also accepted).
    pub fn parse(s: &str) -> Option<PolicyKind> {
        let s = s.trim().to_ascii_lowercase();
        let s = s.strip_prefix("gpu").filter(|r| *r == "clustering" || *r == "packing").unwrap_or(&s);
        PolicyKind::ALL.into_iter().find(|k| k.name() == s)
    }

    /// A fresh policy. `target` is the workload FGD and eGPU measure
    /// fragmentation against; `seed` drives the random choices of Random; the
    /// other policies are deterministic.
    pub fn build(self, target: &TargetWorkload, seed: u64) -> Box<dyn Policy> {
        match self {
            PolicyKind::Random => Box::new(RandomFit::new(seed)),
            PolicyKind::DotProd => Box::new(DotProd::new()),
            PolicyKind::GpuClustering => Box::new(GpuClustering::new()),
            PolicyKind::GpuPacking => Box::new(GpuPacking::new()),
            PolicyKind::BestFit => Box::new(BestFit::new()),
            PolicyKind::Fgd => Box::new(Fgd::new(target.clone())),
            PolicyKind::Egpu => Box::new(EgpuPolicy::new(target.clone())),
        }
    }
}

/// A policy's node with the GPU inside it chosen by best fit: a sharing pod
/// goes to the fitting GPU with the least free compute (lowest index on
/// ties), whatever GPU the policy named. This is what a Kubernetes cluster
/// gets where the device plugin cannot follow a pod's GPU hint: the
/// extender scores nodes with the policy, and the kubelet's device plugin,
/// which then sees only the request's size, fills the tightest GPU that
/// fits (`docs/kubernetes.md`). The simulator measures it with
/// `--gpu-choice best-fit`. Pods of whole GPUs keep the policy's GPUs.
pub struct BestFitInside {
    inner: Box<dyn Policy>,
    name: String,
}

impl BestFitInside {
    pub fn new(inner: Box<dyn Policy>) -> Self {
        let name = format!("{}/bestfit-gpu", inner.name());
        BestFitInside { inner, name }
    }
}

impl Policy for BestFitInside {
    fn name(&self) -> &str {
        &self.name
    }
    fn place(&mut self, cluster: &Cluster, pod: &Pod) -> Option<Placement> {
        let p = self.inner.place(cluster, pod)?;
        if !pod.is_sharing() {
            return Some(p);
        }
        let gpus = gpusel::best_fit(cluster.node(p.node)?, pod)?;
        Some(Placement::new(p.node, pod, &gpus))
    }
}

/// Keeps the node with the highest score; equal scores go to the node with
/// the smallest name. This is the tie-break of the scheduler the FGD paper
/// measured (its vendored Kubernetes scheduler replaces the upstream random
/// tie-break with this one), so the baselines and FGD use it too.
pub(crate) struct MaxPicker<'a, T> {
    best: Option<(i64, &'a str, T)>,
}

impl<'a, T> MaxPicker<'a, T> {
    pub(crate) fn new() -> Self {
        MaxPicker { best: None }
    }
    pub(crate) fn offer(&mut self, score: i64, name: &'a str, item: T) {
        let better = match &self.best {
            None => true,
            Some((s, n, _)) => score > *s || (score == *s && name < *n),
        };
        if better {
            self.best = Some((score, name, item));
        }
    }
    pub(crate) fn take(self) -> Option<T> {
        self.best.map(|b| b.2)
    }
}
