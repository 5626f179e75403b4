//! memcpy / memset: they really move bytes. Device ranges are validated
//! against the allocation registry (an unknown or too-short device range is
//! `CUDA_ERROR_INVALID_VALUE`, never a fault); host pointers are the
//! caller's responsibility, as with the real driver. Synchronous forms first
//! wait for the legacy stream (and the streams it synchronises with) of the
//! current context; copies themselves take no simulated time.

use crate::cptr::{R, copy_bytes, fill, read};
use crate::ops::{context, stream};
use crate::rt::{Proc, cu};
use crate::state::timing::sleep_until;
use egpu_cuda::*;
use std::ffi::c_void;

/// Sleeps until the current context's legacy-stream work is done.
fn wait_legacy(p: &Proc) {
    let t = {
        let g = p.lock();
        context::current(&g).map(|c| context::ctx_tail_blocking(&g, c)).unwrap_or(0)
    };
    sleep_until(t);
}

/// Validates a stream argument of an async copy.
fn check_stream(p: &Proc, s: CUstream, ptsz: bool) -> R<()> {
    stream::resolve(&p.lock(), s, ptsz).map(|_| ())
}

/// Which side of a unified copy is simulated memory: validate it if so.
fn check_any(p: &Proc, ptr: u64, n: u64) -> R<()> {
    let g = p.lock();
    match g.find(ptr) {
        Some(_) => g.range(ptr, n).map(|_| ()),
        None if ptr == 0 && n > 0 => Err(CUDA_ERROR_INVALID_VALUE),
        None => Ok(()), // a host pointer
    }
}

fn check_dev(p: &Proc, ptr: u64, n: u64) -> R<()> {
    if n == 0 {
        return Ok(());
    }
    p.lock().range(ptr, n).map(|_| ())
}

pub fn htod(dst: CUdeviceptr, src: *const c_void, n: usize, sync: bool) -> R<()> {
    let p = cu()?;
    check_dev(p, dst, n as u64)?;
    if sync {
        wait_legacy(p);
    }
    copy_bytes(dst, src as u64, n)
}

pub fn dtoh(dst: *mut c_void, src: CUdeviceptr, n: usize, sync: bool) -> R<()> {
    let p = cu()?;
    check_dev(p, src, n as u64)?;
    if sync {
        wait_legacy(p);
    }
    copy_bytes(dst as u64, src, n)
}

pub fn dtod(dst: CUdeviceptr, src: CUdeviceptr, n: usize, sync: bool) -> R<()> {
    let p = cu()?;
    check_dev(p, dst, n as u64)?;
    check_dev(p, src, n as u64)?;
    if sync {
        wait_legacy(p);
    }
    copy_bytes(dst, src, n)
}

pub fn unified(dst: CUdeviceptr, src: CUdeviceptr, n: usize, sync: bool) -> R<()> {
    let p = cu()?;
    check_any(p, dst, n as u64)?;
    check_any(p, src, n as u64)?;
    if sync {
        wait_legacy(p);
    }
    copy_bytes(dst, src, n)
}

pub fn htod_async(dst: CUdeviceptr, src: *const c_void, n: usize, s: CUstream, ptsz: bool) -> R<()> {
    check_stream(cu()?, s, ptsz)?;
    htod(dst, src, n, false)
}

pub fn dtoh_async(dst: *mut c_void, src: CUdeviceptr, n: usize, s: CUstream, ptsz: bool) -> R<()> {
    check_stream(cu()?, s, ptsz)?;
    dtoh(dst, src, n, false)
}

pub fn dtod_async(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream, ptsz: bool) -> R<()> {
    check_stream(cu()?, s, ptsz)?;
    dtod(dst, src, n, false)
}

pub fn unified_async(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream, ptsz: bool) -> R<()> {
    check_stream(cu()?, s, ptsz)?;
    unified(dst, src, n, false)
}

pub fn peer(dst: CUdeviceptr, _dc: CUcontext, src: CUdeviceptr, _sc: CUcontext, n: usize, s: Option<(CUstream, bool)>) -> R<()> {
    if let Some((s, ptsz)) = s {
        check_stream(cu()?, s, ptsz)?;
    }
    dtod(dst, src, n, s.is_none())
}

/// `cuMemsetD{8,16,32}` (and 2D with a pitch): `elem`-byte elements.
#[allow(clippy::too_many_arguments)]
pub fn memset(dst: CUdeviceptr, pitch: usize, value: u32, elem: usize, width: usize, height: usize, sync: bool, s: Option<(CUstream, bool)>) -> R<()> {
    let p = cu()?;
    if let Some((s, ptsz)) = s {
        check_stream(p, s, ptsz)?;
    }
    if width == 0 || height == 0 {
        return Ok(());
    }
    let row = (width * elem) as u64;
    let pitch = if height == 1 { row } else { pitch as u64 };
    if pitch < row {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    check_dev(p, dst, pitch * (height as u64 - 1) + row)?;
    if sync {
        wait_legacy(p);
    }
    for r in 0..height as u64 {
        fill(dst + r * pitch, value, elem, width)?;
    }
    Ok(())
}

/// `cuMemcpy2D` between host, device and unified memory (arrays are not
/// supported).
pub fn copy_2d(pc: *const CUDA_MEMCPY2D, sync: bool, s: Option<(CUstream, bool)>) -> R<()> {
    let p = cu()?;
    let c = read(pc)?;
    if let Some((s, ptsz)) = s {
        check_stream(p, s, ptsz)?;
    }
    let side = |ty: u32, host: u64, dev: u64, x: usize, y: usize, pitch: usize| -> R<(u64, bool)> {
        let base = match ty {
            CU_MEMORYTYPE_HOST => (host, false),
            CU_MEMORYTYPE_DEVICE => (dev, true),
            CU_MEMORYTYPE_UNIFIED => (dev, p.lock().find(dev).is_some()),
            _ => return Err(CUDA_ERROR_NOT_SUPPORTED),
        };
        Ok((base.0 + (y * pitch + x) as u64, base.1))
    };
    let (src, src_dev) = side(c.srcMemoryType, c.srcHost as u64, c.srcDevice, c.srcXInBytes, c.srcY, c.srcPitch)?;
    let (dst, dst_dev) = side(c.dstMemoryType, c.dstHost as u64, c.dstDevice, c.dstXInBytes, c.dstY, c.dstPitch)?;
    if c.Height == 0 || c.WidthInBytes == 0 {
        return Ok(());
    }
    if (c.Height > 1 && (c.srcPitch < c.WidthInBytes || c.dstPitch < c.WidthInBytes)) || src == 0 || dst == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let extent = |pitch: usize| (pitch * (c.Height - 1) + c.WidthInBytes) as u64;
    if src_dev {
        check_dev(p, src, extent(c.srcPitch))?;
    }
    if dst_dev {
        check_dev(p, dst, extent(c.dstPitch))?;
    }
    if sync {
        wait_legacy(p);
    }
    for r in 0..c.Height as u64 {
        copy_bytes(dst + r * c.dstPitch as u64, src + r * c.srcPitch as u64, c.WidthInBytes)?;
    }
    Ok(())
}
