//! CUDA arrays and mipmapped arrays: charged their byte size (see
//! [`memory::array_bytes`]) on the current context's device; no contents.

use crate::cptr::{R, read, write};
use crate::ops::memory::{self, array_bytes, mipmap_bytes};
use crate::rt::{ArrayDesc, Proc, cu, new_handle};
use egpu_cuda::*;

fn create(p: &Proc, out: *mut CUarray, mut d: ArrayDesc, bytes: u64) -> R<u64> {
    if out.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut g = p.lock();
    let (_, _, phys) = memory::cur(&g)?;
    if !p.shm.charge(&p.locks, p.slot, phys, bytes) {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    d.phys = phys;
    d.charged = bytes;
    let h = new_handle();
    g.arrays.insert(h, d);
    Ok(h)
}

pub fn array_create(out: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR) -> R<()> {
    let p = cu()?;
    let a = read(desc)?;
    let bytes = array_bytes(a.Width, a.Height, 0, a.Format, a.NumChannels)?;
    let d = ArrayDesc { width: a.Width, height: a.Height, depth: 0, format: a.Format, channels: a.NumChannels, flags: 0, phys: 0, charged: 0, view: false };
    let h = create(p, out, d, bytes)?;
    write(out, h as CUarray)
}

pub fn array3d_create(out: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR) -> R<()> {
    let p = cu()?;
    let a = read(desc)?;
    let bytes = array_bytes(a.Width, a.Height, a.Depth, a.Format, a.NumChannels)?;
    let d = ArrayDesc { width: a.Width, height: a.Height, depth: a.Depth, format: a.Format, channels: a.NumChannels, flags: a.Flags, phys: 0, charged: 0, view: false };
    let h = create(p, out, d, bytes)?;
    write(out, h as CUarray)
}

pub fn array_destroy(a: CUarray) -> R<()> {
    let p = cu()?;
    let mut g = p.lock();
    match g.arrays.get(&(a as u64)) {
        Some(d) if !d.view => {
            let d = g.arrays.remove(&(a as u64)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            p.shm.uncharge(p.slot, d.phys, d.charged);
            Ok(())
        }
        _ => Err(CUDA_ERROR_INVALID_HANDLE),
    }
}

pub fn array_get_descriptor(out: *mut CUDA_ARRAY_DESCRIPTOR, a: CUarray) -> R<()> {
    let p = cu()?;
    let g = p.lock();
    let d = g.arrays.get(&(a as u64)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    write(out, CUDA_ARRAY_DESCRIPTOR { Width: d.width, Height: d.height, Format: d.format, NumChannels: d.channels })
}

pub fn array3d_get_descriptor(out: *mut CUDA_ARRAY3D_DESCRIPTOR, a: CUarray) -> R<()> {
    let p = cu()?;
    let g = p.lock();
    let d = g.arrays.get(&(a as u64)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    write(
        out,
        CUDA_ARRAY3D_DESCRIPTOR { Width: d.width, Height: d.height, Depth: d.depth, Format: d.format, NumChannels: d.channels, Flags: d.flags },
    )
}

pub fn mipmapped_create(out: *mut CUmipmappedArray, desc: *const CUDA_ARRAY3D_DESCRIPTOR, levels: u32) -> R<()> {
    let p = cu()?;
    let a = read(desc)?;
    if out.is_null() || levels == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let layered = a.Flags & CUDA_ARRAY3D_LAYERED != 0;
    let bytes = mipmap_bytes(a.Width, a.Height, a.Depth, a.Format, a.NumChannels, layered, levels)?;
    let mut g = p.lock();
    let (_, _, phys) = memory::cur(&g)?;
    if !p.shm.charge(&p.locks, p.slot, phys, bytes) {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    let top = ArrayDesc { width: a.Width, height: a.Height, depth: a.Depth, format: a.Format, channels: a.NumChannels, flags: a.Flags, phys, charged: bytes, view: false };
    let mut lv = Vec::new();
    let (mut w, mut h, mut d) = (a.Width, a.Height, a.Depth);
    for _ in 0..levels {
        let l = new_handle();
        g.arrays.insert(l, ArrayDesc { width: w, height: h, depth: d, charged: 0, view: true, ..top });
        lv.push(l);
        w = (w / 2).max(1);
        h = if h == 0 { 0 } else { (h / 2).max(1) };
        if !layered {
            d = if d == 0 { 0 } else { (d / 2).max(1) };
        }
    }
    let m = new_handle();
    g.mipmaps.insert(m, (top, levels, lv));
    write(out, m as CUmipmappedArray)
}

pub fn mipmapped_destroy(m: CUmipmappedArray) -> R<()> {
    let p = cu()?;
    let mut g = p.lock();
    let (top, _, lv) = g.mipmaps.remove(&(m as u64)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    for l in lv {
        g.arrays.remove(&l);
    }
    p.shm.uncharge(p.slot, top.phys, top.charged);
    Ok(())
}

pub fn mipmapped_get_level(out: *mut CUarray, m: CUmipmappedArray, level: u32) -> R<()> {
    let p = cu()?;
    let g = p.lock();
    let (_, _, lv) = g.mipmaps.get(&(m as u64)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let l = *lv.get(level as usize).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    write(out, l as CUarray)
}
