//! Intercepted CUDA driver API entry points. Each line names the exact
//! versioned symbol, its C signature and the safe `ops` function deciding
//! what to do; `detour::hooks!` generates the exported detour, the real
//! pointer and the address-mapping table. Families live in submodules.

pub mod array;
pub mod ctx;
pub mod graph;
pub mod info;
pub mod init;
pub mod launch;
pub mod legacy;
pub mod mem;
pub mod pool;
pub mod sparse;
pub mod vmm;

use egpu_cuda::*;
use std::ffi::{c_char, c_int, c_uint, c_void};

/// The stream a `_ptsz` entry point means: its stream 0 is the calling
/// thread's per-thread default stream, not the legacy one (whether it is
/// capturing, whose context it is in, where a refused allocation is given
/// back all follow from it).
pub(crate) fn per_thread(stream: CUstream) -> CUstream {
    if stream.is_null() { CU_STREAM_PER_THREAD as CUstream } else { stream }
}

crate::detour::hooks! {
    runner: cuda; ret: CUresult; lib: Cuda;
    // Ways in, and the fail-closed gate.
    fn cuInit(flags: c_uint) => init::init;
    fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int, flags: u64) => init::get_proc_address;
    fn cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int, flags: u64, status: *mut c_uint) => init::get_proc_address_v2;
    // Linear memory.
    fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) => mem::alloc;
    fn cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, elem: c_uint) => mem::alloc_pitch;
    fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint) => mem::alloc_managed;
    fn cuMemFree_v2(dptr: CUdeviceptr) => mem::free;
    // Queries.
    fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) => info::mem_get_info;
    fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) => info::device_total_mem;
    // Arrays.
    fn cuArrayCreate_v2(handle: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR) => array::create;
    fn cuArray3DCreate_v2(handle: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR) => array::create_3d;
    fn cuArrayDestroy(handle: CUarray) => array::destroy;
    fn cuMipmappedArrayCreate(handle: *mut CUmipmappedArray, desc: *const CUDA_ARRAY3D_DESCRIPTOR, levels: c_uint) => array::create_mipmapped;
    fn cuMipmappedArrayDestroy(handle: CUmipmappedArray) => array::destroy_mipmapped;
    // Stream-ordered allocator and pools.
    fn cuMemAllocAsync(dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream) => pool::alloc_async;
    fn cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream) => pool::alloc_async_ptsz;
    fn cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, stream: CUstream) => pool::alloc_from_pool;
    fn cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, stream: CUstream) => pool::alloc_from_pool_ptsz;
    fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) => pool::free_async;
    fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: CUstream) => pool::free_async_ptsz;
    fn cuMemPoolCreate(pool: *mut CUmemoryPool, props: *const CUmemPoolProps) => pool::create;
    fn cuMemPoolDestroy(pool: CUmemoryPool) => pool::destroy;
    fn cuMemPoolTrimTo(pool: CUmemoryPool, keep: usize) => pool::trim_to;
    fn cuStreamSynchronize(stream: CUstream) => pool::synchronize_stream;
    fn cuStreamSynchronize_ptsz(stream: CUstream) => pool::synchronize_stream;
    fn cuCtxSynchronize() => pool::synchronize_ctx;
    fn cuCtxSynchronize_v2(ctx: CUcontext) => pool::synchronize_ctx_v2;
    // Virtual memory management and multicast.
    fn cuMemCreate(handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationProp, flags: u64) => vmm::create;
    fn cuMemRelease(handle: CUmemGenericAllocationHandle) => vmm::release;
    fn cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: u64) => vmm::map;
    fn cuMemUnmap(ptr: CUdeviceptr, size: usize) => vmm::unmap;
    fn cuMemRetainAllocationHandle(handle: *mut CUmemGenericAllocationHandle, addr: *mut c_void) => vmm::retain;
    fn cuMulticastCreate(handle: *mut CUmemGenericAllocationHandle, prop: *const CUmulticastObjectProp) => vmm::multicast_create;
    // Sparse arrays: their tiles mapped to VMM handles.
    fn cuMemMapArrayAsync(list: *mut CUarrayMapInfo, count: c_uint, stream: CUstream) => sparse::map_array_async;
    fn cuMemMapArrayAsync_ptsz(list: *mut CUarrayMapInfo, count: c_uint, stream: CUstream) => sparse::map_array_async;
    // Graph memory nodes.
    fn cuGraphAddMemAllocNode(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, ndeps: usize, params: *mut CUDA_MEM_ALLOC_NODE_PARAMS) => graph::add_mem_alloc_node;
    fn cuGraphInstantiateWithFlags(exec: *mut CUgraphExec, graph: CUgraph, flags: u64) => graph::instantiate_with_flags;
    fn cuGraphInstantiate_v2(exec: *mut CUgraphExec, graph: CUgraph, err_node: *mut CUgraphNode, log: *mut c_char, log_size: usize) => graph::instantiate_v2;
    // The CUDA 10 export: the same five arguments as `_v2`.
    fn cuGraphInstantiate(exec: *mut CUgraphExec, graph: CUgraph, err_node: *mut CUgraphNode, log: *mut c_char, log_size: usize) => graph::instantiate_v2;
    fn cuGraphInstantiateWithParams(exec: *mut CUgraphExec, graph: CUgraph, params: *mut c_void) => graph::instantiate_with_params;
    fn cuGraphInstantiateWithParams_ptsz(exec: *mut CUgraphExec, graph: CUgraph, params: *mut c_void) => graph::instantiate_with_params;
    fn cuGraphExecDestroy(exec: CUgraphExec) => graph::exec_destroy;
    fn cuGraphDestroy(graph: CUgraph) => graph::destroy;
    fn cuDeviceGraphMemTrim(device: CUdevice) => graph::trim;
    // Contexts.
    fn cuCtxCreate_v2(ctx: *mut CUcontext, flags: c_uint, dev: CUdevice) => ctx::create_v2;
    fn cuCtxCreate(ctx: *mut CUcontext, flags: c_uint, dev: CUdevice) => ctx::create_v2;
    fn cuCtxCreate_v3(ctx: *mut CUcontext, params: *mut CUexecAffinityParam, nparams: c_int, flags: c_uint, dev: CUdevice) => ctx::create_v3;
    fn cuCtxCreate_v4(ctx: *mut CUcontext, params: *mut CUctxCreateParams, flags: c_uint, dev: CUdevice) => ctx::create_v4;
    fn cuCtxDestroy_v2(ctx: CUcontext) => ctx::destroy;
    fn cuCtxDestroy(ctx: CUcontext) => ctx::destroy;
    fn cuDevicePrimaryCtxRetain(ctx: *mut CUcontext, dev: CUdevice) => ctx::primary_retain;
    fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) => ctx::primary_release;
    fn cuDevicePrimaryCtxRelease(dev: CUdevice) => ctx::primary_release;
    fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) => ctx::primary_reset;
    fn cuDevicePrimaryCtxReset(dev: CUdevice) => ctx::primary_reset;
    fn cuGreenCtxCreate(green: *mut CUgreenCtx, desc: CUdevResourceDesc, dev: CUdevice, flags: c_uint) => ctx::green_create;
    fn cuGreenCtxDestroy(green: CUgreenCtx) => ctx::green_destroy;
    // Launches: gated against the slice's compute allowance (see `compute`).
    fn cuLaunchKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void) => launch::launch_kernel;
    fn cuLaunchKernel_ptsz(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void) => launch::launch_kernel_ptsz;
    fn cuLaunchKernelEx(config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void) => launch::launch_kernel_ex;
    fn cuLaunchKernelEx_ptsz(config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void) => launch::launch_kernel_ex_ptsz;
    fn cuLaunchCooperativeKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: *mut *mut c_void) => launch::launch_cooperative;
    fn cuLaunchCooperativeKernel_ptsz(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: *mut *mut c_void) => launch::launch_cooperative_ptsz;
    fn cuLaunchCooperativeKernelMultiDevice(list: *mut CUDA_LAUNCH_PARAMS, n: c_uint, flags: c_uint) => launch::launch_cooperative_multi_device;
    fn cuGraphLaunch(exec: CUgraphExec, stream: CUstream) => launch::graph_launch;
    fn cuGraphLaunch_ptsz(exec: CUgraphExec, stream: CUstream) => launch::graph_launch_ptsz;
    fn cuLaunch(f: CUfunction) => launch::launch_legacy;
    fn cuLaunchGrid(f: CUfunction, w: c_int, h: c_int) => launch::launch_grid;
    fn cuLaunchGridAsync(f: CUfunction, w: c_int, h: c_int, stream: CUstream) => launch::launch_grid_async;
    // Stream capture (the gate steps aside while launches are captured) and event waits (reaping).
    fn cuStreamBeginCapture(s: CUstream) => launch::begin_capture_v1;
    fn cuStreamBeginCapture_ptsz(s: CUstream) => launch::begin_capture_v1_ptsz;
    fn cuStreamBeginCapture_v2(s: CUstream, mode: c_uint) => launch::begin_capture_v2;
    fn cuStreamBeginCapture_v2_ptsz(s: CUstream, mode: c_uint) => launch::begin_capture_v2_ptsz;
    fn cuStreamBeginCaptureToGraph(s: CUstream, graph: CUgraph, deps: *const CUgraphNode, data: *const c_void, n: usize, mode: c_uint) => launch::begin_capture_to_graph;
    fn cuStreamBeginCaptureToGraph_ptsz(s: CUstream, graph: CUgraph, deps: *const CUgraphNode, data: *const c_void, n: usize, mode: c_uint) => launch::begin_capture_to_graph_ptsz;
    fn cuStreamBeginRecaptureToGraph(s: CUstream, mode: c_uint, graph: CUgraph, callback: *mut c_void, user: *mut c_void) => launch::begin_recapture_to_graph;
    fn cuStreamBeginRecaptureToGraph_ptsz(s: CUstream, mode: c_uint, graph: CUgraph, callback: *mut c_void, user: *mut c_void) => launch::begin_recapture_to_graph_ptsz;
    fn cuStreamEndCapture(s: CUstream, graph: *mut CUgraph) => launch::end_capture;
    fn cuStreamEndCapture_ptsz(s: CUstream, graph: *mut CUgraph) => launch::end_capture_ptsz;
    fn cuEventSynchronize(e: CUevent) => launch::event_synchronize;
    // Legacy 32-bit (v1) entry points: refused or answered with the slice view.
    fn cuMemAlloc(dptr: *mut c_uint, bytesize: c_uint) => legacy::refuse_alloc;
    fn cuMemAllocPitch(dptr: *mut c_uint, pitch: *mut c_uint, width: c_uint, height: c_uint, elem: c_uint) => legacy::refuse_alloc_pitch;
    fn cuArrayCreate(handle: *mut CUarray, desc: *const c_void) => legacy::refuse_array;
    fn cuArray3DCreate(handle: *mut CUarray, desc: *const c_void) => legacy::refuse_array;
    fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) => legacy::mem_get_info;
    fn cuDeviceTotalMem(bytes: *mut c_uint, dev: CUdevice) => legacy::device_total_mem;
}

/// Real functions the hook calls without intercepting them.
pub mod drv {
    use egpu_cuda::*;
    use std::ffi::{c_int, c_void};
    crate::detour::real_fns! {
        lib: Cuda;
        fn cuCtxGetDevice(dev: *mut CUdevice) -> CUresult;
        fn cuCtxGetCurrent(ctx: *mut CUcontext) -> CUresult;
        fn cuCtxPushCurrent_v2(ctx: CUcontext) -> CUresult;
        fn cuCtxPopCurrent_v2(ctx: *mut CUcontext) -> CUresult;
        fn cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice) -> CUresult;
        fn cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice) -> CUresult;
        fn cuDeviceGetAttribute(v: *mut c_int, attr: u32, dev: CUdevice) -> CUresult;
        fn cuDeviceGetMemPool(pool: *mut CUmemoryPool, dev: CUdevice) -> CUresult;
        fn cuDeviceGetDefaultMemPool(pool: *mut CUmemoryPool, dev: CUdevice) -> CUresult;
        fn cuDeviceGetCount(count: *mut c_int) -> CUresult;
        fn cuDevicePrimaryCtxGetState(dev: CUdevice, flags: *mut u32, active: *mut c_int) -> CUresult;
        fn cuMemPoolGetAttribute(pool: CUmemoryPool, attr: u32, value: *mut c_void) -> CUresult;
        fn cuStreamGetCtx(stream: CUstream, ctx: *mut CUcontext) -> CUresult;
        fn cuGraphGetNodes(graph: CUgraph, nodes: *mut CUgraphNode, n: *mut usize) -> CUresult;
        fn cuGraphNodeGetType(node: CUgraphNode, t: *mut u32) -> CUresult;
        fn cuGraphMemAllocNodeGetParams(node: CUgraphNode, params: *mut CUDA_MEM_ALLOC_NODE_PARAMS) -> CUresult;
        fn cuGraphChildGraphNodeGetGraph(node: CUgraphNode, graph: *mut CUgraph) -> CUresult;
        fn cuDeviceGetGraphMemAttribute(dev: CUdevice, attr: u32, value: *mut c_void) -> CUresult;
    }
}
