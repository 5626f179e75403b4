//! `egpu bench resize`: resize latency on a live node.
//!
//! A throw-away egpud (simulated GPUs unless NVML finds real ones) and one
//! egpu-probe `grow` process under libegpu.so. The probe allocates `--step`
//! at a time until its slice is full, reports "blocked" and retries every
//! `--retry-us` (50 µs by default). Each round raises the limit by one step through the gRPC API; the
//! latency is CLOCK_MONOTONIC from the resize call returning (and from it
//! being issued) to the probe's successful allocation ("unblocked", stamped
//! by the probe with CLOCK_MONOTONIC). Both clocks are system-wide.

use crate::localnode::{LocalNode, Workload, real_gpu_present};
use egpu_core::Bytes;
use egpu_node::proto;
use std::time::Duration;

#[derive(Debug, clap::Args)]
pub struct ResizeBenchArgs {
    /// Number of resizes (at least 1).
    #[arg(long, default_value_t = 1000, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=10_000_000))]
    pub count: usize,
    /// How much each resize adds (and the probe's allocation size).
    #[arg(long, default_value = "2MiB", value_parser = crate::cli::nonzero_size)]
    pub step: Bytes,
    /// Simulated GPUs to use when the machine has no NVIDIA GPU.
    #[arg(long, default_value = "1x16GiB", value_parser = crate::daemon::sim_spec)]
    pub simulate: String,
    /// How often the blocked probe retries its allocation, in microseconds.
    /// The figure measured includes up to one retry interval.
    #[arg(long, default_value_t = 50)]
    pub retry_us: u64,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, serde::Serialize)]
pub struct Stats {
    pub count: usize,
    pub median_ns: u64,
    pub p99_ns: u64,
    pub max_ns: u64,
    pub min_ns: i64,
}

/// Order statistics of `v` (nearest-rank).
pub fn stats(v: &[i64]) -> Stats {
    let mut s: Vec<i64> = v.to_vec();
    s.sort_unstable();
    let rank = |q: f64| s[((q * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1].max(0) as u64;
    Stats { count: s.len(), median_ns: rank(0.5), p99_ns: rank(0.99), max_ns: rank(1.0), min_ns: s[0] }
}

pub async fn resize(_socket: &std::path::Path, args: ResizeBenchArgs) -> anyhow::Result<i32> {
    anyhow::ensure!(args.count > 0 && args.step.0 > 0, "--count and --step must be positive");
    if grows_to(&args).is_none() {
        return Err(crate::exit::Failure::new(crate::exit::USAGE, format!("--step {} × (--count {} + 64) resizes past 16 EiB; use a smaller --step or --count", args.step, args.count)).into());
    }
    let simulate = (!real_gpu_present()).then(|| args.simulate.clone());
    let (node, mut c) = LocalNode::start(simulate.clone()).await?;
    let r = run(&mut c, &args).await;
    node.stop().await;
    let (from_return, from_call, call) = r?;
    let (a, b, k) = (stats(&from_return), stats(&from_call), stats(&call));
    if args.json {
        let v = serde_json::json!({"gpu": simulate.unwrap_or_else(|| "real".into()), "step": args.step.0, "retry_us": args.retry_us,
            "from_return": a, "from_call": b, "call": k});
        say!("{v}");
    } else {
        let ms = |ns: u64| ns as f64 / 1e6;
        say!("resize latency over {} resizes ({} GPU, step {}):", a.count, simulate.as_deref().unwrap_or("real"), args.step);
        say!("  resize call returned -> blocked allocation succeeds: median {:.3} ms, p99 {:.3} ms, max {:.3} ms", ms(a.median_ns), ms(a.p99_ns), ms(a.max_ns));
        say!("  resize call issued   -> blocked allocation succeeds: median {:.3} ms, p99 {:.3} ms, max {:.3} ms", ms(b.median_ns), ms(b.p99_ns), ms(b.max_ns));
        say!("  the resize call itself (gRPC + durable store write + publish): median {:.3} ms, p99 {:.3} ms", ms(k.median_ns), ms(k.p99_ns));
        say!("  (the probe retries a refused allocation every {} us, which the first two include)", args.retry_us);
    }
    Ok(0)
}

type Samples = (Vec<i64>, Vec<i64>, Vec<i64>);

/// The slice's limit before the first resize.
const START_LIMIT: u64 = 64 << 20;

/// The size the probe grows to: 64 spare steps past the last resize's
/// limit. `None` past 16 EiB.
fn grows_to(args: &ResizeBenchArgs) -> Option<u64> {
    args.step.0.checked_mul(args.count as u64 + 64)?.checked_add(START_LIMIT)
}

async fn run(c: &mut egpu_node::client::Client, args: &ResizeBenchArgs) -> anyhow::Result<Samples> {
    let t = Duration::from_secs(30);
    let step = args.step.0;
    let start_limit = START_LIMIT;
    let req = proto::CreateSliceRequest {
        name: "bench".into(),
        devices: vec![proto::DeviceShareSpec { device: 0, memory_bytes: start_limit, compute_share_bps: 0, compute_limit_bps: 0, memory_burst_bytes: 0 }],
        ..Default::default()
    };
    c.create_slice(req).await.map_err(crate::exit::status)?;
    let until = grows_to(args).ok_or_else(|| anyhow::anyhow!("--step × --count past 16 EiB"))?;
    let step_s = step.to_string();
    let until_s = until.to_string();
    let retry_s = args.retry_us.to_string();
    let mut p = Workload::probe(c, "bench", &["grow", "--step", &step_s, "--until", &until_s, "--retry-us", &retry_s, "--hold"]).await?;
    let (mut from_return, mut from_call, mut call) = (Vec::new(), Vec::new(), Vec::new());
    let mut limit = start_limit;
    p.wait_event(&["blocked"], t).await?;
    for _ in 0..args.count {
        limit += step;
        let req = proto::ResizeSliceRequest { name: "bench".into(), memory_bytes: Some(limit), ..Default::default() };
        let t0 = egpu_abi::monotonic_ns();
        c.resize_slice(req).await.map_err(crate::exit::status)?;
        let t1 = egpu_abi::monotonic_ns();
        let un = p.wait_event(&["unblocked"], t).await?;
        let seen = un["t_ns"].as_u64().unwrap_or(0) as i64;
        from_return.push(seen - t1 as i64);
        from_call.push(seen - t0 as i64);
        call.push((t1 - t0) as i64);
        // One step fits per resize, so the probe blocks again at once.
        p.wait_event(&["blocked"], t).await?;
    }
    // Let the probe reach its target, then stop it.
    let req = proto::ResizeSliceRequest { name: "bench".into(), memory_bytes: Some(until + (256 << 20)), ..Default::default() };
    c.resize_slice(req).await.map_err(crate::exit::status)?;
    p.wait_event(&["holding"], t).await?;
    p.finish().await?;
    Ok((from_return, from_call, call))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_stats() {
        let v: Vec<i64> = (1..=100).collect();
        let s = stats(&v);
        assert_eq!((s.median_ns, s.p99_ns, s.max_ns, s.min_ns), (50, 99, 100, 1));
        assert_eq!(stats(&[-5]).median_ns, 0, "negative samples (seen before the call returned) count as 0");
    }
}
