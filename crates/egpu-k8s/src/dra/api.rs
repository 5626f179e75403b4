//! The API server as the plugin uses it: a claim read, the ResourceSlice
//! written, the node's pods followed. Behind [`Cluster`], so that tests
//! put their own in its place.

use super::publish::DIGEST_ANNOTATION;
use k8s_openapi::api::resource::v1 as res;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Where the plugin reads claims and publishes its ResourceSlice.
pub trait Cluster: Send + Sync + 'static {
    fn claim(&self, namespace: &str, name: &str) -> impl std::future::Future<Output = Result<res::ResourceClaim, String>> + Send;
    /// Makes the ResourceSlice `name` say `spec`: creates it, or replaces it
    /// (its pool generation bumped past the stored one) unless it already
    /// carries `digest` ([`DIGEST_ANNOTATION`]). Owned by the Node `node`,
    /// so that it goes with the Node.
    fn publish(&self, name: &str, node: &str, spec: res::ResourceSliceSpec, digest: &str) -> impl std::future::Future<Output = Result<Written, String>> + Send;
    /// Follows the node's pods (a list, then a watch) into `pods`: their
    /// `egpu.io/` annotations by (namespace, name). Runs until dropped.
    fn follow_pods(&self, node: &str, retry: Duration, pods: Arc<Mutex<Option<PodAnnotations>>>) -> impl std::future::Future<Output = ()> + Send;
}

/// The node's pods, by (namespace, name); `None` before the first list.
pub use crate::follow::NodePods as PodAnnotations;

/// What a publish did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    Created,
    Replaced,
    Unchanged,
}

/// The API server, through the kube client.
#[derive(Clone)]
pub struct Api {
    client: kube::Client,
}

impl Api {
    pub fn new(client: kube::Client) -> Api {
        Api { client }
    }
}

/// How long one API call may take.
const API_TIMEOUT: Duration = Duration::from_secs(10);

impl Cluster for Api {
    async fn claim(&self, namespace: &str, name: &str) -> Result<res::ResourceClaim, String> {
        let api: kube::Api<res::ResourceClaim> = kube::Api::namespaced(self.client.clone(), namespace);
        match tokio::time::timeout(API_TIMEOUT, api.get_opt(name)).await {
            Ok(Ok(Some(c))) => Ok(c),
            Ok(Ok(None)) => Err(format!("ResourceClaim {namespace}/{name} does not exist")),
            Ok(Err(e)) => Err(format!("cannot read ResourceClaim {namespace}/{name}: {e}")),
            Err(_) => Err(format!("reading ResourceClaim {namespace}/{name} took over {API_TIMEOUT:?}")),
        }
    }

    async fn publish(&self, name: &str, node: &str, mut spec: res::ResourceSliceSpec, digest: &str) -> Result<Written, String> {
        let api: kube::Api<res::ResourceSlice> = kube::Api::all(self.client.clone());
        let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(self.client.clone());
        // Owned by the Node: deleted with it. Without the Node's UID (no
        // access, no such Node) it is written unowned, and owned later.
        let owner = || async {
            match nodes.get_opt(node).await {
                Ok(Some(n)) => n.metadata.uid.map(|uid| k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                    api_version: "v1".into(),
                    kind: "Node".into(),
                    name: node.to_string(),
                    uid,
                    controller: Some(true),
                    block_owner_deletion: None,
                }),
                Ok(None) => None,
                Err(e) => {
                    tracing::warn!("cannot read Node {node} ({e}); the ResourceSlice is written without an owner for now, so it would outlive the Node");
                    None
                }
            }
        };
        let call = async {
            match api.get_opt(name).await.map_err(|e| format!("cannot read ResourceSlice {name}: {e}"))? {
                None => {
                    let metadata = kube::api::ObjectMeta {
                        name: Some(name.to_string()),
                        annotations: Some(BTreeMap::from([(DIGEST_ANNOTATION.to_string(), digest.to_string())])),
                        owner_references: owner().await.map(|o| vec![o]),
                        ..Default::default()
                    };
                    api.create(&kube::api::PostParams::default(), &res::ResourceSlice { metadata, spec }).await.map_err(|e| format!("cannot create ResourceSlice {name}: {e}"))?;
                    Ok(Written::Created)
                }
                Some(mut have) => {
                    let same = have.metadata.annotations.as_ref().and_then(|a| a.get(DIGEST_ANNOTATION)).is_some_and(|d| d == digest);
                    let owned = have.metadata.owner_references.as_ref().is_some_and(|o| o.iter().any(|o| o.kind == "Node"));
                    let new_owner = if owned { None } else { owner().await };
                    if same && new_owner.is_none() {
                        return Ok(Written::Unchanged);
                    }
                    if let Some(o) = new_owner {
                        have.metadata.owner_references.get_or_insert_default().push(o);
                    }
                    if !same {
                        spec.pool.generation = have.spec.pool.generation.saturating_add(1);
                        have.spec = spec;
                        have.metadata.annotations.get_or_insert_default().insert(DIGEST_ANNOTATION.to_string(), digest.to_string());
                    }
                    api.replace(name, &kube::api::PostParams::default(), &have).await.map_err(|e| format!("cannot update ResourceSlice {name}: {e}"))?;
                    Ok(if same { Written::Unchanged } else { Written::Replaced })
                }
            }
        };
        tokio::time::timeout(API_TIMEOUT, call).await.unwrap_or_else(|_| Err(format!("publishing ResourceSlice {name} took over {API_TIMEOUT:?}")))
    }

    async fn follow_pods(&self, node: &str, retry: Duration, pods: Arc<Mutex<Option<PodAnnotations>>>) {
        let api: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::all(self.client.clone());
        crate::follow::node_pods(&api, node, retry, API_TIMEOUT, &pods).await;
    }
}
