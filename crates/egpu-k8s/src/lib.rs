//! eGPU on Kubernetes, node side: the kubelet device plugin.
//!
//! Contract:
//! - The plugin advertises the extended resource `egpu.io/gpu-memory` (by
//!   default): one device per memory unit of each GPU ([`tokens`]). The
//!   kubelet counts them, so a node is never promised more GPU memory than
//!   it has, and a container's request becomes a slice with a hard memory
//!   limit of exactly what it asked for, on one GPU (or on whole GPUs, for a
//!   container larger than one), created through egpud's
//!   gRPC API and handed to the runtime as a CDI device.
//! - It talks to the kubelet (registration, pod-resources) and to egpud,
//!   over unix sockets. With `--node-name` it also patches its own Node's
//!   `egpu.io/gpus` annotation ([`annotation`]) through the API server, for
//!   the scheduler extender ([`extender`]), which reads it from the Node
//!   objects kube-scheduler sends or from its own node cache (a watch of the
//!   nodes); the extender's API access is for that cache and for binding
//!   pods ([`assume`]).
//! - The protocols are the kubelet's published ones (`proto/k8s/`), written
//!   for eGPU with the published names and field numbers.
//!
//! - With Dynamic Resource Allocation instead ([`dra`], `egpu-dra-plugin`),
//!   the node's GPUs are published as a ResourceSlice with consumable
//!   `memory` and `compute`, and each allocated ResourceClaim becomes one
//!   slice.
//!
//! Modules: [`tokens`] (device IDs, the preferred allocation: pure),
//! [`plugin`] (the gRPC service, registration, refresh and sweep loops),
//! [`annotation`] (the Node annotation's format), [`extender`] (the
//! kube-scheduler extender), [`assume`] (its cache of bound pods),
//! [`checkpoint`] (the kubelet's device checkpoint, read while its
//! pod list is incomplete), [`follow`] (list-then-watch of objects' metadata), [`hint`] (the
//! pod annotation that hands the policy's GPU to the device plugin), [`metrics`] (the
//! Prometheus metrics of the extender and the kubelet plugins), [`dra`] (the DRA kubelet plugin),
//! [`quantity`] (Kubernetes quantities), [`names`] (the name rules flags are checked against).

pub mod annotation;
pub mod assume;
pub mod checkpoint;
pub mod dra;
pub mod extender;
pub mod follow;
pub mod hint;
pub mod metrics;
pub mod names;
pub mod plugin;
pub mod quantity;
pub mod tokens;

/// Generated types of the kubelet's device-plugin API (`v1beta1`).
#[allow(clippy::all)]
pub mod deviceplugin {
    tonic::include_proto!("v1beta1");
}

/// Generated types of the kubelet's pod-resources API (`v1`).
#[allow(clippy::all)]
pub mod podresources {
    tonic::include_proto!("v1");
}

/// A gRPC channel to a unix socket (the kubelet's), connect and request
/// timeouts alike.
pub async fn unix_channel(path: &std::path::Path, timeout: std::time::Duration) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    egpu_node::client::unix_channel(path, timeout, timeout).await
}

/// Seconds since the Unix epoch by this machine's clock (0 before it).
pub(crate) fn unix_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A ticker of `period` whose first tick is one period from now and which
/// delays (never bursts) after a slow tick: the plugins' refresh loops and
/// the extender's resync.
pub fn poll_ticker(period: std::time::Duration) -> tokio::time::Interval {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick
}
