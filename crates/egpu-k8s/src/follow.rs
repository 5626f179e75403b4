//! Following objects' metadata as the kubelet and kube-scheduler follow
//! theirs: one LIST, then a WATCH from the list's resource version, so the
//! API server streams changes instead of being asked for everything every
//! few seconds. Only metadata travels (`PartialObjectMetadata`): the
//! plugin needs its pods' annotations, the extender its nodes'.
//!
//! - The first list is served from the API server's watch cache
//!   (`resourceVersion=0`), not read from etcd. A later list after a failure
//!   asks for data not older than the last version seen, so a lagging API
//!   server cannot take the set back in time; after the server expired the
//!   version (`410 Gone`, or `504` "too large resource version" from a
//!   lagging one) it lists the latest (a consistent read).
//! - A watch the server ends (its timeout) resumes from the last version
//!   seen (an event's or a bookmark's), with no new list.
//! - A watch that hears nothing for longer than the server's own timeout
//!   (a half-open connection: the client has no read timeout) is dropped
//!   and resumed the same way.
//! - A watch the server has expired (`410 Gone`, as an event, as the watch
//!   request's answer, or as a bare status in the stream) lists again at
//!   once, unless the last list was less than `retry` ago.
//! - A failed list or watch lists again after `retry`, doubled after each
//!   failure in a row up to 8 × `retry` (a missing permission does not
//!   become a list every few seconds).
//! - A watch that ends sooner than `retry` after it started waits out the
//!   rest of `retry` before the next, so a server that ends every watch at
//!   once is not asked in a tight loop.

use kube::api::{ListParams, ObjectMeta, WatchEvent, WatchParams};
use serde::de::DeserializeOwned;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::sync::Mutex;
use std::time::Duration;
use tokio_stream::StreamExt;

/// What to follow.
#[derive(Debug, Clone)]
pub struct Follow {
    /// For the log: "this node's pods", "eGPU nodes".
    pub what: String,
    /// A field selector (`spec.nodeName=n1`), or none.
    pub fields: Option<String>,
    /// A label selector (`egpu.io/enabled=true`), or none.
    pub labels: Option<String>,
    /// How long to wait after a failure.
    pub retry: Duration,
    /// How long one list may take.
    pub list_timeout: Duration,
}

/// Which data a list asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListFrom {
    /// The API server's watch cache, however recent (`resourceVersion=0`).
    Cache,
    /// Not older than this version.
    NotOlderThan(String),
    /// The latest (a consistent read).
    Latest,
}

/// Why a list failed.
#[derive(Debug, thiserror::Error)]
pub enum ListError {
    #[error("it took over {0:?}")]
    Timeout(Duration),
    #[error("{0}")]
    Api(#[from] kube::Error),
}

impl ListError {
    /// A request the server will refuse however often it is sent (a bad
    /// selector, a missing permission).
    pub fn is_refused(&self) -> bool {
        matches!(self, ListError::Api(kube::Error::Api(st)) if matches!(st.code, 400 | 401 | 403 | 422))
    }
}

/// Whether the server says the version is gone from its history (or, from
/// a lagging server, not in it yet): list the latest.
fn expired(st: &kube::core::Status) -> bool {
    st.code == 410 || (st.code == 504 && (st.reason.contains("TooLarge") || st.message.to_lowercase().contains("too large resource version")))
}

/// The server's timeout for one watch, seconds (under its 30 min cap).
const WATCH_SECONDS: u32 = 290;
/// Silence on a watch longer than this means the connection is gone: the
/// server ends a watch after `WATCH_SECONDS` and sends bookmarks meanwhile.
const WATCH_SILENCE: Duration = Duration::from_secs(WATCH_SECONDS as u64 + 30);

impl Follow {
    fn list_params(&self, from: &ListFrom) -> ListParams {
        let mut lp = match from {
            ListFrom::Cache => ListParams::default().match_any(),
            ListFrom::NotOlderThan(v) => ListParams::default().at(v).matching(kube::api::VersionMatch::NotOlderThan),
            ListFrom::Latest => ListParams::default(),
        };
        if let Some(f) = &self.fields {
            lp = lp.fields(f);
        }
        if let Some(l) = &self.labels {
            lp = lp.labels(l);
        }
        lp
    }

    fn watch_params(&self) -> WatchParams {
        let mut wp = WatchParams::default().timeout(WATCH_SECONDS);
        if let Some(f) = &self.fields {
            wp = wp.fields(f);
        }
        if let Some(l) = &self.labels {
            wp = wp.labels(l);
        }
        wp
    }

    /// Lists once: every object's metadata to `listed`; the list's
    /// resource version.
    pub async fn list<K>(&self, api: &kube::Api<K>, from: &ListFrom, listed: &mut impl FnMut(Vec<ObjectMeta>)) -> Result<String, ListError>
    where
        K: Clone + DeserializeOwned + Debug,
    {
        let list = tokio::time::timeout(self.list_timeout, api.list_metadata(&self.list_params(from))).await.map_err(|_| ListError::Timeout(self.list_timeout))??;
        listed(list.items.into_iter().map(|o| o.metadata).collect());
        Ok(list.metadata.resource_version.unwrap_or_default())
    }

    /// The wait after `failures` failures in a row.
    fn backoff(&self, failures: u32) -> Duration {
        self.retry * (1 << failures.clamp(1, 4).saturating_sub(1))
    }

    /// Follows for ever (until the task is dropped): `listed` gets the
    /// whole set at each list, `changed(meta, present)` each change after
    /// it (`present` false: deleted, or no longer selected). With `version`,
    /// the first list is skipped and the watch starts from it (the caller
    /// has just listed).
    pub async fn run<K>(&self, api: &kube::Api<K>, mut version: Option<String>, mut listed: impl FnMut(Vec<ObjectMeta>), mut changed: impl FnMut(ObjectMeta, bool))
    where
        K: Clone + DeserializeOwned + Debug,
    {
        let wp = self.watch_params();
        let mut listed_at = tokio::time::Instant::now();
        let mut from = ListFrom::Cache;
        let mut failures = 0u32;
        loop {
            let mut rv = match version.take() {
                Some(v) => v,
                None => {
                    listed_at = tokio::time::Instant::now();
                    match self.list(api, &from, &mut listed).await {
                        Ok(v) => v,
                        Err(e) => {
                            failures += 1;
                            let wait = self.backoff(failures);
                            tracing::warn!("cannot list {} ({e}); trying again in {wait:?}", self.what);
                            tokio::time::sleep(wait).await;
                            continue;
                        }
                    }
                }
            };
            // Follow from `rv` until the watch must list again: `true` when
            // the server expired the version, `false` after a failure.
            let expired_now = loop {
                let started = tokio::time::Instant::now();
                let stream = match tokio::time::timeout(self.list_timeout, api.watch_metadata(&wp, &rv)).await {
                    Ok(Ok(s)) => s,
                    Ok(Err(kube::Error::Api(st))) if expired(&st) => break true,
                    Ok(Err(e)) => {
                        tracing::warn!("cannot watch {} ({e})", self.what);
                        break false;
                    }
                    Err(_) => {
                        tracing::warn!("watching {} took over {:?} to start", self.what, self.list_timeout);
                        break false;
                    }
                };
                let mut stream = std::pin::pin!(stream);
                let mut end = None;
                loop {
                    let ev = match tokio::time::timeout(WATCH_SILENCE, stream.next()).await {
                        Ok(Some(ev)) => ev,
                        // Ended by the server, or silent too long: resume.
                        Ok(None) => break,
                        Err(_) => {
                            tracing::warn!("the watch of {} was silent for {WATCH_SILENCE:?}; watching again", self.what);
                            break;
                        }
                    };
                    let (meta, present) = match ev {
                        Ok(WatchEvent::Added(o) | WatchEvent::Modified(o)) => (o.metadata, true),
                        Ok(WatchEvent::Deleted(o)) => (o.metadata, false),
                        Ok(WatchEvent::Bookmark(b)) => {
                            rv = b.metadata.resource_version;
                            continue;
                        }
                        Ok(WatchEvent::Error(st)) => {
                            if !expired(&st) {
                                tracing::warn!("the watch of {} failed ({}: {})", self.what, st.code, st.message);
                            }
                            end = Some(expired(&st));
                            break;
                        }
                        Err(kube::Error::Api(st)) if expired(&st) => {
                            end = Some(true);
                            break;
                        }
                        Err(e) => {
                            tracing::warn!("the watch of {} broke ({e})", self.what);
                            end = Some(false);
                            break;
                        }
                    };
                    failures = 0;
                    if let Some(v) = meta.resource_version.clone() {
                        rv = v;
                    }
                    changed(meta, present);
                }
                if let Some(now) = end {
                    break now;
                }
                tokio::time::sleep_until(started + self.retry).await;
            };
            if expired_now {
                from = ListFrom::Latest;
                tokio::time::sleep_until(listed_at + self.retry).await;
            } else {
                from = ListFrom::NotOlderThan(rv);
                failures += 1;
                let wait = self.backoff(failures);
                tracing::warn!("listing {} again in {wait:?}", self.what);
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// A pod of a node, as [`node_pods`] keeps it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodInfo {
    pub uid: String,
    /// Its `egpu.io/` annotations.
    pub annotations: BTreeMap<String, String>,
}

/// A node's pods, by (namespace, name).
pub type NodePods = HashMap<(String, String), PodInfo>;

/// A pod's entry in [`NodePods`], from its metadata (`None` without a name).
pub fn pod_entry(pod: ObjectMeta) -> Option<((String, String), PodInfo)> {
    let annotations = pod.annotations.unwrap_or_default().into_iter().filter(|(k, _)| k.starts_with("egpu.io/")).collect();
    Some(((pod.namespace.unwrap_or_default(), pod.name?), PodInfo { uid: pod.uid.unwrap_or_default(), annotations }))
}

/// Follows the pods of `node` (a list, then a watch: [`Follow`]) into
/// `pods` (`None` until the first list): what the kubelet plugins resize
/// slices from. Runs until dropped.
pub async fn node_pods(api: &kube::Api<k8s_openapi::api::core::v1::Pod>, node: &str, retry: Duration, list_timeout: Duration, pods: &Mutex<Option<NodePods>>) {
    let follow = Follow { what: "this node's pods".into(), fields: Some(format!("spec.nodeName={node}")), labels: None, retry, list_timeout };
    let entry = pod_entry;
    let listed = |list: Vec<ObjectMeta>| *pods.lock().expect("pods lock") = Some(list.into_iter().filter_map(entry).collect());
    let changed = |pod: ObjectMeta, present: bool| {
        let Some((key, info)) = entry(pod) else { return };
        if let Some(map) = pods.lock().expect("pods lock").as_mut() {
            if present {
                map.insert(key, info);
            } else {
                map.remove(&key);
            }
        }
    };
    follow.run(api, None, listed, changed).await;
}
