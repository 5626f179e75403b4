//! `egpud`: the eGPU node agent (logic in `egpu-node`).

use anyhow::Context;
use clap::Parser;
use egpu_cli::daemon::DaemonArgs;
use egpu_node::agent::{Agent, shutdown_signal};
use egpu_node::config::{SIM_GPUS_ENV, SIM_STATE_ENV};
use std::process::ExitCode;

fn main() -> ExitCode {
    let args = DaemonArgs::parse();
    let config = args.config();
    if let Some(spec) = &config.simulate {
        // SAFETY: nothing but this thread exists yet (no runtime, no logger
        // thread), so no other thread can read the environment concurrently.
        unsafe {
            std::env::set_var(SIM_GPUS_ENV, spec);
            std::env::set_var(SIM_STATE_ENV, config.sim_state_path());
        }
    }
    egpu_node::logging::init_logging(&args.log);
    match run(config, args.metrics_addr) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("egpud: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(config: egpu_node::NodeConfig, metrics_addr: Option<std::net::SocketAddr>) -> anyhow::Result<()> {
    let agent = Agent::start(config)?;
    // <run-dir>/metrics.addr names the address of a running egpud's metrics:
    // one a crashed egpud left names nothing (this one holds the run
    // directory's lock), and a stopping one removes its own while it still
    // holds the lock (so never the file of an egpud started after it).
    let file = agent.node().config.run_dir.join("metrics.addr");
    let _ = std::fs::remove_file(&file);
    let mut written = None;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let r = rt.block_on(async {
        let (stop_metrics, stopped) = tokio::sync::oneshot::channel::<()>();
        if let Some(addr) = metrics_addr {
            let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("cannot listen on --metrics-addr {addr}"))?;
            let bound = listener.local_addr()?;
            // Written whole or not at all: a reader that sees the file reads the address.
            let tmp = file.with_extension("addr.tmp");
            std::fs::write(&tmp, format!("{bound}\n")).and_then(|()| std::fs::rename(&tmp, &file)).with_context(|| format!("writing {}", file.display()))?;
            written = Some(format!("{bound}\n"));
            tracing::info!(addr = %bound, "serving metrics at http://{bound}/metrics");
            let node = agent.node().clone();
            tokio::spawn(async move {
                if let Err(e) = egpu_node::metrics::serve(node, listener, async { let _ = stopped.await; }).await {
                    tracing::error!("{e:#}");
                }
            });
        }
        // The handlers go in now, before egpud serves (shutdown_signal
        // installs them when called): a SIGTERM as soon as the socket
        // exists must stop egpud, not kill it.
        let signal = shutdown_signal();
        let shutdown = async {
            signal.await;
            let _ = std::fs::remove_file(&file);
        };
        let r = agent.serve(shutdown).await;
        let _ = stop_metrics.send(());
        anyhow::Ok(r?)
    });
    // Stopped otherwise than by a signal (serving failed): the file, if it is still ours.
    if written.is_some() && std::fs::read_to_string(&file).ok() == written {
        let _ = std::fs::remove_file(&file);
    }
    r
}
