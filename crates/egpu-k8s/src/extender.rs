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

use crate::annotation::{AnnotationError, NodeGpus};
use crate::assume::Assumed;
use egpu_place::policy::EgpuPolicy;
use egpu_place::{Cluster, NodeSpec, Placement, Pod, Qos, TargetWorkload, TypeSet};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// How many recent pods' shapes the fragmentation target is taken from.
pub const WINDOW: usize = 1000;
/// The most a node may score (the protocol's MaxExtenderPriority).
pub const MAX_SCORE: i64 = 10;

/// `ExtenderArgs`: the pod and the candidate nodes.
#[derive(Debug, Deserialize)]
pub struct ExtenderArgs {
    #[serde(rename = "Pod", alias = "pod")]
    pub pod: Option<Value>,
    #[serde(rename = "Nodes", alias = "nodes")]
    pub nodes: Option<NodeList>,
    #[serde(rename = "NodeNames", alias = "nodenames")]
    pub node_names: Option<Vec<String>>,
}

/// `v1.NodeList`, kept as JSON: the nodes that pass go back as they came.
#[derive(Debug, Default, Deserialize, Serialize)]
pub struct NodeList {
    #[serde(default)]
    pub items: Vec<Value>,
}

/// `ExtenderFilterResult`.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct FilterResult {
    #[serde(rename = "Nodes", skip_serializing_if = "Option::is_none")]
    pub nodes: Option<NodeList>,
    #[serde(rename = "NodeNames", skip_serializing_if = "Option::is_none")]
    pub node_names: Option<Vec<String>>,
    #[serde(rename = "FailedNodes")]
    pub failed_nodes: BTreeMap<String, String>,
    #[serde(rename = "FailedAndUnresolvableNodes")]
    pub failed_and_unresolvable_nodes: BTreeMap<String, String>,
    #[serde(rename = "Error")]
    pub error: String,
}

/// `HostPriority`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostPriority {
    #[serde(rename = "Host")]
    pub host: String,
    #[serde(rename = "Score")]
    pub score: i64,
}

/// `ExtenderPreemptionArgs`: the pod, and the victims the scheduler chose
/// on each candidate node: UIDs only (`NodeNameToMetaVictims`) when the
/// extender is `nodeCacheCapable`, else whole pods (`NodeNameToVictims`).
#[derive(Debug, Deserialize)]
pub struct PreemptionArgs {
    #[serde(rename = "Pod", alias = "pod")]
    pub pod: Option<Value>,
    #[serde(rename = "NodeNameToVictims", alias = "nodeNameToVictims", default)]
    pub node_name_to_victims: Option<BTreeMap<String, Victims>>,
    #[serde(rename = "NodeNameToMetaVictims", alias = "nodeNameToMetaVictims", default)]
    pub node_name_to_meta_victims: Option<BTreeMap<String, MetaVictims>>,
}

/// `Victims`: whole pods.
#[derive(Debug, Deserialize)]
pub struct Victims {
    #[serde(rename = "Pods", alias = "pods", default)]
    pub pods: Vec<Value>,
    #[serde(rename = "NumPDBViolations", alias = "numPDBViolations", default)]
    pub num_pdb_violations: i64,
}

/// `MetaVictims`: the victims' UIDs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaVictims {
    #[serde(rename = "Pods", alias = "pods", default)]
    pub pods: Vec<MetaPod>,
    #[serde(rename = "NumPDBViolations", alias = "numPDBViolations", default)]
    pub num_pdb_violations: i64,
}

/// `MetaPod`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaPod {
    #[serde(rename = "UID", alias = "uid")]
    pub uid: String,
}

/// `ExtenderPreemptionResult`: the candidate nodes kept, with their victims
/// (always by UID, whichever form came in).
#[derive(Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreemptionResult {
    #[serde(rename = "NodeNameToMetaVictims")]
    pub node_name_to_meta_victims: BTreeMap<String, MetaVictims>,
}

/// A request the extender cannot answer; it goes back in `Error`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("the request has no Pod")]
    NoPod,
    #[error("the request has no Nodes, and this extender keeps no node cache (it runs with --no-bind, without API access): configure it with nodeCacheCapable: false, so that the scheduler sends Node objects (their egpu.io/gpus annotation is what it reads), or run it with API access")]
    NoNodes,
    #[error("the request has neither Nodes nor NodeNames")]
    NoCandidates,
    #[error("this extender's node cache has not been filled yet (it cannot list the nodes; its log says why): the scheduler retries the pod")]
    NotSynced,
    #[error("container '{container}' asks for {resource}: '{value}', which is not a whole number of units")]
    BadQuantity { container: String, resource: String, value: String },
    #[error("an init container asks for {resource}: not supported (an init container's units pass to the app containers after it); give the memory to the app containers only")]
    InitContainer { resource: String },
    #[error("container '{container}' asks for {resource} {requests} in requests but {limits} in limits: an extended resource must have both equal")]
    Mismatch { container: String, resource: String, requests: u64, limits: u64 },
}

/// What a pod asks for: one GPU's worth of units per container that asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Demand {
    /// Units per container, largest first.
    pub units: Vec<u32>,
    /// Units per container, in the pod's order (the kubelet allocates the
    /// containers in that order).
    pub in_order: Vec<u32>,
}

impl Demand {
    /// Reads the resource requests of the pod's containers. Init containers
    /// that ask are refused: the kubelet lends their devices to the app
    /// containers after them, which would put two slices on one set of units.
    pub fn of_pod(pod: &Value, resource: &str) -> Result<Demand, RequestError> {
        let spec = &pod["spec"];
        let read = |key: &str| -> Result<Vec<u32>, RequestError> {
            let mut out = Vec::new();
            for c in spec[key].as_array().map(Vec::as_slice).unwrap_or_default() {
                let name = c["name"].as_str().unwrap_or("?").to_string();
                let get = |which: &str| -> Result<Option<u64>, RequestError> {
                    match &c["resources"][which][resource] {
                        Value::Null => Ok(None),
                        v => {
                            let text = v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string());
                            whole_quantity(&text).map(Some).ok_or_else(|| RequestError::BadQuantity {
                                container: name.clone(),
                                resource: resource.into(),
                                value: egpu_core::slice::shown(&text),
                            })
                        }
                    }
                };
                let (req, lim) = (get("requests")?, get("limits")?);
                if let (Some(r), Some(l)) = (req, lim)
                    && r != l
                {
                    return Err(RequestError::Mismatch { container: name, resource: resource.into(), requests: r, limits: l });
                }
                let n = lim.or(req).unwrap_or(0);
                if n > 0 {
                    out.push(u32::try_from(n).unwrap_or(u32::MAX));
                }
            }
            Ok(out)
        };
        if !read("initContainers")?.is_empty() {
            return Err(RequestError::InitContainer { resource: resource.into() });
        }
        let in_order = read("containers")?;
        let mut units = in_order.clone();
        units.sort_unstable_by(|a, b| b.cmp(a));
        Ok(Demand { units, in_order })
    }

    /// Whether no eviction could make room for the containers on these
    /// GPUs: they ask for more units than the node has, or one of them is
    /// larger than every GPU and no GPU size divides it with enough GPUs of
    /// that size. Only these sure cases: with whole GPUs of mixed sizes,
    /// the placement of an empty node is not always the best one (32 + 16
    /// units on GPUs of 16, 16, 8, 8, 8, 8 misfit empty, and fit once the
    /// 32 takes the four 8s), so a misfit on an empty node proves nothing.
    pub fn never_fits(&self, gpus: &NodeGpus) -> bool {
        let total: u64 = gpus.gpus.iter().map(|g| u64::from(g.units)).sum();
        if self.units.iter().map(|&u| u64::from(u)).sum::<u64>() > total {
            return true;
        }
        let largest = gpus.gpus.iter().map(|g| g.units).max().unwrap_or(0);
        let of_size = |s: u32| gpus.gpus.iter().filter(|g| g.units == s).count() as u64;
        self.units.iter().any(|&u| u > largest && !gpus.gpus.iter().any(|g| g.units > 0 && u % g.units == 0 && of_size(g.units) >= u64::from(u / g.units)))
    }

    /// Whether the containers fit on the GPUs' free units (each container on
    /// one GPU, several may share one; or whole GPUs for a container larger
    /// than one), placed as the plugin places them, largest first. `None`
    /// if they fit, else the reason.
    pub fn misfit(&self, gpus: &NodeGpus) -> Option<String> {
        let mut left = gpus.gpus_only();
        for &u in &self.units {
            if left.take(u) {
                continue;
            }
            let gib = |n: u32| n as f64 * gpus.unit_bytes as f64 / f64::from(1u32 << 30);
            let largest = gpus.gpus.iter().map(|g| g.free).max().unwrap_or(0);
            let per = gpus.gpus.iter().map(|g| g.units).max().unwrap_or(0);
            return Some(if u > per {
                let whole = gpus.gpus.iter().filter(|g| g.units > 0 && g.free == g.units).count();
                if per > 0 && u % per == 0 {
                    format!("a container asks for {u} units ({} whole GPUs of {per}); {whole} GPU(s) are entirely free", u / per)
                } else {
                    format!("a container asks for {u} units, more than one GPU ({per}): a multi-GPU container takes whole GPUs, so ask for a multiple of {per}")
                }
            } else if self.units.len() == 1 {
                format!("no GPU has {u} units ({:.1} GiB) free; the most free on one GPU is {largest} ({:.1} GiB)", gib(u), gib(largest))
            } else {
                format!(
                    "the containers' {:?} units do not fit the GPUs' free units {:?} (each container's memory comes from one GPU)",
                    self.units,
                    gpus.gpus.iter().map(|g| g.free).collect::<Vec<_>>()
                )
            });
        }
        None
    }
}

/// A Kubernetes quantity that is a whole number: `10`, `2k` (2000), `2Ki`
/// (2048), `1e3`, `1500m` is not (1.5), `1.5k` is (1500). The API server
/// stores quantities in canonical form, so a request of 2000 comes back as
/// `2k`. `None` for anything else.
pub fn whole_quantity(text: &str) -> Option<u64> {
    let t = text.trim();
    let digits_end = t.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+')).unwrap_or(t.len());
    let (num, suffix) = t.split_at(digits_end);
    let num = num.strip_prefix('+').unwrap_or(num);
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty() && frac.is_empty() || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()) || frac.len() > 18 || int.len() > 20 {
        return None;
    }
    // value = mantissa × 10^exp10 × 2^exp2, mantissa = int.frac as an integer.
    let mantissa: u128 = format!("{int}{frac}").parse().ok()?;
    let (mut exp10, exp2): (i32, u32) = match suffix {
        "" => (0, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        e if e.starts_with(['e', 'E']) => (e[1..].parse::<i32>().ok().filter(|x| x.abs() <= 30)?, 0),
        _ => return None,
    };
    exp10 -= frac.len() as i32;
    let mut v = mantissa.checked_mul(1u128.checked_shl(exp2)?)?;
    if exp10 >= 0 {
        v = v.checked_mul(10u128.checked_pow(exp10 as u32)?)?;
    } else {
        let d = 10u128.checked_pow(exp10.unsigned_abs())?;
        if v % d != 0 {
            return None;
        }
        v /= d;
    }
    u64::try_from(v).ok()
}

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

/// The eGPU nodes' `egpu.io/gpus` annotations, followed from the API server
/// (metadata only), for a scheduler that sends node names
/// (`nodeCacheCapable: true`) instead of whole Node objects.
#[derive(Debug, Default)]
pub struct NodeCache {
    /// The label selector followed, for the reason a node is unknown.
    selector: String,
    /// Each node's annotation, parsed when it arrives (a filter then reads
    /// no JSON), or why it cannot be used.
    annotations: RwLock<HashMap<String, Result<Arc<NodeGpus>, AnnotationError>>>,
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
fn annotation_of(m: &kube::api::ObjectMeta) -> Result<Arc<NodeGpus>, AnnotationError> {
    NodeGpus::parse(m.annotations.as_ref().and_then(|a| a.get(crate::annotation::ANNOTATION)).map(String::as_str)).map(Arc::new)
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

/// `ExtenderBindingArgs`: the pod and the node the scheduler chose.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct BindingArgs {
    #[serde(rename = "PodName", alias = "podName")]
    pub pod_name: String,
    #[serde(rename = "PodNamespace", alias = "podNamespace")]
    pub pod_namespace: String,
    #[serde(rename = "PodUID", alias = "podUID", default)]
    pub pod_uid: String,
    #[serde(rename = "Node", alias = "node")]
    pub node: String,
}

/// Why a bind failed: `refused` when the request, the pod or the API
/// server's 4xx answer said no; otherwise (no answer in time, a server
/// error, no API access) it failed.
#[derive(Debug)]
struct BindError {
    refused: bool,
    why: String,
}

impl From<String> for BindError {
    fn from(why: String) -> Self {
        BindError { refused: false, why }
    }
}

impl std::fmt::Display for BindError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.why)
    }
}

/// `ExtenderBindingResult`: empty `Error` on success.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BindingResult {
    #[serde(rename = "Error")]
    pub error: String,
}

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
        self.viewed(name, full, |with_pods| NodeGpus::parse_with(value, with_pods))
    }

    /// [`Extender::free_from`] for an annotation the node cache parsed: its
    /// GPUs copied, and its pod lists only where needed.
    fn free_from_parsed(&self, name: &str, parsed: &Result<Arc<NodeGpus>, AnnotationError>, full: bool) -> Result<NodeGpus, AnnotationError> {
        let parsed = parsed.as_ref().map_err(Clone::clone)?;
        self.viewed(name, full, |with_pods| Ok(if with_pods { NodeGpus::clone(parsed) } else { parsed.gpus_only() }))
    }

    /// The annotation `read` gives (with its pod lists when asked for) less
    /// the node's assumptions. The pod lists only where `full` or something
    /// is assumed: an assumption made between these two locks and read
    /// without the list is kept (and counted) until the next request, which
    /// errs on the safe side.
    fn viewed(&self, name: &str, full: bool, read: impl FnOnce(bool) -> Result<NodeGpus, AnnotationError>) -> Result<NodeGpus, AnnotationError> {
        let with_pods = full || self.assumed.lock().expect("assume lock").has(name);
        let g = read(with_pods)?;
        Ok(self.assumed.lock().expect("assume lock").view(name, g, Instant::now(), self.assume_ttl))
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
                            Some(parsed) => self.free_from_parsed(name, parsed, full).map_err(|e| e.to_string()),
                        };
                        (name.clone(), free)
                    })
                    .collect()
            }
        }
    }

    /// `bind`: binds the pod to the node through the API server (as
    /// kube-scheduler's own binder does, the pod's UID as precondition),
    /// then assumes its units there until the node's annotation counts
    /// them. Any failure goes back in `Error`, and the scheduler retries
    /// the pod.
    pub async fn bind(&self, a: BindingArgs) -> BindingResult {
        let pod = format!("{}/{}", a.pod_namespace, a.pod_name);
        match self.bind_inner(&a, &pod).await {
            Ok(units) => {
                tracing::info!(pod, node = a.node, ?units, "bound");
                self.metrics.bind("bound");
                BindingResult::default()
            }
            Err(e) => {
                tracing::warn!(pod, node = a.node, "cannot bind: {e}");
                self.metrics.bind(if e.refused { "refused" } else { "failed" });
                BindingResult { error: format!("egpu-scheduler cannot bind {pod} to {}: {}", a.node, e.why) }
            }
        }
    }

    async fn bind_inner(&self, a: &BindingArgs, pod: &str) -> Result<Vec<u32>, BindError> {
        use k8s_openapi::api::core::v1::{Binding, ObjectReference, Pod as KPod};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
        let client = self.api.clone().ok_or_else(|| BindError::from("this extender runs with --no-bind; remove bindVerb from the scheduler's extender config, or run it with API access".to_string()))?;
        if a.pod_name.is_empty() || a.pod_namespace.is_empty() || a.node.is_empty() {
            return Err(BindError { refused: true, why: "the request needs PodName, PodNamespace and Node".into() });
        }
        let deadline = tokio::time::Instant::now() + BIND_DEADLINE;
        let pods: kube::Api<KPod> = kube::Api::namespaced(client, &a.pod_namespace);
        let remembered = self.assumed.lock().expect("assume lock").demand(&a.pod_uid);
        let units = match remembered {
            Some(u) => u,
            // Not filtered by this process (it restarted, or another
            // replica led): read the pod.
            None => {
                let p = tokio::time::timeout_at(deadline, pods.get(&a.pod_name)).await.map_err(|_| "reading the pod timed out".to_string())?.map_err(|e| BindError {
                    refused: matches!(&e, kube::Error::Api(st) if (400..500).contains(&st.code)),
                    why: format!("cannot read the pod: {e}"),
                })?;
                let v = serde_json::to_value(&p).map_err(|e| e.to_string())?;
                Demand::of_pod(&v, &self.resource).map_err(|e| BindError { refused: true, why: e.to_string() })?.in_order
            }
        };
        // Assumed before the API call: a filter for the next pod may come
        // while it is in flight, and a call whose answer is lost (timeout,
        // broken connection) may still have bound the pod. Only a definite
        // refusal releases it; otherwise the node's annotation or the time
        // to live ends it.
        self.assumed.lock().expect("assume lock").assume(&a.node, pod, units.clone(), Instant::now(), self.assume_ttl);
        let binding = Binding {
            metadata: ObjectMeta { name: Some(a.pod_name.clone()), namespace: Some(a.pod_namespace.clone()), uid: (!a.pod_uid.is_empty()).then(|| a.pod_uid.clone()), ..Default::default() },
            target: ObjectReference { api_version: Some("v1".into()), kind: Some("Node".into()), name: Some(a.node.clone()), ..Default::default() },
        };
        let posted = tokio::time::timeout_at(deadline, pods.create_subresource::<_, Value>("binding", &a.pod_name, &kube::api::PostParams::default(), &binding)).await;
        match posted {
            Ok(Ok(_)) => Ok(units),
            // An earlier bind to this node whose answer was lost: bound.
            Ok(Err(kube::Error::Api(st))) if st.code == 409 && st.message.contains(&format!("already assigned to node \"{}\"", a.node)) => Ok(units),
            Ok(Err(kube::Error::Api(st))) if (400..500).contains(&st.code) => {
                self.assumed.lock().expect("assume lock").release(&a.node, pod);
                Err(BindError { refused: true, why: format!("the API server refused it ({}): {}", st.code, st.message) })
            }
            Ok(Err(e)) => Err(format!("{e} (its units stay counted on the node until its annotation or --assume-ttl says otherwise)").into()),
            Err(_) => Err(format!("the API server did not answer within {} s (its units stay counted on the node until its annotation or --assume-ttl says otherwise)", BIND_DEADLINE.as_secs()).into()),
        }
    }

    /// Assumes the units of every pod that is bound to a node but still
    /// `Pending` and asks for the resource, where nothing is assumed for it
    /// yet: what a restarted extender, or a new leader's, did not see bind
    /// (and pods another scheduler bound). Those the nodes' annotations
    /// already count are dropped at the next look at their node. Returns
    /// how many it added.
    pub async fn resync(&self) -> Result<usize, String> {
        use k8s_openapi::api::core::v1::Pod as KPod;
        let client = self.api.clone().ok_or("no API access")?;
        let pods: kube::Api<KPod> = kube::Api::all(client);
        // From the API server's watch cache (resourceVersion=0), not etcd: a
        // resync may be a little stale, not a load on a large cluster.
        let lp = kube::api::ListParams::default().match_any().fields("status.phase=Pending,spec.nodeName!=");
        let list = tokio::time::timeout(RESYNC_DEADLINE, pods.list(&lp)).await.map_err(|_| format!("listing the pending pods took over {RESYNC_DEADLINE:?}"))?.map_err(|e| e.to_string())?;
        let mut added = 0;
        // Pods being deleted hold nothing they will use.
        for p in list.items.into_iter().filter(|p| p.metadata.deletion_timestamp.is_none()) {
            let (Some(ns), Some(name), Some(node)) = (p.metadata.namespace.clone(), p.metadata.name.clone(), p.spec.as_ref().and_then(|s| s.node_name.clone())) else { continue };
            let Ok(v) = serde_json::to_value(&p) else { continue };
            let Ok(d) = Demand::of_pod(&v, &self.resource) else { continue };
            if !d.in_order.is_empty() && self.assumed.lock().expect("assume lock").assume_if_absent(&node, &format!("{ns}/{name}"), d.in_order, Instant::now(), self.assume_ttl) {
                added += 1;
            }
        }
        Ok(added)
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
        let Some(pod) = args.pod else { return fail(RequestError::NoPod) };
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

    /// `prioritize`: every candidate node with a score from 0 to 10.
    pub fn prioritize(&self, args: ExtenderArgs) -> Result<Vec<HostPriority>, RequestError> {
        let pod = args.pod.ok_or(RequestError::NoPod)?;
        let candidates = self.candidates(args.nodes, args.node_names)?;
        let demand = Demand::of_pod(&pod, &self.resource)?;
        let mut scores: Vec<HostPriority> = candidates.names().into_iter().map(|host| HostPriority { host, score: 0 }).collect();
        let Some(&largest) = demand.units.first() else {
            return Ok(scores);
        };
        let frees = self.frees(&candidates, false);
        let recent: Vec<u32> = self.recent.lock().expect("recent lock").units.iter().map(|(_, u)| *u).collect();
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
            let milli = |u: u32| ((u64::from(u) * 1000).div_ceil(u64::from(units))).clamp(1, 1000) as u32;
            let mut cluster = Cluster::new();
            let Ok(ty) = cluster.gpu_type_or_insert(&format!("{units}u"), u64::from(units)) else { continue };
            // A container larger than one GPU is a pod of whole GPUs.
            let shape = |u: u32| if u > units { Pod::new(0, 0, u.div_ceil(units), 1000, TypeSet::only(ty), Qos::Be).ok() } else { sharing_pod(milli(u), ty) };
            let Some(pod) = shape(largest) else { continue };
            let mut ids = Vec::new();
            for (i, g) in &members {
                let spec = NodeSpec {
                    name: scores[*i].host.clone(),
                    cpu_milli: u64::MAX / 4,
                    memory_mib: u64::MAX / 4,
                    gpu_type: Some(ty),
                    nvlink_groups: vec![0; g.gpus.len().min(egpu_place::model::MAX_GPUS_PER_NODE)],
                    max_pods: u32::MAX,
                };
                let Ok(id) = cluster.add_node(spec) else { continue };
                for (gi, gpu) in g.gpus.iter().enumerate().take(egpu_place::model::MAX_GPUS_PER_NODE) {
                    let used = 1000 - (u64::from(gpu.free.min(gpu.units)) * 1000 / u64::from(gpu.units.max(1))) as u32;
                    if let Some(p) = (used > 0).then(|| sharing_pod(used, ty)).flatten() {
                        let _ = cluster.apply(&Placement::new(id, &p, &[gi as u8]));
                    }
                }
                ids.push((id, *i));
            }
            let shapes: Vec<Pod> = recent.iter().filter_map(|&u| shape(u)).collect();
            let target = if shapes.is_empty() { TargetWorkload::from_pods([&pod], 1.0) } else { TargetWorkload::from_pods(&shapes, 0.95) };
            let node_keys = EgpuPolicy::new(target).node_keys(&cluster, &pod);
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

impl Extender {
    /// `preempt`: of the nodes where the scheduler would evict victims for
    /// the pod, keeps those where, once the victims' units are back on the
    /// GPUs they hold (the annotation's `holds`), each of the pod's
    /// containers fits on one GPU (or whole GPUs), as `filter` judges; the
    /// victims stay as the scheduler chose them. The scheduler's own
    /// preemption counts only the node's total units, so without this it
    /// could evict pods spread over several GPUs and still leave no GPU
    /// with room: evictions for nothing, and again at the next attempt.
    /// Dropped: a node whose annotation cannot be read, and one the
    /// victims cannot make room on. A pod that asks for no units keeps
    /// every node. Without a node cache (the scheduler then sends no
    /// nodes) nothing can be judged and every node is kept.
    pub fn preempt(&self, args: PreemptionArgs) -> Result<PreemptionResult, RequestError> {
        let pod = args.pod.ok_or(RequestError::NoPod)?;
        let demand = Demand::of_pod(&pod, &self.resource)?;
        let victims: BTreeMap<String, MetaVictims> = match (args.node_name_to_meta_victims, args.node_name_to_victims) {
            (Some(meta), _) => meta,
            (None, Some(full)) => full
                .into_iter()
                .map(|(node, v)| {
                    let pods = v.pods.iter().map(|p| MetaPod { uid: p["metadata"]["uid"].as_str().unwrap_or_default().to_string() }).collect();
                    (node, MetaVictims { pods, num_pdb_violations: v.num_pdb_violations })
                })
                .collect(),
            (None, None) => BTreeMap::new(),
        };
        if demand.units.is_empty() || self.nodes.is_none() {
            return Ok(PreemptionResult { node_name_to_meta_victims: victims });
        }
        let candidates = self.candidates(None, Some(victims.keys().cloned().collect()))?;
        let mut out = PreemptionResult::default();
        let (mut kept, mut dropped) = (0, 0);
        for (name, free) in self.frees(&candidates, true) {
            let Some(v) = victims.get(&name) else { continue };
            let uids: Vec<&str> = v.pods.iter().map(|p| p.uid.as_str()).collect();
            let fits = free.is_ok_and(|mut g| {
                g.release(&uids);
                demand.misfit(&g).is_none()
            });
            if fits {
                out.node_name_to_meta_victims.insert(name, v.clone());
                kept += 1;
            } else {
                dropped += 1;
            }
        }
        self.metrics.preempted(kept, dropped);
        Ok(out)
    }
}

/// A one-GPU pod of `milli` on GPUs of type `ty` (None when out of range).
fn sharing_pod(milli: u32, ty: egpu_place::GpuTypeId) -> Option<Pod> {
    Pod::new(0, 0, 1, milli.clamp(1, 1000), TypeSet::only(ty), Qos::Be).ok()
}

/// `GET /metrics` (and `GET /healthz`) alone, for a separate address that
/// a Prometheus outside the pod can reach (`--metrics-listen`).
pub fn metrics_router(ext: std::sync::Arc<Extender>) -> axum::Router {
    use axum::extract::State;
    use axum::response::IntoResponse;
    async fn metrics(State(ext): State<std::sync::Arc<Extender>>) -> axum::response::Response {
        ([(axum::http::header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], ext.metrics_text()).into_response()
    }
    axum::Router::new().route("/metrics", axum::routing::get(metrics)).route("/healthz", axum::routing::get(|| async { "ok" })).with_state(ext)
}

/// The extender's HTTP routes: `POST /filter`, `POST /prioritize`,
/// `POST /bind`, `POST /preempt`, `GET /metrics`, `GET /healthz`. A body that is not JSON of the protocol's shape gets
/// HTTP 400 with the reason; a request the extender cannot answer gets its
/// reason in the result's `Error` (filter, bind) or HTTP 400 (prioritize
/// and preempt, whose results have no error field).
pub fn router(ext: std::sync::Arc<Extender>) -> axum::Router {
    use axum::extract::{DefaultBodyLimit, State};
    use axum::http::StatusCode;
    use axum::response::{IntoResponse, Response};
    use axum::routing::post;
    type Ext = State<std::sync::Arc<Extender>>;

    fn parse(body: &[u8]) -> Result<ExtenderArgs, String> {
        serde_json::from_slice(body).map_err(|e| format!("not an ExtenderArgs JSON body: {e}"))
    }
    async fn filter(State(ext): Ext, body: axum::body::Bytes) -> Response {
        let t = std::time::Instant::now();
        let (ok, r) = match parse(&body) {
            Ok(args) => {
                let r = ext.filter(args);
                (r.error.is_empty(), axum::Json(r).into_response())
            }
            Err(why) => (false, (StatusCode::BAD_REQUEST, why).into_response()),
        };
        ext.metrics.request("filter", ok, t.elapsed());
        r
    }
    async fn bind(State(ext): Ext, body: axum::body::Bytes) -> Response {
        let t = std::time::Instant::now();
        let (ok, r) = match serde_json::from_slice::<BindingArgs>(&body) {
            Ok(args) => {
                let r = ext.bind(args).await;
                (r.error.is_empty(), axum::Json(r).into_response())
            }
            Err(e) => (false, (StatusCode::BAD_REQUEST, format!("not an ExtenderBindingArgs JSON body: {e}")).into_response()),
        };
        ext.metrics.request("bind", ok, t.elapsed());
        r
    }
    async fn prioritize(State(ext): Ext, body: axum::body::Bytes) -> Response {
        let t = std::time::Instant::now();
        let (ok, r) = match parse(&body).and_then(|a| ext.prioritize(a).map_err(|e| e.to_string())) {
            Ok(list) => (true, axum::Json(list).into_response()),
            Err(why) => (false, (StatusCode::BAD_REQUEST, why).into_response()),
        };
        ext.metrics.request("prioritize", ok, t.elapsed());
        r
    }
    async fn preempt(State(ext): Ext, body: axum::body::Bytes) -> Response {
        let t = std::time::Instant::now();
        let parsed = serde_json::from_slice::<PreemptionArgs>(&body).map_err(|e| format!("not an ExtenderPreemptionArgs JSON body: {e}"));
        let (ok, r) = match parsed.and_then(|a| ext.preempt(a).map_err(|e| e.to_string())) {
            Ok(result) => (true, axum::Json(result).into_response()),
            Err(why) => (false, (StatusCode::BAD_REQUEST, why).into_response()),
        };
        ext.metrics.request("preempt", ok, t.elapsed());
        r
    }
    axum::Router::new()
        .route("/filter", post(filter))
        .route("/prioritize", post(prioritize))
        .route("/bind", post(bind))
        .route("/preempt", post(preempt))
        // Without the node cache the scheduler sends whole Node objects:
        // ~14 KB each, so a 10,000-GPU cluster's request is ~18 MB.
        .layer(DefaultBodyLimit::max(256 << 20))
        .with_state(ext.clone())
        .merge(metrics_router(ext))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::annotation::{GpuFree, VERSION};
    use serde_json::json;

    const R: &str = "egpu.io/gpu-memory";

    fn node(name: &str, free: &[u32]) -> Value {
        let g = NodeGpus {
            v: VERSION,
            unit_bytes: 1 << 30,
            gpus: free.iter().enumerate().map(|(i, &f)| GpuFree { index: i as u32, uuid: format!("GPU-{name}-{i}"), model: "m".into(), units: 16, free: f }).collect(),
            pods: None,
            holds: None,
        };
        json!({"metadata": {"name": name, "annotations": {"egpu.io/gpus": g.to_json()}}, "status": {"capacity": {"egpu.io/gpu-memory": "32"}}})
    }

    fn pod(units: &[&str]) -> Value {
        let containers: Vec<Value> =
            units.iter().enumerate().map(|(i, u)| json!({"name": format!("c{i}"), "resources": {"limits": {R: u}, "requests": {R: u}}})).collect();
        json!({"metadata": {"name": "p", "namespace": "default"}, "spec": {"containers": containers}})
    }

    fn args(pod: Value, nodes: Vec<Value>) -> ExtenderArgs {
        serde_json::from_value(json!({"Pod": pod, "Nodes": {"items": nodes}})).unwrap()
    }

    #[test]
    fn demand_reads_containers_and_refuses_nonsense() {
        assert_eq!(Demand::of_pod(&pod(&["4", "10"]), R).unwrap().units, [10, 4]);
        let e = Demand::of_pod(&pod(&["1.5"]), R).unwrap_err();
        assert!(e.to_string().contains("'1.5'") && e.to_string().contains("c0"), "{e}");
        assert_eq!(Demand::of_pod(&pod(&["2k"]), R).unwrap().units, [2000], "canonical form of 2000");
        let p = json!({"spec": {"containers": [{"name": "m", "resources": {"limits": {R: "4"}, "requests": {R: "2"}}}]}});
        assert!(matches!(Demand::of_pod(&p, R), Err(RequestError::Mismatch { .. })));
        let p = json!({"spec": {"initContainers": [{"name": "i", "resources": {"limits": {R: 3}}}], "containers": [{"name": "m"}]}});
        assert_eq!(Demand::of_pod(&p, R), Err(RequestError::InitContainer { resource: R.into() }));
        let p = json!({"spec": {"initContainers": [{"name": "i"}], "containers": [{"name": "m", "resources": {"limits": {R: 3}}}]}});
        assert_eq!(Demand::of_pod(&p, R).unwrap().units, [3], "init containers that ask nothing are fine");
    }

    #[test]
    fn filter_keeps_nodes_where_each_container_fits_one_gpu() {
        let ext = Extender::new(R);
        let mut unannotated = node("c", &[16]);
        unannotated["metadata"]["annotations"] = json!({});
        let r = ext.filter(args(pod(&["10"]), vec![node("a", &[6, 6]), node("b", &[12, 0]), unannotated]));
        let names: Vec<&str> = r.nodes.as_ref().unwrap().items.iter().map(node_name).collect();
        assert_eq!(names, ["b"]);
        assert!(r.failed_nodes["a"].contains("no GPU has 10 units") && r.failed_nodes["a"].contains("is 6"), "{:?}", r.failed_nodes);
        assert!(r.failed_and_unresolvable_nodes["c"].contains("--node-name"), "{:?}", r.failed_and_unresolvable_nodes);
        // Two containers share a GPU when it has room for both, or take one each.
        let r = ext.filter(args(pod(&["8", "8"]), vec![node("one", &[16]), node("split", &[8, 7]), node("two", &[8, 8])]));
        let names: Vec<&str> = r.nodes.as_ref().unwrap().items.iter().map(node_name).collect();
        assert_eq!(names, ["one", "two"]);
        assert!(r.failed_nodes["split"].contains("[8, 8]"), "{:?}", r.failed_nodes);
        // Larger than a GPU: whole free GPUs, a multiple of one.
        let r = ext.filter(args(pod(&["32"]), vec![node("two", &[16, 16]), node("one", &[16, 15]), node("odd", &[16, 16])]));
        assert_eq!(r.nodes.unwrap().items.len(), 2);
        assert!(r.failed_nodes["one"].contains("2 whole GPUs of 16") && r.failed_nodes["one"].contains("1 GPU(s) are entirely free"), "{:?}", r.failed_nodes);
        // What no eviction could fix is unresolvable, so the scheduler does
        // not preempt there: not a multiple of a GPU, more whole GPUs than
        // the node has, more than one GPU's units on a node of small GPUs.
        let r = ext.filter(args(pod(&["20"]), vec![node("two", &[16, 16])]));
        assert!(r.failed_and_unresolvable_nodes["two"].contains("ask for a multiple of 16"), "{:?}", r.failed_and_unresolvable_nodes);
        let r = ext.filter(args(pod(&["48"]), vec![node("two", &[16, 16]), node("three", &[16, 16, 0])]));
        assert!(r.failed_and_unresolvable_nodes["two"].contains("even with every GPU of the node free"), "{r:?}");
        assert!(r.failed_nodes["three"].contains("3 whole GPUs of 16"), "{r:?}");
        let r = ext.filter(args(pod(&["10", "10"]), vec![node("a", &[6, 6])]));
        assert!(r.failed_nodes.contains_key("a") && r.failed_and_unresolvable_nodes.is_empty(), "evicting makes room for both: {r:?}");
        // Scored as a pod of two whole GPUs: a node with exactly two free wins.
        let s = ext.prioritize(args(pod(&["32"]), vec![node("four", &[16, 16, 16, 16]), node("two", &[16, 16, 0, 0]), node("one", &[16, 0, 0, 0])])).unwrap();
        assert_eq!(s.iter().find(|h| h.host == "two").unwrap().score, MAX_SCORE, "{s:?}");
        assert_eq!(s.iter().find(|h| h.host == "one").unwrap().score, 0, "two whole GPUs do not fit one: {s:?}");
        // A pod that asks for none passes everywhere, untouched.
        let r = ext.filter(args(json!({"spec": {"containers": [{"name": "x"}]}}), vec![node("a", &[0])]));
        assert_eq!(r.nodes.unwrap().items.len(), 1);
        // Errors go back in Error.
        let r = ext.filter(serde_json::from_value(json!({"Pod": pod(&["1"])})).unwrap());
        assert_eq!(r.error, RequestError::NoCandidates.to_string());
    }

    #[test]
    fn preempt_keeps_the_nodes_where_the_victims_make_room_on_one_gpu() {
        // GPUs of 16 with 3 and 1 free; pods a (5 on GPU 0, 5 on GPU 1) and
        // b (10 on GPU 1); 8 units of GPU 0 are held by pods not named.
        let mut g: NodeGpus = serde_json::from_str(node("n", &[3, 1])["metadata"]["annotations"][crate::annotation::ANNOTATION].as_str().unwrap()).unwrap();
        g.holds = Some([("a".to_string(), [(0, 5), (1, 5)].into()), ("b".to_string(), [(1, 10)].into())].into());
        let meta = json!({"name": "n", "annotations": {crate::annotation::ANNOTATION: g.to_json()}});
        let cache = Arc::new(NodeCache::new("egpu.io/enabled=true"));
        cache.replace(vec![serde_json::from_value(meta).unwrap()]);
        let ext = Extender::new(R).with_node_cache(cache);
        let victims = |uids: &[&str]| MetaVictims { pods: uids.iter().map(|u| MetaPod { uid: u.to_string() }).collect(), num_pdb_violations: 0 };
        let kept = |units: &str, uids: &[&str]| {
            let args = PreemptionArgs { pod: Some(pod(&[units])), node_name_to_victims: None, node_name_to_meta_victims: Some([("n".to_string(), victims(uids))].into()) };
            ext.preempt(args).unwrap().node_name_to_meta_victims.contains_key("n")
        };
        // a frees 5 on each GPU (8 and 6 free): not 12 on one; b frees 10
        // on GPU 1 (11); both free 8 and 16.
        assert!(!kept("12", &["a"]));
        assert!(!kept("12", &["b"]) && kept("11", &["b"]));
        assert!(kept("12", &["a", "b"]));
        assert!(!kept("12", &["unknown"]) && !kept("4", &["unknown"]), "a pod the annotation does not place frees nothing");
        // After a (8 and 6 free), 8 fits and 9 does not.
        assert!(kept("8", &["a"]) && !kept("9", &["a"]));
        // Whole pods (without nodeCacheCapable) are read by their UIDs.
        let full = json!({"Pod": pod(&["11"]), "NodeNameToVictims": {"n": {"Pods": [{"metadata": {"uid": "b"}}], "NumPDBViolations": 2}}});
        let r = ext.preempt(serde_json::from_value(full).unwrap()).unwrap();
        assert_eq!(r.node_name_to_meta_victims["n"], MetaVictims { num_pdb_violations: 2, ..victims(&["b"]) });
        // A pod that asks for no units keeps every node; so does an extender
        // without a node cache, which cannot see the nodes.
        let none = json!({"Pod": {"spec": {"containers": [{"name": "x"}]}}, "NodeNameToMetaVictims": {"zz": {"Pods": []}}});
        assert!(ext.preempt(serde_json::from_value(none).unwrap()).unwrap().node_name_to_meta_victims.contains_key("zz"));
        let blind = Extender::new(R);
        let args = PreemptionArgs { pod: Some(pod(&["12"])), node_name_to_victims: None, node_name_to_meta_victims: Some([("n".to_string(), victims(&["a"]))].into()) };
        assert!(blind.preempt(args).unwrap().node_name_to_meta_victims.contains_key("n"));
        // The wire names are Go's.
        let wire = serde_json::to_value(PreemptionResult { node_name_to_meta_victims: [("n".to_string(), victims(&["b"]))].into() }).unwrap();
        assert_eq!(wire, json!({"NodeNameToMetaVictims": {"n": {"Pods": [{"UID": "b"}], "NumPDBViolations": 0}}}));
        assert_eq!(ext.preempt(serde_json::from_value(json!({"NodeNameToMetaVictims": {}})).unwrap()), Err(RequestError::NoPod));
    }

    #[test]
    fn never_fits_only_where_no_eviction_could_help() {
        let gpus = |sizes: &[u32], free: &[u32]| NodeGpus {
            v: VERSION,
            unit_bytes: 1 << 30,
            gpus: sizes.iter().zip(free).enumerate().map(|(i, (&units, &free))| GpuFree { index: i as u32, uuid: format!("GPU-{i}"), model: "m".into(), units, free }).collect(),
            pods: None,
            holds: None,
        };
        let demand = |units: &[u32]| Demand { units: { let mut u = units.to_vec(); u.sort_unstable_by(|a, b| b.cmp(a)); u }, in_order: units.to_vec() };
        let two = gpus(&[16, 16], &[0, 0]);
        assert!(demand(&[20]).never_fits(&two), "larger than a GPU, not a multiple");
        assert!(demand(&[48]).never_fits(&two), "three whole GPUs of two");
        assert!(demand(&[10, 10, 10, 10]).never_fits(&two), "more than the node has");
        assert!(!demand(&[32]).never_fits(&two) && !demand(&[16, 16]).never_fits(&two));
        // Mixed sizes: the empty node's placement misfits, yet a fuller node fits.
        let sizes = [16, 16, 8, 8, 8, 8];
        let d = demand(&[32, 16]);
        assert!(d.misfit(&gpus(&sizes, &sizes)).is_some() && d.misfit(&gpus(&sizes, &[15, 16, 8, 8, 8, 8])).is_none());
        assert!(!d.never_fits(&gpus(&sizes, &[0; 6])), "evictions could make room");
    }

    proptest::proptest! {
        /// Preemption's judgement is the filter's on the node as it would
        /// be without the victims (their units freed on their GPUs, worked
        /// out here independently of `release`), and more victims never
        /// lose a node.
        #[test]
        fn preempt_judges_as_filter_would_without_the_victims(
            pods in proptest::collection::vec((0usize..3, 1u32..=8), 0..8),
            ask in proptest::collection::vec(proptest::prop_oneof![4 => 1u32..=16, 1 => proptest::strategy::Just(32u32)], 1..4),
            victims in proptest::collection::vec(proptest::bool::ANY, 8),
            more in proptest::collection::vec(proptest::bool::ANY, 8),
        ) {
            // Three GPUs of 16; each pod (GPU, units) is kept only if it fits.
            let mut free = [16u32; 3];
            let mut holds: BTreeMap<String, BTreeMap<u32, u32>> = BTreeMap::new();
            for (j, &(gpu, units)) in pods.iter().enumerate() {
                if free[gpu] >= units {
                    free[gpu] -= units;
                    holds.insert(format!("p{j}"), [(gpu as u32, units)].into());
                }
            }
            let annotated = |free: &[u32], holds: &BTreeMap<String, BTreeMap<u32, u32>>| {
                let mut g: NodeGpus = serde_json::from_str(node("n", free)["metadata"]["annotations"][crate::annotation::ANNOTATION].as_str().unwrap()).unwrap();
                g.holds = Some(holds.clone());
                g
            };
            let cache = Arc::new(NodeCache::new("egpu.io/enabled=true"));
            let meta = json!({"name": "n", "annotations": {crate::annotation::ANNOTATION: annotated(&free, &holds).to_json()}});
            cache.replace(vec![serde_json::from_value(meta).unwrap()]);
            let ext = Extender::new(R).with_node_cache(cache);
            let units: Vec<String> = ask.iter().map(u32::to_string).collect();
            let units: Vec<&str> = units.iter().map(String::as_str).collect();
            let pick = |which: &[bool]| -> Vec<String> { (0..pods.len()).filter(|&j| which[j]).map(|j| format!("p{j}")).collect() };
            let kept = |uids: &[String]| {
                let v = MetaVictims { pods: uids.iter().map(|u| MetaPod { uid: u.clone() }).collect(), num_pdb_violations: 0 };
                let args = PreemptionArgs { pod: Some(pod(&units)), node_name_to_victims: None, node_name_to_meta_victims: Some([("n".to_string(), v)].into()) };
                ext.preempt(args).unwrap().node_name_to_meta_victims.contains_key("n")
            };
            let chosen = pick(&victims);
            // The node without the victims, worked out from the pod list.
            let mut after = free;
            for u in &chosen {
                if let Some(h) = holds.get(u) {
                    for (&gpu, &n) in h {
                        after[gpu as usize] += n;
                    }
                }
            }
            let filtered = Extender::new(R).filter(args(pod(&units), vec![node("n", &after)]));
            proptest::prop_assert_eq!(kept(&chosen), filtered.nodes.unwrap().items.len() == 1);
            let both: Vec<String> = pick(&victims.iter().zip(&more).map(|(a, b)| *a || *b).collect::<Vec<_>>());
            proptest::prop_assert!(!kept(&chosen) || kept(&both), "more victims lost the node");
        }
    }

    #[test]
    fn node_names_with_the_cache_answer_as_node_objects_do() {
        // Passing and failing nodes interleaved, one without the annotation.
        let mut bare = node("c", &[16]);
        bare["metadata"]["annotations"] = json!({});
        let nodes = vec![node("a", &[6, 6]), node("b", &[12, 0]), bare, node("d", &[16, 16]), node("e", &[9, 3])];
        let names: Vec<String> = nodes.iter().map(|n| node_name(n).to_string()).collect();
        let cache = Arc::new(NodeCache::new("egpu.io/enabled=true"));
        let by_names = Extender::new(R).with_node_cache(cache.clone());
        let named = |units: &str| serde_json::from_value::<ExtenderArgs>(json!({"Pod": pod(&[units]), "NodeNames": names})).unwrap();
        // Not filled yet: the scheduler is told to retry.
        assert_eq!(by_names.filter(named("10")).error, RequestError::NotSynced.to_string());
        assert_eq!(by_names.prioritize(named("10")), Err(RequestError::NotSynced));
        cache.replace(nodes.iter().map(|n| serde_json::from_value(n["metadata"].clone()).unwrap()).collect());
        let by_objects = Extender::new(R);
        for units in ["4", "10", "13"] {
            let o = by_objects.filter(args(pod(&[units]), nodes.clone()));
            let n = by_names.filter(named(units));
            let passed: Vec<String> = o.nodes.unwrap().items.iter().map(|x| node_name(x).to_string()).collect();
            assert_eq!(n.node_names, Some(passed), "{units} units");
            assert!(n.nodes.is_none());
            assert_eq!((n.failed_nodes, n.failed_and_unresolvable_nodes), (o.failed_nodes, o.failed_and_unresolvable_nodes), "{units} units");
            assert_eq!(by_names.prioritize(named(units)).unwrap(), by_objects.prioritize(args(pod(&[units]), nodes.clone())).unwrap(), "{units} units");
        }
        // A node the cache does not hold is unresolvable, with the reason.
        let r = by_names.filter(serde_json::from_value(json!({"Pod": pod(&["1"]), "NodeNames": ["zz"]})).unwrap());
        assert!(r.failed_and_unresolvable_nodes["zz"].contains("not selected by 'egpu.io/enabled=true'"), "{r:?}");
        // Names without a cache, or neither field: the reason.
        let e = by_objects.filter(serde_json::from_value(json!({"Pod": pod(&["1"]), "NodeNames": ["a"]})).unwrap()).error;
        assert!(e.contains("nodeCacheCapable: false"), "{e}");
        let e = by_names.filter(serde_json::from_value(json!({"Pod": pod(&["1"])})).unwrap()).error;
        assert_eq!(e, RequestError::NoCandidates.to_string());
    }

    #[test]
    fn prioritize_prefers_the_hole_the_pod_completes() {
        let ext = Extender::new(R);
        // 4 units: "exact" has a GPU with exactly 4 free, "empty" is idle,
        // "ragged" leaves a 3-unit hole.
        let nodes = vec![node("empty", &[16, 16]), node("exact", &[4, 16]), node("ragged", &[7, 16])];
        let s = ext.prioritize(args(pod(&["4"]), nodes)).unwrap();
        let score = |n: &str| s.iter().find(|h| h.host == n).unwrap().score;
        assert_eq!(score("exact"), MAX_SCORE, "{s:?}");
        assert!(score("exact") > score("ragged") && score("ragged") > score("empty"), "idle nodes last; {s:?}");
        // The top score is the node the policy itself places the pod on.
        let mut cluster = Cluster::new();
        let ty = cluster.gpu_type_or_insert("16u", 16).unwrap();
        let p = sharing_pod(250, ty).unwrap();
        for (name, free) in [("empty", [1000, 1000]), ("exact", [250, 1000]), ("ragged", [437, 1000])] {
            let id = cluster.add_node(NodeSpec { name: name.into(), cpu_milli: 1 << 40, memory_mib: 1 << 40, gpu_type: Some(ty), nvlink_groups: vec![0, 0], max_pods: 100 }).unwrap();
            for (g, f) in free.iter().enumerate() {
                if *f < 1000 {
                    cluster.apply(&Placement::new(id, &sharing_pod(1000 - f, ty).unwrap(), &[g as u8])).unwrap();
                }
            }
        }
        use egpu_place::Policy;
        let placed = EgpuPolicy::new(TargetWorkload::from_pods([&p], 1.0)).place(&cluster, &p).unwrap();
        assert_eq!(cluster.nodes()[placed.node].name(), "exact");
        assert!(s.iter().all(|h| (0..=MAX_SCORE).contains(&h.score)));
        // A node it does not fit scores 0; a pod asking nothing scores all 0.
        let s = ext.prioritize(args(pod(&["12"]), vec![node("full", &[4, 4]), node("free", &[16, 16])])).unwrap();
        assert_eq!(s, [HostPriority { host: "full".into(), score: 0 }, HostPriority { host: "free".into(), score: MAX_SCORE }]);
    }

    #[test]
    fn quantities_that_are_whole_numbers() {
        for (q, v) in [("10", 10), ("+3", 3), ("2k", 2000), ("2Ki", 2048), ("1Gi", 1 << 30), ("1.5k", 1500), ("1e3", 1000), ("1500m", 0), ("3000m", 3), ("1.", 1), (".5k", 500), ("0", 0), (" 7 ", 7), ("1E2", 100)] {
            if q == "1500m" {
                assert_eq!(whole_quantity(q), None, "1.5 is not whole");
            } else {
                assert_eq!(whole_quantity(q), Some(v), "{q}");
            }
        }
        for q in ["", "x", ".", "-1", "1.5", "2 Gi", "2gi", "1e", "1e-2", "99999999999999999999999", "1Ei0", "1e99"] {
            assert_eq!(whole_quantity(q), None, "{q}");
        }
    }

    #[test]
    fn the_target_window_counts_each_pod_once() {
        let ext = Extender::new(R);
        let mut p = pod(&["4"]);
        p["metadata"]["uid"] = "u1".into();
        for _ in 0..5 {
            ext.filter(args(p.clone(), vec![node("a", &[16])]));
        }
        assert_eq!(ext.recent.lock().unwrap().units.len(), 1);
        p["metadata"]["uid"] = "u2".into();
        ext.filter(args(p, vec![node("a", &[16])]));
        assert_eq!(ext.recent.lock().unwrap().units.len(), 2);
    }

    #[test]
    fn wire_names_are_gos_and_lower_case_is_accepted() {
        let a: ExtenderArgs = serde_json::from_value(json!({"pod": {}, "nodes": {"items": []}, "nodenames": ["x"]})).unwrap();
        assert!(a.pod.is_some() && a.nodes.is_some() && a.node_names.is_some());
        let v = serde_json::to_value(FilterResult { error: "e".into(), ..Default::default() }).unwrap();
        assert_eq!(v, json!({"FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": "e"}));
        assert_eq!(serde_json::to_value(HostPriority { host: "h".into(), score: 3 }).unwrap(), json!({"Host": "h", "Score": 3}));
    }
}
