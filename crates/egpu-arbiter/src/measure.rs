//! What a launch costs, and how the arbiter reconciles it.
//!
//! **In the hook.** After each gated launch the hook records an event on the
//! launching stream. When event *k* is found complete, with `end_k` its GPU
//! timestamp mapped to CLOCK_MONOTONIC and `submit_k` the launch time, the
//! launch is charged [`StreamClock::attribute`]: `end_k − max(end_{k−1},
//! submit_k)`. On a stream alone on the device that is the kernel's run time.
//! Under contention it also contains the time the kernel waited behind other
//! processes' work (a FIFO device such as the simulated GPU) or was
//! time-sliced out (a real GPU without MPS): it is the time the stream had
//! unfinished work, an upper bound of the GPU time it used.
//!
//! **In the arbiter.** That over-count is corrected once per period against
//! the device's own accounting (the simulated GPU's per-process busy time, or
//! NVML per-process utilisation / accounting on real hardware): with `M` the
//! measured and `T` the true GPU time of a slice in the last period, the
//! slice's next budget (true ns) is converted into its own measured units
//! with the ratio `M/T` ([`Scale`]). Because `M` is the time the slice had
//! work outstanding, `M ≈ P` is also the demand signal "backlogged all
//! period". Without a device truth the ratio stays 1 and budgets are
//! enforced in measured (backlog) time.

/// Per-stream attribution of finished launches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamClock {
    last_end_ns: u64,
}

impl StreamClock {
    /// Charge of a launch submitted at `submit_ns` whose completion event
    /// reads `end_ns` (same clock). Completions must be fed in stream order.
    pub fn attribute(&mut self, submit_ns: u64, end_ns: u64) -> u64 {
        let start = self.last_end_ns.max(submit_ns);
        self.last_end_ns = self.last_end_ns.max(end_ns);
        end_ns.saturating_sub(start)
    }
}

/// Periods whose measured and true times are summed for the ratio.
pub const SCALE_WINDOW: usize = 2;

/// Measured-to-true ratio of one slice on one device, in parts per million:
/// `Σ M / Σ T` over the last [`SCALE_WINDOW`] (2) meaningful periods.
///
/// A window, not the last period alone: `M` (completions the hook reaped)
/// and `T` (the device's accounting) do not see a launch in the same period
/// — on the simulated GPU a kernel's time is charged when it is queued, on
/// NVML when a sample covers it — so one period's ratio is off by the work
/// in flight at its ends, up to a queue bound (2 ms of 10). A slice that
/// launched much at a period's end had a low ratio, hence a small allowance
/// next period, then a high one: end to end the shares alternated ±10 points
/// from period to period after a resize (resize convergence median 4–5,
/// p99 13–18 periods; 2 and 4 with the window). Summed over two periods the
/// edge error is halved and a low and a high period cancel; a window of 4
/// was worse in the model: a slice waking from idle kept a wake-up period's
/// low ratio for 4 periods and missed its share in the first full one.
///
/// Damped: the published ratio moves half-way from its old value to the
/// window's ratio each period (the first meaningful period is taken as is).
/// End to end the simulated GPU's per-period truth is quantised to whole
/// 410 µs kernels and charged at queue time, so one period's `T` swings ±20
/// points; at gain 1 the ratio passed that on to the next allowance and the
/// shares kept swinging ±5 points after a resize (resize convergence misses
/// 25% of resizes over 2 periods; 12% at gain ½, 4% with the deficit's
/// settle at 3 ticks, see `docs/compute-arbiter.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scale {
    ppm: u64,
    m: [u64; SCALE_WINDOW],
    t: [u64; SCALE_WINDOW],
    next: usize,
}

impl Default for Scale {
    fn default() -> Self {
        Scale { ppm: Scale::ONE, m: [0; SCALE_WINDOW], t: [0; SCALE_WINDOW], next: 0 }
    }
}

impl Scale {
    /// 1.0
    pub const ONE: u64 = 1_000_000;
    /// Never below 0.5 (completions straddling a tick) or above 64.
    pub const MIN: u64 = Scale::ONE / 2;
    pub const MAX: u64 = 64 * Scale::ONE;

    pub fn ppm(self) -> u64 {
        self.ppm
    }

    /// Updates from one period's measured and true GPU time. A period with
    /// too little of either to be meaningful (under 1% of it) leaves the
    /// ratio unchanged; a period with no device truth resets it to 1.
    pub fn update(&mut self, measured_ns: u64, true_ns: Option<u64>, period_ns: u64) {
        let Some(t) = true_ns else {
            *self = Scale::default();
            return;
        };
        let floor = period_ns / 100;
        if t < floor || measured_ns < floor {
            return;
        }
        self.m[self.next] = measured_ns;
        self.t[self.next] = t;
        self.next = (self.next + 1) % SCALE_WINDOW;
        let sm: u128 = self.m.iter().map(|&v| u128::from(v)).sum();
        let st: u128 = self.t.iter().map(|&v| u128::from(v)).sum();
        let r = (sm * u128::from(Scale::ONE) / st.max(1)).min(u128::from(u64::MAX)) as u64;
        let r = r.clamp(Scale::MIN, Scale::MAX);
        // Half-way from the old ratio to the window's (but the first
        // meaningful period is taken as is).
        let first = self.t.iter().filter(|&&v| v > 0).count() == 1;
        self.ppm = if first { r } else { self.ppm / 2 + r / 2 };
    }

    /// `ns` of true GPU time in the slice's measured units.
    pub fn to_measured(self, ns: u64) -> u64 {
        (u128::from(ns) * u128::from(self.ppm) / u128::from(Scale::ONE)).min(u128::from(u64::MAX)) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alone_on_the_device_charges_run_time() {
        let mut s = StreamClock::default();
        // Launched back to back while the previous one runs: each charged its own run.
        assert_eq!(s.attribute(0, 100), 100);
        assert_eq!(s.attribute(10, 200), 100);
        // Launched after an idle gap: charged from its submission.
        assert_eq!(s.attribute(500, 550), 50);
    }

    #[test]
    fn contention_is_counted_as_backlog() {
        let mut s = StreamClock::default();
        // Submitted at 0, waited 300 behind another process, ran 100.
        assert_eq!(s.attribute(0, 400), 400);
        // An out-of-order (earlier) completion is never negative.
        assert_eq!(s.attribute(0, 350), 0);
    }

    #[test]
    fn scale_follows_measured_over_true_and_is_bounded() {
        let mut sc = Scale::default();
        sc.update(20, Some(10), 100);
        assert_eq!(sc.ppm(), 2 * Scale::ONE);
        assert_eq!(sc.to_measured(7), 14);
        sc.update(0, Some(50), 100);
        assert_eq!(sc.ppm(), 2 * Scale::ONE, "an idle period keeps the ratio");
        sc.update(1_000_000, Some(10), 100);
        assert_eq!(sc.ppm(), Scale::ONE + Scale::MAX / 2, "half-way from 2 to the bound");
        sc.update(1_000_000, Some(10), 100);
        assert!(sc.ppm() > Scale::MAX * 3 / 4 && sc.ppm() <= Scale::MAX);
        let mut lo = Scale::default();
        lo.update(10, Some(100), 100);
        assert_eq!(lo.ppm(), Scale::MIN);
        sc.update(10, None, 100);
        assert_eq!(sc, Scale::default(), "no truth: ratio 1, history gone");
    }

    #[test]
    fn scale_is_a_ratio_of_sums_over_the_window() {
        // Work launched at a period's end is charged to T in that period and
        // to M in the next: per period the ratio would swing 1.5 / 0.75.
        let mut sc = Scale::default();
        for (m, t) in [(100, 100), (150, 100), (75, 100), (150, 100), (75, 100)] {
            sc.update(m, Some(t), 100);
        }
        // Last two: (150 + 75) / 200, where one period alone says 0.75
        // (the published ratio, half-way each period: 1, 1.125, 1.125, …).
        assert_eq!(sc.ppm(), 1_125_000);
        // Then half-way from 1.125 to the window's (75 + 100) / 200.
        sc.update(100, Some(100), 100);
        assert_eq!(sc.ppm(), 1_125_000 / 2 + (75 + 100) * Scale::ONE / 200 / 2);
    }
}
