//! CUDA device ordinal → slice device index, by UUID.
//!
//! `egpu` sets `CUDA_VISIBLE_DEVICES` to the slice's UUIDs in slice order, so
//! ordinal `i` is normally slice device `i`; we never rely on that. The UUID
//! of each ordinal comes from the real `cuDeviceGetUuid_v2` and is matched
//! against the slice table. A visible device that is not in the slice (e.g.
//! `CUDA_VISIBLE_DEVICES` overridden inside the slice) fails closed: every
//! allocation on it is refused with `CUDA_ERROR_INVALID_DEVICE`.

use crate::cuda::drv::real;
use crate::util::say;
use egpu_cuda::{
    CU_MEM_LOCATION_TYPE_DEVICE, CU_MEM_LOCATION_TYPE_DEVICE_LOCALITY_DOMAIN, CU_MEM_LOCATION_TYPE_HOST, CU_MEM_LOCATION_TYPE_HOST_NUMA, CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT,
    CU_MEM_LOCATION_TYPE_NONE, CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_NOT_SUPPORTED, CUdevice, CUmemLocation, CUresult, CUuuid,
};
use std::sync::atomic::{AtomicI32, Ordering};

const MAX_ORDINALS: usize = 256;
/// 0 unknown; `k + 1` slice device `k`; -1 not in the slice.
static ORDINALS: [AtomicI32; MAX_ORDINALS] = [const { AtomicI32::new(0) }; MAX_ORDINALS];

/// NVML's text form of a CUDA UUID: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub fn format_uuid(u: &CUuuid) -> String {
    let b: Vec<u8> = u.bytes.iter().map(|&c| c as u8).collect();
    let h = |r: std::ops::Range<usize>| b[r].iter().map(|x| format!("{x:02x}")).collect::<String>();
    format!("GPU-{}-{}-{}-{}-{}", h(0..4), h(4..6), h(6..8), h(8..10), h(10..16))
}

/// UUID of a CUDA ordinal, from the real driver.
pub fn uuid_of(ordinal: CUdevice) -> Result<String, CUresult> {
    let mut u = CUuuid::default();
    let f = real::cuDeviceGetUuid_v2.get().or(real::cuDeviceGetUuid.get()).ok_or(CUDA_ERROR_NOT_SUPPORTED)?;
    // SAFETY: `u` is a valid CUuuid to write into; the ordinal is checked by the driver.
    let r = unsafe { f(&mut u, ordinal) };
    if r != 0 {
        return Err(r);
    }
    Ok(format_uuid(&u))
}

/// The slice device index of CUDA ordinal `ordinal`.
pub fn slice_dev(ordinal: CUdevice) -> Result<usize, CUresult> {
    let s = crate::state::slice()?;
    let cache = usize::try_from(ordinal).ok().and_then(|o| ORDINALS.get(o));
    if let Some(c) = cache {
        match c.load(Ordering::Relaxed) {
            0 => {}
            -1 => return Err(CUDA_ERROR_INVALID_DEVICE),
            k => return Ok(k as usize - 1),
        }
    }
    let uuid = uuid_of(ordinal)?;
    let found = s.uuids.iter().position(|u| u.eq_ignore_ascii_case(&uuid));
    if let Some(c) = cache {
        c.store(found.map_or(-1, |k| k as i32 + 1), Ordering::Relaxed);
    }
    match found {
        Some(k) => Ok(k),
        None => {
            say(&format!(
                "CUDA device {ordinal} ({uuid}) is not part of slice '{}' (devices: {}); allocations on it are refused. Do not override CUDA_VISIBLE_DEVICES inside a slice.",
                s.name,
                s.uuids.join(", ")
            ));
            Err(CUDA_ERROR_INVALID_DEVICE)
        }
    }
}

/// A CUDA ordinal of slice device `dev`, among those already matched by
/// [`slice_dev`] (every charge on a device went through it first).
pub fn ordinal_of(dev: usize) -> Option<CUdevice> {
    let k = i32::try_from(dev).ok()?.checked_add(1)?;
    ORDINALS.iter().position(|c| c.load(Ordering::Relaxed) == k).and_then(|o| CUdevice::try_from(o).ok())
}

/// Where memory at a `CUmemLocation` lives, for charging.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placed {
    /// On this slice device.
    Device(usize),
    /// Host memory (the host, a host NUMA node): never charged.
    Host,
    /// `CU_MEM_LOCATION_TYPE_NONE`: no location (a managed pool's "no
    /// preference"; refused elsewhere).
    Unspecified,
}

/// Where memory at `loc` lives: a device location (`DEVICE`, or CUDA 13.4's
/// `DEVICE_LOCALITY_DOMAIN`, part of one device's memory) on its slice
/// device; the host kinds on the host. A location type this hook does not
/// know (a newer driver's) is taken as device memory on the current device:
/// an unknown kind is charged, never free.
pub fn placed(loc: CUmemLocation) -> Result<Placed, CUresult> {
    match loc.type_ {
        CU_MEM_LOCATION_TYPE_DEVICE => slice_dev(loc.id).map(Placed::Device),
        CU_MEM_LOCATION_TYPE_DEVICE_LOCALITY_DOMAIN => slice_dev(loc.localized_device()).map(Placed::Device),
        CU_MEM_LOCATION_TYPE_HOST | CU_MEM_LOCATION_TYPE_HOST_NUMA | CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT => Ok(Placed::Host),
        CU_MEM_LOCATION_TYPE_NONE => Ok(Placed::Unspecified),
        _ => current().map(|(_, d)| Placed::Device(d)),
    }
}

/// The current context's device: (CUDA ordinal, slice device index).
pub fn current() -> Result<(CUdevice, usize), CUresult> {
    let f = real::cuCtxGetDevice.get().ok_or(CUDA_ERROR_NOT_SUPPORTED)?;
    let mut d: CUdevice = -1;
    // SAFETY: `d` is a valid CUdevice to write into.
    let r = unsafe { f(&mut d) };
    if r != 0 {
        return Err(r);
    }
    Ok((d, slice_dev(d)?))
}
