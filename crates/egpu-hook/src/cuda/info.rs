//! `cuMemGetInfo_v2` and `cuDeviceTotalMem_v2`: the slice's view.
//!
//! total = the slice's limit on that device (never more than the real
//! total); free = limit − slice usage, clamped at zero and never more than
//! the device really has free. These never fail for being over the limit
//! (a lowered limit leaves usage above it until the workload frees).

use super::sig;
use crate::detour::Outcome;
use crate::devmap;
use egpu_cuda::{CUDA_ERROR_INVALID_VALUE, CUdevice};

/// The slice's (free, total) view of slice device `dev`, given the real numbers.
pub fn view(dev: usize, real_free: u64, real_total: u64) -> Result<(u64, u64), u32> {
    let s = crate::state::slice()?;
    super::pool::release_unused();
    let limit = s.limit(dev);
    let used = s.used(dev);
    let total = limit.min(real_total);
    let free = limit.saturating_sub(used).min(real_free).min(total);
    Ok((free, total))
}

/// `cuMemGetInfo_v2`.
#[doc(alias = "cuMemGetInfo_v2")]
pub(crate) fn mem_get_info(real: sig::cuMemGetInfo_v2, free: *mut usize, total: *mut usize) -> Outcome {
    let (mut rf, mut rt) = (0usize, 0usize);
    // SAFETY: real call into our own locals.
    let r = unsafe { real(&mut rf, &mut rt) };
    if r != 0 {
        return Outcome::Error(r);
    }
    let (_, dev) = match devmap::current() {
        Ok(d) => d,
        Err(e) => return Outcome::Error(e),
    };
    match view(dev, rf as u64, rt as u64) {
        Ok((f, t)) => {
            // SAFETY: caller's out-parameters; the driver accepts either being null.
            unsafe {
                if !free.is_null() {
                    *free = f as usize;
                }
                if !total.is_null() {
                    *total = t as usize;
                }
            }
            Outcome::Success
        }
        Err(e) => Outcome::Error(e),
    }
}

/// `cuDeviceTotalMem_v2`: the slice's limit on that device.
#[doc(alias = "cuDeviceTotalMem_v2")]
pub(crate) fn device_total_mem(real: sig::cuDeviceTotalMem_v2, bytes: *mut usize, dev: CUdevice) -> Outcome {
    if bytes.is_null() {
        return Outcome::Error(CUDA_ERROR_INVALID_VALUE);
    }
    let mut rt = 0usize;
    // SAFETY: real call into our own local.
    let r = unsafe { real(&mut rt, dev) };
    if r != 0 {
        return Outcome::Error(r);
    }
    let sdev = match devmap::slice_dev(dev) {
        Ok(d) => d,
        Err(e) => return Outcome::Error(e),
    };
    let s = match crate::state::slice() {
        Ok(s) => s,
        Err(e) => return Outcome::Error(e),
    };
    // SAFETY: checked non-null; the caller's out-parameter.
    unsafe { *bytes = s.limit(sdev).min(rt as u64) as usize };
    Outcome::Success
}
