//! The kubelet's side: the `DRAPlugin` service (v1 and v1beta1), the
//! plugin watcher's `Registration`, and the loop that serves both sockets.

use super::api::Cluster;
use super::shared::Shared;
use super::{PLUGIN_TYPE, SUPPORTED_VERSIONS, registration, v1, v1beta1};
use crate::plugin::file_id;
use std::path::Path;
use std::sync::Arc;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

/// The `DRAPlugin` service, both versions.
pub struct Service<C: Cluster>(pub Arc<Shared<C>>);

impl<C: Cluster> Clone for Service<C> {
    fn clone(&self) -> Self {
        Service(self.0.clone())
    }
}

impl<C: Cluster> Service<C> {
    async fn prepare_all(&self, r: v1::NodePrepareResourcesRequest) -> v1::NodePrepareResourcesResponse {
        let mut claims = std::collections::HashMap::new();
        for c in r.claims {
            let t = std::time::Instant::now();
            let prepared = self.0.prepare(&c).await;
            self.0.metrics.claim("prepare", prepared.is_ok(), t.elapsed());
            let answer = match prepared {
                Ok(devices) => v1::NodePrepareResourceResponse { devices, error: String::new() },
                Err(error) => {
                    tracing::warn!(claim = %format!("{}/{}", c.namespace, c.name), "cannot prepare: {error}");
                    v1::NodePrepareResourceResponse { devices: vec![], error }
                }
            };
            claims.insert(c.uid, answer);
        }
        v1::NodePrepareResourcesResponse { claims }
    }

    async fn unprepare_all(&self, r: v1::NodeUnprepareResourcesRequest) -> v1::NodeUnprepareResourcesResponse {
        let mut claims = std::collections::HashMap::new();
        for c in r.claims {
            let t = std::time::Instant::now();
            let error = self.0.unprepare(&c).await.err().unwrap_or_default();
            self.0.metrics.claim("unprepare", error.is_empty(), t.elapsed());
            claims.insert(c.uid, v1::NodeUnprepareResourceResponse { error });
        }
        v1::NodeUnprepareResourcesResponse { claims }
    }
}

#[tonic::async_trait]
impl<C: Cluster> v1::dra_plugin_server::DraPlugin for Service<C> {
    async fn node_prepare_resources(&self, r: Request<v1::NodePrepareResourcesRequest>) -> Result<Response<v1::NodePrepareResourcesResponse>, Status> {
        Ok(Response::new(self.prepare_all(r.into_inner()).await))
    }
    async fn node_unprepare_resources(&self, r: Request<v1::NodeUnprepareResourcesRequest>) -> Result<Response<v1::NodeUnprepareResourcesResponse>, Status> {
        Ok(Response::new(self.unprepare_all(r.into_inner()).await))
    }
}

/// v1beta1's messages are v1's, field for field: a message of one is read
/// as the other through its encoding.
fn convert<A: prost::Message, B: prost::Message + Default>(a: &A) -> Result<B, Status> {
    B::decode(a.encode_to_vec().as_slice()).map_err(|e| Status::internal(format!("v1beta1/v1 conversion: {e}")))
}

#[tonic::async_trait]
impl<C: Cluster> v1beta1::dra_plugin_server::DraPlugin for Service<C> {
    async fn node_prepare_resources(&self, r: Request<v1beta1::NodePrepareResourcesRequest>) -> Result<Response<v1beta1::NodePrepareResourcesResponse>, Status> {
        let out = self.prepare_all(convert(&r.into_inner())?).await;
        Ok(Response::new(convert(&out)?))
    }
    async fn node_unprepare_resources(&self, r: Request<v1beta1::NodeUnprepareResourcesRequest>) -> Result<Response<v1beta1::NodeUnprepareResourcesResponse>, Status> {
        let out = self.unprepare_all(convert(&r.into_inner())?).await;
        Ok(Response::new(convert(&out)?))
    }
}

/// The plugin watcher's `Registration` service.
#[derive(Clone)]
pub struct Registrar {
    info: registration::PluginInfo,
    /// Woken when the kubelet says the plugin is registered.
    registered: Arc<tokio::sync::Notify>,
}

#[tonic::async_trait]
impl registration::registration_server::Registration for Registrar {
    async fn get_info(&self, _: Request<registration::InfoRequest>) -> Result<Response<registration::PluginInfo>, Status> {
        Ok(Response::new(self.info.clone()))
    }
    async fn notify_registration_status(&self, r: Request<registration::RegistrationStatus>) -> Result<Response<registration::RegistrationStatusResponse>, Status> {
        let r = r.into_inner();
        if r.plugin_registered {
            tracing::info!(driver = %self.info.name, "registered with the kubelet");
            self.registered.notify_one();
        } else {
            tracing::error!(driver = %self.info.name, "the kubelet refused the registration: {}", r.error);
        }
        Ok(Response::new(registration::RegistrationStatusResponse {}))
    }
}

/// Serves a socket at `path`, making its directory first (the plugin's own
/// under `plugins/`).
fn bind(path: &Path) -> std::io::Result<tokio::net::UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    crate::plugin::rebind(path)
}

/// Serves both sockets and keeps the ResourceSlice current until
/// `shutdown`; serves again when a socket is removed (the kubelet's plugin
/// directories wiped). The plugin socket is served before the registration
/// socket appears, so the kubelet finds it answering.
pub async fn run<C: Cluster>(shared: Arc<Shared<C>>, shutdown: impl std::future::Future<Output = ()> + Send + 'static) -> Result<(), String> {
    let cfg = shared.cfg.clone();
    let (stop_all, stopping) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_all.send(true);
    });
    let follower = {
        let shared = shared.clone();
        tokio::spawn(async move { shared.cluster.follow_pods(&shared.cfg.node, shared.cfg.pod_poll, shared.pods.clone()).await })
    };
    shared.refresh(false).await;
    let refresher = {
        let shared = shared.clone();
        tokio::spawn(async move {
            let mut tick = crate::poll_ticker(shared.cfg.poll);
            loop {
                let force = tokio::select! {
                    _ = tick.tick() => false,
                    _ = shared.republish.notified() => true,
                };
                shared.refresh(force).await;
            }
        })
    };
    let (plugin_sock, reg_sock) = (cfg.plugin_socket(), cfg.registration_socket());
    let info = registration::PluginInfo {
        r#type: PLUGIN_TYPE.into(),
        name: cfg.driver.clone(),
        endpoint: plugin_sock.display().to_string(),
        supported_versions: SUPPORTED_VERSIONS.iter().map(|s| s.to_string()).collect(),
    };
    let result = loop {
        let served = (|| Ok::<_, std::io::Error>((bind(&plugin_sock)?, file_id(&plugin_sock), bind(&reg_sock)?, file_id(&reg_sock))))();
        let (plugin_l, plugin_id, reg_l, reg_id) = match served {
            Ok(s) => s,
            Err(e) => break Err(format!("cannot serve on {} / {}: {e}", plugin_sock.display(), reg_sock.display())),
        };
        let (stop, stopped) = watch::channel(false);
        let until = |mut rx: watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let svc = Service(shared.clone());
        let plugin = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(v1::dra_plugin_server::DraPluginServer::new(svc.clone()))
                .add_service(v1beta1::dra_plugin_server::DraPluginServer::new(svc))
                .serve_with_incoming_shutdown(tokio_stream::wrappers::UnixListenerStream::new(plugin_l), until(stopped.clone())),
        );
        let reg = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(registration::registration_server::RegistrationServer::new(Registrar { info: info.clone(), registered: shared.republish.clone() }))
                .serve_with_incoming_shutdown(tokio_stream::wrappers::UnixListenerStream::new(reg_l), until(stopped)),
        );
        tracing::info!(driver = %cfg.driver, "serving {} and {}", plugin_sock.display(), reg_sock.display());
        let mut tick = tokio::time::interval(cfg.poll);
        let mut stopping = stopping.clone();
        let done = loop {
            tokio::select! {
                _ = stopping.wait_for(|s| *s) => break true,
                _ = tick.tick() => {
                    if file_id(&plugin_sock) != plugin_id || file_id(&reg_sock) != reg_id || plugin.is_finished() || reg.is_finished() {
                        tracing::info!("a socket was removed (kubelet restart?): serving again");
                        break false;
                    }
                }
            }
        };
        let _ = stop.send(true);
        let _ = plugin.await;
        let _ = reg.await;
        if done {
            for (p, id) in [(&reg_sock, reg_id), (&plugin_sock, plugin_id)] {
                if file_id(p) == id {
                    let _ = std::fs::remove_file(p);
                }
            }
            break Ok(());
        }
    };
    refresher.abort();
    follower.abort();
    result
}
