//! The device plugin: gRPC service, registration with the kubelet, and the
//! refresh / sweep loop.
//!
//! - **Serve** `DevicePlugin` on `<kubelet dir>/device-plugins/<socket>` and
//!   **register** it with the kubelet's `Registration` service. The kubelet
//!   wipes that directory when it restarts; the plugin notices its socket is
//!   gone (checked every `poll`) and serves and registers again.
//! - **Refresh** every `poll`: egpud's GPUs and slices, and the kubelet's
//!   pod-resources list. Memory egpud has promised elsewhere (slices made
//!   outside Kubernetes with `egpu create`, plugin slices no container holds
//!   that wait for the sweep, lent burst memory) is reported as that many
//!   unhealthy tokens, so the kubelet does not promise it to pods. While
//!   egpud cannot be reached every token is unhealthy: the kubelet admits no
//!   new pod that needs one, and running workloads keep their limits
//!   (egpud's own promise). With `--node-name`, the Node's `egpu.io/gpus`
//!   annotation is patched for the scheduler extender.
//! - **Allocate** turns the tokens the kubelet chose into a slice (memory =
//!   tokens × unit on their GPU, compute guarantee in proportion to that
//!   memory, cap the whole GPU) and answers with its CDI device.
//! - **Sweep**: a slice this plugin made is deleted once the kubelet has
//!   listed no container holding its tokens for [`PluginConfig::sweep_settle`]
//!   (a tenth of `sweep_grace`, at most 30 s) and `Allocate` has not handed
//!   it out within that time. For a grace period after the kubelet
//!   (re)registers the plugin or its list could not be read, the list may be
//!   incomplete: the slice must then be missing for the whole `sweep_grace`
//!   and be that old. egpud refuses to delete a slice with live processes
//!   (the delete is not forced). No slice is deleted while pod-resources
//!   cannot be read.

use crate::deviceplugin as dp;
use crate::podresources as pr;
use crate::annotation::{self, ANNOTATION, GpuFree, NodeGpus};
use crate::tokens::{self, Inventory, SLICE_PREFIX};
use egpu_node::proto as node;
use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

/// The device-plugin API version this plugin speaks.
pub const API_VERSION: &str = "v1beta1";
/// The default extended resource.
pub const DEFAULT_RESOURCE: &str = "egpu.io/gpu-memory";
pub const HEALTHY: &str = "Healthy";
pub const UNHEALTHY: &str = "Unhealthy";

/// How the plugin runs.
#[derive(Debug, Clone)]
pub struct PluginConfig {
    /// egpud's socket.
    pub egpud_socket: PathBuf,
    /// The kubelet's root directory (`/var/lib/kubelet`): its
    /// `device-plugins/` and `pod-resources/` sockets are under it.
    pub kubelet_dir: PathBuf,
    /// The extended resource advertised, e.g. `egpu.io/gpu-memory`.
    pub resource_name: String,
    /// Bytes of GPU memory per device (token).
    pub unit_bytes: u64,
    /// The directory egpud writes CDI specs into (its `--cdi-dir`).
    pub cdi_dir: PathBuf,
    /// How often egpud and the kubelet are read, and the socket checked.
    pub poll: Duration,
    /// How long the kubelet must list no holder of a slice (and how old the
    /// slice, and its last hand-out, must be) before the slice is deleted.
    pub sweep_grace: Duration,
    /// The CDI kind of the GPU vendor's spec (`nvidia.com/gpu`): each
    /// container is also given `<kind>=<GPU index>`, the GPU itself, beside
    /// the slice. `None` on a simulated node.
    pub gpu_cdi_kind: Option<String>,
    /// With `--node-name`, this node's pods are followed (a list, then a
    /// watch) for their `egpu.io/` annotations; after a failed list or
    /// watch, they are listed again this much later.
    pub pod_poll: Duration,
}

/// Writes the `egpu.io/gpus` annotation on the plugin's own Node.
pub struct Publisher {
    api: kube::Api<k8s_openapi::api::core::v1::Node>,
    pods: kube::Api<k8s_openapi::api::core::v1::Pod>,
    node: String,
    /// The value last patched, and when.
    last: Mutex<Option<(String, std::time::Instant)>>,
}

/// How long one patch of the Node may take before the refresh goes on.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);
/// An unchanged annotation is patched again this often, in case someone
/// removed it or the Node was re-created.
const REPUBLISH_EVERY: Duration = Duration::from_secs(60);
/// At most one patch this often (lent burst memory can change every poll).
const PUBLISH_MIN_GAP: Duration = Duration::from_secs(2);

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher").field("node", &self.node).finish_non_exhaustive()
    }
}

impl Publisher {
    pub fn new(client: kube::Client, node: String) -> Publisher {
        Publisher { api: kube::Api::all(client.clone()), pods: kube::Api::all(client), node, last: Mutex::new(None) }
    }

    /// Patches the annotation when its value changed since the last
    /// successful patch, or that was [`REPUBLISH_EVERY`] ago; a failure or a
    /// patch slower than [`PUBLISH_TIMEOUT`] is logged and retried at the
    /// next refresh, which it does not hold up longer.
    async fn publish(&self, value: String) {
        let skip = |l: &Option<(String, std::time::Instant)>| {
            l.as_ref().is_some_and(|(v, at)| (*v == value && at.elapsed() < REPUBLISH_EVERY) || at.elapsed() < PUBLISH_MIN_GAP)
        };
        if skip(&self.last.lock().expect("publisher lock")) {
            return;
        }
        let patch = serde_json::json!({ "metadata": { "annotations": { ANNOTATION: value } } });
        let params = kube::api::PatchParams::default();
        match tokio::time::timeout(PUBLISH_TIMEOUT, self.api.patch(&self.node, &params, &kube::api::Patch::Merge(&patch))).await {
            Ok(Ok(_)) => *self.last.lock().expect("publisher lock") = Some((value, std::time::Instant::now())),
            Ok(Err(e)) => tracing::warn!(node = %self.node, "cannot annotate the node with its free GPU memory ({e}); the scheduler extender will not see this node's changes until it can"),
            Err(_) => tracing::warn!(node = %self.node, "annotating the node took over {PUBLISH_TIMEOUT:?}; retrying at the next refresh"),
        }
    }
}

impl PluginConfig {
    pub fn device_plugin_dir(&self) -> PathBuf {
        self.kubelet_dir.join("device-plugins")
    }
    /// The plugin's socket file name: `egpu-<resource without its domain>.sock`.
    pub fn endpoint(&self) -> String {
        let short = self.resource_name.rsplit('/').next().unwrap_or(&self.resource_name);
        format!("egpu-{short}.sock")
    }
    pub fn pod_resources_socket(&self) -> PathBuf {
        self.kubelet_dir.join("pod-resources/kubelet.sock")
    }
    /// How long a slice must be missing from the kubelet's list, when the
    /// list is settled, before it is swept: a tenth of the grace period, at
    /// most 30 s.
    pub fn sweep_settle(&self) -> Duration {
        (self.sweep_grace / 10).min(Duration::from_secs(30))
    }
}

/// Why the plugin stopped.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("cannot serve on {path}: {source}")]
    Serve { path: PathBuf, source: std::io::Error },
    #[error("the kubelet refused to register {resource}: {message}. Is another plugin serving this resource?")]
    Refused { resource: String, message: String },
    #[error("bad configuration: {0}")]
    Config(String),
}

/// A pod of this node, as the followed list has it.
#[derive(Debug, Clone, Default)]
struct PodInfo {
    uid: String,
    /// Its `egpu.io/` annotations.
    annotations: std::collections::BTreeMap<String, String>,
}

/// This node's pods, by (namespace, name).
type PodAnnotations = HashMap<(String, String), PodInfo>;

/// A container holding units, per the kubelet.
#[derive(Debug, Clone)]
struct Holder {
    namespace: String,
    pod: String,
    ids: Vec<String>,
}

/// Pod annotations that resize a running pod's slices live (with
/// `--node-name`): the guaranteed compute share, the compute cap, and the
/// memory burst cap. Absent, a slice has its defaults: a share in
/// proportion to its memory, the whole GPU as cap, no burst.
pub const COMPUTE_ANNOTATION: &str = "egpu.io/gpu-compute";
pub const COMPUTE_LIMIT_ANNOTATION: &str = "egpu.io/gpu-compute-limit";
pub const MEMORY_BURST_ANNOTATION: &str = "egpu.io/gpu-memory-burst";

/// What a pod's annotations ask of its slices: (share, cap) in basis
/// points and the burst cap in bytes, over the defaults (share, cap 100%,
/// no burst); or the reason an annotation cannot be read.
fn wanted(annotations: &std::collections::BTreeMap<String, String>, default_share: u32) -> Result<(u32, u32, u64), String> {
    wanted_over(annotations, (default_share, 10_000, 0))
}

/// [`wanted`] over other defaults (share, cap, burst).
pub(crate) fn wanted_over(annotations: &std::collections::BTreeMap<String, String>, defaults: (u32, u32, u64)) -> Result<(u32, u32, u64), String> {
    let (default_share, default_limit, default_burst) = defaults;
    use egpu_core::quantity::{Bytes, Percent};
    let pct = |key: &str, default: u32| -> Result<u32, String> {
        annotations.get(key).map_or(Ok(default), |v| v.parse::<Percent>().map(|p| p.0).map_err(|e| format!("{key}: {e}")))
    };
    let share = pct(COMPUTE_ANNOTATION, default_share)?;
    let limit = pct(COMPUTE_LIMIT_ANNOTATION, default_limit)?;
    let burst = annotations.get(MEMORY_BURST_ANNOTATION).map_or(Ok(default_burst), |v| v.parse::<Bytes>().map(|b| b.0).map_err(|e| format!("{MEMORY_BURST_ANNOTATION}: {e}")))?;
    Ok((share, limit, burst))
}

/// What one refresh read.
#[derive(Debug, Default)]
struct Snapshot {
    inventory: Option<Inventory>,
    devices: Vec<dp::Device>,
}

/// State shared by the service and the loops.
#[derive(Debug)]
pub struct Shared {
    cfg: PluginConfig,
    snapshot: Mutex<Snapshot>,
    devices: watch::Sender<Vec<dp::Device>>,
    publisher: Option<Publisher>,
    /// When each of this plugin's slices was first seen held by no container.
    missing_since: Mutex<HashMap<String, std::time::Instant>>,
    /// Slices the sweep has warned it cannot delete.
    sweep_warned: Mutex<HashSet<String>>,
    /// When Allocate last handed each slice out.
    allocated_at: Mutex<HashMap<String, std::time::Instant>>,
    /// Until when the kubelet's list may be incomplete (it restarted, or its
    /// list could not be read): the sweep then waits the whole grace period.
    unsettled_until: Mutex<std::time::Instant>,
    /// The last list of held tokens read.
    last_held: Mutex<Option<Vec<Vec<String>>>>,
    /// Held by Allocate, and by the sweep while it deletes.
    alloc_lock: tokio::sync::Mutex<()>,
    /// This node's pods' `egpu.io/` annotations, by (namespace, name), as
    /// listed and then watched (`None` before the first list, or without
    /// `--node-name`).
    pod_annotations: Mutex<Option<PodAnnotations>>,
    /// (slice, reason) pairs already warned about.
    resize_warned: Mutex<HashSet<(String, String)>>,
}

impl Shared {
    pub fn new(cfg: PluginConfig, publisher: Option<Publisher>) -> Result<Arc<Shared>, PluginError> {
        if cfg.unit_bytes < (1 << 20) {
            return Err(PluginError::Config(format!("--memory-unit {} B is below 1 MiB; use e.g. 1GiB or 512MiB", cfg.unit_bytes)));
        }
        if let Some(kind) = &cfg.gpu_cdi_kind {
            check_cdi_kind(kind).map_err(PluginError::Config)?;
        }
        if !cfg.resource_name.contains('/') {
            return Err(PluginError::Config(format!("resource '{}' needs a domain, e.g. egpu.io/gpu-memory", cfg.resource_name)));
        }
        let (devices, _) = watch::channel(Vec::new());
        Ok(Arc::new(Shared {
            cfg,
            snapshot: Mutex::new(Snapshot::default()),
            devices,
            publisher,
            missing_since: Mutex::new(HashMap::new()),
            sweep_warned: Mutex::new(HashSet::new()),
            allocated_at: Mutex::new(HashMap::new()),
            unsettled_until: Mutex::new(std::time::Instant::now()),
            last_held: Mutex::new(None),
            alloc_lock: tokio::sync::Mutex::new(()),
            pod_annotations: Mutex::new(None),
            resize_warned: Mutex::new(HashSet::new()),
        }))
    }

    pub fn config(&self) -> &PluginConfig {
        &self.cfg
    }

    /// The kubelet's list may be incomplete for a grace period from now.
    fn unsettle(&self) {
        *self.unsettled_until.lock().expect("sweep lock") = std::time::Instant::now() + self.cfg.sweep_grace;
    }

    /// The devices last advertised.
    pub fn devices(&self) -> Vec<dp::Device> {
        self.devices.borrow().clone()
    }

    async fn egpud(&self) -> Result<egpu_node::client::Client, Status> {
        egpu_node::client::connect(&self.cfg.egpud_socket).await.map_err(|e| Status::unavailable(e.to_string()))
    }

    /// Reads egpud and the kubelet once: updates the advertised devices and
    /// deletes slices no container holds.
    pub async fn refresh(&self) {
        let read = async {
            let mut c = self.egpud().await?;
            let n = c.get_node(node::GetNodeRequest {}).await?.into_inner();
            let s = c.list_slices(node::ListSlicesRequest {}).await?.into_inner().slices;
            Ok::<_, Status>((c, n, s))
        };
        // egpud's slices first, then the kubelet's list: a slice in the first
        // was made before the second was read, so the kubelet has recorded its
        // container unless Allocate has only just answered (the sweep keeps
        // such a slice).
        let read = read.await;
        let holders = self.held_tokens().await;
        let held: Option<Vec<Vec<String>>> = holders.as_ref().map(|h| h.iter().map(|x| x.ids.clone()).collect());
        // While the kubelet's list cannot be read, the reserve follows the
        // last list read (nothing is swept or published meanwhile).
        let last_held = match &held {
            Some(h) => {
                *self.last_held.lock().expect("held lock") = Some(h.clone());
                Some(h.clone())
            }
            None => self.last_held.lock().expect("held lock").clone(),
        };
        let mut annotation = None;
        let (inventory, devices) = match read {
            Ok((mut client, n, slices)) => {
                let inv = Inventory {
                    unit_bytes: self.cfg.unit_bytes,
                    gpus: n.devices.iter().map(tokens::Gpu::from).collect(),
                };
                let devices = advertise(&inv, &slices, last_held.as_ref());
                if let (Some(held), Some(holders)) = (&held, &holders) {
                    self.sweep(&mut client, &slices, held).await;
                    // One copy of the followed pod list for both (the lock is
                    // not held across egpud's calls).
                    let pods = self.pod_annotations.lock().expect("pods lock").clone();
                    self.apply_pod_annotations(&mut client, &inv, &slices, holders, pods.as_ref()).await;
                    annotation = Some(node_gpus(&inv, &devices, holders, pods.as_ref()).to_json());
                }
                (Some(inv), devices)
            }
            Err(e) => {
                tracing::warn!("egpud unreachable, every {} device is reported unhealthy: {}", self.cfg.resource_name, e.message());
                let mut devices = self.devices();
                devices.iter_mut().for_each(|d| d.health = UNHEALTHY.into());
                (None, devices)
            }
        };
        self.snapshot.lock().expect("snapshot lock").inventory = inventory;
        self.devices.send_if_modified(|cur| {
            let changed = *cur != devices;
            *cur = devices.clone();
            changed
        });
        self.snapshot.lock().expect("snapshot lock").devices = devices;
        // After the kubelet's list went out: a slow API server delays only this.
        if let (Some(p), Some(value)) = (&self.publisher, annotation) {
            p.publish(value).await;
        }
    }

    /// The tokens each container holds, per the kubelet's pod-resources
    /// API, with the container's pod: `None` when it cannot be read.
    async fn held_tokens(&self) -> Option<Vec<Holder>> {
        let path = self.cfg.pod_resources_socket();
        let list = async {
            let ch = crate::unix_channel(&path, Duration::from_secs(10)).await.map_err(|e| Status::unavailable(e.to_string()))?;
            pr::pod_resources_lister_client::PodResourcesListerClient::new(ch).list(pr::ListPodResourcesRequest {}).await
        };
        match list.await {
            Ok(r) => Some(
                r.into_inner()
                    .pod_resources
                    .iter()
                    .flat_map(|p| p.containers.iter().map(move |c| (p, c)))
                    .flat_map(|(p, c)| c.devices.iter().map(move |d| (p, d)))
                    .filter(|(_, d)| d.resource_name == self.cfg.resource_name && !d.device_ids.is_empty())
                    .map(|(p, d)| Holder { namespace: p.namespace.clone(), pod: p.name.clone(), ids: d.device_ids.clone() })
                    .collect(),
            ),
            Err(e) => {
                tracing::warn!("cannot read the kubelet's pod resources at {} ({}); no slice is swept until it can be read", path.display(), e.message());
                self.unsettle();
                None
            }
        }
    }

    /// Deletes this plugin's slices whose tokens no container holds (rules
    /// in the module doc). "Missing for a while", not "missing now": a
    /// kubelet that has just restarted lists no pod until it has synced
    /// them, and a slice must not go in that window.
    async fn sweep(&self, client: &mut egpu_node::client::Client, slices: &[node::Slice], held: &[Vec<String>]) {
        let live: HashSet<String> = held.iter().map(|ids| tokens::slice_name(ids)).collect();
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let grace = self.cfg.sweep_grace;
        let settle = self.cfg.sweep_settle();
        let unsettled = *self.unsettled_until.lock().expect("sweep lock") > std::time::Instant::now();
        let decided = std::time::Instant::now();
        let due: Vec<&node::Slice> = {
            let mut missing = self.missing_since.lock().expect("sweep lock");
            let mut allocated = self.allocated_at.lock().expect("sweep lock");
            missing.retain(|name, _| slices.iter().any(|s| &s.name == name) && !live.contains(name));
            // (An entry for a slice made after `slices` was read is kept too.)
            allocated.retain(|name, at| slices.iter().any(|s| &s.name == name) || at.elapsed() < settle.max(grace));
            self.sweep_warned.lock().expect("sweep lock").retain(|name| missing.contains_key(name));
            slices
                .iter()
                .filter(|s| s.name.starts_with(SLICE_PREFIX) && !live.contains(&s.name))
                .filter(|s| {
                    let since = *missing.entry(s.name.clone()).or_insert_with(std::time::Instant::now);
                    // Handed out by Allocate just now: the kubelet lists its
                    // holder only after the answer.
                    let fresh = allocated.get(&s.name).is_some_and(|t| t.elapsed() < settle);
                    if unsettled {
                        since.elapsed() >= grace && now.saturating_sub(s.created_unix) >= grace.as_secs() && !fresh
                    } else {
                        since.elapsed() >= settle && !fresh
                    }
                })
                .collect()
        };
        // Allocate cannot hand one of these out while they are deleted.
        let _allocating = self.alloc_lock.lock().await;
        for s in due {
            if self.allocated_at.lock().expect("sweep lock").get(&s.name).is_some_and(|t| *t >= decided) {
                continue;
            }
            match client.delete_slice(node::DeleteSliceRequest { name: s.name.clone(), force: false }).await {
                Ok(_) => tracing::info!(slice = %s.name, "deleted: no container holds its {} any more", self.cfg.resource_name),
                // Once per slice: the sweep retries every poll.
                Err(e) if self.sweep_warned.lock().expect("sweep lock").insert(s.name.clone()) => {
                    tracing::warn!(slice = %s.name, "cannot delete a slice no container holds (retrying quietly): {}", e.message())
                }
                Err(_) => {}
            }
        }
    }

    /// Resizes each held slice to what its pod's annotations ask (compute
    /// share, compute cap, burst cap), live. Only pods the followed list of
    /// the node's pods saw are touched; a refusal (an annotation that does
    /// not parse, or egpud's: e.g. shares over 100% of the GPU) is logged
    /// once per slice and value.
    async fn apply_pod_annotations(&self, client: &mut egpu_node::client::Client, inv: &Inventory, slices: &[node::Slice], holders: &[Holder], pods: Option<&PodAnnotations>) {
        self.resize_warned.lock().expect("pods lock").retain(|(name, _)| slices.iter().any(|s| &s.name == name));
        let Some(pods) = pods else { return };
        for h in holders {
            let name = tokens::slice_name(&h.ids);
            let (Some(PodInfo { annotations: ann, .. }), Some(slice)) = (pods.get(&(h.namespace.clone(), h.pod.clone())), slices.iter().find(|s| s.name == name)) else { continue };
            let warn = |why: String| {
                if self.resize_warned.lock().expect("pods lock").insert((name.clone(), why.clone())) {
                    tracing::warn!(slice = %name, pod = %format!("{}/{}", h.namespace, h.pod), "cannot apply the pod's annotations: {why}");
                }
            };
            let [d] = slice.devices.as_slice() else {
                if !ann.is_empty() {
                    warn("a multi-GPU slice holds whole GPUs: its compute and burst follow no annotation".into());
                }
                continue;
            };
            let Some(gpu) = inv.gpus.iter().find(|g| g.index == d.device) else { continue };
            let default_share = default_share(inv, gpu, d.memory_limit_bytes);
            let (share, limit, burst) = match wanted(ann, default_share) {
                Ok(w) => w,
                Err(why) => {
                    warn(why);
                    continue;
                }
            };
            if (d.compute_share_bps, d.compute_limit_bps, d.memory_burst_bytes) == (share, limit, burst) {
                continue;
            }
            let req = node::ResizeSliceRequest {
                name: name.clone(),
                compute_share_bps: Some(share),
                compute_limit_bps: Some(limit),
                memory_burst_bytes: Some(burst),
                ..Default::default()
            };
            match client.resize_slice(req).await {
                Ok(_) => tracing::info!(slice = %name, share, limit, burst, "resized to the pod's annotations"),
                Err(e) => warn(format!("egpud refused: {}", e.message())),
            }
        }
    }

    /// Follows this node's pods' `egpu.io/` annotations ([`crate::follow`]:
    /// a list, then a watch), so that an annotation applies at the next
    /// refresh and the API server is not asked for every node's pods every
    /// few seconds. After a failed list or watch, lists again after
    /// `pod_poll`. Runs until the task is dropped.
    pub async fn follow_pods(&self) {
        let Some(p) = &self.publisher else { return };
        let follow = crate::follow::Follow {
            what: "this node's pods".into(),
            fields: Some(format!("spec.nodeName={}", p.node)),
            labels: None,
            retry: self.cfg.pod_poll,
            list_timeout: PUBLISH_TIMEOUT,
        };
        let listed = |pods: Vec<kube::api::ObjectMeta>| {
            *self.pod_annotations.lock().expect("pods lock") = Some(pods.into_iter().filter_map(Self::pod_entry).collect());
        };
        let changed = |pod: kube::api::ObjectMeta, present: bool| {
            let Some((key, ann)) = Self::pod_entry(pod) else { return };
            if let Some(map) = self.pod_annotations.lock().expect("pods lock").as_mut() {
                if present {
                    map.insert(key, ann);
                } else {
                    map.remove(&key);
                }
            }
        };
        follow.run(&p.pods, None, listed, changed).await;
    }

    /// A pod's key and its `egpu.io/` annotations (`None` without a name).
    fn pod_entry(pod: kube::api::ObjectMeta) -> Option<((String, String), PodInfo)> {
        let ns = pod.namespace.unwrap_or_default();
        let name = pod.name?;
        let annotations = pod.annotations.unwrap_or_default().into_iter().filter(|(k, _)| k.starts_with("egpu.io/")).collect();
        Some(((ns, name), PodInfo { uid: pod.uid.unwrap_or_default(), annotations }))
    }

    /// Makes (or finds) the slice of one container's tokens.
    async fn allocate_one(&self, ids: &[String]) -> Result<dp::ContainerAllocateResponse, Status> {
        let _allocating = self.alloc_lock.lock().await;
        let inv = self.snapshot.lock().expect("snapshot lock").inventory.clone();
        let Some(inv) = inv else {
            return Err(Status::unavailable(format!(
                "egpud is not reachable at {}; start it (egpud --cdi-dir {}). The kubelet rejects this pod; its controller's next one is admitted once egpud answers",
                self.cfg.egpud_socket.display(),
                self.cfg.cdi_dir.display()
            )));
        };
        let on = inv.resolve(ids).map_err(|e| Status::failed_precondition(format!("{}: {e}", self.cfg.resource_name)))?;
        let name = tokens::slice_name(ids);
        // One device per GPU: a part of one GPU, or whole GPUs (a
        // multi-GPU slice, whose peer access, IPC and NCCL egpud keeps).
        let want: Vec<node::DeviceShareSpec> = on
            .iter()
            .map(|(gpu, n)| {
                let memory = *n as u64 * self.cfg.unit_bytes;
                node::DeviceShareSpec { device: gpu.index, memory_bytes: memory, compute_share_bps: default_share(&inv, gpu, memory), compute_limit_bps: 10_000, memory_burst_bytes: 0 }
            })
            .collect();
        let where_ = want.iter().map(|d| format!("{} B on GPU {}", d.memory_bytes, d.device)).collect::<Vec<_>>().join(", ");
        let mut c = self.egpud().await?;
        match c.create_slice(node::CreateSliceRequest { name: name.clone(), devices: want.clone(), ephemeral: false, owner_pid: 0, ..Default::default() }).await {
            Ok(_) => tracing::info!(slice = %name, devices = %where_, "created for the kubelet"),
            Err(e) if e.code() == tonic::Code::AlreadyExists => {
                // A repeated Allocate for the same tokens (kubelet restart, retry).
                let s = c.get_slice(node::GetSliceRequest { name: name.clone() }).await?.into_inner();
                let mut have: Vec<(u32, u64)> = s.devices.iter().map(|d| (d.device, d.memory_limit_bytes)).collect();
                have.sort_unstable();
                let same = have == want.iter().map(|w| (w.device, w.memory_bytes)).collect::<Vec<_>>();
                if !same {
                    return Err(Status::already_exists(format!("slice {name} exists with other devices or memory; delete it (egpu rm {name}) and retry")));
                }
            }
            Err(e) => return Err(Status::new(e.code(), format!("egpud refused slice {name} ({where_}): {}", e.message()))),
        }
        let spec = self.cfg.cdi_dir.join(egpu_node::cdi::spec_file(&name));
        if !spec.exists() {
            let _ = c.delete_slice(node::DeleteSliceRequest { name: name.clone(), force: false }).await;
            return Err(Status::failed_precondition(format!(
                "egpud wrote no CDI spec {}: start egpud with --cdi-dir {} (or point the plugin's --cdi-dir at egpud's)",
                spec.display(),
                self.cfg.cdi_dir.display()
            )));
        }
        self.missing_since.lock().expect("sweep lock").remove(&name);
        self.allocated_at.lock().expect("sweep lock").insert(name.clone(), std::time::Instant::now());
        Ok(dp::ContainerAllocateResponse {
            envs: HashMap::from([("EGPU_SLICE".to_string(), name.clone())]),
            cdi_devices: cdi_devices(&self.cfg, &name, on.iter().map(|(g, _)| *g)),
            ..Default::default()
        })
    }
}

/// The device list for the kubelet: every token, healthy except as many of
/// each GPU's highest-numbered tokens no container holds as the memory
/// egpud has promised elsewhere covers (rounded up): the guarantees of
/// slices made outside Kubernetes, of plugin slices no container holds any
/// more (known only when the kubelet's list could be read), and burst
/// memory lent to any slice.
fn advertise(inv: &Inventory, slices: &[node::Slice], held: Option<&Vec<Vec<String>>>) -> Vec<dp::Device> {
    let live: Option<HashSet<String>> = held.map(|h| h.iter().map(|ids| tokens::slice_name(ids)).collect());
    let mut foreign: HashMap<u32, u64> = HashMap::new();
    for s in slices {
        // A plugin slice whose units a container holds is counted by those
        // units; one no container holds any more (waiting for the sweep)
        // still has its memory in egpud, but the kubelet has freed its units.
        let counted = !s.name.starts_with(SLICE_PREFIX) || live.as_ref().is_some_and(|l| !l.contains(&s.name));
        for d in &s.devices {
            // Burst memory lent to a slice cannot be guaranteed to a new one either.
            *foreign.entry(d.device).or_default() += if counted { d.memory_limit_bytes } else { 0 } + d.memory_granted_bytes;
        }
    }
    let held: HashSet<&str> = held.map(|h| h.iter().flatten().map(String::as_str).collect()).unwrap_or_default();
    let mut out = Vec::new();
    for g in &inv.gpus {
        let n = inv.tokens_of(g);
        let mut reserve = foreign.get(&g.index).copied().unwrap_or(0).div_ceil(inv.unit_bytes);
        let mut health = vec![HEALTHY; n as usize];
        for k in (0..n).rev() {
            if reserve == 0 {
                break;
            }
            if !held.contains(tokens::token_id(&g.uuid, k).as_str()) {
                health[k as usize] = UNHEALTHY;
                reserve -= 1;
            }
        }
        out.extend((0..n).map(|k| dp::Device { id: tokens::token_id(&g.uuid, k), health: health[k as usize].into(), topology: None }));
    }
    out
}

/// The CDI devices a container gets: its slice, and its GPUs from the
/// vendor's spec when `--gpu-cdi-kind` names one.
fn cdi_devices<'a>(cfg: &PluginConfig, slice: &str, gpus: impl Iterator<Item = &'a tokens::Gpu>) -> Vec<dp::CdiDevice> {
    let mut out = vec![dp::CdiDevice { name: egpu_node::cdi::device_name(slice) }];
    if let Some(kind) = cfg.gpu_cdi_kind.as_deref().filter(|k| !k.is_empty()) {
        out.extend(gpus.map(|g| dp::CdiDevice { name: format!("{kind}={}", g.index) }));
    }
    out
}

/// A slice's default guaranteed compute on `gpu`, in basis points: its
/// memory's fraction of the GPU, or all of it for every unit of the GPU (a
/// GPU's memory is seldom a whole number of units: an H100 80 GB's
/// 81,559 MiB is 79 units of 1 GiB, whose fraction would leave 0.8% idle).
fn default_share(inv: &Inventory, gpu: &tokens::Gpu, memory: u64) -> u32 {
    if memory >= u64::from(inv.tokens_of(gpu)) * inv.unit_bytes {
        return 10_000;
    }
    u32::try_from((u128::from(memory) * 10_000 / u128::from(gpu.memory_bytes.max(1))).min(10_000)).unwrap_or(10_000)
}

/// The node annotation: per GPU, its units and those that are healthy and
/// held by no container; the pods that hold units; and, for the pods of
/// the followed list (`pods`, by name: their UIDs), which GPUs they hold.
fn node_gpus(inv: &Inventory, devices: &[dp::Device], holders: &[Holder], pods_known: Option<&PodAnnotations>) -> NodeGpus {
    let held: HashSet<&str> = holders.iter().flat_map(|h| &h.ids).map(String::as_str).collect();
    let mut pods: std::collections::BTreeMap<String, u32> = std::collections::BTreeMap::new();
    let mut holds: std::collections::BTreeMap<String, std::collections::BTreeMap<u32, u32>> = std::collections::BTreeMap::new();
    // A token counts once, as in `free`, even if listed twice.
    let mut placed: HashSet<&str> = HashSet::new();
    for h in holders {
        *pods.entry(format!("{}/{}", h.namespace, h.pod)).or_default() += u32::try_from(h.ids.len()).unwrap_or(u32::MAX);
        let Some(info) = pods_known.and_then(|p| p.get(&(h.namespace.clone(), h.pod.clone()))).filter(|i| !i.uid.is_empty()) else { continue };
        let per_gpu = holds.entry(info.uid.clone()).or_default();
        for (uuid, _) in h.ids.iter().filter(|id| placed.insert(id.as_str())).filter_map(|id| tokens::parse_token(id)) {
            if let Some(g) = inv.gpus.iter().find(|g| g.uuid == uuid) {
                *per_gpu.entry(g.index).or_default() += 1;
            }
        }
    }
    let healthy: HashSet<&str> = devices.iter().filter(|d| d.health == HEALTHY).map(|d| d.id.as_str()).collect();
    let gpus = inv
        .gpus
        .iter()
        .map(|g| {
            let units = inv.tokens_of(g);
            let free = (0..units)
                .map(|k| tokens::token_id(&g.uuid, k))
                .filter(|id| !held.contains(id.as_str()) && healthy.contains(id.as_str()))
                .count();
            GpuFree { index: g.index, uuid: g.uuid.clone(), model: g.model.clone(), units, free: u32::try_from(free).unwrap_or(u32::MAX) }
        })
        .collect();
    NodeGpus { v: annotation::VERSION, unit_bytes: inv.unit_bytes, gpus, pods: Some(pods), holds: Some(holds) }
}

/// The `DevicePlugin` gRPC service. Its `ListAndWatch` streams end when
/// `stopped` turns true, so that a server being replaced (kubelet restart)
/// or shut down is not held open by the kubelet's stream.
#[derive(Debug, Clone)]
pub struct Service {
    pub shared: Arc<Shared>,
    pub stopped: watch::Receiver<bool>,
}

type DeviceStream = Pin<Box<dyn Stream<Item = Result<dp::ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl dp::device_plugin_server::DevicePlugin for Service {
    async fn get_device_plugin_options(&self, _: Request<dp::Empty>) -> Result<Response<dp::DevicePluginOptions>, Status> {
        Ok(Response::new(options()))
    }

    type ListAndWatchStream = DeviceStream;

    async fn list_and_watch(&self, _: Request<dp::Empty>) -> Result<Response<DeviceStream>, Status> {
        let mut devices = self.shared.devices.subscribe();
        let mut stopped = self.stopped.clone();
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            loop {
                let list = devices.borrow_and_update().clone();
                if tx.send(Ok(dp::ListAndWatchResponse { devices: list })).await.is_err() {
                    return; // the kubelet went away
                }
                tokio::select! {
                    _ = stopped.wait_for(|s| *s) => return,
                    changed = devices.changed() => if changed.is_err() { return },
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }

    async fn get_preferred_allocation(&self, req: Request<dp::PreferredAllocationRequest>) -> Result<Response<dp::PreferredAllocationResponse>, Status> {
        let inv = self.shared.snapshot.lock().expect("snapshot lock").inventory.clone();
        let container_responses = req
            .into_inner()
            .container_requests
            .iter()
            .map(|r| dp::ContainerPreferredAllocationResponse {
                device_i_ds: {
                    let size = usize::try_from(r.allocation_size).unwrap_or(0);
                    // Larger than any one GPU: whole GPUs, when enough are free.
                    let whole = inv.as_ref().filter(|inv| size > inv.max_tokens() as usize).and_then(|inv| tokens::preferred_whole(&r.available_device_i_ds, &r.must_include_device_i_ds, size, &|u| inv.tokens_of_uuid(u)));
                    whole.unwrap_or_else(|| tokens::preferred(&r.available_device_i_ds, &r.must_include_device_i_ds, size))
                },
            })
            .collect();
        Ok(Response::new(dp::PreferredAllocationResponse { container_responses }))
    }

    async fn allocate(&self, req: Request<dp::AllocateRequest>) -> Result<Response<dp::AllocateResponse>, Status> {
        let mut container_responses = Vec::new();
        for r in &req.into_inner().container_requests {
            container_responses.push(self.shared.allocate_one(&r.devices_ids).await?);
        }
        Ok(Response::new(dp::AllocateResponse { container_responses }))
    }

    async fn pre_start_container(&self, _: Request<dp::PreStartContainerRequest>) -> Result<Response<dp::PreStartContainerResponse>, Status> {
        Ok(Response::new(dp::PreStartContainerResponse {}))
    }
}

fn options() -> dp::DevicePluginOptions {
    dp::DevicePluginOptions { pre_start_required: false, get_preferred_allocation_available: true }
}

/// `--gpu-cdi-kind`, as both kubelet plugins take it: a CDI kind
/// (`vendor/class`), not a device name.
pub(crate) fn check_cdi_kind(kind: &str) -> Result<(), String> {
    if kind.split('/').count() != 2 || kind.contains('=') || kind.starts_with('/') || kind.ends_with('/') {
        return Err(format!("--gpu-cdi-kind '{kind}' is not a CDI kind (vendor/class, e.g. nvidia.com/gpu)"));
    }
    Ok(())
}

/// The identity of a file, to notice it was removed or replaced.
pub(crate) fn file_id(path: &Path) -> Option<(u64, u64)> {
    std::fs::symlink_metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Runs the plugin until `shutdown` resolves: refresh loop, and serve +
/// register again every time the kubelet removes the socket.
pub async fn run(shared: Arc<Shared>, shutdown: impl std::future::Future<Output = ()> + Send + 'static) -> Result<(), PluginError> {
    let cfg = shared.cfg.clone();
    // The shutdown future is awaited once, here; every wait below is on this
    // flag, which can be awaited any number of times.
    let (stop_all, stopping) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_all.send(true);
    });
    let shutting_down = || {
        let mut rx = stopping.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    // Read once before serving, so the kubelet's first list is the node's.
    shared.refresh().await;
    let pod_lister = shared.publisher.is_some().then(|| {
        let shared = shared.clone();
        tokio::spawn(async move { shared.follow_pods().await })
    });
    let refresher = {
        let shared = shared.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + shared.cfg.poll, shared.cfg.poll);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                shared.refresh().await;
            }
        })
    };
    let sock = cfg.device_plugin_dir().join(cfg.endpoint());
    // The socket this process last served; a different one at the path is
    // another instance's (a rolling update's new pod): wait for it to go.
    let mut ours: Option<Option<(u64, u64)>> = None;
    let result = loop {
        if let Some(id) = ours
            && file_id(&sock).is_some()
            && file_id(&sock) != id
        {
            tokio::select! {
                _ = shutting_down() => break Ok(()),
                _ = tokio::time::sleep(cfg.poll) => continue,
            }
        }
        match std::fs::remove_file(&sock) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => break Err(PluginError::Serve { path: sock.clone(), source }),
        }
        let listener = match tokio::net::UnixListener::bind(&sock) {
            Ok(l) => l,
            Err(source) if source.kind() == std::io::ErrorKind::NotFound => {
                tracing::warn!("{} does not exist yet (is the kubelet running?); waiting", cfg.device_plugin_dir().display());
                tokio::select! {
                    _ = shutting_down() => break Ok(()),
                    _ = tokio::time::sleep(cfg.poll) => continue,
                }
            }
            Err(source) => break Err(PluginError::Serve { path: sock.clone(), source }),
        };
        let id = file_id(&sock);
        ours = Some(id);
        let (stop, server_stopped) = watch::channel(false);
        let service = Service { shared: shared.clone(), stopped: server_stopped.clone() };
        let mut until_stopped = server_stopped;
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(dp::device_plugin_server::DevicePluginServer::new(service))
                .serve_with_incoming_shutdown(tokio_stream::wrappers::UnixListenerStream::new(listener), async move {
                    let _ = until_stopped.wait_for(|s| *s).await;
                }),
        );
        // Register (the kubelet may still be starting: retry until it answers).
        let registered = loop {
            match register(&cfg).await {
                Ok(()) => break Registration::Done,
                Err(e) if e.code() == tonic::Code::Unavailable || e.code() == tonic::Code::Unknown && e.message().contains("transport") => {
                    tracing::warn!("kubelet registration socket not answering ({}); retrying", e.message());
                }
                Err(e) => break Registration::Refused(PluginError::Refused { resource: cfg.resource_name.clone(), message: e.message().to_string() }),
            }
            tokio::select! {
                _ = shutting_down() => break Registration::ShutDown,
                _ = tokio::time::sleep(cfg.poll) => {}
            }
        };
        let outcome = match registered {
            Registration::Done => None,
            Registration::ShutDown => Some(Ok(())),
            Registration::Refused(e) => Some(Err(e)),
        };
        if let Some(outcome) = outcome {
            let _ = stop.send(true);
            let _ = server.await;
            if file_id(&sock) == id {
                let _ = std::fs::remove_file(&sock);
            }
            break outcome;
        }
        tracing::info!("registered {} with the kubelet, serving {}", cfg.resource_name, sock.display());
        // A (re)started kubelet lists no pod until it has synced them.
        shared.unsettle();
        // Watch the socket: the kubelet removes it when it restarts.
        let mut tick = tokio::time::interval(cfg.poll);
        let done = loop {
            tokio::select! {
                _ = shutting_down() => break true,
                _ = tick.tick() => {
                    if file_id(&sock) != id || server.is_finished() {
                        tracing::info!("{} was removed (kubelet restart?): serving and registering again", sock.display());
                        break false;
                    }
                }
            }
        };
        let _ = stop.send(true);
        let _ = server.await;
        if done {
            if file_id(&sock) == id {
                let _ = std::fs::remove_file(&sock);
            }
            break Ok(());
        }
    };
    refresher.abort();
    if let Some(t) = pod_lister {
        t.abort();
    }
    result
}

/// How one registration attempt loop ended.
enum Registration {
    Done,
    ShutDown,
    Refused(PluginError),
}

async fn register(cfg: &PluginConfig) -> Result<(), Status> {
    let path = cfg.device_plugin_dir().join("kubelet.sock");
    let ch = crate::unix_channel(&path, Duration::from_secs(10)).await.map_err(|e| Status::unavailable(format!("{}: {e}", path.display())))?;
    dp::registration_client::RegistrationClient::new(ch)
        .register(dp::RegisterRequest {
            version: API_VERSION.into(),
            endpoint: cfg.endpoint(),
            resource_name: cfg.resource_name.clone(),
            options: Some(options()),
        })
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(name: &str, device: u32, gib: u64) -> node::Slice {
        node::Slice {
            name: name.into(),
            devices: vec![node::SliceDevice { device, memory_limit_bytes: gib << 30, ..Default::default() }],
            ..Default::default()
        }
    }

    #[test]
    fn the_annotation_says_which_gpus_each_known_pod_holds() {
        let gpu = |index: u32, uuid: &str| tokens::Gpu { index, uuid: uuid.into(), model: "m".into(), memory_bytes: 4 << 30 };
        let inv = Inventory { unit_bytes: 1 << 30, gpus: vec![gpu(0, "GPU-a"), gpu(1, "GPU-b")] };
        let devices = advertise(&inv, &[], None);
        let holder = |pod: &str, ids: &[&str]| Holder { namespace: "ns".into(), pod: pod.into(), ids: ids.iter().map(|s| s.to_string()).collect() };
        // Pod p: two containers, on both GPUs; pod q is not in the followed list.
        let holders = [holder("p", &["GPU-a_0", "GPU-a_1"]), holder("p", &["GPU-b_0"]), holder("q", &["GPU-b_1", "GPU-b_2"])];
        let known: PodAnnotations = [(("ns".to_string(), "p".to_string()), PodInfo { uid: "uid-p".into(), ..Default::default() })].into();
        let g = node_gpus(&inv, &devices, &holders, Some(&known));
        assert_eq!(g.gpus.iter().map(|x| x.free).collect::<Vec<_>>(), [2, 1]);
        assert_eq!(g.pods, Some([("ns/p".to_string(), 3), ("ns/q".to_string(), 2)].into()));
        assert_eq!(g.holds, Some([("uid-p".to_string(), [(0, 2), (1, 1)].into())].into()), "q's UID is unknown: left out");
        assert_eq!(node_gpus(&inv, &devices, &holders, None).holds, Some(Default::default()));
    }

    #[test]
    fn foreign_slices_make_free_tokens_unhealthy_from_the_top() {
        let inv = Inventory {
            unit_bytes: 1 << 30,
            gpus: vec![
                tokens::Gpu { index: 0, uuid: "GPU-a".into(), model: "m".into(), memory_bytes: 4 << 30 },
                tokens::Gpu { index: 1, uuid: "GPU-b".into(), model: "m".into(), memory_bytes: 4 << 30 },
            ],
        };
        let mut half = slice("train", 1, 1);
        half.devices[0].memory_limit_bytes += 1; // 1 GiB + 1 B: two tokens
        let slices = [half, slice(&tokens::slice_name(&["GPU-a_0".into()]), 0, 1)];
        // GPU-b_3 is held by a container: the reserve skips it.
        let held = vec![vec!["GPU-b_3".to_string()]];
        let d = advertise(&inv, &slices, Some(&held));
        let unhealthy: Vec<&str> = d.iter().filter(|d| d.health == UNHEALTHY).map(|d| d.id.as_str()).collect();
        // GPU-a: the plugin slice no container holds still has its 1 GiB.
        assert_eq!(unhealthy, ["GPU-a_3", "GPU-b_1", "GPU-b_2"]);
        assert_eq!(d.len(), 8);
        // Held again: its units count for it, nothing more is reserved.
        let held2 = vec![held[0].clone(), vec!["GPU-a_0".to_string()]];
        let d = advertise(&inv, &slices, Some(&held2));
        assert_eq!(d.iter().filter(|d| d.health == UNHEALTHY).count(), 2);
        // Borrowed burst memory is reserved too.
        let mut lent = slices.clone();
        lent[0].devices[0].memory_granted_bytes = 1 << 30;
        let d = advertise(&inv, &lent, Some(&held2));
        assert_eq!(d.iter().filter(|d| d.health == UNHEALTHY).count(), 3);
        // Without the held set only outside slices count, from the top.
        let d = advertise(&inv, &slices, None);
        let unhealthy: Vec<&str> = d.iter().filter(|d| d.health == UNHEALTHY).map(|d| d.id.as_str()).collect();
        assert_eq!(unhealthy, ["GPU-b_2", "GPU-b_3"]);
    }

    #[test]
    fn pod_annotations_ask_for_share_cap_and_burst() {
        let ann = |kv: &[(&str, &str)]| kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<std::collections::BTreeMap<_, _>>();
        assert_eq!(wanted(&ann(&[]), 1250), Ok((1250, 10_000, 0)), "defaults");
        let w = wanted(&ann(&[(COMPUTE_ANNOTATION, "30%"), (COMPUTE_LIMIT_ANNOTATION, "50"), (MEMORY_BURST_ANNOTATION, "12GiB")]), 1250);
        assert_eq!(w, Ok((3000, 5000, 12 << 30)));
        let e = wanted(&ann(&[(COMPUTE_ANNOTATION, "lots")]), 1250).unwrap_err();
        assert!(e.starts_with("egpu.io/gpu-compute:") && e.contains("'lots'"), "{e}");
        let e = wanted(&ann(&[(MEMORY_BURST_ANNOTATION, "12 apples")]), 1250).unwrap_err();
        assert!(e.starts_with("egpu.io/gpu-memory-burst:"), "{e}");
    }

    #[test]
    fn endpoint_and_config_checks() {
        let cfg = PluginConfig {
            egpud_socket: "/x".into(),
            kubelet_dir: "/var/lib/kubelet".into(),
            resource_name: DEFAULT_RESOURCE.into(),
            unit_bytes: 1 << 30,
            cdi_dir: "/var/run/cdi".into(),
            poll: Duration::from_secs(1),
            sweep_grace: Duration::from_secs(30),
            gpu_cdi_kind: None,
            pod_poll: Duration::from_secs(5),
        };
        assert_eq!(cfg.endpoint(), "egpu-gpu-memory.sock");
        let gpu = tokens::Gpu { index: 3, uuid: "GPU-x".into(), model: "m".into(), memory_bytes: 1 << 30 };
        let names = |cfg: &PluginConfig| cdi_devices(cfg, "k8s-1", std::iter::once(&gpu)).into_iter().map(|d| d.name).collect::<Vec<_>>();
        assert_eq!(names(&cfg), ["egpu.io/slice=k8s-1"]);
        let nvidia = PluginConfig { gpu_cdi_kind: Some("nvidia.com/gpu".into()), ..cfg.clone() };
        assert_eq!(names(&nvidia), ["egpu.io/slice=k8s-1", "nvidia.com/gpu=3"]);
        // A multi-GPU slice names each of its GPUs.
        let gpu5 = tokens::Gpu { index: 5, ..gpu.clone() };
        let both: Vec<String> = cdi_devices(&nvidia, "k8s-2", [&gpu, &gpu5].into_iter()).into_iter().map(|d| d.name).collect();
        assert_eq!(both, ["egpu.io/slice=k8s-2", "nvidia.com/gpu=3", "nvidia.com/gpu=5"]);
        // The default share: the memory's fraction, or all of it for every
        // unit of the GPU (an H100 80 GB: 81,559 MiB, 79 units of 1 GiB).
        let h100 = tokens::Gpu { index: 0, uuid: "GPU-h".into(), model: "m".into(), memory_bytes: 81_559 << 20 };
        let inv = Inventory { unit_bytes: 1 << 30, gpus: vec![h100.clone()] };
        assert_eq!(default_share(&inv, &h100, 79 << 30), 10_000);
        assert_eq!(default_share(&inv, &h100, 10 << 30), 1255, "10 GiB of 79.6");
        let e = Shared::new(PluginConfig { gpu_cdi_kind: Some("nvidia.com/gpu=0".into()), ..cfg.clone() }, None).unwrap_err();
        assert!(e.to_string().contains("not a CDI kind"), "{e}");
        assert!(Shared::new(cfg.clone(), None).is_ok());
        let e = Shared::new(PluginConfig { unit_bytes: 4096, ..cfg.clone() }, None).unwrap_err();
        assert!(e.to_string().contains("below 1 MiB"), "{e}");
        let e = Shared::new(PluginConfig { resource_name: "gpu-memory".into(), ..cfg }, None).unwrap_err();
        assert!(e.to_string().contains("needs a domain"), "{e}");
    }
}
