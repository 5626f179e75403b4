//! The thin adapter between [`Arbiter`] and the slice table: read every
//! slice's seqlocked spec and usage counters, tick, publish.
//!
//! `egpud` calls [`Arbiter::tick_tables`] once per period (a tokio interval
//! of [`ArbiterConfig::period_ns`]) with a [`TableRef`] per live slice.

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
        let budgets = self.tick(&inputs);
        let period = self.config().period_ns;
        for (b, &ti) in budgets.iter().zip(&owners) {
            let w = tables[ti].limits;
            let r = w.region();
            r.arbiter_period_ns.store(period, Ordering::Relaxed);
            let d = &r.devices[b.key.dev as usize];
            d.queue_launches.store(b.queue_launches, Ordering::Relaxed);
            d.queue_ns.store(b.queue_ns, Ordering::Relaxed);
            d.scale_ppm.store(b.scale_ppm, Ordering::Relaxed);
            d.epoch_start_ns.store(now_ns, Ordering::Relaxed);
            d.allowance_ns.store(b.allowance_ns, Ordering::Release);
            w.set_budget(b.key.dev as usize, b.epoch, b.budget_ns);
        }
        (budgets, errors)
    }
}
