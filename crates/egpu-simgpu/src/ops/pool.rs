//! Stream-ordered allocation and memory pools.
//!
//! A pool *reserves* device memory in [`CHUNK`] (32 MiB) steps when an
//! allocation does not fit in what it has reserved, and charges the
//! reservation, not the allocations. Frees return bytes to the pool; the
//! reservation stays until the next synchronisation on the pool's device
//! (stream/event/context synchronize), which releases everything above
//! `max(used, release threshold)` rounded to chunks. The default release
//! threshold is 0, so an idle pool shrinks to zero at the next sync.
//! `cuMemPoolTrimTo(keep)` shrinks to `max(used, keep)` at once.

use crate::cptr::{R, read, write};
use crate::ops::{graph, memory, stream};
use crate::rt::{Inner, Kind, Pool, Proc, cu, new_handle};
use crate::sys::round_up;
use egpu_cuda::*;
use std::ffi::c_void;

pub const CHUNK: u64 = 32 << 20;

/// Reservation after allocating `n` more bytes.
pub fn grown(reserved: u64, used: u64, n: u64) -> u64 {
    reserved.max(round_up(used + n, CHUNK))
}

/// Reservation kept after a synchronisation.
pub fn after_sync(reserved: u64, used: u64, threshold: u64) -> u64 {
    let keep = round_up(used, CHUNK).max(threshold / CHUNK * CHUNK);
    reserved.min(keep)
}

/// Reservation after `cuMemPoolTrimTo(keep)`.
pub fn trimmed(reserved: u64, used: u64, keep: u64) -> u64 {
    reserved.min(round_up(used, CHUNK).max(round_up(keep, CHUNK)))
}

fn new_pool(g: &mut Inner, ord: usize, phys: usize) -> u64 {
    let h = new_handle();
    g.pools.insert(
        h,
        Pool { ord, phys, reserved: 0, used: 0, reserved_high: 0, used_high: 0, threshold: 0, max_size: 0, reuse: [1, 1, 1] },
    );
    h
}

fn default_pool(g: &mut Inner, ord: usize, phys: usize) -> u64 {
    if let Some(&h) = g.default_pool.get(&ord) {
        return h;
    }
    let h = new_pool(g, ord, phys);
    g.default_pool.insert(ord, h);
    h
}

fn current_pool(g: &mut Inner, ord: usize, phys: usize) -> u64 {
    match g.current_pool.get(&ord) {
        Some(&h) if g.pools.contains_key(&h) => h,
        _ => default_pool(g, ord, phys),
    }
}

fn set_reserved(p: &Proc, pool: &mut Pool, new: u64) -> R<()> {
    if new > pool.reserved {
        if !p.shm.charge(&p.locks, p.slot, pool.phys, new - pool.reserved) {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
    } else {
        p.shm.uncharge(p.slot, pool.phys, pool.reserved - new);
    }
    pool.reserved = new;
    pool.reserved_high = pool.reserved_high.max(new);
    Ok(())
}

fn alloc_from(p: &Proc, g: &mut Inner, pool_h: u64, size: u64, s: stream::SRef) -> R<u64> {
    if size == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let ctx = s.ctx(g);
    let pool = g.pools.get_mut(&pool_h).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let (ord, phys) = (pool.ord, pool.phys);
    let want = grown(pool.reserved, pool.used, size);
    if pool.max_size != 0 && want > pool.max_size {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    set_reserved(p, pool, want)?;
    let d = memory::alloc_arena_on(p, g, ctx, ord, phys, size, Kind::Pool(pool_h), 0)?;
    let pool = g.pools.get_mut(&pool_h).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    pool.used += size;
    pool.used_high = pool.used_high.max(pool.used);
    Ok(d)
}

/// Frees a pool allocation (from cuMemFree or cuMemFreeAsync).
pub fn free_alloc(_p: &Proc, g: &mut Inner, pool_h: u64, base: u64) -> R<()> {
    let a = g.allocs.remove(&base).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    crate::ops::arena::free(g, a.phys, a.base, a.span);
    if let Some(pool) = g.pools.get_mut(&pool_h) {
        pool.used = pool.used.saturating_sub(a.size);
    }
    Ok(())
}

/// Release rule at a synchronisation on ordinal `ord`.
pub fn on_sync(p: &Proc, ord: usize) {
    let mut g = p.lock();
    for pool in g.pools.values_mut().filter(|x| x.ord == ord) {
        let new = after_sync(pool.reserved, pool.used, pool.threshold);
        let _ = set_reserved(p, pool, new);
    }
}

pub fn mem_alloc_async(out: *mut CUdeviceptr, size: usize, s: CUstream, ptsz: bool) -> R<()> {
    let p = cu()?;
    if out.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut g = p.lock();
    let r = stream::resolve(&g, s, ptsz)?;
    let c = &g.ctxs[&r.ctx(&g)];
    let (ord, phys) = (c.ord, c.phys);
    if let Some(d) = graph::captured_alloc(p, &mut g, r, ord, phys, size as u64) {
        return write(out, d?);
    }
    let pool = current_pool(&mut g, ord, phys);
    let d = alloc_from(p, &mut g, pool, size as u64, r)?;
    write(out, d)
}

pub fn mem_alloc_from_pool_async(out: *mut CUdeviceptr, size: usize, pool: CUmemoryPool, s: CUstream, ptsz: bool) -> R<()> {
    let p = cu()?;
    if out.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut g = p.lock();
    let r = stream::resolve(&g, s, ptsz)?;
    let (ord, phys) = g.pools.get(&(pool as u64)).map(|pl| (pl.ord, pl.phys)).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if let Some(d) = graph::captured_alloc(p, &mut g, r, ord, phys, size as u64) {
        return write(out, d?);
    }
    let d = alloc_from(p, &mut g, pool as u64, size as u64, r)?;
    write(out, d)
}

pub fn mem_free_async(d: CUdeviceptr, s: CUstream, ptsz: bool) -> R<()> {
    let p = cu()?;
    let mut g = p.lock();
    let r = stream::resolve(&g, s, ptsz)?;
    if let Some(done) = graph::captured_free(&mut g, r, d) {
        return done;
    }
    memory::free_locked(p, &mut g, d)
}

pub fn pool_create(out: *mut CUmemoryPool, props: *const CUmemPoolProps) -> R<()> {
    let p = cu()?;
    let mut pr = read(props)?;
    if pr.allocType != CU_MEM_ALLOCATION_TYPE_MANAGED {
        pr.location = super::whole_device(pr.location)?;
    }
    let device = pr.location.type_ == CU_MEM_LOCATION_TYPE_DEVICE;
    // A managed pool (CUDA 13) takes any preferred location; the simulated
    // GPU keeps its memory on the preferred device, or on the current
    // context's device without a device preference (where the kernels that
    // touch it run).
    let managed = pr.allocType == CU_MEM_ALLOCATION_TYPE_MANAGED
        && matches!(pr.location.type_, CU_MEM_LOCATION_TYPE_NONE | CU_MEM_LOCATION_TYPE_DEVICE | CU_MEM_LOCATION_TYPE_HOST);
    if out.is_null() || !(managed || pr.allocType == CU_MEM_ALLOCATION_TYPE_PINNED && device) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut g = p.lock();
    let (ord, phys) = if device {
        (pr.location.id as usize, p.phys(pr.location.id)?)
    } else {
        let (_, ord, phys) = memory::cur(&g)?;
        (ord, phys)
    };
    let h = new_pool(&mut g, ord, phys);
    g.pools.get_mut(&h).ok_or(CUDA_ERROR_UNKNOWN)?.max_size = pr.maxSize as u64;
    write(out, h as CUmemoryPool)
}

pub fn pool_destroy(pool: CUmemoryPool) -> R<()> {
    let p = cu()?;
    let mut g = p.lock();
    let h = pool as u64;
    if g.default_pool.values().any(|&d| d == h) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut pl = g.pools.remove(&h).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let _ = set_reserved(p, &mut pl, 0);
    let owned: Vec<u64> = g.allocs.values().filter(|a| a.kind == Kind::Pool(h)).map(|a| a.base).collect();
    for b in owned {
        if let Some(a) = g.allocs.remove(&b) {
            crate::ops::arena::free(&mut g, a.phys, a.base, a.span);
        }
    }
    g.current_pool.retain(|_, v| *v != h);
    Ok(())
}

/// Validates a pool handle.
pub fn check(pool: CUmemoryPool) -> R<()> {
    let p = cu()?;
    if p.lock().pools.contains_key(&(pool as u64)) { Ok(()) } else { Err(CUDA_ERROR_INVALID_VALUE) }
}

pub fn trim_to(pool: CUmemoryPool, keep: usize) -> R<()> {
    let p = cu()?;
    let mut g = p.lock();
    let pl = g.pools.get_mut(&(pool as u64)).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let new = trimmed(pl.reserved, pl.used, keep as u64);
    set_reserved(p, pl, new)
}

pub fn set_attribute(pool: CUmemoryPool, attr: u32, value: *mut c_void) -> R<()> {
    let p = cu()?;
    let mut g = p.lock();
    let pl = g.pools.get_mut(&(pool as u64)).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    match attr {
        CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES..=CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
            pl.reuse[(attr - 1) as usize] = read(value as *const i32)?
        }
        CU_MEMPOOL_ATTR_RELEASE_THRESHOLD => pl.threshold = read(value as *const u64)?,
        CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH => {
            if read(value as *const u64)? != 0 {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            pl.reserved_high = pl.reserved;
        }
        CU_MEMPOOL_ATTR_USED_MEM_HIGH => {
            if read(value as *const u64)? != 0 {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            pl.used_high = pl.used;
        }
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    }
    Ok(())
}

pub fn get_attribute(pool: CUmemoryPool, attr: u32, value: *mut c_void) -> R<()> {
    let p = cu()?;
    let g = p.lock();
    let pl = g.pools.get(&(pool as u64)).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let v64 = |v: u64| write(value as *mut u64, v);
    if p.cfg.pool_sizes_hidden && matches!(attr, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT..=CU_MEMPOOL_ATTR_USED_MEM_HIGH) {
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    match attr {
        CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES..=CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
            write(value as *mut i32, pl.reuse[(attr - 1) as usize])
        }
        CU_MEMPOOL_ATTR_RELEASE_THRESHOLD => v64(pl.threshold),
        CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT => v64(pl.reserved),
        CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH => v64(pl.reserved_high),
        CU_MEMPOOL_ATTR_USED_MEM_CURRENT => v64(pl.used),
        CU_MEMPOOL_ATTR_USED_MEM_HIGH => v64(pl.used_high),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

pub fn device_get_default_mem_pool(out: *mut CUmemoryPool, dev: CUdevice) -> R<()> {
    let p = cu()?;
    let phys = p.phys(dev)?;
    let mut g = p.lock();
    let h = default_pool(&mut g, dev as usize, phys);
    write(out, h as CUmemoryPool)
}

pub fn device_get_mem_pool(out: *mut CUmemoryPool, dev: CUdevice) -> R<()> {
    let p = cu()?;
    let phys = p.phys(dev)?;
    let mut g = p.lock();
    let h = current_pool(&mut g, dev as usize, phys);
    write(out, h as CUmemoryPool)
}

pub fn device_set_mem_pool(dev: CUdevice, pool: CUmemoryPool) -> R<()> {
    let p = cu()?;
    p.phys(dev)?;
    let mut g = p.lock();
    match g.pools.get(&(pool as u64)) {
        Some(pl) if pl.ord == dev as usize => {
            g.current_pool.insert(dev as usize, pool as u64);
            Ok(())
        }
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    const M: u64 = 1 << 20;

    #[test]
    fn reservation_math() {
        assert_eq!(grown(0, 0, 1), 32 * M);
        assert_eq!(grown(32 * M, 10 * M, 20 * M), 32 * M, "fits in the reservation");
        assert_eq!(grown(32 * M, 10 * M, 30 * M), 64 * M);
        assert_eq!(grown(0, 0, 100 * M), 128 * M);
        // Default threshold 0: an idle pool releases everything at sync.
        assert_eq!(after_sync(128 * M, 0, 0), 0);
        // Still-used bytes keep their chunks.
        assert_eq!(after_sync(128 * M, 33 * M, 0), 64 * M);
        // The threshold keeps memory reserved, never grows it.
        assert_eq!(after_sync(128 * M, 0, 64 * M), 64 * M);
        assert_eq!(after_sync(32 * M, 0, u64::MAX), 32 * M);
        assert_eq!(after_sync(128 * M, 0, 40 * M), 32 * M, "threshold rounds down to chunks");
        assert_eq!(trimmed(128 * M, 0, 0), 0);
        assert_eq!(trimmed(128 * M, 1, 40 * M), 64 * M);
        assert_eq!(trimmed(32 * M, 0, 1 << 40), 32 * M);
    }
}
