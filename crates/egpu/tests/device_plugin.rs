//! Kubernetes, node and scheduler: the kubelet device plugin against a
//! kubelet stand-in (real gRPC over unix sockets; the kubelet's side —
//! Registration, PodResourcesLister, and the calls a kubelet makes on the
//! plugin — written here from the published API) and an API-server stand-in
//! (real HTTP, the kube client's PATCH of the Node), a real egpud on simulated
//! GPUs publishing CDI specs, and the scheduler extender over real HTTP fed
//! the Node the plugin annotated.

mod common;

use common::{Node, http_get, sample, scrape_logged, target_dir, wait_until};
use egpu_k8s::deviceplugin as dp;
use egpu_k8s::podresources as pr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tonic::{Request, Response, Status};

const RESOURCE: &str = "egpu.io/gpu-memory";
const WAIT: Duration = Duration::from_secs(30);

/// The kubelet's side: registrations received, and the pod-resources list.
#[derive(Clone)]
struct Kubelet {
    registered: mpsc::UnboundedSender<dp::RegisterRequest>,
    pods: Arc<Mutex<Vec<pr::PodResources>>>,
}

#[tonic::async_trait]
impl dp::registration_server::Registration for Kubelet {
    async fn register(&self, req: Request<dp::RegisterRequest>) -> Result<Response<dp::Empty>, Status> {
        let r = req.into_inner();
        if r.version != "v1beta1" {
            return Err(Status::invalid_argument(format!("unsupported version {}", r.version)));
        }
        self.registered.send(r).unwrap();
        Ok(Response::new(dp::Empty {}))
    }
}

#[tonic::async_trait]
impl pr::pod_resources_lister_server::PodResourcesLister for Kubelet {
    async fn list(&self, _: Request<pr::ListPodResourcesRequest>) -> Result<Response<pr::ListPodResourcesResponse>, Status> {
        Ok(Response::new(pr::ListPodResourcesResponse { pod_resources: self.pods.lock().unwrap().clone() }))
    }
    async fn get_allocatable_resources(&self, _: Request<pr::AllocatableResourcesRequest>) -> Result<Response<pr::AllocatableResourcesResponse>, Status> {
        Err(Status::unimplemented("not used"))
    }
}

fn serve_kubelet(rt: &tokio::runtime::Runtime, dir: &Path, k: Kubelet) {
    std::fs::create_dir_all(dir.join("device-plugins")).unwrap();
    std::fs::create_dir_all(dir.join("pod-resources")).unwrap();
    let _guard = rt.enter();
    let reg = tokio::net::UnixListener::bind(dir.join("device-plugins/kubelet.sock")).unwrap();
    let res = tokio::net::UnixListener::bind(dir.join("pod-resources/kubelet.sock")).unwrap();
    let k2 = k.clone();
    rt.spawn(
        tonic::transport::Server::builder()
            .add_service(dp::registration_server::RegistrationServer::new(k))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(reg)),
    );
    rt.spawn(
        tonic::transport::Server::builder()
            .add_service(pr::pod_resources_lister_server::PodResourcesListerServer::new(k2))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(res)),
    );
}

fn holder(pod: &str, ids: &[String]) -> pr::PodResources {
    pr::PodResources {
        name: pod.into(),
        namespace: "default".into(),
        containers: vec![pr::ContainerResources {
            name: "main".into(),
            devices: vec![pr::ContainerDevices { resource_name: RESOURCE.into(), device_ids: ids.to_vec(), topology: None }],
            ..Default::default()
        }],
    }
}

/// The API server's side: the Node's annotations, as the plugin patched
/// them, and the annotations of the pod `default/a` on node `n1`, as a test
/// sets them.
#[derive(Clone, Default)]
struct ApiServer {
    annotations: Arc<Mutex<serde_json::Map<String, serde_json::Value>>>,
    patches: Arc<Mutex<u32>>,
    pod_annotations: Arc<Mutex<serde_json::Map<String, serde_json::Value>>>,
    /// Pods of namespace `default` by name, for GET and binding.
    pods: Arc<Mutex<serde_json::Map<String, serde_json::Value>>>,
    /// Bindings created, as posted.
    bindings: Arc<Mutex<Vec<serde_json::Value>>>,
    /// Lists of the node's pods served (watches not counted), and those
    /// with a `limit` (the plugin's look for GPU hints at admission).
    pod_lists: Arc<Mutex<u32>>,
    hint_lists: Arc<Mutex<u32>>,
    /// Patches of `default/a` that watches do not hear of (a watch that
    /// lags): only a list sees them.
    silent_patches: Arc<std::sync::atomic::AtomicBool>,
    /// The version of the pod `default/a`, bumped by each change of its
    /// annotations; watches of the node's pods send each change. With
    /// `true`, open watches get a BOOKMARK at that version and end, as the
    /// server ends a watch at its timeout.
    pod_version: Arc<tokio::sync::watch::Sender<(u64, bool)>>,
    /// The version each watch of the node's pods started from.
    watches_from: Arc<Mutex<Vec<u64>>>,
    /// Watches from a version below this get `410 Gone` (history compacted).
    gone_below: Arc<std::sync::atomic::AtomicU64>,
    /// Nodes by name, for the extender's node cache (list and watch).
    nodes: Arc<Mutex<serde_json::Map<String, serde_json::Value>>>,
    /// The nodes' version and the node last changed; watches send it.
    node_version: Arc<tokio::sync::watch::Sender<(u64, String)>>,
}

impl ApiServer {
    /// Sets the annotations of `default/a` (a new version, sent to watches).
    fn set_pod_annotations(&self, kv: &[(&str, &str)]) {
        let mut a = self.pod_annotations.lock().unwrap();
        a.clear();
        for (k, v) in kv {
            a.insert(k.to_string(), serde_json::Value::from(*v));
        }
        drop(a);
        self.pod_version.send_modify(|(v, end)| (*v, *end) = (*v + 1, false));
    }

    /// Ends the open watches (a BOOKMARK at a new version, then the end of
    /// the stream); returns that version.
    fn end_watches(&self) -> u64 {
        self.pod_version.send_modify(|(v, end)| (*v, *end) = (*v + 1, true));
        self.pod_version.borrow().0
    }

    /// Compacts the history: open watches and watches from an older
    /// version get `410 Gone`, as the API server answers them.
    fn expire_watches(&self) {
        self.gone_below.store(self.pod_version.borrow().0 + 1, std::sync::atomic::Ordering::SeqCst);
        self.pod_version.send_modify(|(v, end)| (*v, *end) = (*v + 1, false));
    }

    /// Adds or changes a node (a new version, sent to watches).
    fn set_node(&self, name: &str, labelled: bool, annotation: Option<String>) {
        let labels = if labelled { serde_json::json!({"egpu.io/enabled": "true"}) } else { serde_json::json!({}) };
        let annotations = annotation.map_or(serde_json::json!({}), |a| serde_json::json!({egpu_k8s::annotation::ANNOTATION: a}));
        let node = serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels, "annotations": annotations}});
        self.nodes.lock().unwrap().insert(name.into(), node);
        self.node_version.send_modify(|(v, n)| {
            *v += 1;
            *n = name.into();
        });
    }

    /// `default/a` as it is now.
    fn pod_a(&self) -> serde_json::Value {
        serde_json::json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "a", "namespace": "default", "uid": "uid-a", "resourceVersion": self.pod_version.borrow().0.to_string(), "annotations": *self.pod_annotations.lock().unwrap()},
            "spec": {"nodeName": "n1", "containers": []}})
    }
}

/// A `Status` failure as the API server writes it.
fn api_error(code: axum::http::StatusCode, reason: &str, message: String) -> axum::response::Response {
    use axum::response::IntoResponse;
    let status = serde_json::json!({"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code.as_u16()});
    (code, axum::Json(status)).into_response()
}

async fn get_pod(axum::extract::State(api): axum::extract::State<ApiServer>, axum::extract::Path((ns, name)): axum::extract::Path<(String, String)>) -> axum::response::Response {
    use axum::response::IntoResponse;
    match api.pods.lock().unwrap().get(&name) {
        Some(p) if ns == "default" => axum::Json(p.clone()).into_response(),
        _ => api_error(axum::http::StatusCode::NOT_FOUND, "NotFound", format!("pods \"{name}\" not found")),
    }
}

/// A PATCH request's body as a JSON merge patch, or why it is not one (the
/// server answers 415).
fn merge_patch(headers: &axum::http::HeaderMap, body: &str) -> Result<serde_json::Value, String> {
    let ct = headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("");
    match serde_json::from_str(body) {
        Ok(v) if ct == "application/merge-patch+json" => Ok(v),
        _ => Err(format!("want a JSON merge patch, got {ct}")),
    }
}

/// `PATCH …/pods/{name}`: a JSON merge patch of the pod's annotations,
/// with the UID in the patch as a precondition, as the API server checks
/// it (the kubelet's status patches rely on the same answer). `default/a`
/// is the pod the node's watch sends: its annotations change there too.
async fn patch_pod(
    axum::extract::State(api): axum::extract::State<ApiServer>,
    axum::extract::Path((ns, name)): axum::extract::Path<(String, String)>,
    headers: axum::http::HeaderMap,
    body: String,
) -> axum::response::Response {
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    let patch = match merge_patch(&headers, &body) {
        Ok(p) => p,
        Err(why) => return (axum::http::StatusCode::UNSUPPORTED_MEDIA_TYPE, why).into_response(),
    };
    let mut pods = api.pods.lock().unwrap();
    let Some(pod) = pods.get_mut(&name).filter(|_| ns == "default") else {
        return api_error(StatusCode::NOT_FOUND, "NotFound", format!("pods \"{name}\" not found"));
    };
    if !patch["metadata"]["uid"].is_null() && patch["metadata"]["uid"] != pod["metadata"]["uid"] {
        return api_error(StatusCode::CONFLICT, "Conflict", format!("Precondition failed: UID in precondition: {}, UID in object meta: {}", patch["metadata"]["uid"], pod["metadata"]["uid"]));
    }
    let mut ann = pod["metadata"]["annotations"].as_object().cloned().unwrap_or_default();
    for (k, v) in patch["metadata"]["annotations"].as_object().cloned().unwrap_or_default() {
        if v.is_null() {
            ann.remove(&k);
        } else {
            ann.insert(k, v);
        }
    }
    pod["metadata"]["annotations"] = ann.clone().into();
    let out = pod.clone();
    drop(pods);
    if name == "a" {
        *api.pod_annotations.lock().unwrap() = ann;
        if !api.silent_patches.load(std::sync::atomic::Ordering::SeqCst) {
            api.pod_version.send_modify(|(v, end)| (*v, *end) = (*v + 1, false));
        }
    }
    axum::Json(out).into_response()
}

/// `POST …/pods/{name}/binding`, with the checks the API server makes: a
/// Binding to a Node, the pod's UID if given, and a pod not yet assigned.
async fn bind_pod(
    axum::extract::State(api): axum::extract::State<ApiServer>,
    axum::extract::Path((ns, name)): axum::extract::Path<(String, String)>,
    body: String,
) -> axum::response::Response {
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    let b: serde_json::Value = match serde_json::from_str(&body) {
        Ok(v) => v,
        Err(e) => return api_error(StatusCode::BAD_REQUEST, "BadRequest", e.to_string()),
    };
    if b["kind"] != "Binding" || b["target"]["kind"] != "Node" || b["metadata"]["name"] != name.as_str() || b["metadata"]["namespace"] != ns.as_str() {
        return api_error(StatusCode::BAD_REQUEST, "BadRequest", format!("not a Binding of this pod to a Node: {b}"));
    }
    let mut pods = api.pods.lock().unwrap();
    let Some(pod) = pods.get_mut(&name).filter(|_| ns == "default") else {
        return api_error(StatusCode::NOT_FOUND, "NotFound", format!("pods \"{name}\" not found"));
    };
    if !b["metadata"]["uid"].is_null() && b["metadata"]["uid"] != pod["metadata"]["uid"] {
        return api_error(StatusCode::CONFLICT, "Conflict", format!("Precondition failed: UID in precondition: {}, UID in object meta: {}", b["metadata"]["uid"], pod["metadata"]["uid"]));
    }
    if let Some(n) = pod["spec"]["nodeName"].as_str() {
        return api_error(StatusCode::CONFLICT, "Conflict", format!("Operation cannot be fulfilled on pods/binding \"{name}\": pod {name} is already assigned to node \"{n}\""));
    }
    pod["spec"]["nodeName"] = b["target"]["name"].clone();
    api.bindings.lock().unwrap().push(b);
    (StatusCode::CREATED, axum::Json(serde_json::json!({"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Success", "code": 201}))).into_response()
}

/// For a watch request (`watch=true`), the version it starts from (0
/// when it names none); `None` for a list.
fn watch_from(query: &str) -> Option<u64> {
    let mut kv = query.split('&');
    kv.clone().any(|kv| kv == "watch=true" || kv == "watch=1").then(|| kv.find_map(|kv| kv.strip_prefix("resourceVersion=")).and_then(|v| v.parse().ok()).unwrap_or(0))
}

async fn list_pods(axum::extract::State(api): axum::extract::State<ApiServer>, axum::extract::RawQuery(q): axum::extract::RawQuery) -> axum::response::Response {
    use axum::response::IntoResponse;
    let q = q.unwrap_or_default();
    // The extender's resync: every bound pod still pending, cluster-wide.
    if q.contains("fieldSelector=status.phase%3DPending%2Cspec.nodeName%21%3D") {
        let items: Vec<serde_json::Value> = api.pods.lock().unwrap().values().filter(|p| p["spec"]["nodeName"].is_string()).cloned().collect();
        return axum::Json(serde_json::json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"}, "items": items})).into_response();
    }
    if !q.contains("fieldSelector=spec.nodeName%3Dn1") {
        return (axum::http::StatusCode::BAD_REQUEST, format!("want this node's pods only, got ?{q}")).into_response();
    }
    if let Some(from) = watch_from(&q) {
        // A watch: one MODIFIED event (a line of JSON) per change after the
        // version it starts from, as the API server streams them; a 410
        // ERROR, then the end, once the history is compacted past it; a
        // BOOKMARK, then the end, when the test ends the watches.
        api.watches_from.lock().unwrap().push(from);
        let (tx, body) = tokio::sync::mpsc::channel::<Result<String, std::convert::Infallible>>(16);
        let mut changes = api.pod_version.subscribe();
        tokio::spawn(async move {
            let line = |v: serde_json::Value| Ok(format!("{v}\n"));
            if changes.borrow_and_update().0 > from && tx.send(line(serde_json::json!({"type": "MODIFIED", "object": api.pod_a()}))).await.is_err() {
                return;
            }
            while changes.changed().await.is_ok() {
                let (v, end) = *changes.borrow_and_update();
                let event = if api.gone_below.load(std::sync::atomic::Ordering::SeqCst) > from {
                    serde_json::json!({"type": "ERROR", "object": {"apiVersion": "v1", "kind": "Status", "status": "Failure", "reason": "Expired", "code": 410, "message": format!("too old resource version: {from}")}})
                } else if end {
                    serde_json::json!({"type": "BOOKMARK", "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"resourceVersion": v.to_string()}}})
                } else {
                    serde_json::json!({"type": "MODIFIED", "object": api.pod_a()})
                };
                let last = event["type"] != "MODIFIED";
                if tx.send(line(event)).await.is_err() || last {
                    return;
                }
            }
        });
        return axum::body::Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(body)).into_response();
    }
    *if q.split('&').any(|kv| kv.starts_with("limit=")) { &api.hint_lists } else { &api.pod_lists }.lock().unwrap() += 1;
    let version = api.pod_version.borrow().0.to_string();
    axum::Json(serde_json::json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": version}, "items": [api.pod_a()]})).into_response()
}

/// `GET /api/v1/nodes`: the nodes labelled `egpu.io/enabled=true` (the
/// only selector served), listed or watched: a watch from an older version
/// first gets every selected node as it is now, then each change as a
/// MODIFIED event of the node changed, or DELETED when it loses the label
/// (it no longer matches the selector).
async fn list_nodes(axum::extract::State(api): axum::extract::State<ApiServer>, axum::extract::RawQuery(q): axum::extract::RawQuery) -> axum::response::Response {
    use axum::response::IntoResponse;
    use tokio_stream::StreamExt;
    let q = q.unwrap_or_default();
    if !q.contains("labelSelector=egpu.io%2Fenabled%3Dtrue") {
        return (axum::http::StatusCode::BAD_REQUEST, format!("want the eGPU nodes only, got ?{q}")).into_response();
    }
    let at = |api: &ApiServer, name: &str, v: u64| {
        let mut n = api.nodes.lock().unwrap().get(name).cloned().unwrap_or_default();
        n["metadata"]["resourceVersion"] = v.to_string().into();
        n
    };
    let labelled = |n: &serde_json::Value| n["metadata"]["labels"]["egpu.io/enabled"] == "true";
    if let Some(from) = watch_from(&q) {
        let rx = api.node_version.subscribe();
        let now = rx.borrow().0;
        let names: Vec<String> = api.nodes.lock().unwrap().keys().cloned().collect();
        let missed: Vec<serde_json::Value> = if now > from { names.iter().map(|n| at(&api, n, now)).filter(labelled).collect() } else { Vec::new() };
        let event = |kind: &str, n: serde_json::Value| Ok::<_, std::convert::Infallible>(format!("{}\n", serde_json::json!({"type": kind, "object": n})));
        let changes = tokio_stream::wrappers::WatchStream::from_changes(rx).map(move |(v, name)| {
            let n = at(&api, &name, v);
            if labelled(&n) { event("MODIFIED", n) } else { event("DELETED", n) }
        });
        let events = tokio_stream::iter(missed.into_iter().map(move |n| event("MODIFIED", n))).chain(changes);
        return axum::body::Body::from_stream(events).into_response();
    }
    let v = api.node_version.borrow().0;
    let names: Vec<String> = api.nodes.lock().unwrap().keys().cloned().collect();
    let items: Vec<serde_json::Value> = names.iter().map(|n| at(&api, n, v)).filter(labelled).collect();
    axum::Json(serde_json::json!({"apiVersion": "v1", "kind": "NodeList", "metadata": {"resourceVersion": v.to_string()}, "items": items})).into_response()
}

async fn patch_node(
    axum::extract::State(api): axum::extract::State<ApiServer>,
    axum::extract::Path(name): axum::extract::Path<String>,
    headers: axum::http::HeaderMap,
    body: String,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let patch = match merge_patch(&headers, &body) {
        Ok(p) => p,
        Err(why) => return (axum::http::StatusCode::UNSUPPORTED_MEDIA_TYPE, why).into_response(),
    };
    let mut ann = api.annotations.lock().unwrap();
    for (k, v) in patch["metadata"]["annotations"].as_object().cloned().unwrap_or_default() {
        ann.insert(k, v);
    }
    *api.patches.lock().unwrap() += 1;
    axum::Json(serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "annotations": *ann}})).into_response()
}

/// Serves the API-server stand-in; returns a kubeconfig file naming it.
fn serve_api(rt: &tokio::runtime::Runtime, dir: &Path, api: ApiServer) -> PathBuf {
    let app = axum::Router::new()
        .route("/api/v1/nodes/{name}", axum::routing::patch(patch_node))
        .route("/api/v1/nodes", axum::routing::get(list_nodes))
        .route("/api/v1/pods", axum::routing::get(list_pods))
        .route("/api/v1/namespaces/{ns}/pods/{name}", axum::routing::get(get_pod).patch(patch_pod))
        .route("/api/v1/namespaces/{ns}/pods/{name}/binding", axum::routing::post(bind_pod))
        .with_state(api);
    common::serve_api(rt, dir, app)
}

/// One HTTP/1.1 POST over a fresh connection: (status, body).
fn post(addr: &str, path: &str, body: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    write!(c, "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).unwrap();
    let mut out = String::new();
    c.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    (head.split(' ').nth(1).unwrap().parse().unwrap(), body.to_string())
}

/// The scheduler extender, started on a free port.
struct Scheduler(Child, String);
impl Scheduler {
    /// Without API access: `--no-bind`.
    fn start() -> Scheduler {
        Scheduler::start_with(None)
    }

    /// With a kubeconfig: API access, so it can bind.
    fn start_with(kubeconfig: Option<&Path>) -> Scheduler {
        Scheduler::start_args(kubeconfig, &[]).0
    }

    /// With more flags; also the metrics address, if it printed one.
    fn start_args(kubeconfig: Option<&Path>, args: &[&str]) -> (Scheduler, Option<String>) {
        use std::io::BufRead;
        let mut cmd = clean("egpu-scheduler");
        cmd.args(args);
        match kubeconfig {
            Some(k) => cmd.env("KUBECONFIG", k),
            None => cmd.arg("--no-bind"),
        };
        let mut child = cmd.args(["--listen", "127.0.0.1:0"]).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line}: {e}"));
        let addr = v["addr"].as_str().unwrap().to_string();
        (Scheduler(child, addr), v["metrics"].as_str().map(str::to_string))
    }
}
impl Drop for Scheduler {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn pod_asking(units: u32) -> serde_json::Value {
    serde_json::json!({"metadata": {"name": "p", "namespace": "default"},
        "spec": {"containers": [{"name": "main", "resources": {"limits": {RESOURCE: units.to_string()}, "requests": {RESOURCE: units.to_string()}}}]}})
}

struct Plugin(Child);
impl Plugin {
    /// SIGTERM, then its exit status.
    fn terminate(&mut self) -> std::process::ExitStatus {
        common::signal(self.0.id(), libc::SIGTERM);
        let mut status = None;
        assert!(wait_until(WAIT, || {
            status = self.0.try_wait().unwrap();
            status.is_some()
        }));
        status.unwrap()
    }
}
impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

type DpClient = dp::device_plugin_client::DevicePluginClient<tonic::transport::Channel>;

async fn connect(sock: &Path) -> DpClient {
    dp::device_plugin_client::DevicePluginClient::new(egpu_k8s::unix_channel(sock, WAIT).await.unwrap())
}

/// A command for one of the binaries, without what the environment of a CI
/// runner (perhaps itself in Kubernetes) could add: its node's name, a
/// kubeconfig, a log filter, an egpud socket.
fn clean(bin: &str) -> Command {
    let path = target_dir().join(bin);
    assert!(path.exists(), "{} is not built: it is egpu-k8s's; run `cargo build --workspace` (scripts/test.sh does)", path.display());
    let mut c = Command::new(path);
    for v in ["NODE_NAME", "POD_NAME", "POD_NAMESPACE", "EGPU_LOG", "EGPU_SOCKET", "KUBERNETES_SERVICE_HOST"] {
        c.env_remove(v);
    }
    // Not the developer's own ~/.kube/config either.
    c.env("KUBECONFIG", "/nonexistent/egpu-test-kubeconfig");
    c
}

/// Reads the ListAndWatch stream until a list satisfies `cond`.
async fn until(stream: &mut tonic::Streaming<dp::ListAndWatchResponse>, what: &str, cond: impl Fn(&[dp::Device]) -> bool) -> Vec<dp::Device> {
    let read = async {
        loop {
            let m = stream.message().await.unwrap().expect("stream ended");
            if cond(&m.devices) {
                return m.devices;
            }
        }
    };
    tokio::time::timeout(WAIT, read).await.unwrap_or_else(|_| panic!("no device list where {what}"))
}

fn unhealthy(d: &[dp::Device]) -> Vec<String> {
    d.iter().filter(|d| d.health != "Healthy").map(|d| d.id.clone()).collect()
}

fn spec_path(cdi: &Path, slice: &str) -> PathBuf {
    cdi.join(format!("egpu.io-slice_{slice}.json"))
}

/// A node as the tests need it: egpud (publishing CDI specs), the kubelet
/// and API-server stand-ins, and the plugin with `--sweep-grace grace`.
struct Rig {
    tmp: tempfile::TempDir,
    cdi: PathBuf,
    kdir: PathBuf,
    node: Node,
    rt: tokio::runtime::Runtime,
    registered: mpsc::UnboundedReceiver<dp::RegisterRequest>,
    pods: Arc<Mutex<Vec<pr::PodResources>>>,
    api: ApiServer,
    _plugin: Plugin,
}

impl Rig {
    fn start(grace: &str) -> Rig {
        Rig::start_with(grace, &[])
    }

    /// [`Rig::start`], the plugin given `extra` arguments too.
    fn start_with(grace: &str, extra: &[&str]) -> Rig {
        Rig::start_on("2x16GiB", &[], &[], grace, extra)
    }

    /// [`Rig::start_with`] on `spec` simulated GPUs, egpud given `env` and
    /// the flags `node_extra`.
    fn start_on(spec: &str, env: &[(&str, &str)], node_extra: &[&str], grace: &str, extra: &[&str]) -> Rig {
        let tmp = tempfile::tempdir().unwrap();
        let cdi = tmp.path().join("cdi");
        let kdir = tmp.path().join("kubelet");
        let node = Node::start_env(spec, &[&["--cdi-dir", cdi.to_str().unwrap()], node_extra].concat(), env);
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let (tx, registered) = mpsc::unbounded_channel();
        let pods = Arc::new(Mutex::new(Vec::new()));
        serve_kubelet(&rt, &kdir, Kubelet { registered: tx, pods: pods.clone() });
        let api = ApiServer::default();
        let kubeconfig = serve_api(&rt, tmp.path(), api.clone());
        let log = std::fs::File::create(tmp.path().join("plugin.log")).unwrap();
        let plugin = Plugin(
            clean("egpu-device-plugin")
                .arg("--socket")
                .arg(node.socket())
                .arg("--kubelet-dir")
                .arg(&kdir)
                .arg("--cdi-dir")
                .arg(&cdi)
                .args(["--poll", "50ms", "--pod-poll", "50ms", "--sweep-grace", grace, "--log", "info", "--node-name", "n1", "--metrics-listen", "127.0.0.1:0"])
                .args(extra)
                .env("KUBECONFIG", &kubeconfig)
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap(),
        );
        Rig { tmp, cdi, kdir, node, rt, registered, pods, api, _plugin: plugin }
    }

    fn annotation(&self) -> Option<egpu_k8s::annotation::NodeGpus> {
        self.api.annotation()
    }

    fn free(&self) -> Option<Vec<u32>> {
        self.api.free()
    }

    fn plugin_log(&self) -> String {
        std::fs::read_to_string(self.tmp.path().join("plugin.log")).unwrap_or_default()
    }
}

impl ApiServer {
    /// The Node's `egpu.io/gpus`, as last patched.
    fn annotation(&self) -> Option<egpu_k8s::annotation::NodeGpus> {
        let v = self.annotations.lock().unwrap().get(egpu_k8s::annotation::ANNOTATION)?.as_str()?.to_string();
        Some(egpu_k8s::annotation::NodeGpus::parse(Some(&v)).unwrap())
    }

    /// Free units per GPU, per the Node's annotation.
    fn free(&self) -> Option<Vec<u32>> {
        self.annotation().map(|a| a.gpus.iter().map(|g| g.free).collect())
    }
}

#[test]
fn device_plugin_turns_kubelet_allocations_into_slices() {
    let Rig { tmp, cdi, kdir, mut node, rt, mut registered, pods, api, _plugin } = Rig::start("0s");
    let (annotation, free) = (|| api.annotation(), || api.free());
    let plugin_log = || std::fs::read_to_string(tmp.path().join("plugin.log")).unwrap_or_default();

    rt.block_on(async {
        // 1. Registration: the published version, our socket, our resource.
        let reg = tokio::time::timeout(WAIT, registered.recv()).await.expect("no registration").unwrap();
        assert_eq!((reg.version.as_str(), reg.endpoint.as_str(), reg.resource_name.as_str()), ("v1beta1", "egpu-gpu-memory.sock", RESOURCE));
        assert!(reg.options.unwrap().get_preferred_allocation_available);
        let sock = kdir.join("device-plugins").join(&reg.endpoint);
        let mut c = connect(&sock).await;
        let opts = c.get_device_plugin_options(dp::Empty {}).await.unwrap().into_inner();
        assert!(opts.get_preferred_allocation_available && !opts.pre_start_required);

        // 2. One device per GiB of each GPU, all healthy.
        let mut stream = c.list_and_watch(dp::Empty {}).await.unwrap().into_inner();
        let devices = until(&mut stream, "32 healthy", |d| d.len() == 32 && unhealthy(d).is_empty()).await;
        let all: Vec<String> = devices.iter().map(|d| d.id.clone()).collect();
        // GPU 0's tokens come first, numbered from 0.
        let uuid = |id: &str| id.rsplit_once('_').unwrap().0.to_string();
        let (u0, u1) = (uuid(&all[0]), uuid(&all[31]));
        assert_ne!(u0, u1);
        let tok = |u: &str, k: u32| format!("{u}_{k}");
        assert_eq!(all[15], tok(&u0, 15));
        assert_eq!(all[16], tok(&u1, 0));

        // 3. The preferred 10 lie on one GPU.
        let ask = |available: Vec<String>, size: i32| dp::PreferredAllocationRequest {
            container_requests: vec![dp::ContainerPreferredAllocationRequest { available_device_i_ds: available, must_include_device_i_ds: vec![], allocation_size: size }],
        };
        let pref = c.get_preferred_allocation(ask(all.clone(), 10)).await.unwrap().into_inner().container_responses.remove(0).device_i_ds;
        assert_eq!(pref.len(), 10);
        assert!(pref.iter().all(|id| uuid(id) == u0), "{pref:?}");

        // 4. Allocate: a slice of exactly 10 GiB on GPU 0 with its CDI device.
        // (This kubelet records the container before it asks; a real one
        // records it after, which the sweep's grace period covers.)
        pods.lock().unwrap().push(holder("a", &pref));
        let alloc = |ids: Vec<String>| dp::AllocateRequest { container_requests: vec![dp::ContainerAllocateRequest { devices_ids: ids }] };
        let r = c.allocate(alloc(pref.clone())).await.unwrap().into_inner().container_responses.remove(0);
        let slice = egpu_k8s::tokens::slice_name(&pref);
        assert_eq!(r.cdi_devices.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(), [format!("egpu.io/slice={slice}")]);
        assert_eq!(r.envs.get("EGPU_SLICE"), Some(&slice));
        let s = node.slice(&slice);
        assert_eq!(s["devices"].as_array().unwrap().len(), 1, "{s}");
        assert_eq!(s["devices"][0]["device"], 0, "{s}");
        assert_eq!(s["devices"][0]["memory_limit_bytes"], 10u64 << 30, "{s}");
        assert_eq!(s["devices"][0]["compute_share_percent"], 62.5, "10 of 16 GiB: 62.5% guaranteed; {s}");
        assert!(spec_path(&cdi, &slice).exists());
        // The same tokens again (a kubelet retry) give the same slice.
        let again = c.allocate(alloc(pref.clone())).await.unwrap().into_inner().container_responses.remove(0);
        assert_eq!(again.cdi_devices, r.cdi_devices);
        assert_eq!(node.slices().len(), 1);
        // The Node's annotation says what is left on each GPU.
        assert!(wait_until(WAIT, || free() == Some(vec![6, 16])), "annotation {:?}; plugin log:\n{}", annotation(), plugin_log());
        let a = annotation().unwrap();
        assert_eq!((a.unit_bytes, a.gpus[0].units, a.gpus[1].uuid.as_str()), (1 << 30, 16, u1.as_str()));
        // It names the pod whose units `free` counts, and how many it holds,
        // for the extender's bind.
        assert_eq!(a.pods, Some([("default/a".to_string(), 10)].into()));
        // And, once its followed list has the pod's UID, where they are, for
        // the extender's preemption.
        let held_by_uid = || annotation().and_then(|a| a.holds) == Some([("uid-a".to_string(), [(0, 10)].into())].into());
        assert!(wait_until(WAIT, held_by_uid), "annotation {:?}", annotation());

        // 4b. The pod's annotations resize its slice live: share, cap, burst.
        let set = |kv: &[(&str, &str)]| api.set_pod_annotations(kv);
        let dev = |node: &Node| node.slice(&slice)["devices"][0].clone();
        let is = |d: &serde_json::Value, share: f64, limit: f64, burst: u64| {
            d["compute_share_percent"] == share && d["compute_limit_percent"] == limit && d["memory_burst_bytes"] == burst
        };
        set(&[("egpu.io/gpu-compute", "20%"), ("egpu.io/gpu-compute-limit", "50%"), ("egpu.io/gpu-memory-burst", "12GiB")]);
        assert!(wait_until(WAIT, || is(&dev(&node), 20.0, 50.0, 12 << 30)), "{}; plugin log:\n{}", dev(&node), plugin_log());
        set(&[("egpu.io/gpu-compute", "30%")]);
        assert!(wait_until(WAIT, || is(&dev(&node), 30.0, 100.0, 0)), "{}", dev(&node));
        // An annotation that does not parse changes nothing, and says why.
        set(&[("egpu.io/gpu-compute", "lots")]);
        assert!(wait_until(WAIT, || plugin_log().contains("cannot apply the pod's annotations: egpu.io/gpu-compute:")), "{}", plugin_log());
        assert!(is(&dev(&node), 30.0, 100.0, 0), "{}", dev(&node));
        // Gone: the defaults come back.
        set(&[]);
        assert!(wait_until(WAIT, || is(&dev(&node), 62.5, 100.0, 0)), "{}", dev(&node));
        // Every change came by the watch: the pods were listed once.
        assert_eq!(*api.pod_lists.lock().unwrap(), 1, "plugin log:\n{}", plugin_log());
        // The server expires the watch (410 Gone): the plugin lists again
        // once and follows the next change by its new watch.
        api.expire_watches();
        assert!(wait_until(WAIT, || *api.pod_lists.lock().unwrap() == 2), "plugin log:\n{}", plugin_log());
        set(&[("egpu.io/gpu-compute", "25%")]);
        assert!(wait_until(WAIT, || is(&dev(&node), 25.0, 100.0, 0)), "{}", dev(&node));
        set(&[]);
        assert!(wait_until(WAIT, || is(&dev(&node), 62.5, 100.0, 0)), "{}", dev(&node));
        assert_eq!(*api.pod_lists.lock().unwrap(), 2, "plugin log:\n{}", plugin_log());
        // The server ends the watch (its timeout) with a bookmark: the
        // plugin watches again from the bookmark's version, with no list.
        let watches = api.watches_from.lock().unwrap().len();
        let bookmark = api.end_watches();
        assert!(wait_until(WAIT, || api.watches_from.lock().unwrap().len() > watches), "plugin log:\n{}", plugin_log());
        assert_eq!(api.watches_from.lock().unwrap()[watches], bookmark);
        set(&[("egpu.io/gpu-compute", "35%")]);
        assert!(wait_until(WAIT, || is(&dev(&node), 35.0, 100.0, 0)), "{}", dev(&node));
        set(&[]);
        assert!(wait_until(WAIT, || is(&dev(&node), 62.5, 100.0, 0)), "{}", dev(&node));
        assert_eq!(*api.pod_lists.lock().unwrap(), 2, "plugin log:\n{}", plugin_log());

        // 5. Tokens on two GPUs are refused with the reason, and make no slice.
        let spread = vec![tok(&u0, 12), tok(&u1, 0)];
        let e = c.allocate(alloc(spread)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
        assert!(e.message().contains("one GPU") && e.message().contains("1 on GPU 0, 1 on GPU 1"), "{}", e.message());
        let e = c.allocate(alloc(vec!["GPU-other_0".into()])).await.unwrap_err();
        assert!(e.message().contains("not one this plugin advertised"), "{}", e.message());
        assert_eq!(node.slices().len(), 1);

        // 6. A slice made outside Kubernetes takes its memory off the list:
        // the top 3 tokens of GPU 1 become unhealthy.
        node.ok(&["create", "--name", "batch", "--gpu-memory", "3GiB", "--device", "1"]);
        let d = until(&mut stream, "3 unhealthy", |d| !unhealthy(d).is_empty()).await;
        assert_eq!(unhealthy(&d), [tok(&u1, 13), tok(&u1, 14), tok(&u1, 15)]);
        assert!(wait_until(WAIT, || free() == Some(vec![6, 13])), "annotation {:?}", annotation());

        // The extender, fed the Node as the plugin annotated it, admits what
        // fits one GPU and says why it refuses the rest.
        let sched = Scheduler::start();
        let node_obj = serde_json::json!({"metadata": {"name": "n1", "annotations": *api.annotations.lock().unwrap()}});
        let ask = |units| serde_json::json!({"Pod": pod_asking(units), "Nodes": {"items": [node_obj.clone()]}}).to_string();
        let (code, body) = post(&sched.1, "/filter", &ask(13));
        assert_eq!(code, 200, "{body}");
        let r: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(r["Nodes"]["items"][0]["metadata"]["name"], "n1", "{r}");
        let (_, body) = post(&sched.1, "/filter", &ask(14));
        let r: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(r["Nodes"]["items"].as_array().unwrap().len(), 0, "{r}");
        assert!(r["FailedNodes"]["n1"].as_str().unwrap().contains("the most free on one GPU is 13"), "{r}");
        let (code, body) = post(&sched.1, "/prioritize", &ask(4));
        assert_eq!(code, 200, "{body}");
        assert_eq!(serde_json::from_str::<serde_json::Value>(&body).unwrap(), serde_json::json!([{"Host": "n1", "Score": 10}]));

        // 7. The container is gone from the kubelet: its slice and spec go.
        pods.lock().unwrap().clear();
        let gone = wait_until(WAIT, || node.slices().iter().all(|s| s["name"] != slice.as_str()));
        assert!(gone, "slice not swept; plugin log:\n{}", plugin_log());
        assert!(wait_until(WAIT, || !spec_path(&cdi, &slice).exists()));
        assert_eq!(node.slices().len(), 1, "the outside slice is never swept");
        assert!(wait_until(WAIT, || free() == Some(vec![16, 13])), "annotation {:?}", annotation());
        // What the plugin counted: two containers allocated (the second
        // found the slice), two refused, seven resizes, one slice swept.
        let m = scrape_logged(plugin_log);
        let at = |series: &str| sample(&m, series);
        assert_eq!(at(r#"egpu_device_plugin_allocations_total{outcome="ok"}"#), Some(2.0), "{m}");
        assert_eq!(at(r#"egpu_device_plugin_allocations_total{outcome="error"}"#), Some(2.0), "{m}");
        assert_eq!(at("egpu_device_plugin_allocation_seconds_count"), Some(4.0), "{m}");
        assert_eq!(at("egpu_device_plugin_resizes_total"), Some(7.0), "{m}");
        assert_eq!(at("egpu_device_plugin_swept_slices_total"), Some(1.0), "{m}");
        assert_eq!((at("egpu_device_plugin_egpud_up"), at("egpu_device_plugin_pod_resources_up")), (Some(1.0), Some(1.0)), "{m}");
        assert_eq!(at(r#"egpu_device_plugin_devices{health="unhealthy"}"#), Some(3.0), "{m}");
        assert_eq!(at(r#"egpu_device_plugin_devices{health="healthy"}"#), Some(29.0), "{m}");
        // (A registration is counted when the kubelet has answered it: wait.)
        let registrations = || sample(&scrape_logged(plugin_log), "egpu_device_plugin_registrations_total");
        assert!(wait_until(WAIT, || registrations() == Some(1.0)), "{:?}", registrations());

        // 8. The kubelet restarts (its device-plugins directory is wiped):
        // the plugin serves and registers again.
        std::fs::remove_file(&sock).unwrap();
        let reg = tokio::time::timeout(WAIT, registered.recv()).await.expect("no second registration").unwrap();
        assert_eq!(reg.resource_name, RESOURCE);
        let mut c = connect(&sock).await;
        let mut stream = c.list_and_watch(dp::Empty {}).await.unwrap().into_inner();
        until(&mut stream, "32 with 3 unhealthy", |d| d.len() == 32 && unhealthy(d).len() == 3).await;

        // 9. egpud dies: every device unhealthy, Allocate says why; back when it restarts.
        node.kill9();
        until(&mut stream, "all unhealthy", |d| d.len() == 32 && unhealthy(d).len() == 32).await;
        let e = c.allocate(alloc(vec![tok(&u0, 0)])).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
        assert!(e.message().contains("egpud is not reachable"), "{}", e.message());
        let m = scrape_logged(plugin_log);
        assert_eq!(sample(&m, "egpu_device_plugin_egpud_up"), Some(0.0), "{m}");
        assert_eq!(sample(&m, r#"egpu_device_plugin_devices{health="unhealthy"}"#), Some(32.0), "{m}");
        assert_eq!(sample(&m, r#"egpu_device_plugin_allocations_total{outcome="error"}"#), Some(3.0), "{m}");
        assert!(wait_until(WAIT, || registrations() == Some(2.0)), "registered again after the kubelet's restart: {:?}", registrations());
        node.restart();
        until(&mut stream, "healthy again", |d| d.len() == 32 && unhealthy(d).len() == 3).await;
        // 10. SIGTERM with a stream open: the plugin ends it (else its server's
        // graceful shutdown would wait for it), exits 0 and removes its socket.
        let mut plugin = _plugin;
        assert!(plugin.terminate().success(), "{}", plugin_log());
        assert!(!sock.exists());
    });
    assert!(!plugin_log().contains("panicked"), "{}", plugin_log());
}

/// The GPU eGPU's policy picks inside the node reaches the device plugin:
/// the extender writes it onto the pod at bind (`egpu.io/gpu-hint`), the
/// plugin follows the node's pods and prefers that GPU for a request of
/// the pod's size, once. Best fit would have taken the other GPU.
#[test]
fn the_policys_gpu_reaches_the_plugin_through_the_pods_hint() {
    let Rig { tmp, rt, mut registered, pods, api, kdir, node: _node, _plugin, .. } = Rig::start("0s");
    let plugin_log = || std::fs::read_to_string(tmp.path().join("plugin.log")).unwrap_or_default();
    rt.block_on(async {
        let reg = tokio::time::timeout(WAIT, registered.recv()).await.expect("no registration").unwrap();
        let mut c = connect(&kdir.join("device-plugins").join(&reg.endpoint)).await;
        let mut stream = c.list_and_watch(dp::Empty {}).await.unwrap().into_inner();
        let all: Vec<String> = until(&mut stream, "32 healthy", |d| d.len() == 32 && unhealthy(d).is_empty()).await.iter().map(|d| d.id.clone()).collect();
        let uuid = |id: &str| id.rsplit_once('_').unwrap().0.to_string();
        let (u0, u1) = (uuid(&all[0]), uuid(&all[31]));
        // Pods x (10 units of GPU 0) and y (6 of GPU 1) leave [6, 10] free.
        let (x, y): (Vec<String>, Vec<String>) = (all[..10].to_vec(), all[16..22].to_vec());
        pods.lock().unwrap().extend([holder("x", &x), holder("y", &y)]);
        let alloc = |ids: Vec<String>| dp::AllocateRequest { container_requests: vec![dp::ContainerAllocateRequest { devices_ids: ids }] };
        c.allocate(alloc(x.clone())).await.unwrap();
        c.allocate(alloc(y.clone())).await.unwrap();
        assert!(wait_until(WAIT, || api.free() == Some(vec![6, 10])), "annotation {:?}; plugin log:\n{}", api.annotation(), plugin_log());
        let available: Vec<String> = all.iter().filter(|id| !x.contains(id) && !y.contains(id)).cloned().collect();
        let prefer = |size: i32| {
            let req = dp::PreferredAllocationRequest {
                container_requests: vec![dp::ContainerPreferredAllocationRequest { available_device_i_ds: available.clone(), must_include_device_i_ds: vec![], allocation_size: size }],
            };
            let mut c = c.clone();
            async move { c.get_preferred_allocation(req).await.unwrap().into_inner().container_responses.remove(0).device_i_ds }
        };
        // Without a hint: best fit, GPU 0's 6.
        assert!(prefer(4).await.iter().all(|id| uuid(id) == u0));

        // The scheduler, whose node cache has the node as the plugin
        // annotated it, places pod a (4 units) and binds it.
        let node_annotation = api.annotations.lock().unwrap()[egpu_k8s::annotation::ANNOTATION].as_str().unwrap().to_string();
        api.set_node("n1", true, Some(node_annotation));
        let mut a = pod_asking(4);
        a["metadata"]["name"] = "a".into();
        a["metadata"]["uid"] = "uid-a".into();
        api.pods.lock().unwrap().insert("a".into(), a.clone());
        let kubeconfig = tmp.path().join("kubeconfig");
        // The plugin's watch will lag: it does not hear of the hint.
        api.silent_patches.store(true, std::sync::atomic::Ordering::SeqCst);
        let (sched, metrics) = Scheduler::start_args(Some(&kubeconfig), &["--metrics-listen", "127.0.0.1:0"]);
        let (code, body) = post(&sched.1, "/filter", &serde_json::json!({"Pod": a, "NodeNames": ["n1"]}).to_string());
        assert_eq!(code, 200, "{body}");
        assert_eq!(serde_json::from_str::<serde_json::Value>(&body).unwrap()["NodeNames"], serde_json::json!(["n1"]), "{body}");
        let (code, body) = post(&sched.1, "/bind", &serde_json::json!({"PodName": "a", "PodNamespace": "default", "PodUID": "uid-a", "Node": "n1"}).to_string());
        assert_eq!((code, serde_json::from_str::<serde_json::Value>(&body).unwrap()["Error"].as_str()), (200, Some("")), "{body}");
        // The hint names GPU 1, where the policy keeps two holes a 4 can use.
        let hint = api.pods.lock().unwrap()["a"]["metadata"]["annotations"][egpu_k8s::hint::HINT_ANNOTATION].as_str().map(egpu_k8s::hint::Hint::parse);
        let Some(Ok(hint)) = hint else { panic!("{:?}", api.pods.lock().unwrap()["a"]) };
        assert_eq!((hint.gpus, hint.total), (vec![(u1.clone(), 4)], 4));
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        assert!(hint.at <= now && now - hint.at < 60, "written now: {} vs {now}", hint.at);
        assert_eq!(api.bindings.lock().unwrap().len(), 1);
        let metrics_addr = metrics.unwrap();
        let (_, _, m) = http_get(&metrics_addr, "/metrics");
        assert_eq!(sample(&m, r#"egpu_extender_hints_total{outcome="written"}"#), Some(1.0), "{m}");
        // The kubelet asks before the plugin's watch has the hint (here it
        // never will): the plugin, finding no hint of the size, reads the
        // node's pods once and prefers GPU 1 for a 4.
        let lists = *api.hint_lists.lock().unwrap();
        let pref = prefer(4).await;
        assert_eq!(pref, all[22..26].to_vec(), "GPU 1's lowest available units; plugin log:\n{}", plugin_log());
        assert_eq!(*api.hint_lists.lock().unwrap(), lists + 1);
        // Followed once: the next 4 is best fit again.
        assert!(prefer(4).await.iter().all(|id| uuid(id) == u0));
        let m = scrape_logged(plugin_log);
        assert_eq!(sample(&m, r#"egpu_device_plugin_preferred_hints_total{outcome="followed"}"#), Some(1.0), "{m}");
        assert_eq!(sample(&m, r#"egpu_device_plugin_preferred_hints_total{outcome="stale"}"#), None, "{m}");
        assert_eq!(sample(&m, r#"egpu_device_plugin_preferred_hints_total{outcome="none"}"#), Some(2.0), "{m}");
        // A bind whose hint the API server refuses (here the UID
        // precondition: the pod was replaced) counts the failure and goes
        // on to the Binding, which is refused for the same reason.
        let mut b = pod_asking(4);
        b["metadata"]["name"] = "b".into();
        b["metadata"]["uid"] = "uid-b".into();
        api.pods.lock().unwrap().insert("b".into(), b.clone());
        b["metadata"]["uid"] = "uid-b-old".into();
        let (code, _) = post(&sched.1, "/filter", &serde_json::json!({"Pod": b, "NodeNames": ["n1"]}).to_string());
        assert_eq!(code, 200);
        let (_, body) = post(&sched.1, "/bind", &serde_json::json!({"PodName": "b", "PodNamespace": "default", "PodUID": "uid-b-old", "Node": "n1"}).to_string());
        assert!(body.contains("refused it (409)") && body.contains("UID in precondition"), "{body}");
        assert!(api.pods.lock().unwrap()["b"]["metadata"]["annotations"].is_null(), "no hint written");
        let (_, _, m) = http_get(&metrics_addr, "/metrics");
        assert_eq!(sample(&m, r#"egpu_extender_hints_total{outcome="failed"}"#), Some(1.0), "{m}");
    });
    assert!(!plugin_log().contains("panicked"), "{}", plugin_log());
}

/// On a node whose GPUs are NVLink pairs (0-1, 2-3: the simulated
/// driver's `EGPU_SIM_NVLINK=pairs`), egpud reports each GPU's NVLink
/// group, the plugin publishes it in the Node's annotation, and a
/// container of two whole GPUs gets a pair: with GPU 1 in use, GPUs 2 and
/// 3, not the lowest free ones (0 and 2, across the pairs). The extender's
/// view of the node takes the same two.
#[test]
fn whole_gpus_come_from_one_nvlink_group() {
    let rig = Rig::start_on("4x16GiB", &[("EGPU_SIM_NVLINK", "pairs")], &[], "0s", &[]);
    let out = rig.node.egpu(&["devices", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let groups: Vec<serde_json::Value> = v["devices"].as_array().unwrap().iter().map(|d| d["nvlink_group"].clone()).collect();
    assert_eq!(groups, [0, 0, 2, 2].map(serde_json::Value::from), "{v}");
    two_whole_gpus_are_2_and_3(rig, |g| g.nvlink, [Some(0), Some(0), Some(2), Some(2)], [None; 4]);
}

/// On a node without NVLink whose GPUs sit in pairs under PCIe switches
/// (0-1, 2-3: the simulated driver's `EGPU_SIM_PCIE=pairs`), egpud reports
/// each GPU's PCIe switch group, and a container of two whole GPUs gets a
/// pair under one switch: with GPU 1 in use, GPUs 2 and 3.
#[test]
fn whole_gpus_come_from_one_pcie_switch_group() {
    let rig = Rig::start_on("4x16GiB", &[("EGPU_SIM_NVLINK", "none"), ("EGPU_SIM_PCIE", "pairs")], &[], "0s", &[]);
    let out = rig.node.egpu(&["devices", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let field = |f: &str| v["devices"].as_array().unwrap().iter().map(|d| d[f].clone()).collect::<Vec<_>>();
    assert_eq!((field("pcie_switch_group"), field("nvlink_group")), ([0, 0, 2, 2].map(serde_json::Value::from).to_vec(), [0, 1, 2, 3].map(serde_json::Value::from).to_vec()), "{v}");
    two_whole_gpus_are_2_and_3(rig, |g| g.pcie, [Some(0), Some(0), Some(2), Some(2)], [None; 4]);
}

/// On a node whose GPUs sit on two NUMA nodes (0-1 on node 0, 2-3 on node
/// 1, in a made-up sysfs given to `egpud --sysfs`; all four in one NVLink
/// domain, the simulated driver's default), egpud reports each GPU's
/// PCI address, NUMA node and PCIe root; every token the plugin advertises
/// carries its GPU's NUMA node for the kubelet's Topology Manager; and a
/// container of two whole GPUs gets two of one NUMA node: with GPU 1 in
/// use, GPUs 2 and 3, not 0 and 2. The extender's view takes the same two.
#[test]
fn whole_gpus_come_from_one_numa_node() {
    let sysfs = tempfile::tempdir().unwrap();
    let devices = sysfs.path().join("bus/pci/devices");
    std::fs::create_dir_all(&devices).unwrap();
    for d in 0..4u32 {
        // The simulated driver's PCI addresses: bus 0x10 + index.
        let bdf = format!("0000:{:02x}:00.0", 0x10 + d);
        let root = if d < 2 { "pci0000:00" } else { "pci0000:80" };
        let path = format!("{root}/{}:01.0/{bdf}", &root[3..]);
        let real = sysfs.path().join("devices").join(&path);
        std::fs::create_dir_all(&real).unwrap();
        std::fs::write(real.join("numa_node"), format!("{}\n", d / 2)).unwrap();
        std::os::unix::fs::symlink(format!("../../../devices/{path}"), devices.join(&bdf)).unwrap();
    }
    let rig = Rig::start_on("4x16GiB", &[], &["--sysfs", sysfs.path().to_str().unwrap()], "0s", &["--numa-topology"]);
    let out = rig.node.egpu(&["devices", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let field = |f: &str| v["devices"].as_array().unwrap().iter().map(|d| d[f].clone()).collect::<Vec<_>>();
    assert_eq!(field("numa_node"), [0, 0, 1, 1].map(serde_json::Value::from), "{v}");
    assert_eq!(field("pcie_root"), ["pci0000:00", "pci0000:00", "pci0000:80", "pci0000:80"].map(serde_json::Value::from), "{v}");
    assert_eq!(field("pci_bus_id")[3], "0000:13:00.0", "{v}");
    let table = String::from_utf8(rig.node.egpu(&["devices"]).stdout).unwrap();
    assert!(table.lines().nth(1).is_some_and(|h| h.contains(" NUMA ")), "{table}");
    two_whole_gpus_are_2_and_3(rig, |g| g.numa, [Some(0), Some(0), Some(1), Some(1)], [Some(0), Some(0), Some(1), Some(1)]);
}

/// The shared part of the two tests above, on four GPUs of 16 units
/// whose `link` (read from each GPU of the Node's annotation) is `links`
/// and whose tokens carry the NUMA nodes `numa`: pod x holds 4 units of
/// GPU 1, and a container of two whole GPUs is preferred GPUs 2 and 3, as
/// the extender's view of the node takes them.
fn two_whole_gpus_are_2_and_3(rig: Rig, link: fn(&egpu_k8s::annotation::GpuFree) -> Option<u32>, links: [Option<u32>; 4], numa: [Option<i64>; 4]) {
    let Rig { rt, mut registered, pods, api, kdir, _plugin, tmp, .. } = rig;
    let plugin_log = || std::fs::read_to_string(tmp.path().join("plugin.log")).unwrap_or_default();
    rt.block_on(async {
        let reg = tokio::time::timeout(WAIT, registered.recv()).await.expect("no registration").unwrap();
        let mut c = connect(&kdir.join("device-plugins").join(&reg.endpoint)).await;
        let mut stream = c.list_and_watch(dp::Empty {}).await.unwrap().into_inner();
        let devices = until(&mut stream, "64 healthy", |d| d.len() == 64 && unhealthy(d).is_empty()).await;
        let topology: Vec<Option<Vec<i64>>> = devices.iter().step_by(16).map(|d| d.topology.as_ref().map(|t| t.nodes.iter().map(|n| n.id).collect())).collect();
        assert_eq!(topology, numa.map(|n| n.map(|n| vec![n])), "each GPU's first token");
        let first = |id: &str| devices.iter().find(|e| e.id == format!("{}_0", id.rsplit_once('_').unwrap().0)).unwrap();
        assert!(devices.iter().all(|d| d.topology == first(&d.id).topology), "every token as its GPU's first");
        let all: Vec<String> = devices.iter().map(|d| d.id.clone()).collect();
        let uuid = |id: &str| id.rsplit_once('_').unwrap().0.to_string();
        let gpu = |i: usize| uuid(&all[i * 16]);
        // Pod x holds 4 units of GPU 1.
        let x = all[16..20].to_vec();
        pods.lock().unwrap().push(holder("x", &x));
        c.allocate(dp::AllocateRequest { container_requests: vec![dp::ContainerAllocateRequest { devices_ids: x.clone() }] }).await.unwrap();
        let published = || api.annotation().map(|a| (a.gpus.iter().map(link).collect::<Vec<_>>(), a.gpus.iter().map(|g| g.free).collect::<Vec<_>>()));
        assert!(wait_until(WAIT, || published() == Some((links.to_vec(), vec![16, 12, 16, 16]))), "{:?}; plugin log:\n{}", published(), plugin_log());
        let available: Vec<String> = all.iter().filter(|id| !x.contains(id)).cloned().collect();
        let req = dp::PreferredAllocationRequest { container_requests: vec![dp::ContainerPreferredAllocationRequest { available_device_i_ds: available, must_include_device_i_ds: vec![], allocation_size: 32 }] };
        let pref = c.get_preferred_allocation(req).await.unwrap().into_inner().container_responses.remove(0).device_i_ds;
        let mut on: Vec<String> = pref.iter().map(|id| uuid(id)).collect();
        on.dedup();
        assert_eq!((pref.len(), on), (32, vec![gpu(2), gpu(3)]));
        // The extender places the same container on the same two GPUs.
        let mut g = api.annotation().unwrap();
        assert!(g.take(32));
        assert_eq!(g.gpus.iter().map(|g| g.free).collect::<Vec<_>>(), [16, 12, 0, 0]);
    });
}

#[test]
fn scheduler_extender_answers_bad_requests_with_the_reason() {
    let sched = Scheduler::start();
    let (code, body) = post(&sched.1, "/filter", "{not json");
    assert_eq!(code, 400);
    assert!(body.contains("not an ExtenderArgs JSON body"), "{body}");
    // No Nodes: the extender needs nodeCacheCapable: false.
    let (code, body) = post(&sched.1, "/filter", &serde_json::json!({"Pod": pod_asking(1), "NodeNames": ["a"]}).to_string());
    assert_eq!(code, 200);
    assert!(body.contains("nodeCacheCapable: false"), "{body}");
    let (code, body) = post(&sched.1, "/prioritize", &serde_json::json!({"Nodes": {"items": []}}).to_string());
    assert_eq!(code, 400);
    assert!(body.contains("no Pod"), "{body}");
    // A quantity that is not a whole number names the container.
    let mut pod = pod_asking(1);
    pod["spec"]["containers"][0]["resources"]["limits"][RESOURCE] = "500m".into();
    pod["spec"]["containers"][0]["resources"]["requests"][RESOURCE] = "500m".into();
    let (_, body) = post(&sched.1, "/filter", &serde_json::json!({"Pod": pod, "Nodes": {"items": []}}).to_string());
    assert!(body.contains("container 'main'") && body.contains("'500m'"), "{body}");
}

/// An `egpu.io/gpus` value: GPUs of 16 units with these free, and the pods
/// holding units.
fn gpus_annotation(free: &[u32], pods: &[(&str, u32)]) -> String {
    egpu_k8s::annotation::NodeGpus {
        v: egpu_k8s::annotation::VERSION,
        unit_bytes: 1 << 30,
        gpus: free.iter().enumerate().map(|(i, &f)| egpu_k8s::annotation::GpuFree { index: i as u32, uuid: format!("GPU-{i}"), model: "m".into(), units: 16, free: f, nvlink: None, numa: None, pcie: None }).collect(),
        pods: Some(pods.iter().map(|(p, u)| (p.to_string(), *u)).collect()),
        holds: None,
    }
    .to_json()
}

/// The API-server stand-in alone, with a kubeconfig naming it (keep the
/// directory and the runtime alive while it serves).
fn api_stand_in() -> (tempfile::TempDir, tokio::runtime::Runtime, ApiServer, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let api = ApiServer::default();
    let kubeconfig = serve_api(&rt, tmp.path(), api.clone());
    (tmp, rt, api, kubeconfig)
}

/// With API access the extender follows the eGPU nodes' annotations itself
/// (a list before it answers, then a watch), so a scheduler configured with
/// `nodeCacheCapable: true` sends node names instead of whole Nodes.
#[test]
fn scheduler_extender_with_a_node_cache_takes_node_names() {
    let (_tmp, _rt, api, kubeconfig) = api_stand_in();
    api.set_node("n1", true, Some(gpus_annotation(&[10, 4], &[])));
    api.set_node("n3", false, Some(gpus_annotation(&[16], &[])));
    api.set_node("n4", true, None);
    let (sched, metrics) = Scheduler::start_args(Some(&kubeconfig), &["--metrics-listen", "127.0.0.1:0"]);
    let metrics = metrics.expect("the metrics address");
    let ask = |verb: &str, units: u32, names: &[&str]| -> serde_json::Value {
        let (code, body) = post(&sched.1, verb, &serde_json::json!({"Pod": pod_asking(units), "NodeNames": names}).to_string());
        assert_eq!(code, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    };
    // Filled before it answered: n1 fits, and the others say why not.
    let r = ask("/filter", 8, &["n1", "n3", "n4", "n9"]);
    assert_eq!(r["NodeNames"], serde_json::json!(["n1"]), "{r}");
    assert!(r.get("Nodes").is_none(), "names in, names out: {r}");
    let unresolvable = &r["FailedAndUnresolvableNodes"];
    for n in ["n3", "n9"] {
        assert!(unresolvable[n].as_str().unwrap().contains("not in this extender's node cache"), "{r}");
    }
    assert!(unresolvable["n4"].as_str().unwrap().contains("no egpu.io/gpus annotation"), "{r}");
    assert_eq!(ask("/prioritize", 8, &["n1", "n4"]), serde_json::json!([{"Host": "n1", "Score": 10}, {"Host": "n4", "Score": 0}]));
    // The metrics, on their own address: the cache, and what the filter decided.
    let (code, _, m) = http_get(&metrics, "/metrics");
    assert_eq!(code, 200, "{m}");
    assert_eq!((sample(&m, "egpu_extender_node_cache_synced"), sample(&m, "egpu_extender_node_cache_nodes")), (Some(1.0), Some(2.0)), "{m}");
    let decided = |result: &str| sample(&m, &format!("egpu_extender_filter_nodes_total{{result=\"{result}\"}}"));
    assert_eq!((decided("passed"), decided("failed"), decided("unresolvable")), (Some(1.0), Some(0.0), Some(3.0)), "{m}");
    assert_eq!(sample(&m, "egpu_extender_requests_total{verb=\"prioritize\",outcome=\"ok\"}"), Some(1.0), "{m}");
    assert!(m.contains("egpu_extender_request_seconds_bucket{le=\"0.0005\",verb=\"filter\"}") || m.contains("egpu_extender_request_seconds_bucket{verb=\"filter\",le=\"0.0005\"}"), "{m}");
    // A change reaches it by the watch.
    api.set_node("n1", true, Some(gpus_annotation(&[4, 4], &[])));
    let refused = || ask("/filter", 8, &["n1"])["FailedNodes"]["n1"].as_str().unwrap_or_default().contains("the most free on one GPU is 4");
    assert!(wait_until(WAIT, refused));
    // A selector the server refuses stops it at start, with the reason.
    let o = clean("egpu-scheduler").args(["--listen", "127.0.0.1:0", "--node-selector", "team=x"]).env("KUBECONFIG", &kubeconfig).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("cannot list the nodes selected by --node-selector 'team=x'"), "{err}");
    // Preemption: a node is kept only where the victims' units, back on the
    // GPUs they hold, make room on one GPU. n5 has 2 + 2 free of 16 + 16;
    // pod v-a holds 6 on GPU 0, v-b 14 on GPU 1; the pod asks for 12.
    let mut n5: egpu_k8s::annotation::NodeGpus = serde_json::from_str(&gpus_annotation(&[2, 2], &[])).unwrap();
    n5.holds = Some([("v-a".to_string(), [(0, 6)].into()), ("v-b".to_string(), [(1, 14)].into())].into());
    api.set_node("n5", true, Some(n5.to_json()));
    let preempt = |victims: serde_json::Value| -> serde_json::Value {
        let (code, body) = post(&sched.1, "/preempt", &serde_json::json!({"Pod": pod_asking(12), "NodeNameToMetaVictims": victims}).to_string());
        assert_eq!(code, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    };
    let victims = |uids: &[&str]| serde_json::json!({"Pods": uids.iter().map(|u| serde_json::json!({"UID": u})).collect::<Vec<_>>(), "NumPDBViolations": 1});
    let cached = || ask("/filter", 12, &["n5"])["FailedNodes"]["n5"].as_str().is_some_and(|why| why.contains("the most free on one GPU is 2"));
    assert!(wait_until(WAIT, cached), "n5 never came through the watch");
    let r = preempt(serde_json::json!({"n5": victims(&["v-b"])}));
    assert_eq!(r["NodeNameToMetaVictims"]["n5"], victims(&["v-b"]), "kept with the scheduler's victims, as they came: {r}");
    // v-a frees 6 on GPU 0 (8 free): no room for 12; a node outside the cache is dropped too.
    let r = preempt(serde_json::json!({"n5": victims(&["v-a"]), "n9": victims(&["v-b"])}));
    assert_eq!(r, serde_json::json!({"NodeNameToMetaVictims": {}}), "{r}");
    let (_, _, m) = http_get(&metrics, "/metrics");
    let preempt_nodes = |result: &str| sample(&m, &format!("egpu_extender_preempt_nodes_total{{result=\"{result}\"}}"));
    assert_eq!((preempt_nodes("kept"), preempt_nodes("dropped")), (Some(1.0), Some(2.0)), "{m}");
    // A node that loses the label leaves the cache (the watch's DELETED).
    api.set_node("n1", false, Some(gpus_annotation(&[16, 16], &[])));
    let gone = || ask("/filter", 8, &["n1"])["FailedAndUnresolvableNodes"]["n1"].as_str().unwrap_or_default().contains("not in this extender's node cache");
    assert!(wait_until(WAIT, gone));
}

/// The extender binds the pods it places and counts their units on their
/// node until the node's annotation does; failures come back with the
/// API server's reason. Against the API-server stand-in, over real HTTP.
#[test]
fn scheduler_extender_binds_and_counts_a_bound_pod_until_the_node_does() {
    let (_tmp, _rt, api, kubeconfig) = api_stand_in();
    let pod = |name: &str, units: u32| {
        let mut p = pod_asking(units);
        p["metadata"]["name"] = name.into();
        p["metadata"]["uid"] = format!("uid-{name}").into();
        p
    };
    // p1 is stored asking 2, though its filter asks 8: a bind that read
    // the pod instead of using what its filter saw would assume 2.
    for (name, units) in [("p1", 2), ("p2", 8), ("p3", 12), ("p4", 11)] {
        api.pods.lock().unwrap().insert(name.into(), pod(name, units));
    }
    let node_named = |name: &str, free: &[u32], pods: &[(&str, u32)]| {
        serde_json::json!({"metadata": {"name": name, "annotations": {egpu_k8s::annotation::ANNOTATION: gpus_annotation(free, pods)}}})
    };
    let node = |free: &[u32], pods: &[(&str, u32)]| node_named("n1", free, pods);
    let sched = Scheduler::start_with(Some(&kubeconfig));
    let filter = |name: &str, units: u32, n: &serde_json::Value| -> serde_json::Value {
        let (code, body) = post(&sched.1, "/filter", &serde_json::json!({"Pod": pod(name, units), "Nodes": {"items": [n]}}).to_string());
        assert_eq!(code, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    };
    let passes = |r: &serde_json::Value| r["Nodes"]["items"].as_array().unwrap().len() == 1;
    let bind_to = |name: &str, node: &str| -> String {
        let (code, body) = post(&sched.1, "/bind", &serde_json::json!({"PodName": name, "PodNamespace": "default", "PodUID": format!("uid-{name}"), "Node": node}).to_string());
        assert_eq!(code, 200, "{body}");
        serde_json::from_str::<serde_json::Value>(&body).unwrap()["Error"].as_str().unwrap().to_string()
    };
    let bind = |name: &str| bind_to(name, "n1");

    // p1 (8 units) fits GPU 0's 10 and is bound there, as the scheduler's
    // own binder would: a Binding to the Node, with the pod's UID.
    let stale = node(&[10, 4], &[]);
    assert!(passes(&filter("p1", 8, &stale)));
    assert_eq!(bind("p1"), "");
    let b = api.bindings.lock().unwrap()[0].clone();
    assert_eq!((b["metadata"]["name"].as_str(), b["metadata"]["uid"].as_str(), b["target"]["kind"].as_str(), b["target"]["name"].as_str()), (Some("p1"), Some("uid-p1"), Some("Node"), Some("n1")), "{b}");
    // The annotation has not caught up: p2 (8) is refused anyway, as p1 took
    // 8 of GPU 0's 10.
    let r = filter("p2", 8, &stale);
    assert!(!passes(&r), "{r}");
    assert!(r["FailedNodes"]["n1"].as_str().unwrap().contains("the most free on one GPU is 4"), "{r}");
    // The annotation now counts p1 (and GPU 1 was freed meanwhile): p1's
    // assumption ends, so p3 (12) fits GPU 1.
    let caught_up = node(&[2, 12], &[("default/p1", 8)]);
    assert!(passes(&filter("p3", 12, &caught_up)));
    // A pod this process never filtered (a restart, another replica): its
    // demand is read from the API server. p4's 11 then take GPU 1, and p3
    // no longer fits.
    assert_eq!(bind("p4"), "");
    let r = filter("p3", 12, &caught_up);
    assert!(r["FailedNodes"]["n1"].as_str().unwrap().contains("the most free on one GPU is 2"), "{r}");
    // A repeated bind to the node the pod is on (an answer lost) is bound.
    assert_eq!(bind("p1"), "");
    // A refusal carries the API server's reason, and assumes nothing: the
    // pod's 8 units are not held on n2.
    let e = bind_to("p1", "n2");
    assert!(e.contains("refused it (409)") && e.contains("already assigned to node"), "{e}");
    assert!(passes(&{
        let (_, body) = post(&sched.1, "/filter", &serde_json::json!({"Pod": pod("p2", 8), "Nodes": {"items": [node_named("n2", &[8], &[])]}}).to_string());
        serde_json::from_str::<serde_json::Value>(&body).unwrap()
    }));
    let e = bind("nope");
    assert!(e.contains("cannot read the pod") && e.contains("not found"), "{e}");
    // What is not a Kubernetes name never reaches the API's URLs.
    let e = bind("../../x");
    assert!(e.contains("is not a Kubernetes name") && e.contains("'../../x' (pod)"), "{e}");
    let (code, body) = post(&sched.1, "/bind", r#"{"PodName": 3}"#);
    assert_eq!(code, 400);
    assert!(body.contains("not an ExtenderBindingArgs JSON body"), "{body}");
    assert_eq!(api.bindings.lock().unwrap().len(), 2, "p1 and p4");
    // Binds by outcome: p1, p4 and p1's repeat bound; the other node, the
    // missing pod and the bad name refused (4xx); none failed. The bad
    // body is a bind request error.
    let (_, _, m) = http_get(&sched.1, "/metrics");
    let binds = |o: &str| sample(&m, &format!("egpu_extender_binds_total{{outcome=\"{o}\"}}"));
    assert_eq!((binds("bound"), binds("refused"), binds("failed")), (Some(3.0), Some(3.0), None), "{m}");
    assert_eq!(sample(&m, "egpu_extender_requests_total{verb=\"bind\",outcome=\"error\"}"), Some(4.0), "{m}");
    // A restarted extender (or a new leader's) counts the pods bound before
    // it that are still pending, before it answers: p1 (2 units, as the
    // API server has it) and p4 (11) on n1 leave at most 5 on one GPU.
    let restarted = Scheduler::start_with(Some(&kubeconfig));
    let on = |sched: &Scheduler, units: u32, n: &serde_json::Value| -> serde_json::Value {
        let (_, body) = post(&sched.1, "/filter", &serde_json::json!({"Pod": pod("p3", units), "Nodes": {"items": [n]}}).to_string());
        serde_json::from_str(&body).unwrap()
    };
    let r = on(&restarted, 12, &node(&[16, 4], &[]));
    assert!(r["FailedNodes"]["n1"].as_str().unwrap_or_default().contains("the most free on one GPU is 5"), "{r}");
    // Counted by the node: dropped.
    assert!(passes(&on(&restarted, 12, &node(&[16, 4], &[("default/p1", 2), ("default/p4", 11)]))));
    // With --no-bind it says so, and what to do.
    let offline = Scheduler::start();
    let (_, body) = post(&offline.1, "/bind", &serde_json::json!({"PodName": "p2", "PodNamespace": "default", "PodUID": "uid-p2", "Node": "n1"}).to_string());
    assert!(body.contains("--no-bind") && body.contains("bindVerb"), "{body}");
    // Without API access and without --no-bind it does not start.
    let o = clean("egpu-scheduler").args(["--listen", "127.0.0.1:0"]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("no API access") && err.contains("--no-bind"), "{err}");
}

/// When the kubelet has just restarted, its list may be incomplete: a slice
/// missing from it is kept for the whole grace period, its memory reserved.
/// When the list is settled, a slice whose container has gone is swept
/// within a tenth of the grace period, so its memory is not held back.
#[test]
fn a_slice_outlives_a_restarting_kubelets_empty_list_and_goes_soon_after_its_pod() {
    const GRACE: Duration = Duration::from_secs(20);
    let mut rig = Rig::start(&format!("{}s", GRACE.as_secs()));
    let reg = rig.rt.block_on(async { tokio::time::timeout(WAIT, rig.registered.recv()).await }).expect("no registration").unwrap();
    let sock = rig.kdir.join("device-plugins").join(&reg.endpoint);
    let (ids, stream) = rig.rt.block_on(async {
        let mut c = connect(&sock).await;
        let mut stream = c.list_and_watch(dp::Empty {}).await.unwrap().into_inner();
        let all = until(&mut stream, "32 devices", |d| d.len() == 32).await;
        let ids: Vec<String> = all[..4].iter().map(|d| d.id.clone()).collect();
        rig.pods.lock().unwrap().push(holder("a", &ids));
        c.allocate(dp::AllocateRequest { container_requests: vec![dp::ContainerAllocateRequest { devices_ids: ids.clone() }] }).await.unwrap();
        (ids, stream)
    });
    let slice = egpu_k8s::tokens::slice_name(&ids);
    let gpu0 = ids[0].rsplit_once('_').unwrap().0.to_string();
    assert!(wait_until(WAIT, || rig.free() == Some(vec![12, 16])), "{:?}", rig.annotation());

    // The kubelet restarts: the socket goes, the plugin registers again, and
    // the kubelet lists nothing yet. The refresh that first sees the empty
    // list has run once the kubelet is told that 4 other units of GPU 0 are
    // not to be promised (the slice still holds its memory in egpud).
    std::fs::remove_file(&sock).unwrap();
    rig.pods.lock().unwrap().clear();
    rig.rt.block_on(async { tokio::time::timeout(WAIT, rig.registered.recv()).await }).expect("no second registration").unwrap();
    let registered_again = std::time::Instant::now();
    let mut stream = rig.rt.block_on(async {
        drop(stream);
        let mut c = connect(&sock).await;
        let mut stream = c.list_and_watch(dp::Empty {}).await.unwrap().into_inner();
        let d = until(&mut stream, "4 reserved", |d| unhealthy(d).len() == 4).await;
        assert!(unhealthy(&d).iter().all(|id| id.starts_with(&gpu0)), "{:?}", unhealthy(&d));
        stream
    });
    // Past the settled wait (a tenth of the grace period), still there: the
    // time is the property under test, so this waits on the clock.
    std::thread::sleep(GRACE / 10 * 2 + Duration::from_secs(1));
    assert!(rig.node.slices().iter().any(|s| s["name"] == slice.as_str()), "swept while the kubelet's list was unsettled; plugin log:\n{}", rig.plugin_log());
    assert!(rig.cdi.join(format!("egpu.io-slice_{slice}.json")).exists());
    // The kubelet has synced: the container is listed again, nothing reserved.
    rig.pods.lock().unwrap().push(holder("a", &ids));
    rig.rt.block_on(until(&mut stream, "nothing reserved", |d| unhealthy(d).is_empty()));

    // Settled (a grace period after the registration; this waits on the
    // clock, the property under test): the pod ends, and its slice goes
    // well within the grace period, its reserve with it.
    assert!(wait_until(GRACE + WAIT, || registered_again.elapsed() > GRACE + Duration::from_secs(1)));
    rig.pods.lock().unwrap().clear();
    let gone_at = std::time::Instant::now();
    assert!(wait_until(WAIT, || rig.node.slices().is_empty()), "not swept; plugin log:\n{}", rig.plugin_log());
    assert!(gone_at.elapsed() < GRACE, "swept only after {:?}", gone_at.elapsed());
    rig.rt.block_on(until(&mut stream, "nothing reserved", |d| unhealthy(d).is_empty()));
    assert!(wait_until(WAIT, || rig.free() == Some(vec![16, 16])), "{:?}", rig.annotation());
}

/// A kubelet that restarted and cannot reach the API server lists none of
/// the pods the API server gave it, for as long as that lasts, yet it
/// restarts their containers with the units its device checkpoint names.
/// Past the grace period, a slice the checkpoint names is kept and one it
/// does not name (its pod ended before the restart) is swept; once the
/// kubelet lists the plugin's own pod again, a slice whose pod ended
/// meanwhile is swept.
#[test]
fn a_kubelet_without_the_api_server_keeps_the_slices_its_checkpoint_names() {
    const GRACE: Duration = Duration::from_secs(3);
    let mut rig = Rig::start_with(&format!("{}s", GRACE.as_secs()), &["--pod-name", "egpu-node-x", "--pod-namespace", "egpu-system"]);
    let own = pr::PodResources { name: "egpu-node-x".into(), namespace: "egpu-system".into(), containers: vec![] };
    rig.pods.lock().unwrap().push(own.clone());
    let reg = rig.rt.block_on(async { tokio::time::timeout(WAIT, rig.registered.recv()).await }).expect("no registration").unwrap();
    let sock = rig.kdir.join("device-plugins").join(&reg.endpoint);
    let (a, b) = rig.rt.block_on(async {
        let mut c = connect(&sock).await;
        let mut stream = c.list_and_watch(dp::Empty {}).await.unwrap().into_inner();
        let all = until(&mut stream, "32 devices", |d| d.len() == 32).await;
        let a: Vec<String> = all[..4].iter().map(|d| d.id.clone()).collect();
        let b: Vec<String> = all[16..18].iter().map(|d| d.id.clone()).collect();
        for (pod, ids) in [("a", &a), ("b", &b)] {
            rig.pods.lock().unwrap().push(holder(pod, ids));
            c.allocate(dp::AllocateRequest { container_requests: vec![dp::ContainerAllocateRequest { devices_ids: ids.clone() }] }).await.unwrap();
        }
        (a, b)
    });
    let slice_a = egpu_k8s::tokens::slice_name(&a);
    let log_path = rig.tmp.path().join("plugin.log");
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let synced = || sample(&scrape_logged(log), "egpu_device_plugin_kubelet_synced");
    assert!(wait_until(WAIT, || synced() == Some(1.0)), "{:?}", synced());
    assert_eq!(rig.node.slices().len(), 2);

    // The kubelet restarts without the API server: it registers the plugin
    // again and lists no pod (not the plugin's own either). Its checkpoint,
    // as it wrote it, still names pod a's units (with another resource's
    // and an empty entry), not pod b's: b ended before the restart. First
    // the file is damaged: nothing can be swept then, and the log says why.
    let checkpoint = rig.kdir.join("device-plugins").join(egpu_k8s::checkpoint::FILE);
    std::fs::write(&checkpoint, "{\"Data\":{\"PodDeviceEntries\":[").unwrap();
    std::fs::remove_file(&sock).unwrap();
    rig.pods.lock().unwrap().clear();
    rig.rt.block_on(async { tokio::time::timeout(WAIT, rig.registered.recv()).await }).expect("no second registration").unwrap();
    let mut stream = rig.rt.block_on(async { connect(&sock).await.list_and_watch(dp::Empty {}).await.unwrap().into_inner() });
    assert!(wait_until(WAIT, || log().contains("does not parse")), "{}", log());
    assert!(wait_until(WAIT, || synced() == Some(0.0)), "{:?}", synced());
    // Twice the grace period with the damaged file (the time is the
    // property under test): both slices stay, b's too.
    std::thread::sleep(GRACE * 2 + Duration::from_secs(1));
    assert_eq!(rig.node.slices().len(), 2, "swept while the checkpoint could not be read; plugin log:\n{}", log());
    assert_eq!(sample(&scrape_logged(log), "egpu_device_plugin_swept_slices_total"), Some(0.0));
    let entries = serde_json::json!([
        {"PodUID": "uid-a", "ContainerName": "main", "ResourceName": RESOURCE, "DeviceIDs": {"-1": a}, "AllocResp": "AA=="},
        {"PodUID": "uid-c", "ContainerName": "main", "ResourceName": "nvidia.com/gpu", "DeviceIDs": {"0": [b[0]]}, "AllocResp": "AA=="},
        {"PodUID": "uid-d", "ContainerName": "main", "ResourceName": RESOURCE, "DeviceIDs": {"0": null}, "AllocResp": null},
    ]);
    let tmp = checkpoint.with_extension("tmp");
    std::fs::write(&tmp, serde_json::json!({"Data": {"PodDeviceEntries": entries, "RegisteredDevices": {RESOURCE: []}}, "Checksum": 1}).to_string()).unwrap();
    std::fs::rename(&tmp, &checkpoint).unwrap();

    // Now b's 2 units are reserved (its slice waits for the sweep), a's are
    // not: the kubelet holds them. Past the grace period b's slice goes
    // (missing for all of it, and that old) and its reserve with it; a's
    // slice is kept. Had a's been due, the same sweep would have deleted
    // it, and the reserve is lifted only by a refresh after that sweep.
    let gpu1 = b[0].rsplit_once('_').unwrap().0.to_string();
    let d = rig.rt.block_on(until(&mut stream, "b's 2 units reserved", |d| unhealthy(d).len() == 2));
    assert!(unhealthy(&d).iter().all(|id| id.starts_with(&gpu1)), "{:?}", unhealthy(&d));
    rig.rt.block_on(until(&mut stream, "b's reserve lifted", |d| unhealthy(d).is_empty()));
    let names: Vec<String> = rig.node.slices().iter().map(|s| s["name"].as_str().unwrap().to_string()).collect();
    assert_eq!(names, [slice_a], "b's slice swept, a's kept; plugin log:\n{}", log());
    assert!(wait_until(WAIT, || log().contains("has not listed this plugin's pod egpu-system/egpu-node-x")), "{}", log());
    // (The sweep counts a slice once egpud has answered its delete: wait.)
    let swept = || sample(&scrape_logged(log), "egpu_device_plugin_swept_slices_total");
    assert!(wait_until(WAIT, || swept() == Some(1.0)), "{:?}", swept());
    assert_eq!(synced(), Some(0.0));

    // The API server is back: the kubelet lists its pods, pod a ended
    // meanwhile. Its slice goes, though the checkpoint still names it (after
    // the whole grace period: the kubelet may list its pods one by one).
    rig.pods.lock().unwrap().push(own);
    assert!(wait_until(WAIT, || rig.node.slices().is_empty()), "a's slice not swept; plugin log:\n{}", log());
    assert_eq!(synced(), Some(1.0));
    assert!(log().contains("the kubelet lists its pods again"), "{}", log());
    assert!(!log().contains("panicked"), "{}", log());
}

/// A container that asks for more than one GPU holds gets whole GPUs: the
/// preferred allocation picks entirely free GPUs, and `Allocate` makes one
/// slice over them (egpud keeps peer access, IPC and NCCL working across a
/// multi-GPU slice). A spread that covers no GPU whole is still refused.
#[test]
fn a_container_larger_than_a_gpu_gets_whole_gpus() {
    let Rig { tmp, cdi, kdir, node, rt, mut registered, pods, api, _plugin } = Rig::start("0s");
    let plugin_log = || std::fs::read_to_string(tmp.path().join("plugin.log")).unwrap_or_default();
    rt.block_on(async {
        let reg = tokio::time::timeout(WAIT, registered.recv()).await.expect("no registration").unwrap();
        let mut c = connect(&kdir.join("device-plugins").join(&reg.endpoint)).await;
        let mut stream = c.list_and_watch(dp::Empty {}).await.unwrap().into_inner();
        let all: Vec<String> = until(&mut stream, "32 healthy", |d| d.len() == 32 && unhealthy(d).is_empty()).await.iter().map(|d| d.id.clone()).collect();
        let ask = |size: i32| dp::PreferredAllocationRequest {
            container_requests: vec![dp::ContainerPreferredAllocationRequest { available_device_i_ds: all.clone(), must_include_device_i_ds: vec![], allocation_size: size }],
        };
        let alloc = |ids: Vec<String>| dp::AllocateRequest { container_requests: vec![dp::ContainerAllocateRequest { devices_ids: ids }] };
        // 20 units: more than a GPU, not whole GPUs. The kubelet's pick
        // spreads, and Allocate says why not.
        let spread = c.get_preferred_allocation(ask(20)).await.unwrap().into_inner().container_responses.remove(0).device_i_ds;
        assert_eq!(spread.len(), 20);
        let e = c.allocate(alloc(spread)).await.unwrap_err();
        assert!(e.message().contains("whole GPUs"), "{}", e.message());
        // 32 units: both GPUs, whole.
        let both = c.get_preferred_allocation(ask(32)).await.unwrap().into_inner().container_responses.remove(0).device_i_ds;
        let mut sorted = both.clone();
        sorted.sort();
        let mut want = all.clone();
        want.sort();
        assert_eq!(sorted, want);
        pods.lock().unwrap().push(holder("big", &both));
        let r = c.allocate(alloc(both.clone())).await.unwrap().into_inner().container_responses.remove(0);
        let slice = egpu_k8s::tokens::slice_name(&both);
        assert_eq!(r.cdi_devices.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(), [format!("egpu.io/slice={slice}")]);
        let s = node.slice(&slice);
        let devs = s["devices"].as_array().unwrap();
        assert_eq!(devs.iter().map(|d| (d["device"].as_u64().unwrap(), d["memory_limit_bytes"].as_u64().unwrap(), d["compute_share_percent"].as_f64().unwrap())).collect::<Vec<_>>(), [(0, 16 << 30, 100.0), (1, 16 << 30, 100.0)], "{s}");
        assert!(spec_path(&cdi, &slice).exists());
        // A repeated Allocate (the kubelet's retry), in another order: the same slice.
        let mut again = both.clone();
        again.reverse();
        let r2 = c.allocate(alloc(again)).await.unwrap().into_inner().container_responses.remove(0);
        assert_eq!(r2.cdi_devices, r.cdi_devices);
        assert_eq!(node.slices().len(), 1);
        // The node has nothing left, and names the pod with its 32 units.
        assert!(wait_until(WAIT, || api.free() == Some(vec![0, 0])), "annotation {:?}; plugin log:\n{}", api.annotation(), plugin_log());
        assert_eq!(api.annotation().unwrap().pods, Some([("default/big".to_string(), 32)].into()));
    });
    assert!(!plugin_log().contains("panicked"), "{}", plugin_log());
}

/// The device plugin of `node`, with a kubelet directory under `dir` where
/// no kubelet answers, its stderr to `stderr`; and the socket it serves.
fn plugin_without_kubelet(node: &Node, dir: &Path, extra: &[&str], stderr: Stdio) -> (Plugin, PathBuf) {
    let kdir = dir.join("kubelet");
    std::fs::create_dir_all(kdir.join("device-plugins")).unwrap();
    let child = clean("egpu-device-plugin").arg("--socket").arg(node.socket()).arg("--kubelet-dir").arg(&kdir).args(["--poll", "50ms"]).args(extra).stdout(Stdio::null()).stderr(stderr).spawn().unwrap();
    (Plugin(child), kdir.join("device-plugins/egpu-gpu-memory.sock"))
}

/// SIGTERM while the kubelet is not answering: a clean exit, no panic.
#[test]
fn device_plugin_stops_cleanly_before_it_has_registered() {
    let tmp = tempfile::tempdir().unwrap();
    let node = Node::start("1x16GiB");
    let log = tmp.path().join("plugin.log");
    let (mut plugin, sock) = plugin_without_kubelet(&node, tmp.path(), &[], std::fs::File::create(&log).unwrap().into());
    // It serves, and retries registering with a kubelet that is not there.
    let text = || std::fs::read_to_string(&log).unwrap_or_default();
    assert!(wait_until(WAIT, || sock.exists() && text().contains("retrying")), "{}", text());
    assert!(plugin.terminate().success(), "{}", text());
    assert!(!text().contains("panicked"), "{}", text());
    assert!(!sock.exists());
}

/// Their stderr a pipe nobody reads any more (a log collector that went
/// away): the plugin and the extender keep serving and stop cleanly. Every
/// log line fails to write from the first one on; until they dropped such
/// lines, tracing reported the failure on the same stderr, which panicked.
#[test]
fn daemons_outlive_a_stderr_whose_reader_is_gone() {
    let closed = || {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        writer
    };
    let tmp = tempfile::tempdir().unwrap();
    let node = Node::start("1x16GiB");
    let (mut plugin, sock) = plugin_without_kubelet(&node, tmp.path(), &["--log", "debug"], closed().into());
    let mut exited = None;
    assert!(wait_until(WAIT, || {
        exited = plugin.0.try_wait().unwrap();
        sock.exists() || exited.is_some()
    }));
    assert_eq!(exited, None, "the plugin exited with its stderr closed");
    assert!(plugin.terminate().success());

    let mut child = clean("egpu-scheduler").args(["--no-bind", "--listen", "127.0.0.1:0", "--log", "debug"]).stdout(Stdio::piped()).stderr(closed()).spawn().unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line).unwrap();
    let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?}: {e}"));
    let mut sched = Plugin(child);
    assert_eq!(http_get(v["addr"].as_str().unwrap(), "/healthz").0, 200);
    assert!(sched.terminate().success());
}

/// Bad flags: exit 2 with what was wrong and what to give instead.
#[test]
fn kubernetes_binaries_refuse_bad_flags_with_the_reason() {
    let run = |bin: &str, args: &[&str]| {
        let o = clean(bin).args(args).output().unwrap();
        (o.status.code(), String::from_utf8_lossy(&o.stderr).into_owned())
    };
    for (bin, args, needle) in [
        ("egpu-device-plugin", &["--memory-unit", "4KiB"][..], "below 1 MiB"),
        ("egpu-device-plugin", &["--memory-unit", "lots"][..], "is not a size"),
        ("egpu-device-plugin", &["--resource", "gpu-memory"][..], "needs a domain"),
        ("egpu-device-plugin", &["--resource", "egpu.io/a b"][..], "its name 'a b'"),
        ("egpu-device-plugin", &["--resource", "kubernetes.io/gpu"][..], "kubernetes.io domain"),
        ("egpu-device-plugin", &["--node-name", "Node_1"][..], "is not a node name"),
        ("egpu-scheduler", &["--resource", ""][..], "needs a domain"),
        ("egpu-scheduler", &["--resource", "egpu.io/gpu memory"][..], "its name 'gpu memory'"),
        ("egpu-device-plugin", &["--gpu-cdi-kind", "nvidia.com/gpu=0"][..], "not a CDI kind"),
        ("egpu-device-plugin", &["--poll", "0s"][..], "--poll and --pod-poll must be greater than 0"),
        ("egpu-device-plugin", &["--pod-poll", "0s"][..], "--poll and --pod-poll must be greater than 0"),
        ("egpu-device-plugin", &["--log", "x=["][..], "give a level"),
        ("egpu-device-plugin", &["--metrics-listen", "9402"][..], "invalid value '9402' for '--metrics-listen"),
        ("egpu-scheduler", &["--listen", "localhost"][..], "invalid value 'localhost' for '--listen"),
        ("egpu-scheduler", &["--log", "x=["][..], "give a level"),
        ("egpu-scheduler", &["--assume-ttl", "0s"][..], "must be more than 0"),
        ("egpu-scheduler", &["--listen", "0.0.0.0:0"][..], "not a loopback address"),
    ] {
        let (code, err) = run(bin, args);
        assert_eq!(code, Some(2), "{bin} {args:?}: {err}");
        assert!(err.contains(needle), "{bin} {args:?}: {err}");
    }
}
