//! Contexts cost device memory, so creating one is charged.
//!
//! - The cost is measured as the change around the real creation of the
//!   memory NVML lists for *this process* on the device, which other
//!   tenants' allocations cannot disturb. Where that is unknown (NVML cannot
//!   list processes, or lists them in another pid namespace, which shows as
//!   no change), the device's used-memory delta is used: with `cuMemGetInfo`
//!   when a context on the same device is current before the call (and the
//!   new context after it), otherwise with NVML's device memory info. Without
//!   any of these, the last cost measured for that device in this process is
//!   used.
//! - Charge first: the last cost is pre-charged before the real call, then
//!   settled to the measured cost (not below the floor above). If the context does not fit,
//!   it is destroyed again and `CUDA_ERROR_OUT_OF_MEMORY` returned.
//! - `cuCtxDestroy` uncharges; a primary context is charged on this
//!   process's first retain and uncharged on its last release (when the
//!   driver agrees that it ended it) or on reset.
//! - Destroying a context (`cuCtxDestroy`, a primary context's reset or last
//!   release) frees what was allocated in it: every ledger entry recorded
//!   with that context current (linear, pitch and managed memory, arrays) is
//!   taken out before the real call, uncharged if the context was destroyed
//!   and put back if it was not. Pools, `cuMemCreate` handles and graph
//!   memory are device-level objects the driver keeps: they stay charged.
//! - With the device-wide fallback, concurrent allocations by other processes
//!   on the device during the measurement are attributed to the context (an
//!   over-charge of that context). Frees during the measurement would make
//!   the context look cheaper: what this process freed meanwhile (another
//!   thread's frees) is added back, and a context is never charged less
//!   than the smallest cost above 0 this process measured on the device
//!   before. A free by another slice during a process's *first*
//!   measurement is the one thing that can still lower a charge; the
//!   memory audit sees the difference.

use super::drv::real as drv;
use super::hooked;
use super::sig;
use crate::detour::Outcome;
use crate::devmap;
use crate::ledger::{Charge, CtxAllocs, LEDGER, Primary};
use crate::state::{charge, uncharge};
use egpu_abi::MAX_DEVICES;
use egpu_cuda::{
    CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_OUT_OF_MEMORY, CUcontext, CUctxCreateParams, CUdevResourceDesc, CUdevice, CUexecAffinityParam, CUgreenCtx, CUresult, CUstream,
};
use std::ffi::{c_int, c_uint};
use std::sync::atomic::{AtomicU64, Ordering};

/// Last measured context cost per slice device (this process): the next
/// creation's pre-charge.
static COST: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];
/// Smallest cost above 0 measured per slice device (this process; 0: none
/// yet): no later context there is charged less ([`context_cost`]).
static FLOOR: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];
/// Generations of primary-context entries (see [`Primary::generation`]).
static GEN: AtomicU64 = AtomicU64::new(1);

fn new_generation() -> u64 {
    GEN.fetch_add(1, Ordering::Relaxed)
}

/// Uncharges what a destroyed context's allocations charged.
fn uncharge_all(t: &CtxAllocs) {
    for c in t.charges() {
        crate::state::uncharge_freed(c.dev, c.bytes);
    }
}

/// The context was not destroyed: its allocations go back into the ledger.
fn restore(t: CtxAllocs) {
    if t.is_empty() {
        return;
    }
    let gone = LEDGER.lock().restore_ctx(t);
    uncharge_all(&gone);
}

/// The context was destroyed: what was allocated in it is freed.
fn freed_with(ctx: usize, t: &CtxAllocs) {
    if !t.is_empty() {
        crate::util::debug!("context {ctx:#x} destroyed: {} allocations and {} arrays freed with it", t.ptrs.len(), t.arrays.len());
    }
    super::sparse::destroyed(t.arrays.iter().map(|(k, _)| *k));
    uncharge_all(t);
}

#[derive(Clone, Copy)]
enum Source {
    Cuda,
    Nvml,
}

fn cuda_used(ctx: Option<CUcontext>) -> Option<u64> {
    let info = hooked::cuMemGetInfo_v2.get()?;
    let (mut f, mut t) = (0usize, 0usize);
    // SAFETY: pushes/pops a context the caller just created, and reads memory info into locals.
    unsafe {
        if let Some(c) = ctx
            && drv::cuCtxPushCurrent_v2.get()?(c) != 0
        {
            return None;
        }
        let r = info(&mut f, &mut t);
        if ctx.is_some() {
            let mut popped: CUcontext = std::ptr::null_mut();
            drv::cuCtxPopCurrent_v2.get()?(&mut popped);
        }
        (r == 0).then_some(t.saturating_sub(f) as u64)
    }
}

/// How to measure, decided before the creation.
fn source_before(ordinal: CUdevice) -> Option<(Source, u64)> {
    let same_device = devmap::current().is_ok_and(|(d, _)| d == ordinal);
    if same_device && let Some(u) = cuda_used(None) {
        return Some((Source::Cuda, u));
    }
    let uuid = devmap::uuid_of(ordinal).ok()?;
    crate::nvml::real_used(&uuid).map(|u| (Source::Nvml, u))
}

fn used_after(src: Source, ordinal: CUdevice, ctx: CUcontext) -> Option<u64> {
    match src {
        Source::Cuda => cuda_used(Some(ctx)),
        Source::Nvml => crate::nvml::real_used(&devmap::uuid_of(ordinal).ok()?),
    }
}

/// What a new context is charged, and what was measured (0: nothing),
/// from memory in use (before, after) its creation: this process's own
/// (`own`, NVML's per-process figure) if that moved, else the device's
/// (`device_wide`), each with what this process freed meanwhile
/// (`freed`, on other threads) added back. Never less than `floor`, the
/// smallest cost above 0 this process measured on the device before: a
/// free elsewhere (another slice's, which no counter here sees) cannot
/// take a context's charge to nothing. The smallest, not the largest, so
/// one inflated measurement (another tenant allocating meanwhile)
/// over-charges only its own context. With no measurement, `est` (the
/// last cost).
fn context_cost(own: Option<(u64, u64)>, device_wide: impl FnOnce() -> Option<(u64, u64)>, freed: u64, floor: u64, est: u64) -> (u64, u64) {
    let delta = |(before, after): (u64, u64)| after.saturating_add(freed).saturating_sub(before);
    // Own usage that did not move is no measurement (NVML lists the
    // process under another pid namespace's pid, or not at all).
    match own.filter(|(b, a)| a != b).map(delta).or_else(|| device_wide().map(delta)) {
        Some(m) => (m.max(floor), m),
        None => (est.max(floor), 0),
    }
}

/// Charges a context created by `make` on `ordinal`; `undo` destroys it if it does not fit.
fn charged_create(ordinal: CUdevice, make: impl FnOnce() -> (u32, CUcontext), undo: impl FnOnce(CUcontext)) -> Result<(CUcontext, Charge), u32> {
    let dev = devmap::slice_dev(ordinal)?;
    let est = COST[dev].load(Ordering::Relaxed);
    charge(dev, est)?;
    let uuid = devmap::uuid_of(ordinal).ok();
    let own_before = uuid.as_deref().and_then(crate::nvml::real_own_used);
    let before = source_before(ordinal);
    let given_back = crate::state::freed_so_far(dev);
    let (r, ctx) = make();
    if r != 0 {
        uncharge(dev, est);
        return Err(r);
    }
    let given_back = crate::state::freed_so_far(dev).saturating_sub(given_back);
    let own = own_before.zip(uuid.as_deref().and_then(crate::nvml::real_own_used));
    let device_wide = || before.and_then(|(src, b)| used_after(src, ordinal, ctx).map(|a| (b, a)));
    let (cost, measured) = context_cost(own, device_wide, given_back, FLOOR[dev].load(Ordering::Relaxed), est);
    COST[dev].store(cost, Ordering::Relaxed);
    if measured > 0 {
        let _ = FLOOR[dev].fetch_update(Ordering::Relaxed, Ordering::Relaxed, |f| (f == 0 || measured < f).then_some(measured));
    }
    crate::util::debug!("context on device {ordinal} costs {cost} bytes (pre-charged {est})");
    if cost > est {
        if charge(dev, cost - est).is_err() {
            undo(ctx);
            uncharge(dev, est);
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
    } else {
        uncharge(dev, est - cost);
    }
    Ok((ctx, Charge { dev, bytes: cost }))
}

fn destroy_ctx(ctx: CUcontext) {
    if let Some(f) = hooked::cuCtxDestroy_v2.get() {
        // SAFETY: destroys the context we just created.
        unsafe { f(ctx) };
    }
}

fn record(pctx: *mut CUcontext, res: Result<(CUcontext, Charge), u32>) -> Outcome {
    match res {
        Ok((ctx, c)) => {
            LEDGER.lock().ctxs.insert(ctx as usize, c);
            let _ = pctx;
            Outcome::Success
        }
        Err(e) => Outcome::Error(e),
    }
}

fn out(pctx: *mut CUcontext) -> CUcontext {
    // SAFETY: read after the driver's success wrote it.
    if pctx.is_null() { std::ptr::null_mut() } else { unsafe { *pctx } }
}

/// `cuCtxCreate_v2` (and the v1 `cuCtxCreate`, which has the same signature).
#[doc(alias = "cuCtxCreate_v2")]
pub(crate) fn create_v2(real: sig::cuCtxCreate_v2, pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> Outcome {
    // SAFETY: the real function with the caller's arguments.
    let res = charged_create(dev, || (unsafe { real(pctx, flags, dev) }, out(pctx)), destroy_ctx);
    record(pctx, res)
}

/// `cuCtxCreate_v3` (execution affinity).
#[doc(alias = "cuCtxCreate_v3")]
pub(crate) fn create_v3(real: sig::cuCtxCreate_v3, pctx: *mut CUcontext, params: *mut CUexecAffinityParam, n: c_int, flags: c_uint, dev: CUdevice) -> Outcome {
    // SAFETY: the real function with the caller's arguments.
    let res = charged_create(dev, || (unsafe { real(pctx, params, n, flags, dev) }, out(pctx)), destroy_ctx);
    record(pctx, res)
}

/// `cuCtxCreate_v4` (`CUctxCreateParams`).
#[doc(alias = "cuCtxCreate_v4")]
pub(crate) fn create_v4(real: sig::cuCtxCreate_v4, pctx: *mut CUcontext, params: *mut CUctxCreateParams, flags: c_uint, dev: CUdevice) -> Outcome {
    // SAFETY: the real function with the caller's arguments.
    let res = charged_create(dev, || (unsafe { real(pctx, params, flags, dev) }, out(pctx)), destroy_ctx);
    record(pctx, res)
}

/// `cuCtxDestroy_v2` (and v1). The entry leaves the ledger before the real
/// call: once destroyed, the handle value may be reused by another thread's
/// creation, whose entry a removal after the call would take.
#[doc(alias = "cuCtxDestroy_v2")]
pub(crate) fn destroy(real: sig::cuCtxDestroy_v2, ctx: CUcontext) -> Outcome {
    let h = ctx as usize;
    let (entry, owned) = {
        let mut l = LEDGER.lock();
        (l.ctxs.remove(&h), l.take_ctx(h))
    };
    // SAFETY: the real function with the caller's argument.
    let r = unsafe { real(ctx) };
    if r == 0 {
        if let Some(c) = entry {
            crate::state::uncharge_freed(c.dev, c.bytes);
        }
        freed_with(h, &owned);
    } else {
        if let Some(c) = entry {
            LEDGER.lock().ctxs.insert(h, c);
        }
        restore(owned);
    }
    Outcome::from_code(r)
}

/// Whether the driver says `dev`'s primary context is active (false when it
/// cannot say).
fn primary_active(dev: CUdevice) -> bool {
    let (mut flags, mut active): (u32, c_int) = (0, 0);
    // SAFETY: writes two integers.
    drv::cuDevicePrimaryCtxGetState.get().is_some_and(|f| unsafe { f(dev, &mut flags, &mut active) } == 0 && active != 0)
}

/// `cuDevicePrimaryCtxRetain`: the first retain by this process is charged.
#[doc(alias = "cuDevicePrimaryCtxRetain")]
pub(crate) fn primary_retain(real: sig::cuDevicePrimaryCtxRetain, pctx: *mut CUcontext, dev: CUdevice) -> Outcome {
    let held = LEDGER.lock().primary.get(&dev).is_some_and(|p| p.refs > 0);
    if held || primary_active(dev) {
        if let Err(e) = devmap::slice_dev(dev) {
            return Outcome::Error(e);
        }
        // SAFETY: the real function with the caller's arguments.
        let r = unsafe { real(pctx, dev) };
        if r == 0 {
            let sdev = devmap::slice_dev(dev).unwrap_or(0);
            let handle = out(pctx) as usize;
            let mut l = LEDGER.lock();
            let p = l.primary.entry(dev).or_insert_with(|| Primary { refs: 0, charge: Charge { dev: sdev, bytes: 0 }, handle, generation: new_generation() });
            p.refs += 1;
            if p.handle == 0 {
                p.handle = handle;
            }
        }
        return Outcome::from_code(r);
    }
    let undo = |_ctx: CUcontext| {
        if let Some(f) = hooked::cuDevicePrimaryCtxRelease_v2.get() {
            // SAFETY: releases the retain we just made.
            unsafe { f(dev) };
        }
    };
    // SAFETY: the real function with the caller's arguments.
    match charged_create(dev, || (unsafe { real(pctx, dev) }, out(pctx)), undo) {
        Ok((ctx, c)) => {
            let mut l = LEDGER.lock();
            match l.primary.get_mut(&dev) {
                // Another thread's retain of the same context got its entry in
                // first (both found the device without a context and both
                // charged; or it found the context this one had just made
                // active). One context: one reference more, and one charge,
                // the larger of the two; the other is given back.
                Some(p) if p.refs > 0 && p.handle == ctx as usize => {
                    p.refs += 1;
                    let give_back = p.charge.bytes.min(c.bytes);
                    p.charge.bytes = p.charge.bytes.max(c.bytes);
                    drop(l);
                    uncharge(c.dev, give_back);
                }
                _ => {
                    // An entry with no references is a context being released by another
                    // thread; it was not active any more, so that release has destroyed it
                    // (the new generation tells that release so: it uncharges what was
                    // allocated in the old context).
                    let old = l.primary.insert(dev, Primary { refs: 1, charge: c, handle: ctx as usize, generation: new_generation() });
                    drop(l);
                    if let Some(o) = old.filter(|o| o.refs == 0) {
                        crate::state::uncharge_freed(o.charge.dev, o.charge.bytes);
                    }
                }
            }
            Outcome::Success
        }
        Err(e) => Outcome::Error(e),
    }
}

/// `cuDevicePrimaryCtxRelease_v2` (and v1): the last release uncharges.
///
/// The reference is dropped before the real call and the entry stays, at zero
/// references, until the call returned: a retain by another thread meanwhile
/// finds the context still active, takes the entry back (with its charge),
/// and the context lives on charged; a retain after the call finds it inactive
/// and charges a new one, replacing (and uncharging) the old entry.
///
/// The last reference also takes the context's allocations out first; they
/// are uncharged if the context was destroyed (the entry is still ours at zero
/// references, or a retain replaced it with a new generation, or a reset
/// removed it), and put back if a retain took the context back in time.
///
/// Our count is not the driver's: a reset does not release the references
/// retained before it (the CUDA documentation), and the hook stops counting
/// them at the reset. So when our last reference goes and the driver still
/// says the context is active (`cuDevicePrimaryCtxGetState`), the context
/// stays charged with its allocations, counted as one reference, and the
/// next release asks again. (A retain by another thread between the real
/// release and that question can make one reference too many: an
/// over-charge until the process exits, never an escape.)
#[doc(alias = "cuDevicePrimaryCtxRelease_v2")]
pub(crate) fn primary_release(real: sig::cuDevicePrimaryCtxRelease_v2, dev: CUdevice) -> Outcome {
    let (had, last, generation, handle, owned) = {
        let mut l = LEDGER.lock();
        let mine = match l.primary.get_mut(&dev) {
            Some(p) if p.refs > 0 => {
                p.refs -= 1;
                Some((p.generation, p.handle, p.refs == 0))
            }
            _ => None,
        };
        match mine {
            Some((generation, handle, last)) => (true, last, generation, handle, if last { l.take_ctx(handle) } else { CtxAllocs::default() }),
            None => (false, false, 0, 0, CtxAllocs::default()),
        }
    };
    // SAFETY: the real function with the caller's argument.
    let r = unsafe { real(dev) };
    if !had {
        return Outcome::from_code(r);
    }
    // Asked outside the ledger's lock, and only when this was our last reference.
    let alive = r == 0 && last && primary_active(dev);
    let mut l = LEDGER.lock();
    if r != 0 {
        l.primary.entry(dev).or_insert(Primary { refs: 0, charge: Charge { dev: 0, bytes: 0 }, handle, generation }).refs += 1;
        drop(l);
        restore(owned);
        return Outcome::Error(r);
    }
    let (gone, destroyed) = match l.primary.get_mut(&dev) {
        // Our count reached zero but the driver still holds the context: a
        // reference we do not count outlived it (one retained before a
        // reset, which the documentation says the reset does not release).
        // It stays charged, counted as one reference, until a release
        // leaves the driver without it.
        Some(p) if p.generation == generation && p.refs == 0 && alive => {
            p.refs = 1;
            (None, false)
        }
        Some(p) if p.generation == generation && p.refs == 0 => (l.primary.remove(&dev).map(|p| p.charge), true),
        // Retained again before the release reached the driver: still alive.
        Some(p) if p.generation == generation => (None, false),
        // Replaced by a new incarnation, or reset: ours was destroyed.
        _ => (None, true),
    };
    drop(l);
    if let Some(c) = gone {
        crate::state::uncharge_freed(c.dev, c.bytes);
    }
    if destroyed {
        freed_with(handle, &owned);
    } else {
        restore(owned);
    }
    Outcome::Success
}

/// `cuDevicePrimaryCtxReset_v2` (and v1): destroys the primary context. The
/// entry leaves the ledger first, so that a context retained by another thread
/// after the reset is charged as a new one and not uncharged here.
#[doc(alias = "cuDevicePrimaryCtxReset_v2")]
pub(crate) fn primary_reset(real: sig::cuDevicePrimaryCtxReset_v2, dev: CUdevice) -> Outcome {
    let (entry, owned) = {
        let mut l = LEDGER.lock();
        let e = l.primary.remove(&dev);
        let owned = e.map(|p| l.take_ctx(p.handle)).unwrap_or_default();
        (e, owned)
    };
    // SAFETY: the real function with the caller's argument.
    let r = unsafe { real(dev) };
    if r == 0 {
        freed_with(entry.map_or(0, |p| p.handle), &owned);
    } else {
        restore(owned);
    }
    match entry {
        Some(p) if r == 0 => crate::state::uncharge_freed(p.charge.dev, p.charge.bytes),
        Some(p) => {
            // Still alive: put it back, merged with what a retain meanwhile
            // recorded (an uncharged reference to the same, still active, context).
            let extra = {
                let mut l = LEDGER.lock();
                match l.primary.get_mut(&dev) {
                    None => {
                        l.primary.insert(dev, p);
                        None
                    }
                    Some(e) => {
                        e.refs += p.refs;
                        if e.handle == 0 {
                            e.handle = p.handle;
                        }
                        if e.charge.bytes == 0 {
                            e.charge = p.charge;
                            None
                        } else {
                            Some(p.charge)
                        }
                    }
                }
            };
            if let Some(c) = extra {
                crate::state::uncharge_freed(c.dev, c.bytes);
            }
        }
        None => {}
    }
    Outcome::from_code(r)
}

/// `cuGreenCtxCreate` (CUDA 12.4+). The driver retains the device's primary
/// context for the green context (making it if it is not active) and
/// releases it when the green context is destroyed; a later
/// `cuDevicePrimaryCtxRetain` then finds it active and is charged nothing.
/// So the hook takes a primary reference of its own first, through
/// [`primary_retain`] (charged as a first retain is), and the green context
/// holds it until [`green_destroy`]. A green context's own resources beyond
/// its primary context are not measured.
#[doc(alias = "cuGreenCtxCreate")]
pub(crate) fn green_create(real: sig::cuGreenCtxCreate, green: *mut CUgreenCtx, desc: CUdevResourceDesc, dev: CUdevice, flags: c_uint) -> Outcome {
    let (Some(retain), Some(release)) = (hooked::cuDevicePrimaryCtxRetain.get(), hooked::cuDevicePrimaryCtxRelease_v2.get()) else {
        return Outcome::Error(CUDA_ERROR_NOT_SUPPORTED);
    };
    if green.is_null() {
        return Outcome::Error(CUDA_ERROR_INVALID_VALUE);
    }
    let mut ctx: CUcontext = std::ptr::null_mut();
    match primary_retain(retain, &mut ctx, dev) {
        Outcome::Success => {}
        Outcome::Error(e) => return Outcome::Error(e),
        Outcome::Passthrough => unreachable!("primary_retain always decides"),
    }
    // SAFETY: the real function with the caller's arguments.
    let r = unsafe { real(green, desc, dev, flags) };
    if r != 0 {
        let _ = primary_release(release, dev);
        return Outcome::Error(r);
    }
    // SAFETY: on success the driver wrote the handle.
    let g = unsafe { *green } as usize;
    LEDGER.lock().greens.insert(g, dev);
    Outcome::Success
}

/// `cuGreenCtxDestroy`: the driver releases its primary reference, and the
/// hook then its own ([`green_create`]).
#[doc(alias = "cuGreenCtxDestroy")]
pub(crate) fn green_destroy(real: sig::cuGreenCtxDestroy, green: CUgreenCtx) -> Outcome {
    // SAFETY: the real function with the caller's argument.
    let r = unsafe { real(green) };
    if r != 0 {
        return Outcome::Error(r);
    }
    let dev = LEDGER.lock().greens.remove(&(green as usize));
    if let (Some(dev), Some(release)) = (dev, hooked::cuDevicePrimaryCtxRelease_v2.get()) {
        let _ = primary_release(release, dev);
    }
    Outcome::Success
}

/// Runs `f` with the context of `stream` current.
pub(crate) fn in_stream_ctx<R>(stream: CUstream, f: impl FnOnce() -> R) -> Result<R, CUresult> {
    let (Some(get), Some(push), Some(pop)) = (drv::cuStreamGetCtx.get(), drv::cuCtxPushCurrent_v2.get(), drv::cuCtxPopCurrent_v2.get()) else {
        return Ok(f());
    };
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: the caller's stream; `ctx` is a valid out-pointer.
    let r = unsafe { get(stream, &mut ctx) };
    if r != 0 {
        return Err(r);
    }
    // SAFETY: a context the driver just returned.
    let r = unsafe { push(ctx) };
    if r != 0 {
        return Err(r);
    }
    let out = f();
    let mut popped: CUcontext = std::ptr::null_mut();
    // SAFETY: pops the context pushed above.
    let _ = unsafe { pop(&mut popped) };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::context_cost;

    #[test]
    fn a_free_during_the_measurement_does_not_cheapen_a_context() {
        const MIB: u64 = 1 << 20;
        let cost = |own, dev: Option<(u64, u64)>, freed, floor, est| context_cost(own, || dev, freed, floor, est).0;
        // Own usage moved by 32 MiB: that is the cost.
        assert_eq!(context_cost(Some((100 * MIB, 132 * MIB)), || None, 0, 0, 0), (32 * MIB, 32 * MIB));
        // Another thread freed 900 MiB in the window: the process's usage
        // fell, but the context still costs 32 MiB.
        assert_eq!(cost(Some((1000 * MIB, 132 * MIB)), None, 900 * MIB, 0, 0), 32 * MIB);
        // The same through the device-wide figure (own usage unknown).
        assert_eq!(cost(None, Some((1000 * MIB, 132 * MIB)), 900 * MIB, 0, 0), 32 * MIB);
        // A free no counter here sees (another slice's) lowers the device
        // figure: never below the smallest cost measured before.
        assert_eq!(context_cost(None, || Some((1000 * MIB, 900 * MIB)), 0, 32 * MIB, 32 * MIB), (32 * MIB, 0));
        // An inflated measurement (another tenant allocated meanwhile) is
        // this context's only: the floor stays the smallest, so it does not
        // carry over (the caller keeps the minimum).
        assert_eq!(context_cost(None, || Some((0, 5000 * MIB)), 0, 32 * MIB, 32 * MIB), (5000 * MIB, 5000 * MIB));
        // Own usage that did not move (another pid namespace) is no
        // measurement: the device figure decides.
        assert_eq!(cost(Some((5, 5)), Some((0, 40 * MIB)), 0, 32 * MIB, 0), 40 * MIB);
        // ... even when this process freed memory meanwhile.
        assert_eq!(cost(Some((5, 5)), Some((900 * MIB, 40 * MIB)), 900 * MIB, 0, 0), 40 * MIB);
        // Nothing measured: the last cost, not below the floor.
        assert_eq!(context_cost(None, || None, 0, 32 * MIB, 48 * MIB), (48 * MIB, 0));
        assert_eq!(cost(None, None, 0, 32 * MIB, 0), 32 * MIB);
    }
}
