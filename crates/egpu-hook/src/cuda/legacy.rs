//! Legacy v1 entry points (32-bit `CUdeviceptr`, `unsigned int` sizes) that
//! real drivers still export. Allocations through them are refused with
//! `CUDA_ERROR_NOT_SUPPORTED` (no toolkit since CUDA 3.2 emits them, and
//! passing them through would escape the limit); the v1 queries get the
//! slice view, clamped to 32 bits.

use super::sig;
use crate::detour::Outcome;
use crate::util::say_once;
use egpu_cuda::{CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_SUPPORTED, CUdevice, CUarray};
use std::ffi::{c_uint, c_void};
use std::sync::atomic::AtomicBool;

static SAID: AtomicBool = AtomicBool::new(false);

fn refuse(name: &str) -> Outcome {
    say_once(&SAID, || format!("{name} (a pre-CUDA-3.2 32-bit entry point) is not supported under eGPU; rebuild against a current cuda.h"));
    Outcome::Error(CUDA_ERROR_NOT_SUPPORTED)
}

#[doc(alias = "cuMemAlloc")]
pub(crate) fn refuse_alloc(_real: sig::cuMemAlloc, _dptr: *mut c_uint, _bytes: c_uint) -> Outcome {
    refuse("cuMemAlloc")
}

#[doc(alias = "cuMemAllocPitch")]
pub(crate) fn refuse_alloc_pitch(_real: sig::cuMemAllocPitch, _d: *mut c_uint, _p: *mut c_uint, _w: c_uint, _h: c_uint, _e: c_uint) -> Outcome {
    refuse("cuMemAllocPitch")
}

#[doc(alias = "cuArrayCreate")]
pub(crate) fn refuse_array(_real: unsafe extern "C" fn(*mut CUarray, *const c_void) -> u32, _h: *mut CUarray, _d: *const c_void) -> Outcome {
    refuse("cuArrayCreate/cuArray3DCreate (v1)")
}

/// `cuMemGetInfo` (v1): the slice view clamped to `unsigned int`.
#[doc(alias = "cuMemGetInfo")]
pub(crate) fn mem_get_info(_real: sig::cuMemGetInfo, free: *mut c_uint, total: *mut c_uint) -> Outcome {
    let Some(f) = super::hooked::cuMemGetInfo_v2.get() else {
        return Outcome::Error(CUDA_ERROR_NOT_SUPPORTED);
    };
    let (mut fr, mut tt) = (0usize, 0usize);
    let r = super::info::mem_get_info(f, &mut fr, &mut tt);
    if r == Outcome::Success {
        // SAFETY: the caller's out-parameters (null allowed).
        unsafe {
            if !free.is_null() {
                *free = fr.min(u32::MAX as usize) as c_uint;
            }
            if !total.is_null() {
                *total = tt.min(u32::MAX as usize) as c_uint;
            }
        }
    }
    r
}

/// `cuDeviceTotalMem` (v1): the slice limit clamped to `unsigned int`.
#[doc(alias = "cuDeviceTotalMem")]
pub(crate) fn device_total_mem(_real: sig::cuDeviceTotalMem, bytes: *mut c_uint, dev: CUdevice) -> Outcome {
    let Some(f) = super::hooked::cuDeviceTotalMem_v2.get() else {
        return Outcome::Error(CUDA_ERROR_NOT_SUPPORTED);
    };
    if bytes.is_null() {
        return Outcome::Error(CUDA_ERROR_INVALID_VALUE);
    }
    let mut t = 0usize;
    let r = super::info::device_total_mem(f, &mut t, dev);
    if r == Outcome::Success {
        // SAFETY: checked non-null; the caller's out-parameter.
        unsafe { *bytes = t.min(u32::MAX as usize) as c_uint };
    }
    r
}
