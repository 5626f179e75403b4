//! The extender protocol's JSON types, from the published
//! `k8s.io/kube-scheduler/extender/v1`: field names are Go's (capitalised),
//! and the older lower-case spellings are accepted too.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// Go writes a nil slice or map as `null`: read it as empty.
fn null_is_empty<'de, D: Deserializer<'de>, T: Default + Deserialize<'de>>(d: D) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// `ExtenderArgs`: the pod and the candidate nodes.
#[derive(Debug, Deserialize)]
pub struct ExtenderArgs {
    #[serde(rename = "Pod", alias = "pod")]
    pub pod: Option<Value>,
    #[serde(rename = "Nodes", alias = "nodes")]
    pub nodes: Option<NodeList>,
    #[serde(rename = "NodeNames", alias = "nodenames")]
    pub node_names: Option<Vec<String>>,
}

/// `v1.NodeList`, kept as JSON: the nodes that pass go back as they came.
#[derive(Debug, Default, Deserialize, Serialize)]
pub struct NodeList {
    #[serde(default, deserialize_with = "null_is_empty")]
    pub items: Vec<Value>,
}

/// `ExtenderFilterResult`.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct FilterResult {
    #[serde(rename = "Nodes", skip_serializing_if = "Option::is_none")]
    pub nodes: Option<NodeList>,
    #[serde(rename = "NodeNames", skip_serializing_if = "Option::is_none")]
    pub node_names: Option<Vec<String>>,
    #[serde(rename = "FailedNodes", default, deserialize_with = "null_is_empty")]
    pub failed_nodes: BTreeMap<String, String>,
    #[serde(rename = "FailedAndUnresolvableNodes", default, deserialize_with = "null_is_empty")]
    pub failed_and_unresolvable_nodes: BTreeMap<String, String>,
    #[serde(rename = "Error")]
    pub error: String,
}

/// `HostPriority`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostPriority {
    #[serde(rename = "Host")]
    pub host: String,
    #[serde(rename = "Score")]
    pub score: i64,
}

/// `ExtenderPreemptionArgs`: the pod, and the victims the scheduler chose
/// on each candidate node: UIDs only (`NodeNameToMetaVictims`) when the
/// extender is `nodeCacheCapable`, else whole pods (`NodeNameToVictims`).
#[derive(Debug, Deserialize)]
pub struct PreemptionArgs {
    #[serde(rename = "Pod", alias = "pod")]
    pub pod: Option<Value>,
    #[serde(rename = "NodeNameToVictims", alias = "nodeNameToVictims", default)]
    pub node_name_to_victims: Option<BTreeMap<String, Victims>>,
    #[serde(rename = "NodeNameToMetaVictims", alias = "nodeNameToMetaVictims", default)]
    pub node_name_to_meta_victims: Option<BTreeMap<String, MetaVictims>>,
}

/// `Victims`: whole pods.
#[derive(Debug, Deserialize)]
pub struct Victims {
    #[serde(rename = "Pods", alias = "pods", default, deserialize_with = "null_is_empty")]
    pub pods: Vec<Value>,
    #[serde(rename = "NumPDBViolations", alias = "numPDBViolations", default)]
    pub num_pdb_violations: i64,
}

/// `MetaVictims`: the victims' UIDs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaVictims {
    #[serde(rename = "Pods", alias = "pods", default, deserialize_with = "null_is_empty")]
    pub pods: Vec<MetaPod>,
    #[serde(rename = "NumPDBViolations", alias = "numPDBViolations", default)]
    pub num_pdb_violations: i64,
}

/// `MetaPod`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaPod {
    #[serde(rename = "UID", alias = "uid")]
    pub uid: String,
}

/// `ExtenderPreemptionResult`: the candidate nodes kept, with their victims
/// (always by UID, whichever form came in).
#[derive(Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreemptionResult {
    #[serde(rename = "NodeNameToMetaVictims")]
    pub node_name_to_meta_victims: BTreeMap<String, MetaVictims>,
}

/// A request the extender cannot answer; it goes back in `Error`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("the request has no Pod (a v1.Pod object)")]
    NoPod,
    #[error("the request has no Nodes, and this extender keeps no node cache (it runs with --no-bind, without API access): configure it with nodeCacheCapable: false, so that the scheduler sends Node objects (their egpu.io/gpus annotation is what it reads), or run it with API access")]
    NoNodes,
    #[error("the request has neither Nodes nor NodeNames")]
    NoCandidates,
    #[error("this extender's node cache has not been filled yet (it cannot list the nodes; its log says why): the scheduler retries the pod")]
    NotSynced,
    #[error("container '{container}' asks for {resource}: '{value}', which is not a whole number of units")]
    BadQuantity { container: String, resource: String, value: String },
    #[error("container '{container}' asks for {resource}: '{value}', which is {units} units, more than any node has: {resource} counts the device plugin's memory units (1 GiB each unless its --memory-unit says otherwise), not bytes, so ask for e.g. \"8\" for 8 GiB")]
    TooLarge { container: String, resource: String, value: String, units: u128 },
    #[error("{} '{container}' asks for {resource}: not supported ({}); give the memory to the app containers only", if *sidecar { "sidecar container (an init container with restartPolicy: Always)" } else { "init container" }, if *sidecar { "the extender places the units of app containers only" } else { "an init container's units pass to the app containers after it" })]
    InitContainer { container: String, resource: String, sidecar: bool },
    #[error("container '{container}' asks for {resource} {requests} in requests but {limits} in limits: an extended resource must have both equal")]
    Mismatch { container: String, resource: String, requests: u64, limits: u64 },
}

/// `ExtenderBindingArgs`: the pod and the node the scheduler chose.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct BindingArgs {
    #[serde(rename = "PodName", alias = "podName")]
    pub pod_name: String,
    #[serde(rename = "PodNamespace", alias = "podNamespace")]
    pub pod_namespace: String,
    #[serde(rename = "PodUID", alias = "podUID", default)]
    pub pod_uid: String,
    #[serde(rename = "Node", alias = "node")]
    pub node: String,
}

/// `ExtenderBindingResult`: empty `Error` on success.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BindingResult {
    #[serde(rename = "Error")]
    pub error: String,
}
