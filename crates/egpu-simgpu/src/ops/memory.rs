//! Device, managed and pinned-host memory; address queries; pointer
//! attributes. Charging: `cuMemAlloc`, `cuMemAllocPitch` and
//! `cuMemAllocManaged` charge exactly the bytes requested (pitch x height for
//! pitched memory) to the current context's device; host memory is never
//! charged.

use crate::cptr::{R, read_at, write, write_opt};
use crate::ops::{arena, context};
use crate::rt::{Alloc, Inner, Kind, Proc, cu};
use crate::sys;
use egpu_cuda::*;
use std::ffi::c_void;

/// (context handle, ordinal, physical index) of the current context.
pub fn cur(g: &Inner) -> R<(u64, usize, usize)> {
    let h = context::current(g)?;
    let c = &g.ctxs[&h];
    Ok((h, c.ord, c.phys))
}

/// Allocates and registers `size` bytes of arena memory on the current
/// device, charging `charge` bytes.
pub fn alloc_arena(p: &Proc, g: &mut Inner, size: u64, kind: Kind, charge: u64) -> R<u64> {
    if size == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (ctx, ord, phys) = cur(g)?;
    alloc_arena_on(p, g, ctx, ord, phys, size, kind, charge)
}

#[allow(clippy::too_many_arguments)]
pub fn alloc_arena_on(p: &Proc, g: &mut Inner, ctx: u64, ord: usize, phys: usize, size: u64, kind: Kind, charge: u64) -> R<u64> {
    if charge > 0 && !p.shm.charge(&p.locks, p.slot, phys, charge) {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    let (base, span) = match arena::alloc(p, g, phys, size) {
        Ok(x) => x,
        Err(e) => {
            p.shm.uncharge(p.slot, phys, charge);
            return Err(e);
        }
    };
    let id = g.next_buffer_id;
    g.next_buffer_id += 1;
    g.allocs.insert(
        base,
        Alloc { base, size, span, kind, ord, phys, ctx, charged: charge, id, access: CU_MEM_ACCESS_FLAGS_PROT_READWRITE, host_flags: 0 },
    );
    Ok(base)
}

/// Frees the allocation starting at `base` (any freeable kind).
pub fn free_locked(p: &Proc, g: &mut Inner, base: u64) -> R<()> {
    let a = g.allocs.get(&base).ok_or(CUDA_ERROR_INVALID_VALUE)?.clone();
    match a.kind {
        Kind::Device | Kind::Managed | Kind::ModuleGlobal => {}
        Kind::Pool(pool) => return crate::ops::pool::free_alloc(p, g, pool, base),
        Kind::GraphAlloc => return crate::ops::graph::free_alloc(p, g, base),
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    }
    g.allocs.remove(&base);
    p.shm.uncharge(p.slot, a.phys, a.charged);
    arena::free(g, a.phys, a.base, a.span);
    Ok(())
}

pub fn mem_alloc(out: *mut CUdeviceptr, size: usize) -> R<()> {
    let p = cu()?;
    if out.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut g = p.lock();
    let d = alloc_arena(p, &mut g, size as u64, Kind::Device, size as u64)?;
    write(out, d)
}

pub fn mem_alloc_pitch(out: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, elem: u32) -> R<()> {
    let p = cu()?;
    if out.is_null() || pitch.is_null() || !matches!(elem, 4 | 8 | 16) || width == 0 || height == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let pt = sys::round_up(width as u64, 512);
    let size = pt.checked_mul(height as u64).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let mut g = p.lock();
    let d = alloc_arena(p, &mut g, size, Kind::Device, size)?;
    write(pitch, pt as usize)?;
    write(out, d)
}

pub fn mem_alloc_managed(out: *mut CUdeviceptr, size: usize, flags: u32) -> R<()> {
    let p = cu()?;
    if out.is_null() || !(flags == CU_MEM_ATTACH_GLOBAL || flags == CU_MEM_ATTACH_HOST) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut g = p.lock();
    let d = alloc_arena(p, &mut g, size as u64, Kind::Managed, size as u64)?;
    write(out, d)
}

pub fn mem_free(d: CUdeviceptr) -> R<()> {
    let p = cu()?;
    if d == 0 {
        return Ok(());
    }
    let mut g = p.lock();
    free_locked(p, &mut g, d)
}

pub fn mem_get_info(free: *mut usize, total: *mut usize) -> R<()> {
    let p = cu()?;
    let phys = cur(&p.lock())?.2;
    let t = p.shm.devs[phys].total;
    let used = p.shm.used(phys);
    write(free, t.saturating_sub(used) as usize)?;
    write(total, t as usize)
}

pub fn get_address_range(base: *mut CUdeviceptr, size: *mut usize, d: CUdeviceptr) -> R<()> {
    let p = cu()?;
    let g = p.lock();
    let a = g.find(d).ok_or(CUDA_ERROR_NOT_FOUND)?;
    write_opt(base, a.base);
    write_opt(size, a.size as usize);
    Ok(())
}

// --- pinned host memory (never charged) ------------------------------------

fn host_alloc_impl(out: *mut *mut c_void, size: usize, flags: u32) -> R<()> {
    let p = cu()?;
    if out.is_null() || size == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut g = p.lock();
    let (ctx, ord, phys) = cur(&g)?;
    let span = sys::round_up(size as u64, sys::PAGE);
    let base = sys::anon(span)?;
    let id = g.next_buffer_id;
    g.next_buffer_id += 1;
    g.allocs.insert(
        base,
        Alloc {
            base,
            size: size as u64,
            span,
            kind: Kind::HostAlloc,
            ord,
            phys,
            ctx,
            charged: 0,
            id,
            access: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            host_flags: flags,
        },
    );
    write(out, base as *mut c_void)
}

pub fn mem_alloc_host(out: *mut *mut c_void, size: usize) -> R<()> {
    host_alloc_impl(out, size, 0)
}

pub fn mem_host_alloc(out: *mut *mut c_void, size: usize, flags: u32) -> R<()> {
    host_alloc_impl(out, size, flags)
}

pub fn mem_free_host(ptr: *mut c_void) -> R<()> {
    let p = cu()?;
    let mut g = p.lock();
    match g.allocs.get(&(ptr as u64)) {
        Some(a) if a.kind == Kind::HostAlloc => {
            let (b, s) = (a.base, a.span);
            g.allocs.remove(&b);
            sys::unmap(b, s);
            Ok(())
        }
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

pub fn host_register(ptr: *mut c_void, size: usize, flags: u32) -> R<()> {
    let p = cu()?;
    let base = ptr as u64;
    if base == 0 || size == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut g = p.lock();
    let (ctx, ord, phys) = cur(&g)?;
    if g.find(base).is_some() || g.find(base + size as u64 - 1).is_some() {
        return Err(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    }
    let id = g.next_buffer_id;
    g.next_buffer_id += 1;
    g.allocs.insert(
        base,
        Alloc {
            base,
            size: size as u64,
            span: size as u64,
            kind: Kind::HostRegistered,
            ord,
            phys,
            ctx,
            charged: 0,
            id,
            access: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            host_flags: flags,
        },
    );
    Ok(())
}

pub fn host_unregister(ptr: *mut c_void) -> R<()> {
    let p = cu()?;
    let mut g = p.lock();
    match g.allocs.get(&(ptr as u64)) {
        Some(a) if a.kind == Kind::HostRegistered => {
            g.allocs.remove(&(ptr as u64));
            Ok(())
        }
        _ => Err(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED),
    }
}

pub fn host_get_device_pointer(out: *mut CUdeviceptr, ptr: *mut c_void, flags: u32) -> R<()> {
    let p = cu()?;
    if flags != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let g = p.lock();
    match g.find(ptr as u64) {
        Some(a) if matches!(a.kind, Kind::HostAlloc | Kind::HostRegistered) => write(out, ptr as u64),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

pub fn host_get_flags(out: *mut u32, ptr: *mut c_void) -> R<()> {
    let p = cu()?;
    let g = p.lock();
    match g.find(ptr as u64) {
        Some(a) if matches!(a.kind, Kind::HostAlloc | Kind::HostRegistered) => write(out, a.host_flags),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

// --- pointer attributes ------------------------------------------------------

fn is_host(k: Kind) -> bool {
    matches!(k, Kind::HostAlloc | Kind::HostRegistered)
}

/// Writes attribute `attr` of `a` (None: not a simulated pointer) to `data`.
fn write_attr(g: &Inner, data: *mut c_void, attr: u32, ptr: u64, a: Option<&Alloc>) -> R<()> {
    let Some(a) = a else {
        return match attr {
            CU_POINTER_ATTRIBUTE_MEMORY_TYPE => write(data as *mut u32, 0),
            CU_POINTER_ATTRIBUTE_CONTEXT | CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE => write(data as *mut u64, 0),
            CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL => write(data as *mut i32, -2),
            CU_POINTER_ATTRIBUTE_P2P_TOKENS => write(data as *mut CUDA_POINTER_ATTRIBUTE_P2P_TOKENS, Default::default()),
            CU_POINTER_ATTRIBUTE_RANGE_SIZE | CU_POINTER_ATTRIBUTE_MAPPING_SIZE => write(data as *mut usize, 0),
            CU_POINTER_ATTRIBUTE_DEVICE_POINTER
            | CU_POINTER_ATTRIBUTE_HOST_POINTER
            | CU_POINTER_ATTRIBUTE_RANGE_START_ADDR
            | CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR
            | CU_POINTER_ATTRIBUTE_BUFFER_ID
            | CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES
            | CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID => write(data as *mut u64, 0),
            _ => write(data as *mut u32, 0),
        };
    };
    let mapping_base = match a.kind {
        Kind::Vmm { offset, .. } => a.base - offset.min(a.base),
        _ => a.base,
    };
    match attr {
        CU_POINTER_ATTRIBUTE_CONTEXT => write(data as *mut u64, a.ctx),
        CU_POINTER_ATTRIBUTE_MEMORY_TYPE => {
            write(data as *mut u32, if is_host(a.kind) { CU_MEMORYTYPE_HOST } else { CU_MEMORYTYPE_DEVICE })
        }
        CU_POINTER_ATTRIBUTE_DEVICE_POINTER => write(data as *mut u64, ptr),
        CU_POINTER_ATTRIBUTE_HOST_POINTER => {
            if is_host(a.kind) || a.kind == Kind::Managed {
                write(data as *mut u64, ptr)
            } else {
                Err(CUDA_ERROR_INVALID_VALUE)
            }
        }
        CU_POINTER_ATTRIBUTE_P2P_TOKENS => write(data as *mut CUDA_POINTER_ATTRIBUTE_P2P_TOKENS, Default::default()),
        CU_POINTER_ATTRIBUTE_SYNC_MEMOPS | CU_POINTER_ATTRIBUTE_MAPPED => write(data as *mut u32, 1),
        CU_POINTER_ATTRIBUTE_BUFFER_ID | CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID => write(data as *mut u64, a.id),
        CU_POINTER_ATTRIBUTE_IS_MANAGED => write(data as *mut u32, (a.kind == Kind::Managed) as u32),
        CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL => write(data as *mut i32, a.ord as i32),
        CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE => write(data as *mut u32, (a.kind == Kind::Device) as u32),
        CU_POINTER_ATTRIBUTE_RANGE_START_ADDR => write(data as *mut u64, a.base),
        CU_POINTER_ATTRIBUTE_RANGE_SIZE => write(data as *mut usize, a.size as usize),
        CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES => {
            let t = match a.kind {
                Kind::Vmm { handle, .. } => g.phys.get(&handle).map_or(0, |ph| ph.handle_types as u64),
                _ => 0,
            };
            write(data as *mut u64, t)
        }
        CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE => write(data as *mut u32, 0),
        CU_POINTER_ATTRIBUTE_ACCESS_FLAGS => write(data as *mut u32, a.access),
        CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE => {
            write(data as *mut u64, if let Kind::Pool(pool) = a.kind { pool } else { 0 })
        }
        CU_POINTER_ATTRIBUTE_MAPPING_SIZE => write(data as *mut usize, a.span as usize),
        CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR => write(data as *mut u64, mapping_base),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

pub fn pointer_get_attribute(data: *mut c_void, attr: u32, ptr: CUdeviceptr) -> R<()> {
    let p = cu()?;
    let g = p.lock();
    let a = g.find(ptr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    write_attr(&g, data, attr, ptr, Some(a))
}

/// Validates a simulated pointer (cuPointerSetAttribute).
pub fn pointer_check(ptr: CUdeviceptr) -> R<()> {
    let p = cu()?;
    p.lock().find(ptr).map(|_| ()).ok_or(CUDA_ERROR_INVALID_VALUE)
}

pub fn pointer_get_attributes(n: u32, attrs: *const u32, data: *mut *mut c_void, ptr: CUdeviceptr) -> R<()> {
    let p = cu()?;
    let g = p.lock();
    let a = g.find(ptr);
    for i in 0..n as usize {
        let attr = read_at(attrs, i)?;
        let d = read_at(data as *const *mut c_void, i)?;
        if !d.is_null() {
            write_attr(&g, d, attr, ptr, a)?;
        }
    }
    Ok(())
}

// --- arrays (charged by their byte size, no contents) -------------------------

/// Bytes of one array (level): width x max(height,1) x max(depth,1) x
/// element size (format bytes x channels).
pub fn array_bytes(w: usize, h: usize, d: usize, format: u32, channels: u32) -> R<u64> {
    let fb = array_format_bytes(format).ok_or(CUDA_ERROR_INVALID_VALUE)? as u64;
    if w == 0 || !matches!(channels, 1 | 2 | 4) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    (w as u64)
        .checked_mul(h.max(1) as u64)
        .and_then(|x| x.checked_mul(d.max(1) as u64))
        .and_then(|x| x.checked_mul(fb * channels as u64))
        .ok_or(CUDA_ERROR_INVALID_VALUE)
}

/// Bytes of a mipmapped array: the sum over levels, each halving width,
/// height and (unless layered) depth, never below 1.
pub fn mipmap_bytes(w: usize, h: usize, d: usize, format: u32, channels: u32, layered: bool, levels: u32) -> R<u64> {
    let (mut w, mut h, mut d) = (w, h, d);
    let mut total = 0u64;
    for _ in 0..levels.max(1) {
        total = total.checked_add(array_bytes(w, h, d, format, channels)?).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        w = (w / 2).max(1);
        h = if h == 0 { 0 } else { (h / 2).max(1) };
        if !layered {
            d = if d == 0 { 0 } else { (d / 2).max(1) };
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_sizes() {
        assert_eq!(array_bytes(100, 0, 0, CU_AD_FORMAT_FLOAT, 4).unwrap(), 1600);
        assert_eq!(array_bytes(64, 32, 2, CU_AD_FORMAT_HALF, 1).unwrap(), 64 * 32 * 2 * 2);
        assert!(array_bytes(64, 32, 2, CU_AD_FORMAT_HALF, 3).is_err());
        assert!(array_bytes(0, 1, 1, CU_AD_FORMAT_FLOAT, 1).is_err());
        // 8x8 float: 64 + 16 + 4 + 1 elements of 4 bytes.
        assert_eq!(mipmap_bytes(8, 8, 0, CU_AD_FORMAT_FLOAT, 1, false, 4).unwrap(), (64 + 16 + 4 + 1) * 4);
        // Layered: layers are not halved.
        assert_eq!(mipmap_bytes(4, 4, 3, CU_AD_FORMAT_UNSIGNED_INT8, 1, true, 2).unwrap(), 16 * 3 + 4 * 3);
    }
}
