//! The stream-ordered allocator and memory pools, charged by each pool's
//! *reserved* size (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`): that is the
//! device memory the pool holds, whether or not it is handed out.
//!
//! - Before an allocation, the growth it can cause (request minus the pool's
//!   unused reservation) is charged first; after it, the charge is settled to
//!   the pool's real reserved size. If the pool grew by more than that and
//!   the rest does not fit, the allocation is freed, the pool trimmed, and
//!   `CUDA_ERROR_OUT_OF_MEMORY` returned.
//! - Frees, trims, synchronisations and pool destruction settle the charge
//!   down to the reserved size (a pool returns memory at synchronisation,
//!   depending on its release threshold). The size is read outside the
//!   ledger's lock, so a settle on one thread may read it before another
//!   thread's allocation grew the pool: a reading taken before an
//!   allocation started or ended never takes the charge down (the pool's
//!   epoch), and the next settle reads again. Refused allocations first settle
//!   every pool, so memory a pool already gave back is not held against the
//!   slice.
//! - Pools located on the host are never charged, unless they are managed
//!   pools (CUDA 13), which are charged as `cuMemAllocManaged` is.
//! - An allocation on a stream that is being captured takes nothing from
//!   the pool: the driver makes it a memory-allocation node of the graph,
//!   owned by the graph, so it is charged with the graph's nodes when the
//!   graph is instantiated ([`super::graph`]) and passed through here.

use super::drv::real as drv;
use super::hooked;
use super::sig;
use crate::detour::Outcome;
use crate::devmap;
use crate::ledger::{Charge, LEDGER, PoolAcct, Ptr};
use crate::state::{charge, uncharge};
use egpu_cuda::{CU_MEM_ALLOCATION_TYPE_MANAGED, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_OUT_OF_MEMORY, CUdeviceptr, CUmemPoolProps, CUmemoryPool, CUresult, CUstream};
use std::sync::atomic::{AtomicBool, Ordering};

/// Device index marking a host-located pool (never charged).
const HOST: usize = usize::MAX;
static ANY_POOLS: AtomicBool = AtomicBool::new(false);

fn attr(pool: usize, which: u32) -> Option<u64> {
    let f = drv::cuMemPoolGetAttribute.get()?;
    let mut v: u64 = 0;
    // SAFETY: both attributes are cuuint64_t written into `v`.
    let r = unsafe { f(pool as CUmemoryPool, which, (&mut v as *mut u64).cast()) };
    (r == 0).then_some(v)
}

/// Settles the pool's charge to its reserved size (plus allocations in
/// flight). Growth is charged only when `grow` (an allocation path); it fails
/// with out-of-memory if it does not fit.
fn reconcile(pool: usize, grow: bool) -> Result<(), CUresult> {
    reconcile_if_reported(pool, grow).unwrap_or(Ok(()))
}

/// [`reconcile`], or `None` where the driver does not report the pool's
/// reserved size.
fn reconcile_if_reported(pool: usize, grow: bool) -> Option<Result<(), CUresult>> {
    // A reading taken while another thread's allocation started or ended
    // cannot settle down; read again a few times, so a settle before a
    // refusal is not skipped merely because the pool is busy.
    for _ in 0..4 {
        let seen = epoch(pool);
        let reserved = attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?;
        if epoch(pool) == seen || grow {
            return Some(reconcile_to(pool, reserved, grow, seen));
        }
    }
    Some(Ok(()))
}

/// The pool's allocation epoch ([`PoolAcct::epoch`]), read before its size.
fn epoch(pool: usize) -> u64 {
    LEDGER.lock().pools.get(&pool).map_or(0, |a| a.epoch)
}

/// [`reconcile`] with the pool's reserved size already read, under `epoch`.
fn reconcile_to(pool: usize, reserved: u64, grow: bool, epoch: u64) -> Result<(), CUresult> {
    let (dev, delta_up, delta_down) = {
        let mut l = LEDGER.lock();
        let Some(a) = l.pools.get_mut(&pool) else { return Ok(()) };
        if a.dev == HOST {
            return Ok(());
        }
        let (up, down) = a.settle_to(reserved, grow, epoch);
        (a.dev, up, down)
    };
    crate::state::uncharge_freed(dev, delta_down);
    if delta_up > 0 {
        charge(dev, delta_up)?;
        if let Some(a) = LEDGER.lock().pools.get_mut(&pool) {
            a.charged += delta_up;
        }
    }
    Ok(())
}

/// Settles one pool's charge down to what it still reserves.
pub fn settle(pool: usize) {
    let _ = reconcile(pool, false);
}

/// `bytes` of `pool` on slice device `dev` are no longer wanted (a free, or
/// an allocation that failed after its estimate was charged): settled
/// through the pool's reserved size, or, for a pool whose reserved size the
/// driver does not report (charged by allocation), given back as such.
pub fn freed(pool: usize, dev: usize, bytes: u64) {
    if reconcile_if_reported(pool, false).is_some() {
        return;
    }
    let known = LEDGER.lock().pools.get_mut(&pool).map(|a| a.charged = a.charged.saturating_sub(bytes)).is_some();
    if known {
        crate::state::uncharge_freed(dev, bytes);
    }
}

/// Settles every pool this process uses (after a refusal, on queries and on
/// synchronisation).
pub fn release_unused() {
    if !ANY_POOLS.load(Ordering::Acquire) {
        return;
    }
    let pools: Vec<usize> = LEDGER.lock().pools.keys().copied().collect();
    for p in pools {
        settle(p);
    }
}

/// Allocates from `pool` on slice device `dev`, charging the pool's growth.
fn alloc_in_pool(dptr: *mut CUdeviceptr, size: usize, pool: usize, dev: usize, stream: CUstream, alloc: impl FnOnce() -> u32) -> Outcome {
    let reserved = attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT).unwrap_or(0);
    let used = attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT).unwrap_or(reserved);
    let est = (size as u64).saturating_sub(reserved.saturating_sub(used));
    {
        let mut l = LEDGER.lock();
        l.pools.entry(pool).or_insert(PoolAcct::new(dev));
    }
    ANY_POOLS.store(true, Ordering::Release);
    // The first time we see a pool (a default pool used before any hook saw
    // it), bring its charge up to what it already reserves.
    if let Err(e) = reconcile(pool, true) {
        return Outcome::Error(e);
    }
    if let Err(e) = charge(dev, est) {
        return Outcome::Error(e);
    }
    if let Some(a) = LEDGER.lock().pools.get_mut(&pool) {
        a.charged += est;
        a.inflight += est;
        a.epoch += 1;
    }
    let r = alloc();
    if let Some(a) = LEDGER.lock().pools.get_mut(&pool) {
        a.inflight -= est.min(a.inflight);
        a.epoch += 1;
    }
    if r != 0 {
        freed(pool, dev, est);
        return Outcome::Error(r);
    }
    // SAFETY: on success the driver wrote the caller's `*dptr`.
    let p = unsafe { *dptr };
    LEDGER.lock().ptrs.insert(p, Ptr { charge: Charge { dev, bytes: size as u64 }, pool, ctx: 0 });
    if reconcile(pool, true).is_err() {
        // The pool grew past the limit: give the memory back and refuse.
        LEDGER.lock().ptrs.remove(&p);
        // SAFETY: frees and trims what we just allocated, on the caller's stream.
        unsafe {
            if let Some(f) = hooked::cuMemFreeAsync.get() {
                f(p, stream);
            }
            if let Some(f) = hooked::cuStreamSynchronize.get() {
                f(stream);
            }
            if let Some(f) = hooked::cuMemPoolTrimTo.get() {
                f(pool as CUmemoryPool, 0);
            }
        }
        settle(pool);
        return Outcome::Error(CUDA_ERROR_OUT_OF_MEMORY);
    }
    Outcome::Success
}

/// The device (driver ordinal, slice index) whose pool serves an
/// allocation on `stream`: the null, legacy (0x1) and per-thread (0x2)
/// streams belong to the current context; any other is asked for its own.
fn stream_device(stream: CUstream) -> Result<(egpu_cuda::CUdevice, usize), CUresult> {
    if (stream as usize) <= 2 { devmap::current() } else { super::ctx::in_stream_ctx(stream, devmap::current).and_then(|r| r) }
}

/// Whether `stream` is being captured (or its capture was invalidated):
/// an allocation on it is then a graph's, not a pool's.
fn capturing(stream: CUstream) -> bool {
    crate::compute::drv::capture_status(stream as usize).is_some_and(|s| s != egpu_cuda::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// `cuMemAllocAsync_ptsz`: [`alloc_async`] on the stream it means.
#[doc(alias = "cuMemAllocAsync_ptsz")]
pub(crate) fn alloc_async_ptsz(real: sig::cuMemAllocAsync_ptsz, dptr: *mut CUdeviceptr, size: usize, stream: CUstream) -> Outcome {
    alloc_async(real, dptr, size, super::per_thread(stream))
}

/// `cuMemAllocFromPoolAsync_ptsz`: [`alloc_from_pool`] on the stream it means.
#[doc(alias = "cuMemAllocFromPoolAsync_ptsz")]
pub(crate) fn alloc_from_pool_ptsz(real: sig::cuMemAllocFromPoolAsync_ptsz, dptr: *mut CUdeviceptr, size: usize, pool: CUmemoryPool, stream: CUstream) -> Outcome {
    alloc_from_pool(real, dptr, size, pool, super::per_thread(stream))
}

/// `cuMemFreeAsync_ptsz`: [`free_async`] on the stream it means.
#[doc(alias = "cuMemFreeAsync_ptsz")]
pub(crate) fn free_async_ptsz(real: sig::cuMemFreeAsync_ptsz, dptr: CUdeviceptr, stream: CUstream) -> Outcome {
    free_async(real, dptr, super::per_thread(stream))
}

/// `cuMemAllocAsync`: from the current pool of the *stream's* device (which
/// may not be the current one).
#[doc(alias = "cuMemAllocAsync")]
pub(crate) fn alloc_async(real: sig::cuMemAllocAsync, dptr: *mut CUdeviceptr, size: usize, stream: CUstream) -> Outcome {
    if capturing(stream) {
        return Outcome::Passthrough;
    }
    let (ord, dev) = match stream_device(stream) {
        Ok(d) => d,
        Err(e) => return Outcome::Error(e),
    };
    let Some(getpool) = drv::cuDeviceGetMemPool.get() else { return Outcome::Error(CUDA_ERROR_NOT_SUPPORTED) };
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    // SAFETY: writes one pool handle.
    let r = unsafe { getpool(&mut pool, ord) };
    if r != 0 {
        return Outcome::Error(r);
    }
    // SAFETY: the real function with the caller's arguments.
    alloc_in_pool(dptr, size, pool as usize, dev, stream, || unsafe { real(dptr, size, stream) })
}

/// The slice device of a pool the hook did not see created: the device
/// whose default or current pool it is (asked of the driver for each
/// device), else, if it is neither (a pool from an API the hook does not
/// follow), the stream's device.
fn owner_of_unknown_pool(pool: CUmemoryPool, stream: CUstream) -> Result<usize, CUresult> {
    let mut n: std::ffi::c_int = 0;
    if let Some(count) = drv::cuDeviceGetCount.get() {
        // SAFETY: writes one int.
        if unsafe { count(&mut n) } != 0 {
            n = 0;
        }
    }
    for ord in 0..n {
        for get in [drv::cuDeviceGetDefaultMemPool.get(), drv::cuDeviceGetMemPool.get()].into_iter().flatten() {
            let mut p: CUmemoryPool = std::ptr::null_mut();
            // SAFETY: writes one pool handle for a valid ordinal.
            if unsafe { get(&mut p, ord) } == 0 && p == pool {
                return devmap::slice_dev(ord);
            }
        }
    }
    stream_device(stream).map(|(_, d)| d)
}

/// `cuMemAllocFromPoolAsync`.
#[doc(alias = "cuMemAllocFromPoolAsync")]
pub(crate) fn alloc_from_pool(real: sig::cuMemAllocFromPoolAsync, dptr: *mut CUdeviceptr, size: usize, pool: CUmemoryPool, stream: CUstream) -> Outcome {
    if capturing(stream) {
        return Outcome::Passthrough;
    }
    let known = LEDGER.lock().pools.get(&(pool as usize)).map(|a| a.dev);
    let dev = match known {
        Some(HOST) => return Outcome::Passthrough,
        Some(d) => d,
        // Never created through us: a device's default or current pool.
        None => match owner_of_unknown_pool(pool, stream) {
            Ok(d) => d,
            Err(e) => return Outcome::Error(e),
        },
    };
    // SAFETY: the real function with the caller's arguments.
    alloc_in_pool(dptr, size, pool as usize, dev, stream, || unsafe { real(dptr, size, pool, stream) })
}

/// `cuMemFreeAsync`.
#[doc(alias = "cuMemFreeAsync")]
pub(crate) fn free_async(real: sig::cuMemFreeAsync, dptr: CUdeviceptr, stream: CUstream) -> Outcome {
    // Out of the ledger before the real call, as in `mem::free`: once freed,
    // the address may be handed to another thread's allocation at once.
    let e = LEDGER.lock().ptrs.remove(&dptr);
    // SAFETY: the real function with the caller's arguments.
    let r = unsafe { real(dptr, stream) };
    if r != 0 {
        if let Some(e) = e {
            LEDGER.lock().ptrs.insert(dptr, e);
        }
        return Outcome::Error(r);
    }
    match e {
        Some(Ptr { pool: 0, charge, .. }) => crate::state::uncharge_freed(charge.dev, charge.bytes),
        Some(Ptr { pool, charge, .. }) => freed(pool, charge.dev, charge.bytes),
        None => {}
    }
    Outcome::Success
}

/// `cuMemPoolCreate`: device pools are tracked (charged as they reserve);
/// host pools never. A managed pool (CUDA 13) is charged like
/// `cuMemAllocManaged`: to its preferred device, or to the current device
/// when it prefers none or the host (its memory migrates to whichever GPU
/// touches it, so a location preference must not exempt it).
#[doc(alias = "cuMemPoolCreate")]
pub(crate) fn create(real: sig::cuMemPoolCreate, pool: *mut CUmemoryPool, props: *const CUmemPoolProps) -> Outcome {
    // SAFETY: the caller's props, read once (null checked).
    let props_in = if props.is_null() { None } else { Some(unsafe { *props }) };
    let placed = props_in.map(|p| (p, devmap::placed(p.location)));
    let dev = match placed {
        Some((_, Ok(devmap::Placed::Device(d)))) => Ok(d),
        Some((_, Err(e))) => Err(e),
        // With no context current, a one-device slice still knows where.
        Some((p, Ok(_))) if p.allocType == CU_MEM_ALLOCATION_TYPE_MANAGED => devmap::current().map(|(_, d)| d).or_else(|e| match crate::state::slice() {
            Ok(s) if s.usage.n_devices() == 1 => Ok(0),
            _ => Err(e),
        }),
        Some((_, Ok(devmap::Placed::Host))) => Ok(HOST),
        // No location for a pool of device memory: the driver refuses it;
        // should one accept it, the memory is the current device's.
        Some((_, Ok(devmap::Placed::Unspecified))) => devmap::current().map(|(_, d)| d).or(Ok(HOST)),
        None => return Outcome::Passthrough,
    };
    let dev = match dev {
        Ok(d) => d,
        Err(e) => return Outcome::Error(e),
    };
    // SAFETY: the real function with the caller's arguments.
    let r = unsafe { real(pool, props) };
    if r != 0 {
        return Outcome::Error(r);
    }
    // SAFETY: on success the driver wrote the pool handle.
    let p = unsafe { *pool } as usize;
    LEDGER.lock().pools.insert(p, PoolAcct::new(dev));
    ANY_POOLS.store(true, Ordering::Release);
    Outcome::Success
}

/// `cuMemPoolDestroy`: uncharges the pool, except for allocations still
/// outstanding, which keep their own size charged until freed. The pool's
/// entry leaves the ledger before the real call, as on the other release
/// paths: once the driver has destroyed the pool, another thread's
/// `cuMemPoolCreate` may be handed the same handle, and a removal after the
/// call would take that pool's entry. Its pointers keep naming the pool
/// until the call succeeded: a free meanwhile finds no pool entry and
/// uncharges nothing (the bytes stay in the pool's charge), so a refused
/// destroy changes no charge.
#[doc(alias = "cuMemPoolDestroy")]
pub(crate) fn destroy(real: sig::cuMemPoolDestroy, pool: CUmemoryPool) -> Outcome {
    let p = pool as usize;
    let taken = LEDGER.lock().pools.remove(&p);
    // SAFETY: the real function with the caller's argument.
    let r = unsafe { real(pool) };
    let Some(a) = taken else { return Outcome::from_code(r) };
    if r != 0 {
        let mut l = LEDGER.lock();
        // An allocation from the pool meanwhile made a fresh entry and
        // charged the pool's reservation again: the fresh entry (settled to
        // what the pool reserves now) stays, the old charge goes.
        let doubled = match l.pools.entry(p) {
            std::collections::btree_map::Entry::Occupied(_) => a.charged,
            std::collections::btree_map::Entry::Vacant(e) => {
                e.insert(a);
                0
            }
        };
        drop(l);
        if a.dev != HOST {
            uncharge(a.dev, doubled);
        }
        return Outcome::Error(r);
    }
    let keep = {
        let mut l = LEDGER.lock();
        let mut keep = 0u64;
        for v in l.ptrs.values_mut().filter(|v| v.pool == p) {
            // Outstanding pointers now carry their own size until freed.
            v.pool = 0;
            keep += v.charge.bytes;
        }
        keep
    };
    if a.dev != HOST {
        crate::state::uncharge_freed(a.dev, a.charged - keep.min(a.charged));
    }
    Outcome::Success
}

/// `cuMemPoolTrimTo`: settles the charge to what the pool still reserves.
#[doc(alias = "cuMemPoolTrimTo")]
pub(crate) fn trim_to(real: sig::cuMemPoolTrimTo, pool: CUmemoryPool, keep: usize) -> Outcome {
    // SAFETY: the real function with the caller's arguments.
    let r = unsafe { real(pool, keep) };
    if r == 0 {
        settle(pool as usize);
    }
    Outcome::from_code(r)
}

/// `cuStreamSynchronize` / `_ptsz`: pools release memory here.
#[doc(alias = "cuStreamSynchronize")]
pub(crate) fn synchronize_stream(real: sig::cuStreamSynchronize, stream: CUstream) -> Outcome {
    // SAFETY: the real function with the caller's argument.
    let r = unsafe { real(stream) };
    if ANY_POOLS.load(Ordering::Acquire) {
        release_unused();
    }
    crate::compute::after_sync();
    Outcome::from_code(r)
}

/// `cuCtxSynchronize`: pools release memory here.
#[doc(alias = "cuCtxSynchronize")]
pub(crate) fn synchronize_ctx(real: sig::cuCtxSynchronize) -> Outcome {
    // SAFETY: the real function, no arguments.
    synchronized(unsafe { real() })
}

/// `cuCtxSynchronize_v2` (CUDA 13, what `cuCtxSynchronize` resolves to
/// there: the context to wait for is an argument, null for the current
/// one): as [`synchronize_ctx`].
#[doc(alias = "cuCtxSynchronize_v2")]
pub(crate) fn synchronize_ctx_v2(real: sig::cuCtxSynchronize_v2, ctx: egpu_cuda::CUcontext) -> Outcome {
    // SAFETY: the real function with the caller's argument.
    synchronized(unsafe { real(ctx) })
}

/// After a context-wide wait: pools release memory, finished launches are reaped.
fn synchronized(r: CUresult) -> Outcome {
    if ANY_POOLS.load(Ordering::Acquire) {
        release_unused();
    }
    crate::compute::after_sync();
    Outcome::from_code(r)
}
