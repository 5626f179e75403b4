//! Driver-API exports (`cu*`), grouped by family.

use crate::ops::{array, capture, context as ctx, copy, device, graph, ipc, launch, memory as mem, module, pool, stream, vmm};
use crate::procaddr;
use egpu_cuda::*;
use std::ffi::{c_char, c_void};
use std::ptr::null_mut;

type P<T> = *mut T;
type Pc<T> = *const T;
type Dp = CUdeviceptr;

fn ok() -> crate::cptr::R<()> {
    Ok(())
}

cu_exports! {
    // --- initialisation, versions, errors, entry points ---------------------
    cuInit(flags: u32) => device::init(flags);
    cuDriverGetVersion(v: P<i32>) => device::driver_get_version(v);
    cuGetErrorName(e: CUresult, s: P<*const c_char>) => device::get_error_name(e, s);
    cuGetErrorString(e: CUresult, s: P<*const c_char>) => device::get_error_string(e, s);
    cuGetExportTable(t: P<*const c_void>, id: Pc<CUuuid>) => Err(CUDA_ERROR_NOT_SUPPORTED);
    cuGetProcAddress(sym: Pc<c_char>, pfn: P<*mut c_void>, ver: i32, flags: u64) => procaddr::get_proc_address(sym, pfn, ver, flags, null_mut());
    cuGetProcAddress_v2(sym: Pc<c_char>, pfn: P<*mut c_void>, ver: i32, flags: u64, st: P<u32>) => procaddr::get_proc_address(sym, pfn, ver, flags, st);

    // --- devices ------------------------------------------------------------
    cuDeviceGet(d: P<CUdevice>, o: i32) => device::device_get(d, o);
    cuDeviceGetCount(c: P<i32>) => device::device_get_count(c);
    cuDeviceGetName(n: P<c_char>, len: i32, d: CUdevice) => device::device_get_name(n, len, d);
    cuDeviceGetUuid(u: P<CUuuid>, d: CUdevice) => device::device_get_uuid(u, d);
    cuDeviceGetUuid_v2(u: P<CUuuid>, d: CUdevice) => device::device_get_uuid(u, d);
    cuDeviceTotalMem_v2(b: P<usize>, d: CUdevice) => device::device_total_mem(b, d);
    cuDeviceGetAttribute(v: P<i32>, a: u32, d: CUdevice) => device::device_get_attribute(v, a, d);
    cuDeviceComputeCapability(ma: P<i32>, mi: P<i32>, d: CUdevice) => device::compute_capability(ma, mi, d);
    cuDeviceGetProperties(p: P<CUdevprop>, d: CUdevice) => device::get_properties(p, d);
    cuDeviceGetPCIBusId(b: P<c_char>, len: i32, d: CUdevice) => device::device_get_pci_bus_id(b, len, d);
    cuDeviceGetByPCIBusId(d: P<CUdevice>, id: Pc<c_char>) => device::device_get_by_pci_bus_id(d, id);
    cuDeviceCanAccessPeer(r: P<i32>, d: CUdevice, p: CUdevice) => device::can_access_peer(r, d, p);
    cuDeviceGetP2PAttribute(v: P<i32>, a: u32, s: CUdevice, d: CUdevice) => device::p2p_attribute(v, a, s, d);
    cuDeviceGetExecAffinitySupport(v: P<i32>, t: u32, d: CUdevice) => device::exec_affinity_support(v, t, d);
    cuDeviceGetDefaultMemPool(p: P<CUmemoryPool>, d: CUdevice) => pool::device_get_default_mem_pool(p, d);
    cuDeviceGetMemPool(p: P<CUmemoryPool>, d: CUdevice) => pool::device_get_mem_pool(p, d);
    cuDeviceSetMemPool(d: CUdevice, p: CUmemoryPool) => pool::device_set_mem_pool(d, p);
    cuDeviceGraphMemTrim(d: CUdevice) => graph::device_graph_mem_trim(d);
    cuGraphGetNodes(g: CUgraph, n: P<CUgraphNode>, c: P<usize>) => graph::get_nodes(g, n, c);
    cuGraphNodeGetType(n: CUgraphNode, t: P<u32>) => graph::node_get_type(n, t);
    cuGraphMemAllocNodeGetParams(n: CUgraphNode, p: P<CUDA_MEM_ALLOC_NODE_PARAMS>) => graph::mem_alloc_node_get_params(n, p);
    cuDeviceGetGraphMemAttribute(d: CUdevice, a: u32, v: P<c_void>) => graph::get_graph_mem_attribute(d, a, v);
    cuDeviceSetGraphMemAttribute(d: CUdevice, a: u32, v: P<c_void>) => graph::set_graph_mem_attribute(d, a, v);

    // --- primary and explicit contexts ---------------------------------------
    cuDevicePrimaryCtxRetain(c: P<CUcontext>, d: CUdevice) => ctx::primary_retain(c, d);
    cuDeviceGetDevResource(d: CUdevice, r: P<CUdevResource>, t: u32) => ctx::dev_resource(d, r, t);
    cuDevResourceGenerateDesc(o: P<CUdevResourceDesc>, r: P<CUdevResource>, n: u32) => ctx::resource_desc(o, r, n);
    cuGreenCtxCreate(o: P<CUgreenCtx>, desc: CUdevResourceDesc, d: CUdevice, f: u32) => ctx::green_create(o, desc, d, f);
    cuGreenCtxDestroy(g: CUgreenCtx) => ctx::green_destroy(g);
    cuCtxFromGreenCtx(o: P<CUcontext>, g: CUgreenCtx) => ctx::ctx_from_green(o, g);
    cuDevicePrimaryCtxRelease(d: CUdevice) => ctx::primary_release(d);
    cuDevicePrimaryCtxRelease_v2(d: CUdevice) => ctx::primary_release(d);
    cuDevicePrimaryCtxGetState(d: CUdevice, f: P<u32>, a: P<i32>) => ctx::primary_get_state(d, f, a);
    cuDevicePrimaryCtxSetFlags(d: CUdevice, f: u32) => ctx::primary_set_flags(d, f);
    cuDevicePrimaryCtxSetFlags_v2(d: CUdevice, f: u32) => ctx::primary_set_flags(d, f);
    cuDevicePrimaryCtxReset(d: CUdevice) => ctx::primary_reset(d);
    cuDevicePrimaryCtxReset_v2(d: CUdevice) => ctx::primary_reset(d);
    cuCtxCreate(c: P<CUcontext>, f: u32, d: CUdevice) => ctx::ctx_create(c, f, d);
    cuCtxCreate_v2(c: P<CUcontext>, f: u32, d: CUdevice) => ctx::ctx_create(c, f, d);
    cuCtxCreate_v3(c: P<CUcontext>, p: P<CUexecAffinityParam>, n: i32, f: u32, d: CUdevice) => ctx::ctx_create_v3(c, p, n, f, d);
    cuCtxCreate_v4(c: P<CUcontext>, p: P<CUctxCreateParams>, f: u32, d: CUdevice) => ctx::ctx_create_v4(c, p, f, d);
    cuCtxDestroy(c: CUcontext) => ctx::ctx_destroy(c);
    cuCtxDestroy_v2(c: CUcontext) => ctx::ctx_destroy(c);
    cuCtxGetCurrent(c: P<CUcontext>) => ctx::get_current(c);
    cuCtxSetCurrent(c: CUcontext) => ctx::set_current(c);
    cuCtxPushCurrent(c: CUcontext) => ctx::push_current(c);
    cuCtxPushCurrent_v2(c: CUcontext) => ctx::push_current(c);
    cuCtxPopCurrent(c: P<CUcontext>) => ctx::pop_current(c);
    cuCtxPopCurrent_v2(c: P<CUcontext>) => ctx::pop_current(c);
    cuCtxGetDevice(d: P<CUdevice>) => ctx::get_device(d);
    cuCtxSynchronize() => ctx::synchronize();
    cuCtxSynchronize_v2(c: CUcontext) => ctx::synchronize_v2(c);
    cuCtxGetApiVersion(c: CUcontext, v: P<u32>) => ctx::get_api_version(c, v);
    cuCtxGetFlags(f: P<u32>) => ctx::get_flags(f);
    cuCtxSetFlags(f: u32) => ctx::set_flags(f);
    cuCtxGetId(c: CUcontext, id: P<u64>) => ctx::get_id(c, id);
    cuCtxEnablePeerAccess(p: CUcontext, f: u32) => ctx::enable_peer_access(p, f);
    cuCtxDisablePeerAccess(p: CUcontext) => ctx::disable_peer_access(p);
    cuCtxGetLimit(v: P<usize>, l: u32) => ctx::get_limit(v, l);
    cuCtxSetLimit(l: u32, v: usize) => ctx::set_limit(l, v);
    cuCtxGetCacheConfig(c: P<u32>) => ctx::get_cache_config(c);
    cuCtxSetCacheConfig(c: u32) => ctx::ok_if_ctx();
    cuCtxGetSharedMemConfig(c: P<u32>) => ctx::get_cache_config(c);
    cuCtxSetSharedMemConfig(c: u32) => ctx::ok_if_ctx();
    cuCtxGetStreamPriorityRange(l: P<i32>, g: P<i32>) => ctx::get_stream_priority_range(l, g);
    cuCtxResetPersistingL2Cache() => ctx::ok_if_ctx();

    // --- device, managed and host memory ---------------------------------------
    cuMemAlloc_v2(d: P<Dp>, s: usize) => mem::mem_alloc(d, s);
    cuMemAllocPitch_v2(d: P<Dp>, p: P<usize>, w: usize, h: usize, e: u32) => mem::mem_alloc_pitch(d, p, w, h, e);
    cuMemAllocManaged(d: P<Dp>, s: usize, f: u32) => mem::mem_alloc_managed(d, s, f);
    cuMemFree_v2(d: Dp) => mem::mem_free(d);
    cuMemGetInfo_v2(f: P<usize>, t: P<usize>) => mem::mem_get_info(f, t);
    cuMemGetAddressRange_v2(b: P<Dp>, s: P<usize>, d: Dp) => mem::get_address_range(b, s, d);
    cuMemAllocHost_v2(p: P<*mut c_void>, s: usize) => mem::mem_alloc_host(p, s);
    cuMemHostAlloc(p: P<*mut c_void>, s: usize, f: u32) => mem::mem_host_alloc(p, s, f);
    cuMemFreeHost(p: P<c_void>) => mem::mem_free_host(p);
    cuMemHostRegister(p: P<c_void>, s: usize, f: u32) => mem::host_register(p, s, f);
    cuMemHostRegister_v2(p: P<c_void>, s: usize, f: u32) => mem::host_register(p, s, f);
    cuMemHostUnregister(p: P<c_void>) => mem::host_unregister(p);
    cuMemHostGetDevicePointer_v2(d: P<Dp>, p: P<c_void>, f: u32) => mem::host_get_device_pointer(d, p, f);
    cuMemHostGetFlags(f: P<u32>, p: P<c_void>) => mem::host_get_flags(f, p);
    cuPointerGetAttribute(v: P<c_void>, a: u32, p: Dp) => mem::pointer_get_attribute(v, a, p);
    cuPointerGetAttributes(n: u32, a: Pc<u32>, v: P<*mut c_void>, p: Dp) => mem::pointer_get_attributes(n, a, v, p);
    cuPointerSetAttribute(v: Pc<c_void>, a: u32, p: Dp) => mem::pointer_check(p);
    cuMemAdvise(d: Dp, n: usize, a: u32, dev: CUdevice) => ok();
    cuMemAdvise_v2(d: Dp, n: usize, a: u32, l: CUmemLocation) => ok();
    cuMemPrefetchAsync(d: Dp, n: usize, dev: CUdevice, s: CUstream) => ok();
    cuMemPrefetchAsync_ptsz(d: Dp, n: usize, dev: CUdevice, s: CUstream) => ok();
    cuMemPrefetchAsync_v2(d: Dp, n: usize, l: CUmemLocation, f: u32, s: CUstream) => ok();
    cuMemPrefetchAsync_v2_ptsz(d: Dp, n: usize, l: CUmemLocation, f: u32, s: CUstream) => ok();

    // --- arrays ---------------------------------------------------------------
    cuArrayCreate_v2(a: P<CUarray>, d: Pc<CUDA_ARRAY_DESCRIPTOR>) => array::array_create(a, d);
    cuArray3DCreate_v2(a: P<CUarray>, d: Pc<CUDA_ARRAY3D_DESCRIPTOR>) => array::array3d_create(a, d);
    cuArrayDestroy(a: CUarray) => array::array_destroy(a);
    cuArrayGetDescriptor_v2(d: P<CUDA_ARRAY_DESCRIPTOR>, a: CUarray) => array::array_get_descriptor(d, a);
    cuArray3DGetDescriptor_v2(d: P<CUDA_ARRAY3D_DESCRIPTOR>, a: CUarray) => array::array3d_get_descriptor(d, a);
    cuMipmappedArrayCreate(m: P<CUmipmappedArray>, d: Pc<CUDA_ARRAY3D_DESCRIPTOR>, n: u32) => array::mipmapped_create(m, d, n);
    cuMipmappedArrayDestroy(m: CUmipmappedArray) => array::mipmapped_destroy(m);
    cuMipmappedArrayGetLevel(a: P<CUarray>, m: CUmipmappedArray, l: u32) => array::mipmapped_get_level(a, m, l);
    cuMemMapArrayAsync(m: P<CUarrayMapInfo>, n: u32, s: CUstream) => array::map_array_async(m, n, s);
    cuMemMapArrayAsync_ptsz(m: P<CUarrayMapInfo>, n: u32, s: CUstream) => array::map_array_async(m, n, s);

    // --- copies and sets --------------------------------------------------------
    cuMemcpy(d: Dp, s: Dp, n: usize) => copy::unified(d, s, n, true);
    cuMemcpy_ptds(d: Dp, s: Dp, n: usize) => copy::unified(d, s, n, true);
    cuMemcpyAsync(d: Dp, s: Dp, n: usize, st: CUstream) => copy::unified_async(d, s, n, st, false);
    cuMemcpyAsync_ptsz(d: Dp, s: Dp, n: usize, st: CUstream) => copy::unified_async(d, s, n, st, true);
    cuMemcpyHtoD_v2(d: Dp, s: Pc<c_void>, n: usize) => copy::htod(d, s, n, true);
    cuMemcpyHtoD_v2_ptds(d: Dp, s: Pc<c_void>, n: usize) => copy::htod(d, s, n, true);
    cuMemcpyDtoH_v2(d: P<c_void>, s: Dp, n: usize) => copy::dtoh(d, s, n, true);
    cuMemcpyDtoH_v2_ptds(d: P<c_void>, s: Dp, n: usize) => copy::dtoh(d, s, n, true);
    cuMemcpyDtoD_v2(d: Dp, s: Dp, n: usize) => copy::dtod(d, s, n, true);
    cuMemcpyDtoD_v2_ptds(d: Dp, s: Dp, n: usize) => copy::dtod(d, s, n, true);
    cuMemcpyHtoDAsync_v2(d: Dp, s: Pc<c_void>, n: usize, st: CUstream) => copy::htod_async(d, s, n, st, false);
    cuMemcpyHtoDAsync_v2_ptsz(d: Dp, s: Pc<c_void>, n: usize, st: CUstream) => copy::htod_async(d, s, n, st, true);
    cuMemcpyDtoHAsync_v2(d: P<c_void>, s: Dp, n: usize, st: CUstream) => copy::dtoh_async(d, s, n, st, false);
    cuMemcpyDtoHAsync_v2_ptsz(d: P<c_void>, s: Dp, n: usize, st: CUstream) => copy::dtoh_async(d, s, n, st, true);
    cuMemcpyDtoDAsync_v2(d: Dp, s: Dp, n: usize, st: CUstream) => copy::dtod_async(d, s, n, st, false);
    cuMemcpyDtoDAsync_v2_ptsz(d: Dp, s: Dp, n: usize, st: CUstream) => copy::dtod_async(d, s, n, st, true);
    cuMemcpyPeer(d: Dp, dc: CUcontext, s: Dp, sc: CUcontext, n: usize) => copy::peer(d, dc, s, sc, n, None);
    cuMemcpyPeer_ptds(d: Dp, dc: CUcontext, s: Dp, sc: CUcontext, n: usize) => copy::peer(d, dc, s, sc, n, None);
    cuMemcpyPeerAsync(d: Dp, dc: CUcontext, s: Dp, sc: CUcontext, n: usize, st: CUstream) => copy::peer(d, dc, s, sc, n, Some((st, false)));
    cuMemcpyPeerAsync_ptsz(d: Dp, dc: CUcontext, s: Dp, sc: CUcontext, n: usize, st: CUstream) => copy::peer(d, dc, s, sc, n, Some((st, true)));
    cuMemcpy2D_v2(p: Pc<CUDA_MEMCPY2D>) => copy::copy_2d(p, true, None);
    cuMemcpy2D_v2_ptds(p: Pc<CUDA_MEMCPY2D>) => copy::copy_2d(p, true, None);
    cuMemcpy2DUnaligned_v2(p: Pc<CUDA_MEMCPY2D>) => copy::copy_2d(p, true, None);
    cuMemcpy2DUnaligned_v2_ptds(p: Pc<CUDA_MEMCPY2D>) => copy::copy_2d(p, true, None);
    cuMemcpy2DAsync_v2(p: Pc<CUDA_MEMCPY2D>, st: CUstream) => copy::copy_2d(p, false, Some((st, false)));
    cuMemcpy2DAsync_v2_ptsz(p: Pc<CUDA_MEMCPY2D>, st: CUstream) => copy::copy_2d(p, false, Some((st, true)));
    cuMemsetD8_v2(d: Dp, v: u8, n: usize) => copy::memset(d, 0, v as u32, 1, n, 1, true, None);
    cuMemsetD8_v2_ptds(d: Dp, v: u8, n: usize) => copy::memset(d, 0, v as u32, 1, n, 1, true, None);
    cuMemsetD16_v2(d: Dp, v: u16, n: usize) => copy::memset(d, 0, v as u32, 2, n, 1, true, None);
    cuMemsetD16_v2_ptds(d: Dp, v: u16, n: usize) => copy::memset(d, 0, v as u32, 2, n, 1, true, None);
    cuMemsetD32_v2(d: Dp, v: u32, n: usize) => copy::memset(d, 0, v, 4, n, 1, true, None);
    cuMemsetD32_v2_ptds(d: Dp, v: u32, n: usize) => copy::memset(d, 0, v, 4, n, 1, true, None);
    cuMemsetD8Async(d: Dp, v: u8, n: usize, st: CUstream) => copy::memset(d, 0, v as u32, 1, n, 1, false, Some((st, false)));
    cuMemsetD8Async_ptsz(d: Dp, v: u8, n: usize, st: CUstream) => copy::memset(d, 0, v as u32, 1, n, 1, false, Some((st, true)));
    cuMemsetD16Async(d: Dp, v: u16, n: usize, st: CUstream) => copy::memset(d, 0, v as u32, 2, n, 1, false, Some((st, false)));
    cuMemsetD16Async_ptsz(d: Dp, v: u16, n: usize, st: CUstream) => copy::memset(d, 0, v as u32, 2, n, 1, false, Some((st, true)));
    cuMemsetD32Async(d: Dp, v: u32, n: usize, st: CUstream) => copy::memset(d, 0, v, 4, n, 1, false, Some((st, false)));
    cuMemsetD32Async_ptsz(d: Dp, v: u32, n: usize, st: CUstream) => copy::memset(d, 0, v, 4, n, 1, false, Some((st, true)));
    cuMemsetD2D8_v2(d: Dp, p: usize, v: u8, w: usize, h: usize) => copy::memset(d, p, v as u32, 1, w, h, true, None);
    cuMemsetD2D8_v2_ptds(d: Dp, p: usize, v: u8, w: usize, h: usize) => copy::memset(d, p, v as u32, 1, w, h, true, None);
    cuMemsetD2D16_v2(d: Dp, p: usize, v: u16, w: usize, h: usize) => copy::memset(d, p, v as u32, 2, w, h, true, None);
    cuMemsetD2D16_v2_ptds(d: Dp, p: usize, v: u16, w: usize, h: usize) => copy::memset(d, p, v as u32, 2, w, h, true, None);
    cuMemsetD2D32_v2(d: Dp, p: usize, v: u32, w: usize, h: usize) => copy::memset(d, p, v, 4, w, h, true, None);
    cuMemsetD2D32_v2_ptds(d: Dp, p: usize, v: u32, w: usize, h: usize) => copy::memset(d, p, v, 4, w, h, true, None);
    cuMemsetD2D8Async(d: Dp, p: usize, v: u8, w: usize, h: usize, st: CUstream) => copy::memset(d, p, v as u32, 1, w, h, false, Some((st, false)));
    cuMemsetD2D8Async_ptsz(d: Dp, p: usize, v: u8, w: usize, h: usize, st: CUstream) => copy::memset(d, p, v as u32, 1, w, h, false, Some((st, true)));
    cuMemsetD2D16Async(d: Dp, p: usize, v: u16, w: usize, h: usize, st: CUstream) => copy::memset(d, p, v as u32, 2, w, h, false, Some((st, false)));
    cuMemsetD2D16Async_ptsz(d: Dp, p: usize, v: u16, w: usize, h: usize, st: CUstream) => copy::memset(d, p, v as u32, 2, w, h, false, Some((st, true)));
    cuMemsetD2D32Async(d: Dp, p: usize, v: u32, w: usize, h: usize, st: CUstream) => copy::memset(d, p, v, 4, w, h, false, Some((st, false)));
    cuMemsetD2D32Async_ptsz(d: Dp, p: usize, v: u32, w: usize, h: usize, st: CUstream) => copy::memset(d, p, v, 4, w, h, false, Some((st, true)));

    // --- stream-ordered allocation and pools ---------------------------------------
    cuMemAllocAsync(d: P<Dp>, s: usize, st: CUstream) => pool::mem_alloc_async(d, s, st, false);
    cuMemAllocAsync_ptsz(d: P<Dp>, s: usize, st: CUstream) => pool::mem_alloc_async(d, s, st, true);
    cuMemAllocFromPoolAsync(d: P<Dp>, s: usize, p: CUmemoryPool, st: CUstream) => pool::mem_alloc_from_pool_async(d, s, p, st, false);
    cuMemAllocFromPoolAsync_ptsz(d: P<Dp>, s: usize, p: CUmemoryPool, st: CUstream) => pool::mem_alloc_from_pool_async(d, s, p, st, true);
    cuMemFreeAsync(d: Dp, st: CUstream) => pool::mem_free_async(d, st, false);
    cuMemFreeAsync_ptsz(d: Dp, st: CUstream) => pool::mem_free_async(d, st, true);
    cuMemPoolCreate(p: P<CUmemoryPool>, props: Pc<CUmemPoolProps>) => pool::pool_create(p, props);
    cuMemPoolDestroy(p: CUmemoryPool) => pool::pool_destroy(p);
    cuMemPoolTrimTo(p: CUmemoryPool, keep: usize) => pool::trim_to(p, keep);
    cuMemPoolSetAttribute(p: CUmemoryPool, a: u32, v: P<c_void>) => pool::set_attribute(p, a, v);
    cuMemPoolGetAttribute(p: CUmemoryPool, a: u32, v: P<c_void>) => pool::get_attribute(p, a, v);
    cuMemPoolSetAccess(p: CUmemoryPool, d: Pc<CUmemAccessDesc>, n: usize) => pool::check(p);
    cuMemPoolGetAccess(f: P<u32>, p: CUmemoryPool, l: P<CUmemLocation>) => crate::cptr::write(f, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);

    // --- virtual memory management and multicast -------------------------------------
    cuMemGetAllocationGranularity(g: P<usize>, p: Pc<CUmemAllocationProp>, o: u32) => vmm::get_granularity(g, p, o);
    cuMemCreate(h: P<u64>, s: usize, p: Pc<CUmemAllocationProp>, f: u64) => vmm::create(h, s, p, f);
    cuMemRelease(h: u64) => vmm::release(h);
    cuMemAddressReserve(p: P<Dp>, s: usize, a: usize, addr: Dp, f: u64) => vmm::address_reserve(p, s, a, addr, f);
    cuMemAddressFree(p: Dp, s: usize) => vmm::address_free(p, s);
    cuMemMap(p: Dp, s: usize, o: usize, h: u64, f: u64) => vmm::map(p, s, o, h, f);
    cuMemUnmap(p: Dp, s: usize) => vmm::unmap(p, s);
    cuMemSetAccess(p: Dp, s: usize, d: Pc<CUmemAccessDesc>, n: usize) => vmm::set_access(p, s, d, n);
    cuMemGetAccess(f: P<u64>, l: Pc<CUmemLocation>, p: Dp) => vmm::get_access(f, l, p);
    cuMemExportToShareableHandle(o: P<c_void>, h: u64, t: u32, f: u64) => vmm::export(o, h, t, f);
    cuMemImportFromShareableHandle(h: P<u64>, os: P<c_void>, t: u32) => vmm::import(h, os, t);
    cuMemRetainAllocationHandle(h: P<u64>, a: P<c_void>) => vmm::retain_allocation_handle(h, a);
    cuMemGetAllocationPropertiesFromHandle(p: P<CUmemAllocationProp>, h: u64) => vmm::get_properties(p, h);
    cuMulticastCreate(h: P<u64>, p: Pc<CUmulticastObjectProp>) => vmm::multicast_create(h, p);
    cuMulticastAddDevice(h: u64, d: CUdevice) => vmm::multicast_add_device(h, d);
    cuMulticastBindMem(mc: u64, mco: usize, mh: u64, mo: usize, s: usize, f: u64) => vmm::multicast_bind_mem(mc, mh);
    cuMulticastBindAddr(mc: u64, mco: usize, p: Dp, s: usize, f: u64) => vmm::multicast_plain(mc);
    cuMulticastUnbind(mc: u64, d: CUdevice, o: usize, s: usize) => vmm::multicast_plain(mc);
    cuMulticastGetGranularity(g: P<usize>, p: Pc<CUmulticastObjectProp>, o: u32) => vmm::multicast_granularity(g, p, o);

    // --- IPC ------------------------------------------------------------------
    cuIpcGetMemHandle(h: P<CUipcMemHandle>, d: Dp) => ipc::get_mem_handle(h, d);
    cuIpcOpenMemHandle(d: P<Dp>, h: CUipcMemHandle, f: u32) => ipc::open_mem_handle(d, h, f);
    cuIpcOpenMemHandle_v2(d: P<Dp>, h: CUipcMemHandle, f: u32) => ipc::open_mem_handle(d, h, f);
    cuIpcCloseMemHandle(d: Dp) => ipc::close_mem_handle(d);

    // --- streams ----------------------------------------------------------------
    cuStreamCreate(s: P<CUstream>, f: u32) => stream::stream_create(s, f);
    cuStreamCreateWithPriority(s: P<CUstream>, f: u32, p: i32) => stream::stream_create_with_priority(s, f, p);
    cuStreamDestroy(s: CUstream) => stream::stream_destroy(s);
    cuStreamDestroy_v2(s: CUstream) => stream::stream_destroy(s);
    cuStreamSynchronize(s: CUstream) => stream::stream_synchronize(s, false);
    cuStreamSynchronize_ptsz(s: CUstream) => stream::stream_synchronize(s, true);
    cuStreamQuery(s: CUstream) => stream::stream_query(s, false);
    cuStreamQuery_ptsz(s: CUstream) => stream::stream_query(s, true);
    cuStreamWaitEvent(s: CUstream, e: CUevent, f: u32) => stream::stream_wait_event(s, e, f, false);
    cuStreamWaitEvent_ptsz(s: CUstream, e: CUevent, f: u32) => stream::stream_wait_event(s, e, f, true);
    cuStreamGetPriority(s: CUstream, p: P<i32>) => stream::stream_get_priority(s, p, false);
    cuStreamGetPriority_ptsz(s: CUstream, p: P<i32>) => stream::stream_get_priority(s, p, true);
    cuStreamGetFlags(s: CUstream, f: P<u32>) => stream::stream_get_flags(s, f, false);
    cuStreamGetFlags_ptsz(s: CUstream, f: P<u32>) => stream::stream_get_flags(s, f, true);
    cuStreamGetCtx(s: CUstream, c: P<CUcontext>) => stream::stream_get_ctx(s, c, false);
    cuStreamGetCtx_ptsz(s: CUstream, c: P<CUcontext>) => stream::stream_get_ctx(s, c, true);
    cuStreamGetCtx_v2(s: CUstream, c: P<CUcontext>, gc: P<*mut c_void>) => { crate::cptr::write_opt(gc, null_mut()); stream::stream_get_ctx(s, c, false) };
    cuStreamGetCtx_v2_ptsz(s: CUstream, c: P<CUcontext>, gc: P<*mut c_void>) => { crate::cptr::write_opt(gc, null_mut()); stream::stream_get_ctx(s, c, true) };
    cuStreamGetId(s: CUstream, id: P<u64>) => stream::stream_get_id(s, id, false);
    cuStreamGetId_ptsz(s: CUstream, id: P<u64>) => stream::stream_get_id(s, id, true);
    cuLaunchHostFunc(s: CUstream, f: CUhostFn, d: P<c_void>) => stream::launch_host_func(s, f, d as usize, false);
    cuLaunchHostFunc_ptsz(s: CUstream, f: CUhostFn, d: P<c_void>) => stream::launch_host_func(s, f, d as usize, true);
    cuStreamBeginCapture(s: CUstream) => capture::begin_capture(s, 0, false);
    cuStreamBeginCapture_ptsz(s: CUstream) => capture::begin_capture(s, 0, true);
    cuStreamBeginCapture_v2(s: CUstream, m: u32) => capture::begin_capture(s, m, false);
    cuStreamBeginCapture_v2_ptsz(s: CUstream, m: u32) => capture::begin_capture(s, m, true);
    cuStreamBeginCaptureToGraph(s: CUstream, g: CUgraph, d: Pc<CUgraphNode>, e: Pc<c_void>, n: usize, m: u32) => capture::begin_capture_to_graph(s, g, m, false);
    cuStreamBeginCaptureToGraph_ptsz(s: CUstream, g: CUgraph, d: Pc<CUgraphNode>, e: Pc<c_void>, n: usize, m: u32) => capture::begin_capture_to_graph(s, g, m, true);
    cuStreamBeginRecaptureToGraph(s: CUstream, m: u32, g: CUgraph, cb: P<c_void>, u: P<c_void>) => capture::begin_recapture_to_graph(s, m, g, false);
    cuStreamBeginRecaptureToGraph_ptsz(s: CUstream, m: u32, g: CUgraph, cb: P<c_void>, u: P<c_void>) => capture::begin_recapture_to_graph(s, m, g, true);
    cuStreamEndCapture(s: CUstream, g: P<CUgraph>) => capture::end_capture(s, g, false);
    cuStreamEndCapture_ptsz(s: CUstream, g: P<CUgraph>) => capture::end_capture(s, g, true);
    cuThreadExchangeStreamCaptureMode(m: P<u32>) => capture::exchange_mode(m);
    cuStreamIsCapturing(s: CUstream, st: P<u32>) => stream::is_capturing(s, st, false);
    cuStreamIsCapturing_ptsz(s: CUstream, st: P<u32>) => stream::is_capturing(s, st, true);
    cuStreamGetCaptureInfo(s: CUstream, st: P<u32>, id: P<u64>) => stream::get_capture_info(s, st, id, null_mut(), null_mut(), null_mut(), false);
    cuStreamGetCaptureInfo_ptsz(s: CUstream, st: P<u32>, id: P<u64>) => stream::get_capture_info(s, st, id, null_mut(), null_mut(), null_mut(), true);
    cuStreamGetCaptureInfo_v2(s: CUstream, st: P<u32>, id: P<u64>, g: P<CUgraph>, d: P<*const CUgraphNode>, n: P<usize>) => stream::get_capture_info(s, st, id, g, d, n, false);
    cuStreamGetCaptureInfo_v2_ptsz(s: CUstream, st: P<u32>, id: P<u64>, g: P<CUgraph>, d: P<*const CUgraphNode>, n: P<usize>) => stream::get_capture_info(s, st, id, g, d, n, true);
    cuStreamGetCaptureInfo_v3(s: CUstream, st: P<u32>, id: P<u64>, g: P<CUgraph>, d: P<*const CUgraphNode>, e: P<*const c_void>, n: P<usize>) => { crate::cptr::write_opt(e, std::ptr::null()); stream::get_capture_info(s, st, id, g, d, n, false) };
    cuStreamGetCaptureInfo_v3_ptsz(s: CUstream, st: P<u32>, id: P<u64>, g: P<CUgraph>, d: P<*const CUgraphNode>, e: P<*const c_void>, n: P<usize>) => { crate::cptr::write_opt(e, std::ptr::null()); stream::get_capture_info(s, st, id, g, d, n, true) };

    // --- events -------------------------------------------------------------------
    cuEventCreate(e: P<CUevent>, f: u32) => stream::event_create(e, f);
    cuEventDestroy(e: CUevent) => stream::event_destroy(e);
    cuEventDestroy_v2(e: CUevent) => stream::event_destroy(e);
    cuEventRecord(e: CUevent, s: CUstream) => stream::event_record(e, s, false);
    cuEventRecord_ptsz(e: CUevent, s: CUstream) => stream::event_record(e, s, true);
    cuEventRecordWithFlags(e: CUevent, s: CUstream, f: u32) => stream::event_record(e, s, false);
    cuEventRecordWithFlags_ptsz(e: CUevent, s: CUstream, f: u32) => stream::event_record(e, s, true);
    cuEventQuery(e: CUevent) => stream::event_query(e);
    cuEventSynchronize(e: CUevent) => stream::event_synchronize(e);
    cuEventElapsedTime(ms: P<f32>, a: CUevent, b: CUevent) => stream::event_elapsed_time(ms, a, b);
    cuEventElapsedTime_v2(ms: P<f32>, a: CUevent, b: CUevent) => stream::event_elapsed_time(ms, a, b);

    // --- modules, libraries, functions ------------------------------------------------
    cuModuleLoad(m: P<CUmodule>, f: Pc<c_char>) => module::load_file(m, f);
    cuModuleLoadData(m: P<CUmodule>, i: Pc<c_void>) => module::load_data(m, i);
    cuModuleLoadDataEx(m: P<CUmodule>, i: Pc<c_void>, n: u32, o: P<u32>, v: P<*mut c_void>) => module::load_data(m, i);
    cuModuleLoadFatBinary(m: P<CUmodule>, i: Pc<c_void>) => module::load_data(m, i);
    cuModuleUnload(m: CUmodule) => module::unload(m);
    cuModuleGetFunction(f: P<CUfunction>, m: CUmodule, n: Pc<c_char>) => module::get_function(f, m, n);
    cuModuleGetGlobal_v2(d: P<Dp>, b: P<usize>, m: CUmodule, n: Pc<c_char>) => module::get_global(d, b, m, n);
    cuLibraryLoadData(l: P<CUlibrary>, c: Pc<c_void>, jo: P<u32>, jv: P<*mut c_void>, nj: u32, lo: P<u32>, lv: P<*mut c_void>, nl: u32) => module::library_load(l, c);
    cuLibraryUnload(l: CUlibrary) => module::library_unload(l);
    cuLibraryGetKernel(k: P<CUkernel>, l: CUlibrary, n: Pc<c_char>) => module::library_get_kernel(k, l, n);
    cuKernelGetFunction(f: P<CUfunction>, k: CUkernel) => module::kernel_get_function(f, k);
    cuKernelGetAttribute(v: P<i32>, a: u32, k: CUkernel, d: CUdevice) => module::func_get_attribute(v, a, k);
    cuKernelSetAttribute(a: u32, v: i32, k: CUkernel, d: CUdevice) => module::func_set_attribute(k, a, v);
    cuFuncGetAttribute(v: P<i32>, a: u32, f: CUfunction) => module::func_get_attribute(v, a, f);
    cuFuncSetAttribute(f: CUfunction, a: u32, v: i32) => module::func_set_attribute(f, a, v);
    cuFuncSetCacheConfig(f: CUfunction, c: u32) => module::func_check(f);
    cuFuncSetSharedMemConfig(f: CUfunction, c: u32) => module::func_check(f);
    cuFuncGetName(n: P<*const c_char>, f: CUfunction) => module::func_get_name(n, f);
    cuOccupancyMaxActiveBlocksPerMultiprocessor(n: P<i32>, f: CUfunction, b: i32, s: usize) => module::occupancy_max_active_blocks(n, f, b, s);
    cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(n: P<i32>, f: CUfunction, b: i32, s: usize, fl: u32) => module::occupancy_max_active_blocks(n, f, b, s);
    cuOccupancyMaxPotentialBlockSize(g: P<i32>, b: P<i32>, f: CUfunction, cb: P<c_void>, s: usize, l: i32) => module::occupancy_max_potential_block_size(g, b, f, l);

    // --- launches -------------------------------------------------------------------
    cuLaunchKernel(f: CUfunction, gx: u32, gy: u32, gz: u32, bx: u32, by: u32, bz: u32, sm: u32, s: CUstream, p: P<*mut c_void>, e: P<*mut c_void>) => launch::launch_kernel(f, gx, gy, gz, bx, by, bz, sm, s, p, e, false);
    cuLaunchKernel_ptsz(f: CUfunction, gx: u32, gy: u32, gz: u32, bx: u32, by: u32, bz: u32, sm: u32, s: CUstream, p: P<*mut c_void>, e: P<*mut c_void>) => launch::launch_kernel(f, gx, gy, gz, bx, by, bz, sm, s, p, e, true);
    cuLaunchKernelEx(c: Pc<CUlaunchConfig>, f: CUfunction, p: P<*mut c_void>, e: P<*mut c_void>) => launch::launch_kernel_ex(c, f, p, e, false);
    cuLaunchKernelEx_ptsz(c: Pc<CUlaunchConfig>, f: CUfunction, p: P<*mut c_void>, e: P<*mut c_void>) => launch::launch_kernel_ex(c, f, p, e, true);
    cuLaunchCooperativeKernel(f: CUfunction, gx: u32, gy: u32, gz: u32, bx: u32, by: u32, bz: u32, sm: u32, s: CUstream, p: P<*mut c_void>) => launch::launch_kernel(f, gx, gy, gz, bx, by, bz, sm, s, p, null_mut(), false);
    cuLaunchCooperativeKernel_ptsz(f: CUfunction, gx: u32, gy: u32, gz: u32, bx: u32, by: u32, bz: u32, sm: u32, s: CUstream, p: P<*mut c_void>) => launch::launch_kernel(f, gx, gy, gz, bx, by, bz, sm, s, p, null_mut(), true);

    // --- graphs ---------------------------------------------------------------------
    cuGraphCreate(g: P<CUgraph>, f: u32) => graph::create(g, f);
    cuGraphDestroy(g: CUgraph) => graph::destroy(g);
    cuGraphAddKernelNode(n: P<CUgraphNode>, g: CUgraph, d: Pc<CUgraphNode>, nd: usize, p: Pc<CUDA_KERNEL_NODE_PARAMS>) => graph::add_kernel_node(n, g, p);
    cuGraphAddKernelNode_v2(n: P<CUgraphNode>, g: CUgraph, d: Pc<CUgraphNode>, nd: usize, p: Pc<CUDA_KERNEL_NODE_PARAMS_v2>) => graph::add_kernel_node(n, g, p as Pc<CUDA_KERNEL_NODE_PARAMS>);
    cuGraphAddEmptyNode(n: P<CUgraphNode>, g: CUgraph, d: Pc<CUgraphNode>, nd: usize) => graph::add_empty_node(n, g);
    cuGraphAddMemAllocNode(n: P<CUgraphNode>, g: CUgraph, d: Pc<CUgraphNode>, nd: usize, p: P<CUDA_MEM_ALLOC_NODE_PARAMS>) => graph::add_mem_alloc_node(n, g, p);
    cuGraphAddMemFreeNode(n: P<CUgraphNode>, g: CUgraph, d: Pc<CUgraphNode>, nd: usize, dp: Dp) => graph::add_mem_free_node(n, g, dp);
    cuGraphInstantiate(e: P<CUgraphExec>, g: CUgraph, en: P<CUgraphNode>, lb: P<c_char>, ls: usize) => graph::instantiate(e, g);
    cuGraphInstantiate_v2(e: P<CUgraphExec>, g: CUgraph, en: P<CUgraphNode>, lb: P<c_char>, ls: usize) => graph::instantiate(e, g);
    cuGraphInstantiateWithFlags(e: P<CUgraphExec>, g: CUgraph, f: u64) => graph::instantiate(e, g);
    cuGraphInstantiateWithParams(e: P<CUgraphExec>, g: CUgraph, p: P<c_void>) => graph::instantiate(e, g);
    cuGraphInstantiateWithParams_ptsz(e: P<CUgraphExec>, g: CUgraph, p: P<c_void>) => graph::instantiate(e, g);
    cuGraphExecDestroy(e: CUgraphExec) => graph::exec_destroy(e);
    cuGraphLaunch(e: CUgraphExec, s: CUstream) => graph::launch(e, s, false);
    cuGraphLaunch_ptsz(e: CUgraphExec, s: CUstream) => graph::launch(e, s, true);
    cuGraphUpload(e: CUgraphExec, s: CUstream) => ok();
    cuGraphUpload_ptsz(e: CUgraphExec, s: CUstream) => ok();
}

/// The old 32-bit-pointer entry points: exported so `dlsym` finds them, but
/// their `unsigned int` device pointers cannot hold simulated addresses.
mod legacy32 {
    super::super::cu_stubs!(
        cuMemAlloc, cuMemAllocPitch, cuMemFree, cuMemGetInfo, cuMemGetAddressRange, cuMemAllocHost, cuMemHostGetDevicePointer,
        cuDeviceTotalMem, cuModuleGetGlobal, cuMemcpyHtoD, cuMemcpyDtoH, cuMemcpyDtoD, cuMemcpyHtoDAsync, cuMemcpyDtoHAsync,
        cuMemcpyDtoDAsync, cuMemsetD8, cuMemsetD16, cuMemsetD32, cuMemsetD2D8, cuMemsetD2D16, cuMemsetD2D32, cuArrayCreate,
        cuArrayGetDescriptor, cuArray3DCreate, cuArray3DGetDescriptor, cuMemcpy2D, cuMemcpy2DUnaligned, cuMemcpy2DAsync,
    );
}
