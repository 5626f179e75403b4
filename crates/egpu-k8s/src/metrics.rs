//! Prometheus metrics (`GET /metrics`, OpenMetrics text,
//! `prometheus-client`) of the scheduler extender and of the two kubelet
//! plugins.
//! The extender's: requests by verb and outcome with their latency, what
//! filters decided per node, binds by outcome, and, read at each scrape,
//! the live assumptions and the node cache. The DRA plugin's: claims
//! prepared and unprepared by outcome with their latency, ResourceSlice
//! writes, live resizes, and, read at each scrape, the claims prepared,
//! egpud's reachability and the resizes that cannot be applied. The device
//! plugin's: containers allocated by outcome with their latency,
//! registrations, slices swept, live resizes, and, read at each scrape, the
//! devices advertised by health and whether egpud and the kubelet's
//! pod-resources answered the last refresh. Names and labels are listed in
//! `docs/metrics.md`.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::Mutex;
use std::time::Duration;

type Labels = Vec<(&'static str, &'static str)>;

/// Upper bounds of the request-latency buckets: 0.5 ms to ~4 s.
fn latency() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 14))
}

/// `GET /metrics` (what `render` returns at each scrape) and `GET /healthz`.
pub fn router(render: impl Fn() -> String + Clone + Send + Sync + 'static) -> axum::Router {
    use axum::response::IntoResponse;
    let metrics = move || {
        let text = render();
        async move { ([(axum::http::header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text).into_response() }
    };
    axum::Router::new().route("/metrics", axum::routing::get(metrics)).route("/healthz", axum::routing::get(|| async { "ok" }))
}

/// Serves [`router`] on `addr` (`--metrics-listen`) from `rt`, and logs
/// the bound address (port 0 resolved); the error says which flag's
/// address could not be bound.
pub fn serve(rt: &tokio::runtime::Runtime, addr: std::net::SocketAddr, render: impl Fn() -> String + Clone + Send + Sync + 'static) -> Result<std::net::SocketAddr, String> {
    let listener = rt.block_on(tokio::net::TcpListener::bind(addr)).map_err(|e| format!("cannot listen on {addr} (--metrics-listen): {e}"))?;
    let bound = listener.local_addr().unwrap_or(addr);
    tracing::info!("serving metrics at http://{bound}/metrics");
    rt.spawn(async move {
        if let Err(e) = axum::serve(listener, router(render)).await {
            tracing::warn!("the metrics server stopped: {e}");
        }
    });
    Ok(bound)
}

fn encode(registry: &Mutex<Registry>) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry.lock().expect("registry lock")).expect("writing to a String");
    out
}

/// The extender's metrics.
pub struct ExtenderMetrics {
    registry: Mutex<Registry>,
    requests: Family<Labels, Counter>,
    seconds: Family<Labels, Histogram, fn() -> Histogram>,
    nodes: Family<Labels, Counter>,
    binds: Family<Labels, Counter>,
    hints: Family<Labels, Counter>,
    preempt_nodes: Family<Labels, Counter>,
    assumed: Gauge,
    cache_nodes: Gauge,
    cache_synced: Gauge,
}

impl std::fmt::Debug for ExtenderMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ExtenderMetrics")
    }
}

impl Default for ExtenderMetrics {
    fn default() -> Self {
        let m = ExtenderMetrics {
            registry: Mutex::new(Registry::default()),
            requests: Family::default(),
            seconds: Family::new_with_constructor(latency as fn() -> Histogram),
            nodes: Family::default(),
            binds: Family::default(),
            hints: Family::default(),
            preempt_nodes: Family::default(),
            assumed: Gauge::default(),
            cache_nodes: Gauge::default(),
            cache_synced: Gauge::default(),
        };
        {
            let mut r = m.registry.lock().expect("registry lock");
            r.register("egpu_extender_requests", "Requests answered, by verb (filter, prioritize, bind, preempt) and outcome (ok, error)", m.requests.clone());
            r.register("egpu_extender_request_seconds", "Time to answer a request, parse to answer, by verb", m.seconds.clone());
            r.register(
                "egpu_extender_filter_nodes",
                "Nodes filters decided on, by result: passed, failed (too little free on one GPU, or too few whole free GPUs), unresolvable (no usable annotation, not in the node cache, or no fit even with every GPU of the node free)",
                m.nodes.clone(),
            );
            r.register("egpu_extender_binds", "Binds, by outcome: bound, refused (the request, the pod or a 4xx answer said no), failed (anything else: no answer in time, a server error, no API access)", m.binds.clone());
            r.register(
                "egpu_extender_hints",
                "GPU hints of binds (egpu.io/gpu-hint on the pod), by outcome: written, failed (the pod's patch failed or timed out; the pod is bound without it, and the plugin's best fit places it), none (no container fits one GPU, or the node is not in the node cache)",
                m.hints.clone(),
            );
            r.register(
                "egpu_extender_preempt_nodes",
                "Candidate nodes of preemptions, by result: kept (the victims make room on one GPU, or whole GPUs, for each container), dropped (they would not, or the node is not in the node cache or its annotation cannot be read)",
                m.preempt_nodes.clone(),
            );
            r.register("egpu_extender_assumed_pods", "Pods bound, within the assume TTL, whose units the extender counts on their node until the node's annotation does", m.assumed.clone());
            r.register("egpu_extender_node_cache_nodes", "Nodes in the extender's node cache", m.cache_nodes.clone());
            r.register("egpu_extender_node_cache_synced", "1 once a list has filled the node cache (0 without one, or before)", m.cache_synced.clone());
        }
        m
    }
}

/// Adds each count to its `result` in `family`.
fn count_results(family: &Family<Labels, Counter>, counts: &[(&'static str, usize)]) {
    for &(result, n) in counts {
        family.get_or_create(&vec![("result", result)]).inc_by(n as u64);
    }
}

impl ExtenderMetrics {
    /// One request of `verb` answered in `took`.
    pub fn request(&self, verb: &'static str, ok: bool, took: Duration) {
        self.requests.get_or_create(&vec![("verb", verb), ("outcome", if ok { "ok" } else { "error" })]).inc();
        self.seconds.get_or_create(&vec![("verb", verb)]).observe(took.as_secs_f64());
    }

    /// A filter's decisions.
    pub fn filtered(&self, passed: usize, failed: usize, unresolvable: usize) {
        count_results(&self.nodes, &[("passed", passed), ("failed", failed), ("unresolvable", unresolvable)]);
    }

    /// A preemption's decisions on its candidate nodes.
    pub fn preempted(&self, kept: usize, dropped: usize) {
        count_results(&self.preempt_nodes, &[("kept", kept), ("dropped", dropped)]);
    }

    /// A bind's outcome: `bound`, `refused` or `failed`.
    /// A bind's GPU hint: written, failed or none.
    pub fn hint(&self, outcome: &'static str) {
        self.hints.get_or_create(&vec![("outcome", outcome)]).inc();
    }

    pub fn bind(&self, outcome: &'static str) {
        self.binds.get_or_create(&vec![("outcome", outcome)]).inc();
    }

    /// The text of a scrape, with the gauges read now.
    pub fn render(&self, assumed: usize, cache: Option<(usize, bool)>) -> String {
        self.assumed.set(i64::try_from(assumed).unwrap_or(i64::MAX));
        let (nodes, synced) = cache.unwrap_or((0, false));
        self.cache_nodes.set(i64::try_from(nodes).unwrap_or(i64::MAX));
        self.cache_synced.set(i64::from(synced));
        encode(&self.registry)
    }
}

/// The DRA plugin's metrics.
pub struct DraMetrics {
    registry: Mutex<Registry>,
    claims: Family<Labels, Counter>,
    seconds: Family<Labels, Histogram, fn() -> Histogram>,
    slice_writes: Family<Labels, Counter>,
    resizes: Counter,
    prepared: Gauge,
    egpud_up: Gauge,
    pods_synced: Gauge,
    resize_problems: Gauge,
}

impl std::fmt::Debug for DraMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DraMetrics")
    }
}

impl Default for DraMetrics {
    fn default() -> Self {
        let m = DraMetrics {
            registry: Mutex::new(Registry::default()),
            claims: Family::default(),
            seconds: Family::new_with_constructor(latency as fn() -> Histogram),
            slice_writes: Family::default(),
            resizes: Counter::default(),
            prepared: Gauge::default(),
            egpud_up: Gauge::default(),
            pods_synced: Gauge::default(),
            resize_problems: Gauge::default(),
        };
        {
            let mut r = m.registry.lock().expect("registry lock");
            r.register("egpu_dra_claims", "Claims the kubelet asked to prepare or unprepare, by verb (prepare, unprepare) and outcome (ok, error: the answer for that claim carried an error)", m.claims.clone());
            r.register("egpu_dra_claim_seconds", "Time to prepare or unprepare one claim, by verb", m.seconds.clone());
            r.register("egpu_dra_resourceslice_writes", "Writes of the node's ResourceSlice, by outcome: created, updated (spec changed), failed (the write, the reads before it, or a timeout)", m.slice_writes.clone());
            r.register("egpu_dra_resizes", "Live resizes of a claim's slice (one GPU each) that its pod's annotations asked and egpud made", m.resizes.clone());
            r.register("egpu_dra_prepared_claims", "Claims prepared on this node (slices the plugin made and still resizes)", m.prepared.clone());
            r.register("egpu_dra_egpud_up", "1 when the last refresh read egpud, else 0: claims cannot be prepared and the ResourceSlice stays as last published", m.egpud_up.clone());
            r.register("egpu_dra_pods_synced", "1 once the node's pods have been listed (pod annotations resize slices only then)", m.pods_synced.clone());
            r.register(
                "egpu_dra_resize_problems",
                "Slices whose pod's annotations cannot be applied now (an annotation that does not parse, a cap below the guarantee, egpud's refusal); the plugin's log says why",
                m.resize_problems.clone(),
            );
        }
        m
    }
}

impl DraMetrics {
    /// One claim of a `verb` call, answered in `took`.
    pub fn claim(&self, verb: &'static str, ok: bool, took: Duration) {
        self.claims.get_or_create(&vec![("verb", verb), ("outcome", if ok { "ok" } else { "error" })]).inc();
        self.seconds.get_or_create(&vec![("verb", verb)]).observe(took.as_secs_f64());
    }

    /// A write of the ResourceSlice: `created`, `updated` or `failed`.
    pub fn slice_write(&self, outcome: &'static str) {
        self.slice_writes.get_or_create(&vec![("outcome", outcome)]).inc();
    }

    /// A resize egpud made.
    pub fn resized(&self) {
        self.resizes.inc();
    }

    /// Whether the last refresh read egpud.
    pub fn egpud_up(&self, up: bool) {
        self.egpud_up.set(i64::from(up));
    }

    /// The text of a scrape, with the gauges read now.
    pub fn render(&self, prepared: usize, pods_synced: bool, resize_problems: usize) -> String {
        self.prepared.set(i64::try_from(prepared).unwrap_or(i64::MAX));
        self.pods_synced.set(i64::from(pods_synced));
        self.resize_problems.set(i64::try_from(resize_problems).unwrap_or(i64::MAX));
        encode(&self.registry)
    }
}

/// The device plugin's metrics.
pub struct DevicePluginMetrics {
    registry: Mutex<Registry>,
    allocations: Family<Labels, Counter>,
    seconds: Histogram,
    registrations: Counter,
    swept: Counter,
    resizes: Counter,
    hints: Family<Labels, Counter>,
    devices: Family<Labels, Gauge>,
    egpud_up: Gauge,
    pod_resources_up: Gauge,
    kubelet_synced: Gauge,
}

impl std::fmt::Debug for DevicePluginMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DevicePluginMetrics")
    }
}

impl Default for DevicePluginMetrics {
    fn default() -> Self {
        let m = DevicePluginMetrics {
            registry: Mutex::new(Registry::default()),
            allocations: Family::default(),
            seconds: latency(),
            registrations: Counter::default(),
            swept: Counter::default(),
            resizes: Counter::default(),
            hints: Family::default(),
            devices: Family::default(),
            egpud_up: Gauge::default(),
            pod_resources_up: Gauge::default(),
            kubelet_synced: Gauge::default(),
        };
        {
            let mut r = m.registry.lock().expect("registry lock");
            r.register(
                "egpu_device_plugin_allocations",
                "Containers of the kubelet's Allocate calls, by outcome: ok (a slice made, or found), error (refused, e.g. units on two GPUs or egpud down; the call stops there, and its later containers are not counted)",
                m.allocations.clone(),
            );
            r.register("egpu_device_plugin_allocation_seconds", "Time to allocate one container (its slice made in egpud, or found)", m.seconds.clone());
            r.register("egpu_device_plugin_registrations", "Registrations the kubelet accepted (one at start, one after each kubelet restart)", m.registrations.clone());
            r.register("egpu_device_plugin_swept_slices", "Slices deleted because no container holds their units any more", m.swept.clone());
            r.register("egpu_device_plugin_resizes", "Live resizes egpud made from a pod's annotations", m.resizes.clone());
            r.register(
                "egpu_device_plugin_preferred_hints",
                "Containers of GetPreferredAllocation calls that fit one GPU, by how the extender's GPU hints (egpu.io/gpu-hint) placed them: followed (on the hinted GPU), stale (hints of that size were pending, but none of their GPUs had the units available: best fit), none (no pending hint of that size: best fit)",
                m.hints.clone(),
            );
            r.register("egpu_device_plugin_devices", "Devices (units of GPU memory) last advertised to the kubelet, by health: healthy, unhealthy (promised elsewhere, or egpud down)", m.devices.clone());
            r.register("egpu_device_plugin_egpud_up", "1 when the last refresh read egpud, else 0 (every device is then advertised unhealthy)", m.egpud_up.clone());
            r.register("egpu_device_plugin_pod_resources_up", "1 when the last refresh read the kubelet's pod-resources list, else 0 (nothing is swept meanwhile)", m.pod_resources_up.clone());
            r.register(
                "egpu_device_plugin_kubelet_synced",
                "1 when the kubelet's last pod-resources list named the plugin's own pod (the kubelet has synced with the API server; always 1 without --pod-name), else 0 (the units in the kubelet's device checkpoint are kept meanwhile)",
                m.kubelet_synced.clone(),
            );
        }
        m
    }
}

impl DevicePluginMetrics {
    /// One container's preference: followed, stale or none.
    pub fn hint(&self, outcome: &'static str) {
        self.hints.get_or_create(&vec![("outcome", outcome)]).inc();
    }

    /// One container of an Allocate call, answered in `took`.
    pub fn allocation(&self, ok: bool, took: Duration) {
        self.allocations.get_or_create(&vec![("outcome", if ok { "ok" } else { "error" })]).inc();
        self.seconds.observe(took.as_secs_f64());
    }

    /// A registration the kubelet accepted.
    pub fn registered(&self) {
        self.registrations.inc();
    }

    /// A slice the sweep deleted.
    pub fn swept(&self) {
        self.swept.inc();
    }

    /// A resize egpud made.
    pub fn resized(&self) {
        self.resizes.inc();
    }

    /// What the last refresh read: egpud, the kubelet's list, and whether
    /// that list was synced (unchanged when it was not read).
    pub fn refreshed(&self, egpud: bool, pod_resources: bool, synced: Option<bool>) {
        self.egpud_up.set(i64::from(egpud));
        self.pod_resources_up.set(i64::from(pod_resources));
        if let Some(s) = synced {
            self.kubelet_synced.set(i64::from(s));
        }
    }

    /// The text of a scrape, with the devices advertised now.
    pub fn render(&self, healthy: usize, unhealthy: usize) -> String {
        for (health, n) in [("healthy", healthy), ("unhealthy", unhealthy)] {
            self.devices.get_or_create(&vec![("health", health)]).set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        encode(&self.registry)
    }
}

