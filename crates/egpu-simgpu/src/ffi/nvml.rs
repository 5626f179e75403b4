//! NVML exports (`nvml*`).

use crate::nvml as n;
use egpu_cuda::*;
use std::ffi::c_char;

type P<T> = *mut T;
type Pc<T> = *const T;
type D = nvmlDevice_t;

nvml_exports! {
    nvmlInit() => n::init(0);
    nvmlInit_v2() => n::init(0);
    nvmlInitWithFlags(f: u32) => n::init(f);
    nvmlShutdown() => n::shutdown();
    nvmlSystemGetDriverVersion(b: P<c_char>, l: u32) => n::driver_version(b, l);
    nvmlSystemGetNVMLVersion(b: P<c_char>, l: u32) => n::nvml_version(b, l);
    nvmlSystemGetCudaDriverVersion(v: P<i32>) => n::cuda_driver_version(v);
    nvmlSystemGetCudaDriverVersion_v2(v: P<i32>) => n::cuda_driver_version(v);
    nvmlDeviceGetCount(c: P<u32>) => n::count(c);
    nvmlDeviceGetCount_v2(c: P<u32>) => n::count(c);
    nvmlDeviceGetHandleByIndex(i: u32, d: P<D>) => n::by_index(i, d);
    nvmlDeviceGetHandleByIndex_v2(i: u32, d: P<D>) => n::by_index(i, d);
    nvmlDeviceGetHandleByUUID(u: Pc<c_char>, d: P<D>) => n::by_uuid(u, d);
    nvmlDeviceGetHandleByPciBusId(b: Pc<c_char>, d: P<D>) => n::by_pci_bus_id(b, d);
    nvmlDeviceGetHandleByPciBusId_v2(b: Pc<c_char>, d: P<D>) => n::by_pci_bus_id(b, d);
    nvmlDeviceGetIndex(d: D, i: P<u32>) => n::index(d, i);
    nvmlDeviceGetName(d: D, b: P<c_char>, l: u32) => n::name(d, b, l);
    nvmlDeviceGetUUID(d: D, b: P<c_char>, l: u32) => n::uuid(d, b, l);
    nvmlDeviceGetSerial(d: D, b: P<c_char>, l: u32) => n::serial(d, b, l);
    nvmlDeviceGetMemoryInfo(d: D, m: P<nvmlMemory_t>) => n::memory_info(d, m);
    nvmlDeviceGetMemoryInfo_v2(d: D, m: P<nvmlMemory_v2_t>) => n::memory_info_v2(d, m);
    nvmlDeviceGetPciInfo(d: D, p: P<nvmlPciInfo_t>) => n::pci_info(d, p);
    nvmlDeviceGetPciInfo_v2(d: D, p: P<nvmlPciInfo_t>) => n::pci_info(d, p);
    nvmlDeviceGetPciInfo_v3(d: D, p: P<nvmlPciInfo_t>) => n::pci_info(d, p);
    nvmlDeviceGetMinorNumber(d: D, m: P<u32>) => n::minor_number(d, m);
    nvmlDeviceGetCudaComputeCapability(d: D, ma: P<i32>, mi: P<i32>) => n::compute_capability(d, ma, mi);
    nvmlDeviceGetComputeRunningProcesses(d: D, c: P<u32>, i: P<nvmlProcessInfo_v1_t>) => n::compute_processes(d, c, i as P<u8>, true, false);
    nvmlDeviceGetComputeRunningProcesses_v2(d: D, c: P<u32>, i: P<nvmlProcessInfo_t>) => n::compute_processes(d, c, i as P<u8>, false, false);
    nvmlDeviceGetComputeRunningProcesses_v3(d: D, c: P<u32>, i: P<nvmlProcessInfo_t>) => n::compute_processes(d, c, i as P<u8>, false, false);
    nvmlDeviceGetGraphicsRunningProcesses(d: D, c: P<u32>, i: P<nvmlProcessInfo_v1_t>) => n::compute_processes(d, c, i as P<u8>, true, true);
    nvmlDeviceGetGraphicsRunningProcesses_v2(d: D, c: P<u32>, i: P<nvmlProcessInfo_t>) => n::compute_processes(d, c, i as P<u8>, false, true);
    nvmlDeviceGetGraphicsRunningProcesses_v3(d: D, c: P<u32>, i: P<nvmlProcessInfo_t>) => n::compute_processes(d, c, i as P<u8>, false, true);
    nvmlDeviceGetMPSComputeRunningProcesses(d: D, c: P<u32>, i: P<nvmlProcessInfo_v1_t>) => n::compute_processes(d, c, i as P<u8>, true, true);
    nvmlDeviceGetMPSComputeRunningProcesses_v2(d: D, c: P<u32>, i: P<nvmlProcessInfo_t>) => n::compute_processes(d, c, i as P<u8>, false, true);
    nvmlDeviceGetMPSComputeRunningProcesses_v3(d: D, c: P<u32>, i: P<nvmlProcessInfo_t>) => n::compute_processes(d, c, i as P<u8>, false, true);
    nvmlDeviceGetUtilizationRates(d: D, u: P<nvmlUtilization_t>) => n::utilization(d, u);
    nvmlDeviceGetProcessUtilization(d: D, s: P<nvmlProcessUtilizationSample_t>, c: P<u32>, t: u64) => n::process_utilization(d, s, c, t);
    nvmlDeviceGetNvLinkState(d: D, l: u32, a: P<u32>) => n::nvlink_state(d, l, a);
    nvmlDeviceGetNvLinkVersion(d: D, l: u32, v: P<u32>) => n::nvlink_version(d, l, v);
    nvmlDeviceGetNvLinkCapability(d: D, l: u32, c: u32, r: P<u32>) => n::nvlink_capability(d, l, c, r);
    nvmlDeviceGetNvLinkRemotePciInfo(d: D, l: u32, p: P<nvmlPciInfo_t>) => n::nvlink_remote_pci(d, l, p);
    nvmlDeviceGetNvLinkRemotePciInfo_v2(d: D, l: u32, p: P<nvmlPciInfo_t>) => n::nvlink_remote_pci(d, l, p);
    nvmlDeviceGetNvLinkRemoteDeviceType(d: D, l: u32, t: P<u32>) => n::nvlink_remote_type(d, l, t);
    nvmlDeviceGetP2PStatus(a: D, b: D, c: u32, s: P<u32>) => n::p2p_status(a, b, c, s);
    nvmlDeviceGetTopologyCommonAncestor(a: D, b: D, l: P<u32>) => n::topology_common_ancestor(a, b, l);
    nvmlDeviceGetFieldValues(d: D, c: i32, v: P<nvmlFieldValue_t>) => n::field_values(d, c, v);
    nvmlDeviceGetPersistenceMode(d: D, m: P<u32>) => n::simple_u32(d, m, NVML_FEATURE_ENABLED);
    nvmlDeviceGetComputeMode(d: D, m: P<u32>) => n::simple_u32(d, m, 0);
    nvmlDeviceGetBrand(d: D, b: P<u32>) => n::simple_u32(d, b, NVML_BRAND_NVIDIA);
    nvmlDeviceGetArchitecture(d: D, a: P<u32>) => n::simple_u32(d, a, 9);
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlErrorString(r: nvmlReturn_t) -> *const c_char {
    std::panic::catch_unwind(|| n::error_string(r)).unwrap_or(std::ptr::null())
}

nvml_stubs!(
    nvmlDeviceGetMigMode,
    nvmlDeviceGetPowerUsage,
    nvmlDeviceGetTemperature,
    nvmlDeviceGetClockInfo,
    nvmlDeviceGetMaxClockInfo,
    nvmlDeviceGetPowerManagementLimit,
    nvmlDeviceGetEnforcedPowerLimit,
    nvmlDeviceGetEccMode,
    nvmlDeviceGetFanSpeed,
    nvmlDeviceGetPerformanceState,
    nvmlDeviceGetBAR1MemoryInfo,
    nvmlDeviceGetCpuAffinity,
    nvmlDeviceGetCpuAffinityWithinScope,
    nvmlDeviceGetMemoryAffinity,
    nvmlDeviceGetCurrPcieLinkGeneration,
    nvmlDeviceGetCurrPcieLinkWidth,
    nvmlDeviceGetGpuFabricInfo,
    nvmlDeviceGetGpuFabricInfoV,
    nvmlDeviceGetAccountingStats,
    nvmlDeviceGetTotalEnergyConsumption,
    nvmlDeviceGetNumGpuCores,
    nvmlDeviceGetSupportedEventTypes,
    nvmlDeviceRegisterEvents,
    nvmlEventSetCreate,
    nvmlEventSetWait_v2,
    nvmlEventSetFree,
    nvmlDeviceGetBoardId,
    nvmlDeviceGetVbiosVersion,
    nvmlDeviceGetMaxMigDeviceCount,
    nvmlDeviceGetMigDeviceHandleByIndex,
    nvmlDeviceGetGpuInstanceId,
    nvmlDeviceGetComputeInstanceId,
    nvmlDeviceGetDeviceHandleFromMigDeviceHandle,
    nvmlDeviceIsMigDeviceHandle,
    nvmlDeviceGetNvLinkUtilizationCounter,
    nvmlDeviceGetNvLinkErrorCounter,
    nvmlDeviceGetPciInfoExt,
    nvmlSystemGetTopologyGpuSet,
    nvmlDeviceGetTopologyNearestGpus,
);
