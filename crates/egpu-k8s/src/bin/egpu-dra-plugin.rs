//! `egpu-dra-plugin`: the kubelet plugin of eGPU's DRA driver (logic in
//! `egpu_k8s::dra`). Publishes the node's GPUs as a ResourceSlice and turns
//! each allocated ResourceClaim into a slice of egpud, handed to the
//! runtime as a CDI device.

use clap::Parser;
use egpu_k8s::dra::{Api, DEFAULT_DRIVER, DraConfig, Shared, run};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Debug, Parser)]
#[command(name = "egpu-dra-plugin", version, about = "Kubelet DRA plugin: the node's GPUs as a ResourceSlice, each ResourceClaim a slice of egpud")]
struct Args {
    /// This node's name (from the downward API's spec.nodeName): the name of the ResourceSlice's pool.
    #[arg(long, env = "NODE_NAME")]
    node_name: String,
    /// The DRA driver name, as DeviceClasses select it.
    #[arg(long, default_value = DEFAULT_DRIVER)]
    driver: String,
    /// egpud's socket.
    #[arg(long, env = "EGPU_SOCKET", default_value = egpu_node::config::DEFAULT_SOCKET)]
    socket: PathBuf,
    /// The kubelet's root directory (its plugins/ and plugins_registry/ are under it).
    #[arg(long, default_value = "/var/lib/kubelet")]
    kubelet_dir: PathBuf,
    /// Where egpud writes its CDI specs (egpud's --cdi-dir).
    #[arg(long, default_value = "/var/run/cdi")]
    cdi_dir: PathBuf,
    /// The CDI kind of the GPU vendor's spec, e.g. nvidia.com/gpu (devices named by index): each claim's
    /// containers then also get `<kind>=<GPU index>`, the GPU itself. Empty: only the slice.
    #[arg(long, default_value = "")]
    gpu_cdi_kind: String,
    /// How often egpud's GPUs (for the ResourceSlice) and the sockets are checked, and pods' annotations applied.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    poll: Duration,
    /// The node's pods are followed (a list, then a watch) for the annotations that resize the slices of the
    /// claims made for them (egpu.io/gpu-compute-limit, egpu.io/gpu-memory-burst); after a failed list or watch
    /// they are listed again this much later.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pod_poll: Duration,
    /// Serve `GET /metrics` (Prometheus) and `GET /healthz` here, e.g. 0.0.0.0:9403; port 0 picks a free
    /// one, and the address is logged.
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
    /// Log filter (tracing's EnvFilter syntax).
    #[arg(long, env = "EGPU_LOG", default_value = "info", value_parser = egpu_node::logging::log_filter)]
    log: String,
}

fn main() -> ExitCode {
    let a = Args::parse();
    egpu_node::logging::init_logging(&a.log);
    let cfg = DraConfig {
        driver: a.driver,
        node: a.node_name,
        egpud_socket: a.socket,
        kubelet_dir: a.kubelet_dir,
        cdi_dir: a.cdi_dir,
        gpu_cdi_kind: Some(a.gpu_cdi_kind).filter(|k| !k.is_empty()),
        poll: a.poll,
        pod_poll: a.pod_poll,
    };
    if let Err(e) = cfg.check() {
        eprintln!("egpu-dra-plugin: {e}");
        return ExitCode::from(2);
    }
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("egpu-dra-plugin: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let client = match rt.block_on(kube::Client::try_default()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("egpu-dra-plugin: needs the Kubernetes API (in-cluster service account or KUBECONFIG) to read ResourceClaims and publish the ResourceSlice: {e}");
            return ExitCode::from(2);
        }
    };
    let shared = match Shared::new(cfg, Api::new(client)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("egpu-dra-plugin: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(m) = a.metrics_listen {
        let shared = shared.clone();
        if let Err(e) = egpu_k8s::metrics::serve(&rt, m, move || shared.metrics_text()) {
            eprintln!("egpu-dra-plugin: {e}");
            return ExitCode::from(2);
        }
    }
    // The signal handlers are installed first, inside the runtime.
    match rt.block_on(async { run(shared, egpu_node::agent::shutdown_signal()).await }) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("egpu-dra-plugin: {e}");
            ExitCode::FAILURE
        }
    }
}
