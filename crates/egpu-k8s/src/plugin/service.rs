//! The `DevicePlugin` gRPC service, and the loop that serves it and
//! registers it with the kubelet.

use super::{API_VERSION, PluginConfig, PluginError, Shared, file_id};
use crate::deviceplugin as dp;
use crate::tokens;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

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
        let mut container_responses = Vec::new();
        for r in &req.into_inner().container_requests {
            let size = usize::try_from(r.allocation_size).unwrap_or(0);
            let device_i_ds = match &inv {
                // Larger than any one GPU: whole GPUs, when enough are free.
                Some(inv) if size > inv.max_tokens() as usize => tokens::preferred_whole(&r.available_device_i_ds, &r.must_include_device_i_ds, size, &|u| inv.whole_of_uuid(u))
                    .unwrap_or_else(|| tokens::preferred(&r.available_device_i_ds, &r.must_include_device_i_ds, size)),
                // One GPU: the extender's hint, else best fit.
                _ => self.shared.preferred_one(&r.available_device_i_ds, &r.must_include_device_i_ds, size).await,
            };
            container_responses.push(dp::ContainerPreferredAllocationResponse { device_i_ds });
        }
        Ok(Response::new(dp::PreferredAllocationResponse { container_responses }))
    }

    async fn allocate(&self, req: Request<dp::AllocateRequest>) -> Result<Response<dp::AllocateResponse>, Status> {
        let mut container_responses = Vec::new();
        for r in &req.into_inner().container_requests {
            let t = std::time::Instant::now();
            let one = self.shared.allocate_one(&r.devices_ids).await;
            self.shared.metrics.allocation(one.is_ok(), t.elapsed());
            container_responses.push(one?);
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
    // Read once before serving, so the kubelet's first list is the node's
    // (a list the kubelet could not receive stops the plugin here).
    shared.refresh().await?;
    let pod_lister = shared.publisher.is_some().then(|| {
        let shared = shared.clone();
        tokio::spawn(async move { shared.follow_pods().await })
    });
    let refresher = {
        let shared = shared.clone();
        tokio::spawn(async move {
            let mut tick = crate::poll_ticker(shared.cfg.poll);
            let mut said = None;
            loop {
                tick.tick().await;
                // egpud's GPUs changed since the start: the kubelet keeps the last list.
                let e = shared.refresh().await.err().map(|e| e.to_string());
                if e.is_some() && e != said {
                    tracing::error!("{}; the kubelet keeps the last device list", e.as_deref().unwrap_or_default());
                }
                said = e;
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
        // Only the bind answers NotFound: the kubelet's directory is missing.
        let listener = match super::rebind(&sock) {
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
                // An Allocate naming every unit of a node is as long as its device list (up to 4 MiB).
                .add_service(dp::device_plugin_server::DevicePluginServer::new(service).max_decoding_message_size(16 << 20))
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
        shared.metrics.registered();
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
