//! The fleet policy's settings ([`FleetConfig`], [`Share`]) and what a run
//! and a search report ([`FleetRun`], [`FleetSearch`]).

use super::Outcome;
use serde::Serialize;

/// How a GPU's spare capacity is handed out to its pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Share {
    /// Compute: every pod on the GPU gets the same share (1 ÷ its pods),
    /// whatever its base, so the arbiter splits a saturated GPU max-min
    /// fairly and cuts only the pods that want more than the common level.
    /// Memory (with `burst` off): the spare equally, as [`Share::Equal`].
    Even,
    /// The same amount to every pod on the GPU.
    Equal,
    /// In proportion to the pod's base slice.
    Base,
    /// In proportion to the pod's recent volatility: its largest
    /// one-minute memory rise (and, for compute, its largest duty above its
    /// base share) over the last [`FleetConfig::vol_window`] minutes.
    Volatility,
    /// First, water-filled, what would bring each pod back to its peak of
    /// the last [`FleetConfig::vol_window`] minutes (memory and duty);
    /// what is left after that, equally.
    Reach,
}

impl Share {
    /// Parse `even`, `reach`, `equal`, `base` or `volatility`.
    pub fn parse(s: &str) -> Option<Share> {
        match s {
            "even" => Some(Share::Even),
            "equal" => Some(Share::Equal),
            "base" => Some(Share::Base),
            "volatility" => Some(Share::Volatility),
            "reach" => Some(Share::Reach),
            _ => None,
        }
    }
}

/// The fixed-fleet policy.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct FleetConfig {
    /// Base memory = peak of this many past minutes …
    pub mem_window: usize,
    /// … × (1 + this) …
    pub mem_headroom: f64,
    /// … + this many GiB.
    pub mem_floor_gib: f64,
    /// Base compute share = this quantile (1 = peak) …
    pub compute_quantile: f64,
    /// … of this many past minutes of duty.
    pub compute_window: usize,
    /// How spare capacity is handed out (compute always; memory unless
    /// [`FleetConfig::burst`]).
    pub share: Share,
    /// Memory beyond the base slices is a **burst pool** per GPU, as
    /// `--gpu-memory-burst` gives in `egpud`: the base slice is the pod's
    /// guarantee, and a pod grows past it on demand while the GPU has memory
    /// no base slice reserved and no other pod borrowed. False: the spare is
    /// split into fixed per-pod limits by [`FleetConfig::share`].
    pub burst: bool,
    /// How a burst pool's overflowing minute is counted. False: every
    /// borrower of that GPU-minute is refused (a one-sample-a-period trace
    /// cannot say whose allocation came last: the pessimistic count). True:
    /// the borrowers come first come, first served in a seeded random order
    /// (a hash of the minute, the GPU and the pod), each gets what is left
    /// of the pool (as if it grew in small allocations), and only those
    /// that fall short are refused (an estimate of the expected count).
    /// The refused GiB are the same either way.
    pub first_come: bool,
    /// Minutes of history for [`Share::Volatility`].
    pub vol_window: usize,
    /// Rebalance while the least spare memory of a GPU is below this, GiB.
    pub min_spare_gib: f64,
    /// At most this many rebalancing moves per resize (0: none).
    pub rebalance: usize,
    /// Compute-risk window, minutes (0: off). A GPU's risk is the number
    /// of these past minutes in which its pods' summed duty exceeded one
    /// GPU. Pods are placed on the GPU with the best room − `risk_weight`
    /// × risk ÷ window, and up to `risk_moves` pods a resize move off the
    /// riskiest GPU when that lowers the summed risk.
    pub risk_window: usize,
    pub risk_weight: f64,
    pub risk_moves: usize,
    /// Violation budget for [`search_fleet`], as a fraction of pod-minutes.
    pub budget: f64,
    /// Evaluate this fleet size instead of searching.
    pub gpus: Option<usize>,
    /// Also evaluate the fleet with the hindsight placement (one GPU per
    /// pod, chosen knowing the whole trace; a reference, not a policy).
    pub hindsight: bool,
    /// Also evaluate the fleet re-placed every this many minutes knowing
    /// the next this many minutes of usage (`fleet-foresight`; a reference,
    /// not a policy).
    pub foresight: Option<usize>,
    /// The foresight reference knows each pod's levels in the coming
    /// minutes but not which minutes they fall in (`fleet-foresight-shuffled`).
    pub foresight_shuffled: bool,
    /// How many shuffled draws the shuffled foresight plans against (the
    /// mean cost over them: a plan for the levels' distribution, not for
    /// one draw's chance coincidences).
    pub foresight_draws: usize,
    /// Re-place the pods every this many minutes (0: never) with the
    /// foresight planner fed the last [`FleetConfig::replan_lookback`]
    /// minutes of usage (an online policy: the past stands for the future).
    pub replan: usize,
    pub replan_lookback: usize,
    /// Compute work a pod was not given in its minute waits for the next
    /// one ([`super::eval::Backlog`]); false drops it.
    pub carry_unserved: bool,
}

impl Default for FleetConfig {
    fn default() -> Self {
        FleetConfig { mem_window: 2, mem_headroom: 0.0, mem_floor_gib: 0.0, compute_quantile: 0.5, compute_window: 5, share: Share::Even, burst: true, first_come: false, vol_window: 60, min_spare_gib: 0.0, rebalance: 0, risk_window: 0, risk_weight: 1.0, risk_moves: 0, budget: 0.01, gpus: None, hindsight: false, foresight: None, foresight_shuffled: false, foresight_draws: 8, replan: 0, replan_lookback: 240, carry_unserved: true }
    }
}

/// One fleet run's outcome and a check of its limits.
#[derive(Debug, Clone)]
pub struct FleetRun {
    pub outcome: Outcome,
    /// Largest Σ memory limits on one GPU in any minute, GiB.
    pub max_gpu_mem_limits_gib: f64,
    /// Largest Σ compute shares on one GPU in any minute.
    pub max_gpu_shares: f64,
    /// Pod-minutes whose base slices found no GPU with room (their GPU's
    /// limits were scaled down).
    pub overflow_minutes: u64,
    /// GPU-minutes whose summed duty exceeded the GPU (each forces at
    /// least one compute violation, whatever the shares).
    pub saturated_gpu_minutes: u64,
    /// Violation pod-minutes that no compute split could avoid with this
    /// placement: per GPU-minute, its pods refused memory, or one if there
    /// are none and its summed duty exceeded the GPU.
    pub floor_pod_minutes: u64,
    /// With the burst pool counting every borrower of an overflowing
    /// minute as refused (a bound), the violation pod-minutes had the same
    /// run counted them first come ([`FleetConfig::first_come`], an
    /// estimate; placement does not depend on the count). `None` otherwise.
    pub first_come_violation_minutes: Option<u64>,
}

/// The fleet sizes tried by [`search_fleet`] and their violation fractions.
#[derive(Debug, Clone, Serialize)]
pub struct FleetSearch {
    pub gpus: usize,
    /// At that size: pod-minutes on a GPU whose base slices did not fit,
    /// and GPU-minutes whose summed duty exceeded the GPU.
    pub overflow_pod_minutes: u64,
    pub saturated_gpu_minutes: u64,
    /// At that size: violation pod-minutes that no compute split could
    /// avoid ([`FleetRun::floor_pod_minutes`]).
    pub floor_pod_minutes: u64,
    /// Whether `gpus` meets the budget (false: none up to the cap did).
    pub met: bool,
    /// Each size tried and its violation fraction.
    pub tried: Vec<(usize, f64)>,
    /// For each size in `tried`, the fraction of pod-minutes that no
    /// compute split could keep from being violations.
    pub floors: Vec<f64>,
    /// For each size in `tried`, the violation fraction with the pool's
    /// refusals counted first come ([`FleetRun::first_come_violation_minutes`];
    /// empty when the run does not compute it), and the smallest size
    /// tried within budget by that count.
    pub first_come_tried: Vec<f64>,
    pub first_come_gpus: Option<usize>,
}
