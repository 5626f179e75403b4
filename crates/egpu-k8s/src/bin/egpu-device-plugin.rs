//! `egpu-device-plugin`: the kubelet device plugin (logic in `egpu-k8s`).
//! Advertises `egpu.io/gpu-memory` and turns each container's request into
//! a slice of egpud, handed to the runtime as a CDI device.

use clap::Parser;
use egpu_core::quantity::Bytes;
use egpu_k8s::plugin::{DEFAULT_RESOURCE, PluginConfig, Publisher, Shared, run};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Debug, Parser)]
#[command(name = "egpu-device-plugin", version, about = "Kubelet device plugin: GPU memory as an extended resource, each container's share a slice of egpud")]
struct Args {
    /// egpud's socket.
    #[arg(long, env = "EGPU_SOCKET", default_value = egpu_node::config::DEFAULT_SOCKET)]
    socket: PathBuf,
    /// The kubelet's root directory (its device-plugins/ and pod-resources/ sockets are under it).
    #[arg(long, default_value = "/var/lib/kubelet")]
    kubelet_dir: PathBuf,
    /// The extended resource to advertise (domain/name).
    #[arg(long, default_value = DEFAULT_RESOURCE, value_parser = egpu_k8s::names::resource_flag)]
    resource: String,
    /// GPU memory per unit of the resource: a pod asking for N gets N of these.
    #[arg(long, default_value = "1GiB")]
    memory_unit: Bytes,
    /// Where egpud writes its CDI specs (egpud's --cdi-dir).
    #[arg(long, default_value = "/var/run/cdi")]
    cdi_dir: PathBuf,
    /// How often egpud and the kubelet are read.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    poll: Duration,
    /// After the kubelet (re)registers the plugin, or its pod list could not be read, a slice is deleted only once
    /// no container has held it for this long (long enough for a restarted kubelet to list its pods again);
    /// otherwise after a tenth of it (at most 30 s).
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    sweep_grace: Duration,
    /// The CDI kind of the GPU vendor's spec, e.g. nvidia.com/gpu (from `nvidia-ctk cdi generate`, devices
    /// named by index): each container then also gets `<kind>=<GPU index>`, the GPU itself. Empty: only the slice.
    #[arg(long, default_value = "")]
    gpu_cdi_kind: String,
    /// This node's name (from the downward API's spec.nodeName): the plugin then writes what each GPU has
    /// free in the Node's egpu.io/gpus annotation, for the scheduler extender. Needs API access (in-cluster
    /// service account or KUBECONFIG) allowed to patch the Node.
    #[arg(long, env = "NODE_NAME", value_parser = node_name)]
    node_name: Option<String>,
    /// The plugin's own pod (from the downward API's metadata.name and metadata.namespace). The kubelet lists it
    /// once it has synced its pods with the API server; until then the units in the kubelet's device checkpoint
    /// count as held too, so a kubelet that restarted without the API server keeps every slice. Unset (or
    /// only one of the two): the kubelet's list is always taken as whole.
    #[arg(long, env = "POD_NAME")]
    pod_name: Option<String>,
    /// The namespace of --pod-name.
    #[arg(long, env = "POD_NAMESPACE")]
    pod_namespace: Option<String>,
    /// With --node-name, this node's pods are followed (a list, then a watch) for the annotations that resize
    /// their slices live (egpu.io/gpu-compute, egpu.io/gpu-compute-limit, egpu.io/gpu-memory-burst); after a
    /// failed list or watch they are listed again this much later.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pod_poll: Duration,
    /// Serve `GET /metrics` (Prometheus) and `GET /healthz` here, e.g. 0.0.0.0:9402; port 0 picks a free
    /// one, and the address is logged.
    #[arg(long)]
    metrics_listen: Option<std::net::SocketAddr>,
    /// Give each unit its GPU's NUMA node (egpud reads it from sysfs; only where every GPU's is known), so that
    /// the kubelet's Topology Manager aligns a container's CPUs with its GPU. Off by default: the kubelet then
    /// picks the NUMA node itself, counting units per NUMA node, not per GPU, so it can pick one whose free
    /// units are spread over GPUs none of which holds the container (Allocate refuses it), it overrides the
    /// scheduler's GPU hint and the whole-GPU rule, and strict policies refuse containers whose GPUs would span
    /// NUMA nodes (see docs/kubernetes.md, "Topology").
    #[arg(long)]
    numa_topology: bool,
    /// Log filter (tracing's EnvFilter syntax).
    #[arg(long, env = "EGPU_LOG", default_value = "info", value_parser = egpu_node::logging::log_filter)]
    log: String,
}

/// `--node-name`: empty (no annotation) or a node name.
fn node_name(s: &str) -> Result<String, String> {
    if s.is_empty() || egpu_k8s::names::is_dns_subdomain(s) {
        Ok(s.to_string())
    } else {
        Err(format!("'{s}' is not a node name (a DNS subdomain: lower-case letters, digits, '-' and '.'); give the Node's metadata.name, from the downward API's spec.nodeName"))
    }
}

fn main() -> ExitCode {
    let a = Args::parse();
    egpu_node::logging::init_logging(&a.log);
    if a.poll.is_zero() || a.pod_poll.is_zero() {
        eprintln!("egpu-device-plugin: --poll and --pod-poll must be greater than 0, e.g. 1s");
        return ExitCode::from(2);
    }
    let own_pod = match (a.pod_namespace.filter(|s| !s.is_empty()), a.pod_name.filter(|s| !s.is_empty())) {
        (Some(ns), Some(name)) => Some((ns, name)),
        (None, None) => None,
        (ns, name) => {
            tracing::warn!(
                "only one of --pod-namespace ({}) and --pod-name ({}) is set: both are needed to tell when the kubelet has synced its pods, so neither is used",
                ns.as_deref().unwrap_or("unset"),
                name.as_deref().unwrap_or("unset")
            );
            None
        }
    };
    let cfg = PluginConfig {
        egpud_socket: a.socket,
        kubelet_dir: a.kubelet_dir,
        resource_name: a.resource,
        unit_bytes: a.memory_unit.0,
        cdi_dir: a.cdi_dir,
        poll: a.poll,
        sweep_grace: a.sweep_grace,
        gpu_cdi_kind: Some(a.gpu_cdi_kind).filter(|k| !k.is_empty()),
        pod_poll: a.pod_poll,
        own_pod,
        numa_topology: a.numa_topology,
    };
    if a.sweep_grace < Duration::from_secs(30) {
        tracing::warn!(
            "--sweep-grace {:?} is short: the kubelet lists a container's units only after Allocate returns, and after a restart only once it has synced its pods; a slice may be deleted under a container that is starting",
            a.sweep_grace
        );
    }
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("egpu-device-plugin: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let publisher = match a.node_name.filter(|n| !n.is_empty()) {
        None => None,
        Some(node) => match rt.block_on(kube::Client::try_default()) {
            Ok(client) => Some(Publisher::new(client, node)),
            Err(e) => {
                eprintln!("egpu-device-plugin: --node-name {node} needs the Kubernetes API (in-cluster service account or KUBECONFIG): {e}");
                return ExitCode::from(2);
            }
        },
    };
    let shared = match Shared::new(cfg, publisher) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("egpu-device-plugin: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(m) = a.metrics_listen {
        let shared = shared.clone();
        if let Err(e) = egpu_k8s::metrics::serve(&rt, m, move || shared.metrics_text()) {
            eprintln!("egpu-device-plugin: {e}");
            return ExitCode::from(2);
        }
    }
    // The signal handlers are installed first, inside the runtime.
    match rt.block_on(async { run(shared, egpu_node::agent::shutdown_signal()).await }) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("egpu-device-plugin: {e}");
            ExitCode::FAILURE
        }
    }
}
