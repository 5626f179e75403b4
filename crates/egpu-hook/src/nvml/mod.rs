//! Intercepted NVML entry points: the slice's view of devices, memory and
//! processes. NVLink, P2P, topology, fabric and field-value queries are not
//! intercepted, so NCCL sees the real answers; handles are the real NVML
//! handles, so those calls work on them unchanged.

pub mod procs;
pub mod view;

use egpu_cuda::*;
use std::ffi::{c_char, c_uint};

crate::detour::hooks! {
    runner: nvml; ret: nvmlReturn_t; lib: Nvml;
    fn nvmlInit_v2() => view::init;
    fn nvmlInit() => view::init;
    fn nvmlInitWithFlags(flags: c_uint) => view::init_with_flags;
    fn nvmlDeviceGetCount_v2(count: *mut c_uint) => view::count;
    fn nvmlDeviceGetCount(count: *mut c_uint) => view::count;
    fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, device: *mut nvmlDevice_t) => view::by_index;
    fn nvmlDeviceGetHandleByIndex(index: c_uint, device: *mut nvmlDevice_t) => view::by_index;
    fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, device: *mut nvmlDevice_t) => view::by_key;
    fn nvmlDeviceGetHandleByPciBusId_v2(bus: *const c_char, device: *mut nvmlDevice_t) => view::by_key;
    fn nvmlDeviceGetHandleByPciBusId(bus: *const c_char, device: *mut nvmlDevice_t) => view::by_key;
    fn nvmlDeviceGetHandleBySerial(serial: *const c_char, device: *mut nvmlDevice_t) => view::by_key;
    fn nvmlDeviceGetIndex(device: nvmlDevice_t, index: *mut c_uint) => view::index;
    fn nvmlDeviceGetMemoryInfo(device: nvmlDevice_t, memory: *mut nvmlMemory_t) => view::memory;
    fn nvmlDeviceGetMemoryInfo_v2(device: nvmlDevice_t, memory: *mut nvmlMemory_v2_t) => view::memory_v2;
    fn nvmlDeviceGetComputeRunningProcesses(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_v1_t) => procs::running_v1;
    fn nvmlDeviceGetComputeRunningProcesses_v2(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_t) => procs::running_v2;
    fn nvmlDeviceGetComputeRunningProcesses_v3(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_t) => procs::running_v3;
}

/// Device-wide used memory of the device with `uuid` from the real NVML (for
/// measuring context cost), initialising the real NVML once for the hook.
pub fn real_used(uuid: &str) -> Option<u64> {
    // Racing first calls may both initialise; NVML counts its inits.
    static INIT: once_cell::race::OnceBool = once_cell::race::OnceBool::new();
    // SAFETY: nvmlInit_v2 takes no arguments.
    let ok = INIT.get_or_init(|| hooked::nvmlInit_v2.get().is_some_and(|f| unsafe { f() } == NVML_SUCCESS));
    if !ok {
        return None;
    }
    let h = view::real_handle(uuid).ok()?;
    let f = hooked::nvmlDeviceGetMemoryInfo.get()?;
    let mut m = nvmlMemory_t::default();
    // SAFETY: a real handle and a struct to fill.
    (unsafe { f(h, &mut m) } == NVML_SUCCESS).then_some(m.used)
}

/// Memory the real NVML charges to this process on the device with `uuid`
/// (0 when the process is not listed yet). Unlike [`real_used`], other
/// tenants' concurrent allocations do not show in it. `None` when NVML cannot
/// answer; in another pid namespace the process is never listed, so callers
/// treat a zero change as "unknown" too.
pub fn real_own_used(uuid: &str) -> Option<u64> {
    real_used(uuid)?; // initialises the real NVML once
    let h = view::real_handle(uuid).ok()?;
    let f = hooked::nvmlDeviceGetComputeRunningProcesses_v3.get()?;
    let mut buf = vec![nvmlProcessInfo_t { pid: 0, usedGpuMemory: 0, gpuInstanceId: 0, computeInstanceId: 0 }; 64];
    loop {
        let mut n = buf.len() as c_uint;
        // SAFETY: a real handle, and a buffer of n entries that the call fills.
        match unsafe { f(h, &mut n, buf.as_mut_ptr()) } {
            NVML_SUCCESS => {
                let me = std::process::id();
                return Some(buf[..n as usize].iter().filter(|p| p.pid == me).map(|p| p.usedGpuMemory).sum());
            }
            NVML_ERROR_INSUFFICIENT_SIZE if (n as usize) > buf.len() && n < 1 << 16 => buf.resize(n as usize, buf[0]),
            _ => return None,
        }
    }
}
