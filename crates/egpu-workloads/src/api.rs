//! The function table the probe calls through.

use std::ffi::{c_char, c_int, c_uint, c_void};
use egpu_cuda::*;

/// One symbol: the ELF name, the `cuGetProcAddress` base name and version.
#[derive(Debug, Clone, Copy)]
pub struct Sym {
    pub elf: &'static str,
    pub base: &'static str,
    pub version: i32,
}

macro_rules! api {
    ($( $field:ident = $base:literal @ $ver:literal : fn($($t:ty),* $(,)?); )*) => {
        /// Driver API and NVML functions; `None` when the chosen way did not find one.
        #[allow(non_snake_case)]
        pub struct Api {
            $( pub $field: Option<unsafe extern "C" fn($($t),*) -> u32>, )*
        }

        impl Api {
            /// Every symbol, in field order.
            pub const SYMBOLS: &'static [Sym] = &[ $( Sym { elf: stringify!($field), base: $base, version: $ver } ),* ];

            /// Fills the table with `resolve`, which returns null for a missing symbol.
            pub fn load(mut resolve: impl FnMut(&Sym) -> *mut c_void) -> Api {
                Api { $( $field: {
                    let p = resolve(&Sym { elf: stringify!($field), base: $base, version: $ver });
                    // SAFETY: `p` is the address of the function named
                    // `$field` (or its per-thread variant, same signature),
                    // whose C signature is the one declared here.
                    if p.is_null() { None } else { Some(unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($t),*) -> u32>(p) }) }
                }, )* }
            }
        }
    };
}

api! {
    cuInit = "cuInit" @ 2000: fn(c_uint);
    cuGetProcAddress_v2 = "cuGetProcAddress" @ 12000: fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_uint);
    cuDriverGetVersion = "cuDriverGetVersion" @ 2020: fn(*mut c_int);
    cuDeviceGet = "cuDeviceGet" @ 2000: fn(*mut CUdevice, c_int);
    cuDeviceGetCount = "cuDeviceGetCount" @ 2000: fn(*mut c_int);
    cuDeviceGetUuid_v2 = "cuDeviceGetUuid" @ 11040: fn(*mut CUuuid, CUdevice);
    cuDeviceTotalMem_v2 = "cuDeviceTotalMem" @ 3020: fn(*mut usize, CUdevice);
    cuDeviceGetAttribute = "cuDeviceGetAttribute" @ 2000: fn(*mut c_int, c_uint, CUdevice);
    cuDevicePrimaryCtxRetain = "cuDevicePrimaryCtxRetain" @ 7000: fn(*mut CUcontext, CUdevice);
    cuDevicePrimaryCtxRelease_v2 = "cuDevicePrimaryCtxRelease" @ 11000: fn(CUdevice);
    cuDevicePrimaryCtxReset_v2 = "cuDevicePrimaryCtxReset" @ 11000: fn(CUdevice);
    cuDevicePrimaryCtxGetState = "cuDevicePrimaryCtxGetState" @ 7000: fn(CUdevice, *mut c_uint, *mut c_int);
    cuDeviceGetDevResource = "cuDeviceGetDevResource" @ 12040: fn(CUdevice, *mut CUdevResource, c_uint);
    cuDevResourceGenerateDesc = "cuDevResourceGenerateDesc" @ 12040: fn(*mut CUdevResourceDesc, *mut CUdevResource, c_uint);
    cuGreenCtxCreate = "cuGreenCtxCreate" @ 12040: fn(*mut CUgreenCtx, CUdevResourceDesc, CUdevice, c_uint);
    cuGreenCtxDestroy = "cuGreenCtxDestroy" @ 12040: fn(CUgreenCtx);
    cuCtxFromGreenCtx = "cuCtxFromGreenCtx" @ 12040: fn(*mut CUcontext, CUgreenCtx);
    cuCtxSetCurrent = "cuCtxSetCurrent" @ 4000: fn(CUcontext);
    cuCtxCreate_v2 = "cuCtxCreate" @ 3020: fn(*mut CUcontext, c_uint, CUdevice);
    cuCtxDestroy_v2 = "cuCtxDestroy" @ 4000: fn(CUcontext);
    cuCtxSynchronize = "cuCtxSynchronize" @ 2000: fn();
    cuCtxSetLimit = "cuCtxSetLimit" @ 3010: fn(c_uint, usize);
    cuMemGetInfo_v2 = "cuMemGetInfo" @ 3020: fn(*mut usize, *mut usize);
    cuMemAlloc_v2 = "cuMemAlloc" @ 3020: fn(*mut CUdeviceptr, usize);
    cuMemAllocPitch_v2 = "cuMemAllocPitch" @ 3020: fn(*mut CUdeviceptr, *mut usize, usize, usize, c_uint);
    cuMemAllocManaged = "cuMemAllocManaged" @ 6000: fn(*mut CUdeviceptr, usize, c_uint);
    cuMemFree_v2 = "cuMemFree" @ 3020: fn(CUdeviceptr);
    cuMemAllocHost_v2 = "cuMemAllocHost" @ 3020: fn(*mut *mut c_void, usize);
    cuMemFreeHost = "cuMemFreeHost" @ 2000: fn(*mut c_void);
    cuMemHostAlloc = "cuMemHostAlloc" @ 2020: fn(*mut *mut c_void, usize, c_uint);
    cuMemsetD8_v2 = "cuMemsetD8" @ 3020: fn(CUdeviceptr, u8, usize);
    cuArrayCreate_v2 = "cuArrayCreate" @ 3020: fn(*mut CUarray, *const CUDA_ARRAY_DESCRIPTOR);
    cuArray3DCreate_v2 = "cuArray3DCreate" @ 3020: fn(*mut CUarray, *const CUDA_ARRAY3D_DESCRIPTOR);
    cuArrayDestroy = "cuArrayDestroy" @ 2000: fn(CUarray);
    cuMipmappedArrayCreate = "cuMipmappedArrayCreate" @ 5000: fn(*mut CUmipmappedArray, *const CUDA_ARRAY3D_DESCRIPTOR, c_uint);
    cuMipmappedArrayDestroy = "cuMipmappedArrayDestroy" @ 5000: fn(CUmipmappedArray);
    cuStreamCreate = "cuStreamCreate" @ 2000: fn(*mut CUstream, c_uint);
    cuStreamDestroy_v2 = "cuStreamDestroy" @ 4000: fn(CUstream);
    cuStreamSynchronize = "cuStreamSynchronize" @ 2000: fn(CUstream);
    cuMemAllocAsync = "cuMemAllocAsync" @ 11020: fn(*mut CUdeviceptr, usize, CUstream);
    cuMemFreeAsync = "cuMemFreeAsync" @ 11020: fn(CUdeviceptr, CUstream);
    cuMemAllocFromPoolAsync = "cuMemAllocFromPoolAsync" @ 11020: fn(*mut CUdeviceptr, usize, CUmemoryPool, CUstream);
    cuMemPoolCreate = "cuMemPoolCreate" @ 11020: fn(*mut CUmemoryPool, *const CUmemPoolProps);
    cuMemPoolDestroy = "cuMemPoolDestroy" @ 11020: fn(CUmemoryPool);
    cuMemPoolTrimTo = "cuMemPoolTrimTo" @ 11020: fn(CUmemoryPool, usize);
    cuMemPoolSetAttribute = "cuMemPoolSetAttribute" @ 11020: fn(CUmemoryPool, c_uint, *mut c_void);
    cuMemPoolGetAttribute = "cuMemPoolGetAttribute" @ 11020: fn(CUmemoryPool, c_uint, *mut c_void);
    cuMemCreate = "cuMemCreate" @ 10020: fn(*mut CUmemGenericAllocationHandle, usize, *const CUmemAllocationProp, u64);
    cuMemRelease = "cuMemRelease" @ 10020: fn(CUmemGenericAllocationHandle);
    cuMemAddressReserve = "cuMemAddressReserve" @ 10020: fn(*mut CUdeviceptr, usize, usize, CUdeviceptr, u64);
    cuMemAddressFree = "cuMemAddressFree" @ 10020: fn(CUdeviceptr, usize);
    cuMemMap = "cuMemMap" @ 10020: fn(CUdeviceptr, usize, usize, CUmemGenericAllocationHandle, u64);
    cuMemUnmap = "cuMemUnmap" @ 10020: fn(CUdeviceptr, usize);
    cuMemSetAccess = "cuMemSetAccess" @ 10020: fn(CUdeviceptr, usize, *const CUmemAccessDesc, usize);
    cuMemGetAllocationGranularity = "cuMemGetAllocationGranularity" @ 10020: fn(*mut usize, *const CUmemAllocationProp, c_uint);
    cuMemRetainAllocationHandle = "cuMemRetainAllocationHandle" @ 11000: fn(*mut CUmemGenericAllocationHandle, *mut c_void);
    cuMemMapArrayAsync = "cuMemMapArrayAsync" @ 11010: fn(*mut CUarrayMapInfo, c_uint, CUstream);
    cuMemExportToShareableHandle = "cuMemExportToShareableHandle" @ 10020: fn(*mut c_void, CUmemGenericAllocationHandle, c_uint, u64);
    cuMemImportFromShareableHandle = "cuMemImportFromShareableHandle" @ 10020: fn(*mut CUmemGenericAllocationHandle, *mut c_void, c_uint);
    cuMulticastCreate = "cuMulticastCreate" @ 12010: fn(*mut CUmemGenericAllocationHandle, *const CUmulticastObjectProp);
    cuMulticastGetGranularity = "cuMulticastGetGranularity" @ 12010: fn(*mut usize, *const CUmulticastObjectProp, c_uint);
    cuMulticastAddDevice = "cuMulticastAddDevice" @ 12010: fn(CUmemGenericAllocationHandle, CUdevice);
    cuDeviceGetDefaultMemPool = "cuDeviceGetDefaultMemPool" @ 11020: fn(*mut CUmemoryPool, CUdevice);
    cuGraphCreate = "cuGraphCreate" @ 10000: fn(*mut CUgraph, c_uint);
    cuGraphDestroy = "cuGraphDestroy" @ 10000: fn(CUgraph);
    cuGraphAddMemAllocNode = "cuGraphAddMemAllocNode" @ 11040: fn(*mut CUgraphNode, CUgraph, *const CUgraphNode, usize, *mut CUDA_MEM_ALLOC_NODE_PARAMS);
    cuGraphAddMemFreeNode = "cuGraphAddMemFreeNode" @ 11040: fn(*mut CUgraphNode, CUgraph, *const CUgraphNode, usize, CUdeviceptr);
    cuGraphInstantiateWithFlags = "cuGraphInstantiate" @ 12000: fn(*mut CUgraphExec, CUgraph, u64);
    cuGraphInstantiate = "cuGraphInstantiate" @ 10000: fn(*mut CUgraphExec, CUgraph, *mut CUgraphNode, *mut c_char, usize);
    cuGraphExecDestroy = "cuGraphExecDestroy" @ 10000: fn(CUgraphExec);
    cuGraphLaunch = "cuGraphLaunch" @ 10000: fn(CUgraphExec, CUstream);
    cuStreamBeginCapture_v2 = "cuStreamBeginCapture" @ 10010: fn(CUstream, c_uint);
    cuStreamEndCapture = "cuStreamEndCapture" @ 10000: fn(CUstream, *mut CUgraph);
    cuDeviceGraphMemTrim = "cuDeviceGraphMemTrim" @ 11040: fn(CUdevice);
    cuIpcGetMemHandle = "cuIpcGetMemHandle" @ 4010: fn(*mut CUipcMemHandle, CUdeviceptr);
    cuIpcOpenMemHandle_v2 = "cuIpcOpenMemHandle" @ 11000: fn(*mut CUdeviceptr, CUipcMemHandle, c_uint);
    cuIpcCloseMemHandle = "cuIpcCloseMemHandle" @ 4010: fn(CUdeviceptr);
    cuModuleLoadData = "cuModuleLoadData" @ 2000: fn(*mut CUmodule, *const c_void);
    cuModuleGetFunction = "cuModuleGetFunction" @ 2000: fn(*mut CUfunction, CUmodule, *const c_char);
    cuModuleUnload = "cuModuleUnload" @ 2000: fn(CUmodule);
    cuLaunchKernel = "cuLaunchKernel" @ 4000: fn(CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void, *mut *mut c_void);
    nvmlInit_v2 = "nvmlInit_v2" @ 0: fn();
    nvmlShutdown = "nvmlShutdown" @ 0: fn();
    nvmlDeviceGetCount_v2 = "nvmlDeviceGetCount_v2" @ 0: fn(*mut c_uint);
    nvmlDeviceGetHandleByIndex_v2 = "nvmlDeviceGetHandleByIndex_v2" @ 0: fn(c_uint, *mut nvmlDevice_t);
    nvmlDeviceGetHandleByUUID = "nvmlDeviceGetHandleByUUID" @ 0: fn(*const c_char, *mut nvmlDevice_t);
    nvmlDeviceGetUUID = "nvmlDeviceGetUUID" @ 0: fn(nvmlDevice_t, *mut c_char, c_uint);
    nvmlDeviceGetIndex = "nvmlDeviceGetIndex" @ 0: fn(nvmlDevice_t, *mut c_uint);
    nvmlDeviceGetMemoryInfo = "nvmlDeviceGetMemoryInfo" @ 0: fn(nvmlDevice_t, *mut nvmlMemory_t);
    nvmlDeviceGetMemoryInfo_v2 = "nvmlDeviceGetMemoryInfo_v2" @ 0: fn(nvmlDevice_t, *mut nvmlMemory_v2_t);
    nvmlDeviceGetComputeRunningProcesses_v3 = "nvmlDeviceGetComputeRunningProcesses_v3" @ 0: fn(nvmlDevice_t, *mut c_uint, *mut nvmlProcessInfo_t);
}

/// Symbols that have a `_ptsz` per-thread-default-stream variant the probe uses with `--ptds`.
pub const PTSZ: &[&str] =
    &["cuStreamSynchronize", "cuMemAllocAsync", "cuMemFreeAsync", "cuMemAllocFromPoolAsync", "cuGraphLaunch", "cuLaunchKernel", "cuStreamBeginCapture_v2", "cuStreamEndCapture"];

/// A driver call failed: which one and its status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallError {
    pub call: &'static str,
    pub code: u32,
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} failed with {}", self.call, self.code)
    }
}

impl std::error::Error for CallError {}

/// Calls `$api.$f(args)`, mapping a missing function to [`crate::via::missing_code`]
/// and a non-zero status to `Err(CallError)`.
#[macro_export]
macro_rules! call {
    ($api:expr, $f:ident ( $($a:expr),* $(,)? )) => {{
        match $api.$f {
            // SAFETY: the probe passes arguments valid for the C function.
            Some(func) => match unsafe { func($($a),*) } {
                0 => Ok(()),
                code => Err($crate::api::CallError { call: stringify!($f), code }),
            },
            None => Err($crate::api::CallError { call: stringify!($f), code: $crate::via::missing_code() }),
        }
    }};
}

#[cfg(test)]
mod tests {
    #[test]
    fn symbols_txt_lists_every_symbol() {
        let text = include_str!("../symbols.txt");
        for s in super::Api::SYMBOLS {
            let line = format!("{} {} {}", s.elf, s.base, s.version);
            assert!(text.lines().any(|l| l == line), "symbols.txt lacks '{line}'");
        }
        for p in super::PTSZ {
            assert!(text.lines().any(|l| l.starts_with(&format!("{p}_ptsz "))), "symbols.txt lacks {p}_ptsz");
        }
    }
}
