//! CUDA arrays and mipmapped arrays: charged the bytes their descriptor
//! describes (width × height × depth × channel bytes × channels; a
//! mipmapped array the sum of its levels), on the current context's device.
//!
//! - Unknown or block-compressed formats are charged 16 bytes per element
//!   (the largest plain element), so they are never under-charged.
//! - `CUDA_ARRAY3D_SPARSE` arrays have no backing memory at creation (it is
//!   mapped later from `cuMemCreate` handles, which are charged there), so
//!   they are charged nothing; their mappings keep those handles charged
//!   (`sparse`).

use super::sig;
use crate::detour::Outcome;
use crate::devmap;
use crate::ledger::{Charge, LEDGER, Owned};
use crate::state::{charge, uncharge};
use egpu_cuda::{CUDA_ARRAY_DESCRIPTOR, CUDA_ARRAY3D_DESCRIPTOR, CUDA_ARRAY3D_CUBEMAP, CUDA_ARRAY3D_LAYERED, CUDA_ARRAY3D_SPARSE, CU_AD_FORMAT_NV12, CUDA_ERROR_INVALID_VALUE, CUarray, CUmipmappedArray, array_format_bytes};
use std::ffi::c_uint;

/// Bytes of one element of `format` with `channels` channels.
pub fn element_bytes(format: c_uint, channels: c_uint) -> u64 {
    match array_format_bytes(format) {
        Some(b) => b as u64 * channels.max(1) as u64,
        None => 16,
    }
}

/// Bytes of one level of the given extent (zero height/depth mean 1).
pub fn level_bytes(w: u64, h: u64, d: u64, format: c_uint, channels: c_uint) -> u64 {
    let rows = if format == CU_AD_FORMAT_NV12 { h.max(1).saturating_mul(3).div_ceil(2) } else { h.max(1) };
    w.saturating_mul(rows).saturating_mul(d.max(1)).saturating_mul(element_bytes(format, channels))
}

/// Bytes of a 3D (or layered / cubemap) array.
pub fn array3d_bytes(d: &CUDA_ARRAY3D_DESCRIPTOR) -> u64 {
    if d.Flags & CUDA_ARRAY3D_SPARSE != 0 {
        return 0;
    }
    // A cubemap has 6 faces (Depth must be 6, or 6 × layers when layered).
    let depth = if d.Flags & CUDA_ARRAY3D_CUBEMAP != 0 && d.Flags & CUDA_ARRAY3D_LAYERED == 0 { 6 } else { d.Depth as u64 };
    level_bytes(d.Width as u64, d.Height as u64, depth, d.Format, d.NumChannels)
}

/// Bytes of a mipmapped array: each level halves width, height and (unless
/// layered or a cubemap, whose depth counts layers/faces) depth, down to 1.
pub fn mipmapped_bytes(d: &CUDA_ARRAY3D_DESCRIPTOR, levels: c_uint) -> u64 {
    if d.Flags & CUDA_ARRAY3D_SPARSE != 0 {
        return 0;
    }
    let layered = d.Flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP) != 0;
    let mut total = 0u64;
    for l in 0..levels.clamp(1, 64) {
        let shrink = |x: usize| if x == 0 { 0 } else { ((x as u64) >> l).max(1) };
        let depth = if layered { array3d_depth(d) } else { shrink(d.Depth) };
        total = total.saturating_add(level_bytes(shrink(d.Width), shrink(d.Height), depth, d.Format, d.NumChannels));
    }
    total
}

fn array3d_depth(d: &CUDA_ARRAY3D_DESCRIPTOR) -> u64 {
    if d.Flags & CUDA_ARRAY3D_CUBEMAP != 0 && d.Flags & CUDA_ARRAY3D_LAYERED == 0 { 6 } else { d.Depth as u64 }
}

fn charged_handle(handle: *mut usize, bytes: u64, create: impl FnOnce() -> u32) -> Outcome {
    let (_, dev) = match devmap::current() {
        Ok(d) => d,
        Err(e) => return Outcome::Error(e),
    };
    let ctx = super::mem::current_ctx();
    if let Err(e) = charge(dev, bytes) {
        return Outcome::Error(e);
    }
    let r = create();
    if r != 0 {
        uncharge(dev, bytes);
        return Outcome::Error(r);
    }
    // SAFETY: on success the driver wrote the handle.
    let h = unsafe { *handle };
    LEDGER.lock().arrays.insert(h, Owned { charge: Charge { dev, bytes }, ctx });
    Outcome::Success
}

fn read<T: Copy>(p: *const T) -> Option<T> {
    // SAFETY: the caller's descriptor, read once (null checked).
    if p.is_null() { None } else { Some(unsafe { *p }) }
}

/// `cuArrayCreate_v2`.
#[doc(alias = "cuArrayCreate_v2")]
pub(crate) fn create(real: sig::cuArrayCreate_v2, handle: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR) -> Outcome {
    let Some(d) = read(desc) else { return Outcome::Error(CUDA_ERROR_INVALID_VALUE) };
    let bytes = level_bytes(d.Width as u64, d.Height as u64, 1, d.Format, d.NumChannels);
    // SAFETY: the real function with the caller's arguments.
    charged_handle(handle.cast(), bytes, || unsafe { real(handle, desc) })
}

/// `cuArray3DCreate_v2`.
#[doc(alias = "cuArray3DCreate_v2")]
pub(crate) fn create_3d(real: sig::cuArray3DCreate_v2, handle: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR) -> Outcome {
    let Some(d) = read(desc) else { return Outcome::Error(CUDA_ERROR_INVALID_VALUE) };
    // SAFETY: the real function with the caller's arguments.
    charged_handle(handle.cast(), array3d_bytes(&d), || unsafe { real(handle, desc) })
}

/// `cuMipmappedArrayCreate`.
#[doc(alias = "cuMipmappedArrayCreate")]
pub(crate) fn create_mipmapped(real: sig::cuMipmappedArrayCreate, handle: *mut CUmipmappedArray, desc: *const CUDA_ARRAY3D_DESCRIPTOR, levels: c_uint) -> Outcome {
    let Some(d) = read(desc) else { return Outcome::Error(CUDA_ERROR_INVALID_VALUE) };
    // SAFETY: the real function with the caller's arguments.
    charged_handle(handle.cast(), mipmapped_bytes(&d, levels), || unsafe { real(handle, desc, levels) })
}

/// Runs the real destroy of handle `h`, then uncharges it. The entry leaves
/// the ledger first: once destroyed, the handle value may be reused by another
/// thread's creation before we would remove it.
fn destroyed(h: usize, destroy: impl FnOnce() -> u32) -> Outcome {
    let entry = LEDGER.lock().arrays.remove(&h);
    let r = destroy();
    match entry {
        Some(c) if r == 0 => crate::state::uncharge_freed(c.charge.dev, c.charge.bytes),
        Some(c) => {
            LEDGER.lock().arrays.insert(h, c);
        }
        None => {}
    }
    if r == 0 {
        // A sparse array's mapped tiles go with it.
        super::sparse::destroyed([h]);
    }
    Outcome::from_code(r)
}

/// `cuArrayDestroy`.
#[doc(alias = "cuArrayDestroy")]
pub(crate) fn destroy(real: sig::cuArrayDestroy, handle: CUarray) -> Outcome {
    // SAFETY: the real function with the caller's argument.
    destroyed(handle as usize, || unsafe { real(handle) })
}

/// `cuMipmappedArrayDestroy`.
#[doc(alias = "cuMipmappedArrayDestroy")]
pub(crate) fn destroy_mipmapped(real: sig::cuMipmappedArrayDestroy, handle: CUmipmappedArray) -> Outcome {
    // SAFETY: the real function with the caller's argument.
    destroyed(handle as usize, || unsafe { real(handle) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use egpu_cuda::{CU_AD_FORMAT_FLOAT, CU_AD_FORMAT_UNSIGNED_INT8};

    fn d3(w: usize, h: usize, d: usize, flags: c_uint) -> CUDA_ARRAY3D_DESCRIPTOR {
        CUDA_ARRAY3D_DESCRIPTOR { Width: w, Height: h, Depth: d, Format: CU_AD_FORMAT_FLOAT, NumChannels: 4, Flags: flags }
    }

    #[test]
    fn sizes() {
        assert_eq!(level_bytes(1024, 0, 0, CU_AD_FORMAT_UNSIGNED_INT8, 1), 1024);
        assert_eq!(level_bytes(100, 10, 1, CU_AD_FORMAT_FLOAT, 2), 8000);
        assert_eq!(level_bytes(16, 16, 1, 0x7777, 1), 16 * 16 * 16);
        assert_eq!(array3d_bytes(&d3(64, 64, 4, 0)), 64 * 64 * 4 * 16);
        assert_eq!(array3d_bytes(&d3(64, 64, 6, CUDA_ARRAY3D_CUBEMAP)), 64 * 64 * 6 * 16);
        assert_eq!(array3d_bytes(&d3(64, 64, 4, CUDA_ARRAY3D_SPARSE)), 0);
        // 8x8 -> 4x4 -> 2x2 -> 1x1
        assert_eq!(mipmapped_bytes(&d3(8, 8, 0, 0), 4), (64 + 16 + 4 + 1) * 16);
        // layered: the layer count stays.
        assert_eq!(mipmapped_bytes(&d3(8, 8, 3, CUDA_ARRAY3D_LAYERED), 2), (64 + 16) * 3 * 16);
        assert_eq!(level_bytes(usize::MAX as u64, 2, 1, CU_AD_FORMAT_FLOAT, 4), u64::MAX);
    }
}
