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
    static INIT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    // SAFETY: nvmlInit_v2 takes no arguments.
    let ok = *INIT.get_or_init(|| hooked::nvmlInit_v2.get().is_some_and(|f| unsafe { f() } == NVML_SUCCESS));
    if !ok {
        return None;
    }
    let h = view::real_handle(uuid).ok()?;
    let f = hooked::nvmlDeviceGetMemoryInfo.get()?;
    let mut m = nvmlMemory_t::default();
    // SAFETY: a real handle and a struct to fill.
    (unsafe { f(h, &mut m) } == NVML_SUCCESS).then_some(m.used)
}
