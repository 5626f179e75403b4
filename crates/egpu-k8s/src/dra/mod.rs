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
//! [`SliceConfig`] are pure; the rest is IO. The parts:
//!
//! - `publish`: the ResourceSlice this node publishes, and its digest;
//! - `claim`: a claim's configuration, what it becomes, and what the
//!   kubelet is told;
//! - `state`: the claims prepared (`claims.json`) and the resizes their
//!   pods' annotations ask;
//! - `api`: the API server, behind the [`Cluster`] trait;
//! - `shared`: prepare, unprepare and the refresh loop's work;
//! - `service`: the gRPC services and the sockets.

mod api;
mod claim;
mod publish;
mod service;
mod shared;
mod state;
#[cfg(test)]
mod tests;

pub use api::{Api, Cluster, PodAnnotations, Written};
pub use claim::{Plan, SliceConfig, burst_bytes, kubelet_devices, plan};
pub use publish::{DIGEST_ANNOTATION, REPUBLISH_EVERY, Reserved, digest, reserved_elsewhere, resource_slice_spec};
pub use service::{Registrar, Service, run};
pub use shared::Shared;
pub use state::{Prepared, resizes};

use std::path::PathBuf;
use std::time::Duration;

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

/// The least memory a claim may consume of a GPU; a GPU with less left
/// for claims is not published.
pub const MIN_MEMORY: u64 = 1 << 20;

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
        let dns = crate::names::is_dns_subdomain;
        // A DRA driver name is at most 63 characters.
        if !dns(&self.driver) || !self.driver.contains('.') || self.driver.len() > 63 {
            return Err(format!("--driver '{}' must be a DNS subdomain with a domain, of at most 63 characters, e.g. {DEFAULT_DRIVER}", self.driver));
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
