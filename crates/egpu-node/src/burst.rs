//! Burst memory: a slice's memory limit grows on demand, up to its burst
//! cap, into device memory that no slice has reserved, and shrinks back when
//! the slice no longer uses it.
//!
//! Per device, the **pool** is the device's memory less the guarantees
//! (`DeviceShare::memory`) of its slices. What a slice has **borrowed** is
//! how far its limit, or its usage if that is higher, exceeds its guarantee;
//! the invariant is that the borrows on a device never exceed its pool, so a
//! guarantee can always be allocated in full, whatever the others borrowed.
//!
//! The hook asks: an allocation over the limit of a slice with a burst cap
//! raises `UsageRegion::mem_want` to the total it needs and waits (at most
//! 100 ms) for the word to be cleared. Every arbiter tick (10 ms), [`serve`]
//! takes each request and grants it (publishes a higher limit, then clears
//! the word) if the pool has room. If it has not, it first takes back
//! grants other slices do not use (lowers their limits to their usage) and
//! keeps the request for the next tick; a request that would not fit even
//! then is answered with no grant. A grant unused for [`LINGER`] is taken
//! back the same way.
//!
//! Taking back is exact: the hook reads the limit inside the slice's charge
//! lock, so once `egpud` has seen that lock free after publishing a lower
//! limit, every later charge is checked against it and every earlier one is
//! in the usage records. Until then the old limit still counts as borrowed
//! ([`Burst::held`]). The grants live in memory only: a restarted `egpud`
//! reads them back from the limits files (`SliceManager::adopt`).

use crate::slices::{Slice, SliceManager};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// A grant the slice has not used for this long is taken back.
pub const LINGER: Duration = Duration::from_secs(2);

/// A request waits at most this many ticks for memory being taken back
/// (the hook itself waits at most 100 ms).
const MAX_DEFERRALS: u32 = 3;

/// What [`serve`] remembers between ticks.
#[derive(Debug, Default)]
pub struct Burst {
    /// (slice, slice device) → a limit that was lowered and may still be
    /// charged against, until the charge lock is seen free.
    held: HashMap<(String, usize), u64>,
    /// (slice, slice device) → since when its grant has been partly unused.
    unused_since: HashMap<(String, usize), Instant>,
    /// (slice, slice device) → ticks its request has been kept waiting for
    /// taken-back memory.
    deferred: HashMap<(String, usize), u32>,
    /// Grants made, requests refused (cumulative, for logs and tests).
    pub grants: u64,
    pub refusals: u64,
}

/// One slice device as [`serve`] sees it.
struct View {
    slice: String,
    dev: usize,
    device: usize,
    guarantee: u64,
    cap: u64,
    limit: u64,
    used: u64,
}

impl Burst {
    /// Counts `limit` as still charged against on `slice`'s device `dev`
    /// until its charge lock is seen free (a limit was just lowered).
    pub(crate) fn hold(&mut self, slice: &str, dev: usize, limit: u64) {
        let h = self.held.entry((slice.to_string(), dev)).or_insert(0);
        *h = (*h).max(limit);
    }

    fn held_limit(&self, slice: &str, dev: usize) -> u64 {
        self.held.get(&(slice.to_string(), dev)).copied().unwrap_or(0)
    }

    /// What `v`'s slice borrows: its limit, usage or still-held old limit
    /// above its guarantee. Usage is not capped at the burst cap: a slice
    /// resized below what it holds really does occupy unreserved memory,
    /// and over-counting only makes `egpud` lend less.
    fn borrowed(&self, v: &View) -> u64 {
        let held = self.held_limit(&v.slice, v.dev);
        v.limit.max(v.used).max(held).saturating_sub(v.guarantee)
    }
}

fn views(m: &SliceManager) -> Vec<View> {
    let mut out = Vec::new();
    for s in m.slices() {
        let limits = s.mem_limits();
        for (i, d) in s.record.spec.devices.iter().enumerate() {
            out.push(View {
                slice: s.name().to_string(),
                dev: i,
                device: d.device as usize,
                guarantee: d.memory.0,
                cap: d.memory_cap().0,
                limit: limits[i],
                used: s.usage.used(i),
            });
        }
    }
    out
}

/// Memory lent out per device: borrows above the guarantees, counting
/// limits that were lowered but may still be charged against.
fn lent(m: &SliceManager, b: &Burst) -> Vec<u64> {
    let mut out = vec![0u64; m.devices().len()];
    for v in views(m) {
        if let Some(x) = out.get_mut(v.device) {
            *x = x.saturating_add(b.borrowed(&v));
        }
    }
    out
}

/// Lowers the grant of `slice`'s device `dev` so that its limit is its usage
/// (never below the guarantee), remembering the old limit as held.
fn take_back(m: &mut SliceManager, b: &mut Burst, v: &View) -> bool {
    let new_grant = v.used.saturating_sub(v.guarantee);
    let Some(s) = m.slice_mut(&v.slice) else { return false };
    if s.granted.get(v.dev).is_none_or(|&g| g <= new_grant) {
        return false;
    }
    s.granted[v.dev] = new_grant;
    publish(s);
    b.hold(&v.slice, v.dev, v.limit);
    tracing::debug!(slice = %v.slice, device = v.device, from = v.limit, to = v.guarantee + new_grant, "took back burst memory");
    true
}

fn publish(s: &Slice) {
    if let Err(e) = s.publish() {
        tracing::warn!(slice = %s.name(), error = %e, "could not publish a burst grant");
    }
}

/// One tick of the manager's burst state (see [`serve`]).
pub fn tick(m: &mut SliceManager, now: Instant) {
    let mut b = std::mem::take(&mut m.burst);
    serve(m, &mut b, now);
    m.burst = b;
}

/// Admission next to the burst pool: `spec`'s guarantees, with every other
/// slice's guarantee and what is lent out now, must fit each device. A
/// slice being resized (`except`) counts with its usage above its new
/// guarantee.
pub fn check_lent(m: &SliceManager, except: Option<&str>, spec: &egpu_core::SliceSpec) -> Result<(), crate::capacity::CapacityError> {
    for d in &spec.devices {
        let dev = d.device as usize;
        let Some(info) = m.devices().get(dev) else { continue };
        let mut held = 0u64;
        let mut others = 0u64;
        for v in views(m).iter().filter(|v| v.device == dev) {
            if Some(v.slice.as_str()) == except {
                // Its current limit may still be charged against after the resize.
                let old = v.used.max(v.limit).max(m.burst.held_limit(&v.slice, v.dev));
                held = held.saturating_add(old.saturating_sub(d.memory.0));
            } else {
                others = others.saturating_add(v.guarantee);
                held = held.saturating_add(m.burst.borrowed(v));
            }
        }
        if others.saturating_add(held).saturating_add(d.memory.0) > info.memory_bytes {
            let free = info.memory_bytes.saturating_sub(others).saturating_sub(held);
            return Err(crate::capacity::CapacityError::Lent { device: d.device, requested: egpu_core::Bytes(d.memory.0), free: egpu_core::Bytes(free), lent: egpu_core::Bytes(held) });
        }
    }
    Ok(())
}

/// One tick: confirm taken-back limits, take back grants unused for
/// [`LINGER`], and answer every slice's pending request.
fn serve(m: &mut SliceManager, b: &mut Burst, now: Instant) {
    let totals: Vec<u64> = m.devices().iter().map(|d| d.memory_bytes).collect();
    // Lowered limits whose charge lock is now free are no longer charged against.
    b.held.retain(|(name, dev), _| m.get(name).is_ok_and(|s| !s.usage.charge_lock_free(*dev)));
    let live: std::collections::HashSet<(String, usize)> = views(m).into_iter().map(|v| (v.slice, v.dev)).collect();
    b.unused_since.retain(|k, _| live.contains(k));
    b.deferred.retain(|k, _| live.contains(k));
    // Grants not used for LINGER go back to the pool.
    for v in views(m) {
        let key = (v.slice.clone(), v.dev);
        if v.limit > v.guarantee && v.used < v.limit {
            let since = *b.unused_since.entry(key.clone()).or_insert(now);
            if now.duration_since(since) >= LINGER && take_back(m, b, &v) {
                b.unused_since.remove(&key);
            }
        } else {
            b.unused_since.remove(&key);
        }
    }
    // Requests, in slice order.
    for v in views(m) {
        let Ok(s) = m.get(&v.slice) else { continue };
        let want = s.usage.take_memory_want(v.dev);
        if want == 0 {
            continue;
        }
        let target = want.min(v.cap);
        if target <= v.limit {
            continue; // already there (another process's request, or a grant this tick)
        }
        let pool = totals.get(v.device).copied().unwrap_or(0).saturating_sub(guarantees(m, v.device));
        let lent_now = lent(m, b).get(v.device).copied().unwrap_or(0);
        let mine = b.borrowed(&v);
        let after = lent_now - mine + target.max(v.used).saturating_sub(v.guarantee);
        if after <= pool {
            if let Some(s) = m.slice_mut(&v.slice) {
                s.granted[v.dev] = target - v.guarantee;
                publish(s);
            }
            b.grants += 1;
            b.unused_since.remove(&(v.slice.clone(), v.dev));
            b.deferred.remove(&(v.slice.clone(), v.dev));
            tracing::debug!(slice = %v.slice, device = v.device, limit = target, "granted burst memory");
            continue;
        }
        // Not enough: what the others hold unused could make room.
        let idle: u64 = views(m)
            .iter()
            .filter(|o| o.device == v.device && o.slice != v.slice && o.limit > o.used.max(o.guarantee))
            .map(|o| o.limit - o.used.max(o.guarantee))
            .sum();
        let key = (v.slice.clone(), v.dev);
        let deferred = b.deferred.get(&key).copied().unwrap_or(0);
        if after <= pool.saturating_add(idle) && idle > 0 && deferred < MAX_DEFERRALS {
            for o in views(m).iter().filter(|o| o.device == v.device && o.slice != v.slice && o.limit > o.used.max(o.guarantee)) {
                take_back(m, b, o);
            }
            // Answered at a next tick, once the taken-back limits are confirmed.
            if let Ok(s) = m.get(&v.slice) {
                s.usage.want_memory(v.dev, want);
            }
            b.deferred.insert(key, deferred + 1);
            continue;
        }
        b.deferred.remove(&key);
        b.refusals += 1;
        tracing::debug!(slice = %v.slice, device = v.device, want, pool, lent = lent_now, "burst request refused: the device's pool is lent out");
    }
}

fn guarantees(m: &SliceManager, device: usize) -> u64 {
    m.slices().flat_map(|s| s.record.spec.devices.iter()).filter(|d| d.device as usize == device).map(|d| d.memory.0).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capacity::CapacityError;
    use crate::devices::FakeGpus;
    use crate::slices::{CreateRequest, ResizeRequest, SliceOpError};
    use crate::store::Store;
    use egpu_abi::usage::ProcSlot;
    use egpu_core::{Bytes, DeviceShare, Percent, Priority, SliceSpec};

    const G: u64 = Bytes::GIB;

    fn create(m: &mut SliceManager, name: &str, gib: u64, burst_gib: u64) {
        let d = DeviceShare { device: 0, memory: Bytes::gib(gib), memory_burst: Bytes::gib(burst_gib), compute_share: Percent::ZERO, compute_limit: Percent::FULL };
        m.create(CreateRequest { spec: SliceSpec { name: name.into(), priority: Priority::Normal, devices: vec![d] }, ephemeral: false, owner_pid: None }).unwrap();
    }

    /// A charge as the hook makes it: the limit read inside the charge lock.
    fn charge(m: &SliceManager, name: &str, slot: &ProcSlot, bytes: u64) -> bool {
        let s = m.get(name).unwrap();
        s.usage.try_charge_with(slot, 0, bytes, &|| s.limits.snapshot().devices()[0].mem_limit).is_ok()
    }

    fn limit(m: &SliceManager, name: &str) -> u64 {
        m.get(name).unwrap().limits.snapshot().devices()[0].mem_limit
    }

    /// Guarantees plus what is lent never exceed the device.
    fn check_invariant(m: &SliceManager) {
        let guar: u64 = m.slices().map(|s| s.record.spec.devices[0].memory.0).sum();
        let lent = lent(m, &m.burst)[0];
        assert!(guar + lent <= 10 * G, "guarantees {guar} + lent {lent} exceed the device");
    }

    #[test]
    fn grants_from_the_pool_take_back_unused_memory_and_keep_guarantees() {
        let (run, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let store = Store::open(state.path()).unwrap();
        let (mut m, _) = SliceManager::adopt(run.path(), FakeGpus::new(1, 10 * G).devices, store).unwrap();
        // Guarantees 2 + 4 of 10 GiB: the pool is 4 GiB.
        create(&mut m, "a", 2, 8);
        create(&mut m, "b", 4, 6);
        assert_eq!(m.get("a").unwrap().limits.region().devices[0].mem_burst.load(std::sync::atomic::Ordering::Acquire), 8 * G, "the hook sees the burst cap");
        let pa = m.get("a").unwrap().usage.claim(1).unwrap();
        let pb = m.get("b").unwrap().usage.claim(2).unwrap();
        let t0 = Instant::now();

        assert!(charge(&m, "a", &pa, 2 * G));
        assert!(!charge(&m, "a", &pa, 3 * G), "over the guarantee before any grant");
        m.get("a").unwrap().usage.want_memory(0, 5 * G);
        tick(&mut m, t0);
        assert_eq!(limit(&m, "a"), 5 * G, "3 GiB lent from the 4 GiB pool");
        assert_eq!(m.get("a").unwrap().usage.wanted_memory(0), 0, "the request is answered");
        assert!(charge(&m, "a", &pa, 3 * G));
        check_invariant(&m);

        // b wants 2 GiB above its guarantee: only 1 GiB is left, and a uses all it got.
        assert!(charge(&m, "b", &pb, 4 * G));
        m.get("b").unwrap().usage.want_memory(0, 6 * G);
        tick(&mut m, t0);
        assert_eq!(limit(&m, "b"), 4 * G, "refused: the pool is lent out");
        assert_eq!(m.get("b").unwrap().usage.wanted_memory(0), 0, "refusals are answered too");
        assert_eq!(m.burst.refusals, 1);
        check_invariant(&m);

        // a frees 2 GiB: b's request takes it back from a, then is granted.
        m.get("a").unwrap().usage.uncharge(&pa, 0, 2 * G);
        m.get("b").unwrap().usage.want_memory(0, 6 * G);
        tick(&mut m, t0);
        assert_eq!(limit(&m, "a"), 3 * G, "a's unused grant is taken back");
        assert_eq!(limit(&m, "b"), 4 * G, "b waits until the lower limit is confirmed");
        assert_ne!(m.get("b").unwrap().usage.wanted_memory(0), 0, "the request is kept");
        assert!(!charge(&m, "a", &pa, 1), "a cannot charge above its lowered limit");
        check_invariant(&m);
        tick(&mut m, t0);
        assert_eq!(limit(&m, "b"), 6 * G, "granted once a's lock was seen free");
        assert!(charge(&m, "b", &pb, 2 * G));
        check_invariant(&m);

        // A new slice's guarantee must fit next to what is lent (1 + 2 GiB).
        let d = |gib| DeviceShare { device: 0, memory: Bytes::gib(gib), memory_burst: Bytes(0), compute_share: Percent::ZERO, compute_limit: Percent::FULL };
        let req = |gib| CreateRequest { spec: SliceSpec { name: "c".into(), priority: Priority::Normal, devices: vec![d(gib)] }, ephemeral: false, owner_pid: None };
        let e = m.create(req(2)).err().expect("2 GiB do not fit next to 3 GiB lent");
        assert!(matches!(e, SliceOpError::Capacity(CapacityError::Lent { .. })), "{e}");
        assert!(e.to_string().contains("lent out"), "{e}");
        m.create(req(1)).unwrap();
        check_invariant(&m);

        // b frees its burst; after LINGER unused, its grant goes back.
        m.get("b").unwrap().usage.uncharge(&pb, 0, 2 * G);
        tick(&mut m, t0 + Duration::from_millis(10));
        assert_eq!(limit(&m, "b"), 6 * G, "kept while not unused for LINGER");
        tick(&mut m, t0 + Duration::from_millis(10) + LINGER);
        assert_eq!(limit(&m, "b"), 4 * G, "taken back after LINGER");
        check_invariant(&m);
    }

    #[test]
    fn resize_keeps_a_grant_within_the_new_cap_and_restart_reads_it_back() {
        let (run, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let devices = FakeGpus::new(1, 10 * G).devices;
        {
            let (mut m, _) = SliceManager::adopt(run.path(), devices.clone(), Store::open(state.path()).unwrap()).unwrap();
            create(&mut m, "a", 2, 8);
            let pa = m.get("a").unwrap().usage.claim(std::process::id()).unwrap();
            // (The record stays claimed: the restart below adopts a slice in use.)
            assert!(charge(&m, "a", &pa, 2 * G));
            m.get("a").unwrap().usage.want_memory(0, 6 * G);
            tick(&mut m, Instant::now());
            assert_eq!(limit(&m, "a"), 6 * G);
            // A compute-only resize leaves the grant alone; a lower cap trims it.
            m.resize("a", ResizeRequest { compute_share: Some(Percent::from_pct(10)), ..Default::default() }).unwrap();
            assert_eq!(limit(&m, "a"), 6 * G);
            m.resize("a", ResizeRequest { memory_burst: Some(Bytes::gib(5)), ..Default::default() }).unwrap();
            assert_eq!(limit(&m, "a"), 5 * G);
            // A burst cap above the device is refused.
            let e = m.resize("a", ResizeRequest { memory_burst: Some(Bytes::gib(11)), ..Default::default() }).err().unwrap();
            assert!(matches!(e, SliceOpError::Capacity(CapacityError::BurstAboveDevice { .. })), "{e}");
        }
        // egpud restarts: the grant in the limits file is adopted, not dropped.
        let (m, _) = SliceManager::adopt(run.path(), devices, Store::open(state.path()).unwrap()).unwrap();
        assert_eq!(limit(&m, "a"), 5 * G);
        assert_eq!(m.get("a").unwrap().granted, vec![3 * G]);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Charge(usize, u64),
        Free(usize, u64),
        Want(usize, u64),
        Tick(u64),
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            (0..3usize, 1..1500u64).prop_map(|(s, m)| Op::Charge(s, m)),
            (0..3usize, 1..1500u64).prop_map(|(s, m)| Op::Free(s, m)),
            (0..3usize, 1..6000u64).prop_map(|(s, m)| Op::Want(s, m)),
            (0..3000u64).prop_map(Op::Tick),
        ]
    }

    proptest::proptest! {
        /// Whatever the slices charge, free and ask for, and however the
        /// ticks fall: what the slices hold never exceeds the device, and
        /// guarantees plus what is lent never exceed it either, so every
        /// guarantee can always be allocated in full.
        #[test]
        fn the_pool_is_never_overlent(guar in proptest::collection::vec(1..3000u64, 3), caps in proptest::collection::vec(0..6000u64, 3), ops in proptest::collection::vec(op(), 1..80)) {
            const MIB: u64 = 1 << 20;
            let total = 8 * G;
            let (run, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
            let (mut m, _) = SliceManager::adopt(run.path(), FakeGpus::new(1, total).devices, Store::open(state.path()).unwrap()).unwrap();
            let names = ["a", "b", "c"];
            let mut slots = Vec::new();
            for (k, n) in names.iter().enumerate() {
                let memory = Bytes(guar[k] * MIB);
                let burst = if caps[k] * MIB > memory.0 { Bytes(caps[k] * MIB) } else { Bytes(0) };
                let d = DeviceShare { device: 0, memory, memory_burst: burst, compute_share: Percent::ZERO, compute_limit: Percent::FULL };
                let ok = m.create(CreateRequest { spec: SliceSpec { name: (*n).into(), priority: Priority::Normal, devices: vec![d] }, ephemeral: false, owner_pid: None }).is_ok();
                slots.push(ok.then(|| m.get(n).unwrap().usage.claim(100 + k as u32).unwrap()));
            }
            let mut held = [0u64; 3];
            let mut now = Instant::now();
            for o in ops {
                match o {
                    Op::Charge(k, mib) => if let Some(slot) = &slots[k]
                        && charge(&m, names[k], slot, mib * MIB)
                    {
                        held[k] += mib * MIB;
                    },
                    Op::Free(k, mib) => if let Some(slot) = &slots[k] {
                        let b = (mib * MIB).min(held[k]);
                        m.get(names[k]).unwrap().usage.uncharge(slot, 0, b);
                        held[k] -= b;
                    },
                    Op::Want(k, mib) => if slots[k].is_some() { m.get(names[k]).unwrap().usage.want_memory(0, mib * MIB) },
                    Op::Tick(ms) => { now += Duration::from_millis(ms); tick(&mut m, now); }
                }
                let used: u64 = held.iter().sum();
                proptest::prop_assert!(used <= total, "slices hold {used} of {total}");
                let guar: u64 = m.slices().map(|s| s.record.spec.devices[0].memory.0).sum();
                let lent = lent(&m, &m.burst)[0];
                proptest::prop_assert!(guar + lent <= total, "guarantees {guar} + lent {lent} > {total}");
                for (k, n) in names.iter().enumerate() {
                    if slots[k].is_some() {
                        let s = m.get(n).unwrap();
                        let d = s.record.spec.devices[0];
                        proptest::prop_assert!(s.mem_limits()[0] <= d.memory_cap().0, "a limit above its burst cap");
                    }
                }
            }
        }
    }
}
