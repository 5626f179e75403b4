//! One allocation of each family, and how to free it.

use crate::common::Cuda;
use egpu_cuda::*;
use egpu_workloads::api::CallError;
use egpu_workloads::call;
use std::ffi::c_void;

/// What `egpu-probe alloc --family` allocates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Mem,
    Pitch,
    Managed,
    Array,
    Mipmap,
    Async,
    Pool,
    /// A CUDA 13 managed memory pool with no preferred location.
    ManagedPool,
    /// A device's default pool (`cuDeviceGetDefaultMemPool`), never created
    /// by the program: of `alloc --pool-device`, else of the context's device.
    DefaultPool,
    Vmm,
    Multicast,
    Graph,
    /// A graph instantiated through the CUDA 10 `cuGraphInstantiate` export.
    Graph10,
    /// A graph with an allocation node and no free node: its allocation
    /// outlives the graph (freeing destroys the graph and its executable;
    /// the allocation lives until the process ends).
    GraphKeep,
    /// `cuMemAllocFromPoolAsync` from the run's pool on a stream being
    /// captured: the allocation is the captured graph's, which is
    /// instantiated and launched and keeps it (freed with `cuMemFree`).
    CapturedPool,
    Ctx,
    /// Host memory (`cuMemAllocHost`): never charged.
    Host,
    /// `cuMemCreate` located on the host: never charged.
    HostVmm,
}

impl std::str::FromStr for Family {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "mem" => Family::Mem,
            "pitch" => Family::Pitch,
            "managed" => Family::Managed,
            "array" => Family::Array,
            "mipmap" => Family::Mipmap,
            "async" => Family::Async,
            "pool" => Family::Pool,
            "managedpool" => Family::ManagedPool,
            "defaultpool" => Family::DefaultPool,
            "vmm" => Family::Vmm,
            "multicast" => Family::Multicast,
            "graph" => Family::Graph,
            "graph10" => Family::Graph10,
            "graphkeep" => Family::GraphKeep,
            "capturedpool" => Family::CapturedPool,
            "ctx" => Family::Ctx,
            "host" => Family::Host,
            "hostvmm" => Family::HostVmm,
            _ => return Err(format!("unknown family '{s}': mem pitch managed array mipmap async pool managedpool defaultpool vmm multicast graph graph10 graphkeep capturedpool ctx host hostvmm")),
        })
    }
}

impl Family {
    pub fn name(self) -> &'static str {
        match self {
            Family::Mem => "mem",
            Family::Pitch => "pitch",
            Family::Managed => "managed",
            Family::Array => "array",
            Family::Mipmap => "mipmap",
            Family::Async => "async",
            Family::Pool => "pool",
            Family::ManagedPool => "managedpool",
            Family::DefaultPool => "defaultpool",
            Family::Vmm => "vmm",
            Family::Multicast => "multicast",
            Family::Graph => "graph",
            Family::Graph10 => "graph10",
            Family::GraphKeep => "graphkeep",
            Family::CapturedPool => "capturedpool",
            Family::Ctx => "ctx",
            Family::Host => "host",
            Family::HostVmm => "hostvmm",
        }
    }
}

/// A live allocation.
pub enum Held {
    Ptr(CUdeviceptr),
    Async(CUdeviceptr),
    Array(CUarray),
    Mipmap(CUmipmappedArray),
    Vmm { va: CUdeviceptr, size: usize },
    Physical(CUmemGenericAllocationHandle),
    Graph { graph: CUgraph, exec: CUgraphExec },
    /// A captured graph and the allocation it made and keeps.
    Captured { graph: CUgraph, exec: CUgraphExec, dptr: CUdeviceptr },
    Ctx(CUcontext),
    Host(*mut c_void),
}

/// State shared by allocations of one run (the explicit pool).
#[derive(Default)]
pub struct Ctx {
    pub pool: Option<CUmemoryPool>,
    pub stream: CUstream,
    /// `alloc --pool-device`: whose default pool `defaultpool` uses.
    pub pool_device: Option<CUdevice>,
    /// `--ptds`: stream 0 is the per-thread default stream (`capturedpool`
    /// captures on it).
    pub per_thread: bool,
}

const ARRAY_WIDTH: usize = 4096;

/// `--locality-domain`: device memory locations are written as CUDA 13.4's
/// `DEVICE_LOCALITY_DOMAIN`, domain 0 (the whole device on a device with one
/// domain), instead of `DEVICE`.
pub static LOCALITY_DOMAIN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn device_location(dev: CUdevice) -> CUmemLocation {
    match u8::try_from(dev) {
        Ok(d) if LOCALITY_DOMAIN.load(std::sync::atomic::Ordering::Relaxed) => CUmemLocation::localized(d, 0),
        _ => CUmemLocation { type_: CU_MEM_LOCATION_TYPE_DEVICE, id: dev },
    }
}

fn device_prop(dev: CUdevice, host: bool) -> CUmemAllocationProp {
    CUmemAllocationProp {
        type_: CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: CU_MEM_HANDLE_TYPE_NONE,
        location: if host { CUmemLocation { type_: CU_MEM_LOCATION_TYPE_HOST, id: 0 } } else { device_location(dev) },
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: Default::default(),
    }
}

fn pool_props(dev: CUdevice) -> CUmemPoolProps {
    CUmemPoolProps {
        allocType: CU_MEM_ALLOCATION_TYPE_PINNED,
        handleTypes: CU_MEM_HANDLE_TYPE_NONE,
        location: device_location(dev),
        win32SecurityAttributes: std::ptr::null_mut(),
        maxSize: 0,
        usage: 0,
        reserved: [0; 54],
    }
}

/// Rounds `size` up to the VMM granularity of `prop`.
fn granular(cu: &Cuda, size: usize, prop: &CUmemAllocationProp) -> Result<usize, CallError> {
    let mut g: usize = 0;
    call!(cu.api, cuMemGetAllocationGranularity(&mut g, prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM))?;
    let g = g.max(1);
    Ok(size.div_ceil(g) * g)
}

/// The bytes one allocation of `size` is expected to be charged (0: never charged or unknown).
pub fn expected_bytes(f: Family, size: usize) -> u64 {
    match f {
        Family::Host | Family::HostVmm | Family::Ctx => 0,
        Family::Array => (ARRAY_WIDTH * 4 * (size / (ARRAY_WIDTH * 4)).max(1)) as u64,
        Family::Mipmap => {
            let h = (size / (ARRAY_WIDTH * 4)).max(1);
            (ARRAY_WIDTH * h * 4 + (ARRAY_WIDTH / 2) * (h / 2).max(1) * 4) as u64
        }
        _ => size as u64,
    }
}

/// Allocates one `size`-byte object of family `f`.
pub fn alloc(cu: &Cuda, st: &mut Ctx, f: Family, size: usize) -> Result<Held, CallError> {
    let a = &cu.api;
    let mut p: CUdeviceptr = 0;
    Ok(match f {
        Family::Mem => {
            call!(a, cuMemAlloc_v2(&mut p, size))?;
            Held::Ptr(p)
        }
        Family::Pitch => {
            let mut pitch = 0usize;
            let height = 16usize;
            call!(a, cuMemAllocPitch_v2(&mut p, &mut pitch, size / height, height, 4))?;
            Held::Ptr(p)
        }
        Family::Managed => {
            call!(a, cuMemAllocManaged(&mut p, size, CU_MEM_ATTACH_GLOBAL))?;
            Held::Ptr(p)
        }
        Family::Array => {
            let d = CUDA_ARRAY_DESCRIPTOR { Width: ARRAY_WIDTH, Height: (size / (ARRAY_WIDTH * 4)).max(1), Format: CU_AD_FORMAT_UNSIGNED_INT8, NumChannels: 4 };
            let mut h: CUarray = std::ptr::null_mut();
            call!(a, cuArrayCreate_v2(&mut h, &d))?;
            Held::Array(h)
        }
        Family::Mipmap => {
            let d = CUDA_ARRAY3D_DESCRIPTOR { Width: ARRAY_WIDTH, Height: (size / (ARRAY_WIDTH * 4)).max(1), Depth: 0, Format: CU_AD_FORMAT_UNSIGNED_INT8, NumChannels: 4, Flags: 0 };
            let mut h: CUmipmappedArray = std::ptr::null_mut();
            call!(a, cuMipmappedArrayCreate(&mut h, &d, 2))?;
            Held::Mipmap(h)
        }
        Family::Async => {
            call!(a, cuMemAllocAsync(&mut p, size, st.stream))?;
            call!(a, cuStreamSynchronize(st.stream))?;
            Held::Async(p)
        }
        Family::Pool | Family::ManagedPool | Family::DefaultPool | Family::CapturedPool => {
            let pool = match st.pool {
                Some(pl) => pl,
                None if f == Family::DefaultPool => {
                    let mut pl: CUmemoryPool = std::ptr::null_mut();
                    call!(a, cuDeviceGetDefaultMemPool(&mut pl, st.pool_device.unwrap_or(cu.dev)))?;
                    pl
                }
                None => {
                    let mut props = pool_props(cu.dev);
                    if f == Family::ManagedPool {
                        props.allocType = CU_MEM_ALLOCATION_TYPE_MANAGED;
                        props.location = CUmemLocation { type_: CU_MEM_LOCATION_TYPE_NONE, id: 0 };
                    }
                    let mut pl: CUmemoryPool = std::ptr::null_mut();
                    call!(a, cuMemPoolCreate(&mut pl, &props))?;
                    st.pool = Some(pl);
                    pl
                }
            };
            if f == Family::CapturedPool {
                return captured(cu, st, pool, size);
            }
            call!(a, cuMemAllocFromPoolAsync(&mut p, size, pool, st.stream))?;
            call!(a, cuStreamSynchronize(st.stream))?;
            Held::Async(p)
        }
        Family::Vmm => {
            let prop = device_prop(cu.dev, false);
            let size = granular(cu, size, &prop)?;
            let mut h: CUmemGenericAllocationHandle = 0;
            call!(a, cuMemCreate(&mut h, size, &prop, 0))?;
            let mut va: CUdeviceptr = 0;
            if let Err(e) = call!(a, cuMemAddressReserve(&mut va, size, 0, 0, 0)) {
                let _ = call!(a, cuMemRelease(h));
                return Err(e);
            }
            call!(a, cuMemMap(va, size, 0, h, 0))?;
            // Like PyTorch's expandable segments: the mapping keeps the memory; drop the handle.
            call!(a, cuMemRelease(h))?;
            let access = CUmemAccessDesc { location: prop.location, flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
            call!(a, cuMemSetAccess(va, size, &access, 1))?;
            // A retained reference is never a new charge.
            let mut r: CUmemGenericAllocationHandle = 0;
            call!(a, cuMemRetainAllocationHandle(&mut r, va as *mut c_void))?;
            call!(a, cuMemRelease(r))?;
            Held::Vmm { va, size }
        }
        Family::HostVmm => {
            let prop = device_prop(cu.dev, true);
            let size = granular(cu, size, &prop)?;
            let mut h: CUmemGenericAllocationHandle = 0;
            call!(a, cuMemCreate(&mut h, size, &prop, 0))?;
            Held::Physical(h)
        }
        Family::Multicast => {
            let mut prop = CUmulticastObjectProp { numDevices: 1, size, handleTypes: 0, flags: 0 };
            let mut g = 0usize;
            if call!(a, cuMulticastGetGranularity(&mut g, &prop, CU_MULTICAST_GRANULARITY_MINIMUM)).is_ok() && g > 0 {
                prop.size = size.div_ceil(g) * g;
            }
            let mut h: CUmemGenericAllocationHandle = 0;
            call!(a, cuMulticastCreate(&mut h, &prop))?;
            let _ = call!(a, cuMulticastAddDevice(h, cu.dev));
            Held::Physical(h)
        }
        Family::Graph | Family::Graph10 | Family::GraphKeep => {
            let mut g: CUgraph = std::ptr::null_mut();
            call!(a, cuGraphCreate(&mut g, 0))?;
            let mut params = CUDA_MEM_ALLOC_NODE_PARAMS { poolProps: pool_props(cu.dev), accessDescs: std::ptr::null(), accessDescCount: 0, bytesize: size, dptr: 0 };
            let mut node: CUgraphNode = std::ptr::null_mut();
            let mut free_node: CUgraphNode = std::ptr::null_mut();
            let mut exec: CUgraphExec = std::ptr::null_mut();
            let r = call!(a, cuGraphAddMemAllocNode(&mut node, g, std::ptr::null(), 0, &mut params))
                .and_then(|_| if f == Family::GraphKeep { Ok(()) } else { call!(a, cuGraphAddMemFreeNode(&mut free_node, g, &node, 1, params.dptr)) })
                .and_then(|_| match f {
                    Family::Graph10 => call!(a, cuGraphInstantiate(&mut exec, g, std::ptr::null_mut(), std::ptr::null_mut(), 0)),
                    _ => call!(a, cuGraphInstantiateWithFlags(&mut exec, g, 0)),
                });
            if let Err(e) = r {
                let _ = call!(a, cuGraphDestroy(g));
                return Err(e);
            }
            call!(a, cuGraphLaunch(exec, st.stream))?;
            call!(a, cuStreamSynchronize(st.stream))?;
            Held::Graph { graph: g, exec }
        }
        Family::Ctx => {
            let mut c: CUcontext = std::ptr::null_mut();
            let r = call!(a, cuCtxCreate_v2(&mut c, 0, cu.dev));
            let _ = call!(a, cuCtxSetCurrent(cu.ctx));
            r?;
            Held::Ctx(c)
        }
        Family::Host => {
            let mut h: *mut c_void = std::ptr::null_mut();
            call!(a, cuMemAllocHost_v2(&mut h, size))?;
            Held::Host(h)
        }
    })
}

/// [`Family::CapturedPool`]: the allocation captured into a graph, which is
/// instantiated (where the graph's memory is charged) and launched.
fn captured(cu: &Cuda, st: &Ctx, pool: CUmemoryPool, size: usize) -> Result<Held, CallError> {
    let a = &cu.api;
    let mut p: CUdeviceptr = 0;
    let mut graph: CUgraph = std::ptr::null_mut();
    // A stream of its own: the legacy default stream cannot be captured. With
    // --ptds, stream 0: the per-thread default stream, which can.
    let mut s: CUstream = std::ptr::null_mut();
    if !st.per_thread {
        call!(a, cuStreamCreate(&mut s, CU_STREAM_NON_BLOCKING))?;
    }
    let made = call!(a, cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_RELAXED)).and_then(|_| {
        let made = call!(a, cuMemAllocFromPoolAsync(&mut p, size, pool, s));
        call!(a, cuStreamEndCapture(s, &mut graph)).and(made)
    });
    if !st.per_thread {
        let _ = call!(a, cuStreamDestroy_v2(s));
    }
    if let Err(e) = made {
        if !graph.is_null() {
            let _ = call!(a, cuGraphDestroy(graph));
        }
        return Err(e);
    }
    let mut exec: CUgraphExec = std::ptr::null_mut();
    if let Err(e) = call!(a, cuGraphInstantiateWithFlags(&mut exec, graph, 0)) {
        let _ = call!(a, cuGraphDestroy(graph));
        return Err(e);
    }
    call!(a, cuGraphLaunch(exec, st.stream))?;
    call!(a, cuStreamSynchronize(st.stream))?;
    Ok(Held::Captured { graph, exec, dptr: p })
}

/// Frees one allocation.
pub fn free(cu: &Cuda, st: &Ctx, h: Held) -> Result<(), CallError> {
    let a = &cu.api;
    match h {
        Held::Ptr(p) => call!(a, cuMemFree_v2(p)),
        Held::Async(p) => call!(a, cuMemFreeAsync(p, st.stream)).and_then(|_| call!(a, cuStreamSynchronize(st.stream))),
        Held::Array(x) => call!(a, cuArrayDestroy(x)),
        Held::Mipmap(x) => call!(a, cuMipmappedArrayDestroy(x)),
        Held::Vmm { va, size } => call!(a, cuMemUnmap(va, size)).and_then(|_| call!(a, cuMemAddressFree(va, size))),
        Held::Physical(x) => call!(a, cuMemRelease(x)),
        Held::Graph { graph, exec } => call!(a, cuGraphExecDestroy(exec)).and_then(|_| call!(a, cuGraphDestroy(graph))),
        Held::Captured { graph, exec, dptr } => call!(a, cuMemFree_v2(dptr)).and_then(|_| call!(a, cuGraphExecDestroy(exec))).and_then(|_| call!(a, cuGraphDestroy(graph))),
        Held::Ctx(c) => call!(a, cuCtxDestroy_v2(c)),
        Held::Host(p) => call!(a, cuMemFreeHost(p)),
    }
}

/// Frees per-run state (the explicit pool).
pub fn finish(cu: &Cuda, st: &mut Ctx) {
    if let Some(p) = st.pool.take() {
        let _ = call!(cu.api, cuMemPoolDestroy(p));
    }
}
