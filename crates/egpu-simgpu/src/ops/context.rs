//! Primary and explicit contexts. A context costs `EGPU_SIM_CTX_BYTES` of
//! device memory from creation (primary: first retain, or the first retain
//! after a reset) until destruction (primary: last release or reset);
//! destroying a context frees the memory allocated in it, like the real
//! driver. A reset does not release the primary context: the references
//! retained before it still count, and the context lives on after the next
//! retain until all of them are released (the CUDA documentation's words;
//! `EGPU_SIM_PRIMARY_RESET=drops-retains` drops them at the reset instead).

use crate::cptr::{R, read, write, write_opt};
use crate::rt::{self, Ctx, Inner, Kind, Proc, cu, new_handle};
use crate::state::timing;
use egpu_cuda::*;
use std::collections::{HashMap, HashSet};

fn default_limit(limit: u32) -> Option<usize> {
    Some(match limit {
        CU_LIMIT_STACK_SIZE => 1024,
        CU_LIMIT_PRINTF_FIFO_SIZE => 1 << 20,
        CU_LIMIT_MALLOC_HEAP_SIZE => 8 << 20,
        CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH => 2,
        CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT => 2048,
        CU_LIMIT_MAX_L2_FETCH_GRANULARITY => 64,
        CU_LIMIT_PERSISTING_L2_CACHE_SIZE => 0,
        CU_LIMIT_SHMEM_SIZE | CU_LIMIT_CIG_ENABLED | CU_LIMIT_CIG_SHMEM_FALLBACK_ENABLED => 0,
        _ => return None,
    })
}

/// Makes a context on ordinal `ord`, charging its cost.
fn make_ctx(p: &Proc, g: &mut Inner, handle: u64, ord: usize, flags: u32, primary: bool) -> R<()> {
    let phys = p.visible[ord];
    if !p.shm.charge(&p.locks, p.slot, phys, p.cfg.ctx_bytes) {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    g.ctxs.insert(
        handle,
        Ctx {
            ord,
            phys,
            flags,
            primary,
            charged: p.cfg.ctx_bytes,
            legacy_tail: 0,
            ptds_tail: 0,
            limits: HashMap::new(),
            peers: HashSet::new(),
        },
    );
    Ok(())
}

/// Destroys context `h`: frees what was allocated in it and its charge.
fn destroy_ctx(p: &Proc, g: &mut Inner, h: u64) {
    let Some(c) = g.ctxs.remove(&h) else { return };
    p.shm.uncharge(p.slot, c.phys, c.charged);
    let owned: Vec<u64> = g
        .allocs
        .values()
        .filter(|a| a.ctx == h && matches!(a.kind, Kind::Device | Kind::Managed | Kind::ModuleGlobal))
        .map(|a| a.base)
        .collect();
    for base in owned {
        let _ = crate::ops::memory::free_locked(p, g, base);
    }
    g.streams.retain(|_, s| s.ctx != h);
    g.ptds_captures.retain(|(c, _), _| *c != h);
    rt::ctx_forget(h);
}

/// The current context's handle, or `CUDA_ERROR_INVALID_CONTEXT`.
pub fn current(g: &Inner) -> R<u64> {
    let h = rt::ctx_top().ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
    if g.ctxs.contains_key(&h) { Ok(h) } else { Err(CUDA_ERROR_INVALID_CONTEXT) }
}

pub fn ctx_create(out: *mut CUcontext, flags: u32, dev: CUdevice) -> R<()> {
    let p = cu()?;
    let ord = usize::try_from(dev).map_err(|_| CUDA_ERROR_INVALID_DEVICE)?;
    p.phys(dev)?;
    if out.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut g = p.lock();
    let h = new_handle();
    make_ctx(p, &mut g, h, ord, flags, false)?;
    rt::ctx_push(h);
    write(out, h as CUcontext)
}

pub fn ctx_create_v3(out: *mut CUcontext, _params: *mut CUexecAffinityParam, _n: i32, flags: u32, dev: CUdevice) -> R<()> {
    ctx_create(out, flags, dev)
}

pub fn ctx_create_v4(out: *mut CUcontext, _params: *mut CUctxCreateParams, flags: u32, dev: CUdevice) -> R<()> {
    ctx_create(out, flags, dev)
}

pub fn ctx_destroy(ctx: CUcontext) -> R<()> {
    let p = cu()?;
    let mut g = p.lock();
    let h = ctx as u64;
    match g.ctxs.get(&h) {
        None => return Err(CUDA_ERROR_INVALID_CONTEXT),
        Some(c) if c.primary => return Err(CUDA_ERROR_INVALID_CONTEXT),
        Some(_) => {}
    }
    destroy_ctx(p, &mut g, h);
    Ok(())
}

pub fn primary_retain(out: *mut CUcontext, dev: CUdevice) -> R<()> {
    let p = cu()?;
    p.phys(dev)?;
    if out.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let h = retain_locked(p, &mut p.lock(), dev as usize)?;
    write(out, h as CUcontext)
}

/// One reference more to the primary context of ordinal `ord`, made if it
/// is not active; its handle.
fn retain_locked(p: &Proc, g: &mut Inner, ord: usize) -> R<u64> {
    if g.primary[ord].handle == 0 {
        g.primary[ord].handle = new_handle();
    }
    let h = g.primary[ord].handle;
    // Not active: never made, last released, or reset. A reset keeps the
    // references retained before it (unless configured otherwise), and
    // this retain makes a new context that they share.
    if !g.ctxs.contains_key(&h) {
        let flags = g.primary[ord].flags;
        make_ctx(p, g, h, ord, flags, true)?;
    }
    g.primary[ord].refcount += 1;
    Ok(h)
}

pub fn primary_release(dev: CUdevice) -> R<()> {
    let p = cu()?;
    p.phys(dev)?;
    release_locked(p, &mut p.lock(), dev as usize)
}

/// One reference less to the primary context of ordinal `ord`; the last
/// destroys it.
fn release_locked(p: &Proc, g: &mut Inner, ord: usize) -> R<()> {
    let pr = &mut g.primary[ord];
    if pr.refcount == 0 {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    pr.refcount -= 1;
    if pr.refcount == 0 {
        let h = pr.handle;
        destroy_ctx(p, g, h);
    }
    Ok(())
}

pub fn primary_reset(dev: CUdevice) -> R<()> {
    let p = cu()?;
    p.phys(dev)?;
    let mut g = p.lock();
    let h = g.primary[dev as usize].handle;
    if p.cfg.reset_drops_retains {
        g.primary[dev as usize].refcount = 0;
    }
    g.primary[dev as usize].flags = 0;
    destroy_ctx(p, &mut g, h);
    Ok(())
}

/// `cuDeviceGetDevResource`: the device's SMs (the only resource type here).
pub fn dev_resource(dev: CUdevice, out: *mut CUdevResource, kind: u32) -> R<()> {
    let p = cu()?;
    let phys = p.phys(dev)?;
    if kind != CU_DEV_RESOURCE_TYPE_SM {
        return Err(CUDA_ERROR_INVALID_RESOURCE_TYPE);
    }
    write(out, CUdevResource { type_: kind, sm_count: p.cfg.spec.devices[phys].sm_count, ..Default::default() })
}

/// `cuDevResourceGenerateDesc`: a descriptor token for SM resources.
pub fn resource_desc(out: *mut CUdevResourceDesc, res: *mut CUdevResource, n: u32) -> R<()> {
    cu()?;
    if n == 0 || read(res)?.type_ != CU_DEV_RESOURCE_TYPE_SM {
        return Err(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
    }
    write(out, new_handle() as CUdevResourceDesc)
}

/// `cuGreenCtxCreate`: as the driver documents, it retains the device's
/// primary context (made now if not active), released when the green
/// context is destroyed.
pub fn green_create(out: *mut CUgreenCtx, desc: CUdevResourceDesc, dev: CUdevice, flags: u32) -> R<()> {
    let p = cu()?;
    p.phys(dev)?;
    if out.is_null() || desc.is_null() || flags & !CU_GREEN_CTX_DEFAULT_STREAM != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut g = p.lock();
    retain_locked(p, &mut g, dev as usize)?;
    let h = new_handle();
    g.greens.insert(h, dev as usize);
    write(out, h as CUgreenCtx)
}

/// `cuGreenCtxDestroy`: releases the primary context it retained.
pub fn green_destroy(green: CUgreenCtx) -> R<()> {
    let p = cu()?;
    let mut g = p.lock();
    let ord = g.greens.remove(&(green as u64)).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
    release_locked(p, &mut g, ord)
}

/// `cuCtxFromGreenCtx`: a context handle for the green context, which acts
/// as the device's primary context here (no SM partitioning is simulated).
pub fn ctx_from_green(out: *mut CUcontext, green: CUgreenCtx) -> R<()> {
    let p = cu()?;
    let g = p.lock();
    let ord = *g.greens.get(&(green as u64)).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
    write(out, g.primary[ord].handle as CUcontext)
}

pub fn primary_get_state(dev: CUdevice, flags: *mut u32, active: *mut i32) -> R<()> {
    let p = cu()?;
    p.phys(dev)?;
    let g = p.lock();
    let pr = &g.primary[dev as usize];
    write(flags, pr.flags)?;
    write(active, g.ctxs.contains_key(&pr.handle) as i32)
}

pub fn primary_set_flags(dev: CUdevice, flags: u32) -> R<()> {
    let p = cu()?;
    p.phys(dev)?;
    if flags & !CU_CTX_FLAGS_MASK != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut g = p.lock();
    g.primary[dev as usize].flags = flags;
    let h = g.primary[dev as usize].handle;
    if let Some(c) = g.ctxs.get_mut(&h) {
        c.flags = flags;
    }
    Ok(())
}

pub fn get_current(out: *mut CUcontext) -> R<()> {
    cu()?;
    write(out, rt::ctx_top().unwrap_or(0) as CUcontext)
}

pub fn set_current(ctx: CUcontext) -> R<()> {
    let p = cu()?;
    let h = ctx as u64;
    if h != 0 && !p.lock().ctxs.contains_key(&h) {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    rt::ctx_set_top((h != 0).then_some(h));
    Ok(())
}

pub fn push_current(ctx: CUcontext) -> R<()> {
    let p = cu()?;
    let h = ctx as u64;
    if !p.lock().ctxs.contains_key(&h) {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    rt::ctx_push(h);
    Ok(())
}

pub fn pop_current(out: *mut CUcontext) -> R<()> {
    cu()?;
    let h = rt::ctx_pop().ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
    write_opt(out, h as CUcontext);
    Ok(())
}

pub fn get_device(out: *mut CUdevice) -> R<()> {
    let p = cu()?;
    let g = p.lock();
    let h = current(&g)?;
    write(out, g.ctxs[&h].ord as CUdevice)
}

pub fn get_flags(out: *mut u32) -> R<()> {
    let p = cu()?;
    let g = p.lock();
    let h = current(&g)?;
    write(out, g.ctxs[&h].flags)
}

pub fn set_flags(flags: u32) -> R<()> {
    let p = cu()?;
    let mut g = p.lock();
    let h = current(&g)?;
    g.ctxs.get_mut(&h).ok_or(CUDA_ERROR_INVALID_CONTEXT)?.flags = flags;
    Ok(())
}

pub fn get_id(ctx: CUcontext, out: *mut u64) -> R<()> {
    let p = cu()?;
    let g = p.lock();
    let h = if ctx.is_null() { current(&g)? } else { ctx as u64 };
    if !g.ctxs.contains_key(&h) {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    write(out, (h - 0x5e6d_0000_0000) / 16)
}

pub fn get_api_version(ctx: CUcontext, out: *mut u32) -> R<()> {
    let p = cu()?;
    let g = p.lock();
    let h = if ctx.is_null() { current(&g)? } else { ctx as u64 };
    if !g.ctxs.contains_key(&h) {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    write(out, 3020)
}

/// Latest completion time of any work queued in context `h`.
pub fn ctx_tail(g: &Inner, h: u64) -> u64 {
    let c = &g.ctxs[&h];
    g.streams.values().filter(|s| s.ctx == h).map(|s| s.tail).fold(c.legacy_tail.max(c.ptds_tail), u64::max)
}

pub fn synchronize() -> R<()> {
    synchronize_v2(std::ptr::null_mut())
}

/// `cuCtxSynchronize_v2` (CUDA 13): waits for `ctx`, or the current context when null.
pub fn synchronize_v2(ctx: CUcontext) -> R<()> {
    let p = cu()?;
    let (deadline, ord) = {
        let mut g = p.lock();
        crate::ops::capture::unsafe_call(&mut g)?;
        let h = if ctx.is_null() { current(&g)? } else { ctx as u64 };
        if !g.ctxs.contains_key(&h) {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        (ctx_tail(&g, h), g.ctxs[&h].ord)
    };
    timing::sleep_until(deadline);
    crate::ops::pool::on_sync(p, ord);
    Ok(())
}

pub fn get_limit(out: *mut usize, limit: u32) -> R<()> {
    let p = cu()?;
    let g = p.lock();
    let h = current(&g)?;
    let v = g.ctxs[&h].limits.get(&limit).copied().or_else(|| default_limit(limit)).ok_or(CUDA_ERROR_UNSUPPORTED_LIMIT)?;
    write(out, v)
}

pub fn set_limit(limit: u32, value: usize) -> R<()> {
    let p = cu()?;
    default_limit(limit).ok_or(CUDA_ERROR_UNSUPPORTED_LIMIT)?;
    let mut g = p.lock();
    let h = current(&g)?;
    g.ctxs.get_mut(&h).ok_or(CUDA_ERROR_INVALID_CONTEXT)?.limits.insert(limit, value);
    Ok(())
}

pub fn enable_peer_access(peer: CUcontext, flags: u32) -> R<()> {
    let p = cu()?;
    if flags != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut g = p.lock();
    let h = current(&g)?;
    let pd = g.ctxs.get(&(peer as u64)).ok_or(CUDA_ERROR_INVALID_CONTEXT)?.phys;
    let c = g.ctxs.get_mut(&h).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
    if pd == c.phys {
        return Err(CUDA_ERROR_INVALID_DEVICE);
    }
    if !c.peers.insert(peer as u64) {
        return Err(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
    }
    Ok(())
}

pub fn disable_peer_access(peer: CUcontext) -> R<()> {
    let p = cu()?;
    let mut g = p.lock();
    let h = current(&g)?;
    if !g.ctxs.get_mut(&h).ok_or(CUDA_ERROR_INVALID_CONTEXT)?.peers.remove(&(peer as u64)) {
        return Err(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
    }
    Ok(())
}

pub fn get_cache_config(out: *mut u32) -> R<()> {
    cu()?;
    write(out, CU_FUNC_CACHE_PREFER_NONE)
}

pub fn get_stream_priority_range(least: *mut i32, greatest: *mut i32) -> R<()> {
    cu()?;
    write_opt(least, 0);
    write_opt(greatest, -5);
    Ok(())
}

/// Accepts and ignores (cache/shared-memory configuration and the like).
pub fn ok_if_ctx() -> R<()> {
    let p = cu()?;
    current(&p.lock()).map(|_| ())
}

pub fn read_ctx(p: *const CUcontext) -> R<u64> {
    read(p).map(|c| c as u64)
}

/// Latest completion time of the legacy stream and every blocking stream of
/// context `h`: where new legacy-stream work may start.
pub fn ctx_tail_blocking(g: &Inner, h: u64) -> u64 {
    let Some(c) = g.ctxs.get(&h) else { return 0 };
    g.streams
        .values()
        .filter(|s| s.ctx == h && s.flags & CU_STREAM_NON_BLOCKING == 0)
        .map(|s| s.tail)
        .fold(c.legacy_tail.max(c.ptds_tail), u64::max)
}
