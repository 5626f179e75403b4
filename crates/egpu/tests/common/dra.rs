//! The DRA rig of tests/dra.rs and benches/dra_prepare.rs: an API-server
//! stand-in (ResourceClaims, the node's ResourceSlice stored as the API
//! server stores it, the Node, the node's pods: list and watch), a real
//! egpud on two simulated 16 GiB GPUs, `egpu-dra-plugin`, and the kubelet's
//! side of registration and of the DRA calls.

use super::{Node, target_dir, wait_until};
use egpu_k8s::dra::{registration as reg, v1};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub const WAIT: Duration = Duration::from_secs(30);
pub const DRIVER: &str = "gpu.egpu.io";
pub const NODE: &str = "node-a";

/// The API server's side: ResourceClaims by (namespace, name), the
/// ResourceSlices written, and how many writes.
#[derive(Clone)]
pub struct ApiServer {
    pub claims: Arc<Mutex<HashMap<(String, String), serde_json::Value>>>,
    pub slices: Arc<Mutex<HashMap<String, serde_json::Value>>>,
    pub writes: Arc<Mutex<u32>>,
    /// The node's pods' annotations, by name (namespace `default`), and
    /// their version, which every change bumps.
    pub pods: Arc<Mutex<HashMap<String, serde_json::Value>>>,
    pub pod_version: Arc<tokio::sync::watch::Sender<u64>>,
    /// Pods deleted, by name, with the version that deleted them.
    pub deleted: Arc<Mutex<Vec<(String, u64)>>>,
}

impl Default for ApiServer {
    fn default() -> ApiServer {
        ApiServer {
            claims: Arc::default(),
            slices: Arc::default(),
            writes: Arc::default(),
            pods: Arc::default(),
            pod_version: Arc::new(tokio::sync::watch::channel(1).0),
            deleted: Arc::default(),
        }
    }
}

impl ApiServer {
    /// Sets a pod's annotations (creating the pod).
    pub fn annotate(&self, pod: &str, annotations: serde_json::Value) {
        self.pods.lock().unwrap().insert(pod.to_string(), annotations);
        self.pod_version.send_modify(|v| *v += 1);
    }

    /// Deletes a pod (a watch then sends DELETED).
    pub fn delete_pod(&self, pod: &str) {
        assert!(self.pods.lock().unwrap().remove(pod).is_some(), "no pod {pod}");
        self.pod_version.send_modify(|v| {
            *v += 1;
            self.deleted.lock().unwrap().push((pod.to_string(), *v));
        });
    }

    pub fn pod_items(&self) -> Vec<serde_json::Value> {
        let v = self.pod_version.borrow().to_string();
        self.pods
            .lock()
            .unwrap()
            .iter()
            .map(|(name, ann)| serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default", "uid": format!("{name}-uid"), "resourceVersion": v, "annotations": ann}}))
            .collect()
    }
}

/// The node's pods: a list, or a watch that sends every pod as MODIFIED
/// whenever one changes after the version it starts from, and each pod
/// deleted since as DELETED.
pub async fn pods(axum::extract::State(api): axum::extract::State<ApiServer>, axum::extract::RawQuery(q): axum::extract::RawQuery) -> axum::response::Response {
    use axum::response::IntoResponse;
    let q = q.unwrap_or_default();
    if !q.contains(&format!("fieldSelector=spec.nodeName%3D{NODE}")) {
        return (axum::http::StatusCode::BAD_REQUEST, format!("want this node's pods only, got ?{q}")).into_response();
    }
    let mut kv = q.split('&');
    let watch = kv.clone().any(|kv| kv == "watch=true" || kv == "watch=1");
    if !watch {
        let v = api.pod_version.borrow().to_string();
        return axum::Json(serde_json::json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": v}, "items": api.pod_items()})).into_response();
    }
    let from: u64 = kv.find_map(|kv| kv.strip_prefix("resourceVersion=")).and_then(|v| v.parse().ok()).unwrap_or(0);
    let (tx, body) = tokio::sync::mpsc::channel::<Result<String, std::convert::Infallible>>(16);
    let mut changes = api.pod_version.subscribe();
    tokio::spawn(async move {
        let mut seen = from;
        loop {
            let now = *changes.borrow_and_update();
            if now > seen {
                let gone: Vec<serde_json::Value> = api
                    .deleted
                    .lock()
                    .unwrap()
                    .iter()
                    .filter(|(_, v)| *v > seen)
                    .map(|(name, v)| serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default", "uid": format!("{name}-uid"), "resourceVersion": v.to_string()}}))
                    .collect();
                seen = now;
                let events = gone.into_iter().map(|pod| ("DELETED", pod)).chain(api.pod_items().into_iter().map(|pod| ("MODIFIED", pod)));
                for (kind, pod) in events {
                    if tx.send(Ok(format!("{}\n", serde_json::json!({"type": kind, "object": pod})))).await.is_err() {
                        return;
                    }
                }
            }
            if changes.changed().await.is_err() {
                return;
            }
        }
    });
    axum::body::Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(body)).into_response()
}

pub fn not_found(what: &str) -> axum::response::Response {
    use axum::response::IntoResponse;
    let status = serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": format!("{what} not found"), "reason": "NotFound", "code": 404});
    (axum::http::StatusCode::NOT_FOUND, axum::Json(status)).into_response()
}

pub async fn get_claim(axum::extract::State(api): axum::extract::State<ApiServer>, axum::extract::Path((ns, name)): axum::extract::Path<(String, String)>) -> axum::response::Response {
    use axum::response::IntoResponse;
    match api.claims.lock().unwrap().get(&(ns, name.clone())) {
        Some(c) => axum::Json(c.clone()).into_response(),
        None => not_found(&format!("resourceclaims {name}")),
    }
}

pub async fn get_slice(axum::extract::State(api): axum::extract::State<ApiServer>, axum::extract::Path(name): axum::extract::Path<String>) -> axum::response::Response {
    use axum::response::IntoResponse;
    match api.slices.lock().unwrap().get(&name) {
        Some(s) => axum::Json(s.clone()).into_response(),
        None => not_found(&format!("resourceslices {name}")),
    }
}

/// Rewrites a quantity as the API server stores it: in its canonical form
/// (a whole number of GiB as `<n>Gi`), which is not what the plugin wrote.
pub fn canonical(q: &mut serde_json::Value) {
    if let Some(n) = q.as_str().and_then(|v| v.parse::<u64>().ok()).filter(|n| *n > 0 && n % (1 << 30) == 0) {
        *q = format!("{}Gi", n >> 30).into();
    }
}

/// Stores a ResourceSlice as the API server would: quantities in canonical
/// form, a new resourceVersion; a replace must carry the stored one.
pub fn store(api: &ApiServer, mut s: serde_json::Value, replace: bool) -> axum::response::Response {
    for d in s["spec"]["devices"].as_array_mut().into_iter().flatten() {
        for c in d["capacity"].as_object_mut().into_iter().flat_map(|c| c.values_mut()) {
            canonical(&mut c["value"]);
            canonical(&mut c["requestPolicy"]["default"]);
            canonical(&mut c["requestPolicy"]["validRange"]["max"]);
        }
    }
    use axum::response::IntoResponse;
    let name = s["metadata"]["name"].as_str().unwrap_or("").to_string();
    let mut slices = api.slices.lock().unwrap();
    match (slices.get(&name), replace) {
        (Some(_), false) => return (axum::http::StatusCode::CONFLICT, "exists").into_response(),
        (None, true) => return not_found(&name),
        (Some(old), true) if old["metadata"]["resourceVersion"] != s["metadata"]["resourceVersion"] => return (axum::http::StatusCode::CONFLICT, "stale resourceVersion").into_response(),
        _ => {}
    }
    let mut writes = api.writes.lock().unwrap();
    *writes += 1;
    s["metadata"]["resourceVersion"] = writes.to_string().into();
    s["apiVersion"] = "resource.k8s.io/v1".into();
    s["kind"] = "ResourceSlice".into();
    slices.insert(name, s.clone());
    (if replace { axum::http::StatusCode::OK } else { axum::http::StatusCode::CREATED }, axum::Json(s)).into_response()
}

pub async fn get_node(axum::extract::Path(name): axum::extract::Path<String>) -> axum::response::Response {
    use axum::response::IntoResponse;
    if name != NODE {
        return not_found(&format!("nodes {name}"));
    }
    axum::Json(serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "uid": "node-uid-1"}})).into_response()
}

pub async fn create_slice(axum::extract::State(api): axum::extract::State<ApiServer>, axum::Json(s): axum::Json<serde_json::Value>) -> axum::response::Response {
    store(&api, s, false)
}

pub async fn replace_slice(axum::extract::State(api): axum::extract::State<ApiServer>, axum::Json(s): axum::Json<serde_json::Value>) -> axum::response::Response {
    store(&api, s, true)
}

/// Serves the API-server stand-in; returns a kubeconfig file naming it.
pub fn serve_api(rt: &tokio::runtime::Runtime, dir: &Path, api: ApiServer) -> PathBuf {
    let app = axum::Router::new()
        .route("/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}", axum::routing::get(get_claim))
        .route("/apis/resource.k8s.io/v1/resourceslices", axum::routing::post(create_slice))
        .route("/apis/resource.k8s.io/v1/resourceslices/{name}", axum::routing::get(get_slice).put(replace_slice))
        .route("/api/v1/nodes/{name}", axum::routing::get(get_node))
        .route("/api/v1/pods", axum::routing::get(pods))
        .with_state(api);
    super::serve_api(rt, dir, app)
}

/// One allocation result: request, device, consumed memory and compute.
pub type Allocated<'a> = (&'a str, &'a str, Option<(&'a str, &'a str)>);

/// A ResourceClaim allocated on this node, and an opaque configuration.
pub fn claim(name: &str, uid: &str, results: &[Allocated], params: Option<serde_json::Value>) -> serde_json::Value {
    let results: Vec<serde_json::Value> = results
        .iter()
        .map(|(request, device, consumed)| {
            let mut r = serde_json::json!({"request": request, "driver": DRIVER, "pool": NODE, "device": device});
            if let Some((m, c)) = consumed {
                r["consumedCapacity"] = serde_json::json!({"memory": m, "compute": c});
            }
            r
        })
        .collect();
    let config: Vec<serde_json::Value> = params.into_iter().map(|p| serde_json::json!({"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": p}})).collect();
    serde_json::json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default", "uid": uid,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": format!("pod-{name}"), "uid": format!("pod-{name}-uid"), "controller": true}]},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
        "status": {"allocation": {"devices": {"results": results, "config": config}}}
    })
}

pub fn spec_path(cdi: &Path, slice: &str) -> PathBuf {
    cdi.join(format!("egpu.io-slice_{slice}.json"))
}

pub struct Plugin(pub Child);
impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub struct Rig {
    pub tmp: tempfile::TempDir,
    pub cdi: PathBuf,
    pub kdir: PathBuf,
    pub node: Node,
    pub rt: tokio::runtime::Runtime,
    pub api: ApiServer,
    pub kubeconfig: PathBuf,
}

impl Rig {
    pub fn start() -> Rig {
        let tmp = tempfile::tempdir().unwrap();
        let cdi = tmp.path().join("cdi");
        let kdir = tmp.path().join("kubelet");
        let node = Node::start_with("2x16GiB", &["--cdi-dir", cdi.to_str().unwrap()]);
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let api = ApiServer::default();
        let kubeconfig = serve_api(&rt, tmp.path(), api.clone());
        Rig { tmp, cdi, kdir, node, rt, api, kubeconfig }
    }

    /// The plugin, reading egpud and applying pod annotations every 100 ms.
    pub fn plugin(&self) -> Plugin {
        self.plugin_polling("100ms")
    }

    /// The plugin, reading egpud every `poll`.
    pub fn plugin_polling(&self, poll: &str) -> Plugin {
        let path = target_dir().join("egpu-dra-plugin");
        assert!(path.exists(), "{} is not built: it is egpu-k8s's; run `cargo build --workspace` (scripts/test.sh does)", path.display());
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.tmp.path().join("plugin.log")).unwrap();
        Plugin(
            Command::new(path)
                .env_remove("EGPU_SOCKET")
                .env_remove("KUBERNETES_SERVICE_HOST")
                .env("KUBECONFIG", &self.kubeconfig)
                .arg("--socket")
                .arg(self.node.socket())
                .arg("--kubelet-dir")
                .arg(&self.kdir)
                .arg("--cdi-dir")
                .arg(&self.cdi)
                .args(["--node-name", NODE, "--poll", poll, "--pod-poll", "100ms", "--log", "info", "--gpu-cdi-kind", "nvidia.com/gpu", "--metrics-listen", "127.0.0.1:0"])
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap(),
        )
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.tmp.path().join("plugin.log")).unwrap_or_default()
    }

    /// A scrape of the metrics of the plugin started last.
    pub fn metrics(&self) -> String {
        super::scrape_logged(|| self.log())
    }

    pub fn add(&self, c: serde_json::Value) {
        let key = (c["metadata"]["namespace"].as_str().unwrap().to_string(), c["metadata"]["name"].as_str().unwrap().to_string());
        self.api.claims.lock().unwrap().insert(key, c);
    }

    /// The kubelet's side of registration: reads the plugin's info from the
    /// registration socket and tells it it is registered.
    pub fn register(&self) -> reg::PluginInfo {
        let sock = self.kdir.join(format!("plugins_registry/{DRIVER}-reg.sock"));
        assert!(wait_until(WAIT, || sock.exists()), "no registration socket {}; log:\n{}", sock.display(), self.log());
        // A killed plugin leaves its socket file: until the new one replaces
        // it, connecting is refused (the kubelet's watcher reacts to the
        // new file; here, try again).
        let mut info = None;
        assert!(
            wait_until(WAIT, || {
                info = self.rt.block_on(async {
                    let ch = egpu_k8s::unix_channel(&sock, WAIT).await.ok()?;
                    let mut c = reg::registration_client::RegistrationClient::new(ch);
                    let info = c.get_info(reg::InfoRequest {}).await.ok()?.into_inner();
                    c.notify_registration_status(reg::RegistrationStatus { plugin_registered: true, error: String::new() }).await.ok()?;
                    Some(info)
                });
                info.is_some()
            }),
            "the registration socket does not answer; log:\n{}",
            self.log()
        );
        info.unwrap()
    }

    pub fn prepare(&self, endpoint: &str, claims: &[(&str, &str)]) -> HashMap<String, v1::NodePrepareResourceResponse> {
        let claims = claims.iter().map(|(name, uid)| v1::Claim { namespace: "default".into(), uid: uid.to_string(), name: name.to_string() }).collect();
        self.rt.block_on(async {
            let ch = egpu_k8s::unix_channel(Path::new(endpoint), WAIT).await.unwrap();
            v1::dra_plugin_client::DraPluginClient::new(ch).node_prepare_resources(v1::NodePrepareResourcesRequest { claims }).await.unwrap().into_inner().claims
        })
    }

    pub fn unprepare(&self, endpoint: &str, name: &str, uid: &str) -> String {
        let claims = vec![v1::Claim { namespace: "default".into(), uid: uid.into(), name: name.into() }];
        self.rt.block_on(async {
            let ch = egpu_k8s::unix_channel(Path::new(endpoint), WAIT).await.unwrap();
            let mut r = v1::dra_plugin_client::DraPluginClient::new(ch).node_unprepare_resources(v1::NodeUnprepareResourcesRequest { claims }).await.unwrap().into_inner().claims;
            r.remove(uid).expect("an entry for every claim").error
        })
    }

    pub fn slice_names(&self) -> Vec<String> {
        let mut n: Vec<String> = self.node.slices().iter().map(|s| s["name"].as_str().unwrap().to_string()).collect();
        n.sort();
        n
    }

    pub fn published(&self) -> Option<serde_json::Value> {
        self.api.slices.lock().unwrap().get(&format!("{NODE}-{DRIVER}")).cloned()
    }
}

