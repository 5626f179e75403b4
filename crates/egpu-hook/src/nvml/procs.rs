//! `nvmlDeviceGetComputeRunningProcesses(_v2/_v3)`: the slice's processes on
//! that device, from the usage records (pid as this process's pid namespace sees it, and
//! the memory charged to it there), never other tenants' processes.

use super::sig;
use crate::detour::Outcome;
use crate::state::slice_nvml;
use egpu_cuda::{NVML_ERROR_INSUFFICIENT_SIZE, NVML_ERROR_INVALID_ARGUMENT, nvmlDevice_t, nvmlProcessInfo_t, nvmlProcessInfo_v1_t};
use std::ffi::c_uint;

/// (pid, bytes charged) of live slice processes holding memory on slice device `i`.
fn slice_procs(i: usize) -> Result<Vec<(u32, u64)>, u32> {
    let s = slice_nvml()?;
    Ok(s.usage.processes().into_iter().filter(|p| p.charged.get(i).copied().unwrap_or(0) > 0).map(|p| (p.pid, p.charged[i])).collect())
}

fn write<T: Copy>(count: *mut c_uint, infos: *mut T, list: &[T]) -> Outcome {
    if count.is_null() {
        return Outcome::Error(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: checked non-null; the caller's in/out count.
    let cap = unsafe { *count } as usize;
    // SAFETY: as above.
    unsafe { *count = list.len() as c_uint };
    if list.len() > cap || (infos.is_null() && !list.is_empty()) {
        return Outcome::Error(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (k, v) in list.iter().enumerate() {
        // SAFETY: the caller's array has room for `cap` >= list.len() entries.
        unsafe { *infos.add(k) = *v };
    }
    Outcome::Success
}

fn run<T: Copy>(device: nvmlDevice_t, count: *mut c_uint, infos: *mut T, make: impl Fn(u32, u64) -> T) -> Outcome {
    let i = match super::view::slice_index(device) {
        Ok(Some(i)) => i,
        Ok(None) => return Outcome::Error(NVML_ERROR_INVALID_ARGUMENT),
        Err(e) => return Outcome::Error(e),
    };
    match slice_procs(i) {
        Ok(list) => write(count, infos, &list.into_iter().map(|(p, b)| make(p, b)).collect::<Vec<T>>()),
        Err(e) => Outcome::Error(e),
    }
}

/// `nvmlDeviceGetComputeRunningProcesses` (v1 struct).
#[doc(alias = "nvmlDeviceGetComputeRunningProcesses")]
pub(crate) fn running_v1(_real: sig::nvmlDeviceGetComputeRunningProcesses, device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_v1_t) -> Outcome {
    run(device, count, infos, |pid, used| nvmlProcessInfo_v1_t { pid, usedGpuMemory: used })
}

fn v2(pid: u32, used: u64) -> nvmlProcessInfo_t {
    nvmlProcessInfo_t { pid, usedGpuMemory: used, gpuInstanceId: u32::MAX, computeInstanceId: u32::MAX }
}

/// `nvmlDeviceGetComputeRunningProcesses_v2`.
#[doc(alias = "nvmlDeviceGetComputeRunningProcesses_v2")]
pub(crate) fn running_v2(_real: sig::nvmlDeviceGetComputeRunningProcesses_v2, device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_t) -> Outcome {
    run(device, count, infos, v2)
}

/// `nvmlDeviceGetComputeRunningProcesses_v3`.
#[doc(alias = "nvmlDeviceGetComputeRunningProcesses_v3")]
pub(crate) fn running_v3(_real: sig::nvmlDeviceGetComputeRunningProcesses_v3, device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_t) -> Outcome {
    run(device, count, infos, v2)
}
