//! Connecting to `egpud` over its unix socket.

use crate::proto::node_client::NodeClient;
use hyper_util::rt::TokioIo;
use std::path::{Path, PathBuf};
use tonic::transport::{Channel, Endpoint, Uri};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// `reason` is the innermost cause (tonic's transport error repeats
    /// its source in its own message, so a cause chain would say it twice).
    #[error("cannot reach egpud at {path} ({reason}): start it with `egpud --simulate 2x16GiB` (or plain `egpud` on a GPU node), or point EGPU_SOCKET / --socket at its socket")]
    Unreachable { path: PathBuf, reason: String },
}

pub type Client = NodeClient<Channel>;

/// How long a request may wait for egpud's answer. Every call is a quick
/// unary one; an agent that accepts connections but never answers
/// (stopped, wedged) must not hang the CLI.
pub const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Connects to the agent serving `socket`.
pub async fn connect(socket: &Path) -> Result<Client, ClientError> {
    let channel = unix_channel(socket, std::time::Duration::from_secs(10), REQUEST_TIMEOUT)
        .await
        .map_err(|e| {
            let mut root: &dyn std::error::Error = &e;
            while let Some(next) = root.source() {
                root = next;
            }
            ClientError::Unreachable { path: socket.to_path_buf(), reason: root.to_string() }
        })?;
    Ok(NodeClient::new(channel))
}

/// A gRPC channel to the server on the unix socket `path` (egpud's, or the
/// kubelet's for the device plugin).
pub async fn unix_channel(path: &Path, connect_timeout: std::time::Duration, request_timeout: std::time::Duration) -> Result<Channel, tonic::transport::Error> {
    let p = path.to_path_buf();
    Endpoint::from_static("http://unix.local")
        .connect_timeout(connect_timeout)
        .timeout(request_timeout)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let p = p.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(p).await?)) }
        }))
        .await
}
