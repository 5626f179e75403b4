//! The per-period allocation: shares, limits, priorities and measured demand
//! in, GPU-time budgets out. Pure integer arithmetic, no allocation.
//!
//! For one device and a period of `P` ns, slice *i* has a guarantee
//! `g = P·share`, a cap `c = P·limit`, and a demand: either *hungry* (it was
//! throttled or backlogged all period, so it would use more) or satisfied
//! with what it used, `u`. Then:
//!
//! 1. every slice's budget starts at its guarantee `g` — whether it is busy
//!    or idle, so a slice that wakes up can always start at its share. A
//!    satisfied slice is expected to want what it used plus 25% for growth;
//! 2. the capacity nobody is expected to use inside their guarantee,
//!    `F = P − Σ min(want, g)`, is water-filled, class by class (high, then
//!    normal, then best-effort: strict order), weighted by share within a
//!    class, to slices that want more
//!    than their guarantee, up to `min(want, c)`;
//! 3. what is still left is handed out the same way as headroom up to each
//!    cap, so a slice whose demand grows finds room at once.
//!
//! Budgets are allowances, not reservations: an idle slice's guarantee is lent
//! (through `F`) while it stays in its budget, so the sum of budgets may exceed
//! `P`. The overbooking is bounded: `Σ budgets ≤ P + Σ (g − min(want, g))
//! ≤ 2P`. A lender that wakes up competes for one period and is counted as
//! busy at the next tick, which takes the loan back.

use egpu_core::Priority;

/// Basis points in 100%.
pub const FULL_BPS: u64 = 10_000;

/// One slice's claim on one device for the next period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    /// Guaranteed share, basis points (clamped to `limit_bps`).
    pub share_bps: u32,
    /// Cap, basis points (clamped to 100%).
    pub limit_bps: u32,
    pub priority: Priority,
    /// GPU time (true ns) the slice used in the last period.
    pub used_ns: u64,
    /// Whether it would have used more: throttled, or backlogged all period.
    pub hungry: bool,
}

impl Claim {
    /// Cap and guarantee in ns for a period of `period_ns`.
    pub fn cap_and_guarantee(&self, period_ns: u64) -> (u64, u64) {
        let limit = u64::from(self.limit_bps).min(FULL_BPS);
        let share = u64::from(self.share_bps).min(limit);
        (mul_bps(period_ns, limit), mul_bps(period_ns, share))
    }

    /// What the slice is expected to use next period, at most its cap: all
    /// of it when hungry, else what it used plus a quarter for growth.
    pub fn want(&self, period_ns: u64) -> u64 {
        let (cap, _) = self.cap_and_guarantee(period_ns);
        if self.hungry { cap } else { self.used_ns.saturating_add(self.used_ns / 4).min(cap) }
    }

    fn weight(&self) -> u64 {
        // Zero-share (pure best-effort) slices still split leftovers among themselves.
        u64::from(self.share_bps.min(self.limit_bps)).max(1)
    }
}

fn mul_bps(ns: u64, bps: u64) -> u64 {
    (u128::from(ns) * u128::from(bps) / u128::from(FULL_BPS)) as u64
}

const CLASSES: [Priority; 3] = [Priority::High, Priority::Normal, Priority::BestEffort];

/// Computes next period's budget (true GPU ns) of every claim into `budgets`
/// (same length and order as `claims`). See the module text for the rules.
///
/// # Panics
/// If `budgets.len() != claims.len()`.
pub fn allocate(period_ns: u64, claims: &[Claim], budgets: &mut [u64]) {
    assert_eq!(claims.len(), budgets.len(), "one budget per claim");
    let mut expected: u64 = 0;
    for (c, b) in claims.iter().zip(budgets.iter_mut()) {
        let (_, g) = c.cap_and_guarantee(period_ns);
        *b = g;
        expected = expected.saturating_add(c.want(period_ns).min(g));
    }
    let mut free = period_ns.saturating_sub(expected);
    // Pass 1: to those that want more than their guarantee, up to what they want.
    for class in CLASSES {
        free = water_fill(period_ns, claims, budgets, free, |c| c.priority == class, |c| c.want(period_ns));
    }
    // Pass 2: headroom up to the caps.
    for class in CLASSES {
        free = water_fill(period_ns, claims, budgets, free, |c| c.priority == class, |c| c.cap_and_guarantee(period_ns).0);
    }
}

/// Gives `free` ns to the claims selected by `pick`, in proportion to their
/// weights, never raising a budget above `ceiling(claim)`. Returns what is left.
fn water_fill(
    period_ns: u64,
    claims: &[Claim],
    budgets: &mut [u64],
    mut free: u64,
    pick: impl Fn(&Claim) -> bool,
    ceiling: impl Fn(&Claim) -> u64,
) -> u64 {
    let _ = period_ns;
    // Each round either fills at least one claim to its ceiling or hands out
    // everything (up to rounding), so it ends within `claims.len() + 1` rounds.
    for _ in 0..=claims.len() {
        if free == 0 {
            break;
        }
        let weight: u64 = claims.iter().zip(budgets.iter()).filter(|(c, b)| pick(c) && **b < ceiling(c)).map(|(c, _)| c.weight()).sum();
        if weight == 0 {
            break;
        }
        let mut given = 0u64;
        for (c, b) in claims.iter().zip(budgets.iter_mut()) {
            let ceil = ceiling(c);
            if !pick(c) || *b >= ceil {
                continue;
            }
            let portion = (u128::from(free) * u128::from(c.weight()) / u128::from(weight)) as u64;
            let take = portion.min(ceil - *b);
            *b += take;
            given += take;
        }
        if given == 0 {
            // Only rounding crumbs are left: give them one ns at a time in order.
            for (c, b) in claims.iter().zip(budgets.iter_mut()) {
                if free == 0 {
                    break;
                }
                if pick(c) && *b < ceiling(c) {
                    *b += 1;
                    free -= 1;
                }
            }
            break;
        }
        free -= given;
    }
    free
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = 10_000_000;

    fn claim(share: u32, limit: u32, priority: Priority, used_pct: u64, hungry: bool) -> Claim {
        Claim { share_bps: share * 100, limit_bps: limit * 100, priority, used_ns: P * used_pct / 100, hungry }
    }

    fn run(claims: &[Claim]) -> Vec<u64> {
        let mut b = vec![0; claims.len()];
        allocate(P, claims, &mut b);
        b.iter().map(|x| x * 100 / P).collect()
    }

    #[test]
    fn saturating_slices_get_their_shares() {
        let n = Priority::Normal;
        assert_eq!(run(&[claim(30, 30, n, 30, true), claim(70, 70, n, 70, true)]), vec![30, 70]);
        assert_eq!(run(&[claim(20, 100, n, 30, true), claim(30, 100, n, 30, true), claim(50, 100, n, 40, true)]), vec![20, 30, 50]);
    }

    #[test]
    fn lone_busy_slice_takes_idle_capacity_up_to_its_limit() {
        let n = Priority::Normal;
        assert_eq!(run(&[claim(30, 100, n, 30, true), claim(70, 100, n, 0, false)]), vec![100, 70]);
        assert_eq!(run(&[claim(30, 40, n, 30, true), claim(70, 100, n, 0, false)])[0], 40);
        assert_eq!(run(&[claim(30, 100, n, 30, true)]), vec![100]);
    }

    #[test]
    fn surplus_goes_by_share_weight() {
        let n = Priority::Normal;
        // 40% idle: split 1:3 between 15% and 45% shares.
        assert_eq!(run(&[claim(15, 100, n, 15, true), claim(45, 100, n, 45, true), claim(40, 100, n, 0, false)]), vec![25, 75, 40]);
    }

    #[test]
    fn a_slice_using_part_of_its_share_keeps_its_guarantee_and_lends_the_rest() {
        let n = Priority::Normal;
        let b = run(&[claim(50, 100, n, 10, false), claim(50, 100, n, 50, true)]);
        assert_eq!(b, vec![50, 87], "10% used + 25% growth stays with the first slice");
    }

    #[test]
    fn best_effort_yields_first() {
        let (h, n, be) = (Priority::High, Priority::Normal, Priority::BestEffort);
        // 50% free beyond guarantees: surplus goes class by class, high first.
        let b = run(&[claim(20, 100, h, 20, true), claim(20, 40, n, 20, true), claim(10, 100, be, 10, true)]);
        assert_eq!(b, vec![70, 20, 10]);
        // With high capped, normal is served next, and best-effort gets the rest.
        let b = run(&[claim(20, 30, h, 20, true), claim(20, 40, n, 20, true), claim(10, 100, be, 10, true)]);
        assert_eq!(b, vec![30, 40, 30]);
    }

    #[test]
    fn high_priority_gets_its_share_back_the_period_it_shows_demand() {
        let (h, be) = (Priority::High, Priority::BestEffort);
        // High idle: best-effort borrows everything.
        let idle = run(&[claim(25, 100, h, 0, false), claim(0, 100, be, 100, true)]);
        assert_eq!(idle, vec![25, 100], "the idle high slice keeps its guarantee as allowance");
        // High busy at 60%: it gets that plus growth; best-effort keeps only the rest.
        let busy = run(&[claim(25, 100, h, 60, false), claim(0, 100, be, 40, true)]);
        assert_eq!(busy, vec![75, 25]);
    }

    #[test]
    fn edge_cases() {
        let n = Priority::Normal;
        // All idle: everyone may still start at its guarantee, plus headroom.
        assert_eq!(run(&[claim(30, 30, n, 0, false), claim(20, 100, n, 0, false)]), vec![30, 100]);
        // Limit below share (rejected upstream) is treated as share = limit.
        assert_eq!(run(&[claim(50, 20, n, 0, true)]), vec![20]);
        // Shares summing below 100 with limits = shares: nothing above the limits.
        assert_eq!(run(&[claim(10, 10, n, 10, true), claim(20, 20, n, 20, true)]), vec![10, 20]);
        // No claims.
        allocate(P, &[], &mut []);
        // Zero period.
        let mut b = [7];
        allocate(0, &[claim(30, 100, n, 0, true)], &mut b);
        assert_eq!(b, [0]);
    }

    #[test]
    fn zero_share_best_effort_slices_split_leftovers_evenly() {
        let be = Priority::BestEffort;
        assert_eq!(run(&[claim(0, 100, be, 50, true), claim(0, 100, be, 50, true)]), vec![50, 50]);
    }
}
