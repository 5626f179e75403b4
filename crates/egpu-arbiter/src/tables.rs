//! The thin adapter between [`Arbiter`] and the slice table: read every
//! slice's seqlocked spec and usage counters, tick, publish.
//!
//! `egpud` calls [`Arbiter::tick_tables`] once per period (a tokio interval
//! of [`ArbiterConfig::period_ns`]) with a [`TableRef`] per live slice, and
//! [`Arbiter::replan_tables`] when a resize is published between ticks.

use crate::arbiter::{Arbiter, Budget, SliceInput, SliceKey};
#[cfg(doc)]
use crate::arbiter::ArbiterConfig;
use egpu_abi::{LimitsWriter, MAX_DEVICES, SliceState, UsageFile};
use egpu_core::Priority;
use std::sync::atomic::Ordering;

/// One slice's tables, as `egpud` holds them.
#[derive(Clone, Copy)]
pub struct TableRef<'a> {
    /// Any stable id of the slice (e.g. its index in `egpud`'s registry).
    pub slice: u64,
    pub limits: &'a LimitsWriter,
    pub usage: &'a UsageFile,
    /// Per slice device: the slice's cumulative true GPU time from the
    /// device's accounting (sum over its processes; `egpud` keeps the sum
    /// monotonic across process exits), or `None`.
    pub true_ns: &'a [Option<u64>],
}

impl std::fmt::Debug for TableRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TableRef").field("slice", &self.slice).field("limits", &self.limits.path()).finish()
    }
}

/// Why a slice was skipped.
#[derive(Debug, thiserror::Error)]
pub enum TablesError {
    #[error("slice {slice}: limits and usage disagree on the device count ({limits} vs {usage})")]
    DeviceCount { slice: u64, limits: usize, usage: usize },
}

impl Arbiter {
    /// Reads, ticks and publishes. Deleted slices keep running at their last
    /// allowance until `egpud` drops them. Returns what was published and
    /// the slices skipped for inconsistent tables.
    pub fn tick_tables(&mut self, now_ns: u64, tables: &[TableRef<'_>]) -> (Vec<Budget>, Vec<TablesError>) {
        let (inputs, owners, errors) = read_tables(tables);
        let budgets = self.tick(&inputs);
        for (b, &ti) in budgets.iter().zip(&owners) {
            publish(tables[ti].limits, b, self.config().period_ns, Some(now_ns));
        }
        (budgets, errors)
    }

    /// A compute resize between ticks: reads the tables and publishes
    /// [`Arbiter::replan`] (the period in progress re-planned under the new
    /// specs; `epoch_start_ns` and the next tick unchanged). `egpud` calls
    /// it when a resize is published, so that the new shares apply at once
    /// rather than at the next tick. Returns what was published.
    pub fn replan_tables(&mut self, tables: &[TableRef<'_>]) -> (Vec<Budget>, Vec<TablesError>) {
        let (inputs, owners, errors) = read_tables(tables);
        let budgets: Vec<Budget> = self
            .replan(&inputs)
            .into_iter()
            .zip(&owners)
            .filter_map(|(b, &ti)| b.map(|b| (b, ti)))
            .map(|(b, ti)| {
                publish(tables[ti].limits, &b, self.config().period_ns, None);
                b
            })
            .collect();
        (budgets, errors)
    }
}

fn read_tables(tables: &[TableRef<'_>]) -> (Vec<SliceInput>, Vec<usize>, Vec<TablesError>) {
    let mut inputs = Vec::with_capacity(tables.len() * 2);
    let mut owners = Vec::with_capacity(tables.len() * 2);
    let mut errors = Vec::new();
    for (ti, t) in tables.iter().enumerate() {
        let snap = t.limits.snapshot();
        if snap.state == SliceState::Deleted {
            continue;
        }
        let n = snap.n_devices.min(MAX_DEVICES);
        if t.usage.n_devices() != n {
            errors.push(TablesError::DeviceCount { slice: t.slice, limits: n, usage: t.usage.n_devices() });
            continue;
        }
        let u = t.usage.region();
        let priority = Priority::from_code(snap.priority).unwrap_or(Priority::Normal);
        for (d, dl) in snap.devices().iter().enumerate() {
            inputs.push(SliceInput {
                key: SliceKey { slice: t.slice, dev: d as u32 },
                device: dl.host_index,
                share_bps: dl.compute_share_bps,
                limit_bps: dl.compute_limit_bps,
                priority,
                consumed_ns: u.consumed_ns[d].load(Ordering::Acquire),
                throttle_waits: u.throttle_waits[d].load(Ordering::Acquire),
                true_ns: t.true_ns.get(d).copied().flatten(),
            });
            owners.push(ti);
        }
    }
    (inputs, owners, errors)
}

/// Publishes one slice device's budget; `epoch_start_ns` only at a tick.
fn publish(w: &LimitsWriter, b: &Budget, period: u64, tick_ns: Option<u64>) {
    let r = w.region();
    r.arbiter_period_ns.store(period, Ordering::Relaxed);
    let d = &r.devices[b.key.dev as usize];
    d.queue_launches.store(b.queue_launches, Ordering::Relaxed);
    d.queue_ns.store(b.queue_ns, Ordering::Relaxed);
    d.scale_ppm.store(b.scale_ppm, Ordering::Relaxed);
    if let Some(now_ns) = tick_ns {
        d.epoch_start_ns.store(now_ns, Ordering::Relaxed);
    }
    d.allowance_ns.store(b.allowance_ns, Ordering::Release);
    w.set_budget(b.key.dev as usize, b.epoch, b.budget_ns);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ArbiterConfig;
    use crate::gate::{Decision, GateView, ProcGate};
    use egpu_abi::limits::DeviceInit;
    use egpu_abi::{DeviceLimitsSnapshot, LimitsReader};

    fn slice(dir: &std::path::Path, name: &str, share: u32, limit: u32) -> (LimitsWriter, UsageFile) {
        let d = dir.join(name);
        std::fs::create_dir(&d).unwrap();
        let init = DeviceInit {
            uuid: "GPU-x".into(),
            host_index: 0,
            limits: DeviceLimitsSnapshot { host_index: 0, mem_limit: 1 << 30, compute_share_bps: share, compute_limit_bps: limit },
        };
        (LimitsWriter::create(&d.join("limits"), name, 1, &[init]).unwrap(), UsageFile::create(&d.join("usage"), 1).unwrap())
    }

    #[test]
    fn tick_publishes_allowances_the_hook_gate_obeys() {
        let dir = tempfile::tempdir().unwrap();
        let (la, ua) = slice(dir.path(), "a", 3000, 3000);
        let (lb, ub) = slice(dir.path(), "b", 7000, 7000);
        let mut arb = Arbiter::new(ArbiterConfig::default());
        let p = arb.config().period_ns;
        let truth = [Some(0)];
        let refs = [
            TableRef { slice: 1, limits: &la, usage: &ua, true_ns: &truth },
            TableRef { slice: 2, limits: &lb, usage: &ub, true_ns: &truth },
        ];
        let (b, errs) = arb.tick_tables(5, &refs);
        assert!(errs.is_empty());
        assert_eq!((b[0].budget_ns, b[1].budget_ns), (3 * p / 10, 7 * p / 10));
        // The hook's read-only view sees the published words, and its gate obeys them.
        let r = LimitsReader::open(la.path()).unwrap();
        let d = &r.region().devices[0];
        assert_eq!(d.allowance_ns.load(Ordering::Relaxed), 3 * p / 10);
        assert_eq!(d.epoch_start_ns.load(Ordering::Relaxed), 5);
        assert_eq!(d.budget_epoch.load(Ordering::Relaxed), 1);
        let v = GateView::from_tables(r.region(), ua.region(), 0, 3000, None);
        let g = ProcGate::new();
        assert_eq!(g.before_launch(&v, 6), Decision::Go);
        ua.region().consumed_ns[0].store(3 * p / 10, Ordering::Relaxed);
        assert_eq!(g.before_launch(&v, 6), Decision::WaitUntil(5 + p));
        // A deleted slice is skipped; a resize shows at the next tick.
        lb.mark_deleted();
        la.publish(1, &[DeviceLimitsSnapshot { host_index: 0, mem_limit: 1 << 30, compute_share_bps: 6000, compute_limit_bps: 6000 }]).unwrap();
        let (b, _) = arb.tick_tables(5 + p, &refs);
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].budget_ns, 6 * p / 10);
    }

    #[test]
    fn inconsistent_tables_are_reported_not_ticked() {
        let dir = tempfile::tempdir().unwrap();
        let (la, _) = slice(dir.path(), "a", 3000, 3000);
        let u2 = UsageFile::create(&dir.path().join("u2"), 2).unwrap();
        let mut arb = Arbiter::new(ArbiterConfig::default());
        let (b, errs) = arb.tick_tables(0, &[TableRef { slice: 9, limits: &la, usage: &u2, true_ns: &[] }]);
        assert!(b.is_empty());
        assert!(matches!(errs[..], [TablesError::DeviceCount { slice: 9, limits: 1, usage: 2 }]));
    }
}
