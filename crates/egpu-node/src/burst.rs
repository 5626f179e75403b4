//! Burst memory: a slice's memory limit grows on demand, up to its burst
//! cap, into device memory that no slice has reserved, and shrinks back when
//! the slice no longer uses it.
//!
//! Per device, the **pool** is the device's memory less the guarantees
//! (`DeviceShare::memory`) of its slices. What a slice has **borrowed** is
//! how far its limit, its usage or a lowered limit not yet confirmed
//! (below) exceeds its guarantee; the invariant is that the borrows on a
//! device never exceed its pool, so a guarantee can always be allocated in
//! full, whatever the others borrowed.
//!
//! The hook asks: an allocation over the limit of a slice with a burst cap
//! raises `UsageRegion::mem_want` to the total it needs and waits (at most
//! 100 ms) for the word to be cleared. Every arbiter tick (10 ms), [`tick`]
//! answers each request: a grant (a higher limit, published before the word
//! is cleared) if the pool has room; if it would have room once other
//! slices gave back grants they do not use, those are taken back (their
//! limits lowered to their usage) and the request is left for a later tick
//! (at most [`MAX_DEFERRALS`]); otherwise the word is cleared with no grant.
//! A grant younger than [`GRACE`] is never taken back (its slice is still
//! retrying the allocation it asked for); one unused for [`LINGER`] is.
//! Requests are served round-robin across ticks.
//!
//! Taking back is exact: the hook reads the limit inside the slice's charge
//! lock, so once `egpud` has seen that lock free after publishing a lower
//! limit, every later charge is checked against it and every earlier one is
//! in the usage records. Until then, and while any live process of the
//! slice runs a hook older than that rule (`CAP_LIMIT_IN_LOCK`), the old
//! limit still counts as borrowed (`Burst::held`). Grants live in
//! `egpud`'s memory and in the limits files: a restarted `egpud` reads them
//! back (`SliceManager::adopt`).

use crate::slices::{Slice, SliceManager};
use egpu_abi::usage::CAP_LIMIT_IN_LOCK;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// A grant the slice has not used for this long is taken back.
pub const LINGER: Duration = Duration::from_secs(2);

/// A grant younger than this is not taken back for another slice's request.
pub const GRACE: Duration = Duration::from_millis(500);

/// A request waits at most this many ticks for memory being taken back
/// (the hook itself waits at most 100 ms).
pub const MAX_DEFERRALS: u32 = 3;

type Key = (String, usize);

/// What [`tick`] remembers between ticks.
#[derive(Debug, Default)]
pub struct Burst {
    /// (slice, slice device) → a limit that was lowered and may still be
    /// charged against, until the charge lock is seen free.
    held: HashMap<Key, u64>,
    /// (slice, slice device) → since when its grant has been partly unused.
    unused_since: HashMap<Key, Instant>,
    /// (slice, slice device) → when it was last granted more.
    granted_at: HashMap<Key, Instant>,
    /// (slice, slice device) → ticks its request has been kept waiting for
    /// taken-back memory.
    deferred: HashMap<Key, u32>,
    /// Ticks so far (round-robin start).
    ticks: u64,
    /// Grants made, requests refused (cumulative, for logs and tests).
    pub grants: u64,
    pub refusals: u64,
}

/// One slice device as [`tick`] sees it.
#[derive(Debug, Clone)]
struct View {
    slice: String,
    dev: usize,
    device: usize,
    guarantee: u64,
    cap: u64,
    limit: u64,
    used: u64,
    held: u64,
}

impl View {
    fn key(&self) -> Key {
        (self.slice.clone(), self.dev)
    }

    /// Borrowed above the guarantee: the limit, the usage or a lowered
    /// limit still held, whichever is highest. Usage is not capped at the
    /// burst cap: a slice resized below what it holds really does occupy
    /// unreserved memory, and over-counting only makes `egpud` lend less.
    fn borrowed(&self) -> u64 {
        self.limit.max(self.used).max(self.held).saturating_sub(self.guarantee)
    }

    /// What taking back its unused grant (and confirming a held limit)
    /// would return to the pool.
    fn reclaimable(&self) -> u64 {
        self.limit.max(self.held).saturating_sub(self.used.max(self.guarantee))
    }
}

impl Burst {
    /// Counts `limit` as still charged against on `slice`'s device `dev`
    /// until its charge lock is seen free (a limit was just lowered).
    pub(crate) fn hold(&mut self, slice: &str, dev: usize, limit: u64) {
        let h = self.held.entry((slice.to_string(), dev)).or_insert(0);
        *h = (*h).max(limit);
    }

    /// Forgets a deleted slice (the next tick would too): a slice made
    /// again under its name before that tick starts with no grace, no
    /// deferral and no held limit of the old one.
    pub(crate) fn forget(&mut self, slice: &str) {
        self.held.retain(|k, _| k.0 != slice);
        self.unused_since.retain(|k, _| k.0 != slice);
        self.granted_at.retain(|k, _| k.0 != slice);
        self.deferred.retain(|k, _| k.0 != slice);
    }

    fn fresh(&self, k: &Key, now: Instant) -> bool {
        self.granted_at.get(k).is_some_and(|&t| now.saturating_duration_since(t) < GRACE)
    }
}

fn views(m: &SliceManager) -> Vec<View> {
    let mut out = Vec::new();
    for s in m.slices() {
        let limits = s.mem_limits();
        // A usage file the truncation guard gave up on reads as zeros:
        // until egpud maps it anew, the slice is taken to use its burst cap.
        let blind = s.usage.detached();
        for (i, d) in s.record.spec.devices.iter().enumerate() {
            let cap = d.memory_cap().0;
            out.push(View {
                slice: s.name().to_string(),
                dev: i,
                device: d.device as usize,
                guarantee: d.memory.0,
                cap,
                limit: if blind { limits[i].max(cap) } else { limits[i] },
                // Memory the audit found the driver holding beyond the
                // records is occupied too (whatever --memory-audit does).
                used: if blind { cap.max(limits[i]) } else { s.usage.used(i).saturating_add(s.audit.get(i).map_or(0, |a| a.untracked)) },
                held: m.burst.held.get(&(s.name().to_string(), i)).copied().unwrap_or(0),
            });
        }
    }
    // A slice whose files could not be opened is taken to hold its burst
    // cap (its processes run with their last limits, which egpud cannot
    // read): nothing is lent out of it, and it is never granted nor taken
    // back (it is not in `m.slices()`).
    for u in m.unadopted() {
        for (i, d) in u.record.spec.devices.iter().enumerate() {
            let cap = d.memory_cap().0;
            out.push(View { slice: u.record.spec.name.clone(), dev: i, device: d.device as usize, guarantee: d.memory.0, cap, limit: cap, used: cap, held: 0 });
        }
    }
    out
}

/// Memory lent out per device: borrows above the guarantees, counting
/// limits that were lowered but may still be charged against.
pub fn lent(m: &SliceManager) -> Vec<u64> {
    let mut out = vec![0u64; m.devices().len()];
    for v in views(m) {
        if let Some(x) = out.get_mut(v.device) {
            *x = x.saturating_add(v.borrowed());
        }
    }
    out
}

/// Devices on which guarantees plus what is lent exceed the memory, and by
/// how much (only possible after adopting grants onto a changed device;
/// new grants there wait until enough comes back).
pub fn overlent(m: &SliceManager) -> Vec<(usize, u64)> {
    let vs = views(m);
    m.devices()
        .iter()
        .enumerate()
        .filter_map(|(d, info)| {
            let need = vs.iter().filter(|v| v.device == d).map(|v| v.guarantee.saturating_add(v.borrowed())).fold(0u64, u64::saturating_add);
            (need > info.memory_bytes).then(|| (d, need - info.memory_bytes))
        })
        .collect()
}

/// Lowers `v`'s grant so that its limit is its usage (never below the
/// guarantee), remembering the old limit as held. Updates `v`.
fn take_back(m: &mut SliceManager, v: &mut View) -> bool {
    let new_grant = v.used.saturating_sub(v.guarantee);
    let Some(s) = m.slice_mut(&v.slice) else { return false };
    if s.granted.get(v.dev).is_none_or(|&g| g <= new_grant) {
        return false;
    }
    s.granted[v.dev] = new_grant;
    publish(s);
    m.burst.hold(&v.slice, v.dev, v.limit);
    tracing::debug!(slice = %v.slice, device = v.device, from = v.limit, to = v.guarantee + new_grant, "took back burst memory");
    v.held = v.held.max(v.limit);
    v.limit = v.guarantee + new_grant;
    true
}

fn publish(s: &Slice) {
    if let Err(e) = s.publish() {
        tracing::warn!(slice = %s.name(), error = %e, "could not publish a burst grant");
    }
}

/// Admission next to the burst pool: `spec`'s guarantees, with every other
/// slice's guarantee and what is lent out now, must fit each device. A
/// slice being resized (`except`) counts with what it holds above its new
/// guarantee.
pub fn check_lent(m: &SliceManager, except: Option<&str>, spec: &egpu_core::SliceSpec) -> Result<(), crate::capacity::CapacityError> {
    let vs = views(m);
    for d in &spec.devices {
        let dev = d.device as usize;
        let Some(info) = m.devices().get(dev) else { continue };
        let (mut lent, mut others) = (0u64, 0u64);
        for v in vs.iter().filter(|v| v.device == dev) {
            if Some(v.slice.as_str()) == except {
                // Its current limit may still be charged against after the resize.
                lent = lent.saturating_add(v.limit.max(v.used).max(v.held).saturating_sub(d.memory.0));
            } else {
                others = others.saturating_add(v.guarantee);
                lent = lent.saturating_add(v.borrowed());
            }
        }
        if others.saturating_add(lent).saturating_add(d.memory.0) > info.memory_bytes {
            let free = info.memory_bytes.saturating_sub(others).saturating_sub(lent);
            return Err(crate::capacity::CapacityError::Lent { device: d.device, requested: egpu_core::Bytes(d.memory.0), free: egpu_core::Bytes(free), lent: egpu_core::Bytes(lent) });
        }
    }
    Ok(())
}

/// One tick: confirm taken-back limits, take back grants unused for
/// [`LINGER`], and answer the slices' requests.
pub fn tick(m: &mut SliceManager, now: Instant) {
    // Lowered limits are final once the charge lock is seen free and no
    // live process of the slice runs a hook that reads the limit outside it.
    let mut held = std::mem::take(&mut m.burst.held);
    held.retain(|(name, dev), _| m.get(name).is_ok_and(|s| !s.usage.charge_lock_free(*dev) || s.usage.live_record_lacks(CAP_LIMIT_IN_LOCK)));
    m.burst.held = held;
    let mut vs = views(m);
    let live: std::collections::HashSet<Key> = vs.iter().map(View::key).collect();
    let b = &mut m.burst;
    b.unused_since.retain(|k, _| live.contains(k));
    b.granted_at.retain(|k, _| live.contains(k));
    b.deferred.retain(|k, _| live.contains(k));
    // Grants not used for LINGER go back to the pool.
    for v in &mut vs {
        let k = v.key();
        if v.limit > v.guarantee && v.used < v.limit {
            let since = *m.burst.unused_since.entry(k.clone()).or_insert(now);
            if now.saturating_duration_since(since) >= LINGER && take_back(m, v) {
                m.burst.unused_since.remove(&k);
            }
        } else {
            m.burst.unused_since.remove(&k);
        }
    }
    let totals: Vec<u64> = m.devices().iter().map(|d| d.memory_bytes).collect();
    let n = vs.len();
    let start = (m.burst.ticks as usize) % n.max(1);
    m.burst.ticks += 1;
    for j in (0..n).map(|k| (start + k) % n) {
        let Ok(s) = m.get(&vs[j].slice) else { continue };
        let want = s.usage.wanted_memory(vs[j].dev);
        if want == 0 {
            continue;
        }
        let v = vs[j].clone();
        let k = v.key();
        let target = want.min(v.cap);
        let answer = |m: &SliceManager| {
            if let Ok(s) = m.get(&v.slice) {
                s.usage.clear_memory_want(v.dev, want);
            }
        };
        if target <= v.limit {
            answer(m); // already there (another process's request, or a grant this tick)
            continue;
        }
        let on_dev = |o: &View| o.device == v.device;
        let guarantees: u64 = vs.iter().filter(|o| on_dev(o)).map(|o| o.guarantee).fold(0, u64::saturating_add);
        let pool = totals.get(v.device).copied().unwrap_or(0).saturating_sub(guarantees);
        let lent_now: u64 = vs.iter().filter(|o| on_dev(o)).map(View::borrowed).fold(0, u64::saturating_add);
        let after = lent_now.saturating_sub(v.borrowed()).saturating_add(target.max(v.used).max(v.held).saturating_sub(v.guarantee));
        if after <= pool {
            if let Some(s) = m.slice_mut(&v.slice) {
                s.granted[v.dev] = target - v.guarantee;
                publish(s);
            }
            answer(m);
            vs[j].limit = target;
            let b = &mut m.burst;
            b.grants += 1;
            b.granted_at.insert(k.clone(), now);
            b.unused_since.remove(&k);
            b.deferred.remove(&k);
            tracing::debug!(slice = %v.slice, device = v.device, limit = target, "granted burst memory");
            continue;
        }
        // Not enough now: would it be, once others' unused grants (not fresh
        // ones) and held limits came back?
        let reclaim: u64 = vs.iter().filter(|o| on_dev(o) && o.slice != v.slice && !m.burst.fresh(&o.key(), now)).map(View::reclaimable).fold(0, u64::saturating_add);
        let deferred = m.burst.deferred.get(&k).copied().unwrap_or(0);
        if reclaim > 0 && after <= pool.saturating_add(reclaim) && deferred < MAX_DEFERRALS {
            for o in vs.iter_mut() {
                if on_dev(o) && o.slice != v.slice && !m.burst.fresh(&o.key(), now) {
                    take_back(m, o);
                }
            }
            // Left posted: answered at a later tick.
            m.burst.deferred.insert(k, deferred + 1);
            continue;
        }
        answer(m);
        m.burst.deferred.remove(&k);
        m.burst.refusals += 1;
        tracing::debug!(slice = %v.slice, device = v.device, want, pool, lent = lent_now, "burst request refused: the device's pool is lent out");
    }
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

    /// A charge as the hook makes it: the limit read inside the charge lock
    /// (asserted: the lock word is this record's while it is read).
    fn charge(m: &SliceManager, name: &str, slot: &ProcSlot, bytes: u64) -> bool {
        let s = m.get(name).unwrap();
        let limit = || {
            assert_eq!(s.usage.region().charge_locks[0].load(std::sync::atomic::Ordering::Acquire), slot.index as u32 + 1, "limit read outside the charge lock");
            s.limits.snapshot().devices()[0].mem_limit
        };
        s.usage.try_charge_with(slot, 0, bytes, &limit).is_ok()
    }

    fn limit(m: &SliceManager, name: &str) -> u64 {
        m.get(name).unwrap().limits.snapshot().devices()[0].mem_limit
    }

    /// Guarantees plus what is lent never exceed the device.
    fn check_invariant(m: &SliceManager) {
        let guar: u64 = m.slices().map(|s| s.record.spec.devices[0].memory.0).sum();
        let lent = lent(m)[0];
        assert!(guar + lent <= 10 * G, "guarantees {guar} + lent {lent} exceed the device");
    }

    #[test]
    fn a_slice_left_bigger_than_its_device_can_still_shrink() {
        // 8 GiB on a 10 GiB device; the node comes back with 4 GiB devices
        // (a smaller GPU, or another --simulate spec): the slice is adopted
        // as stored, and now exceeds its device.
        let (run, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (mut m, _) = SliceManager::adopt(run.path(), FakeGpus::new(1, 10 * G).devices, Store::open(state.path()).unwrap()).unwrap();
        create(&mut m, "a", 8, 0);
        drop(m);
        let (mut m, _) = SliceManager::adopt(run.path(), FakeGpus::new(1, 4 * G).devices, Store::open(state.path()).unwrap()).unwrap();
        // Growing stays refused; what grows nothing is allowed: the priority,
        // the cap, and shrinking to fit.
        assert!(m.resize("a", ResizeRequest { memory: Some(Bytes::gib(9)), ..Default::default() }).is_err());
        m.resize("a", ResizeRequest { priority: Some(Priority::High), compute_limit: Some(Percent::FULL), ..Default::default() }).expect("grows nothing");
        m.resize("a", ResizeRequest { memory: Some(Bytes::gib(3)), ..Default::default() }).expect("a shrink");
        assert_eq!(m.get("a").unwrap().record.spec.devices[0].memory, Bytes::gib(3));
        // Still checked: a cap below the share is refused whatever the room.
        if let Err(e) = m.resize("a", ResizeRequest { compute_share: Some(Percent::ZERO), compute_limit: Some(Percent(1)), ..Default::default() }) {
            panic!("a 0.01% cap over no share: {e}");
        }
        assert!(m.resize("a", ResizeRequest { memory: Some(Bytes::gib(3)), compute_share: Some(Percent(0)), compute_limit: Some(Percent(0)), ..Default::default() }).is_err(), "a zero cap is refused");
    }

    #[test]
    fn a_name_shaped_like_an_id_is_refused() {
        let (run, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (mut m, _) = SliceManager::adopt(run.path(), FakeGpus::new(1, 10 * G).devices, Store::open(state.path()).unwrap()).unwrap();
        create(&mut m, "victim", 1, 0);
        let id = m.get("victim").unwrap().record.id.clone();
        let d = DeviceShare { device: 0, memory: Bytes::gib(1), memory_burst: Bytes(0), compute_share: Percent::ZERO, compute_limit: Percent::FULL };
        for name in [id.as_str(), "s-0123456789ab"] {
            let Err(e) = m.create(CreateRequest { spec: SliceSpec { name: name.into(), priority: Priority::Normal, devices: vec![d] }, ephemeral: false, owner_pid: None }) else { panic!("{name} accepted") };
            assert!(matches!(e, SliceOpError::BadRequest(ref msg) if msg.contains("form of a slice id")), "{e}");
        }
        // Near misses are ordinary names.
        create(&mut m, "s-0123456789a", 1, 0);
        create(&mut m, "s-0123456789abc", 1, 0);
        assert_eq!(m.get(&id).unwrap().name(), "victim", "the id still finds its slice");
        // A long unknown name comes back shortened in the error.
        let Err(e) = m.get(&"x".repeat(20_000)) else { panic!("found") };
        let e = e.to_string();
        assert!(e.len() < 200 && e.contains("…"), "{e}");
    }

    #[test]
    fn a_deleted_slice_leaves_no_burst_state_for_one_made_again_under_its_name() {
        let (run, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (mut m, _) = SliceManager::adopt(run.path(), FakeGpus::new(1, 10 * G).devices, Store::open(state.path()).unwrap()).unwrap();
        create(&mut m, "a", 2, 8);
        create(&mut m, "b", 4, 6);
        let t0 = Instant::now();
        m.get("a").unwrap().usage.want_memory(0, 5 * G);
        tick(&mut m, t0);
        assert_eq!(limit(&m, "a"), 5 * G);
        // Shrunk below its limit: the old limit is held until the charge lock is seen free.
        m.resize("a", ResizeRequest { memory_burst: Some(Bytes::gib(3)), ..Default::default() }).unwrap();
        let key = ("a".to_string(), 0);
        assert!(m.burst.granted_at.contains_key(&key) && m.burst.held.contains_key(&key));
        m.delete("a", false).unwrap();
        let b = &m.burst;
        assert!(
            [b.held.contains_key(&key), b.granted_at.contains_key(&key), b.unused_since.contains_key(&key), b.deferred.contains_key(&key)] == [false; 4],
            "the deleted slice's grace, held limit and waits are forgotten at once"
        );
        create(&mut m, "a", 2, 8);
        assert_eq!(lent(&m)[0], 0, "the new slice borrows nothing");
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

        // a frees 2 GiB, but its grant is fresh (younger than GRACE): b's
        // request does not take it back, so a's own retry cannot lose it.
        m.get("a").unwrap().usage.uncharge(&pa, 0, 2 * G);
        m.get("b").unwrap().usage.want_memory(0, 6 * G);
        tick(&mut m, t0 + GRACE / 2);
        assert_eq!((limit(&m, "a"), limit(&m, "b")), (5 * G, 4 * G), "a fresh grant is kept");
        assert_eq!(m.burst.refusals, 2);

        // Later, b's request takes a's unused 2 GiB back, then is granted.
        let t1 = t0 + GRACE;
        m.get("b").unwrap().usage.want_memory(0, 6 * G);
        // While a's charge lock looks taken (a word no record can hold), the
        // lowered limit is not final: it still counts as lent.
        let lock = &m.get("a").unwrap().usage.region().charge_locks[0];
        lock.store(egpu_abi::MAX_PROCS as u32 + 7, std::sync::atomic::Ordering::Release);
        tick(&mut m, t1);
        assert_eq!(limit(&m, "a"), 3 * G, "a's unused grant is taken back");
        assert_eq!(limit(&m, "b"), 4 * G, "b waits until the lower limit is confirmed");
        assert_ne!(m.get("b").unwrap().usage.wanted_memory(0), 0, "the request stays posted");
        tick(&mut m, t1 + Duration::from_millis(10));
        assert_eq!(limit(&m, "b"), 4 * G, "not while a's lock is taken");
        assert_eq!(lent(&m)[0], 3 * G, "a's old 5 GiB limit still counts (3 GiB above its guarantee)");
        m.get("a").unwrap().usage.region().charge_locks[0].store(0, std::sync::atomic::Ordering::Release);
        assert!(!charge(&m, "a", &pa, 1), "a cannot charge above its lowered limit");
        tick(&mut m, t1 + Duration::from_millis(20));
        assert_eq!(limit(&m, "b"), 6 * G, "granted once a's lock was seen free");
        assert_eq!(m.get("b").unwrap().usage.wanted_memory(0), 0);
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
        let t2 = t1 + Duration::from_millis(30);
        tick(&mut m, t2);
        assert_eq!(limit(&m, "b"), 6 * G, "kept while not unused for LINGER");
        tick(&mut m, t2 + LINGER);
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
                // Independently of `lent`: from the limits files, every slice's
                // guarantee, or its published limit or usage if higher, fits.
                let worst: u64 = m.slices().map(|s| {
                    let file = s.limits.snapshot().devices()[0].mem_limit;
                    s.record.spec.devices[0].memory.0.max(file).max(s.usage.used(0))
                }).sum();
                proptest::prop_assert!(worst <= total, "limits and guarantees {worst} > {total}");
                let guar: u64 = m.slices().map(|s| s.record.spec.devices[0].memory.0).sum();
                let lent = lent(&m)[0];
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
