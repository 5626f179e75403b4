//! One report interval: counts, latency percentiles, event-measured GPU time.

use serde::Serialize;

/// Samples of one interval.
#[derive(Debug, Default)]
pub struct Interval {
    pub kernels: u64,
    /// Per launch: the `cuLaunchKernel` call (saturate) or the whole
    /// launch-and-synchronise iteration (latency), ns.
    pub latencies_ns: Vec<u64>,
    /// GPU time between consecutive completion events, ns (when measurable).
    pub gpu_ns: Option<u64>,
}

/// One JSON line.
#[derive(Debug, Serialize, PartialEq)]
pub struct Report {
    pub t_s: f64,
    pub mode: &'static str,
    pub kernels: u64,
    pub kernels_per_s: f64,
    pub latency_p50_us: f64,
    pub latency_p99_us: f64,
    pub gpu_busy_frac: Option<f64>,
}

/// Nearest-rank percentile of sorted `v`.
pub fn percentile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((q / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

impl Interval {
    pub fn report(mut self, t_s: f64, span_s: f64, mode: &'static str) -> Report {
        self.latencies_ns.sort_unstable();
        let us = |q| percentile(&self.latencies_ns, q) as f64 / 1e3;
        Report {
            t_s,
            mode,
            kernels: self.kernels,
            kernels_per_s: self.kernels as f64 / span_s.max(1e-9),
            latency_p50_us: us(50.0),
            latency_p99_us: us(99.0),
            gpu_busy_frac: self.gpu_ns.map(|g| g as f64 / 1e9 / span_s.max(1e-9)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_rates() {
        let iv = Interval { kernels: 200, latencies_ns: (1..=100).rev().map(|x| x * 1000).collect(), gpu_ns: Some(500_000_000) };
        let r = iv.report(2.0, 2.0, "saturate");
        assert_eq!(r.kernels_per_s, 100.0);
        assert_eq!(r.latency_p50_us, 50.0);
        assert_eq!(r.latency_p99_us, 99.0);
        assert_eq!(r.gpu_busy_frac, Some(0.25));
        assert_eq!(percentile(&[], 50.0), 0);
    }
}
