//! The Prometheus endpoint: `GET /metrics` over HTTP (axum), in the
//! OpenMetrics text format (`prometheus-client`). Every scrape reads the
//! slices (limits, usage records) and the compute arbiter's last tick
//! ([`crate::arbiter_loop::ComputeStats`]); nothing is kept between scrapes.
//! Names, types and labels are documented in `docs/metrics.md`.

use crate::agent::Node;
use crate::arbiter_loop::TICK_BUCKETS;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use std::fmt::Error as FmtError;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("metrics server failed")]
    Serve(#[source] std::io::Error),
}

type Labels = Vec<(&'static str, String)>;

/// One family per call of `family`; the samples are pushed with `gauge`/`counter`.
struct Family<'a> {
    name: &'static str,
    help: &'static str,
    kind: MetricType,
    samples: Vec<(Labels, f64)>,
    _p: std::marker::PhantomData<&'a ()>,
}

impl Family<'_> {
    fn new(name: &'static str, help: &'static str, kind: MetricType) -> Self {
        Family { name, help, kind, samples: Vec::new(), _p: std::marker::PhantomData }
    }

    fn push(&mut self, labels: Labels, v: f64) {
        self.samples.push((labels, v));
    }

    fn encode(&self, enc: &mut DescriptorEncoder) -> Result<(), FmtError> {
        let mut d = enc.encode_descriptor(self.name, self.help, None, self.kind)?;
        for (labels, v) in &self.samples {
            let m: MetricEncoder = d.encode_family(labels)?;
            match self.kind {
                MetricType::Counter => ConstCounter::new(*v).encode(m)?,
                _ => ConstGauge::new(*v).encode(m)?,
            }
        }
        Ok(())
    }
}

/// Reads the node at each scrape.
pub struct NodeCollector {
    node: Arc<Node>,
}

impl std::fmt::Debug for NodeCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeCollector").finish_non_exhaustive()
    }
}

fn families(node: &Node) -> Vec<Family<'static>> {
    use MetricType::{Counter, Gauge};
    let mut dev_mem = Family::new("egpu_device_memory_bytes", "Device memory, bytes.", Gauge);
    let mut dev_alloc = Family::new("egpu_device_memory_allocated_bytes", "Sum of the slices' memory limits on the device, bytes.", Gauge);
    let mut dev_share = Family::new("egpu_device_compute_share_allocated_ratio", "Sum of the slices' guaranteed compute shares on the device (0-1).", Gauge);
    let mut info = Family::new("egpu_slice_info", "A slice (value 1) with its id and priority class.", Gauge);
    let mut procs = Family::new("egpu_slice_processes", "Live processes attached to the slice.", Gauge);
    let mut resizes = Family::new("egpu_slice_resizes", "Resizes of the slice since egpud started.", Counter);
    let mut repairs = Family::new("egpu_slice_usage_file_repairs", "Times egpud found the slice's usage file truncated (by a process of the slice) and extended it back, since egpud started.", Counter);
    let mut mem_limit = Family::new("egpu_slice_memory_limit_bytes", "Guaranteed memory of the slice on the device (its hard limit unless it bursts), bytes.", Gauge);
    let mut mem_burst = Family::new("egpu_slice_memory_burst_bytes", "Burst cap of the slice on the device, bytes (0: the slice does not burst).", Gauge);
    let mut mem_granted = Family::new("egpu_slice_memory_granted_bytes", "Memory lent to the slice now from the device's burst pool, above its guarantee, bytes.", Gauge);
    let mut mem_used = Family::new("egpu_slice_memory_used_bytes", "Memory the slice's processes hold on the device, bytes.", Gauge);
    let mut mem_driver = Family::new("egpu_slice_memory_driver_used_bytes", "Memory the driver reports for the slice's live processes on the device, at the memory audit's last reading, bytes (absent when not audited).", Gauge);
    let mut mem_untracked = Family::new("egpu_slice_memory_untracked_bytes", "Memory the driver holds for the slice's processes beyond what they were charged and the audit's slack, in three audits in a row, bytes (counted against the limit with --memory-audit charge).", Gauge);
    let mut dev_unmanaged = Family::new("egpu_device_memory_unmanaged_bytes", "Memory the driver reports on the device for processes in no slice, at the memory audit's last reading, bytes (absent when not audited).", Gauge);
    let mut refused = Family::new("egpu_slice_refused_allocations", "Allocations refused on the device because of the slice's limit.", Counter);
    let mut share = Family::new("egpu_slice_compute_share_ratio", "Guaranteed compute share of the slice on the device (0-1).", Gauge);
    let mut limit = Family::new("egpu_slice_compute_limit_ratio", "Compute cap of the slice on the device (0-1).", Gauge);
    let mut usage = Family::new("egpu_slice_compute_usage_ratio", "Recent GPU time of the slice as a fraction of the device (moving average over ~0.5 s).", Gauge);
    let mut used = Family::new("egpu_slice_compute_used_seconds", "GPU time of the slice on the device since egpud started (device accounting; the hook's measure where there is none).", Counter);
    let mut measured = Family::new("egpu_slice_compute_measured_seconds", "GPU time the slice's processes measured for their launches (consumed_ns).", Counter);
    let mut throttled = Family::new("egpu_slice_compute_throttled_seconds", "Time the slice's processes waited for compute budget, since egpud started.", Counter);
    let mut waits = Family::new("egpu_slice_throttle_waits", "Launches that found the slice's allowance spent.", Counter);
    let mut budget = Family::new("egpu_slice_compute_budget_seconds", "GPU time granted to the slice on the device for the current arbiter period.", Gauge);
    let mut allowance = Family::new("egpu_slice_compute_allowance_seconds", "Cumulative allowance published to the slice (in its measured time).", Gauge);
    let mut hungry = Family::new("egpu_slice_compute_hungry", "1 when the slice wanted more than it got in the last period.", Gauge);
    let mut scale = Family::new("egpu_slice_compute_scale", "Measured/true GPU-time ratio applied to the slice's budget.", Gauge);
    let m = node.slices();
    let alloc = m.allocated();
    for d in &node.inventory.devices {
        let l = vec![("device", d.index.to_string()), ("uuid", d.uuid.clone())];
        dev_mem.push(l.clone(), d.memory_bytes as f64);
        let a = alloc.get(d.index as usize).copied().unwrap_or_default();
        dev_alloc.push(l.clone(), a.memory as f64);
        if let Some(b) = m.unmanaged(d.index) {
            dev_unmanaged.push(l.clone(), b as f64);
        }
        dev_share.push(l, f64::from(a.compute_share_bps) / 1e4);
    }
    let compute = node.compute.snapshot();
    for s in m.slices() {
        let name = s.name().to_string();
        let sl = vec![("slice", name.clone())];
        info.push(vec![("slice", name.clone()), ("id", s.record.id.clone()), ("priority", s.record.spec.priority.to_string())], 1.0);
        procs.push(sl.clone(), s.live_pids().len() as f64);
        resizes.push(sl.clone(), s.resizes as f64);
        repairs.push(sl, s.usage_repairs as f64);
        let c = compute.slices.get(&name);
        for (i, u) in s.device_usage().iter().enumerate() {
            let l = vec![("slice", name.clone()), ("device", u.share.device.to_string())];
            mem_limit.push(l.clone(), u.share.memory.0 as f64);
            mem_burst.push(l.clone(), u.share.memory_burst.0 as f64);
            mem_granted.push(l.clone(), u.granted as f64);
            mem_used.push(l.clone(), u.used as f64);
            if let Some(b) = u.driver_used {
                mem_driver.push(l.clone(), b as f64);
            }
            mem_untracked.push(l.clone(), u.untracked as f64);
            refused.push(l.clone(), u.refused as f64);
            share.push(l.clone(), f64::from(u.share.compute_share.0) / 1e4);
            limit.push(l.clone(), f64::from(u.share.compute_limit.0) / 1e4);
            if let Some(c) = c.and_then(|c| c.get(i)) {
                usage.push(l.clone(), f64::from(c.usage_bps) / 1e4);
                used.push(l.clone(), c.used_ns_total as f64 / 1e9);
                measured.push(l.clone(), c.measured_ns_total as f64 / 1e9);
                throttled.push(l.clone(), c.throttled_ns_total as f64 / 1e9);
                waits.push(l.clone(), c.throttle_waits as f64);
                budget.push(l.clone(), c.budget_ns as f64 / 1e9);
                allowance.push(l.clone(), c.allowance_ns as f64 / 1e9);
                hungry.push(l.clone(), if c.hungry { 1.0 } else { 0.0 });
                scale.push(l, c.scale_ppm as f64 / 1e6);
            }
        }
    }
    let mut unadopted = Family::new("egpu_slices_unadopted", "Stored slices egpud could not adopt (their slice-table files cannot be opened); their memory stays reserved and every sweep tries again.", Gauge);
    unadopted.push(Vec::new(), m.unadopted().count() as f64);
    let mut recovered = Family::new(
        "egpu_slices_recovered_from_limits",
        "Slices this egpud took back from their limits files at start because its store had lost a change of theirs or the whole slice (a damaged store rolled back); non-zero: check the state directory's disk.",
        Gauge,
    );
    recovered.push(Vec::new(), m.recovered() as f64);
    drop(m);
    let mut period = Family::new("egpu_arbiter_period_seconds", "Configured compute arbiter period.", Gauge);
    period.push(Vec::new(), compute.period_ns as f64 / 1e9);
    let mut achieved = Family::new("egpu_arbiter_achieved_period_seconds", "Moving average of the time between arbiter ticks.", Gauge);
    achieved.push(Vec::new(), compute.achieved_period_s);
    let mut ticks = Family::new("egpu_arbiter_ticks", "Arbiter ticks.", Counter);
    ticks.push(Vec::new(), compute.ticks as f64);
    let mut missed = Family::new("egpu_arbiter_missed_ticks", "Arbiter periods skipped because the loop fell behind.", Counter);
    missed.push(Vec::new(), compute.missed_ticks as f64);
    let mut cpu = Family::new("egpu_arbiter_cpu_seconds", "CPU time of the arbiter thread.", Counter);
    cpu.push(Vec::new(), compute.cpu_s);
    vec![
        dev_mem, dev_alloc, dev_share, dev_unmanaged, info, procs, resizes, repairs, mem_limit, mem_burst, mem_granted, mem_used, mem_driver, mem_untracked, refused, share, limit, usage, used, measured, throttled, waits,
        budget, allowance, hungry, scale, unadopted, recovered, period, achieved, ticks, missed, cpu,
    ]
}

impl Collector for NodeCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), FmtError> {
        for f in families(&self.node) {
            f.encode(&mut enc)?;
        }
        let c = self.node.compute.snapshot();
        let mut d = enc.encode_descriptor("egpu_arbiter_tick_seconds", "Duration of one arbiter tick.", None, MetricType::Histogram)?;
        // Per-bucket counts: the encoder makes them cumulative.
        let buckets: Vec<(f64, u64)> = TICK_BUCKETS.iter().chain(std::iter::once(&f64::INFINITY)).zip(c.tick_buckets).map(|(ub, n)| (*ub, n)).collect();
        type Ex = std::collections::HashMap<usize, prometheus_client::metrics::exemplar::Exemplar<Labels, f64>>;
        d.encode_histogram(c.tick_sum_s, c.tick_buckets.iter().sum(), &buckets, None::<&Ex>)
    }
}

/// The registry a scrape encodes.
pub fn registry(node: Arc<Node>) -> Registry {
    let mut r = Registry::default();
    r.register_collector(Box::new(NodeCollector { node }));
    r
}

/// One scrape, as text.
pub fn render(registry: &Registry) -> String {
    let mut s = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut s, registry);
    s
}

/// Serves `GET /metrics` (OpenMetrics text, whatever `Accept` asks for) and
/// `GET /healthz` (`ok`) on `listener` until `shutdown` completes.
pub async fn serve(node: Arc<Node>, listener: tokio::net::TcpListener, shutdown: impl std::future::Future<Output = ()> + Send + 'static) -> Result<(), MetricsError> {
    use axum::http::header::CONTENT_TYPE;
    let reg = Arc::new(registry(node));
    let app = axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(move || {
                let reg = reg.clone();
                async move {
                    let body = tokio::task::spawn_blocking(move || render(&reg)).await.unwrap_or_default();
                    ([(CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], body)
                }
            }),
        )
        .route("/healthz", axum::routing::get(|| async { "ok" }));
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await.map_err(MetricsError::Serve)
}
