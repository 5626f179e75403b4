//! CUDA arrays and mipmapped arrays: charged their byte size (see
//! [`memory::array_bytes`]) on the current context's device; no contents.
//!
//! Sparse arrays (`CUDA_ARRAY3D_SPARSE`) are charged nothing: their tiles are
//! backed by VMM handles that `cuMemMapArrayAsync` maps. Each mapped tile
//! range holds a mapping reference on its handle's physical allocation, so
//! releasing the handle frees nothing until the range is unmapped (an unmap
//! takes its tiles out of every mapped range: a range inside it goes, one it
//! cuts through leaves its other pieces mapped, each holding a reference;
//! a map over ranges replaces what it covers) or its array destroyed. Checked as the driver documents: a sparse
//! array or mipmapped array (not one of its levels), one device bit, a
//! generic handle to map and none to unmap. Not checked: tiles against the
//! array's tile size and the handle's size, and the handle's
//! `CU_MEM_CREATE_USAGE_TILE_POOL` flag. The operations take effect at the
//! call; deferred-mapping arrays are not simulated.

use crate::cptr::{R, read, read_at, write};
use crate::ops::memory::{self, array_bytes, mipmap_bytes};
use crate::ops::vmm::drop_if_unused;
use crate::rt::{ArrayDesc, Inner, Proc, cu, new_handle};
use egpu_cuda::*;

fn sparse_bytes(flags: u32, bytes: u64) -> u64 {
    if flags & CUDA_ARRAY3D_SPARSE != 0 { 0 } else { bytes }
}

/// Unmaps the tiles of `cut` (all of them: `None`) from `resource`: a
/// range inside goes, releasing its handle's mapping reference; a range it
/// cuts through leaves its other pieces mapped, a reference each.
fn unmap_ranges(p: &Proc, g: &mut Inner, resource: u64, cut: Option<&SparseTiles>) {
    let hit: Vec<((u64, SparseTiles), Option<TilePieces>)> = g
        .sparse
        .range((resource, SparseTiles::MIN)..)
        .take_while(|(k, _)| k.0 == resource)
        .filter_map(|(k, _)| match cut {
            None => Some((*k, None)),
            Some(c) => k.1.minus(c).map(|rest| (*k, Some(rest))),
        })
        .collect();
    for (k, rest) in hit {
        let Some(h) = g.sparse.remove(&k) else { continue };
        let rest = rest.as_ref().map_or(&[][..], TilePieces::as_slice);
        if let Some(ph) = g.phys.get_mut(&h) {
            ph.map_refs = (ph.map_refs + rest.len() as u32).saturating_sub(1);
        }
        for piece in rest {
            g.sparse.insert((resource, *piece), h);
        }
        drop_if_unused(p, g, h);
    }
}

/// `cuMemMapArrayAsync`: every entry is checked before any takes effect.
pub fn map_array_async(list: *mut CUarrayMapInfo, count: u32, _stream: CUstream) -> R<()> {
    let p = cu()?;
    if list.is_null() || count == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut g = p.lock();
    let mut ops = Vec::with_capacity(count as usize);
    for i in 0..count as usize {
        let e = read_at(list as *const CUarrayMapInfo, i)?;
        let r = e.resource as u64;
        // A level of a mipmapped array is not a resource of its own.
        let (flags, view) = match e.resourceType {
            CU_RESOURCE_TYPE_ARRAY => g.arrays.get(&r).map(|d| (d.flags, d.view)),
            CU_RESOURCE_TYPE_MIPMAPPED_ARRAY => g.mipmaps.get(&r).map(|m| (m.0.flags, false)),
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let tiles = e.subresource.tiles(e.subresourceType).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if flags & CUDA_ARRAY3D_SPARSE == 0 || view || e.deviceBitMask.count_ones() != 1 || e.flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let handle = match e.memOperationType {
            CU_MEM_OPERATION_TYPE_MAP => {
                let ph = g.phys.get(&e.memHandle).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
                if e.memHandleType != CU_MEM_HANDLE_TYPE_GENERIC || ph.multicast || e.offset >= ph.size {
                    return Err(CUDA_ERROR_INVALID_VALUE);
                }
                Some(e.memHandle)
            }
            CU_MEM_OPERATION_TYPE_UNMAP if e.memHandle == 0 => None,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        };
        ops.push((r, tiles, handle));
    }
    for (r, tiles, handle) in ops {
        unmap_ranges(p, &mut g, r, Some(&tiles));
        if let Some(h) = handle {
            if let Some(ph) = g.phys.get_mut(&h) {
                ph.map_refs += 1;
            }
            g.sparse.insert((r, tiles), h);
        }
    }
    Ok(())
}

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
    let bytes = sparse_bytes(a.Flags, array_bytes(a.Width, a.Height, a.Depth, a.Format, a.NumChannels)?);
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
            unmap_ranges(p, &mut g, a as u64, None);
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
    let bytes = sparse_bytes(a.Flags, mipmap_bytes(a.Width, a.Height, a.Depth, a.Format, a.NumChannels, layered, levels)?);
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
    unmap_ranges(p, &mut g, m as u64, None);
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
