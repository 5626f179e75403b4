//! `egpu-scheduler`: the kube-scheduler extender (logic in `egpu-k8s`):
//! filters nodes where each container's `egpu.io/gpu-memory` fits one GPU,
//! scores them with eGPU's placement policy, and binds pods, remembering
//! their units until the nodes' annotations count them.

use clap::Parser;
use egpu_k8s::extender::{Extender, router};
use egpu_k8s::plugin::DEFAULT_RESOURCE;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

#[derive(Debug, Parser)]
#[command(name = "egpu-scheduler", version, about = "kube-scheduler extender: per-GPU fit and eGPU's placement policy for egpu.io/gpu-memory pods")]
struct Args {
    /// Address to serve the extender's HTTP API on (filter, prioritize, healthz).
    #[arg(long, default_value = "127.0.0.1:8888")]
    listen: SocketAddr,
    /// The extended resource the device plugin advertises.
    #[arg(long, default_value = DEFAULT_RESOURCE)]
    resource: String,
    /// How long a pod this extender bound keeps its units on its node when
    /// the node's annotation does not name it (admission failed, the pod
    /// went, or an older device plugin).
    #[arg(long, default_value = "2m", value_parser = positive_duration)]
    assume_ttl: std::time::Duration,
    /// Log filter (tracing's EnvFilter syntax).
    #[arg(long, env = "EGPU_LOG", default_value = "info", value_parser = egpu_node::logging::log_filter)]
    log: String,
}

fn positive_duration(s: &str) -> Result<std::time::Duration, String> {
    match humantime::parse_duration(s) {
        Ok(d) if d.is_zero() => Err("must be more than 0".into()),
        Ok(d) => Ok(d),
        Err(e) => Err(e.to_string()),
    }
}

fn main() -> ExitCode {
    let a = Args::parse();
    egpu_node::logging::init_logging(&a.log);
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("egpu-scheduler: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(a.listen).await.map_err(|e| format!("cannot listen on {}: {e}", a.listen))?;
        // The bound address (a :0 port resolved), for whoever started us.
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        println!("{{\"event\":\"listening\",\"addr\":\"{addr}\"}}");
        tracing::info!("extender for {} on http://{addr}", a.resource);
        let mut ext = Extender::new(&a.resource).with_assume_ttl(a.assume_ttl);
        // The API is needed only to bind (the scheduler's bindVerb); the
        // other verbs work without it.
        match kube::Client::try_default().await {
            Ok(c) => ext = ext.with_api(c),
            Err(e) => tracing::warn!("no API access ({e}): filter and prioritize work, bind answers that it cannot"),
        }
        axum::serve(listener, router(Arc::new(ext)))
            .with_graceful_shutdown(egpu_node::agent::shutdown_signal())
            .await
            .map_err(|e| e.to_string())
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("egpu-scheduler: {e}");
            ExitCode::FAILURE
        }
    }
}
