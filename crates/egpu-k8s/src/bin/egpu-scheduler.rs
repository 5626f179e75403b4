//! `egpu-scheduler`: the kube-scheduler extender (logic in `egpu-k8s`):
//! filters nodes where each container's `egpu.io/gpu-memory` fits one GPU,
//! scores them with eGPU's placement policy, binds pods, remembering
//! their units until the nodes' annotations count them, and judges
//! preemption per GPU.

use clap::Parser;
use egpu_k8s::extender::{Extender, NodeCache, RESYNC_EVERY, metrics_router, router};
use egpu_k8s::follow::{Follow, ListFrom};
use k8s_openapi::api::core::v1::Node;
use egpu_k8s::plugin::DEFAULT_RESOURCE;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

#[derive(Debug, Parser)]
#[command(name = "egpu-scheduler", version, about = "kube-scheduler extender: per-GPU fit and eGPU's placement policy for egpu.io/gpu-memory pods")]
struct Args {
    /// Address to serve the extender's HTTP API on (filter, prioritize,
    /// bind, preempt, metrics, healthz). `bind` has no authentication and binds pods with this
    /// process's credentials, so with binding on the address must be a
    /// loopback one (beside kube-scheduler, in its pod).
    #[arg(long, default_value = "127.0.0.1:8888")]
    listen: SocketAddr,
    /// The extended resource the device plugin advertises.
    // Checked as the API server checks one: a typo would read every pod as
    // asking for nothing.
    #[arg(long, default_value = DEFAULT_RESOURCE, value_parser = egpu_k8s::names::resource_flag)]
    resource: String,
    /// How long a pod this extender bound keeps its units on its node when
    /// the node's annotation does not count them (admission failed, the pod
    /// went, or an older device plugin); a pod still bound and Pending is
    /// assumed again at the next resync (every 30 s).
    #[arg(long, default_value = "2m", value_parser = positive_duration)]
    assume_ttl: std::time::Duration,
    /// Do not bind (for a scheduler configured without bindVerb): no API
    /// access is needed, and `bind` answers that it is off. Nor is there a
    /// node cache: the scheduler must send Node objects.
    #[arg(long)]
    no_bind: bool,
    /// The nodes whose `egpu.io/gpus` annotations the extender follows, for
    /// a scheduler that sends node names (`nodeCacheCapable: true`): a label
    /// selector, empty for every node.
    #[arg(long, default_value = "egpu.io/enabled=true")]
    node_selector: String,
    /// Also serve `GET /metrics` (and `/healthz`) here, for a Prometheus
    /// outside the pod (the main address is loopback); read-only.
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
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
    if !a.no_bind && !a.listen.ip().is_loopback() {
        eprintln!(
            "egpu-scheduler: --listen {} is not a loopback address, and /bind has no authentication: it binds pods with this process's credentials. Listen on 127.0.0.1 beside kube-scheduler (deploy/egpu-scheduler.yaml), or pass --no-bind and leave bindVerb out of the scheduler's config",
            a.listen
        );
        return ExitCode::from(2);
    }
    let result = rt.block_on(async {
        // The API is needed only to bind (the scheduler's bindVerb).
        let api = if a.no_bind {
            None
        } else {
            Some(kube::Client::try_default().await.map_err(|e| format!("no API access to bind pods with ({e}): run it with a service account or KUBECONFIG, or pass --no-bind and leave bindVerb out of the scheduler's config"))?)
        };
        let mut ext = Extender::new(&a.resource).with_assume_ttl(a.assume_ttl);
        if let Some(c) = api {
            // The eGPU nodes' annotations, listed before it answers, then
            // watched.
            let cache = Arc::new(NodeCache::new(&a.node_selector));
            let nodes: kube::Api<Node> = kube::Api::all(c.clone());
            let follow = Follow {
                what: format!("the nodes selected by '{}'", a.node_selector),
                fields: None,
                labels: (!a.node_selector.is_empty()).then(|| a.node_selector.clone()),
                retry: RESYNC_EVERY / 6,
                list_timeout: RESYNC_EVERY,
            };
            let version = match follow.list(&nodes, &ListFrom::Cache, &mut |n| cache.replace(n)).await {
                Ok(v) => {
                    tracing::info!("node cache: {} nodes", cache.len());
                    Some(v)
                }
                // A request the server refuses every time (a bad selector, no permission): say so and stop.
                Err(e) if e.is_refused() => return Err(format!("cannot list the nodes selected by --node-selector '{}': {e}", a.node_selector)),
                Err(e) => {
                    tracing::warn!("cannot list the nodes yet ({e}); until it can, requests that name nodes are answered that the cache is not filled");
                    None
                }
            };
            let c2 = cache.clone();
            tokio::spawn(async move { follow.run(&nodes, version, |n| c2.replace(n), |n, present| c2.update(n, present)).await });
            ext = ext.with_api(c).with_node_cache(cache);
        }
        let ext = Arc::new(ext);
        if !a.no_bind {
            // Pods bound before this process (a restart, a new leader) are
            // counted before it answers anything, and looked for again
            // every RESYNC_EVERY.
            match ext.resync().await {
                Ok(n) => tracing::info!("resync at start: {n} bound, pending pods assumed (those their nodes already count are dropped at the next look)"),
                Err(e) => tracing::warn!("cannot list the bound, pending pods ({e}); trying again in {RESYNC_EVERY:?}"),
            }
            let ext = ext.clone();
            tokio::spawn(async move {
                let mut tick = egpu_k8s::poll_ticker(RESYNC_EVERY);
                loop {
                    tick.tick().await;
                    if let Err(e) = ext.resync().await {
                        tracing::warn!("cannot list the bound, pending pods ({e})");
                    }
                }
            });
        }
        let mut metrics_addr = String::new();
        if let Some(m) = a.metrics_listen {
            let l = tokio::net::TcpListener::bind(m).await.map_err(|e| format!("cannot listen on {m} (--metrics-listen): {e}"))?;
            metrics_addr = format!(",\"metrics\":\"{}\"", l.local_addr().map_err(|e| e.to_string())?);
            let ext = ext.clone();
            tokio::spawn(async move {
                if let Err(e) = axum::serve(l, metrics_router(ext)).await {
                    tracing::warn!("the metrics server stopped: {e}");
                }
            });
        }
        let listener = tokio::net::TcpListener::bind(a.listen).await.map_err(|e| format!("cannot listen on {}: {e}", a.listen))?;
        // Handlers before the address goes out: a SIGTERM from then on is a clean stop.
        let shutdown = egpu_node::agent::shutdown_signal();
        // The bound address (a :0 port resolved), for whoever started us.
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        println!("{{\"event\":\"listening\",\"addr\":\"{addr}\"{metrics_addr}}}");
        tracing::info!("extender for {} on http://{addr}", a.resource);
        axum::serve(listener, router(ext))
            .with_graceful_shutdown(shutdown)
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
