//! What the services and the loops share: preparing and unpreparing a
//! claim, and the refresh (egpud read, annotations applied, ResourceSlice
//! published).

use super::api::{Cluster, PodAnnotations, Written};
use super::claim::{kubelet_devices, plan};
use super::publish::{REPUBLISH_EVERY, digest, reserved_elsewhere, resource_slice_spec};
use super::state::{Prepared, load_prepared, resizes};
use super::{DraConfig, resource_slice_name, slice_name, v1};
use crate::tokens::Gpu;
use egpu_node::proto as node;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// State shared by the services and the loops.
pub struct Shared<C: Cluster> {
    pub(super) cfg: DraConfig,
    pub(super) cluster: C,
    /// The digest last published, and when it was last read back.
    published: Mutex<Option<(String, std::time::Instant)>>,
    /// Set when the kubelet (re)registers the plugin: publish again now (a
    /// starting kubelet has deleted its node's ResourceSlices).
    pub(super) republish: Arc<tokio::sync::Notify>,
    /// Prepares and unprepares run one at a time (egpud's answers to a
    /// repeated create are compared, not raced).
    lock: tokio::sync::Mutex<()>,
    /// The claims prepared, by UID (saved in `claims.json`).
    prepared: Mutex<BTreeMap<String, Prepared>>,
    /// The node's pods' annotations, as followed.
    pub(super) pods: Arc<Mutex<Option<PodAnnotations>>>,
    /// The last warning about each slice.
    warned: Mutex<std::collections::HashMap<String, String>>,
    /// `claims.json` is behind `prepared` (a save failed, or is due).
    dirty: std::sync::atomic::AtomicBool,
    /// A publish the kubelet's registration asked for is still to be done.
    force_publish: std::sync::atomic::AtomicBool,
    pub(super) metrics: crate::metrics::DraMetrics,
}

impl<C: Cluster> Shared<C> {
    pub fn new(cfg: DraConfig, cluster: C) -> Result<Arc<Shared<C>>, String> {
        cfg.check()?;
        let prepared = load_prepared(&cfg.state_file());
        Ok(Arc::new(Shared {
            cfg,
            cluster,
            published: Mutex::new(None),
            republish: Arc::new(tokio::sync::Notify::new()),
            lock: tokio::sync::Mutex::new(()),
            prepared: Mutex::new(prepared),
            pods: Arc::new(Mutex::new(None)),
            warned: Mutex::new(std::collections::HashMap::new()),
            dirty: std::sync::atomic::AtomicBool::new(false),
            force_publish: std::sync::atomic::AtomicBool::new(false),
            metrics: crate::metrics::DraMetrics::default(),
        }))
    }

    /// A scrape of the plugin's metrics (`--metrics-listen`).
    pub fn metrics_text(&self) -> String {
        let prepared = self.prepared.lock().expect("prepared lock").len();
        let synced = self.pods.lock().expect("pods lock").is_some();
        let problems = self.warned.lock().expect("warned lock").len();
        self.metrics.render(prepared, synced, problems)
    }

    fn mark_dirty(&self) {
        self.dirty.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Saves `claims.json` if it is behind; a failure is tried again at the
    /// next refresh.
    fn save_if_dirty(&self) {
        if self.dirty.swap(false, std::sync::atomic::Ordering::SeqCst) && !self.save() {
            self.mark_dirty();
        }
    }

    /// Saves the prepared claims: a new file, synced, renamed over the old
    /// one, and the directory synced. Whether it did.
    fn save(&self) -> bool {
        use std::io::Write;
        let path = self.cfg.state_file();
        let json = serde_json::to_vec_pretty(&*self.prepared.lock().expect("prepared lock")).unwrap_or_default();
        let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
        let tmp = dir.join(format!(".claims.json.{}", std::process::id()));
        let done = (|| {
            std::fs::create_dir_all(&dir)?;
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&json)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            std::fs::File::open(&dir)?.sync_all()
        })();
        if let Err(e) = done {
            let _ = std::fs::remove_file(&tmp);
            tracing::warn!("cannot save {} ({e}); trying again at the next refresh (until then a restarted plugin would not resize the slices of the claims prepared since)", path.display());
            return false;
        }
        true
    }

    /// Warns about a slice, unless the last warning about it said the same
    /// (cleared when a resize of it succeeds, or it goes).
    fn warn_once(&self, slice: &str, why: String) {
        if self.warned.lock().expect("warned lock").insert(slice.to_string(), why.clone()).as_ref() != Some(&why) {
            tracing::warn!(slice = %slice, "{why}");
        }
    }

    /// Resizes the slices of claims made for a pod to what the pod's
    /// annotations ask (the cap and the burst cap; absent, the claim's), and
    /// forgets claims whose slice is gone. Runs under `lock`, with `slices`
    /// read under it, so that a claim being prepared is not taken for gone.
    async fn apply_pod_annotations(&self, client: &mut egpu_node::client::Client, slices: &[node::Slice]) -> Result<(), String> {
        let prepared = self.prepared.lock().expect("prepared lock").clone();
        let gone: Vec<String> = prepared.keys().filter(|uid| !slices.iter().any(|s| s.name == slice_name(uid))).cloned().collect();
        if !gone.is_empty() {
            for uid in &gone {
                tracing::info!(slice = %slice_name(uid), "the slice of a prepared claim is gone (deleted on the node?); its claim is forgotten");
                self.warned.lock().expect("warned lock").remove(&slice_name(uid));
            }
            self.prepared.lock().expect("prepared lock").retain(|uid, _| !gone.contains(uid));
            self.mark_dirty();
        }
        self.save_if_dirty();
        let Some(pods) = self.pods.lock().expect("pods lock").clone() else { return Ok(()) };
        for (uid, p) in &prepared {
            let Some(slice) = slices.iter().find(|s| s.name == slice_name(uid)) else { continue };
            // The pod the claim was made for, not a later one of the same name.
            let owner = p.pod.as_ref().and_then(|pod| pods.get(&(p.namespace.clone(), pod.clone()))).filter(|o| p.pod_uid.as_ref().is_none_or(|u| *u == o.uid));
            let (Some(pod), Some(crate::follow::PodInfo { annotations, .. })) = (&p.pod, owner) else {
                // No pod to follow (gone, or a claim of its own): nothing
                // of its is left to apply.
                self.warned.lock().expect("warned lock").remove(&slice.name);
                continue;
            };
            let who = format!("pod {}/{pod}", p.namespace);
            match resizes(p, annotations, slice) {
                Ok(changes) => {
                    let mut failed = false;
                    for (device, limit, burst) in changes {
                        let req = node::ResizeSliceRequest { name: slice.name.clone(), devices: vec![device], compute_limit_bps: Some(limit), memory_burst_bytes: Some(burst), ..Default::default() };
                        match client.resize_slice(req).await {
                            Ok(_) => {
                                self.metrics.resized();
                                tracing::info!(slice = %slice.name, pod = %format!("{}/{pod}", p.namespace), device, limit_bps = limit, burst_bytes = burst, "resized from the pod's annotations");
                            }
                            Err(e) if matches!(e.code(), tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Unknown) => return Err(e.message().to_string()),
                            Err(e) => {
                                failed = true;
                                self.warn_once(&slice.name, format!("{who}: egpud refused the resize of GPU {device} ({}); tried again every --poll", e.message()));
                            }
                        }
                    }
                    if !failed {
                        self.warned.lock().expect("warned lock").remove(&slice.name);
                    }
                }
                Err(why) => self.warn_once(&slice.name, format!("{who}: {why}; the slice keeps its limits")),
            }
        }
        Ok(())
    }

    async fn egpud(&self) -> Result<egpu_node::client::Client, String> {
        egpu_node::client::connect(&self.cfg.egpud_socket).await.map_err(|e| format!("egpud is not reachable at {}: {e}", self.cfg.egpud_socket.display()))
    }

    /// egpud's GPUs, each with the memory it has for claims (less what
    /// slices made outside the driver hold), and what those slices hold.
    async fn read_node(client: &mut egpu_node::client::Client) -> Result<(Vec<Gpu>, Vec<node::Slice>), String> {
        let n = client.get_node(node::GetNodeRequest {}).await.map_err(|e| e.message().to_string())?.into_inner();
        let slices = client.list_slices(node::ListSlicesRequest {}).await.map_err(|e| e.message().to_string())?.into_inner().slices;
        let gpus = n.devices.iter().map(Gpu::from).collect();
        Ok((gpus, slices))
    }

    /// Reads egpud; publishes the ResourceSlice when what it would say
    /// changed, when the last publish failed, when `force` (the kubelet
    /// registered the plugin), or every [`REPUBLISH_EVERY`] to find it
    /// deleted.
    pub async fn refresh(&self, force: bool) {
        // egpud is read under `lock`, so that a claim being prepared is
        // not taken for gone by the annotations pass below.
        let one = self.lock.lock().await;
        let read = async {
            let mut client = self.egpud().await?;
            let (gpus, slices) = Self::read_node(&mut client).await?;
            Ok::<_, String>((client, gpus, slices))
        };
        let (mut client, gpus, slices) = match read.await {
            Ok(r) => r,
            Err(e) => {
                if force {
                    self.force_publish.store(true, std::sync::atomic::Ordering::SeqCst);
                }
                self.metrics.egpud_up(false);
                tracing::warn!("cannot read egpud ({e}); the ResourceSlice stays as last published, and claims cannot be prepared until egpud answers");
                return;
            }
        };
        self.metrics.egpud_up(true);
        if let Err(e) = self.apply_pod_annotations(&mut client, &slices).await {
            tracing::warn!("egpud did not answer while the pods' annotations were applied ({e}); trying again at the next refresh");
        }
        drop(one);
        let spec = resource_slice_spec(&self.cfg.driver, &self.cfg.node, &gpus, &reserved_elsewhere(&slices), 0);
        let d = digest(&spec);
        // A registration's publish waits here until one succeeds.
        let force = force || self.force_publish.swap(false, std::sync::atomic::Ordering::SeqCst);
        let fresh = self.published.lock().expect("published lock").as_ref().is_some_and(|(p, at)| *p == d && at.elapsed() < REPUBLISH_EVERY);
        if fresh && !force {
            return;
        }
        let name = resource_slice_name(&self.cfg.node, &self.cfg.driver);
        let devices = spec.devices.as_ref().map_or(0, Vec::len);
        match self.cluster.publish(&name, &self.cfg.node, spec, &d).await {
            Ok(w) => {
                if w != Written::Unchanged {
                    self.metrics.slice_write(if w == Written::Created { "created" } else { "updated" });
                    tracing::info!(slice = %name, devices, "{} the node's ResourceSlice", if w == Written::Created { "created" } else { "updated" });
                }
                *self.published.lock().expect("published lock") = Some((d, std::time::Instant::now()));
            }
            Err(e) => {
                if force {
                    self.force_publish.store(true, std::sync::atomic::Ordering::SeqCst);
                }
                self.metrics.slice_write("failed");
                tracing::warn!("{e}; retrying at the next refresh");
            }
        }
    }

    /// Prepares one claim: its devices, or why not.
    pub async fn prepare(&self, c: &v1::Claim) -> Result<Vec<v1::Device>, String> {
        let _one = self.lock.lock().await;
        let claim = self.cluster.claim(&c.namespace, &c.name).await?;
        let uid = claim.metadata.uid.as_deref().unwrap_or("");
        if uid != c.uid {
            return Err(format!("ResourceClaim {}/{} has UID {uid}, not {} (deleted and created again?)", c.namespace, c.name, c.uid));
        }
        let mut client = self.egpud().await?;
        let name = slice_name(&c.uid);
        // Each GPU with the memory it has for claims (the scheduler counts
        // the claims' own).
        let (mut gpus, slices) = Self::read_node(&mut client).await?;
        let reserved = reserved_elsewhere(&slices);
        for g in &mut gpus {
            g.memory_bytes = g.memory_bytes.saturating_sub(reserved.get(&g.index).map_or(0, |r| r.memory_bytes));
        }
        let p = plan(&claim, &self.cfg.driver, &self.cfg.node, &gpus).map_err(|e| format!("ResourceClaim {}/{}: {e}", c.namespace, c.name))?;
        let where_ = p.devices.iter().map(|d| format!("{} B on GPU {}", d.memory_bytes, d.device)).collect::<Vec<_>>().join(", ");
        let req = node::CreateSliceRequest { name: name.clone(), priority: p.priority as i32, devices: p.devices.clone(), ephemeral: false, owner_pid: 0 };
        match client.create_slice(req).await {
            Ok(_) => tracing::info!(slice = %name, claim = %format!("{}/{}", c.namespace, c.name), devices = %where_, "prepared"),
            Err(e) if e.code() == tonic::Code::AlreadyExists => {
                // Prepared before (a repeated call, or a restarted plugin).
                // The guarantees must be the claim's; a cap, burst or
                // priority may have been changed since (`egpu resize`).
                let s = client.get_slice(node::GetSliceRequest { name: name.clone() }).await.map_err(|e| e.message().to_string())?.into_inner();
                let mut have: Vec<(u32, u64, u32)> = s.devices.iter().map(|d| (d.device, d.memory_limit_bytes, d.compute_share_bps)).collect();
                have.sort_unstable();
                let want: Vec<(u32, u64, u32)> = p.devices.iter().map(|d| (d.device, d.memory_bytes, d.compute_share_bps)).collect();
                if have != want {
                    return Err(format!(
                        "slice {name} exists with other GPUs or guarantees ((GPU, memory, share in basis points): {have:?}, the claim's: {want:?}); delete it (egpu rm {name}) and the kubelet will prepare the claim again"
                    ));
                }
            }
            Err(e) => return Err(format!("egpud refused slice {name} ({where_}): {}", e.message())),
        }
        if !self.cfg.cdi_dir.join(egpu_node::cdi::spec_file(&name)).exists() {
            let _ = client.delete_slice(node::DeleteSliceRequest { name: name.clone(), force: false }).await;
            return Err(format!("egpud wrote no CDI spec for {name} in {}: start egpud with --cdi-dir {}", self.cfg.cdi_dir.display(), self.cfg.cdi_dir.display()));
        }
        let owner = claim.metadata.owner_references.iter().flatten().find(|o| o.kind == "Pod" && o.api_version == "v1" && o.controller == Some(true));
        let entry = Prepared {
            namespace: c.namespace.clone(),
            claim: c.name.clone(),
            pod: owner.map(|o| o.name.clone()),
            pod_uid: owner.map(|o| o.uid.clone()),
            limit_bps: p.limit_bps,
            burst_bytes: p.burst_bytes,
        };
        let old = self.prepared.lock().expect("prepared lock").insert(c.uid.clone(), entry.clone());
        if old.as_ref() != Some(&entry) {
            self.mark_dirty();
            self.save_if_dirty();
        }
        Ok(kubelet_devices(&self.cfg, &name, &p.results))
    }

    /// Unprepares one claim: deletes its slice (gone already is fine).
    pub async fn unprepare(&self, c: &v1::Claim) -> Result<(), String> {
        let _one = self.lock.lock().await;
        let name = slice_name(&c.uid);
        let mut client = self.egpud().await?;
        match client.delete_slice(node::DeleteSliceRequest { name: name.clone(), force: false }).await {
            Ok(_) => tracing::info!(slice = %name, claim = %format!("{}/{}", c.namespace, c.name), "unprepared"),
            Err(e) if e.code() == tonic::Code::NotFound => {}
            Err(e) => return Err(format!("cannot delete slice {name}: {}", e.message())),
        }
        self.warned.lock().expect("warned lock").remove(&name);
        if self.prepared.lock().expect("prepared lock").remove(&c.uid).is_some() {
            self.mark_dirty();
            self.save_if_dirty();
        }
        Ok(())
    }
}
