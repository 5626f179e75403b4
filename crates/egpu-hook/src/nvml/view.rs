//! The slice's device view in NVML: only slice devices exist, numbered in
//! slice order (the same order as CUDA ordinals under the slice's
//! `CUDA_VISIBLE_DEVICES`), and their memory is the slice's.

use super::{hooked, sig};
use crate::detour::Outcome;
use crate::state::slice_nvml;
use crate::util::cstr;
use egpu_cuda::{NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_NOT_FOUND, NVML_ERROR_FUNCTION_NOT_FOUND, NVML_SUCCESS, nvmlDevice_t, nvmlMemory_t, nvmlMemory_v2_t, nvmlReturn_t};
use std::ffi::{CString, c_char, c_uint};

/// The real NVML handle of the device with `uuid`.
pub fn real_handle(uuid: &str) -> Result<nvmlDevice_t, nvmlReturn_t> {
    let f = hooked::nvmlDeviceGetHandleByUUID.get().ok_or(NVML_ERROR_FUNCTION_NOT_FOUND)?;
    let c = CString::new(uuid).map_err(|_| NVML_ERROR_INVALID_ARGUMENT)?;
    let mut h: nvmlDevice_t = std::ptr::null_mut();
    // SAFETY: a C string and a handle to write.
    let r = unsafe { f(c.as_ptr(), &mut h) };
    if r == NVML_SUCCESS { Ok(h) } else { Err(r) }
}

/// The slice index of a real handle, if it is a slice device.
pub fn slice_index(h: nvmlDevice_t) -> Result<Option<usize>, nvmlReturn_t> {
    let s = slice_nvml()?;
    for (i, u) in s.uuids.iter().enumerate() {
        if real_handle(u)? == h {
            return Ok(Some(i));
        }
    }
    Ok(None)
}

fn gate() -> Outcome {
    match slice_nvml() {
        Ok(_) => Outcome::Passthrough,
        Err(e) => Outcome::Error(e),
    }
}

/// `nvmlInit_v2` / `nvmlInit`: refused when the slice table is unusable.
#[doc(alias = "nvmlInit_v2")]
pub(crate) fn init(_real: sig::nvmlInit_v2) -> Outcome {
    gate()
}

/// `nvmlInitWithFlags`.
#[doc(alias = "nvmlInitWithFlags")]
pub(crate) fn init_with_flags(_real: sig::nvmlInitWithFlags, _flags: c_uint) -> Outcome {
    gate()
}

/// `nvmlDeviceGetCount_v2` / v1: the slice's device count.
#[doc(alias = "nvmlDeviceGetCount_v2")]
pub(crate) fn count(real: sig::nvmlDeviceGetCount_v2, count: *mut c_uint) -> Outcome {
    let s = match slice_nvml() {
        Ok(s) => s,
        Err(e) => return Outcome::Error(e),
    };
    if count.is_null() {
        return Outcome::Error(NVML_ERROR_INVALID_ARGUMENT);
    }
    let mut n: c_uint = 0;
    // SAFETY: the real call (it also reports "uninitialised") into a local.
    let r = unsafe { real(&mut n) };
    if r != NVML_SUCCESS {
        return Outcome::Error(r);
    }
    // SAFETY: checked non-null; the caller's out-parameter.
    unsafe { *count = s.uuids.len() as c_uint };
    Outcome::Success
}

/// `nvmlDeviceGetHandleByIndex_v2` / v1: index = slice device index.
#[doc(alias = "nvmlDeviceGetHandleByIndex_v2")]
pub(crate) fn by_index(_real: sig::nvmlDeviceGetHandleByIndex_v2, index: c_uint, device: *mut nvmlDevice_t) -> Outcome {
    let s = match slice_nvml() {
        Ok(s) => s,
        Err(e) => return Outcome::Error(e),
    };
    if device.is_null() {
        return Outcome::Error(NVML_ERROR_INVALID_ARGUMENT);
    }
    let Some(u) = s.uuids.get(index as usize) else { return Outcome::Error(NVML_ERROR_INVALID_ARGUMENT) };
    match real_handle(u) {
        Ok(h) => {
            // SAFETY: checked non-null; the caller's out-parameter.
            unsafe { *device = h };
            Outcome::Success
        }
        Err(e) => Outcome::Error(e),
    }
}

/// `nvmlDeviceGetHandleByUUID` / `ByPciBusId(_v2)` / `BySerial`: devices
/// outside the slice are not found.
#[doc(alias = "nvmlDeviceGetHandleByUUID")]
pub(crate) fn by_key(real: sig::nvmlDeviceGetHandleByUUID, key: *const c_char, device: *mut nvmlDevice_t) -> Outcome {
    if let Err(e) = slice_nvml() {
        return Outcome::Error(e);
    }
    let mut h: nvmlDevice_t = std::ptr::null_mut();
    // SAFETY: the real call with the caller's key, into a local.
    let r = unsafe { real(key, &mut h) };
    if r != NVML_SUCCESS {
        return Outcome::Error(r);
    }
    match slice_index(h) {
        Ok(Some(_)) if !device.is_null() => {
            // SAFETY: checked non-null; the caller's out-parameter.
            unsafe { *device = h };
            Outcome::Success
        }
        Ok(Some(_)) => Outcome::Error(NVML_ERROR_INVALID_ARGUMENT),
        Ok(None) => {
            crate::util::debug!("NVML lookup of {:?}: not a slice device", cstr(key));
            Outcome::Error(NVML_ERROR_NOT_FOUND)
        }
        Err(e) => Outcome::Error(e),
    }
}

/// `nvmlDeviceGetIndex`: the slice index (consistent with CUDA ordinals).
#[doc(alias = "nvmlDeviceGetIndex")]
pub(crate) fn index(_real: sig::nvmlDeviceGetIndex, device: nvmlDevice_t, index: *mut c_uint) -> Outcome {
    if index.is_null() {
        return Outcome::Error(NVML_ERROR_INVALID_ARGUMENT);
    }
    match slice_index(device) {
        Ok(Some(i)) => {
            // SAFETY: checked non-null; the caller's out-parameter.
            unsafe { *index = i as c_uint };
            Outcome::Success
        }
        Ok(None) => Outcome::Error(NVML_ERROR_NOT_FOUND),
        Err(e) => Outcome::Error(e),
    }
}

/// (total, used, free) the slice sees on its device `i`, given the real ones.
fn slice_memory(i: usize, real_total: u64, real_free: u64) -> Result<(u64, u64, u64), nvmlReturn_t> {
    let s = slice_nvml()?;
    let total = s.limit(i).min(real_total);
    let used = s.used(i);
    let free = total.saturating_sub(used).min(real_free);
    Ok((total, used.min(total), free))
}

/// `nvmlDeviceGetMemoryInfo`: total = limit, used = slice usage, free = the rest.
#[doc(alias = "nvmlDeviceGetMemoryInfo")]
pub(crate) fn memory(real: sig::nvmlDeviceGetMemoryInfo, device: nvmlDevice_t, memory: *mut nvmlMemory_t) -> Outcome {
    let Some(i) = (match slice_index(device) {
        Ok(i) => i,
        Err(e) => return Outcome::Error(e),
    }) else {
        return Outcome::Passthrough;
    };
    let mut m = nvmlMemory_t::default();
    // SAFETY: real call into a local.
    let r = unsafe { real(device, &mut m) };
    if r != NVML_SUCCESS {
        return Outcome::Error(r);
    }
    if memory.is_null() {
        return Outcome::Error(NVML_ERROR_INVALID_ARGUMENT);
    }
    match slice_memory(i, m.total, m.free) {
        Ok((total, used, free)) => {
            // SAFETY: checked non-null; the caller's struct.
            unsafe { *memory = nvmlMemory_t { total, free, used } };
            Outcome::Success
        }
        Err(e) => Outcome::Error(e),
    }
}

/// `nvmlDeviceGetMemoryInfo_v2`: as v1; `reserved` is reported as 0.
#[doc(alias = "nvmlDeviceGetMemoryInfo_v2")]
pub(crate) fn memory_v2(real: sig::nvmlDeviceGetMemoryInfo_v2, device: nvmlDevice_t, memory: *mut nvmlMemory_v2_t) -> Outcome {
    let Some(i) = (match slice_index(device) {
        Ok(i) => i,
        Err(e) => return Outcome::Error(e),
    }) else {
        return Outcome::Passthrough;
    };
    if memory.is_null() {
        return Outcome::Error(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: the caller's struct; its `version` is an input the real call checks.
    let mut m = nvmlMemory_v2_t { version: unsafe { (*memory).version }, ..Default::default() };
    // SAFETY: real call into a local.
    let r = unsafe { real(device, &mut m) };
    if r != NVML_SUCCESS {
        return Outcome::Error(r);
    }
    match slice_memory(i, m.total, m.free) {
        Ok((total, used, free)) => {
            // SAFETY: checked non-null; the caller's struct.
            unsafe { *memory = nvmlMemory_v2_t { version: m.version, total, reserved: 0, free, used } };
            Outcome::Success
        }
        Err(e) => Outcome::Error(e),
    }
}
