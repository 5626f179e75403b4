//! Following objects' metadata as the kubelet and kube-scheduler follow
//! theirs: one LIST, then a WATCH from the list's resource version, so the
//! API server streams changes instead of being asked for everything every
//! few seconds. Only metadata travels (`PartialObjectMetadata`): the
//! plugin needs its pods' annotations, the extender its nodes'.
//!
//! - Lists are served from the API server's watch cache (`resourceVersion=0`,
//!   as informers list), not read from etcd.
//! - A watch the server ends (its timeout) resumes from the last version
//!   seen (an event's or a bookmark's), with no new list.
//! - A watch that hears nothing for longer than the server's own timeout
//!   (a half-open connection: the client has no read timeout) is dropped
//!   and resumed the same way.
//! - A watch the server has expired (`410 Gone`, as an event, as the watch
//!   request's answer, or as a bare status in the stream) lists again at
//!   once, unless the last list was less than `retry` ago.
//! - A failed list or watch lists again after `retry`.
//! - A watch that ends sooner than `retry` after it started waits out the
//!   rest of `retry` before the next, so a server that ends every watch at
//!   once is not asked in a tight loop.

use kube::api::{ListParams, ObjectMeta, WatchEvent, WatchParams};
use serde::de::DeserializeOwned;
use std::fmt::Debug;
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

/// The server's timeout for one watch, seconds (under its 30 min cap).
const WATCH_SECONDS: u32 = 290;
/// Silence on a watch longer than this means the connection is gone: the
/// server ends a watch after `WATCH_SECONDS` and sends bookmarks meanwhile.
const WATCH_SILENCE: Duration = Duration::from_secs(WATCH_SECONDS as u64 + 30);

impl Follow {
    fn list_params(&self) -> ListParams {
        let mut lp = ListParams::default().match_any();
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

    /// Lists once: every object's metadata to `listed`, and the list's
    /// resource version; `None` (logged) when the list fails.
    pub async fn list<K>(&self, api: &kube::Api<K>, listed: &mut impl FnMut(Vec<ObjectMeta>)) -> Option<String>
    where
        K: Clone + DeserializeOwned + Debug,
    {
        match tokio::time::timeout(self.list_timeout, api.list_metadata(&self.list_params())).await {
            Ok(Ok(list)) => {
                listed(list.items.into_iter().map(|o| o.metadata).collect());
                Some(list.metadata.resource_version.unwrap_or_default())
            }
            Ok(Err(e)) => {
                tracing::warn!("cannot list {} ({e}); trying again in {:?}", self.what, self.retry);
                None
            }
            Err(_) => {
                tracing::warn!("listing {} took over {:?}; trying again in {:?}", self.what, self.list_timeout, self.retry);
                None
            }
        }
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
        loop {
            let mut rv = match version.take() {
                Some(v) => v,
                None => {
                    listed_at = tokio::time::Instant::now();
                    match self.list(api, &mut listed).await {
                        Some(v) => v,
                        None => {
                            tokio::time::sleep(self.retry).await;
                            continue;
                        }
                    }
                }
            };
            // Follow from `rv` until the watch must list again: `true` at
            // once (410 Gone), `false` after `retry` (a failure).
            let at_once = loop {
                let started = tokio::time::Instant::now();
                let stream = match tokio::time::timeout(self.list_timeout, api.watch_metadata(&wp, &rv)).await {
                    Ok(Ok(s)) => s,
                    Ok(Err(kube::Error::Api(st))) if st.code == 410 => break true,
                    Ok(Err(e)) => {
                        tracing::warn!("cannot watch {} ({e}); listing again in {:?}", self.what, self.retry);
                        break false;
                    }
                    Err(_) => {
                        tracing::warn!("watching {} took over {:?} to start; listing again in {:?}", self.what, self.list_timeout, self.retry);
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
                            if st.code != 410 {
                                tracing::warn!("the watch of {} failed ({}: {}); listing again in {:?}", self.what, st.code, st.message, self.retry);
                            }
                            end = Some(st.code == 410);
                            break;
                        }
                        Err(kube::Error::Api(st)) if st.code == 410 => {
                            end = Some(true);
                            break;
                        }
                        Err(e) => {
                            tracing::warn!("the watch of {} broke ({e}); listing again in {:?}", self.what, self.retry);
                            end = Some(false);
                            break;
                        }
                    };
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
            if !at_once {
                tokio::time::sleep(self.retry).await;
            } else {
                tokio::time::sleep_until(listed_at + self.retry).await;
            }
        }
    }
}
