//! Enum values and flag bits of the driver API. C enums are `int`-sized; they
//! are `c_uint` here except where the C type is a signed `int` parameter.

use core::ffi::c_uint;

// --- CUarray_format -------------------------------------------------------
pub const CU_AD_FORMAT_UNSIGNED_INT8: c_uint = 0x01;
pub const CU_AD_FORMAT_UNSIGNED_INT16: c_uint = 0x02;
pub const CU_AD_FORMAT_UNSIGNED_INT32: c_uint = 0x03;
pub const CU_AD_FORMAT_SIGNED_INT8: c_uint = 0x08;
pub const CU_AD_FORMAT_SIGNED_INT16: c_uint = 0x09;
pub const CU_AD_FORMAT_SIGNED_INT32: c_uint = 0x0a;
pub const CU_AD_FORMAT_HALF: c_uint = 0x10;
pub const CU_AD_FORMAT_FLOAT: c_uint = 0x20;
pub const CU_AD_FORMAT_NV12: c_uint = 0xb0;
pub const CU_AD_FORMAT_UNORM_INT8X1: c_uint = 0xc0;
pub const CU_AD_FORMAT_UNORM_INT8X2: c_uint = 0xc1;
pub const CU_AD_FORMAT_UNORM_INT8X4: c_uint = 0xc2;
pub const CU_AD_FORMAT_UNORM_INT16X1: c_uint = 0xc3;
pub const CU_AD_FORMAT_UNORM_INT16X2: c_uint = 0xc4;
pub const CU_AD_FORMAT_UNORM_INT16X4: c_uint = 0xc5;
pub const CU_AD_FORMAT_SNORM_INT8X1: c_uint = 0xc6;
pub const CU_AD_FORMAT_SNORM_INT8X2: c_uint = 0xc7;
pub const CU_AD_FORMAT_SNORM_INT8X4: c_uint = 0xc8;
pub const CU_AD_FORMAT_SNORM_INT16X1: c_uint = 0xc9;
pub const CU_AD_FORMAT_SNORM_INT16X2: c_uint = 0xca;
pub const CU_AD_FORMAT_SNORM_INT16X4: c_uint = 0xcb;

/// Bytes of one channel of one element of `format`, or `None` for formats
/// that are not simple per-channel formats (block-compressed, planar video).
/// An element is this times `NumChannels` bytes.
pub const fn array_format_bytes(format: c_uint) -> Option<u32> {
    Some(match format {
        CU_AD_FORMAT_UNSIGNED_INT8 | CU_AD_FORMAT_SIGNED_INT8 => 1,
        CU_AD_FORMAT_UNSIGNED_INT16 | CU_AD_FORMAT_SIGNED_INT16 | CU_AD_FORMAT_HALF => 2,
        CU_AD_FORMAT_UNSIGNED_INT32 | CU_AD_FORMAT_SIGNED_INT32 | CU_AD_FORMAT_FLOAT => 4,
        // The NORM formats carry their channel count in the name; with
        // NumChannels = 1 they are this many bytes per element.
        CU_AD_FORMAT_UNORM_INT8X1 | CU_AD_FORMAT_SNORM_INT8X1 => 1,
        CU_AD_FORMAT_UNORM_INT8X2 | CU_AD_FORMAT_SNORM_INT8X2 => 2,
        CU_AD_FORMAT_UNORM_INT8X4 | CU_AD_FORMAT_SNORM_INT8X4 => 4,
        CU_AD_FORMAT_UNORM_INT16X1 | CU_AD_FORMAT_SNORM_INT16X1 => 2,
        CU_AD_FORMAT_UNORM_INT16X2 | CU_AD_FORMAT_SNORM_INT16X2 => 4,
        CU_AD_FORMAT_UNORM_INT16X4 | CU_AD_FORMAT_SNORM_INT16X4 => 8,
        // NV12 is 8-bit luma plus half-size chroma; callers size it as 1 byte
        // per element and 1.5x height.
        CU_AD_FORMAT_NV12 => 1,
        _ => return None,
    })
}

pub const CUDA_ARRAY3D_LAYERED: c_uint = 0x01;
pub const CUDA_ARRAY3D_SURFACE_LDST: c_uint = 0x02;
pub const CUDA_ARRAY3D_CUBEMAP: c_uint = 0x04;
pub const CUDA_ARRAY3D_TEXTURE_GATHER: c_uint = 0x08;
pub const CUDA_ARRAY3D_SPARSE: c_uint = 0x40;

// --- CUmemorytype ---------------------------------------------------------
pub const CU_MEMORYTYPE_HOST: c_uint = 0x01;
pub const CU_MEMORYTYPE_DEVICE: c_uint = 0x02;
pub const CU_MEMORYTYPE_ARRAY: c_uint = 0x03;
pub const CU_MEMORYTYPE_UNIFIED: c_uint = 0x04;

// --- CUmemLocationType ----------------------------------------------------
pub const CU_MEM_LOCATION_TYPE_INVALID: c_uint = 0x0;
/// CUDA 13: no preferred location (a managed memory pool's location).
pub const CU_MEM_LOCATION_TYPE_NONE: c_uint = 0x0;
pub const CU_MEM_LOCATION_TYPE_DEVICE: c_uint = 0x1;
pub const CU_MEM_LOCATION_TYPE_HOST: c_uint = 0x2;
pub const CU_MEM_LOCATION_TYPE_HOST_NUMA: c_uint = 0x3;
pub const CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT: c_uint = 0x4;
/// CUDA 13.2: what the driver reports for memory that is "not visible but
/// device is accessible" (id `CU_DEVICE_INVALID`).
pub const CU_MEM_LOCATION_TYPE_INVISIBLE: c_uint = 0x5;
/// CUDA 13.4: a portion of a device's memory, one locality domain: the
/// location's `id` word is then `{ deviceId: u8, localityDomainId: u8, .. }`
/// ([`CUmemLocation::localized_device`]). On a device with one locality
/// domain, domain 0 is the whole device.
pub const CU_MEM_LOCATION_TYPE_DEVICE_LOCALITY_DOMAIN: c_uint = 0x6;

// --- Green contexts (CUDA 12.4+) ----------------------------------------------
pub const CU_DEV_RESOURCE_TYPE_SM: c_uint = 1;
/// `cuGreenCtxCreate` flag: the green context gets a default stream.
pub const CU_GREEN_CTX_DEFAULT_STREAM: c_uint = 0x1;

// --- CUmemAllocationHandleType (bit set) -----------------------------------
pub const CU_MEM_HANDLE_TYPE_NONE: c_uint = 0x0;
pub const CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: c_uint = 0x1;
pub const CU_MEM_HANDLE_TYPE_WIN32: c_uint = 0x2;
pub const CU_MEM_HANDLE_TYPE_WIN32_KMT: c_uint = 0x4;
pub const CU_MEM_HANDLE_TYPE_FABRIC: c_uint = 0x8;

// --- Sparse arrays (cuMemMapArrayAsync) -----------------------------------
/// `CUresourcetype`: the resource of a `CUarrayMapInfo`.
pub const CU_RESOURCE_TYPE_ARRAY: c_uint = 0x0;
pub const CU_RESOURCE_TYPE_MIPMAPPED_ARRAY: c_uint = 0x1;
/// `CUarraySparseSubresourceType`.
pub const CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_SPARSE_LEVEL: c_uint = 0x0;
pub const CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_MIPTAIL: c_uint = 0x1;
/// `CUmemOperationType`.
pub const CU_MEM_OPERATION_TYPE_MAP: c_uint = 0x1;
pub const CU_MEM_OPERATION_TYPE_UNMAP: c_uint = 0x2;
/// `CUmemHandleType` (the kind of `CUarrayMapInfo::memHandle`; not the
/// `CUmemAllocationHandleType` bits above).
pub const CU_MEM_HANDLE_TYPE_GENERIC: c_uint = 0x0;
/// `CUmemAllocationProp::allocFlags::usage` bit: the handle may back
/// sparse array tiles (`cuMemMapArrayAsync` requires it).
pub const CU_MEM_CREATE_USAGE_TILE_POOL: u16 = 0x1;

// --- CUmemAllocationType --------------------------------------------------
pub const CU_MEM_ALLOCATION_TYPE_INVALID: c_uint = 0x0;
pub const CU_MEM_ALLOCATION_TYPE_PINNED: c_uint = 0x1;
/// CUDA 13: a memory pool of managed memory (`cuMemPoolCreate`); its
/// location is only a preference (DEVICE, HOST or NONE).
pub const CU_MEM_ALLOCATION_TYPE_MANAGED: c_uint = 0x2;

// --- CUmemAllocationGranularity_flags / CUmulticastGranularity_flags -------
pub const CU_MEM_ALLOC_GRANULARITY_MINIMUM: c_uint = 0x0;
pub const CU_MEM_ALLOC_GRANULARITY_RECOMMENDED: c_uint = 0x1;
pub const CU_MULTICAST_GRANULARITY_MINIMUM: c_uint = 0x0;
pub const CU_MULTICAST_GRANULARITY_RECOMMENDED: c_uint = 0x1;

// --- CUmemAccess_flags ----------------------------------------------------
pub const CU_MEM_ACCESS_FLAGS_PROT_NONE: c_uint = 0x0;
pub const CU_MEM_ACCESS_FLAGS_PROT_READ: c_uint = 0x1;
pub const CU_MEM_ACCESS_FLAGS_PROT_READWRITE: c_uint = 0x3;

// --- CUmemAttach_flags (cuMemAllocManaged) ---------------------------------
pub const CU_MEM_ATTACH_GLOBAL: c_uint = 0x1;
pub const CU_MEM_ATTACH_HOST: c_uint = 0x2;
pub const CU_MEM_ATTACH_SINGLE: c_uint = 0x4;

// --- cuMemHostAlloc / cuMemHostRegister flags -------------------------------
pub const CU_MEMHOSTALLOC_PORTABLE: c_uint = 0x01;
pub const CU_MEMHOSTALLOC_DEVICEMAP: c_uint = 0x02;
pub const CU_MEMHOSTALLOC_WRITECOMBINED: c_uint = 0x04;
pub const CU_MEMHOSTREGISTER_PORTABLE: c_uint = 0x01;
pub const CU_MEMHOSTREGISTER_DEVICEMAP: c_uint = 0x02;
pub const CU_MEMHOSTREGISTER_IOMEMORY: c_uint = 0x04;
pub const CU_MEMHOSTREGISTER_READ_ONLY: c_uint = 0x08;

/// `CUipcMem_flags`.
pub const CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS: c_uint = 0x1;

// --- CUpointer_attribute --------------------------------------------------
pub const CU_POINTER_ATTRIBUTE_CONTEXT: c_uint = 1;
pub const CU_POINTER_ATTRIBUTE_MEMORY_TYPE: c_uint = 2;
pub const CU_POINTER_ATTRIBUTE_DEVICE_POINTER: c_uint = 3;
pub const CU_POINTER_ATTRIBUTE_HOST_POINTER: c_uint = 4;
pub const CU_POINTER_ATTRIBUTE_P2P_TOKENS: c_uint = 5;
pub const CU_POINTER_ATTRIBUTE_SYNC_MEMOPS: c_uint = 6;
pub const CU_POINTER_ATTRIBUTE_BUFFER_ID: c_uint = 7;
pub const CU_POINTER_ATTRIBUTE_IS_MANAGED: c_uint = 8;
pub const CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: c_uint = 9;
pub const CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: c_uint = 10;
pub const CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: c_uint = 11;
pub const CU_POINTER_ATTRIBUTE_RANGE_SIZE: c_uint = 12;
pub const CU_POINTER_ATTRIBUTE_MAPPED: c_uint = 13;
pub const CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES: c_uint = 14;
pub const CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE: c_uint = 15;
pub const CU_POINTER_ATTRIBUTE_ACCESS_FLAGS: c_uint = 16;
pub const CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE: c_uint = 17;
pub const CU_POINTER_ATTRIBUTE_MAPPING_SIZE: c_uint = 18;
pub const CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR: c_uint = 19;
pub const CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID: c_uint = 20;

// --- CUmemPool_attribute --------------------------------------------------
pub const CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES: c_uint = 1;
pub const CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC: c_uint = 2;
pub const CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: c_uint = 3;
/// `cuuint64_t`: bytes the pool keeps reserved across synchronisations.
pub const CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: c_uint = 4;
/// `cuuint64_t`: device memory currently reserved by the pool.
pub const CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: c_uint = 5;
pub const CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: c_uint = 6;
/// `cuuint64_t`: bytes of the reservation handed out to allocations.
pub const CU_MEMPOOL_ATTR_USED_MEM_CURRENT: c_uint = 7;
pub const CU_MEMPOOL_ATTR_USED_MEM_HIGH: c_uint = 8;

// --- CUstreamCaptureStatus ----------------------------------------------
/// `CUstreamCaptureStatus`: not capturing.
pub const CU_STREAM_CAPTURE_STATUS_NONE: c_uint = 0;
/// `CUstreamCaptureStatus`: capturing.
pub const CU_STREAM_CAPTURE_STATUS_ACTIVE: c_uint = 1;
/// `CUstreamCaptureStatus`: capturing, but invalidated (must be ended).
pub const CU_STREAM_CAPTURE_STATUS_INVALIDATED: c_uint = 2;

// --- CUstreamCaptureMode ------------------------------------------------
/// `CUstreamCaptureMode`: potentially unsafe calls are refused in the
/// capturing thread and, for this mode's captures, in every thread in the
/// global mode (every thread's default).
pub const CU_STREAM_CAPTURE_MODE_GLOBAL: c_uint = 0;
/// `CUstreamCaptureMode`: potentially unsafe calls are refused in the capturing thread only.
pub const CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: c_uint = 1;
/// `CUstreamCaptureMode`: no call is refused for being potentially unsafe.
pub const CU_STREAM_CAPTURE_MODE_RELAXED: c_uint = 2;

// --- CUgraphMem_attribute -------------------------------------------------
pub const CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT: c_uint = 0;
pub const CU_GRAPH_MEM_ATTR_USED_MEM_HIGH: c_uint = 1;
pub const CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT: c_uint = 2;
pub const CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH: c_uint = 3;

// --- CUgraphNodeType (subset) ---------------------------------------------
pub const CU_GRAPH_NODE_TYPE_KERNEL: c_uint = 0;
pub const CU_GRAPH_NODE_TYPE_MEMCPY: c_uint = 1;
pub const CU_GRAPH_NODE_TYPE_MEMSET: c_uint = 2;
pub const CU_GRAPH_NODE_TYPE_HOST: c_uint = 3;
pub const CU_GRAPH_NODE_TYPE_GRAPH: c_uint = 4;
pub const CU_GRAPH_NODE_TYPE_EMPTY: c_uint = 5;
pub const CU_GRAPH_NODE_TYPE_MEM_ALLOC: c_uint = 10;
pub const CU_GRAPH_NODE_TYPE_MEM_FREE: c_uint = 11;

/// `CUDA_GRAPH_INSTANTIATE_FLAG_*`.
pub const CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH: u64 = 1;
pub const CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD: u64 = 2;
pub const CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH: u64 = 4;
pub const CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY: u64 = 8;

// --- CUdriverProcAddressQueryResult ----------------------------------------
pub const CU_GET_PROC_ADDRESS_SUCCESS: c_uint = 0;
pub const CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: c_uint = 1;
pub const CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT: c_uint = 2;

// --- CUdriverProcAddress_flags (`cuuint64_t flags` of cuGetProcAddress) -----
pub const CU_GET_PROC_ADDRESS_DEFAULT: u64 = 0;
pub const CU_GET_PROC_ADDRESS_LEGACY_STREAM: u64 = 1 << 0;
pub const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 1 << 1;

// --- CUctx_flags ----------------------------------------------------------
pub const CU_CTX_SCHED_AUTO: c_uint = 0x00;
pub const CU_CTX_SCHED_SPIN: c_uint = 0x01;
pub const CU_CTX_SCHED_YIELD: c_uint = 0x02;
pub const CU_CTX_SCHED_BLOCKING_SYNC: c_uint = 0x04;
pub const CU_CTX_SCHED_MASK: c_uint = 0x07;
pub const CU_CTX_MAP_HOST: c_uint = 0x08;
pub const CU_CTX_LMEM_RESIZE_TO_MAX: c_uint = 0x10;
pub const CU_CTX_COREDUMP_ENABLE: c_uint = 0x20;
pub const CU_CTX_USER_COREDUMP_ENABLE: c_uint = 0x40;
pub const CU_CTX_SYNC_MEMOPS: c_uint = 0x80;
pub const CU_CTX_FLAGS_MASK: c_uint = 0xFF;

// --- CUstream_flags / CUevent_flags / CUevent_record_flags -----------------
pub const CU_STREAM_DEFAULT: c_uint = 0x0;
pub const CU_STREAM_NON_BLOCKING: c_uint = 0x1;
pub const CU_EVENT_DEFAULT: c_uint = 0x0;
pub const CU_EVENT_BLOCKING_SYNC: c_uint = 0x1;
pub const CU_EVENT_DISABLE_TIMING: c_uint = 0x2;
pub const CU_EVENT_INTERPROCESS: c_uint = 0x4;
pub const CU_EVENT_RECORD_DEFAULT: c_uint = 0x0;
pub const CU_EVENT_RECORD_EXTERNAL: c_uint = 0x1;

// --- CUlimit --------------------------------------------------------------
pub const CU_LIMIT_STACK_SIZE: c_uint = 0x00;
pub const CU_LIMIT_PRINTF_FIFO_SIZE: c_uint = 0x01;
pub const CU_LIMIT_MALLOC_HEAP_SIZE: c_uint = 0x02;
pub const CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH: c_uint = 0x03;
pub const CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT: c_uint = 0x04;
pub const CU_LIMIT_MAX_L2_FETCH_GRANULARITY: c_uint = 0x05;
pub const CU_LIMIT_PERSISTING_L2_CACHE_SIZE: c_uint = 0x06;
pub const CU_LIMIT_SHMEM_SIZE: c_uint = 0x07;
pub const CU_LIMIT_CIG_ENABLED: c_uint = 0x08;
pub const CU_LIMIT_CIG_SHMEM_FALLBACK_ENABLED: c_uint = 0x09;

// --- CUfunction_attribute -------------------------------------------------
pub const CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: c_uint = 0;
pub const CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: c_uint = 1;
pub const CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES: c_uint = 2;
pub const CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: c_uint = 3;
pub const CU_FUNC_ATTRIBUTE_NUM_REGS: c_uint = 4;
pub const CU_FUNC_ATTRIBUTE_PTX_VERSION: c_uint = 5;
pub const CU_FUNC_ATTRIBUTE_BINARY_VERSION: c_uint = 6;
pub const CU_FUNC_ATTRIBUTE_CACHE_MODE_CA: c_uint = 7;
pub const CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: c_uint = 8;
pub const CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT: c_uint = 9;

// --- CUfunc_cache ---------------------------------------------------------
pub const CU_FUNC_CACHE_PREFER_NONE: c_uint = 0x00;
pub const CU_FUNC_CACHE_PREFER_SHARED: c_uint = 0x01;
pub const CU_FUNC_CACHE_PREFER_L1: c_uint = 0x02;
pub const CU_FUNC_CACHE_PREFER_EQUAL: c_uint = 0x03;

// --- CUdevice_P2PAttribute ------------------------------------------------
pub const CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK: c_uint = 0x01;
pub const CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED: c_uint = 0x02;
pub const CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED: c_uint = 0x03;
pub const CU_DEVICE_P2P_ATTRIBUTE_CUDA_ARRAY_ACCESS_SUPPORTED: c_uint = 0x04;

// --- CUlaunchAttributeID (subset) ------------------------------------------
pub const CU_LAUNCH_ATTRIBUTE_IGNORE: c_uint = 0;
pub const CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW: c_uint = 1;
pub const CU_LAUNCH_ATTRIBUTE_COOPERATIVE: c_uint = 2;
pub const CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY: c_uint = 3;
pub const CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION: c_uint = 4;
pub const CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE: c_uint = 5;
pub const CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION: c_uint = 6;
pub const CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT: c_uint = 7;
pub const CU_LAUNCH_ATTRIBUTE_PRIORITY: c_uint = 8;
pub const CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP: c_uint = 9;
pub const CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN: c_uint = 10;
pub const CU_LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT: c_uint = 12;

/// `CU_LAUNCH_PARAM_END`, `CU_LAUNCH_PARAM_BUFFER_POINTER`,
/// `CU_LAUNCH_PARAM_BUFFER_SIZE` as the integers the `extra` array holds.
pub const CU_LAUNCH_PARAM_END_AS_INT: usize = 0x00;
pub const CU_LAUNCH_PARAM_BUFFER_POINTER_AS_INT: usize = 0x01;
pub const CU_LAUNCH_PARAM_BUFFER_SIZE_AS_INT: usize = 0x02;

/// `CUjit_option` values the simulator reads from `cuModuleLoadDataEx`.
pub const CU_JIT_INFO_LOG_BUFFER: c_uint = 3;
pub const CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES: c_uint = 4;
pub const CU_JIT_ERROR_LOG_BUFFER: c_uint = 5;
pub const CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES: c_uint = 6;
