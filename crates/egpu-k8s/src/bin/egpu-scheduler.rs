//! `egpu-scheduler`: the kube-scheduler extender (logic in `egpu-k8s`):
//! filters nodes where each container's `egpu.io/gpu-memory` fits one GPU
//! and scores them with eGPU's placement policy.

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
    /// Log filter (tracing's EnvFilter syntax).
    #[arg(long, env = "EGPU_LOG", default_value = "info", value_parser = egpu_node::logging::log_filter)]
    log: String,
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
        axum::serve(listener, router(Arc::new(Extender::new(&a.resource))))
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
