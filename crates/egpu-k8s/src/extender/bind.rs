//! `bind`, and the resync that assumes the pods bound while the extender
//! did not see them.

use super::{BIND_DEADLINE, BindingArgs, BindingResult, Demand, Extender, RESYNC_DEADLINE};
use serde_json::Value;
use std::time::Instant;

/// The longest the hint's patch may take, of the bind's [`BIND_DEADLINE`]:
/// what is left is for the Binding.
const HINT_DEADLINE: std::time::Duration = std::time::Duration::from_millis(1500);

/// Writes the pod's `egpu.io/gpu-hint` (a merge patch of its annotations,
/// with its UID as precondition when the request names it). An error says
/// why, and whether the patch was surely not applied (a 4xx answer; not a
/// 5xx, a timeout or a broken connection).
async fn write_hint(pods: &kube::Api<k8s_openapi::api::core::v1::Pod>, a: &BindingArgs, hint: &crate::hint::Hint, deadline: tokio::time::Instant) -> Result<(), (String, bool)> {
    let mut metadata = serde_json::json!({"annotations": {crate::hint::HINT_ANNOTATION: hint.to_annotation()}});
    if !a.pod_uid.is_empty() {
        metadata["uid"] = a.pod_uid.clone().into();
    }
    let patch = serde_json::json!({ "metadata": metadata });
    let until = deadline.min(tokio::time::Instant::now() + HINT_DEADLINE);
    match tokio::time::timeout_at(until, pods.patch(&a.pod_name, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch))).await {
        Ok(Ok(_)) => Ok(()),
        // Refused (4xx): surely not applied; a 5xx or no answer may have been.
        Ok(Err(e)) => Err((e.to_string(), matches!(&e, kube::Error::Api(st) if (400..500).contains(&st.code)))),
        Err(_) => Err((format!("no answer within {} ms", HINT_DEADLINE.as_millis()), false)),
    }
}

/// Why a bind failed: `refused` when the request, the pod or the API
/// server's 4xx answer said no; otherwise (no answer in time, a server
/// error, no API access) it failed.
#[derive(Debug)]
struct BindError {
    refused: bool,
    why: String,
}

impl From<String> for BindError {
    fn from(why: String) -> Self {
        BindError { refused: false, why }
    }
}

impl std::fmt::Display for BindError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.why)
    }
}

impl Extender {
    /// `bind`: binds the pod to the node through the API server (as
    /// kube-scheduler's own binder does, the pod's UID as precondition),
    /// then assumes its units there until the node's annotation counts
    /// them. Any failure goes back in `Error`, and the scheduler retries
    /// the pod.
    pub async fn bind(&self, a: BindingArgs) -> BindingResult {
        let pod = format!("{}/{}", a.pod_namespace, a.pod_name);
        match self.bind_inner(&a, &pod).await {
            Ok(units) => {
                tracing::info!(pod, node = a.node, ?units, "bound");
                self.metrics.bind("bound");
                BindingResult::default()
            }
            Err(e) => {
                tracing::warn!(pod, node = a.node, "cannot bind: {e}");
                self.metrics.bind(if e.refused { "refused" } else { "failed" });
                BindingResult { error: format!("egpu-scheduler cannot bind {pod} to {}: {}", a.node, e.why) }
            }
        }
    }

    async fn bind_inner(&self, a: &BindingArgs, pod: &str) -> Result<Vec<u32>, BindError> {
        use k8s_openapi::api::core::v1::{Binding, ObjectReference, Pod as KPod};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
        let client = self.api.clone().ok_or_else(|| BindError::from("this extender runs with --no-bind; remove bindVerb from the scheduler's extender config, or run it with API access".to_string()))?;
        if a.pod_name.is_empty() || a.pod_namespace.is_empty() || a.node.is_empty() {
            return Err(BindError { refused: true, why: "the request needs PodName, PodNamespace and Node".into() });
        }
        // The names go into the API's URLs: what is not a name is refused
        // here, not sent (a namespace is a DNS label, a pod or node name a
        // DNS subdomain).
        if !crate::names::is_dns_label(&a.pod_namespace) || !crate::names::is_dns_subdomain(&a.pod_name) || !crate::names::is_dns_subdomain(&a.node) {
            return Err(BindError { refused: true, why: format!("'{}' (namespace), '{}' (pod) or '{}' (node) is not a Kubernetes name", egpu_core::slice::shown(&a.pod_namespace), egpu_core::slice::shown(&a.pod_name), egpu_core::slice::shown(&a.node)) });
        }
        let deadline = tokio::time::Instant::now() + BIND_DEADLINE;
        let pods: kube::Api<KPod> = kube::Api::namespaced(client, &a.pod_namespace);
        let remembered = self.assumed.lock().expect("assume lock").demand(&a.pod_uid);
        let units = match remembered {
            Some(u) => u,
            // Not filtered by this process (it restarted, or another
            // replica led): read the pod.
            None => {
                let p = tokio::time::timeout_at(deadline, pods.get(&a.pod_name)).await.map_err(|_| "reading the pod timed out".to_string())?.map_err(|e| BindError {
                    refused: matches!(&e, kube::Error::Api(st) if (400..500).contains(&st.code)),
                    why: format!("cannot read the pod: {e}"),
                })?;
                let v = serde_json::to_value(&p).map_err(|e| e.to_string())?;
                Demand::of_pod(&v, &self.resource).map_err(|e| BindError { refused: true, why: e.to_string() })?.in_order
            }
        };
        // Assumed before the API call: a filter for the next pod may come
        // while it is in flight, and a call whose answer is lost (timeout,
        // broken connection) may still have bound the pod. Only a definite
        // refusal releases it; otherwise the node's annotation or the time
        // to live ends it.
        //
        // With the policy's GPU for each container, which the pod's hint
        // then hands to the device plugin (`crate::hint`).
        let gpus = self.hint(&a.node, pod, &units);
        let hint = crate::hint::Hint {
            // Only what can be written (a UUID the format cannot carry is
            // left to best fit).
            gpus: units.iter().zip(&gpus).filter_map(|(&u, g)| Some((g.clone().filter(|g| crate::hint::valid_uuid(g))?, u))).collect(),
            at: crate::unix_secs(),
            total: units.iter().map(|&u| u64::from(u)).sum(),
        };
        self.assumed.lock().expect("assume lock").assume_on(&a.node, pod, units.clone(), gpus, Instant::now(), self.assume_ttl);
        if hint.gpus.is_empty() {
            self.metrics.hint("none");
        } else {
            // Before the Binding, so that the pod reaches its node with it.
            // Advisory: a pod whose hint cannot be written is bound
            // without it, and the plugin's best fit places it.
            match write_hint(&pods, a, &hint, deadline).await {
                Ok(()) => self.metrics.hint("written"),
                Err((why, definite)) => {
                    tracing::warn!(pod, node = a.node, "cannot write the pod's GPU hint ({}), binding it without: {why}", crate::hint::HINT_ANNOTATION);
                    self.metrics.hint("failed");
                    // A patch that timed out may still have been applied:
                    // then the hinted GPU stays the better guess.
                    if definite {
                        self.assumed.lock().expect("assume lock").assume(&a.node, pod, units.clone(), Instant::now(), self.assume_ttl);
                    }
                }
            }
        }
        let binding = Binding {
            metadata: ObjectMeta { name: Some(a.pod_name.clone()), namespace: Some(a.pod_namespace.clone()), uid: (!a.pod_uid.is_empty()).then(|| a.pod_uid.clone()), ..Default::default() },
            target: ObjectReference { api_version: Some("v1".into()), kind: Some("Node".into()), name: Some(a.node.clone()), ..Default::default() },
        };
        let posted = tokio::time::timeout_at(deadline, pods.create_subresource::<_, Value>("binding", &a.pod_name, &kube::api::PostParams::default(), &binding)).await;
        match posted {
            Ok(Ok(_)) => Ok(units),
            // An earlier bind to this node whose answer was lost: bound.
            Ok(Err(kube::Error::Api(st))) if st.code == 409 && st.message.contains(&format!("already assigned to node \"{}\"", a.node)) => Ok(units),
            Ok(Err(kube::Error::Api(st))) if (400..500).contains(&st.code) => {
                self.assumed.lock().expect("assume lock").release(&a.node, pod);
                Err(BindError { refused: true, why: format!("the API server refused it ({}): {}", st.code, st.message) })
            }
            Ok(Err(e)) => Err(format!("{e} (its units stay counted on the node until its annotation or --assume-ttl says otherwise)").into()),
            Err(_) => Err(format!("the API server did not answer within {} s (its units stay counted on the node until its annotation or --assume-ttl says otherwise)", BIND_DEADLINE.as_secs()).into()),
        }
    }

    /// Assumes the units of every pod that is bound to a node but still
    /// `Pending` and asks for the resource, where nothing is assumed for it
    /// yet: what a restarted extender, or a new leader's, did not see bind
    /// (and pods another scheduler bound). Those the nodes' annotations
    /// already count are dropped at the next look at their node. Returns
    /// how many it added.
    pub async fn resync(&self) -> Result<usize, String> {
        use k8s_openapi::api::core::v1::Pod as KPod;
        let client = self.api.clone().ok_or("no API access")?;
        let pods: kube::Api<KPod> = kube::Api::all(client);
        // From the API server's watch cache (resourceVersion=0), not etcd: a
        // resync may be a little stale, not a load on a large cluster.
        let lp = kube::api::ListParams::default().match_any().fields("status.phase=Pending,spec.nodeName!=");
        let list = tokio::time::timeout(RESYNC_DEADLINE, pods.list(&lp)).await.map_err(|_| format!("listing the pending pods took over {RESYNC_DEADLINE:?}"))?.map_err(|e| e.to_string())?;
        let mut added = 0;
        // Pods being deleted hold nothing they will use.
        for p in list.items.into_iter().filter(|p| p.metadata.deletion_timestamp.is_none()) {
            let (Some(ns), Some(name), Some(node)) = (p.metadata.namespace.clone(), p.metadata.name.clone(), p.spec.as_ref().and_then(|s| s.node_name.clone())) else { continue };
            let Ok(v) = serde_json::to_value(&p) else { continue };
            let Ok(d) = Demand::of_pod(&v, &self.resource) else { continue };
            if !d.in_order.is_empty() && self.assumed.lock().expect("assume lock").assume_if_absent(&node, &format!("{ns}/{name}"), d.in_order, Instant::now(), self.assume_ttl) {
                added += 1;
            }
        }
        Ok(added)
    }
}
