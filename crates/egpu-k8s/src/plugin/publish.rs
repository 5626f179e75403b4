//! The `egpu.io/gpus` annotation on the plugin's own Node, for the
//! scheduler extender.

use crate::annotation::ANNOTATION;
use std::sync::Mutex;
use std::time::Duration;

/// Writes the `egpu.io/gpus` annotation on the plugin's own Node.
pub struct Publisher {
    api: kube::Api<k8s_openapi::api::core::v1::Node>,
    pub(super) pods: kube::Api<k8s_openapi::api::core::v1::Pod>,
    pub(super) node: String,
    /// The value last patched, and when.
    last: Mutex<Option<(String, std::time::Instant)>>,
}

/// How long one patch of the Node may take before the refresh goes on.
pub(super) const PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);
/// An unchanged annotation is patched again this often, in case someone
/// removed it or the Node was re-created.
const REPUBLISH_EVERY: Duration = Duration::from_secs(60);
/// At most one patch this often (lent burst memory can change every poll).
const PUBLISH_MIN_GAP: Duration = Duration::from_secs(2);

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher").field("node", &self.node).finish_non_exhaustive()
    }
}

impl Publisher {
    pub fn new(client: kube::Client, node: String) -> Publisher {
        Publisher { api: kube::Api::all(client.clone()), pods: kube::Api::all(client), node, last: Mutex::new(None) }
    }

    /// Patches the annotation when its value changed since the last
    /// successful patch, or that was [`REPUBLISH_EVERY`] ago; a failure or a
    /// patch slower than [`PUBLISH_TIMEOUT`] is logged and retried at the
    /// next refresh, which it does not hold up longer.
    pub(super) async fn publish(&self, value: String) {
        let skip = |l: &Option<(String, std::time::Instant)>| {
            l.as_ref().is_some_and(|(v, at)| (*v == value && at.elapsed() < REPUBLISH_EVERY) || at.elapsed() < PUBLISH_MIN_GAP)
        };
        if skip(&self.last.lock().expect("publisher lock")) {
            return;
        }
        let patch = serde_json::json!({ "metadata": { "annotations": { ANNOTATION: value } } });
        let params = kube::api::PatchParams::default();
        match tokio::time::timeout(PUBLISH_TIMEOUT, self.api.patch(&self.node, &params, &kube::api::Patch::Merge(&patch))).await {
            Ok(Ok(_)) => *self.last.lock().expect("publisher lock") = Some((value, std::time::Instant::now())),
            Ok(Err(e)) => tracing::warn!(node = %self.node, "cannot annotate the node with its free GPU memory ({e}); the scheduler extender will not see this node's changes until it can"),
            Err(_) => tracing::warn!(node = %self.node, "annotating the node took over {PUBLISH_TIMEOUT:?}; retrying at the next refresh"),
        }
    }
}
