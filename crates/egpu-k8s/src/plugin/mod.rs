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
//! - **Preferred allocation**: units on the GPU the extender's hint on a
//!   pending pod names for a request of that size ([`crate::hint`]), else
//!   best fit ([`tokens::preferred`]), or whole GPUs for a container larger
//!   than one.
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
//!
//! The parts: `publish` (the Node annotation), `devices` (what the kubelet
//! and the extender are told, pure), and `service` (the gRPC service, the
//! socket and the registration); the shared state and its refresh, sweep
//! and allocation are here.

use crate::deviceplugin as dp;
use crate::follow::{NodePods as PodAnnotations, PodInfo};
use crate::podresources as pr;
use crate::tokens::{self, Inventory, SLICE_PREFIX};
use egpu_node::proto as node;
use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tonic::Status;

mod devices;
mod publish;
mod service;
#[cfg(test)]
mod tests;

use devices::{advertise, cdi_devices, default_share, node_gpus};
use publish::PUBLISH_TIMEOUT;
pub use publish::Publisher;
pub use service::{Service, run};

/// A pod's key in the hint bookkeeping: its UID, else `namespace/name`.
fn hint_key((ns, name): &(String, String), info: &PodInfo) -> String {
    if info.uid.is_empty() { format!("{ns}/{name}") } else { info.uid.clone() }
}

/// Forgets the followed hint entries of pods no longer in the followed
/// list (`live`), once their hints cannot be live any more: a pod the
/// watch has not delivered yet (its hint found by a list read at
/// admission) keeps its followed entries.
fn forget_followed(followed: &mut HashMap<crate::hint::EntryKey, std::time::Instant>, live: &HashSet<String>, now: std::time::Instant) {
    followed.retain(|(uid, _), at| live.contains(uid) || now.saturating_duration_since(*at) < 2 * crate::hint::HINT_TTL);
}

/// The longest the list of the node's pods read for a request without a
/// followed hint may take ([`Shared::fresh_hints`]): it is on the kubelet's
/// admission path.
const FRESH_LIST_TIMEOUT: Duration = Duration::from_millis(300);
/// The most pods that list reads (a node runs 110 by default).
const FRESH_LIST_LIMIT: u32 = 1000;

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
    /// The plugin's own pod (namespace, name), from the downward API. The
    /// kubelet's pod-resources list names it once the kubelet has synced
    /// its pods with the API server; until then the list may leave out
    /// containers that still hold units, and the kubelet's checkpoint is
    /// read too. `None`: every list is taken as synced, and the checkpoint
    /// is never read (the kubelet keeps ended pods in it until its next
    /// write, so it is no guide once its list is whole).
    pub own_pod: Option<(String, String)>,
    /// Give each unit its GPU's NUMA node as its `TopologyInfo`
    /// (`--numa-topology`), for the kubelet's Topology Manager, where
    /// egpud knows every GPU's. Off by default: the kubelet counts units
    /// per NUMA node, not per GPU, and picks the NUMA node itself, so with
    /// a Topology Manager policy it may pick one whose units are spread
    /// over GPUs none of which holds the container, or other GPUs than the
    /// extender's (docs/kubernetes.md, "Topology").
    pub numa_topology: bool,
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
    /// Whether a pod-resources list (pods by namespace and name) is the
    /// kubelet's whole list: it names this plugin's own pod (a kubelet that
    /// restarted and has not reached the API server lists only its static
    /// pods). Always, when the plugin's pod is not known.
    pub fn synced<'a>(&self, mut pods: impl Iterator<Item = (&'a str, &'a str)>) -> bool {
        self.own_pod.as_ref().is_none_or(|(ns, name)| pods.any(|(n, p)| n == ns && p == name))
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


/// A container holding units, per the kubelet.
#[derive(Debug, Clone)]
struct Holder {
    namespace: String,
    pod: String,
    ids: Vec<String>,
}

/// The kubelet's pod-resources list, as the plugin uses it.
#[derive(Debug)]
struct Listed {
    holders: Vec<Holder>,
    /// [`PluginConfig::synced`].
    synced: bool,
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
    /// Since when the kubelet's list has not been synced (it did not name
    /// the plugin's own pod), and whether that has been warned about.
    unsynced: Mutex<Option<(std::time::Instant, bool)>>,
    /// The checkpoint error last warned about (warned once until it reads).
    checkpoint_warned: Mutex<Option<String>>,
    /// Held by Allocate, and by the sweep while it deletes.
    alloc_lock: tokio::sync::Mutex<()>,
    /// This node's pods' `egpu.io/` annotations, by (namespace, name), as
    /// listed and then watched (`None` before the first list, or without
    /// `--node-name`).
    pod_annotations: Mutex<Option<PodAnnotations>>,
    /// (slice, reason) pairs already warned about.
    resize_warned: Mutex<HashSet<(String, String)>>,
    /// Hint entries a preferred allocation has followed: (pod UID, entry).
    hints_followed: Mutex<HashMap<crate::hint::EntryKey, std::time::Instant>>,
    /// Units each pod holds, by (namespace, name), per the kubelet's last
    /// list (a pod holding its hint's `total` has no hint pending).
    held_by_pod: Mutex<HashMap<(String, String), u32>>,
    /// Hint annotations already warned about (they do not parse).
    hint_warned: Mutex<HashSet<String>>,
    /// `--numa-topology` with some GPUs' NUMA nodes unknown was logged.
    numa_warned: std::sync::atomic::AtomicBool,
    metrics: crate::metrics::DevicePluginMetrics,
}

impl Shared {
    pub fn new(cfg: PluginConfig, publisher: Option<Publisher>) -> Result<Arc<Shared>, PluginError> {
        if cfg.unit_bytes < (1 << 20) {
            return Err(PluginError::Config(format!("--memory-unit {} B is below 1 MiB; use e.g. 1GiB or 512MiB", cfg.unit_bytes)));
        }
        if let Some(kind) = &cfg.gpu_cdi_kind {
            check_cdi_kind(kind).map_err(PluginError::Config)?;
        }
        crate::names::check_extended_resource(&cfg.resource_name).map_err(PluginError::Config)?;
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
            unsynced: Mutex::new(None),
            checkpoint_warned: Mutex::new(None),
            alloc_lock: tokio::sync::Mutex::new(()),
            pod_annotations: Mutex::new(None),
            resize_warned: Mutex::new(HashSet::new()),
            hints_followed: Mutex::new(HashMap::new()),
            held_by_pod: Mutex::new(HashMap::new()),
            hint_warned: Mutex::new(HashSet::new()),
            numa_warned: std::sync::atomic::AtomicBool::new(false),
            metrics: crate::metrics::DevicePluginMetrics::default(),
        }))
    }

    /// A scrape of the plugin's metrics (`--metrics-listen`).
    pub fn metrics_text(&self) -> String {
        let devices = self.devices();
        let healthy = devices.iter().filter(|d| d.health == HEALTHY).count();
        self.metrics.render(healthy, devices.len() - healthy)
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
    /// deletes slices no container holds. `Err` (no list sent, nothing
    /// swept) when the node's units would make a device list the kubelet
    /// cannot receive.
    pub async fn refresh(&self) -> Result<(), PluginError> {
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
        let listed = self.held_tokens().await;
        self.metrics.refreshed(read.is_ok(), listed.is_some(), listed.as_ref().map(|l| l.synced));
        if let Some(l) = &listed {
            let mut by_pod: HashMap<(String, String), u32> = HashMap::new();
            for h in &l.holders {
                *by_pod.entry((h.namespace.clone(), h.pod.clone())).or_default() += u32::try_from(h.ids.len()).unwrap_or(u32::MAX);
            }
            *self.held_by_pod.lock().expect("held lock") = by_pod;
        }
        let held = listed.as_ref().and_then(|l| self.held_with_checkpoint(l));
        let holders = listed.map(|l| l.holders);
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
                if self.cfg.numa_topology && !inv.numa_known() && !self.numa_warned.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::warn!(
                        "--numa-topology: egpud knows the NUMA node of only some GPUs ({}); no unit is given one (the kubelet would never count the units of the others), so the Topology Manager sees no preference",
                        inv.gpus.iter().map(|g| format!("GPU {}: {}", g.index, g.numa.map_or_else(|| "unknown".into(), |n| n.to_string()))).collect::<Vec<_>>().join(", ")
                    );
                }
                let devices = advertise(&inv, &slices, last_held.as_ref(), self.cfg.numa_topology);
                devices::check_list_size(&devices, inv.unit_bytes).map_err(PluginError::Config)?;
                if let Some(holders) = &holders {
                    if let Some(held) = &held {
                        self.sweep(&mut client, &slices, held).await;
                    }
                    // One copy of the followed pod list for both (the lock is
                    // not held across egpud's calls).
                    let pods = self.pod_annotations.lock().expect("pods lock").clone();
                    self.apply_pod_annotations(&mut client, &inv, &slices, holders, pods.as_ref()).await;
                    annotation = Some(node_gpus(&inv, &devices, holders, last_held.as_deref().unwrap_or_default(), pods.as_ref()).to_json());
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
        Ok(())
    }

    /// The tokens held: each container's in the kubelet's list and, while
    /// that list is not synced, each container's in the kubelet's device
    /// checkpoint (the units of containers that are not running now, which
    /// a kubelet without the API server does not list but restarts with
    /// them). `None` when the checkpoint is needed and cannot be read: the
    /// list may then be incomplete, and nothing is swept.
    fn held_with_checkpoint(&self, listed: &Listed) -> Option<Vec<Vec<String>>> {
        let mut held: Vec<Vec<String>> = listed.holders.iter().map(|x| x.ids.clone()).collect();
        {
            let mut unsynced = self.unsynced.lock().expect("held lock");
            match (listed.synced, *unsynced) {
                (true, Some((_, warned))) => {
                    *unsynced = None;
                    // The kubelet adds the API server's pods one by one:
                    // the plugin's own may come before others that hold
                    // units, so the list is given the whole grace period.
                    self.unsettle();
                    if warned {
                        tracing::info!("the kubelet lists its pods again: slices are swept by its list alone");
                    }
                }
                (false, None) => *unsynced = Some((std::time::Instant::now(), false)),
                (false, Some((since, false))) if since.elapsed() >= self.cfg.sweep_grace => {
                    *unsynced = Some((since, true));
                    let (ns, name) = self.cfg.own_pod.clone().unwrap_or_default();
                    tracing::warn!(
                        "the kubelet has not listed this plugin's pod {ns}/{name} for {:?}: it has not synced its pods with the API server (or --pod-namespace/--pod-name are wrong). The slices of the units in its device checkpoint are kept meanwhile, even those whose pods have ended",
                        self.cfg.sweep_grace
                    );
                }
                _ => {}
            }
        }
        if listed.synced {
            return Some(held);
        }
        match crate::checkpoint::read(&self.cfg.device_plugin_dir()) {
            Ok(entries) => {
                *self.checkpoint_warned.lock().expect("held lock") = None;
                held.extend(crate::checkpoint::held(entries.as_deref().unwrap_or_default(), &self.cfg.resource_name));
                Some(held)
            }
            Err(e) => {
                let e = e.to_string();
                let mut warned = self.checkpoint_warned.lock().expect("held lock");
                if warned.as_deref() != Some(e.as_str()) {
                    tracing::warn!("{e}; no slice is swept while the kubelet's list is incomplete and this cannot be read");
                    *warned = Some(e);
                }
                self.unsettle();
                None
            }
        }
    }

    /// The tokens each container holds, per the kubelet's pod-resources
    /// API, with the container's pod: `None` when it cannot be read.
    async fn held_tokens(&self) -> Option<Listed> {
        let path = self.cfg.pod_resources_socket();
        let list = async {
            let ch = crate::unix_channel(&path, Duration::from_secs(10)).await.map_err(|e| Status::unavailable(e.to_string()))?;
            // A node's whole list can pass gRPC's 4 MiB default; the kubelet's own clients allow 16 MiB.
            pr::pod_resources_lister_client::PodResourcesListerClient::new(ch).max_decoding_message_size(16 << 20).list(pr::ListPodResourcesRequest {}).await
        };
        match list.await {
            Ok(r) => {
                let pods = r.into_inner().pod_resources;
                let holders = pods
                    .iter()
                    .flat_map(|p| p.containers.iter().map(move |c| (p, c)))
                    .flat_map(|(p, c)| c.devices.iter().map(move |d| (p, d)))
                    .filter(|(_, d)| d.resource_name == self.cfg.resource_name && !d.device_ids.is_empty())
                    .map(|(p, d)| Holder { namespace: p.namespace.clone(), pod: p.name.clone(), ids: d.device_ids.clone() })
                    .collect();
                Some(Listed { holders, synced: self.cfg.synced(pods.iter().map(|p| (p.namespace.as_str(), p.name.as_str()))) })
            }
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
        let now = crate::unix_secs();
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
                Ok(_) => {
                    self.metrics.swept();
                    tracing::info!(slice = %s.name, "deleted: no container holds its {} any more", self.cfg.resource_name);
                }
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
                if ann.keys().any(|k| k != crate::hint::HINT_ANNOTATION) {
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
                Ok(_) => {
                    self.metrics.resized();
                    tracing::info!(slice = %name, share, limit, burst, "resized to the pod's annotations");
                }
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
        crate::follow::node_pods(&p.pods, &p.node, self.cfg.pod_poll, PUBLISH_TIMEOUT, &self.pod_annotations).await;
    }

    /// The hint entries of `pods` not followed yet ([`crate::hint::pending`]),
    /// keyed by ([`hint_key`], entry); a hint that does not parse is warned
    /// about once.
    fn pending_in(&self, pods: &PodAnnotations) -> Vec<crate::hint::Pending<crate::hint::EntryKey>> {
        let held = self.held_by_pod.lock().expect("held lock").clone();
        let now = crate::unix_secs();
        let with_hint = pods.iter().filter_map(|(k, info)| Some((hint_key(k, info), info.annotations.get(crate::hint::HINT_ANNOTATION)?.as_str(), held.get(k).copied().unwrap_or(0))));
        let (out, bad) = {
            let followed: HashSet<crate::hint::EntryKey> = self.hints_followed.lock().expect("hints lock").keys().cloned().collect();
            crate::hint::pending(with_hint, &followed, now)
        };
        for (pod, e) in bad {
            if self.hint_warned.lock().expect("hints lock").insert(format!("{pod}: {e}")) {
                tracing::warn!(pod, "ignoring the pod's GPU hint: {e}");
            }
        }
        out
    }

    /// [`Shared::pending_in`] the followed list of the node's pods, after
    /// forgetting the followed entries of pods gone from it
    /// ([`forget_followed`]).
    fn pending_hints(&self) -> Vec<crate::hint::Pending<crate::hint::EntryKey>> {
        let Some(pods) = self.pod_annotations.lock().expect("pods lock").clone() else { return Vec::new() };
        let live: HashSet<String> = pods.iter().map(|(k, i)| hint_key(k, i)).collect();
        forget_followed(&mut self.hints_followed.lock().expect("hints lock"), &live, std::time::Instant::now());
        self.pending_in(&pods)
    }

    /// The pending hints from a list of the node's pods read now, for a
    /// request the followed list has no hint to follow for: the kubelet and
    /// this plugin watch the same binding, and the kubelet may ask before
    /// the plugin's watch has it. `None` without API access, or when the list fails or takes
    /// over [`FRESH_LIST_TIMEOUT`].
    async fn fresh_hints(&self) -> Option<Vec<crate::hint::Pending<crate::hint::EntryKey>>> {
        let p = self.publisher.as_ref()?;
        // From the API server's watch cache (indexed by node), which holds
        // what its watches have not delivered yet: cheap, and not a read
        // of every pod from etcd at each admission.
        let lp = kube::api::ListParams::default().match_any().fields(&format!("spec.nodeName={}", p.node)).limit(FRESH_LIST_LIMIT);
        let list = match tokio::time::timeout(FRESH_LIST_TIMEOUT, p.pods.list_metadata(&lp)).await {
            Ok(Ok(l)) => l,
            Ok(Err(e)) => {
                tracing::debug!("cannot list the node's pods for their GPU hints: {e}");
                return None;
            }
            Err(_) => return None,
        };
        let pods: PodAnnotations = list.items.into_iter().filter_map(|m| crate::follow::pod_entry(m.metadata)).collect();
        Some(self.pending_in(&pods))
    }

    /// The preferred units of one container request of `size` units that
    /// fits one GPU: on a pending hint's GPU ([`crate::hint::choose`]; the
    /// entry is then followed), else best fit. When no hint of the
    /// followed list is followed, a list read now is asked too.
    async fn preferred_one(&self, available: &[String], must_include: &[String], size: usize) -> Vec<String> {
        use crate::hint::Choice;
        let mut choice = crate::hint::choose(available, must_include, size, &self.pending_hints());
        if !matches!(choice, Choice::Followed { .. })
            && let Some(fresh) = self.fresh_hints().await
        {
            choice = crate::hint::choose(available, must_include, size, &fresh);
        }
        match choice {
            Choice::Followed { key, ids } => {
                self.metrics.hint("followed");
                self.hints_followed.lock().expect("hints lock").insert(key, std::time::Instant::now());
                ids
            }
            other => {
                self.metrics.hint(if other == Choice::Stale { "stale" } else { "none" });
                tokens::preferred(available, must_include, size)
            }
        }
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
                // The same units may come back to a new container while the
                // slice waits for the sweep: it starts from the defaults,
                // not from the previous pod's annotations (its own are
                // applied at the next refresh). A refusal (a default share
                // that no longer fits beside shares raised since) is left to
                // that refresh rather than refusing the container.
                for w in stale_limits(&s.devices, &want) {
                    let req = node::ResizeSliceRequest {
                        name: name.clone(),
                        devices: vec![w.device],
                        compute_share_bps: Some(w.compute_share_bps),
                        compute_limit_bps: Some(w.compute_limit_bps),
                        memory_burst_bytes: Some(w.memory_burst_bytes),
                        ..Default::default()
                    };
                    if let Err(e) = c.resize_slice(req).await {
                        tracing::warn!(slice = %name, device = w.device, "handed out again with the previous pod's compute or burst: egpud refused to reset them ({})", e.message());
                    }
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

/// The devices of `want` whose share, cap or burst cap the slice's devices
/// `have` differ from.
fn stale_limits<'a>(have: &[node::SliceDevice], want: &'a [node::DeviceShareSpec]) -> Vec<&'a node::DeviceShareSpec> {
    want.iter()
        .filter(|w| have.iter().find(|d| d.device == w.device).is_some_and(|d| (d.compute_share_bps, d.compute_limit_bps, d.memory_burst_bytes) != (w.compute_share_bps, w.compute_limit_bps, w.memory_burst_bytes)))
        .collect()
}

/// `--gpu-cdi-kind`, as both kubelet plugins take it: a CDI kind
/// (`vendor/class`), not a device name.
pub(crate) fn check_cdi_kind(kind: &str) -> Result<(), String> {
    if kind.split('/').count() != 2 || kind.contains('=') || kind.starts_with('/') || kind.ends_with('/') {
        return Err(format!("--gpu-cdi-kind '{kind}' is not a CDI kind (vendor/class, e.g. nvidia.com/gpu)"));
    }
    Ok(())
}

/// The CDI device of GPU `index` in the GPU vendor's spec of kind `kind`
/// (`nvidia.com/gpu=0`: the NVIDIA Container Toolkit names devices by
/// index), as both kubelet plugins hand it out beside the slice's.
pub(crate) fn gpu_cdi_device(kind: &str, index: u32) -> String {
    format!("{kind}={index}")
}

/// Serves a unix socket at `path`, in place of a stale socket file a
/// killed plugin left there (the kubelet connects by path).
pub(crate) fn rebind(path: &Path) -> std::io::Result<tokio::net::UnixListener> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    tokio::net::UnixListener::bind(path)
}

/// The identity of a file, to notice it was removed or replaced.
pub(crate) fn file_id(path: &Path) -> Option<(u64, u64)> {
    std::fs::symlink_metadata(path).ok().map(|m| (m.dev(), m.ino()))
}
