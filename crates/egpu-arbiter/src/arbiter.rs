//! The `egpud` side: one [`Arbiter::tick`] per period turns every slice
//! device's counters into a budget, a cumulative allowance and queue bounds.
//!
//! Per slice device and period the arbiter derives, from the cumulative
//! counters it is given:
//!
//! - `M`, measured ns (the hook's charge, which is backlog time);
//! - `T`, true GPU ns from the device's accounting, when available (else `M`);
//! - *hungry*: some launch waited for budget, or `M ≥ 90%` of the period
//!   (it had work outstanding all period).
//!
//! It then runs [`crate::alloc::allocate`] per physical device, converts each
//! budget to the slice's measured units with its [`Scale`] and publishes
//! `allowance = consumed + budget·scale`: unused allowance is not banked.
//! Before that the budget is corrected by the slice's *deficit*, the
//! accumulated difference between its fair budget and its true use (an
//! integral controller, bounded to −(2 budgets + 2 periods) and +½ budget): a
//! hungry slice that got less than its budget (mis-scaled units, launches
//! still running at the tick) gets it back (up to a quarter of its budget),
//! and any slice that overshot (launches in flight when its allowance ran
//! out, a kernel longer than its budget) pays it back (in full, with zero
//! budgets for as many periods as that takes, for kernels up to two periods
//! long). A satisfied
//! slice's demand is its peak use over the last four periods plus 25%.
//! The largest hungry slice of a device with two or more hungry slices gets
//! a slack of 10% of the period on top (`ArbiterConfig::last_slack_ppm`), so
//! that the device does not idle at a period's end with everyone parked; its
//! over-use is paid back through the deficit like any other (out of the
//! slack itself where the debt exceeds the budget).
//! A resize between ticks is applied at once by [`Arbiter::replan`], which
//! re-plans the period in progress without measuring anything.
//!
//! Queue bounds: every process may keep at most `queue_launches` (4) launches
//! unfinished, and at most its slice's budget for the period (never more
//! than a fifth of the period) of estimated work: a 10% slice (1 ms per
//! 10 ms period) may queue 1 ms, not 4 launches of any size, and at least
//! one kernel (the gate always lets a process with nothing unfinished
//! launch), while a lone slice whose budget grew to the whole period may
//! queue 2 ms. A tighter bound (a quarter or half of the budget) made the
//! model worse: on a FIFO device a backlogged slice's share follows its
//! queue depth, the one-kernel minimum lets small slices keep more than
//! their fraction queued, and an allowance can hold a slice back but never
//! push it forward (10/20/30/40 → 11.8/22.2/30.7/35.4 at a quarter).
//! Best-effort slices get a bound of one launch while a high-priority slice
//! on the same device is active, so that the high slice's kernels never
//! queue behind a deep best-effort backlog.

use crate::alloc::{Claim, allocate};
use crate::measure::Scale;
use egpu_core::Priority;
use std::collections::HashMap;

/// Identifies one slice device: the slice (any id `egpud` likes) and the
/// device's index inside the slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SliceKey {
    pub slice: u64,
    pub dev: u32,
}

/// Tuning. [`ArbiterConfig::default`] is what `egpud` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArbiterConfig {
    /// Period, ns. Default 10 ms (see `docs/compute-arbiter.md` for why).
    pub period_ns: u64,
    /// Measured time above this fraction of the period (ppm) means backlogged.
    pub backlogged_ppm: u64,
    /// Unfinished launches per process (0: unbounded).
    pub queue_launches: u64,
    /// Cap of the unfinished estimated work per process, ppm of the period
    /// (0: no cap from the period).
    pub queue_period_ppm: u64,
    /// Unfinished estimated work per process, ppm of its slice's budget for
    /// the period (0: no bound from the budget).
    pub queue_budget_ppm: u64,
    /// Queue bound of best-effort processes while a high slice is active.
    pub best_effort_queue_under_high: u64,
    /// Extra allowance, ppm of the period (measured ns), of the *last-standing*
    /// slice of a device: the hungry slice with the largest budget, when at
    /// least two slices on the device are hungry and no high-priority slice
    /// is active there (0: off). On a FIFO device the slices with smaller
    /// shares reach their allowances first and park; the largest then runs
    /// alone to the tick. Its allowance, converted at a ratio measured over
    /// past periods, ran out before the tick in 1.5–2.9% of periods end to
    /// end, and the device idled with everyone parked. The slack only lets
    /// it use what the parked slices left; its own deficit pays back any
    /// excess over the following periods. Default 10% (see
    /// `docs/compute-arbiter.md`, "Resize convergence").
    pub last_slack_ppm: u64,
}

impl Default for ArbiterConfig {
    fn default() -> Self {
        ArbiterConfig {
            period_ns: 10_000_000,
            backlogged_ppm: 900_000,
            queue_launches: 4,
            queue_period_ppm: 200_000,
            queue_budget_ppm: 1_000_000,
            best_effort_queue_under_high: 1,
            last_slack_ppm: 100_000,
        }
    }
}

/// One slice device as `egpud` sees it at a tick. Counters are cumulative.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SliceInput {
    pub key: SliceKey,
    /// Physical device (host index): slices on the same one share its time.
    pub device: u32,
    pub share_bps: u32,
    pub limit_bps: u32,
    pub priority: Priority,
    /// `UsageRegion::consumed_ns[dev]`.
    pub consumed_ns: u64,
    /// `UsageRegion::throttle_waits[dev]`.
    pub throttle_waits: u64,
    /// The device's own accounting of the slice's GPU time, cumulative, if any.
    pub true_ns: Option<u64>,
}

/// What the arbiter publishes for one slice device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    pub key: SliceKey,
    pub epoch: u64,
    /// GPU time (true ns) granted for this period.
    pub budget_ns: u64,
    /// Cumulative allowance in measured ns (`DeviceLimits::allowance_ns`).
    pub allowance_ns: u64,
    pub queue_launches: u64,
    pub queue_ns: u64,
    pub scale_ppm: u64,
    /// True GPU time used in the last period (for metrics).
    pub used_ns: u64,
    /// Whether the slice wanted more than it got in the last period.
    pub hungry: bool,
}

/// Periods of usage history behind a satisfied slice's demand estimate.
const HISTORY: usize = 4;

#[derive(Debug, Clone, Copy, Default)]
struct State {
    consumed: u64,
    waits: u64,
    true_ns: Option<u64>,
    allowance: u64,
    /// Budget (true ns) published at the previous tick, and the fair share
    /// it was corrected from.
    budget: u64,
    fair: u64,
    /// Accumulated fair-minus-used true time (the deficit controller).
    deficit: i128,
    /// (share, limit) the deficit was accumulated under.
    spec: (u32, u32),
    /// Ticks left after a resize during which the deficit is not accumulated.
    settle: u8,
    /// True usage of the last `HISTORY` periods (ring).
    history: [u64; HISTORY],
    scale: Scale,
    seen: bool,
    /// The last epoch whose tick had this slice device among its inputs
    /// (slice devices not stamped by a tick are forgotten at its end).
    stamp: u64,
    /// The last tick's view of the period it closed: peak recent use,
    /// hungry, and active (used or wanted time), kept for [`Arbiter::replan`].
    recent: u64,
    hungry: bool,
    active: bool,
}

/// The arbiter's memory between ticks.
#[derive(Debug, Default)]
pub struct Arbiter {
    cfg: ArbiterConfig,
    epoch: u64,
    state: HashMap<SliceKey, State>,
    order: Vec<usize>,
    claims: Vec<Claim>,
    budgets: Vec<u64>,
    last: Vec<bool>,
}

impl Arbiter {
    pub fn new(cfg: ArbiterConfig) -> Arbiter {
        Arbiter { cfg, ..Arbiter::default() }
    }

    pub fn config(&self) -> &ArbiterConfig {
        &self.cfg
    }

    /// Epochs ticked so far.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// One period. Returns one [`Budget`] per input, in input order. Slice
    /// devices absent from `inputs` are forgotten.
    pub fn tick(&mut self, inputs: &[SliceInput]) -> Vec<Budget> {
        self.epoch += 1;
        let p = self.cfg.period_ns;
        let mut out = Vec::with_capacity(inputs.len());
        self.order.clear();
        self.order.extend(0..inputs.len());
        self.order.sort_by_key(|&i| inputs[i].device);
        self.claims.clear();
        let mut used = vec![(0u64, 0u64, false); inputs.len()];
        for (i, inp) in inputs.iter().enumerate() {
            let st = self.state.entry(inp.key).or_default();
            st.stamp = self.epoch;
            let (m, t, hungry) = if st.seen {
                let m = inp.consumed_ns.saturating_sub(st.consumed);
                let t = match (inp.true_ns, st.true_ns) {
                    (Some(now), Some(before)) => Some(now.saturating_sub(before)),
                    _ => None,
                };
                st.scale.update(m, t, p);
                let backlogged = u128::from(m) * 1_000_000 >= u128::from(p) * u128::from(self.cfg.backlogged_ppm);
                (m, t.unwrap_or(m), backlogged || inp.throttle_waits > st.waits)
            } else {
                (0, 0, false)
            };
            used[i] = (m, t, hungry);
            st.history[(self.epoch as usize) % HISTORY] = t;
            let recent = st.history.iter().copied().max().unwrap_or(0);
            (st.recent, st.hungry, st.active) = (recent, hungry, m > 0 || hungry);
            self.claims.push(Claim { share_bps: inp.share_bps, limit_bps: inp.limit_bps, priority: inp.priority, used_ns: recent, hungry });
        }
        let active: Vec<bool> = used.iter().map(|u| u.0 > 0 || u.2).collect();
        let hungry: Vec<bool> = used.iter().map(|u| u.2).collect();
        let high_active = self.plan(inputs, &hungry, &active);
        for (i, inp) in inputs.iter().enumerate() {
            let st = self.state.get_mut(&inp.key).expect("inserted above");
            let fair = self.budgets[i];
            // Deficit (an integral controller on true time): a hungry slice
            // that got less than its fair budget (its measured units were
            // mis-scaled, or its launches were still running at the tick)
            // accumulates the difference, any slice that overshot
            // accumulates the excess, and half the sum corrects the budget.
            // The sum is bounded to half a budget (no wind-up) and cleared
            // when a slice is satisfied, so it never banks unused time.
            let (_, t, hungry) = used[i];
            let error = if !st.seen {
                0
            } else if hungry {
                st.fair as i128 - t as i128
            } else {
                (st.fair as i128 - t as i128).min(0)
            };
            let half = (fair / 2) as i128;
            if st.spec != (inp.share_bps, inp.limit_bps) {
                // A resize: the old deficit measured distance to old shares,
                // and neither the period that ended now (old budgets) nor
                // the next one (queues filled at the old budgets drain, the
                // scale still has the old contention) says anything about
                // the new ones: without this the integral charged that
                // transient to the new budget and rang for several periods.
                // Three ticks, not two: the damped scale (`Scale::update`)
                // takes one more period to reach the new contention (end to
                // end: 4% of resizes over 2 periods instead of 12% at two).
                st.spec = (inp.share_bps, inp.limit_bps);
                st.deficit = 0;
                st.settle = if st.seen { 3 } else { 0 };
            }
            let error = if st.settle > 0 {
                st.settle -= 1;
                0
            } else {
                error
            };
            // Over-use may be paid back in full (with zero budgets for as
            // many periods as it takes); under-use is credited up to a
            // quarter of the budget.
            // Symmetric ±half a budget capped the correction at 25%, less
            // than the over-use of small slices end to end (a 10% slice ran
            // at 12.5–14.7%); on a FIFO device holding a slice back always
            // works, while more allowance cannot make a slice that is short
            // for other reasons (its host, the queue) use it.
            //
            // The lower bound is two budgets plus two periods, not two
            // budgets: the gate lets a launch go while any allowance is
            // left, so a kernel longer than the budget overshoots by up to
            // its length, and a bound of two budgets forgave the rest. A
            // 10% slice (1 ms a period) running 5 ms kernels then launched
            // one every other period: 25% of the GPU against its 10% cap.
            let lower = -2 * (fair as i128 + i128::from(p));
            st.deficit = if hungry || error < 0 { (st.deficit + error).clamp(lower, half) } else { 0 };
            set_budget(&self.cfg, st, fair, inp.consumed_ns, self.last[i]);
            st.consumed = inp.consumed_ns;
            st.waits = inp.throttle_waits;
            st.true_ns = inp.true_ns;
            st.seen = true;
            out.push(budget_out(&self.cfg, st, inp, self.epoch, &high_active, used[i].1, used[i].2));
        }
        // One pass over the map, not one over the inputs per entry: at
        // 10,000 slice devices a tick took 42–53 ms, longer than the period.
        let epoch = self.epoch;
        self.state.retain(|_, st| st.stamp == epoch);
        out
    }

    /// A resize between ticks: re-plans the period in progress under the
    /// specs in `inputs` (shares, limits, priorities), as if they had been
    /// published just before the period's tick. Nothing is measured: the
    /// claims (recent use, hungry) are the last tick's, the period's
    /// measurements go on to the next [`Arbiter::tick`], which still closes
    /// a whole period, and the scale is not updated. Each budget is the
    /// re-planned fair budget plus the slice's deficit (a resized slice's
    /// deficit restarts, as at a tick), and the allowance is re-based on the
    /// consumption at the last tick, so the period in progress as a whole is
    /// granted the new budget: a slice whose share shrank may already have
    /// used it and waits for the next tick. Idempotent: a second call with
    /// the same specs publishes the same allowances. Slice devices not seen
    /// at a tick yet get `None` (their first tick is their start).
    pub fn replan(&mut self, inputs: &[SliceInput]) -> Vec<Option<Budget>> {
        self.order.clear();
        self.order.extend(0..inputs.len());
        self.order.sort_by_key(|&i| inputs[i].device);
        self.claims.clear();
        let mut hungry = vec![false; inputs.len()];
        let mut active = vec![false; inputs.len()];
        for (i, inp) in inputs.iter().enumerate() {
            let st = self.state.get(&inp.key).copied().unwrap_or_default();
            (hungry[i], active[i]) = (st.hungry, st.active);
            self.claims.push(Claim { share_bps: inp.share_bps, limit_bps: inp.limit_bps, priority: inp.priority, used_ns: st.recent, hungry: st.hungry });
        }
        let high_active = self.plan(inputs, &hungry, &active);
        let mut out = Vec::with_capacity(inputs.len());
        for (i, inp) in inputs.iter().enumerate() {
            let Some(st) = self.state.get_mut(&inp.key).filter(|st| st.seen) else {
                out.push(None);
                continue;
            };
            let fair = self.budgets[i];
            if st.spec != (inp.share_bps, inp.limit_bps) {
                // As at a tick (see there): the next three ticks do not
                // accumulate the deficit.
                st.spec = (inp.share_bps, inp.limit_bps);
                st.deficit = 0;
                st.settle = 3;
            }
            // Re-based on the consumption at the last tick.
            set_budget(&self.cfg, st, fair, st.consumed, self.last[i]);
            let used_ns = st.history[(self.epoch as usize) % HISTORY];
            out.push(Some(budget_out(&self.cfg, st, inp, self.epoch, &high_active, used_ns, st.hungry)));
        }
        out
    }

    /// Budgets (`self.budgets`) and last-standing slices (`self.last`) from
    /// `self.claims` (in input order, `self.order` sorted by device); returns
    /// the devices with an active high-priority slice (sorted, for
    /// [`high_active_on`]).
    fn plan(&mut self, inputs: &[SliceInput], hungry: &[bool], active: &[bool]) -> Vec<u32> {
        let p = self.cfg.period_ns;
        self.budgets.clear();
        self.budgets.resize(inputs.len(), 0);
        // Allocate per physical device over the slices on it.
        let mut start = 0;
        while start < self.order.len() {
            let dev = inputs[self.order[start]].device;
            let end = start + self.order[start..].iter().take_while(|&&i| inputs[i].device == dev).count();
            let idx = &self.order[start..end];
            let claims: Vec<Claim> = idx.iter().map(|&i| self.claims[i]).collect();
            let mut b = vec![0; claims.len()];
            allocate(p, &claims, &mut b);
            for (&i, v) in idx.iter().zip(b) {
                self.budgets[i] = v;
            }
            start = end;
        }
        let mut high_active: Vec<u32> = inputs
            .iter()
            .zip(active)
            .filter(|(inp, a)| inp.priority == Priority::High && **a)
            .map(|(inp, _)| inp.device)
            .collect();
        high_active.sort_unstable();
        high_active.dedup();
        // The last-standing slice of each device (see `last_slack_ppm`).
        self.last.clear();
        self.last.resize(inputs.len(), false);
        if self.cfg.last_slack_ppm > 0 {
            let mut start = 0;
            while start < self.order.len() {
                let dev = inputs[self.order[start]].device;
                let end = start + self.order[start..].iter().take_while(|&&i| inputs[i].device == dev).count();
                let hungry = || self.order[start..end].iter().copied().filter(|&i| hungry[i]);
                // Not while a high slice is active there: its kernels would
                // queue behind the slack's (its latency bound is the
                // best-effort queue bound, not an allowance).
                if hungry().count() >= 2 && !high_active_on(&high_active, dev) {
                    // The largest budget; the first such input on a tie.
                    let best = hungry().fold(None, |b: Option<usize>, i| match b {
                        Some(j) if self.budgets[j] >= self.budgets[i] => Some(j),
                        _ => Some(i),
                    });
                    if let Some(i) = best {
                        self.last[i] = true;
                    }
                }
                start = end;
            }
        }
        high_active
    }
}

/// The period's budget (fair budget plus half the deficit, at least zero)
/// and allowance (`consumed` plus the budget in measured ns, plus the
/// last-standing slack if `last`, less what the deficit owes beyond a zero
/// budget) of a slice.
fn set_budget(cfg: &ArbiterConfig, st: &mut State, fair: u64, consumed: u64, last: bool) {
    let corrected = fair as i128 + st.deficit / 2;
    let budget = corrected.max(0) as u64;
    st.fair = fair;
    st.budget = budget;
    st.allowance = consumed.saturating_add(st.scale.to_measured(budget));
    if last {
        // Slack in measured ns: it is spent while the others are parked,
        // when the slice runs alone and measured = true. A debt larger
        // than the budget is paid out of the slack: without that a slice
        // whose budget is smaller than the slack (two saturating slices
        // capped at 5% and 3%) ran at the slack, 10%, its budget held at
        // zero by a deficit that could go no lower.
        let slack = (u128::from(cfg.period_ns) * u128::from(cfg.last_slack_ppm) / 1_000_000) as u64;
        let owed = u64::try_from((-corrected).max(0)).unwrap_or(u64::MAX);
        st.allowance = st.allowance.saturating_add(slack.saturating_sub(st.scale.to_measured(owed)));
    }
}

/// Whether `dev` is in `high_active` (sorted and deduplicated by [`Arbiter::plan`]):
/// a binary search, as every best-effort slice asks it.
fn high_active_on(high_active: &[u32], dev: u32) -> bool {
    high_active.binary_search(&dev).is_ok()
}

/// What is published for a slice from its state after [`set_budget`].
fn budget_out(cfg: &ArbiterConfig, st: &State, inp: &SliceInput, epoch: u64, high_active: &[u32], used_ns: u64, hungry: bool) -> Budget {
    let queue_launches = if inp.priority == Priority::BestEffort && high_active_on(high_active, inp.device) { cfg.best_effort_queue_under_high } else { cfg.queue_launches };
    Budget {
        key: inp.key,
        epoch,
        budget_ns: st.budget,
        allowance_ns: st.allowance,
        queue_launches,
        queue_ns: queue_ns(cfg, st.budget, st.scale),
        scale_ppm: st.scale.ppm(),
        used_ns,
        hungry,
    }
}

/// The per-process bound on unfinished estimated work (measured ns) for a
/// slice with `budget` true ns this period: `queue_budget_ppm` of the
/// budget, at most `queue_period_ppm` of the period; 0 (unbounded) only when
/// both are configured off. Never 0 otherwise, so a zero budget still means
/// "one launch at a time", not "no bound".
fn queue_ns(cfg: &ArbiterConfig, budget: u64, scale: Scale) -> u64 {
    let ppm = |ns: u64, ppm: u64| (u128::from(ns) * u128::from(ppm) / 1_000_000) as u64;
    let by_budget = (cfg.queue_budget_ppm != 0).then(|| ppm(budget, cfg.queue_budget_ppm));
    let by_period = (cfg.queue_period_ppm != 0).then(|| ppm(cfg.period_ns, cfg.queue_period_ppm));
    match (by_budget, by_period) {
        (None, None) => 0,
        (Some(a), Some(b)) => scale.to_measured(a.min(b)).max(1),
        (Some(a), None) | (None, Some(a)) => scale.to_measured(a).max(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(slice: u64, share: u32, consumed: u64) -> SliceInput {
        SliceInput {
            key: SliceKey { slice, dev: 0 },
            device: 0,
            share_bps: share * 100,
            limit_bps: share * 100,
            priority: Priority::Normal,
            consumed_ns: consumed,
            throttle_waits: 0,
            true_ns: None,
        }
    }

    #[test]
    fn queue_bound_follows_the_budget_capped_by_the_period() {
        let mut a = Arbiter::new(ArbiterConfig::default());
        let p = a.config().period_ns;
        a.tick(&[input(1, 10, 0), input(2, 90, 0)]);
        // Both used exactly their shares and were throttled: hungry, budgets = shares.
        let hungry = |slice, share: u32| SliceInput { throttle_waits: 1, ..input(slice, share, p * u64::from(share) / 100) };
        let b = a.tick(&[hungry(1, 10), hungry(2, 90)]);
        assert_eq!((b[0].budget_ns, b[1].budget_ns), (p / 10, 9 * p / 10));
        assert_eq!(b[0].queue_ns, p / 10, "the whole 10% budget, below the period cap");
        assert_eq!(b[1].queue_ns, p / 5, "90% is capped at a fifth of the period");
        assert_eq!(b[0].queue_launches, 4);
        // Bound off by configuration: 0 means unbounded; a zero budget is still bounded.
        let mut off = Arbiter::new(ArbiterConfig { queue_budget_ppm: 0, queue_period_ppm: 0, ..ArbiterConfig::default() });
        assert_eq!(off.tick(&[input(1, 10, 0)])[0].queue_ns, 0);
        let mut zero = Arbiter::new(ArbiterConfig::default());
        assert_eq!(zero.tick(&[input(1, 0, 0)])[0].queue_ns, 1, "a zero budget: one launch at a time, not unbounded");
    }

    #[test]
    fn absent_slice_devices_are_forgotten_and_high_slices_bound_their_device_only() {
        let mut a = Arbiter::new(ArbiterConfig::default());
        let p = a.config().period_ns;
        a.tick(&[input(1, 50, 0), input(2, 50, 0)]);
        a.tick(&[input(1, 50, p / 2)]);
        // Slice 2 was absent from the last tick: it starts afresh (nothing measured), not with p of use.
        let b = a.tick(&[input(1, 50, p), input(2, 50, p)]);
        assert_eq!((b[0].used_ns, b[1].used_ns), (p / 2, 0));
        // Best-effort slices on devices 0, 1, 2; active high slices on 0 and 2 (listed out of order).
        let on = |slice, dev: u32, priority, consumed| SliceInput { device: dev, priority, ..input(slice, 10, consumed) };
        let (be, hi) = (Priority::BestEffort, Priority::High);
        let mut h = Arbiter::new(ArbiterConfig::default());
        let mut specs = [on(1, 0, be, 0), on(2, 1, be, 0), on(3, 2, be, 0), on(4, 2, hi, 0), on(5, 0, hi, 0), on(6, 2, hi, 0)];
        h.tick(&specs);
        for s in &mut specs[3..] {
            s.consumed_ns = p / 20;
        }
        let b = h.tick(&specs);
        let q: Vec<u64> = b.iter().map(|b| b.queue_launches).collect();
        assert_eq!(q, [1, 4, 1, 4, 4, 4]);
    }

        #[test]
    fn the_last_standing_slice_gets_slack_only_while_others_are_hungry() {
        let mut a = Arbiter::new(ArbiterConfig::default());
        let p = a.config().period_ns;
        let slack = p * a.config().last_slack_ppm / 1_000_000;
        assert!(slack > 0);
        // No device truth: the ratio is 1, so the allowance is consumed + budget (+ slack).
        let extra = |b: &Budget, consumed: u64| {
            assert_eq!(b.scale_ppm, Scale::ONE);
            b.allowance_ns - consumed - b.budget_ns
        };
        a.tick(&[input(1, 30, 0), input(2, 70, 0)]);
        // Both throttled: the 70% slice (largest budget) gets the slack, the 30% one none.
        let hungry = |slice, share: u32, waits| SliceInput { throttle_waits: waits, ..input(slice, share, p * u64::from(share) / 100 * waits) };
        let b = a.tick(&[hungry(1, 30, 1), hungry(2, 70, 1)]);
        assert_eq!(extra(&b[0], 3 * p / 10), 0);
        assert_eq!(extra(&b[1], 7 * p / 10), slack);
        // The 30% slice satisfied: the 70% one is alone, no slack (its limit holds).
        let b = a.tick(&[input(1, 30, 3 * p / 10), hungry(2, 70, 2)]);
        assert_eq!(extra(&b[1], 14 * p / 10), 0);
        // A high slice active on the device: no slack either.
        let mut h = Arbiter::new(ArbiterConfig::default());
        let high = |c| SliceInput { priority: Priority::High, ..input(3, 10, c) };
        h.tick(&[input(1, 30, 0), input(2, 60, 0), high(0)]);
        let b = h.tick(&[hungry(1, 30, 1), hungry(2, 60, 1), high(p / 20)]);
        assert!(b.iter().zip([3 * p / 10, 6 * p / 10, p / 20]).all(|(b, c)| extra(b, c) == 0), "{b:?}");
        // Off by configuration.
        let mut off = Arbiter::new(ArbiterConfig { last_slack_ppm: 0, ..ArbiterConfig::default() });
        off.tick(&[input(1, 30, 0), input(2, 70, 0)]);
        let b = off.tick(&[hungry(1, 30, 1), hungry(2, 70, 1)]);
        assert_eq!(extra(&b[1], 7 * p / 10), 0);
    }

    /// A closed loop on one device: every slice always has work, in
    /// kernels of `kernel_ns[i]`, and launches while its consumption is
    /// below its allowance (the gate's rule: a launch goes while any
    /// allowance is left, whatever its length), then waits for the next
    /// period (throttled, so hungry). No device truth (scale 1). Returns
    /// what each slice used over `periods` periods after ten of warm-up, as
    /// ppm of that time.
    fn closed_loop(specs: &[(u32, u32)], kernel_ns: &[u64], periods: u64) -> Vec<u64> {
        let mut a = Arbiter::new(ArbiterConfig::default());
        let p = a.config().period_ns;
        let n = specs.len();
        let (mut consumed, mut waits, mut start) = (vec![0u64; n], vec![0u64; n], vec![0u64; n]);
        for t in 0..10 + periods {
            if t == 10 {
                start.clone_from(&consumed);
            }
            let inputs: Vec<SliceInput> = (0..n)
                .map(|i| SliceInput { share_bps: specs[i].0 * 100, limit_bps: specs[i].1 * 100, throttle_waits: waits[i], ..input(i as u64 + 1, 0, consumed[i]) })
                .collect();
            for (i, b) in a.tick(&inputs).iter().enumerate() {
                while consumed[i] < b.allowance_ns {
                    consumed[i] += kernel_ns[i];
                }
                waits[i] += 1;
            }
        }
        (0..n).map(|i| (consumed[i] - start[i]) * 1_000_000 / (p * periods)).collect()
    }

    #[test]
    fn a_cap_holds_for_a_last_standing_slice_smaller_than_the_slack() {
        // Two saturating slices capped at 5% and 3% (share = limit): the 5%
        // one is the last-standing slice, and the slack (10% of the period)
        // is twice its budget. It used to run at 10%: its budget was held
        // at zero by a deficit that could not go lower, and the slack was
        // granted in full every period.
        let used = closed_loop(&[(5, 5), (3, 3)], &[100_000, 100_000], 400);
        assert!(used[0] <= 52_000, "the 5% slice used {} ppm", used[0]);
        assert!(used[1] <= 32_000, "the 3% slice used {} ppm", used[1]);
        // And it is not starved either: the slack is paid back, not lost.
        assert!(used[0] >= 48_000, "the 5% slice used {} ppm", used[0]);
    }

    #[test]
    fn a_cap_holds_for_kernels_longer_than_the_budget() {
        // A 10% slice (1 ms a period) running 5 ms kernels beside a 90% one:
        // the gate lets each 5 ms kernel go on any allowance left, so the
        // overshoot is 4 ms. A deficit bounded at two budgets forgave 2 ms
        // of it: one kernel every other period, 25% of the GPU.
        let used = closed_loop(&[(10, 10), (90, 90)], &[5_000_000, 100_000], 400);
        assert!(used[0] <= 105_000, "the 10% slice used {} ppm", used[0]);
        assert!(used[0] >= 95_000, "the 10% slice used {} ppm", used[0]);
    }

    #[test]
    fn a_replan_grants_the_period_in_progress_the_new_budgets() {
        let mut a = Arbiter::new(ArbiterConfig { last_slack_ppm: 0, ..ArbiterConfig::default() });
        let p = a.config().period_ns;
        a.tick(&[input(1, 30, 0), input(2, 70, 0)]);
        let hungry = |slice, share: u32, consumed, waits| SliceInput { throttle_waits: waits, ..input(slice, share, consumed) };
        let b = a.tick(&[hungry(1, 30, 3 * p / 10, 1), hungry(2, 70, 7 * p / 10, 1)]);
        assert_eq!((b[0].allowance_ns, b[1].allowance_ns), (6 * p / 10, 14 * p / 10));
        // Mid-period resize to 60/40, slice 2 already past its new budget:
        // the allowances are re-based on the consumption at the tick.
        let now = [input(1, 60, 4 * p / 10), input(2, 40, 13 * p / 10), input(3, 0, 0)];
        let r = a.replan(&now);
        let (r0, r1) = (r[0].unwrap(), r[1].unwrap());
        assert_eq!((r0.budget_ns, r1.budget_ns), (6 * p / 10, 4 * p / 10));
        assert_eq!((r0.allowance_ns, r1.allowance_ns), (9 * p / 10, 11 * p / 10));
        assert_eq!((r0.epoch, r0.hungry), (2, true), "no tick, the last tick's view");
        assert_eq!(r[2], None, "not ticked yet: its first tick is its start");
        assert_eq!(a.replan(&now), r, "idempotent");
        assert_eq!(a.epoch(), 2);
        // The next tick closes the whole period; the deficit settles as after a resize at a tick.
        let b = a.tick(&[hungry(1, 60, 9 * p / 10, 2), hungry(2, 40, 11 * p / 10, 2)]);
        assert_eq!((b[0].budget_ns, b[1].budget_ns), (6 * p / 10, 4 * p / 10));
        assert_eq!((b[0].allowance_ns, b[1].allowance_ns), (15 * p / 10, 15 * p / 10));
    }

    #[test]
    fn persistent_overuse_is_paid_back_beyond_a_quarter_of_the_budget() {
        // A 10% slice that keeps using 15% (true time): the integral must cut
        // its budget below 75% of the fair 10%, which ±half a budget could not.
        let mut a = Arbiter::new(ArbiterConfig::default());
        let p = a.config().period_ns;
        let mut last = 0;
        for used in 0..6u64 {
            let inp = SliceInput { throttle_waits: used, true_ns: Some(used * 15 * p / 100), ..input(1, 10, used * 15 * p / 100) };
            let b = a.tick(&[inp, SliceInput { throttle_waits: used, true_ns: Some(used * 85 * p / 100), ..input(2, 90, used * 85 * p / 100) }]);
            last = b[0].budget_ns;
        }
        assert!(last < p / 10 * 3 / 4, "budget {last} of a fair {}", p / 10);
    }
}
