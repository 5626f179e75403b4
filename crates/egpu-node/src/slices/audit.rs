//! The slice manager's side of the memory audit ([`crate::audit`]).

use super::{Slice, SliceManager};
use crate::audit::{ChargeSampler, Charges};
use crate::devices::ProcMemory;
use egpu_core::Bytes;
use std::collections::BTreeSet;

impl SliceManager {
    /// Sets whether the audit publishes untracked memory to the hook. When
    /// it does not, what an earlier `egpud` published is taken back.
    pub fn set_audit(&mut self, charges: bool) {
        self.audit_charges = charges;
        if charges {
            return;
        }
        for s in self.slices.values_mut() {
            drop_untracked(s);
        }
    }

    /// A slice adopted late (it could not be adopted at start-up) keeps
    /// what an earlier `egpud` published only if this one charges too.
    pub(super) fn settle_adopted_untracked(&self, s: &mut Slice) {
        if !self.audit_charges {
            drop_untracked(s);
        }
    }

    /// The usage files of every slice on host device `host`, to read
    /// around the driver's list without this manager's lock.
    pub fn charge_sampler(&self, host: u32) -> ChargeSampler {
        ChargeSampler::new(
            self.slices
                .values()
                .map(|s| (s.record.id.clone(), s.usage.clone(), s.devices_on(host).collect::<Vec<usize>>()))
                .filter(|(_, _, on)| !on.is_empty())
                .collect(),
        )
    }

    /// One audit of host device `host`: `listed` is the driver's
    /// per-process memory (`None`: it cannot say), `before` the largest charges read
    /// around it ([`SliceManager::charge_sampler`]). What is found untracked is
    /// published to the hook if [`SliceManager::set_audit`] said so.
    pub fn audit_device(&mut self, host: u32, before: &Charges, listed: Option<&[ProcMemory]>, slack: u64) {
        let charge = self.audit_charges;
        let mut in_slices: BTreeSet<u32> = BTreeSet::new();
        for s in self.slices.values_mut() {
            let on: Vec<usize> = s.devices_on(host).collect();
            if on.is_empty() {
                continue;
            }
            // A usage file the truncation guard gave up on reads as zeros
            // until the sweep maps it anew: its charges are unknown.
            let listed = listed.filter(|_| !s.usage.detached());
            let Some(listed) = listed else {
                for &i in &on {
                    if charge {
                        clear_untracked(s, i);
                    }
                    s.audit[i].unknown();
                }
                continue;
            };
            let pids: BTreeSet<u32> = s.usage.processes().into_iter().filter(|p| p.alive).filter_map(|p| p.owner_pid).collect();
            in_slices.extend(&pids);
            let driver: u64 = listed.iter().filter(|p| pids.contains(&p.pid)).map(|p| p.bytes).sum();
            let earlier = before.get(&s.record.id);
            for &i in &on {
                let now = s.usage.used(i);
                // A slice made since the first reading has only this one.
                let then = earlier.and_then(|e| e.iter().find(|(d, _)| *d == i)).map_or(now, |&(_, c)| c);
                let was = s.audit[i].untracked;
                let untracked = s.audit[i].observe(driver, now.max(then), slack);
                if charge && untracked != was {
                    s.limits.set_mem_untracked(i, untracked);
                }
                if was == 0 && untracked > 0 {
                    tracing::warn!(slice = %s.record.spec.name, device = host, driver = %Bytes(driver), charged = %Bytes(now.max(then)), untracked = %Bytes(untracked), pids = ?pids,
                        counted = charge,
                        "the driver reports more memory for the slice's processes than they were charged (memory the hook cannot follow, e.g. an exported allocation imported back)");
                } else if was > 0 && untracked == 0 {
                    tracing::info!(slice = %s.record.spec.name, device = host, "the slice's untracked memory is gone");
                }
            }
        }
        match listed {
            Some(listed) => {
                let outside: u64 = listed.iter().filter(|p| !in_slices.contains(&p.pid)).map(|p| p.bytes).sum();
                self.unmanaged.insert(host, outside);
            }
            None => {
                self.unmanaged.remove(&host);
            }
        }
    }

    /// Memory the driver reported on host device `host` for processes of no
    /// slice at the last audit (`None`: not audited).
    pub fn unmanaged(&self, host: u32) -> Option<u64> {
        self.unmanaged.get(&host).copied()
    }
}

/// Takes back what the limits file says is untracked (the hook stops
/// counting it) and forgets the carried figure.
fn drop_untracked(s: &mut Slice) {
    for i in 0..s.audit.len() {
        clear_untracked(s, i);
    }
}

/// Takes back slice device `i`'s published untracked figure.
fn clear_untracked(s: &mut Slice, i: usize) {
    if s.audit[i].untracked > 0 {
        s.limits.set_mem_untracked(i, 0);
    }
    s.audit[i].untracked = 0;
}

impl Slice {
    /// The slice's device indices on host device `host`.
    fn devices_on(&self, host: u32) -> impl Iterator<Item = usize> + '_ {
        self.record.spec.devices.iter().enumerate().filter(move |(_, d)| d.device == host).map(|(i, _)| i)
    }
}
