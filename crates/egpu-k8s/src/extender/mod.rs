//! The scheduler extender: kube-scheduler's HTTP extender protocol
//! (`filter`, `prioritize`, `bind`, `preempt`), with eGPU's placement policy.
//!
//! - **Filter** keeps the nodes where every container's `egpu.io/gpu-memory`
//!   request fits on one GPU, from the node's `egpu.io/gpus` annotation
//!   ([`crate::annotation`]) less the units of pods this extender bound
//!   there that the annotation does not count yet ([`crate::assume`]). The
//!   scheduler itself only compares the node's total; a node whose free
//!   memory is split over GPUs would take the pod and the device plugin
//!   would then refuse it. Each refused node gets the reason.
//! - **Prioritize** scores the nodes left with [`egpu_place::policy::EgpuPolicy`]'s
//!   cost, the policy `egpu simulate` measures: the node it would pick gets
//!   10, the others 9 less the rank of their cost among the distinct costs
//!   (a node as good as the pick but later by name gets 9). The fragmentation it measures
//!   is against the shapes of the last [`WINDOW`] pods the extender saw.
//! - **Bind** binds the pod through the API server, as kube-scheduler's own
//!   binder does, and assumes its units on the node until the node's
//!   annotation says the pod holds them all (or `assume_ttl` passes). What race remains is
//!   in `docs/kubernetes.md`, "Limits".
//! - **Preempt** keeps the candidate nodes where the scheduler's victims,
//!   their units given back to the GPUs they hold (the annotation's
//!   `holds`), make room as `filter` judges it ([`Extender::preempt`]).
//! - **Nodes**: with API access the extender keeps a node cache (the eGPU
//!   nodes' annotations, listed and watched), so the scheduler may send
//!   node names (`nodeCacheCapable: true`); Node objects are read as sent
//!   either way. Without API access (`--no-bind`) the scheduler must send
//!   Node objects (`nodeCacheCapable: false`).
//!
//! The wire types are written from the published `k8s.io/kube-scheduler/
//! extender/v1` types; field names are Go's (capitalised), and the older
//! lower-case spellings are accepted too.
//!
//! The parts: `wire` (the protocol's JSON types), `demand` (what a pod
//! asks), `cache` (the node cache), `bind` (bind and resync), `preempt`,
//! and `http` (the routes); filter and prioritize are here.

use crate::annotation::{AnnotationError, NodeGpus};
use crate::assume::Assumed;
use egpu_place::policy::{EgpuPolicy, Policy};
use egpu_place::{Cluster, NodeSpec, Placement, Pod, Qos, TargetWorkload, TypeSet};
use serde_json::Value;
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod bind;
mod cache;
mod demand;
mod http;
mod preempt;
#[cfg(test)]
mod tests;
mod wire;

pub use cache::NodeCache;
pub use demand::{Demand, whole_quantity};
pub use http::{metrics_router, router};
pub use wire::{BindingArgs, BindingResult, ExtenderArgs, FilterResult, HostPriority, MetaPod, MetaVictims, NodeList, PreemptionArgs, PreemptionResult, RequestError, Victims};

/// How many recent pods' shapes the fragmentation target is taken from.
pub const WINDOW: usize = 1000;
/// The most a node may score (the protocol's MaxExtenderPriority).
pub const MAX_SCORE: i64 = 10;

fn node_name(node: &Value) -> &str {
    node["metadata"]["name"].as_str().unwrap_or("")
}

/// The extender: its resource name, the recent pods' demands, and, when it
/// binds, the units it has bound pods to ([`crate::assume`]).
pub struct Extender {
    resource: String,
    recent: Mutex<Recent>,
    assumed: Mutex<Assumed>,
    assume_ttl: Duration,
    api: Option<kube::Client>,
    nodes: Option<Arc<NodeCache>>,
    metrics: crate::metrics::ExtenderMetrics,
}

/// The candidate nodes of a request: Node objects as sent, or names looked
/// up in the node cache.
enum Candidates {
    Objects(Vec<Value>),
    Names(Vec<String>),
}

impl Candidates {
    /// The nodes' names, in the request's order.
    fn names(&self) -> Vec<String> {
        match self {
            Candidates::Objects(items) => items.iter().map(|n| node_name(n).to_string()).collect(),
            Candidates::Names(names) => names.clone(),
        }
    }
}

impl std::fmt::Debug for Extender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Extender").field("resource", &self.resource).field("assume_ttl", &self.assume_ttl).field("api", &self.api.is_some()).finish_non_exhaustive()
    }
}

/// How often the extender looks for bound, pending pods it has not assumed
/// ([`Extender::resync`]).
pub const RESYNC_EVERY: Duration = Duration::from_secs(30);
/// The longest one resync's list may take.
const RESYNC_DEADLINE: Duration = Duration::from_secs(20);
/// How long an assumption lasts when the node's annotation does not name
/// the pod (see [`crate::assume`]).
pub const DEFAULT_ASSUME_TTL: Duration = Duration::from_secs(120);
/// The longest a bind may take, its API calls together: under the
/// scheduler's `httpTimeout` for the extender (5 s by default;
/// `deploy/egpu-scheduler.yaml` sets 10 s), so that the answer, not the
/// scheduler's timeout, ends the call.
pub const BIND_DEADLINE: Duration = Duration::from_secs(4);

/// The last [`WINDOW`] containers' units, each pod counted once (a pod the
/// scheduler retries must not fill the window with its own shape).
#[derive(Debug, Default)]
struct Recent {
    units: VecDeque<(String, u32)>,
    pods: std::collections::HashSet<String>,
}

impl Extender {
    pub fn new(resource: &str) -> Extender {
        Extender { resource: resource.into(), recent: Mutex::new(Recent::default()), assumed: Mutex::new(Assumed::default()), assume_ttl: DEFAULT_ASSUME_TTL, api: None, nodes: None, metrics: Default::default() }
    }

    /// With API access, `bind` binds pods (else it answers why it cannot).
    pub fn with_api(mut self, client: kube::Client) -> Extender {
        self.api = Some(client);
        self
    }

    /// With a node cache, requests may name nodes instead of sending them
    /// (`nodeCacheCapable: true`).
    pub fn with_node_cache(mut self, cache: Arc<NodeCache>) -> Extender {
        self.nodes = Some(cache);
        self
    }

    /// How long an assumption lasts without the node's annotation naming
    /// the pod.
    pub fn with_assume_ttl(mut self, ttl: Duration) -> Extender {
        self.assume_ttl = ttl;
        self
    }

    /// The node's annotation less what this extender bound there that the
    /// annotation does not count yet; `full`: with the pod lists (`pods`,
    /// `holds`) however it stands.
    fn free_from(&self, name: &str, value: Option<&str>, full: bool) -> Result<NodeGpus, AnnotationError> {
        self.viewed(name, full, |with_pods| NodeGpus::parse_with(value, with_pods), None)
    }

    /// [`Extender::free_from`] for an annotation the node cache parsed: its
    /// GPUs copied, and its pod lists only where needed; without the
    /// assumption of pod `except`, if any.
    fn free_from_parsed(&self, name: &str, parsed: &Result<Arc<NodeGpus>, AnnotationError>, full: bool, except: Option<&str>) -> Result<NodeGpus, AnnotationError> {
        let parsed = parsed.as_ref().map_err(Clone::clone)?;
        self.viewed(name, full, |with_pods| Ok(if with_pods { NodeGpus::clone(parsed) } else { parsed.gpus_only() }), except)
    }

    /// The annotation `read` gives (with its pod lists when asked for) less
    /// the node's assumptions (but that of pod `except`, if any). The pod
    /// lists only where `full` or something is assumed: an assumption made
    /// between these two locks and read without the list is kept (and
    /// counted) until the next request, which errs on the safe side.
    fn viewed(&self, name: &str, full: bool, read: impl FnOnce(bool) -> Result<NodeGpus, AnnotationError>, except: Option<&str>) -> Result<NodeGpus, AnnotationError> {
        let with_pods = full || self.assumed.lock().expect("assume lock").has(name);
        let g = read(with_pods)?;
        Ok(self.assumed.lock().expect("assume lock").view_except(name, g, Instant::now(), self.assume_ttl, except))
    }

    /// The request's candidates: Node objects, else names with a node cache.
    fn candidates(&self, nodes: Option<NodeList>, names: Option<Vec<String>>) -> Result<Candidates, RequestError> {
        match (nodes, names, &self.nodes) {
            (Some(n), _, _) => Ok(Candidates::Objects(n.items)),
            (None, Some(_), Some(cache)) if !cache.synced() => Err(RequestError::NotSynced),
            (None, Some(names), Some(_)) => Ok(Candidates::Names(names)),
            (None, Some(_), None) => Err(RequestError::NoNodes),
            (None, None, _) => Err(RequestError::NoCandidates),
        }
    }

    /// Each candidate's name and what it has free, or why that is unknown;
    /// `full` as in [`Extender::free_from`].
    fn frees(&self, c: &Candidates, full: bool) -> Vec<(String, Result<NodeGpus, String>)> {
        match c {
            Candidates::Objects(items) => items
                .iter()
                .map(|n| {
                    let name = node_name(n);
                    (name.to_string(), self.free_from(name, n["metadata"]["annotations"][crate::annotation::ANNOTATION].as_str(), full).map_err(|e| e.to_string()))
                })
                .collect(),
            Candidates::Names(names) => {
                let cache = self.nodes.as_ref().expect("names only with a cache");
                let (selector, cache) = (&cache.selector, cache.annotations.read().expect("node cache lock"));
                names
                    .iter()
                    .map(|name| {
                        let free = match cache.get(name) {
                            None => Err(format!("node is not in this extender's node cache: not selected by '{selector}', or not seen yet")),
                            Some(parsed) => self.free_from_parsed(name, parsed, full, None).map_err(|e| e.to_string()),
                        };
                        (name.clone(), free)
                    })
                    .collect()
            }
        }
    }

    /// A scrape of the extender's metrics.
    pub fn metrics_text(&self) -> String {
        self.metrics.render(self.assumed(), self.nodes.as_ref().map(|c| (c.len(), c.synced())))
    }

    /// Live assumptions (bound pods the nodes' annotations do not count yet).
    pub fn assumed(&self) -> usize {
        self.assumed.lock().expect("assume lock").live(Instant::now(), self.assume_ttl)
    }

    /// `filter`.
    pub fn filter(&self, args: ExtenderArgs) -> FilterResult {
        let mut out = FilterResult::default();
        let fail = |e: RequestError| FilterResult { error: e.to_string(), ..Default::default() };
        let Some(pod) = args.pod.filter(Value::is_object) else { return fail(RequestError::NoPod) };
        let candidates = match self.candidates(args.nodes, args.node_names) {
            Ok(c) => c,
            Err(e) => return fail(e),
        };
        let demand = match Demand::of_pod(&pod, &self.resource) {
            Ok(d) => d,
            Err(e) => return fail(e),
        };
        let mut keep = vec![true; match &candidates {
            Candidates::Objects(o) => o.len(),
            Candidates::Names(n) => n.len(),
        }];
        if !demand.units.is_empty() {
            let uid = pod["metadata"]["uid"].as_str().unwrap_or("");
            self.observe(uid, &demand);
            self.assumed.lock().expect("assume lock").remember(uid, &demand.in_order);
            for (k, (name, free)) in self.frees(&candidates, false).into_iter().enumerate() {
                match free {
                    Err(e) => {
                        out.failed_and_unresolvable_nodes.insert(name, format!("egpu: {e}"));
                        keep[k] = false;
                    }
                    Ok(g) => match demand.misfit(&g) {
                        None => {}
                        // Preemption cannot help: the scheduler need not try it here.
                        Some(why) if demand.never_fits(&g) => {
                            out.failed_and_unresolvable_nodes.insert(name, format!("egpu: {why}, even with every GPU of the node free"));
                            keep[k] = false;
                        }
                        Some(why) => {
                            out.failed_nodes.insert(name, format!("egpu: {why}"));
                            keep[k] = false;
                        }
                    },
                }
            }
            let (failed, unresolvable) = (out.failed_nodes.len(), out.failed_and_unresolvable_nodes.len());
            self.metrics.filtered(keep.iter().filter(|k| **k).count(), failed, unresolvable);
        }
        let mut keep = keep.into_iter();
        match candidates {
            Candidates::Objects(mut items) => {
                items.retain(|_| keep.next().unwrap_or(false));
                out.nodes = Some(NodeList { items });
            }
            Candidates::Names(mut names) => {
                names.retain(|_| keep.next().unwrap_or(false));
                out.node_names = Some(names);
            }
        }
        out
    }

    fn observe(&self, uid: &str, d: &Demand) {
        let mut r = self.recent.lock().expect("recent lock");
        if !uid.is_empty() && !r.pods.insert(uid.to_string()) {
            return;
        }
        for &u in &d.units {
            if r.units.len() == WINDOW
                && let Some((old, _)) = r.units.pop_front()
                && !r.units.iter().any(|(p, _)| *p == old)
            {
                r.pods.remove(&old);
            }
            r.units.push_back((uid.to_string(), u));
        }
    }

    /// The recent containers' units (the fragmentation target's window).
    fn recent_units(&self) -> Vec<u32> {
        self.recent.lock().expect("recent lock").units.iter().map(|(_, u)| *u).collect()
    }

    /// The policy's GPU (its UUID) for each of the containers of `pod`
    /// (`namespace/name`; units in the pod's order) on `node`: placed one
    /// after another, as the kubelet admits them, on what the node has free
    /// (its annotation in the node cache, less what is assumed there for
    /// other pods), against the same target as [`Extender::prioritize`].
    /// `None` for a container that does not fit and for a container of
    /// whole GPUs (the plugin picks those by its own rule, which is what
    /// the model then takes off for the containers after it), and for
    /// every container when the node is not in the node cache, its
    /// annotation cannot be read, or its GPUs differ in size.
    fn hint(&self, node: &str, pod: &str, in_order: &[u32]) -> Vec<Option<String>> {
        let none = vec![None; in_order.len()];
        let Some(parsed) = self.nodes.as_ref().and_then(|c| c.annotations.read().expect("node cache lock").get(node).cloned()) else { return none };
        let Ok(g) = self.free_from_parsed(node, &parsed, false, Some(pod)) else { return none };
        let Some(units) = g.gpus.first().map(|x| x.units).filter(|&u| g.gpus.iter().all(|x| x.units == u)) else { return none };
        let (Some(mut model), Some(&largest)) = (Model::new(units), in_order.iter().max()) else { return none };
        let (Some(first), Some(id)) = (model.shape(largest), model.add(node, &g)) else { return none };
        let mut policy = EgpuPolicy::new(model.target(&self.recent_units(), &first));
        // What the node has free as the containers go in, by the plugin's
        // rules (for whole GPUs: the ones its preferred allocation takes).
        let mut left = g.gpus_only();
        in_order
            .iter()
            .map(|&u| {
                let pod = model.shape(u)?;
                if u > units {
                    let before: Vec<u32> = left.gpus.iter().map(|x| x.free).collect();
                    if !left.take(u) {
                        return None;
                    }
                    let taken: Vec<u8> = left.gpus.iter().zip(before).enumerate().filter(|(_, (x, b))| x.free < *b).filter_map(|(i, _)| u8::try_from(i).ok()).collect();
                    let _ = model.cluster.apply(&Placement::new(id, &pod, &taken));
                    return None;
                }
                let p = policy.place(&model.cluster, &pod)?;
                model.cluster.apply(&p).ok()?;
                let uuid = g.gpus.get(usize::from(p.gpus.first()?.index))?.uuid.clone();
                // Milli-GPU rounds: with more than 1,000 units a GPU, the
                // model may fit a container a unit short; no hint then.
                left.take_on(&uuid, u).then_some(uuid)
            })
            .collect()
    }

    /// `prioritize`: every candidate node with a score from 0 to 10.
    pub fn prioritize(&self, args: ExtenderArgs) -> Result<Vec<HostPriority>, RequestError> {
        let pod = args.pod.filter(Value::is_object).ok_or(RequestError::NoPod)?;
        let candidates = self.candidates(args.nodes, args.node_names)?;
        let demand = Demand::of_pod(&pod, &self.resource)?;
        let mut scores: Vec<HostPriority> = candidates.names().into_iter().map(|host| HostPriority { host, score: 0 }).collect();
        let Some(&largest) = demand.units.first() else {
            return Ok(scores);
        };
        let frees = self.frees(&candidates, false);
        let recent = self.recent_units();
        // Nodes grouped by units per GPU: a pod's share of a GPU depends on its size.
        let mut groups: BTreeMap<u32, Vec<(usize, NodeGpus)>> = BTreeMap::new();
        for (i, (_, free)) in frees.into_iter().enumerate() {
            if let Ok(g) = free
                && let Some(units) = g.gpus.first().map(|x| x.units).filter(|&u| u > 0)
            {
                groups.entry(units).or_default().push((i, g));
            }
        }
        let mut keys: Vec<(usize, (i64, bool))> = Vec::new();
        for (units, members) in groups {
            let Some(mut model) = Model::new(units) else { continue };
            let Some(pod) = model.shape(largest) else { continue };
            let ids: Vec<_> = members.iter().filter_map(|(i, g)| Some((model.add(&scores[*i].host, g)?, *i))).collect();
            let node_keys = EgpuPolicy::new(model.target(&recent, &pod)).node_keys(&model.cluster, &pod);
            for (id, i) in ids {
                if let Some(k) = node_keys[id] {
                    keys.push((i, k));
                }
            }
        }
        // The policy's pick (smallest key, then name) gets 10; every other
        // node 9 less the rank of its key among the distinct keys.
        let mut distinct: Vec<(i64, bool)> = keys.iter().map(|(_, k)| *k).collect();
        distinct.sort_unstable();
        distinct.dedup();
        let pick = keys.iter().min_by(|a, b| a.1.cmp(&b.1).then_with(|| scores[a.0].host.cmp(&scores[b.0].host))).map(|(i, _)| *i);
        for (i, k) in keys {
            let rank = distinct.binary_search(&k).expect("key listed") as i64;
            scores[i].score = if Some(i) == pick { MAX_SCORE } else { (MAX_SCORE - 1 - rank).max(0) };
        }
        Ok(scores)
    }
}

/// A one-GPU pod of `milli` on GPUs of type `ty` (None when out of range).
fn sharing_pod(milli: u32, ty: egpu_place::GpuTypeId) -> Option<Pod> {
    Pod::new(0, 0, 1, milli.clamp(1, 1000), TypeSet::only(ty), Qos::Be).ok()
}

/// The placement model of nodes whose GPUs have `units` units each, as
/// [`Extender::prioritize`] scores them and [`Extender::hint`] places a
/// bound pod's containers: one GPU type, a container's units as milli-GPU
/// (rounded up), unlimited CPU and memory.
struct Model {
    cluster: Cluster,
    ty: egpu_place::GpuTypeId,
    units: u32,
}

impl Model {
    fn new(units: u32) -> Option<Model> {
        let mut cluster = Cluster::new();
        let ty = cluster.gpu_type_or_insert(&format!("{units}u"), u64::from(units)).ok()?;
        (units > 0).then_some(Model { cluster, ty, units })
    }

    fn milli(&self, u: u32) -> u32 {
        ((u64::from(u) * 1000).div_ceil(u64::from(self.units))).clamp(1, 1000) as u32
    }

    /// A container of `u` units: a sharing pod, or (larger than one GPU) a
    /// pod of whole GPUs.
    fn shape(&self, u: u32) -> Option<Pod> {
        if u > self.units { Pod::new(0, 0, u.div_ceil(self.units), 1000, TypeSet::only(self.ty), Qos::Be).ok() } else { sharing_pod(self.milli(u), self.ty) }
    }

    /// Adds a node with what its GPUs have free.
    fn add(&mut self, name: &str, g: &NodeGpus) -> Option<egpu_place::NodeId> {
        let spec = NodeSpec {
            name: name.to_string(),
            cpu_milli: u64::MAX / 4,
            memory_mib: u64::MAX / 4,
            gpu_type: Some(self.ty),
            // The GPUs' NVLink groups where the node's plugin reports them
            // (else each GPU its own, joined to none). The node's cost does
            // not read them (it takes the lowest fitting GPUs, as FGD's
            // measure does); the policy's own choice of whole GPUs does.
            nvlink_groups: g.gpus.iter().take(egpu_place::model::MAX_GPUS_PER_NODE).enumerate().map(|(i, x)| x.nvlink.and_then(|g| u8::try_from(g).ok()).unwrap_or(i as u8)).collect(),
            max_pods: u32::MAX,
        };
        let id = self.cluster.add_node(spec).ok()?;
        for (gi, gpu) in g.gpus.iter().enumerate().take(egpu_place::model::MAX_GPUS_PER_NODE) {
            // Used milli rounded down, so free milli rounds up as a pod's
            // demand does (`milli`): a pod of exactly the free units fits
            // its hole (79-unit GPUs, 10 free: 127 milli free against a
            // 10-unit pod's 127, not 126).
            let used = (u64::from(gpu.units - gpu.free.min(gpu.units)) * 1000 / u64::from(gpu.units.max(1))) as u32;
            if let Some(p) = (used > 0).then(|| sharing_pod(used, self.ty)).flatten() {
                let _ = self.cluster.apply(&Placement::new(id, &p, &[gi as u8]));
            }
        }
        Some(id)
    }

    /// The fragmentation target: the recent containers' shapes (95%), or
    /// `pod` alone before any.
    fn target(&self, recent: &[u32], pod: &Pod) -> TargetWorkload {
        let shapes: Vec<Pod> = recent.iter().filter_map(|&u| self.shape(u)).collect();
        if shapes.is_empty() { TargetWorkload::from_pods([pod], 1.0) } else { TargetWorkload::from_pods(&shapes, 0.95) }
    }
}
