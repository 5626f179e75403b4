//! Dynamic Resource Allocation (DRA): eGPU's kubelet plugin for the driver
//! `gpu.egpu.io` (`egpu-dra-plugin`). Design note: `docs/kubernetes.md`,
//! "Dynamic Resource Allocation".
//!
//! - **Publish** one ResourceSlice for the node: one device per GPU
//!   (`gpu-<index>`), with its `index`, `uuid` and `model` as attributes and
//!   two consumable capacities, `memory` (bytes) and `compute` (percent of
//!   the GPU, guaranteed), and `allowMultipleAllocations`: the scheduler
//!   then hands parts of one GPU to several claims and keeps each capacity's
//!   sum within the GPU (Kubernetes' consumable capacity). Without that
//!   feature the API server drops the field and every claim gets whole
//!   GPUs.
//! - **Prepare** a claim (`NodePrepareResources`, the kubelet's call before
//!   its pod starts): read the ResourceClaim, turn what the scheduler
//!   allocated on this node for this driver into **one egpud slice** named
//!   `dra-<claim UID>` (one device per GPU, memory = the consumed memory,
//!   guaranteed compute = the consumed compute, cap and burst from the
//!   claim's opaque configuration), and answer with its CDI device. Repeated
//!   calls answer the same; a restarted plugin finds the slice in egpud.
//! - **Unprepare** deletes that slice (not forced: egpud refuses while a
//!   process still runs in it, and the kubelet calls again).
//! - **Resize** live: the annotations of the pod a claim was made for
//!   (`egpu.io/gpu-compute-limit`, `egpu.io/gpu-memory-burst`) set the
//!   slice's cap and burst cap, every `--poll`; the claims prepared are kept
//!   in `claims.json` beside the plugin's socket, for a restarted plugin.
//! - **Register** through the kubelet's plugin watcher: this plugin serves
//!   `Registration` on `<kubelet dir>/plugins_registry/<driver>-reg.sock`
//!   and `DRAPlugin` (v1 and v1beta1) on
//!   `<kubelet dir>/plugins/<driver>/dra.sock`.
//!
//! [`resource_slice_spec`], [`plan`], [`resizes`], [`kubelet_devices`] and
//! [`SliceConfig`] are pure; the rest is IO.

use crate::plugin::file_id;
use crate::quantity::ceil_times;
use crate::tokens::Gpu;
use egpu_node::proto as node;
use k8s_openapi::api::resource::v1 as res;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

/// Generated types of the kubelet's DRA plugin API, v1.
#[allow(clippy::all)]
pub mod v1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}

/// Generated types of the kubelet's DRA plugin API, v1beta1 (the same
/// messages as v1).
#[allow(clippy::all)]
pub mod v1beta1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1beta1");
}

/// Generated types of the kubelet's plugin-watcher registration API.
#[allow(clippy::all)]
pub mod registration {
    tonic::include_proto!("pluginregistration");
}

/// The default driver name.
pub const DEFAULT_DRIVER: &str = "gpu.egpu.io";
/// The capacity that holds a GPU's memory, in bytes.
pub const MEMORY: &str = "memory";
/// The capacity that holds a GPU's compute, in percent: what a claim
/// consumes is its guaranteed share.
pub const COMPUTE: &str = "compute";
/// The plugin type the kubelet's plugin watcher knows DRA plugins by.
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// The service versions registered, newest first.
pub const SUPPORTED_VERSIONS: [&str; 2] = ["v1.DRAPlugin", "v1beta1.DRAPlugin"];
/// The prefix of the slices this plugin makes: `dra-<claim UID>`.
pub const SLICE_PREFIX: &str = "dra-";
/// The `apiVersion` of the opaque configuration a claim may give.
pub const CONFIG_API_VERSION: &str = "gpu.egpu.io/v1";
/// Its `kind`.
pub const CONFIG_KIND: &str = "SliceConfig";

/// A GPU's device name in the ResourceSlice.
pub fn device_name(index: u32) -> String {
    format!("gpu-{index}")
}

fn device_index(name: &str) -> Option<u32> {
    name.strip_prefix("gpu-").filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()) && (d.len() == 1 || !d.starts_with('0'))).and_then(|d| d.parse().ok())
}

/// The slice a claim becomes.
pub fn slice_name(claim_uid: &str) -> String {
    format!("{SLICE_PREFIX}{claim_uid}")
}

/// The name of this node's ResourceSlice.
pub fn resource_slice_name(node: &str, driver: &str) -> String {
    let mut n = format!("{node}-{driver}");
    n.truncate(253);
    n.trim_end_matches(['-', '.']).to_string()
}

fn quantity(v: u64) -> Quantity {
    Quantity(v.to_string())
}

/// The least memory a claim may consume of a GPU; a GPU with less left
/// for claims is not published.
pub const MIN_MEMORY: u64 = 1 << 20;

/// What egpud has promised on a GPU to slices this driver did not make
/// (`egpu create` on the node, another plugin's): published capacities
/// leave it out, so the scheduler does not promise it again.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reserved {
    pub memory_bytes: u64,
    pub compute_bps: u32,
}

/// What slices not made by this driver reserve, per GPU index.
pub fn reserved_elsewhere(slices: &[node::Slice]) -> BTreeMap<u32, Reserved> {
    let mut out: BTreeMap<u32, Reserved> = BTreeMap::new();
    for d in slices.iter().filter(|s| !s.name.starts_with(SLICE_PREFIX)).flat_map(|s| &s.devices) {
        let r = out.entry(d.device).or_default();
        r.memory_bytes = r.memory_bytes.saturating_add(d.memory_limit_bytes);
        r.compute_bps = r.compute_bps.saturating_add(d.compute_share_bps);
    }
    out
}

/// The spec of this node's ResourceSlice: one pool, named after the node,
/// with one device per GPU, its capacities less what `reserved` holds (a
/// GPU with under [`MIN_MEMORY`] left is left out).
pub fn resource_slice_spec(driver: &str, node: &str, gpus: &[Gpu], reserved: &BTreeMap<u32, Reserved>, generation: i64) -> res::ResourceSliceSpec {
    let devices = gpus
        .iter()
        .filter_map(|g| {
            let r = reserved.get(&g.index).copied().unwrap_or_default();
            let memory_bytes = g.memory_bytes.saturating_sub(r.memory_bytes);
            // Whole percents: a guarantee made outside takes its share rounded up.
            let compute_pct = 100u64.saturating_sub(u64::from(r.compute_bps).div_ceil(100));
            if memory_bytes < MIN_MEMORY {
                return None;
            }
            let attr_s = |s: &str| res::DeviceAttribute { string: Some(s.to_string()), ..Default::default() };
            let attributes = BTreeMap::from([
                ("index".to_string(), res::DeviceAttribute { int: Some(i64::from(g.index)), ..Default::default() }),
                ("uuid".to_string(), attr_s(&g.uuid)),
                ("model".to_string(), attr_s(&g.model)),
            ]);
            // A claim that names no amount gets the whole GPU's memory and no
            // compute guarantee (it still uses idle compute up to its cap).
            let memory = res::DeviceCapacity {
                value: quantity(memory_bytes),
                request_policy: Some(res::CapacityRequestPolicy {
                    default: Some(quantity(memory_bytes)),
                    valid_range: Some(res::CapacityRequestPolicyRange { min: quantity(MIN_MEMORY), max: Some(quantity(memory_bytes)), step: None }),
                    valid_values: None,
                }),
            };
            let compute = res::DeviceCapacity {
                value: quantity(compute_pct),
                request_policy: Some(res::CapacityRequestPolicy {
                    default: Some(quantity(0)),
                    valid_range: Some(res::CapacityRequestPolicyRange { min: quantity(0), max: Some(quantity(compute_pct)), step: None }),
                    valid_values: None,
                }),
            };
            Some(res::Device {
                name: device_name(g.index),
                attributes: Some(attributes),
                capacity: Some(BTreeMap::from([(MEMORY.to_string(), memory), (COMPUTE.to_string(), compute)])),
                allow_multiple_allocations: Some(true),
                ..Default::default()
            })
        })
        .collect();
    res::ResourceSliceSpec {
        driver: driver.to_string(),
        node_name: Some(node.to_string()),
        pool: res::ResourcePool { name: node.to_string(), generation, resource_slice_count: 1 },
        devices: Some(devices),
        ..Default::default()
    }
}

/// The opaque configuration a claim (or its DeviceClass) may give the
/// driver, in `spec.devices.config[].opaque.parameters`:
/// `{"apiVersion": "gpu.egpu.io/v1", "kind": "SliceConfig", "computeLimit":
/// "50%", "memoryBurst": "24GiB", "priority": "high"}`. Every field is
/// optional; an unknown field is an error (a typo must not pass unnoticed).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SliceConfig {
    pub api_version: Option<String>,
    pub kind: Option<String>,
    /// The compute cap, e.g. `50%` (default: the whole GPU).
    pub compute_limit: Option<String>,
    /// The memory burst cap of each device, e.g. `24Gi` (a Kubernetes
    /// quantity) or `24GiB`: above its
    /// guarantee a slice borrows memory no slice reserved, up to this.
    pub memory_burst: Option<String>,
    /// `high`, `normal` (default) or `best-effort`.
    pub priority: Option<String>,
}

/// A burst cap as the DRA driver reads it, in a claim's configuration and
/// on a pod: a Kubernetes quantity (`24Gi`; `24G` is 24·10^9), as in the
/// rest of the claim, or eGPU's own spelling (`24GiB`). Fractions of a byte
/// (`m`, `u`, `n`: `512m` is half a byte, not 512 MiB) and amounts under
/// 1 MiB are refused; `0` is no burst.
pub fn burst_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if t.ends_with(['m', 'u', 'n']) {
        return Err(format!("'{s}' is a fraction of a byte in Kubernetes' units (m is milli); write Mi or MiB for MiB"));
    }
    let b = match ceil_times(t, 1) {
        Ok(b) => b,
        Err(_) => t.parse::<egpu_core::quantity::Bytes>().map_err(|e| format!("{e} (or a Kubernetes quantity such as 24Gi)"))?.0,
    };
    if b != 0 && b < MIN_MEMORY {
        return Err(format!("'{s}' is under 1 MiB; give a burst cap such as 24Gi, or 0 for none"));
    }
    Ok(b)
}

/// What a SliceConfig asks, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Asked {
    limit_bps: u32,
    burst_bytes: u64,
    priority: node::Priority,
}

impl SliceConfig {
    fn parse(v: &serde_json::Value) -> Result<SliceConfig, String> {
        let c: SliceConfig = serde_json::from_value(v.clone()).map_err(|e| format!("its {CONFIG_KIND} configuration does not parse: {e}"))?;
        if let Some(a) = &c.api_version
            && a != CONFIG_API_VERSION
        {
            return Err(format!("its configuration has apiVersion '{a}'; this driver reads {CONFIG_API_VERSION}"));
        }
        if let Some(k) = &c.kind
            && k != CONFIG_KIND
        {
            return Err(format!("its configuration has kind '{k}'; this driver reads {CONFIG_KIND}"));
        }
        Ok(c)
    }

    /// Later configurations override earlier ones, field by field.
    fn merged(self, later: SliceConfig) -> SliceConfig {
        SliceConfig {
            api_version: later.api_version.or(self.api_version),
            kind: later.kind.or(self.kind),
            compute_limit: later.compute_limit.or(self.compute_limit),
            memory_burst: later.memory_burst.or(self.memory_burst),
            priority: later.priority.or(self.priority),
        }
    }

    fn asked(&self) -> Result<Asked, String> {
        use egpu_core::quantity::Percent;
        let limit_bps = match &self.compute_limit {
            None => 10_000,
            Some(s) => s.parse::<Percent>().map_err(|e| format!("computeLimit: {e}"))?.0,
        };
        if limit_bps == 0 {
            return Err("computeLimit: 0% would never run; give a cap above 0, e.g. 50%".into());
        }
        let burst_bytes = match &self.memory_burst {
            None => 0,
            Some(s) => burst_bytes(s).map_err(|e| format!("memoryBurst: {e}"))?,
        };
        let priority = match self.priority.as_deref() {
            None | Some("normal") => node::Priority::Normal,
            Some("high") => node::Priority::High,
            Some("best-effort") => node::Priority::BestEffort,
            Some(p) => return Err(format!("priority '{p}' is not high, normal or best-effort")),
        };
        Ok(Asked { limit_bps, burst_bytes, priority })
    }
}

/// What one claim becomes on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The slice's devices, by GPU index.
    pub devices: Vec<node::DeviceShareSpec>,
    pub priority: node::Priority,
    /// The cap and the burst cap the configuration asks (before a GPU's
    /// burst is raised to its guarantee): what pod annotations override.
    pub limit_bps: u32,
    pub burst_bytes: u64,
    /// (request, device name, GPU index) of each allocation result, in
    /// order; the request by its own name, without a subrequest's
    /// (`main/small` is `main`), as containers name it.
    pub results: Vec<(String, String, u32)>,
}

/// Turns what the scheduler allocated a claim into a slice: the results of
/// `driver` (all of which must be in `pool`, this node's), on GPUs of
/// `gpus` (each with the memory it has for claims); memory and compute from
/// their consumed capacity (absent: all that memory, no compute
/// guarantee), summed per GPU over the claim's requests; the cap, burst
/// and priority from the opaque configuration for this driver. One request
/// given the same GPU twice is refused: it asked for two GPUs.
pub fn plan(claim: &res::ResourceClaim, driver: &str, pool: &str, gpus: &[Gpu]) -> Result<Plan, String> {
    let alloc = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .ok_or("it is not allocated yet (status.allocation is empty); the scheduler allocates a claim when it schedules its first pod")?;
    let devices = alloc.devices.as_ref();
    let results: Vec<&res::DeviceRequestAllocationResult> = devices.and_then(|d| d.results.as_ref()).into_iter().flatten().filter(|r| r.driver == driver).collect();
    if results.is_empty() {
        return Err(format!("none of its allocated devices is of driver {driver}"));
    }
    // Configuration: from the class first, then the claim, in order, each for
    // all requests or for some; only this driver's opaque ones.
    let mut configs: Vec<(&res::DeviceAllocationConfiguration, SliceConfig)> = Vec::new();
    for c in devices.and_then(|d| d.config.as_ref()).into_iter().flatten() {
        let Some(o) = c.opaque.as_ref().filter(|o| o.driver == driver) else { continue };
        configs.push((c, SliceConfig::parse(&o.parameters.0)?));
    }
    configs.sort_by_key(|(c, _)| c.source != "FromClass");
    let mut per_gpu: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    let mut asked: Option<Asked> = None;
    let mut out = Vec::new();
    let mut placed = std::collections::HashSet::new();
    for r in results {
        if r.pool != pool {
            return Err(format!("device {} was allocated from pool '{}', but this node's pool is '{pool}' (is the plugin's --node-name this node's?)", r.device, r.pool));
        }
        if r.admin_access == Some(true) {
            return Err(format!("request {} asks for admin access to {}; this driver gives GPUs only as slices", r.request, r.device));
        }
        let index = device_index(&r.device).ok_or_else(|| format!("device '{}' is not one this driver publishes (gpu-<index>)", r.device))?;
        let gpu = gpus.iter().find(|g| g.index == index).ok_or_else(|| format!("GPU {index} ({}) is not on this node any more", r.device))?;
        let consumed = |key: &str, factor: u64| -> Result<Option<u64>, String> {
            r.consumed_capacity.as_ref().and_then(|c| c.get(key)).map(|q| ceil_times(&q.0, factor).map_err(|e| format!("consumed {key} of {}: {e}", r.device))).transpose()
        };
        let memory = consumed(MEMORY, 1)?.unwrap_or(gpu.memory_bytes);
        let share = consumed(COMPUTE, 100)?.unwrap_or(0);
        if memory == 0 {
            return Err(format!("request {} consumes no memory of {}; ask for some (capacity.requests.memory)", r.request, r.device));
        }
        let base = r.request.split('/').next().unwrap_or(&r.request);
        if !placed.insert((base, index)) {
            return Err(format!(
                "request {base} was given {} twice (a GPU can hold several shares); to spread its devices over GPUs, add constraints: [{{requests: [{base}], distinctAttribute: {driver}/uuid}}] to the claim",
                r.device
            ));
        }
        // The request's own configuration, the last that names it (or all).
        let mine = configs
            .iter()
            .filter(|(c, _)| c.requests.as_ref().is_none_or(|q| q.is_empty() || q.iter().any(|n| n == &r.request || n == base)))
            .fold(SliceConfig::default(), |acc, (_, s)| acc.merged(s.clone()));
        let a = mine.asked()?;
        // One slice has one cap, burst rule and priority: its requests must agree.
        match asked {
            None => asked = Some(a),
            Some(prev) if prev != a => return Err("its requests' configurations differ (cap, burst or priority), but one claim is one slice; give them one configuration".into()),
            Some(_) => {}
        }
        let e = per_gpu.entry(index).or_default();
        e.0 = e.0.saturating_add(memory);
        e.1 = e.1.saturating_add(share);
        out.push((base.to_string(), r.device.clone(), index));
    }
    let a = asked.expect("at least one result");
    let mut specs = Vec::new();
    for (index, (memory, share)) in per_gpu {
        let has = gpus.iter().find(|g| g.index == index).map_or(0, |g| g.memory_bytes);
        if memory > has {
            return Err(format!("it is allocated {memory} B of GPU {index}, which has {has} B for claims (memory taken by slices made outside Kubernetes since the scheduler read the ResourceSlice?)"));
        }
        if share > 10_000 {
            return Err(format!("it is guaranteed {}% of GPU {index}, more than the whole GPU", share as f64 / 100.0));
        }
        if a.limit_bps < share as u32 {
            return Err(format!("computeLimit {}% is below the {}% guaranteed on GPU {index}; a cap must be at least the guarantee", a.limit_bps as f64 / 100.0, share as f64 / 100.0));
        }
        let burst = if a.burst_bytes == 0 { 0 } else { a.burst_bytes.max(memory) };
        specs.push(node::DeviceShareSpec { device: index, memory_bytes: memory, compute_share_bps: share as u32, compute_limit_bps: a.limit_bps, memory_burst_bytes: burst });
    }
    Ok(Plan { devices: specs, priority: a.priority, limit_bps: a.limit_bps, burst_bytes: a.burst_bytes, results: out })
}

/// Reads `claims.json`; a missing file is no claims, and a file that does
/// not parse is set aside (renamed `.bad`) with a warning.
fn load_prepared(path: &Path) -> BTreeMap<String, Prepared> {
    match std::fs::read(path) {
        Ok(bytes) => match serde_json::from_slice(&bytes) {
            Ok(m) => m,
            Err(e) => {
                let bad = path.with_extension("json.bad");
                let _ = std::fs::rename(path, &bad);
                tracing::warn!("{} does not parse ({e}); moved to {}: the slices of the claims prepared before are not resized from their pods' annotations", path.display(), bad.display());
                BTreeMap::new()
            }
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
        Err(e) => {
            tracing::warn!("cannot read {} ({e}): the slices of the claims prepared before are not resized from their pods' annotations", path.display());
            BTreeMap::new()
        }
    }
}

/// How the plugin runs.
#[derive(Debug, Clone)]
pub struct DraConfig {
    pub driver: String,
    /// This node's name: the pool's and the ResourceSlice's.
    pub node: String,
    pub egpud_socket: PathBuf,
    /// The kubelet's root directory (`/var/lib/kubelet`).
    pub kubelet_dir: PathBuf,
    /// The directory egpud writes CDI specs into (its `--cdi-dir`).
    pub cdi_dir: PathBuf,
    /// The CDI kind of the GPU vendor's spec (`nvidia.com/gpu`), or none.
    pub gpu_cdi_kind: Option<String>,
    /// How often egpud's GPUs and the sockets are checked, and the
    /// annotations of the node's pods applied.
    pub poll: Duration,
    /// After a failed list or watch of the node's pods, how long before
    /// they are listed again.
    pub pod_poll: Duration,
}

impl DraConfig {
    pub fn registration_socket(&self) -> PathBuf {
        self.kubelet_dir.join("plugins_registry").join(format!("{}-reg.sock", self.driver))
    }
    pub fn plugin_socket(&self) -> PathBuf {
        self.kubelet_dir.join("plugins").join(&self.driver).join("dra.sock")
    }
    /// The claims prepared, kept beside the plugin's socket.
    pub fn state_file(&self) -> PathBuf {
        self.kubelet_dir.join("plugins").join(&self.driver).join("claims.json")
    }

    /// Checks the names the API and the kubelet will see.
    pub fn check(&self) -> Result<(), String> {
        let dns = |s: &str| !s.is_empty() && s.len() <= 253 && s.split('.').all(|l| !l.is_empty() && l.len() <= 63 && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-') && !l.starts_with('-') && !l.ends_with('-'));
        if !dns(&self.driver) || !self.driver.contains('.') {
            return Err(format!("--driver '{}' must be a DNS subdomain with a domain, e.g. {DEFAULT_DRIVER}", self.driver));
        }
        if !dns(&self.node) {
            return Err(format!("--node-name '{}' is not a node name (a DNS subdomain)", self.node));
        }
        if let Some(kind) = &self.gpu_cdi_kind {
            crate::plugin::check_cdi_kind(kind)?;
        }
        if self.poll.is_zero() || self.pod_poll.is_zero() {
            return Err("--poll and --pod-poll must be greater than 0, e.g. 1s".into());
        }
        Ok(())
    }
}

/// Where the plugin reads claims and publishes its ResourceSlice.
pub trait Cluster: Send + Sync + 'static {
    fn claim(&self, namespace: &str, name: &str) -> impl std::future::Future<Output = Result<res::ResourceClaim, String>> + Send;
    /// Makes the ResourceSlice `name` say `spec`: creates it, or replaces it
    /// (its pool generation bumped past the stored one) unless it already
    /// carries `digest` ([`DIGEST_ANNOTATION`]). Owned by the Node `node`,
    /// so that it goes with the Node.
    fn publish(&self, name: &str, node: &str, spec: res::ResourceSliceSpec, digest: &str) -> impl std::future::Future<Output = Result<Written, String>> + Send;
    /// Follows the node's pods (a list, then a watch) into `pods`: their
    /// `egpu.io/` annotations by (namespace, name). Runs until dropped.
    fn follow_pods(&self, node: &str, retry: Duration, pods: Arc<Mutex<Option<PodAnnotations>>>) -> impl std::future::Future<Output = ()> + Send;
}

/// A pod's UID and its `egpu.io/` annotations.
pub type PodEntry = (String, BTreeMap<String, String>);

/// The node's pods, by (namespace, name); `None` before the first list.
pub type PodAnnotations = std::collections::HashMap<(String, String), PodEntry>;

/// What a publish did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    Created,
    Replaced,
    Unchanged,
}

/// The annotation on the ResourceSlice that names what it was written
/// from: a digest of the spec as the plugin built it. The API server may
/// drop fields (of features that are off) and rewrites quantities in its
/// own canonical form, so the stored spec is not compared itself.
pub const DIGEST_ANNOTATION: &str = "egpu.io/spec-digest";

/// A digest of a spec (FNV-1a over its JSON, in hex): the same spec gives
/// the same digest in every build.
pub fn digest(spec: &res::ResourceSliceSpec) -> String {
    let json = serde_json::to_vec(spec).unwrap_or_default();
    let h = json.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3));
    format!("{h:016x}")
}

/// The API server, through the kube client.
#[derive(Clone)]
pub struct Api {
    client: kube::Client,
}

impl Api {
    pub fn new(client: kube::Client) -> Api {
        Api { client }
    }
}

/// How long one API call may take.
const API_TIMEOUT: Duration = Duration::from_secs(10);

/// The ResourceSlice is read back this often even when nothing changed on
/// the node: the kubelet deletes its node's slices when it starts, and
/// anyone may delete one.
pub const REPUBLISH_EVERY: Duration = Duration::from_secs(60);

impl Cluster for Api {
    async fn claim(&self, namespace: &str, name: &str) -> Result<res::ResourceClaim, String> {
        let api: kube::Api<res::ResourceClaim> = kube::Api::namespaced(self.client.clone(), namespace);
        match tokio::time::timeout(API_TIMEOUT, api.get_opt(name)).await {
            Ok(Ok(Some(c))) => Ok(c),
            Ok(Ok(None)) => Err(format!("ResourceClaim {namespace}/{name} does not exist")),
            Ok(Err(e)) => Err(format!("cannot read ResourceClaim {namespace}/{name}: {e}")),
            Err(_) => Err(format!("reading ResourceClaim {namespace}/{name} took over {API_TIMEOUT:?}")),
        }
    }

    async fn publish(&self, name: &str, node: &str, mut spec: res::ResourceSliceSpec, digest: &str) -> Result<Written, String> {
        let api: kube::Api<res::ResourceSlice> = kube::Api::all(self.client.clone());
        let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(self.client.clone());
        // Owned by the Node: deleted with it. Without the Node's UID (no
        // access, no such Node) it is written unowned, and owned later.
        let owner = || async {
            match nodes.get_opt(node).await {
                Ok(Some(n)) => n.metadata.uid.map(|uid| k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                    api_version: "v1".into(),
                    kind: "Node".into(),
                    name: node.to_string(),
                    uid,
                    controller: Some(true),
                    block_owner_deletion: None,
                }),
                Ok(None) => None,
                Err(e) => {
                    tracing::warn!("cannot read Node {node} ({e}); the ResourceSlice is written without an owner for now, so it would outlive the Node");
                    None
                }
            }
        };
        let call = async {
            match api.get_opt(name).await.map_err(|e| format!("cannot read ResourceSlice {name}: {e}"))? {
                None => {
                    let metadata = kube::api::ObjectMeta {
                        name: Some(name.to_string()),
                        annotations: Some(BTreeMap::from([(DIGEST_ANNOTATION.to_string(), digest.to_string())])),
                        owner_references: owner().await.map(|o| vec![o]),
                        ..Default::default()
                    };
                    api.create(&kube::api::PostParams::default(), &res::ResourceSlice { metadata, spec }).await.map_err(|e| format!("cannot create ResourceSlice {name}: {e}"))?;
                    Ok(Written::Created)
                }
                Some(mut have) => {
                    let same = have.metadata.annotations.as_ref().and_then(|a| a.get(DIGEST_ANNOTATION)).is_some_and(|d| d == digest);
                    let owned = have.metadata.owner_references.as_ref().is_some_and(|o| o.iter().any(|o| o.kind == "Node"));
                    let new_owner = if owned { None } else { owner().await };
                    if same && new_owner.is_none() {
                        return Ok(Written::Unchanged);
                    }
                    if let Some(o) = new_owner {
                        have.metadata.owner_references.get_or_insert_default().push(o);
                    }
                    if !same {
                        spec.pool.generation = have.spec.pool.generation.saturating_add(1);
                        have.spec = spec;
                        have.metadata.annotations.get_or_insert_default().insert(DIGEST_ANNOTATION.to_string(), digest.to_string());
                    }
                    api.replace(name, &kube::api::PostParams::default(), &have).await.map_err(|e| format!("cannot update ResourceSlice {name}: {e}"))?;
                    Ok(if same { Written::Unchanged } else { Written::Replaced })
                }
            }
        };
        tokio::time::timeout(API_TIMEOUT, call).await.unwrap_or_else(|_| Err(format!("publishing ResourceSlice {name} took over {API_TIMEOUT:?}")))
    }

    async fn follow_pods(&self, node: &str, retry: Duration, pods: Arc<Mutex<Option<PodAnnotations>>>) {
        let api: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::all(self.client.clone());
        let follow = crate::follow::Follow { what: "this node's pods".into(), fields: Some(format!("spec.nodeName={node}")), labels: None, retry, list_timeout: API_TIMEOUT };
        let entry = |pod: kube::api::ObjectMeta| -> Option<((String, String), PodEntry)> {
            let annotations = pod.annotations.unwrap_or_default().into_iter().filter(|(k, _)| k.starts_with("egpu.io/")).collect();
            Some(((pod.namespace.unwrap_or_default(), pod.name?), (pod.uid.unwrap_or_default(), annotations)))
        };
        let listed = |list: Vec<kube::api::ObjectMeta>| *pods.lock().expect("pods lock") = Some(list.into_iter().filter_map(entry).collect());
        let changed = |pod: kube::api::ObjectMeta, present: bool| {
            let Some((key, ann)) = entry(pod) else { return };
            if let Some(map) = pods.lock().expect("pods lock").as_mut() {
                if present {
                    map.insert(key, ann);
                } else {
                    map.remove(&key);
                }
            }
        };
        follow.run(&api, None, listed, changed).await;
    }
}

/// A claim this plugin prepared, as `claims.json` in the plugin's
/// directory keeps it (so that a restarted plugin still resizes it).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Prepared {
    pub namespace: String,
    pub claim: String,
    /// The pod the claim was made for (from its template), whose
    /// annotations resize the slice; `None` for a claim of its own.
    pub pod: Option<String>,
    /// That pod's UID: a later pod of the same name is not it.
    #[serde(default)]
    pub pod_uid: Option<String>,
    /// The cap and burst cap the claim's configuration asks.
    pub limit_bps: u32,
    pub burst_bytes: u64,
}

/// What the annotations of a claim's pod make of its slice's devices:
/// (device, cap, burst) for each device whose cap or burst is not that yet;
/// or why the annotations cannot be applied.
pub fn resizes(p: &Prepared, annotations: &BTreeMap<String, String>, slice: &node::Slice) -> Result<Vec<(u32, u32, u64)>, String> {
    use crate::plugin::{COMPUTE_ANNOTATION, MEMORY_BURST_ANNOTATION, wanted_over};
    if annotations.contains_key(COMPUTE_ANNOTATION) {
        return Err(format!("{COMPUTE_ANNOTATION}: a DRA claim's guarantee is what the scheduler counted; ask for it in the claim (capacity.requests.compute), and remove the annotation"));
    }
    // The burst cap in the claim's units (as in its SliceConfig).
    let mut rest = annotations.clone();
    let burst = match rest.remove(MEMORY_BURST_ANNOTATION) {
        Some(v) => burst_bytes(&v).map_err(|e| format!("{MEMORY_BURST_ANNOTATION}: {e}"))?,
        None => p.burst_bytes,
    };
    let (_, limit, _) = wanted_over(&rest, (0, p.limit_bps, 0))?;
    if limit == 0 {
        return Err("egpu.io/gpu-compute-limit: 0% would never run".into());
    }
    // All of the slice's GPUs or none: one cap for the slice.
    if let Some(d) = slice.devices.iter().find(|d| d.compute_share_bps > limit) {
        return Err(format!("egpu.io/gpu-compute-limit: {}% is below the {}% guaranteed on GPU {}", f64::from(limit) / 100.0, f64::from(d.compute_share_bps) / 100.0, d.device));
    }
    Ok(slice
        .devices
        .iter()
        .map(|d| (d.device, limit, if burst == 0 { 0 } else { burst.max(d.memory_limit_bytes) }, d))
        .filter(|(_, l, b, d)| (*l, *b) != (d.compute_limit_bps, d.memory_burst_bytes))
        .map(|(dev, l, b, _)| (dev, l, b))
        .collect())
}

/// State shared by the services and the loops.
pub struct Shared<C: Cluster> {
    cfg: DraConfig,
    cluster: C,
    /// The digest last published, and when it was last read back.
    published: Mutex<Option<(String, std::time::Instant)>>,
    /// Set when the kubelet (re)registers the plugin: publish again now (a
    /// starting kubelet has deleted its node's ResourceSlices).
    republish: Arc<tokio::sync::Notify>,
    /// Prepares and unprepares run one at a time (egpud's answers to a
    /// repeated create are compared, not raced).
    lock: tokio::sync::Mutex<()>,
    /// The claims prepared, by UID (saved in `claims.json`).
    prepared: Mutex<BTreeMap<String, Prepared>>,
    /// The node's pods' annotations, as followed.
    pods: Arc<Mutex<Option<PodAnnotations>>>,
    /// The last warning about each slice.
    warned: Mutex<std::collections::HashMap<String, String>>,
    /// `claims.json` is behind `prepared` (a save failed, or is due).
    dirty: std::sync::atomic::AtomicBool,
    /// A publish the kubelet's registration asked for is still to be done.
    force_publish: std::sync::atomic::AtomicBool,
}

impl<C: Cluster> Shared<C> {
    pub fn new(cfg: DraConfig, cluster: C) -> Result<Arc<Shared<C>>, String> {
        cfg.check()?;
        let prepared = load_prepared(&cfg.state_file());
        Ok(Arc::new(Shared {
            cfg,
            cluster,
            published: Mutex::new(None),
            republish: Arc::new(tokio::sync::Notify::new()),
            lock: tokio::sync::Mutex::new(()),
            prepared: Mutex::new(prepared),
            pods: Arc::new(Mutex::new(None)),
            warned: Mutex::new(std::collections::HashMap::new()),
            dirty: std::sync::atomic::AtomicBool::new(false),
            force_publish: std::sync::atomic::AtomicBool::new(false),
        }))
    }

    fn mark_dirty(&self) {
        self.dirty.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Saves `claims.json` if it is behind; a failure is tried again at the
    /// next refresh.
    fn save_if_dirty(&self) {
        if self.dirty.swap(false, std::sync::atomic::Ordering::SeqCst) && !self.save() {
            self.mark_dirty();
        }
    }

    /// Saves the prepared claims: a new file, synced, renamed over the old
    /// one, and the directory synced. Whether it did.
    fn save(&self) -> bool {
        use std::io::Write;
        let path = self.cfg.state_file();
        let json = serde_json::to_vec_pretty(&*self.prepared.lock().expect("prepared lock")).unwrap_or_default();
        let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
        let tmp = dir.join(format!(".claims.json.{}", std::process::id()));
        let done = (|| {
            std::fs::create_dir_all(&dir)?;
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&json)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            std::fs::File::open(&dir)?.sync_all()
        })();
        if let Err(e) = done {
            let _ = std::fs::remove_file(&tmp);
            tracing::warn!("cannot save {} ({e}); trying again at the next refresh (until then a restarted plugin would not resize the slices of the claims prepared since)", path.display());
            return false;
        }
        true
    }

    /// Warns about a slice, unless the last warning about it said the same
    /// (cleared when a resize of it succeeds, or it goes).
    fn warn_once(&self, slice: &str, why: String) {
        if self.warned.lock().expect("warned lock").insert(slice.to_string(), why.clone()).as_ref() != Some(&why) {
            tracing::warn!(slice = %slice, "{why}");
        }
    }

    /// Resizes the slices of claims made for a pod to what the pod's
    /// annotations ask (the cap and the burst cap; absent, the claim's), and
    /// forgets claims whose slice is gone. Runs under `lock`, and lists the
    /// slices itself, so that a claim being prepared is not taken for gone.
    async fn apply_pod_annotations(&self, client: &mut egpu_node::client::Client) -> Result<(), String> {
        let slices = client.list_slices(node::ListSlicesRequest {}).await.map_err(|e| e.message().to_string())?.into_inner().slices;
        let prepared = self.prepared.lock().expect("prepared lock").clone();
        let gone: Vec<String> = prepared.keys().filter(|uid| !slices.iter().any(|s| s.name == slice_name(uid))).cloned().collect();
        if !gone.is_empty() {
            for uid in &gone {
                tracing::info!(slice = %slice_name(uid), "the slice of a prepared claim is gone (deleted on the node?); its claim is forgotten");
                self.warned.lock().expect("warned lock").remove(&slice_name(uid));
            }
            self.prepared.lock().expect("prepared lock").retain(|uid, _| !gone.contains(uid));
            self.mark_dirty();
        }
        self.save_if_dirty();
        let Some(pods) = self.pods.lock().expect("pods lock").clone() else { return Ok(()) };
        for (uid, p) in &prepared {
            let (Some(pod), Some(slice)) = (&p.pod, slices.iter().find(|s| s.name == slice_name(uid))) else { continue };
            // The pod the claim was made for, not a later one of the same name.
            let Some((_, annotations)) = pods.get(&(p.namespace.clone(), pod.clone())).filter(|(pod_uid, _)| p.pod_uid.as_ref().is_none_or(|u| u == pod_uid)) else { continue };
            let who = format!("pod {}/{pod}", p.namespace);
            match resizes(p, annotations, slice) {
                Ok(changes) => {
                    let mut failed = false;
                    for (device, limit, burst) in changes {
                        let req = node::ResizeSliceRequest { name: slice.name.clone(), devices: vec![device], compute_limit_bps: Some(limit), memory_burst_bytes: Some(burst), ..Default::default() };
                        match client.resize_slice(req).await {
                            Ok(_) => tracing::info!(slice = %slice.name, pod = %format!("{}/{pod}", p.namespace), device, limit_bps = limit, burst_bytes = burst, "resized from the pod's annotations"),
                            Err(e) if matches!(e.code(), tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Unknown) => return Err(e.message().to_string()),
                            Err(e) => {
                                failed = true;
                                self.warn_once(&slice.name, format!("{who}: egpud refused the resize of GPU {device} ({}); tried again every --poll", e.message()));
                            }
                        }
                    }
                    if !failed {
                        self.warned.lock().expect("warned lock").remove(&slice.name);
                    }
                }
                Err(why) => self.warn_once(&slice.name, format!("{who}: {why}; the slice keeps its limits")),
            }
        }
        Ok(())
    }

    async fn egpud(&self) -> Result<egpu_node::client::Client, String> {
        egpu_node::client::connect(&self.cfg.egpud_socket).await.map_err(|e| format!("egpud is not reachable at {}: {e}", self.cfg.egpud_socket.display()))
    }

    /// egpud's GPUs, each with the memory it has for claims (less what
    /// slices made outside the driver hold), and what those slices hold.
    async fn read_node(client: &mut egpu_node::client::Client) -> Result<(Vec<Gpu>, Vec<node::Slice>), String> {
        let n = client.get_node(node::GetNodeRequest {}).await.map_err(|e| e.message().to_string())?.into_inner();
        let slices = client.list_slices(node::ListSlicesRequest {}).await.map_err(|e| e.message().to_string())?.into_inner().slices;
        let gpus = n.devices.iter().map(Gpu::from).collect();
        Ok((gpus, slices))
    }

    /// Reads egpud; publishes the ResourceSlice when what it would say
    /// changed, when the last publish failed, when `force` (the kubelet
    /// registered the plugin), or every [`REPUBLISH_EVERY`] to find it
    /// deleted.
    pub async fn refresh(&self, force: bool) {
        let read = async {
            let mut client = self.egpud().await?;
            let (gpus, slices) = Self::read_node(&mut client).await?;
            Ok::<_, String>((client, gpus, slices))
        };
        let (mut client, gpus, slices) = match read.await {
            Ok(r) => r,
            Err(e) => {
                if force {
                    self.force_publish.store(true, std::sync::atomic::Ordering::SeqCst);
                }
                tracing::warn!("cannot read egpud ({e}); the ResourceSlice stays as last published, and claims cannot be prepared until egpud answers");
                return;
            }
        };
        {
            let _one = self.lock.lock().await;
            if let Err(e) = self.apply_pod_annotations(&mut client).await {
                tracing::warn!("egpud did not answer while the pods' annotations were applied ({e}); trying again at the next refresh");
            }
        }
        let spec = resource_slice_spec(&self.cfg.driver, &self.cfg.node, &gpus, &reserved_elsewhere(&slices), 0);
        let d = digest(&spec);
        // A registration's publish waits here until one succeeds.
        let force = force || self.force_publish.swap(false, std::sync::atomic::Ordering::SeqCst);
        let fresh = self.published.lock().expect("published lock").as_ref().is_some_and(|(p, at)| *p == d && at.elapsed() < REPUBLISH_EVERY);
        if fresh && !force {
            return;
        }
        let name = resource_slice_name(&self.cfg.node, &self.cfg.driver);
        let devices = spec.devices.as_ref().map_or(0, Vec::len);
        match self.cluster.publish(&name, &self.cfg.node, spec, &d).await {
            Ok(w) => {
                if w != Written::Unchanged {
                    tracing::info!(slice = %name, devices, "{} the node's ResourceSlice", if w == Written::Created { "created" } else { "updated" });
                }
                *self.published.lock().expect("published lock") = Some((d, std::time::Instant::now()));
            }
            Err(e) => {
                if force {
                    self.force_publish.store(true, std::sync::atomic::Ordering::SeqCst);
                }
                tracing::warn!("{e}; retrying at the next refresh");
            }
        }
    }

    /// Prepares one claim: its devices, or why not.
    pub async fn prepare(&self, c: &v1::Claim) -> Result<Vec<v1::Device>, String> {
        let _one = self.lock.lock().await;
        let claim = self.cluster.claim(&c.namespace, &c.name).await?;
        let uid = claim.metadata.uid.as_deref().unwrap_or("");
        if uid != c.uid {
            return Err(format!("ResourceClaim {}/{} has UID {uid}, not {} (deleted and created again?)", c.namespace, c.name, c.uid));
        }
        let mut client = self.egpud().await?;
        let name = slice_name(&c.uid);
        // Each GPU with the memory it has for claims (the scheduler counts
        // the claims' own).
        let (mut gpus, slices) = Self::read_node(&mut client).await?;
        let reserved = reserved_elsewhere(&slices);
        for g in &mut gpus {
            g.memory_bytes = g.memory_bytes.saturating_sub(reserved.get(&g.index).map_or(0, |r| r.memory_bytes));
        }
        let p = plan(&claim, &self.cfg.driver, &self.cfg.node, &gpus).map_err(|e| format!("ResourceClaim {}/{}: {e}", c.namespace, c.name))?;
        let where_ = p.devices.iter().map(|d| format!("{} B on GPU {}", d.memory_bytes, d.device)).collect::<Vec<_>>().join(", ");
        let req = node::CreateSliceRequest { name: name.clone(), priority: p.priority as i32, devices: p.devices.clone(), ephemeral: false, owner_pid: 0 };
        match client.create_slice(req).await {
            Ok(_) => tracing::info!(slice = %name, claim = %format!("{}/{}", c.namespace, c.name), devices = %where_, "prepared"),
            Err(e) if e.code() == tonic::Code::AlreadyExists => {
                // Prepared before (a repeated call, or a restarted plugin).
                // The guarantees must be the claim's; a cap, burst or
                // priority may have been changed since (`egpu resize`).
                let s = client.get_slice(node::GetSliceRequest { name: name.clone() }).await.map_err(|e| e.message().to_string())?.into_inner();
                let mut have: Vec<(u32, u64, u32)> = s.devices.iter().map(|d| (d.device, d.memory_limit_bytes, d.compute_share_bps)).collect();
                have.sort_unstable();
                let want: Vec<(u32, u64, u32)> = p.devices.iter().map(|d| (d.device, d.memory_bytes, d.compute_share_bps)).collect();
                if have != want {
                    return Err(format!(
                        "slice {name} exists with other GPUs or guarantees ((GPU, memory, share in basis points): {have:?}, the claim's: {want:?}); delete it (egpu rm {name}) and the kubelet will prepare the claim again"
                    ));
                }
            }
            Err(e) => return Err(format!("egpud refused slice {name} ({where_}): {}", e.message())),
        }
        if !self.cfg.cdi_dir.join(egpu_node::cdi::spec_file(&name)).exists() {
            let _ = client.delete_slice(node::DeleteSliceRequest { name: name.clone(), force: false }).await;
            return Err(format!("egpud wrote no CDI spec for {name} in {}: start egpud with --cdi-dir {}", self.cfg.cdi_dir.display(), self.cfg.cdi_dir.display()));
        }
        let owner = claim.metadata.owner_references.iter().flatten().find(|o| o.kind == "Pod" && o.api_version == "v1" && o.controller == Some(true));
        let entry = Prepared {
            namespace: c.namespace.clone(),
            claim: c.name.clone(),
            pod: owner.map(|o| o.name.clone()),
            pod_uid: owner.map(|o| o.uid.clone()),
            limit_bps: p.limit_bps,
            burst_bytes: p.burst_bytes,
        };
        let old = self.prepared.lock().expect("prepared lock").insert(c.uid.clone(), entry.clone());
        if old.as_ref() != Some(&entry) {
            self.mark_dirty();
            self.save_if_dirty();
        }
        Ok(kubelet_devices(&self.cfg, &name, &p.results))
    }

    /// Unprepares one claim: deletes its slice (gone already is fine).
    pub async fn unprepare(&self, c: &v1::Claim) -> Result<(), String> {
        let _one = self.lock.lock().await;
        let name = slice_name(&c.uid);
        let mut client = self.egpud().await?;
        match client.delete_slice(node::DeleteSliceRequest { name: name.clone(), force: false }).await {
            Ok(_) => tracing::info!(slice = %name, claim = %format!("{}/{}", c.namespace, c.name), "unprepared"),
            Err(e) if e.code() == tonic::Code::NotFound => {}
            Err(e) => return Err(format!("cannot delete slice {name}: {}", e.message())),
        }
        self.warned.lock().expect("warned lock").remove(&name);
        if self.prepared.lock().expect("prepared lock").remove(&c.uid).is_some() {
            self.mark_dirty();
            self.save_if_dirty();
        }
        Ok(())
    }
}

/// The kubelet's device list for a prepared claim: one entry per GPU,
/// naming the requests allocated on it and carrying that GPU's own CDI
/// device (with `--gpu-cdi-kind`); the slice's CDI device is on the first
/// entry only, which names every request. The kubelet gives a container
/// the entries of the requests it names (all of them when it names the
/// claim) and does not remove repeats, so each CDI device is given once
/// whichever requests a container names.
pub fn kubelet_devices(cfg: &DraConfig, slice: &str, results: &[(String, String, u32)]) -> Vec<v1::Device> {
    let mut out: Vec<(v1::Device, u32)> = Vec::new();
    let mut all: Vec<String> = Vec::new();
    for (request, device, gpu) in results {
        if !all.contains(request) {
            all.push(request.clone());
        }
        match out.iter_mut().find(|(d, _)| d.device_name == *device) {
            Some((d, _)) if !d.request_names.contains(request) => d.request_names.push(request.clone()),
            Some(_) => {}
            None => out.push((v1::Device { request_names: vec![request.clone()], pool_name: cfg.node.clone(), device_name: device.clone(), cdi_device_ids: vec![] }, *gpu)),
        }
    }
    out.into_iter()
        .enumerate()
        .map(|(i, (mut d, gpu))| {
            if i == 0 {
                d.request_names = all.clone();
                d.cdi_device_ids.push(egpu_node::cdi::device_name(slice));
            }
            if let Some(kind) = &cfg.gpu_cdi_kind {
                d.cdi_device_ids.push(format!("{kind}={gpu}"));
            }
            d
        })
        .collect()
}

/// The `DRAPlugin` service, both versions.
pub struct Service<C: Cluster>(pub Arc<Shared<C>>);

impl<C: Cluster> Clone for Service<C> {
    fn clone(&self) -> Self {
        Service(self.0.clone())
    }
}

impl<C: Cluster> Service<C> {
    async fn prepare_all(&self, r: v1::NodePrepareResourcesRequest) -> v1::NodePrepareResourcesResponse {
        let mut claims = std::collections::HashMap::new();
        for c in r.claims {
            let answer = match self.0.prepare(&c).await {
                Ok(devices) => v1::NodePrepareResourceResponse { devices, error: String::new() },
                Err(error) => {
                    tracing::warn!(claim = %format!("{}/{}", c.namespace, c.name), "cannot prepare: {error}");
                    v1::NodePrepareResourceResponse { devices: vec![], error }
                }
            };
            claims.insert(c.uid, answer);
        }
        v1::NodePrepareResourcesResponse { claims }
    }

    async fn unprepare_all(&self, r: v1::NodeUnprepareResourcesRequest) -> v1::NodeUnprepareResourcesResponse {
        let mut claims = std::collections::HashMap::new();
        for c in r.claims {
            let error = self.0.unprepare(&c).await.err().unwrap_or_default();
            claims.insert(c.uid, v1::NodeUnprepareResourceResponse { error });
        }
        v1::NodeUnprepareResourcesResponse { claims }
    }
}

#[tonic::async_trait]
impl<C: Cluster> v1::dra_plugin_server::DraPlugin for Service<C> {
    async fn node_prepare_resources(&self, r: Request<v1::NodePrepareResourcesRequest>) -> Result<Response<v1::NodePrepareResourcesResponse>, Status> {
        Ok(Response::new(self.prepare_all(r.into_inner()).await))
    }
    async fn node_unprepare_resources(&self, r: Request<v1::NodeUnprepareResourcesRequest>) -> Result<Response<v1::NodeUnprepareResourcesResponse>, Status> {
        Ok(Response::new(self.unprepare_all(r.into_inner()).await))
    }
}

/// v1beta1's messages are v1's, field for field: a message of one is read
/// as the other through its encoding.
fn convert<A: prost::Message, B: prost::Message + Default>(a: &A) -> Result<B, Status> {
    B::decode(a.encode_to_vec().as_slice()).map_err(|e| Status::internal(format!("v1beta1/v1 conversion: {e}")))
}

#[tonic::async_trait]
impl<C: Cluster> v1beta1::dra_plugin_server::DraPlugin for Service<C> {
    async fn node_prepare_resources(&self, r: Request<v1beta1::NodePrepareResourcesRequest>) -> Result<Response<v1beta1::NodePrepareResourcesResponse>, Status> {
        let out = self.prepare_all(convert(&r.into_inner())?).await;
        Ok(Response::new(convert(&out)?))
    }
    async fn node_unprepare_resources(&self, r: Request<v1beta1::NodeUnprepareResourcesRequest>) -> Result<Response<v1beta1::NodeUnprepareResourcesResponse>, Status> {
        let out = self.unprepare_all(convert(&r.into_inner())?).await;
        Ok(Response::new(convert(&out)?))
    }
}

/// The plugin watcher's `Registration` service.
#[derive(Clone)]
pub struct Registrar {
    info: registration::PluginInfo,
    /// Woken when the kubelet says the plugin is registered.
    registered: Arc<tokio::sync::Notify>,
}

#[tonic::async_trait]
impl registration::registration_server::Registration for Registrar {
    async fn get_info(&self, _: Request<registration::InfoRequest>) -> Result<Response<registration::PluginInfo>, Status> {
        Ok(Response::new(self.info.clone()))
    }
    async fn notify_registration_status(&self, r: Request<registration::RegistrationStatus>) -> Result<Response<registration::RegistrationStatusResponse>, Status> {
        let r = r.into_inner();
        if r.plugin_registered {
            tracing::info!(driver = %self.info.name, "registered with the kubelet");
            self.registered.notify_one();
        } else {
            tracing::error!(driver = %self.info.name, "the kubelet refused the registration: {}", r.error);
        }
        Ok(Response::new(registration::RegistrationStatusResponse {}))
    }
}

fn bind(path: &Path) -> std::io::Result<tokio::net::UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    tokio::net::UnixListener::bind(path)
}

/// Serves both sockets and keeps the ResourceSlice current until
/// `shutdown`; serves again when a socket is removed (the kubelet's plugin
/// directories wiped). The plugin socket is served before the registration
/// socket appears, so the kubelet finds it answering.
pub async fn run<C: Cluster>(shared: Arc<Shared<C>>, shutdown: impl std::future::Future<Output = ()> + Send + 'static) -> Result<(), String> {
    let cfg = shared.cfg.clone();
    let (stop_all, stopping) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_all.send(true);
    });
    let follower = {
        let shared = shared.clone();
        tokio::spawn(async move { shared.cluster.follow_pods(&shared.cfg.node, shared.cfg.pod_poll, shared.pods.clone()).await })
    };
    shared.refresh(false).await;
    let refresher = {
        let shared = shared.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + shared.cfg.poll, shared.cfg.poll);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let force = tokio::select! {
                    _ = tick.tick() => false,
                    _ = shared.republish.notified() => true,
                };
                shared.refresh(force).await;
            }
        })
    };
    let (plugin_sock, reg_sock) = (cfg.plugin_socket(), cfg.registration_socket());
    let info = registration::PluginInfo {
        r#type: PLUGIN_TYPE.into(),
        name: cfg.driver.clone(),
        endpoint: plugin_sock.display().to_string(),
        supported_versions: SUPPORTED_VERSIONS.iter().map(|s| s.to_string()).collect(),
    };
    let result = loop {
        let served = (|| Ok::<_, std::io::Error>((bind(&plugin_sock)?, file_id(&plugin_sock), bind(&reg_sock)?, file_id(&reg_sock))))();
        let (plugin_l, plugin_id, reg_l, reg_id) = match served {
            Ok(s) => s,
            Err(e) => break Err(format!("cannot serve on {} / {}: {e}", plugin_sock.display(), reg_sock.display())),
        };
        let (stop, stopped) = watch::channel(false);
        let until = |mut rx: watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let svc = Service(shared.clone());
        let plugin = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(v1::dra_plugin_server::DraPluginServer::new(svc.clone()))
                .add_service(v1beta1::dra_plugin_server::DraPluginServer::new(svc))
                .serve_with_incoming_shutdown(tokio_stream::wrappers::UnixListenerStream::new(plugin_l), until(stopped.clone())),
        );
        let reg = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(registration::registration_server::RegistrationServer::new(Registrar { info: info.clone(), registered: shared.republish.clone() }))
                .serve_with_incoming_shutdown(tokio_stream::wrappers::UnixListenerStream::new(reg_l), until(stopped)),
        );
        tracing::info!(driver = %cfg.driver, "serving {} and {}", plugin_sock.display(), reg_sock.display());
        let mut tick = tokio::time::interval(cfg.poll);
        let mut stopping = stopping.clone();
        let done = loop {
            tokio::select! {
                _ = stopping.wait_for(|s| *s) => break true,
                _ = tick.tick() => {
                    if file_id(&plugin_sock) != plugin_id || file_id(&reg_sock) != reg_id || plugin.is_finished() || reg.is_finished() {
                        tracing::info!("a socket was removed (kubelet restart?): serving again");
                        break false;
                    }
                }
            }
        };
        let _ = stop.send(true);
        let _ = plugin.await;
        let _ = reg.await;
        if done {
            for (p, id) in [(&reg_sock, reg_id), (&plugin_sock, plugin_id)] {
                if file_id(p) == id {
                    let _ = std::fs::remove_file(p);
                }
            }
            break Ok(());
        }
    };
    refresher.abort();
    follower.abort();
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn gpus() -> Vec<Gpu> {
        (0..2).map(|i| Gpu { index: i, uuid: format!("GPU-{i}"), model: "NVIDIA H200".into(), memory_bytes: 16 << 30 }).collect()
    }

    fn claim(v: serde_json::Value) -> res::ResourceClaim {
        serde_json::from_value(v).unwrap()
    }

    fn result(request: &str, device: &str, consumed: Option<(&str, &str)>) -> serde_json::Value {
        let mut r = serde_json::json!({"request": request, "driver": DEFAULT_DRIVER, "pool": "node-a", "device": device});
        if let Some((m, c)) = consumed {
            r["consumedCapacity"] = serde_json::json!({MEMORY: m, COMPUTE: c});
            r["shareID"] = serde_json::json!("7c3f0c9e-5b0e-4b9e-9b43-0b8f2f0e7a11");
        }
        r
    }

    fn allocated(results: Vec<serde_json::Value>, config: serde_json::Value) -> res::ResourceClaim {
        claim(serde_json::json!({
            "metadata": {"name": "c", "namespace": "ns", "uid": "u-1"},
            "spec": {"devices": {"requests": []}},
            "status": {"allocation": {"devices": {"results": results, "config": config}}}
        }))
    }

    #[test]
    fn the_resource_slice_publishes_each_gpu_with_consumable_memory_and_compute() {
        let spec = resource_slice_spec(DEFAULT_DRIVER, "node-a", &gpus(), &BTreeMap::new(), 3);
        assert_eq!((spec.driver.as_str(), spec.node_name.as_deref(), spec.pool.name.as_str(), spec.pool.generation), (DEFAULT_DRIVER, Some("node-a"), "node-a", 3));
        let d = spec.devices.as_ref().unwrap();
        assert_eq!(d.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(), ["gpu-0", "gpu-1"]);
        assert_eq!(d[1].allow_multiple_allocations, Some(true));
        let cap = d[1].capacity.as_ref().unwrap();
        assert_eq!(cap[MEMORY].value.0, (16u64 << 30).to_string());
        assert_eq!(cap[MEMORY].request_policy.as_ref().unwrap().default.as_ref().unwrap().0, (16u64 << 30).to_string(), "no amount: the whole GPU's memory");
        assert_eq!(cap[COMPUTE].value.0, "100");
        assert_eq!(cap[COMPUTE].request_policy.as_ref().unwrap().default.as_ref().unwrap().0, "0", "no amount: no guarantee");
        let attrs = d[1].attributes.as_ref().unwrap();
        assert_eq!(attrs["index"].int, Some(1));
        assert_eq!(attrs["uuid"].string.as_deref(), Some("GPU-1"));
        // The API's JSON names.
        let j = serde_json::to_value(&spec).unwrap();
        assert_eq!(j["devices"][0]["allowMultipleAllocations"], true);
        assert_eq!(j["devices"][0]["capacity"]["memory"]["requestPolicy"]["validRange"]["min"], "1048576");
        assert_eq!(j["pool"]["resourceSliceCount"], 1);
        assert_eq!(resource_slice_name("node-a", DEFAULT_DRIVER), "node-a-gpu.egpu.io");
    }

    #[test]
    fn what_slices_made_elsewhere_hold_is_not_published() {
        let slice = |name: &str, device: u32, memory: u64, share: u32| node::Slice {
            name: name.into(),
            devices: vec![node::SliceDevice { device, memory_limit_bytes: memory, compute_share_bps: share, ..Default::default() }],
            ..Default::default()
        };
        // An `egpu create` slice on GPU 0 (6 GiB, 12.5%), one of ours on GPU 1, and a second outside one filling GPU 1.
        let slices = [slice("train", 0, 6 << 30, 1250), slice("dra-u-1", 1, 8 << 30, 5000), slice("big", 1, (16 << 30) - 4096, 0)];
        let reserved = reserved_elsewhere(&slices);
        assert_eq!(reserved[&0], Reserved { memory_bytes: 6 << 30, compute_bps: 1250 });
        let spec = resource_slice_spec(DEFAULT_DRIVER, "node-a", &gpus(), &reserved, 1);
        let d = spec.devices.unwrap();
        assert_eq!(d.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(), ["gpu-0"], "GPU 1 has 4 KiB left for claims: not published");
        let cap = d[0].capacity.as_ref().unwrap();
        assert_eq!(cap[MEMORY].value.0, (10u64 << 30).to_string());
        assert_eq!(cap[MEMORY].request_policy.as_ref().unwrap().valid_range.as_ref().unwrap().max.as_ref().unwrap().0, (10u64 << 30).to_string());
        assert_eq!(cap[COMPUTE].value.0, "87", "12.5% taken: 87 whole percents left");
    }

    #[test]
    fn a_claim_becomes_one_slice_with_its_consumed_capacity() {
        let cfg = serde_json::json!([{"source": "FromClaim", "opaque": {"driver": DEFAULT_DRIVER, "parameters": {"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND, "computeLimit": "50%", "memoryBurst": "12GiB", "priority": "high"}}}]);
        let p = plan(&allocated(vec![result("gpu", "gpu-1", Some(("10Gi", "30")))], cfg), DEFAULT_DRIVER, "node-a", &gpus()).unwrap();
        assert_eq!(p.devices, [node::DeviceShareSpec { device: 1, memory_bytes: 10 << 30, compute_share_bps: 3000, compute_limit_bps: 5000, memory_burst_bytes: 12 << 30 }]);
        assert_eq!(p.priority, node::Priority::High);
        assert_eq!(p.results, [("gpu".to_string(), "gpu-1".to_string(), 1)]);
        // Without consumable capacity (the feature off): whole GPUs, no guarantee, defaults.
        let p = plan(&allocated(vec![result("a", "gpu-0", None), result("a", "gpu-1", None)], serde_json::json!([])), DEFAULT_DRIVER, "node-a", &gpus()).unwrap();
        assert_eq!(p.devices.iter().map(|d| (d.device, d.memory_bytes, d.compute_share_bps, d.compute_limit_bps, d.memory_burst_bytes)).collect::<Vec<_>>(), [(0, 16 << 30, 0, 10_000, 0), (1, 16 << 30, 0, 10_000, 0)]);
        assert_eq!(p.priority, node::Priority::Normal);
        // Two shares of one GPU (two requests): summed on one device.
        let p = plan(&allocated(vec![result("a", "gpu-0", Some(("2Gi", "10"))), result("b", "gpu-0", Some(("3Gi", "15")))], serde_json::json!([])), DEFAULT_DRIVER, "node-a", &gpus()).unwrap();
        assert_eq!(p.devices.iter().map(|d| (d.device, d.memory_bytes, d.compute_share_bps)).collect::<Vec<_>>(), [(0, 5 << 30, 2500)]);
        // A burst cap below the guarantee is raised to it.
        let cfg = serde_json::json!([{"source": "FromClass", "opaque": {"driver": DEFAULT_DRIVER, "parameters": {"memoryBurst": "1GiB"}}}]);
        let p = plan(&allocated(vec![result("a", "gpu-0", Some(("2Gi", "0")))], cfg), DEFAULT_DRIVER, "node-a", &gpus()).unwrap();
        assert_eq!(p.devices[0].memory_burst_bytes, 2 << 30);
    }

    #[test]
    fn the_claims_configuration_overrides_the_class_and_other_drivers_are_left_alone() {
        let cfg = serde_json::json!([
            {"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": DEFAULT_DRIVER, "parameters": {"computeLimit": "40%"}}},
            {"source": "FromClass", "opaque": {"driver": DEFAULT_DRIVER, "parameters": {"computeLimit": "90%", "priority": "best-effort"}}},
            {"source": "FromClaim", "opaque": {"driver": "other.example.com", "parameters": {"anything": 1}}},
            {"source": "FromClaim", "requests": ["other-request"], "opaque": {"driver": DEFAULT_DRIVER, "parameters": {"computeLimit": "10%"}}}
        ]);
        let mut results = vec![result("gpu", "gpu-0", Some(("1Gi", "5")))];
        results.push(serde_json::json!({"request": "nic", "driver": "other.example.com", "pool": "p", "device": "eth0"}));
        let p = plan(&allocated(results, cfg), DEFAULT_DRIVER, "node-a", &gpus()).unwrap();
        assert_eq!((p.devices[0].compute_limit_bps, p.priority), (4000, node::Priority::BestEffort));
        assert_eq!(p.results.len(), 1, "the other driver's device is not ours");
    }

    #[test]
    fn what_cannot_become_a_slice_says_why() {
        let none = serde_json::json!([]);
        let err = |c: res::ResourceClaim| plan(&c, DEFAULT_DRIVER, "node-a", &gpus()).unwrap_err();
        let unallocated = claim(serde_json::json!({"metadata": {"name": "c"}, "spec": {"devices": {}}}));
        assert!(err(unallocated).contains("not allocated"));
        let mut wrong_pool = result("a", "gpu-0", None);
        wrong_pool["pool"] = "node-b".into();
        assert!(err(allocated(vec![wrong_pool], none.clone())).contains("pool 'node-b'"));
        assert!(err(allocated(vec![result("a", "gpu-7", None)], none.clone())).contains("GPU 7"));
        assert!(err(allocated(vec![result("a", "nic-0", None)], none.clone())).contains("not one this driver publishes"));
        assert!(err(allocated(vec![result("a", "gpu-00", None)], none.clone())).contains("not one this driver publishes"));
        assert!(err(allocated(vec![result("a", "gpu-0", Some(("lots", "0")))], none.clone())).contains("consumed memory of gpu-0"));
        assert!(err(allocated(vec![result("a", "gpu-0", Some(("0", "0")))], none.clone())).contains("no memory"));
        assert!(err(allocated(vec![result("a", "gpu-0", Some(("1Gi", "60"))), result("b", "gpu-0", Some(("1Gi", "60")))], none.clone())).contains("more than the whole GPU"));
        let capped = serde_json::json!([{"source": "FromClaim", "opaque": {"driver": DEFAULT_DRIVER, "parameters": {"computeLimit": "20%"}}}]);
        assert!(err(allocated(vec![result("a", "gpu-1", Some(("1Gi", "30")))], capped)).contains("computeLimit 20% is below the 30% guaranteed on GPU 1"));
        let mut admin = result("a", "gpu-0", None);
        admin["adminAccess"] = true.into();
        assert!(err(allocated(vec![admin], none.clone())).contains("admin access"));
        let other = serde_json::json!({"request": "nic", "driver": "other.example.com", "pool": "p", "device": "eth0"});
        assert!(err(allocated(vec![other], none)).contains("none of its allocated devices"));
        let bad = |params: serde_json::Value| {
            let cfg = serde_json::json!([{"source": "FromClaim", "opaque": {"driver": DEFAULT_DRIVER, "parameters": params}}]);
            err(allocated(vec![result("a", "gpu-0", None)], cfg))
        };
        assert!(bad(serde_json::json!({"computeLimt": "50%"})).contains("unknown field `computeLimt`"));
        assert!(bad(serde_json::json!({"computeLimit": "150%"})).starts_with("computeLimit:"));
        assert!(bad(serde_json::json!({"computeLimit": "0%"})).contains("never run"));
        assert!(bad(serde_json::json!({"memoryBurst": "lots"})).starts_with("memoryBurst:"));
        assert!(bad(serde_json::json!({"priority": "urgent"})).contains("'urgent'"));
        assert!(bad(serde_json::json!({"apiVersion": "gpu.egpu.io/v2"})).contains("apiVersion 'gpu.egpu.io/v2'"));
        assert!(bad(serde_json::json!({"kind": "Gpu"})).contains("kind 'Gpu'"));
        assert!(bad(serde_json::json!("a string")).contains("does not parse"));
        // Two requests with different configurations: one slice cannot have both.
        let cfg = serde_json::json!([{"source": "FromClaim", "requests": ["b"], "opaque": {"driver": DEFAULT_DRIVER, "parameters": {"computeLimit": "20%"}}}]);
        assert!(err(allocated(vec![result("a", "gpu-0", None), result("b", "gpu-1", None)], cfg)).contains("configurations differ"));
    }

    #[test]
    fn subrequests_are_named_by_their_request_and_a_request_is_not_given_one_gpu_twice() {
        let mut r = result("main/small", "gpu-1", Some(("2Gi", "5")));
        r["shareID"] = "s1".into();
        let p = plan(&allocated(vec![r], serde_json::json!([])), DEFAULT_DRIVER, "node-a", &gpus()).unwrap();
        assert_eq!(p.results, [("main".to_string(), "gpu-1".to_string(), 1)]);
        // `count: 2` without a constraint: the allocator may put both shares on one GPU.
        let twice = allocated(vec![result("gpu", "gpu-0", Some(("4Gi", "0"))), result("gpu", "gpu-0", Some(("4Gi", "0")))], serde_json::json!([]));
        let e = plan(&twice, DEFAULT_DRIVER, "node-a", &gpus()).unwrap_err();
        assert!(e.contains("gpu-0 twice") && e.contains("distinctAttribute: gpu.egpu.io/uuid"), "{e}");
        // More memory than the GPU has for claims.
        let mut small = gpus();
        small[0].memory_bytes = 6 << 30;
        let e = plan(&allocated(vec![result("gpu", "gpu-0", Some(("8Gi", "0")))], serde_json::json!([])), DEFAULT_DRIVER, "node-a", &small).unwrap_err();
        assert!(e.contains("which has 6442450944 B for claims"), "{e}");
        // memoryBurst: a Kubernetes quantity (G is 10^9), or eGPU's GiB.
        for (burst, bytes) in [("24Gi", 24u64 << 30), ("24G", 24_000_000_000), ("24GiB", 24 << 30)] {
            let cfg = serde_json::json!([{"source": "FromClaim", "opaque": {"driver": DEFAULT_DRIVER, "parameters": {"memoryBurst": burst}}}]);
            let p = plan(&allocated(vec![result("gpu", "gpu-0", Some(("1Gi", "0")))], cfg), DEFAULT_DRIVER, "node-a", &gpus()).unwrap();
            assert_eq!(p.devices[0].memory_burst_bytes, bytes, "{burst}");
        }
    }

    #[test]
    fn each_cdi_device_reaches_a_container_once() {
        let cfg = DraConfig {
            driver: DEFAULT_DRIVER.into(),
            node: "node-a".into(),
            egpud_socket: "/x".into(),
            kubelet_dir: "/k".into(),
            cdi_dir: "/c".into(),
            gpu_cdi_kind: Some("nvidia.com/gpu".into()),
            poll: Duration::from_secs(1),
            pod_poll: Duration::from_secs(5),
        };
        let r = |req: &str, dev: &str, gpu: u32| (req.to_string(), dev.to_string(), gpu);
        // Requests a and b share GPU 0; b also has GPU 1.
        let d = kubelet_devices(&cfg, "dra-u", &[r("a", "gpu-0", 0), r("b", "gpu-0", 0), r("b", "gpu-1", 1)]);
        let got: Vec<(Vec<&str>, &str, Vec<&str>)> = d.iter().map(|d| (d.request_names.iter().map(String::as_str).collect(), d.device_name.as_str(), d.cdi_device_ids.iter().map(String::as_str).collect())).collect();
        assert_eq!(got, [(vec!["a", "b"], "gpu-0", vec!["egpu.io/slice=dra-u", "nvidia.com/gpu=0"]), (vec!["b"], "gpu-1", vec!["nvidia.com/gpu=1"])]);
        // What the kubelet gives a container: the entries naming its request (or all, for the whole claim).
        let given = |req: Option<&str>| -> Vec<String> { d.iter().filter(|d| req.is_none_or(|q| d.request_names.iter().any(|n| n == q))).flat_map(|d| d.cdi_device_ids.clone()).collect() };
        for req in [None, Some("a"), Some("b")] {
            let ids = given(req);
            let unique: std::collections::HashSet<&String> = ids.iter().collect();
            assert_eq!(unique.len(), ids.len(), "{req:?}: {ids:?}");
            assert!(ids.contains(&"egpu.io/slice=dra-u".to_string()), "{req:?}");
        }
        assert_eq!(given(Some("a")), ["egpu.io/slice=dra-u", "nvidia.com/gpu=0"]);
    }

    #[test]
    fn a_pods_annotations_resize_its_claims_slice() {
        let p = Prepared { namespace: "ns".into(), claim: "c".into(), pod: Some("p".into()), pod_uid: Some("pu".into()), limit_bps: 5000, burst_bytes: 0 };
        let dev = |device: u32, memory: u64, limit: u32, burst: u64| node::SliceDevice { device, memory_limit_bytes: memory, compute_limit_bps: limit, memory_burst_bytes: burst, ..Default::default() };
        let slice = node::Slice { name: "dra-u".into(), devices: vec![dev(0, 4 << 30, 5000, 0), dev(1, 8 << 30, 5000, 0)], ..Default::default() };
        let ann = |kv: &[(&str, &str)]| kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>();
        assert_eq!(resizes(&p, &ann(&[]), &slice), Ok(vec![]), "no annotation: the claim's values, already there");
        let r = resizes(&p, &ann(&[("egpu.io/gpu-compute-limit", "80%"), ("egpu.io/gpu-memory-burst", "6GiB")]), &slice).unwrap();
        assert_eq!(r, [(0, 8000, 6 << 30), (1, 8000, 8 << 30)], "a burst cap under a GPU's guarantee is raised to it");
        // Already so: nothing to do; the annotation removed: back to the claim's.
        let done = node::Slice { devices: vec![dev(0, 4 << 30, 8000, 6 << 30), dev(1, 8 << 30, 8000, 8 << 30)], ..slice.clone() };
        assert_eq!(resizes(&p, &ann(&[("egpu.io/gpu-compute-limit", "80%"), ("egpu.io/gpu-memory-burst", "6GiB")]), &done), Ok(vec![]));
        assert_eq!(resizes(&p, &ann(&[]), &done), Ok(vec![(0, 5000, 0), (1, 5000, 0)]));
        assert!(resizes(&p, &ann(&[("egpu.io/gpu-compute", "40%")]), &slice).unwrap_err().contains("capacity.requests.compute"));
        assert!(resizes(&p, &ann(&[("egpu.io/gpu-compute-limit", "lots")]), &slice).unwrap_err().starts_with("egpu.io/gpu-compute-limit:"));
        assert!(resizes(&p, &ann(&[("egpu.io/gpu-compute-limit", "0%")]), &slice).unwrap_err().contains("never run"));
        assert!(resizes(&p, &ann(&[("egpu.io/gpu-memory-burst", "512m")]), &slice).unwrap_err().contains("fraction of a byte"));
        assert_eq!(resizes(&p, &ann(&[("egpu.io/gpu-memory-burst", "10G")]), &slice).unwrap()[0].2, 10_000_000_000, "Kubernetes' G");
        let guaranteed = node::Slice { devices: vec![node::SliceDevice { compute_share_bps: 3000, ..dev(0, 4 << 30, 5000, 0) }, dev(1, 8 << 30, 5000, 0)], ..slice.clone() };
        let e = resizes(&p, &ann(&[("egpu.io/gpu-compute-limit", "20%")]), &guaranteed).unwrap_err();
        assert!(e.contains("20% is below the 30% guaranteed on GPU 0"), "{e}");
        assert_eq!(burst_bytes("0"), Ok(0));
        assert!(burst_bytes("1Ki").unwrap_err().contains("under 1 MiB"));
        assert_eq!(burst_bytes("1.5GiB"), Ok(3 << 29));
    }

    #[test]
    fn prepared_claims_survive_a_restart_and_a_bad_file_is_set_aside() {
        let dir = std::env::temp_dir().join(format!("egpu-dra-state-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("claims.json");
        assert!(load_prepared(&path).is_empty(), "no file: no claims");
        let m = BTreeMap::from([("u".to_string(), Prepared { namespace: "ns".into(), claim: "c".into(), pod: None, pod_uid: None, limit_bps: 10_000, burst_bytes: 1 })]);
        std::fs::write(&path, serde_json::to_vec(&m).unwrap()).unwrap();
        assert_eq!(load_prepared(&path), m);
        std::fs::write(&path, b"{\"u\": {\"namespace\": 3").unwrap();
        assert!(load_prepared(&path).is_empty());
        assert!(!path.exists() && dir.join("claims.json.bad").exists(), "set aside, not lost");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_digest_follows_the_spec() {
        let a = resource_slice_spec(DEFAULT_DRIVER, "node-a", &gpus(), &BTreeMap::new(), 0);
        assert_eq!(digest(&a), digest(&a.clone()));
        assert_eq!(digest(&a).len(), 16);
        let reserved = BTreeMap::from([(0, Reserved { memory_bytes: 1 << 30, compute_bps: 0 })]);
        assert_ne!(digest(&a), digest(&resource_slice_spec(DEFAULT_DRIVER, "node-a", &gpus(), &reserved, 0)));
    }

    #[test]
    fn config_and_names() {
        let cfg = DraConfig {
            driver: DEFAULT_DRIVER.into(),
            node: "node-a".into(),
            egpud_socket: "/x".into(),
            kubelet_dir: "/var/lib/kubelet".into(),
            cdi_dir: "/var/run/cdi".into(),
            gpu_cdi_kind: None,
            poll: Duration::from_secs(1),
            pod_poll: Duration::from_secs(5),
        };
        assert_eq!(cfg.check(), Ok(()));
        assert_eq!(cfg.registration_socket(), Path::new("/var/lib/kubelet/plugins_registry/gpu.egpu.io-reg.sock"));
        assert_eq!(cfg.plugin_socket(), Path::new("/var/lib/kubelet/plugins/gpu.egpu.io/dra.sock"));
        assert!(DraConfig { driver: "egpu".into(), ..cfg.clone() }.check().unwrap_err().contains("--driver"));
        assert!(DraConfig { driver: "GPU.egpu.io".into(), ..cfg.clone() }.check().unwrap_err().contains("--driver"));
        assert!(DraConfig { node: "Node_A".into(), ..cfg.clone() }.check().unwrap_err().contains("--node-name"));
        assert!(DraConfig { gpu_cdi_kind: Some("nvidia.com/gpu=0".into()), ..cfg.clone() }.check().unwrap_err().contains("not a CDI kind"));
        assert!(DraConfig { poll: Duration::ZERO, ..cfg.clone() }.check().unwrap_err().contains("--poll"));
        assert!(DraConfig { pod_poll: Duration::ZERO, ..cfg }.check().unwrap_err().contains("--pod-poll"));
        assert_eq!(slice_name("u-1"), "dra-u-1");
        assert_eq!((device_index("gpu-12"), device_index("gpu-"), device_index("gpu-1a")), (Some(12), None, None));
        // The longest claim UID (36 characters) makes a valid slice name.
        assert!(egpu_core::slice::validate_name(&slice_name("0b8f2f0e-7a11-4b9e-9b43-7c3f0c9e5b0e")).is_ok());
    }

    proptest! {
        /// Whatever the allocation says, planning answers (a plan or a
        /// reason) and never guarantees more than a GPU.
        #[test]
        fn planning_never_panics_nor_overcommits(
            results in proptest::collection::vec((0u32..4, proptest::option::of((0u64..40, 0u64..120)), 0usize..3), 0..6),
            limit in proptest::option::of(0u32..200),
        ) {
            let rs: Vec<serde_json::Value> = results
                .iter()
                .map(|(gpu, consumed, req)| {
                    let c = consumed.map(|(m, c)| (format!("{m}Gi"), c.to_string()));
                    result(["a", "b", "c"][*req], &format!("gpu-{gpu}"), c.as_ref().map(|(m, c)| (m.as_str(), c.as_str())))
                })
                .collect();
            let cfg = match limit {
                Some(l) => serde_json::json!([{"source": "FromClaim", "opaque": {"driver": DEFAULT_DRIVER, "parameters": {"computeLimit": format!("{l}%")}}}]),
                None => serde_json::json!([]),
            };
            if let Ok(p) = plan(&allocated(rs, cfg), DEFAULT_DRIVER, "node-a", &gpus()) {
                prop_assert!(!p.devices.is_empty());
                for d in &p.devices {
                    prop_assert!(d.device < 2 && d.compute_share_bps <= 10_000 && d.memory_bytes > 0 && d.memory_bytes <= 16 << 30);
                    prop_assert!(d.compute_limit_bps > 0 && d.compute_limit_bps <= 10_000 && d.compute_limit_bps >= d.compute_share_bps);
                }
            }
        }
    }
}
