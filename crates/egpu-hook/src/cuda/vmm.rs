//! Virtual memory management (`cuMemCreate` and friends) and multicast.
//!
//! - `cuMemCreate` with a device location is charged its size on that
//!   device; host-located (`HOST`, `HOST_NUMA*`) handles are never charged.
//! - The physical memory lives until the handle is released *and* unmapped
//!   everywhere, so the charge is refcounted: 1 for the handle, +1 per
//!   `cuMemMap`, +1 per `cuMemRetainAllocationHandle`; `cuMemRelease` and
//!   `cuMemUnmap` drop references and the last one uncharges.
//! - Imported handles (`cuMemImportFromShareableHandle`) and handles retained
//!   from memory this process did not create are never charged to it.
//! - `cuMulticastCreate` is charged its size on the current context's device
//!   and uncharged when its handle is released (a conservative choice: the
//!   physical memory bound to it is charged where it was created as well).

use super::sig;
use crate::detour::Outcome;
use crate::devmap;
use crate::ledger::{Charge, LEDGER, Physical};
use crate::state::{charge, uncharge};
use egpu_cuda::{CU_MEM_LOCATION_TYPE_DEVICE, CUDA_ERROR_INVALID_VALUE, CUdeviceptr, CUmemAllocationProp, CUmemGenericAllocationHandle, CUmulticastObjectProp};
use std::ffi::c_void;

fn created(handle: *mut CUmemGenericAllocationHandle, c: Charge, create: impl FnOnce() -> u32) -> Outcome {
    if let Err(e) = charge(c.dev, c.bytes) {
        return Outcome::Error(e);
    }
    let r = create();
    if r != 0 {
        uncharge(c.dev, c.bytes);
        return Outcome::Error(r);
    }
    // SAFETY: on success the driver wrote the handle.
    let h = unsafe { *handle };
    LEDGER.lock().physical.insert(h, Physical { charge: c, refs: 1 });
    Outcome::Success
}

/// `cuMemCreate`.
#[doc(alias = "cuMemCreate")]
pub(crate) fn create(real: sig::cuMemCreate, handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationProp, flags: u64) -> Outcome {
    if prop.is_null() || handle.is_null() {
        return Outcome::Error(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller's property struct (null checked), read once.
    let loc = unsafe { (*prop).location };
    if loc.type_ != CU_MEM_LOCATION_TYPE_DEVICE {
        return Outcome::Passthrough; // host memory: never charged
    }
    let dev = match devmap::slice_dev(loc.id) {
        Ok(d) => d,
        Err(e) => return Outcome::Error(e),
    };
    // SAFETY: the real function with the caller's arguments.
    created(handle, Charge { dev, bytes: size as u64 }, || unsafe { real(handle, size, prop, flags) })
}

/// `cuMulticastCreate`.
#[doc(alias = "cuMulticastCreate")]
pub(crate) fn multicast_create(real: sig::cuMulticastCreate, handle: *mut CUmemGenericAllocationHandle, prop: *const CUmulticastObjectProp) -> Outcome {
    if prop.is_null() || handle.is_null() {
        return Outcome::Error(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller's property struct (null checked), read once.
    let size = unsafe { (*prop).size } as u64;
    let dev = match devmap::current() {
        Ok((_, d)) => d,
        Err(e) => return Outcome::Error(e),
    };
    // SAFETY: the real function with the caller's arguments.
    created(handle, Charge { dev, bytes: size }, || unsafe { real(handle, prop) })
}

/// Drops one reference to `h`; the last one uncharges.
fn unref(h: CUmemGenericAllocationHandle) {
    let done = {
        let mut l = LEDGER.lock();
        match l.physical.get_mut(&h) {
            Some(p) if p.refs > 1 => {
                p.refs -= 1;
                None
            }
            Some(_) => l.physical.remove(&h).map(|p| p.charge),
            None => None,
        }
    };
    if let Some(c) = done {
        uncharge(c.dev, c.bytes);
    }
}

/// `cuMemRelease`.
#[doc(alias = "cuMemRelease")]
pub(crate) fn release(real: sig::cuMemRelease, handle: CUmemGenericAllocationHandle) -> Outcome {
    // SAFETY: the real function with the caller's argument.
    let r = unsafe { real(handle) };
    if r == 0 {
        unref(handle);
    }
    Outcome::from_code(r)
}

/// `cuMemMap`: a mapping keeps the physical memory alive.
#[doc(alias = "cuMemMap")]
pub(crate) fn map(real: sig::cuMemMap, ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: u64) -> Outcome {
    // SAFETY: the real function with the caller's arguments.
    let r = unsafe { real(ptr, size, offset, handle, flags) };
    if r == 0 {
        let mut l = LEDGER.lock();
        if let Some(p) = l.physical.get_mut(&handle) {
            p.refs += 1;
            l.mappings.insert(ptr, (size as u64, handle));
        }
    }
    Outcome::from_code(r)
}

/// `cuMemUnmap`: drops the references of every mapping in the range.
#[doc(alias = "cuMemUnmap")]
pub(crate) fn unmap(real: sig::cuMemUnmap, ptr: CUdeviceptr, size: usize) -> Outcome {
    // SAFETY: the real function with the caller's arguments.
    let r = unsafe { real(ptr, size) };
    if r == 0 {
        let end = ptr.saturating_add(size as u64);
        let gone: Vec<u64> = {
            let mut l = LEDGER.lock();
            let keys: Vec<u64> = l.mappings.range(ptr..end).map(|(k, _)| *k).collect();
            keys.iter().filter_map(|k| l.mappings.remove(k)).map(|(_, h)| h).collect()
        };
        for h in gone {
            unref(h);
        }
    }
    Outcome::from_code(r)
}

/// `cuMemRetainAllocationHandle`: never a new charge; a reference to a
/// handle this process created keeps it alive until released.
#[doc(alias = "cuMemRetainAllocationHandle")]
pub(crate) fn retain(real: sig::cuMemRetainAllocationHandle, handle: *mut CUmemGenericAllocationHandle, addr: *mut c_void) -> Outcome {
    // SAFETY: the real function with the caller's arguments.
    let r = unsafe { real(handle, addr) };
    if r == 0 && !handle.is_null() {
        // SAFETY: on success the driver wrote the handle.
        let h = unsafe { *handle };
        if let Some(p) = LEDGER.lock().physical.get_mut(&h) {
            p.refs += 1;
        }
    }
    Outcome::from_code(r)
}
