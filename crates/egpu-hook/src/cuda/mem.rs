//! Linear device memory: `cuMemAlloc_v2`, `cuMemAllocPitch_v2`,
//! `cuMemAllocManaged`, `cuMemFree_v2`.
//!
//! Order for every allocation: charge first (`try_charge`), then the real
//! allocator, then uncharge if it failed, so concurrent processes can never
//! push the slice's charged total past the limit, even transiently.

use super::sig;
use crate::detour::Outcome;
use crate::devmap;
use crate::ledger::{Charge, LEDGER, Ptr};
use crate::state::{charge, uncharge};
use egpu_cuda::{CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT, CUDA_ERROR_OUT_OF_MEMORY, CUcontext, CUdeviceptr};
use std::ffi::c_uint;

/// The current context (0 if none or unknown): the owner of what is
/// allocated now, freed by the driver when that context is destroyed.
pub(crate) fn current_ctx() -> usize {
    let Some(f) = super::drv::real::cuCtxGetCurrent.get() else { return 0 };
    let mut c: CUcontext = std::ptr::null_mut();
    // SAFETY: writes one pointer.
    if unsafe { f(&mut c) } == 0 { c as usize } else { 0 }
}

/// Charges `bytes` on the current device, runs `alloc`, records `*dptr`.
pub(crate) fn charged_alloc(dptr: *mut CUdeviceptr, bytes: u64, alloc: impl FnOnce() -> u32) -> Outcome {
    let (_, dev) = match devmap::current() {
        Ok(d) => d,
        Err(e) => return Outcome::Error(e),
    };
    let ctx = current_ctx();
    if let Err(e) = charge(dev, bytes) {
        return Outcome::Error(e);
    }
    let r = alloc();
    if r != 0 {
        uncharge(dev, bytes);
        return Outcome::Error(r);
    }
    // SAFETY: the real allocator succeeded, so it wrote the caller's `*dptr`.
    let p = unsafe { *dptr };
    LEDGER.lock().ptrs.insert(p, Ptr { charge: Charge { dev, bytes }, pool: 0, ctx });
    Outcome::Success
}

/// `cuMemAlloc_v2`: charged `bytesize` on the current context's device.
#[doc(alias = "cuMemAlloc_v2")]
pub(crate) fn alloc(real: sig::cuMemAlloc_v2, dptr: *mut CUdeviceptr, bytesize: usize) -> Outcome {
    // SAFETY: the real function with the caller's arguments.
    charged_alloc(dptr, bytesize as u64, || unsafe { real(dptr, bytesize) })
}

/// `cuMemAllocManaged`: charged in full to the current context's device,
/// wherever its pages later migrate (a managed allocation can be faulted
/// onto the device at any time, so it counts against the device limit).
#[doc(alias = "cuMemAllocManaged")]
pub(crate) fn alloc_managed(real: sig::cuMemAllocManaged, dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint) -> Outcome {
    // SAFETY: the real function with the caller's arguments.
    charged_alloc(dptr, bytesize as u64, || unsafe { real(dptr, bytesize, flags) })
}

/// Pitch the driver will choose at most: the width rounded up to the larger
/// of 512 bytes and the device's texture pitch alignment.
fn pitch_bound(width: usize) -> u64 {
    let mut align: i32 = 0;
    if let (Some(f), Ok((ord, _))) = (super::drv::real::cuDeviceGetAttribute.get(), devmap::current()) {
        // SAFETY: writes one int.
        let _ = unsafe { f(&mut align, CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT, ord) };
    }
    let a = (align.max(512)) as u64;
    (width as u64).div_ceil(a).saturating_mul(a)
}

/// `cuMemAllocPitch_v2`: charged pitch × height. The pitch is known only
/// after the call, so an upper bound is charged first and the difference
/// settled afterwards (refused, and freed, if the real pitch is larger still
/// and does not fit).
#[doc(alias = "cuMemAllocPitch_v2")]
pub(crate) fn alloc_pitch(real: sig::cuMemAllocPitch_v2, dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, elem: c_uint) -> Outcome {
    let (_, dev) = match devmap::current() {
        Ok(d) => d,
        Err(e) => return Outcome::Error(e),
    };
    let ctx = current_ctx();
    let bound = pitch_bound(width).saturating_mul(height as u64);
    if let Err(e) = charge(dev, bound) {
        return Outcome::Error(e);
    }
    // SAFETY: the real function with the caller's arguments.
    let r = unsafe { real(dptr, pitch, width, height, elem) };
    if r != 0 {
        uncharge(dev, bound);
        return Outcome::Error(r);
    }
    // SAFETY: on success the driver wrote both out-parameters.
    let (p, actual) = unsafe { (*dptr, (*pitch as u64).saturating_mul(height as u64)) };
    let mut bytes = bound;
    if actual > bound {
        if charge(dev, actual - bound).is_err() {
            if let Some(free) = super::hooked::cuMemFree_v2.get() {
                // SAFETY: frees the allocation we just made.
                unsafe { free(p) };
            }
            uncharge(dev, bound);
            return Outcome::Error(CUDA_ERROR_OUT_OF_MEMORY);
        }
        bytes = actual;
    } else if actual < bound {
        uncharge(dev, bound - actual);
        bytes = actual;
    }
    LEDGER.lock().ptrs.insert(p, Ptr { charge: Charge { dev, bytes }, pool: 0, ctx });
    Outcome::Success
}

/// `cuMemFree_v2`: uncharges what the allocation charged; a pointer from a
/// pool is settled through its pool's reserved size.
#[doc(alias = "cuMemFree_v2")]
pub(crate) fn free(real: sig::cuMemFree_v2, dptr: CUdeviceptr) -> Outcome {
    // The entry leaves the ledger before the real free: once the driver has
    // freed the address, another thread may be handed it again and record its
    // own allocation under it, which a later removal would then take instead.
    let entry = LEDGER.lock().ptrs.remove(&dptr);
    // SAFETY: the real function with the caller's argument.
    let r = unsafe { real(dptr) };
    if r != 0 {
        if let Some(e) = entry {
            LEDGER.lock().ptrs.insert(dptr, e);
        }
        return Outcome::Error(r);
    }
    if let Some(e) = entry {
        if e.pool != 0 {
            super::pool::freed(e.pool, e.charge.dev, e.charge.bytes);
        } else {
            crate::state::uncharge_freed(e.charge.dev, e.charge.bytes);
        }
    }
    Outcome::Success
}
