//! Kubernetes with Dynamic Resource Allocation: `egpu-dra-plugin` against a
//! kubelet stand-in (real gRPC over unix sockets: the plugin watcher's
//! `GetInfo` / `NotifyRegistrationStatus`, then `NodePrepareResources` and
//! `NodeUnprepareResources` in both versions, written here from the
//! published API), an API-server stand-in (real HTTP: the kube client's GET
//! of ResourceClaims and its create / replace of the node's ResourceSlice),
//! and a real egpud on simulated GPUs publishing CDI specs.

mod common;

use common::{Node, target_dir, wait_until};
use egpu_k8s::dra::{registration as reg, v1, v1beta1};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);
const DRIVER: &str = "gpu.egpu.io";
const NODE: &str = "node-a";

/// The API server's side: ResourceClaims by (namespace, name), the
/// ResourceSlices written, and how many writes.
#[derive(Clone)]
struct ApiServer {
    claims: Arc<Mutex<HashMap<(String, String), serde_json::Value>>>,
    slices: Arc<Mutex<HashMap<String, serde_json::Value>>>,
    writes: Arc<Mutex<u32>>,
    /// The node's pods' annotations, by name (namespace `default`), and
    /// their version, which every change bumps.
    pods: Arc<Mutex<HashMap<String, serde_json::Value>>>,
    pod_version: Arc<tokio::sync::watch::Sender<u64>>,
}

impl Default for ApiServer {
    fn default() -> ApiServer {
        ApiServer {
            claims: Arc::default(),
            slices: Arc::default(),
            writes: Arc::default(),
            pods: Arc::default(),
            pod_version: Arc::new(tokio::sync::watch::channel(1).0),
        }
    }
}

impl ApiServer {
    /// Sets a pod's annotations (creating the pod).
    fn annotate(&self, pod: &str, annotations: serde_json::Value) {
        self.pods.lock().unwrap().insert(pod.to_string(), annotations);
        self.pod_version.send_modify(|v| *v += 1);
    }

    fn pod_items(&self) -> Vec<serde_json::Value> {
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
/// whenever one changes after the version it starts from.
async fn pods(axum::extract::State(api): axum::extract::State<ApiServer>, axum::extract::RawQuery(q): axum::extract::RawQuery) -> axum::response::Response {
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
                seen = now;
                for pod in api.pod_items() {
                    if tx.send(Ok(format!("{}\n", serde_json::json!({"type": "MODIFIED", "object": pod})))).await.is_err() {
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

fn not_found(what: &str) -> axum::response::Response {
    use axum::response::IntoResponse;
    let status = serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": format!("{what} not found"), "reason": "NotFound", "code": 404});
    (axum::http::StatusCode::NOT_FOUND, axum::Json(status)).into_response()
}

async fn get_claim(axum::extract::State(api): axum::extract::State<ApiServer>, axum::extract::Path((ns, name)): axum::extract::Path<(String, String)>) -> axum::response::Response {
    use axum::response::IntoResponse;
    match api.claims.lock().unwrap().get(&(ns, name.clone())) {
        Some(c) => axum::Json(c.clone()).into_response(),
        None => not_found(&format!("resourceclaims {name}")),
    }
}

async fn get_slice(axum::extract::State(api): axum::extract::State<ApiServer>, axum::extract::Path(name): axum::extract::Path<String>) -> axum::response::Response {
    use axum::response::IntoResponse;
    match api.slices.lock().unwrap().get(&name) {
        Some(s) => axum::Json(s.clone()).into_response(),
        None => not_found(&format!("resourceslices {name}")),
    }
}

/// Rewrites a quantity as the API server stores it: in its canonical form
/// (a whole number of GiB as `<n>Gi`), which is not what the plugin wrote.
fn canonical(q: &mut serde_json::Value) {
    if let Some(n) = q.as_str().and_then(|v| v.parse::<u64>().ok()).filter(|n| *n > 0 && n % (1 << 30) == 0) {
        *q = format!("{}Gi", n >> 30).into();
    }
}

/// Stores a ResourceSlice as the API server would: quantities in canonical
/// form, a new resourceVersion; a replace must carry the stored one.
fn store(api: &ApiServer, mut s: serde_json::Value, replace: bool) -> axum::response::Response {
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

async fn get_node(axum::extract::Path(name): axum::extract::Path<String>) -> axum::response::Response {
    use axum::response::IntoResponse;
    if name != NODE {
        return not_found(&format!("nodes {name}"));
    }
    axum::Json(serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "uid": "node-uid-1"}})).into_response()
}

async fn create_slice(axum::extract::State(api): axum::extract::State<ApiServer>, axum::Json(s): axum::Json<serde_json::Value>) -> axum::response::Response {
    store(&api, s, false)
}

async fn replace_slice(axum::extract::State(api): axum::extract::State<ApiServer>, axum::Json(s): axum::Json<serde_json::Value>) -> axum::response::Response {
    store(&api, s, true)
}

/// Serves the API-server stand-in; returns a kubeconfig file naming it.
fn serve_api(rt: &tokio::runtime::Runtime, dir: &Path, api: ApiServer) -> PathBuf {
    let app = axum::Router::new()
        .route("/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}", axum::routing::get(get_claim))
        .route("/apis/resource.k8s.io/v1/resourceslices", axum::routing::post(create_slice))
        .route("/apis/resource.k8s.io/v1/resourceslices/{name}", axum::routing::get(get_slice).put(replace_slice))
        .route("/api/v1/nodes/{name}", axum::routing::get(get_node))
        .route("/api/v1/pods", axum::routing::get(pods))
        .with_state(api);
    common::serve_api(rt, dir, app)
}

/// One allocation result: request, device, consumed memory and compute.
type Allocated<'a> = (&'a str, &'a str, Option<(&'a str, &'a str)>);

/// A ResourceClaim allocated on this node, and an opaque configuration.
fn claim(name: &str, uid: &str, results: &[Allocated], params: Option<serde_json::Value>) -> serde_json::Value {
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

fn spec_path(cdi: &Path, slice: &str) -> PathBuf {
    cdi.join(format!("egpu.io-slice_{slice}.json"))
}

struct Plugin(Child);
impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Rig {
    tmp: tempfile::TempDir,
    cdi: PathBuf,
    kdir: PathBuf,
    node: Node,
    rt: tokio::runtime::Runtime,
    api: ApiServer,
    kubeconfig: PathBuf,
}

impl Rig {
    fn start() -> Rig {
        let tmp = tempfile::tempdir().unwrap();
        let cdi = tmp.path().join("cdi");
        let kdir = tmp.path().join("kubelet");
        let node = Node::start_with("2x16GiB", &["--cdi-dir", cdi.to_str().unwrap()]);
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let api = ApiServer::default();
        let kubeconfig = serve_api(&rt, tmp.path(), api.clone());
        Rig { tmp, cdi, kdir, node, rt, api, kubeconfig }
    }

    fn plugin(&self) -> Plugin {
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
                .args(["--node-name", NODE, "--poll", "100ms", "--pod-poll", "100ms", "--log", "info", "--gpu-cdi-kind", "nvidia.com/gpu"])
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap(),
        )
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.tmp.path().join("plugin.log")).unwrap_or_default()
    }

    fn add(&self, c: serde_json::Value) {
        let key = (c["metadata"]["namespace"].as_str().unwrap().to_string(), c["metadata"]["name"].as_str().unwrap().to_string());
        self.api.claims.lock().unwrap().insert(key, c);
    }

    /// The kubelet's side of registration: reads the plugin's info from the
    /// registration socket and tells it it is registered.
    fn register(&self) -> reg::PluginInfo {
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

    fn prepare(&self, endpoint: &str, claims: &[(&str, &str)]) -> HashMap<String, v1::NodePrepareResourceResponse> {
        let claims = claims.iter().map(|(name, uid)| v1::Claim { namespace: "default".into(), uid: uid.to_string(), name: name.to_string() }).collect();
        self.rt.block_on(async {
            let ch = egpu_k8s::unix_channel(Path::new(endpoint), WAIT).await.unwrap();
            v1::dra_plugin_client::DraPluginClient::new(ch).node_prepare_resources(v1::NodePrepareResourcesRequest { claims }).await.unwrap().into_inner().claims
        })
    }

    fn unprepare(&self, endpoint: &str, name: &str, uid: &str) -> String {
        let claims = vec![v1::Claim { namespace: "default".into(), uid: uid.into(), name: name.into() }];
        self.rt.block_on(async {
            let ch = egpu_k8s::unix_channel(Path::new(endpoint), WAIT).await.unwrap();
            let mut r = v1::dra_plugin_client::DraPluginClient::new(ch).node_unprepare_resources(v1::NodeUnprepareResourcesRequest { claims }).await.unwrap().into_inner().claims;
            r.remove(uid).expect("an entry for every claim").error
        })
    }

    fn slice_names(&self) -> Vec<String> {
        let mut n: Vec<String> = self.node.slices().iter().map(|s| s["name"].as_str().unwrap().to_string()).collect();
        n.sort();
        n
    }

    fn published(&self) -> Option<serde_json::Value> {
        self.api.slices.lock().unwrap().get(&format!("{NODE}-{DRIVER}")).cloned()
    }
}

/// (device, memory, share %, cap %, burst) of each device of a slice.
fn limits(s: &serde_json::Value) -> Vec<(u64, u64, f64, f64, u64)> {
    s["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (d["device"].as_u64().unwrap(), d["memory_limit_bytes"].as_u64().unwrap(), d["compute_share_percent"].as_f64().unwrap(), d["compute_limit_percent"].as_f64().unwrap(), d["memory_burst_bytes"].as_u64().unwrap())
        })
        .collect()
}

#[test]
fn claims_become_slices_through_the_kubelets_dra_calls() {
    let mut rig = Rig::start();
    let mut plugin = rig.plugin();
    let info = rig.register();
    assert_eq!((info.r#type.as_str(), info.name.as_str()), ("DRAPlugin", DRIVER));
    assert_eq!(info.supported_versions, ["v1.DRAPlugin", "v1beta1.DRAPlugin"]);
    assert_eq!(Path::new(&info.endpoint), rig.kdir.join(format!("plugins/{DRIVER}/dra.sock")));
    let ep = info.endpoint.clone();

    // The node's GPUs, published.
    assert!(wait_until(WAIT, || rig.published().is_some()), "no ResourceSlice; log:\n{}", rig.log());
    let s = rig.published().unwrap();
    assert_eq!(s["spec"]["driver"], DRIVER);
    assert_eq!(s["spec"]["nodeName"], NODE);
    assert_eq!(s["spec"]["pool"]["name"], NODE);
    let devices = s["spec"]["devices"].as_array().unwrap();
    assert_eq!(devices.iter().map(|d| d["name"].as_str().unwrap()).collect::<Vec<_>>(), ["gpu-0", "gpu-1"]);
    assert_eq!(devices[0]["capacity"]["memory"]["value"], "16Gi");
    assert_eq!(s["metadata"]["ownerReferences"][0]["uid"], "node-uid-1", "owned by its Node");
    assert_eq!(devices[0]["capacity"]["compute"]["value"], "100");
    assert_eq!(devices[0]["allowMultipleAllocations"], true);
    // A slice made on the node outside Kubernetes: its memory and guarantee
    // are not published for claims, and come back when it goes.
    rig.node.ok(&["create", "--name", "train", "--gpu-memory", "6GiB", "--gpu-compute", "25%", "--device", "1"]);
    let gpu1 = |field: &str| rig.published().and_then(|s| s["spec"]["devices"].as_array().and_then(|d| d.iter().find(|d| d["name"] == "gpu-1").map(|d| d["capacity"][field]["value"].clone())));
    assert!(wait_until(WAIT, || gpu1("memory") == Some("10Gi".into())), "{:?}", rig.published());
    assert_eq!(gpu1("compute"), Some("75".into()));
    assert_eq!(rig.published().unwrap()["spec"]["pool"]["generation"], 1, "a changed ResourceSlice is a new generation of the pool");
    rig.node.ok(&["rm", "train"]);
    assert!(wait_until(WAIT, || gpu1("memory") == Some("16Gi".into())));
    assert_eq!(*rig.api.writes.lock().unwrap(), 3, "created, then replaced twice");
    // A starting kubelet deletes its node's ResourceSlices, then registers the plugin again: it is written again.
    rig.api.slices.lock().unwrap().clear();
    rig.register();
    assert!(wait_until(WAIT, || rig.published().is_some()), "not published again; log:\n{}", rig.log());
    let writes = *rig.api.writes.lock().unwrap();
    assert_eq!(writes, 4);

    // A part of GPU 0: 10 GiB, 30% guaranteed, capped at 50%, bursting to 12 GiB, high priority.
    let params = serde_json::json!({"apiVersion": "gpu.egpu.io/v1", "kind": "SliceConfig", "computeLimit": "50%", "memoryBurst": "12GiB", "priority": "high"});
    rig.add(claim("a", "uid-a", &[("gpu", "gpu-0", Some(("10Gi", "30")))], Some(params)));
    let r = rig.prepare(&ep, &[("a", "uid-a")]);
    let a = &r["uid-a"];
    assert_eq!(a.error, "", "log:\n{}", rig.log());
    assert_eq!(a.devices.len(), 1);
    assert_eq!((a.devices[0].pool_name.as_str(), a.devices[0].device_name.as_str()), (NODE, "gpu-0"));
    assert_eq!(a.devices[0].request_names, ["gpu"]);
    assert_eq!(a.devices[0].cdi_device_ids, ["egpu.io/slice=dra-uid-a", "nvidia.com/gpu=0"]);
    let sa = rig.node.slice("dra-uid-a");
    assert_eq!(limits(&sa), [(0, 10 << 30, 30.0, 50.0, 12 << 30)], "{sa}");
    assert_eq!(sa["priority"], "high");
    assert!(spec_path(&rig.cdi, "dra-uid-a").exists());

    // The same claim again, through v1beta1 (an older kubelet): the same answer, no second slice.
    let again = rig.rt.block_on(async {
        let ch = egpu_k8s::unix_channel(Path::new(&ep), WAIT).await.unwrap();
        let claims = vec![v1beta1::Claim { namespace: "default".into(), uid: "uid-a".into(), name: "a".into() }];
        v1beta1::dra_plugin_client::DraPluginClient::new(ch).node_prepare_resources(v1beta1::NodePrepareResourcesRequest { claims }).await.unwrap().into_inner().claims
    });
    assert_eq!(again["uid-a"].error, "");
    assert_eq!(again["uid-a"].devices[0].cdi_device_ids, ["egpu.io/slice=dra-uid-a", "nvidia.com/gpu=0"]);
    assert_eq!(rig.slice_names(), ["dra-uid-a"]);

    // A whole GPU (no consumable capacity: the feature off), and in the same call
    // claims that cannot be prepared, each with its reason.
    rig.add(claim("b", "uid-b", &[("gpu", "gpu-1", None)], None));
    rig.add(claim("c", "uid-c", &[("gpu", "gpu-0", Some(("8Gi", "0")))], None));
    rig.add(claim("d", "uid-other", &[("gpu", "gpu-0", Some(("1Gi", "0")))], None));
    let mut unallocated = claim("e", "uid-e", &[], None);
    unallocated["status"] = serde_json::json!({});
    rig.add(unallocated);
    rig.add(claim("f", "uid-f", &[("gpu", "gpu-0", Some(("1Gi", "0")))], Some(serde_json::json!({"computeLimt": "50%"}))));
    let r = rig.prepare(&ep, &[("b", "uid-b"), ("c", "uid-c"), ("d", "uid-d"), ("e", "uid-e"), ("f", "uid-f"), ("missing", "uid-m")]);
    assert_eq!(r.len(), 6, "an entry for every claim");
    assert_eq!(r["uid-b"].error, "");
    assert_eq!(limits(&rig.node.slice("dra-uid-b")), [(1, 16 << 30, 0.0, 100.0, 0)]);
    let e = |uid: &str| r[uid].error.clone();
    assert!(e("uid-c").contains("egpud refused slice dra-uid-c"), "10 + 8 GiB on a 16 GiB GPU: {}", e("uid-c"));
    assert!(e("uid-d").contains("has UID uid-other, not uid-d"), "{}", e("uid-d"));
    assert!(e("uid-e").contains("not allocated"), "{}", e("uid-e"));
    assert!(e("uid-f").contains("unknown field `computeLimt`"), "{}", e("uid-f"));
    assert!(e("uid-m").contains("default/missing does not exist"), "{}", e("uid-m"));
    assert!(r["uid-c"].devices.is_empty());
    assert_eq!(rig.slice_names(), ["dra-uid-a", "dra-uid-b"], "nothing made for the refused claims");

    // Unprepare: the slice and its CDI spec go; again is fine.
    assert_eq!(rig.unprepare(&ep, "a", "uid-a"), "");
    assert_eq!(rig.slice_names(), ["dra-uid-b"]);
    assert!(wait_until(WAIT, || !spec_path(&rig.cdi, "dra-uid-a").exists()));
    assert_eq!(rig.unprepare(&ep, "a", "uid-a"), "", "already gone");
    // Through v1beta1 too.
    let gone = rig.rt.block_on(async {
        let ch = egpu_k8s::unix_channel(Path::new(&ep), WAIT).await.unwrap();
        let claims = vec![v1beta1::Claim { namespace: "default".into(), uid: "uid-b".into(), name: "b".into() }];
        v1beta1::dra_plugin_client::DraPluginClient::new(ch).node_unprepare_resources(v1beta1::NodeUnprepareResourcesRequest { claims }).await.unwrap().into_inner().claims
    });
    assert_eq!(gone["uid-b"].error, "");
    assert!(rig.slice_names().is_empty());

    // Two whole GPUs for one claim: one slice over both (NCCL, IPC and peer access within it).
    rig.add(claim("g", "uid-g", &[("gpus", "gpu-0", None), ("gpus", "gpu-1", None)], None));
    let r = rig.prepare(&ep, &[("g", "uid-g")]);
    assert_eq!(r["uid-g"].error, "");
    assert_eq!(r["uid-g"].devices.iter().map(|d| d.device_name.as_str()).collect::<Vec<_>>(), ["gpu-0", "gpu-1"]);
    let ids: Vec<Vec<String>> = r["uid-g"].devices.iter().map(|d| d.cdi_device_ids.clone()).collect();
    assert_eq!(ids, [vec!["egpu.io/slice=dra-uid-g", "nvidia.com/gpu=0"], vec!["nvidia.com/gpu=1"]], "the slice's CDI device once, each GPU's with it");
    assert_eq!(limits(&rig.node.slice("dra-uid-g")), [(0, 16 << 30, 0.0, 100.0, 0), (1, 16 << 30, 0.0, 100.0, 0)]);

    // The plugin's socket removed under it: served again.
    std::fs::remove_file(&ep).unwrap();
    assert!(wait_until(WAIT, || Path::new(&ep).exists()), "not served again; log:\n{}", rig.log());
    assert_eq!(rig.prepare(&ep, &[("g", "uid-g")])["uid-g"].error, "");

    // kill -9 and restart. The claim was made for pod-g (its owner): the
    // pod's annotations resize its slice live, also after the restart, with
    // no new prepare (a kubelet does not prepare a running pod's claim
    // again): the plugin kept the claim in claims.json.
    drop(plugin);
    assert!(rig.kdir.join(format!("plugins/{DRIVER}/claims.json")).exists());
    plugin = rig.plugin();
    let info = rig.register();
    rig.api.annotate("pod-g", serde_json::json!({"egpu.io/gpu-compute-limit": "60%", "egpu.io/gpu-memory-burst": "16Gi"}));
    let devices = || limits(&rig.node.slice("dra-uid-g"));
    assert!(wait_until(WAIT, || devices() == [(0, 16 << 30, 0.0, 60.0, 16 << 30), (1, 16 << 30, 0.0, 60.0, 16 << 30)]), "{:?}; log:\n{}", devices(), rig.log());
    // The guarantee is the claim's: asking for it on the pod changes nothing (the
    // pod's other annotations neither), with the reason logged.
    rig.api.annotate("pod-g", serde_json::json!({"egpu.io/gpu-compute": "40%", "egpu.io/gpu-compute-limit": "30%"}));
    assert!(wait_until(WAIT, || rig.log().contains("a DRA claim's guarantee is what the scheduler counted")));
    assert_eq!(devices()[0].3, 60.0);
    // The annotations removed: the claim's own values (cap 100%, no burst) again.
    rig.api.annotate("pod-g", serde_json::json!({}));
    assert!(wait_until(WAIT, || devices() == [(0, 16 << 30, 0.0, 100.0, 0), (1, 16 << 30, 0.0, 100.0, 0)]), "{:?}", devices());
    // A repeated prepare after the restart answers the same; the ResourceSlice
    // (stored by the API server in its own form) was not rewritten.
    let r = rig.prepare(&info.endpoint, &[("g", "uid-g")]);
    assert_eq!(r["uid-g"].error, "", "log:\n{}", rig.log());
    assert_eq!(rig.slice_names(), ["dra-uid-g"]);
    assert_eq!(*rig.api.writes.lock().unwrap(), writes, "the same GPUs: no new write of the ResourceSlice");

    // egpud down: a clear error, and the kubelet will call again.
    rig.add(claim("h", "uid-h", &[("gpu", "gpu-0", None)], None));
    rig.node.kill9();
    let r = rig.prepare(&info.endpoint, &[("h", "uid-h")]);
    assert!(r["uid-h"].error.contains("egpud is not reachable"), "{}", r["uid-h"].error);

    // SIGTERM: a clean exit that removes both sockets.
    common::signal(plugin.0.id(), libc::SIGTERM);
    let mut status = None;
    assert!(wait_until(WAIT, || {
        status = plugin.0.try_wait().unwrap();
        status.is_some()
    }));
    assert!(status.unwrap().success(), "log:\n{}", rig.log());
    assert!(!Path::new(&info.endpoint).exists() && !rig.kdir.join(format!("plugins_registry/{DRIVER}-reg.sock")).exists());
}

#[test]
fn bad_flags_are_refused_before_anything_starts() {
    let path = target_dir().join("egpu-dra-plugin");
    let run = |args: &[&str]| Command::new(&path).env_remove("NODE_NAME").env("KUBECONFIG", "/nonexistent/egpu-test-kubeconfig").args(args).output().unwrap();
    let o = run(&["--node-name", "node-a", "--driver", "egpu"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--driver 'egpu' must be a DNS subdomain"), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run(&["--node-name", "node-a", "--poll", "0s"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("--poll and --pod-poll must be greater than 0"));
    let o = run(&["--node-name", "node-a"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("needs the Kubernetes API"), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run(&[]);
    assert_eq!(o.status.code(), Some(2), "--node-name is required");
}
