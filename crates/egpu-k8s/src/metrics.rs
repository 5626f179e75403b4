//! The scheduler extender's Prometheus metrics (`GET /metrics`, OpenMetrics
//! text, `prometheus-client`): requests by verb and outcome with their
//! latency, what filters decided per node, binds by outcome, and, read at
//! each scrape, the live assumptions and the node cache. Names and labels
//! are listed in `docs/metrics.md`.

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

/// The extender's metrics.
pub struct ExtenderMetrics {
    registry: Mutex<Registry>,
    requests: Family<Labels, Counter>,
    seconds: Family<Labels, Histogram, fn() -> Histogram>,
    nodes: Family<Labels, Counter>,
    binds: Family<Labels, Counter>,
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
    pub fn bind(&self, outcome: &'static str) {
        self.binds.get_or_create(&vec![("outcome", outcome)]).inc();
    }

    /// The text of a scrape, with the gauges read now.
    pub fn render(&self, assumed: usize, cache: Option<(usize, bool)>) -> String {
        self.assumed.set(i64::try_from(assumed).unwrap_or(i64::MAX));
        let (nodes, synced) = cache.unwrap_or((0, false));
        self.cache_nodes.set(i64::try_from(nodes).unwrap_or(i64::MAX));
        self.cache_synced.set(i64::from(synced));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry.lock().expect("registry lock")).expect("writing to a String");
        out
    }
}
