//! Scalar and handle types, and the `#[repr(C)]` structs of the driver API.
//!
//! Field names follow the C headers (hence `non_snake_case`), except that the
//! C field `type` is spelled `type_`.

use core::ffi::{c_char, c_int, c_uint, c_void};

/// A device ordinal (`CUdevice`).
pub type CUdevice = c_int;
/// A device address (`CUdeviceptr`, 64-bit on every supported platform).
pub type CUdeviceptr = u64;

/// `CU_DEVICE_CPU`: the host, where a device ordinal is expected.
pub const CU_DEVICE_CPU: CUdevice = -1;
/// `CU_DEVICE_INVALID`.
pub const CU_DEVICE_INVALID: CUdevice = -2;

/// Opaque handle types. The driver never lets callers look inside them, so they
/// are untyped pointers here; the simulated driver and the hook both treat them
/// as plain tokens.
pub type CUcontext = *mut c_void;
pub type CUstream = *mut c_void;
pub type CUevent = *mut c_void;
pub type CUmodule = *mut c_void;
pub type CUfunction = *mut c_void;
pub type CUarray = *mut c_void;
pub type CUmipmappedArray = *mut c_void;
pub type CUmemoryPool = *mut c_void;
pub type CUgraph = *mut c_void;
pub type CUgraphExec = *mut c_void;
pub type CUgraphNode = *mut c_void;
pub type CUlinkState = *mut c_void;
pub type CUlibrary = *mut c_void;
pub type CUkernel = *mut c_void;
pub type CUtexref = *mut c_void;
pub type CUsurfref = *mut c_void;
/// A green context (CUDA 12.4+): a context on part of a device's SMs, which
/// retains the device's primary context while it lives.
pub type CUgreenCtx = *mut c_void;
/// A resource descriptor for `cuGreenCtxCreate` (`cuDevResourceGenerateDesc`).
pub type CUdevResourceDesc = *mut c_void;
pub type CUhostFn = Option<unsafe extern "C" fn(user_data: *mut c_void)>;
/// A physical allocation made by `cuMemCreate` (a 64-bit token, not a pointer).
pub type CUmemGenericAllocationHandle = u64;
/// `CUtexObject` / `CUsurfObject`.
pub type CUtexObject = u64;
pub type CUsurfObject = u64;

/// The legacy default stream (`CU_STREAM_LEGACY`, `(CUstream)0x1`).
pub const CU_STREAM_LEGACY: usize = 0x1;
/// The per-thread default stream (`CU_STREAM_PER_THREAD`, `(CUstream)0x2`).
pub const CU_STREAM_PER_THREAD: usize = 0x2;

/// Size of an IPC handle (`CU_IPC_HANDLE_SIZE`).
pub const CU_IPC_HANDLE_SIZE: usize = 64;

/// `CUuuid`: 16 raw bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CUuuid {
    pub bytes: [c_char; 16],
}
const _: () = assert!(size_of::<CUuuid>() == 16);

/// `CUipcMemHandle`: 64 opaque bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CUipcMemHandle {
    pub reserved: [c_char; CU_IPC_HANDLE_SIZE],
}
const _: () = assert!(size_of::<CUipcMemHandle>() == 64);

/// `CUipcEventHandle`: 64 opaque bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CUipcEventHandle {
    pub reserved: [c_char; CU_IPC_HANDLE_SIZE],
}
const _: () = assert!(size_of::<CUipcEventHandle>() == 64);

/// `CUmemFabricHandle`: 64 opaque bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CUmemFabricHandle {
    pub data: [u8; CU_IPC_HANDLE_SIZE],
}

/// `CUmemPoolPtrExportData`: 64 opaque bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CUmemPoolPtrExportData {
    pub reserved: [u8; 64],
}

/// `CUmemLocation`: where memory lives (`type_` is a `CU_MEM_LOCATION_TYPE_*`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CUmemLocation {
    pub type_: c_uint,
    pub id: c_int,
}
const _: () = assert!(size_of::<CUmemLocation>() == 8);

impl CUmemLocation {
    /// A `CU_MEM_LOCATION_TYPE_DEVICE_LOCALITY_DOMAIN` location (CUDA 13.4):
    /// device `dev`, locality domain `domain`.
    pub fn localized(dev: u8, domain: u8) -> Self {
        CUmemLocation { type_: crate::CU_MEM_LOCATION_TYPE_DEVICE_LOCALITY_DOMAIN, id: c_int::from_ne_bytes([dev, domain, 0, 0]) }
    }

    /// The device ordinal of a `CU_MEM_LOCATION_TYPE_DEVICE_LOCALITY_DOMAIN`
    /// location: the first byte of the `id` union (`localized.deviceId`);
    /// the bytes after the domain are not part of it.
    pub fn localized_device(&self) -> CUdevice {
        CUdevice::from(self.id.to_ne_bytes()[0])
    }
}

/// The `allocFlags` member of [`CUmemAllocationProp`].
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CUmemAllocationPropAllocFlags {
    pub compressionType: u8,
    pub gpuDirectRDMACapable: u8,
    pub usage: u16,
    pub reserved: [u8; 4],
}

/// `CUmemAllocationProp`, the input of `cuMemCreate`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUmemAllocationProp {
    /// `CU_MEM_ALLOCATION_TYPE_*`.
    pub type_: c_uint,
    /// `CU_MEM_HANDLE_TYPE_*` bits.
    pub requestedHandleTypes: c_uint,
    pub location: CUmemLocation,
    pub win32HandleMetaData: *mut c_void,
    pub allocFlags: CUmemAllocationPropAllocFlags,
}
const _: () = assert!(size_of::<CUmemAllocationProp>() == 32);

/// `CUmemAccessDesc`: `flags` is a `CU_MEM_ACCESS_FLAGS_PROT_*`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CUmemAccessDesc {
    pub location: CUmemLocation,
    pub flags: c_uint,
}
const _: () = assert!(size_of::<CUmemAccessDesc>() == 12);

/// `CUmemPoolProps`, the input of `cuMemPoolCreate`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUmemPoolProps {
    pub allocType: c_uint,
    pub handleTypes: c_uint,
    pub location: CUmemLocation,
    pub win32SecurityAttributes: *mut c_void,
    pub maxSize: usize,
    pub usage: u16,
    pub reserved: [u8; 54],
}
const _: () = assert!(size_of::<CUmemPoolProps>() == 88);

/// `CUDA_ARRAY_DESCRIPTOR` (the `_v2` layout, with `size_t` extents).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CUDA_ARRAY_DESCRIPTOR {
    pub Width: usize,
    pub Height: usize,
    /// A `CU_AD_FORMAT_*` value.
    pub Format: c_uint,
    pub NumChannels: c_uint,
}
const _: () = assert!(size_of::<CUDA_ARRAY_DESCRIPTOR>() == 24);

/// `CUDA_ARRAY3D_DESCRIPTOR` (the `_v2` layout).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CUDA_ARRAY3D_DESCRIPTOR {
    pub Width: usize,
    pub Height: usize,
    pub Depth: usize,
    pub Format: c_uint,
    pub NumChannels: c_uint,
    /// `CUDA_ARRAY3D_*` bits.
    pub Flags: c_uint,
}
const _: () = assert!(size_of::<CUDA_ARRAY3D_DESCRIPTOR>() == 40);

/// `CUDA_MEMCPY2D` (the `_v2` layout).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUDA_MEMCPY2D {
    pub srcXInBytes: usize,
    pub srcY: usize,
    /// A `CU_MEMORYTYPE_*` value.
    pub srcMemoryType: c_uint,
    pub srcHost: *const c_void,
    pub srcDevice: CUdeviceptr,
    pub srcArray: CUarray,
    pub srcPitch: usize,
    pub dstXInBytes: usize,
    pub dstY: usize,
    pub dstMemoryType: c_uint,
    pub dstHost: *mut c_void,
    pub dstDevice: CUdeviceptr,
    pub dstArray: CUarray,
    pub dstPitch: usize,
    pub WidthInBytes: usize,
    pub Height: usize,
}
const _: () = assert!(size_of::<CUDA_MEMCPY2D>() == 128);

/// `CUDA_MEMCPY3D` (the `_v2` layout).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUDA_MEMCPY3D {
    pub srcXInBytes: usize,
    pub srcY: usize,
    pub srcZ: usize,
    pub srcLOD: usize,
    pub srcMemoryType: c_uint,
    pub srcHost: *const c_void,
    pub srcDevice: CUdeviceptr,
    pub srcArray: CUarray,
    pub reserved0: *mut c_void,
    pub srcPitch: usize,
    pub srcHeight: usize,
    pub dstXInBytes: usize,
    pub dstY: usize,
    pub dstZ: usize,
    pub dstLOD: usize,
    pub dstMemoryType: c_uint,
    pub dstHost: *mut c_void,
    pub dstDevice: CUdeviceptr,
    pub dstArray: CUarray,
    pub reserved1: *mut c_void,
    pub dstPitch: usize,
    pub dstHeight: usize,
    pub WidthInBytes: usize,
    pub Height: usize,
    pub Depth: usize,
}
const _: () = assert!(size_of::<CUDA_MEMCPY3D>() == 200);

/// `CUlaunchAttributeValue`: a 64-byte, 8-aligned C union.
///
/// It is kept as raw bytes so that reading it needs no `unsafe`. The members
/// used by the launch paths all start at offset 0: `cooperative` and
/// `priority` (`int`), `clusterDim` (three `unsigned int`), and
/// `launchCompletionEvent` / `programmaticEvent` (`CUevent` then `int flags` at
/// offset 8).
#[repr(C, align(8))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CUlaunchAttributeValue {
    pub bytes: [u8; 64],
}
const _: () = assert!(size_of::<CUlaunchAttributeValue>() == 64);

impl CUlaunchAttributeValue {
    /// The `int` member at offset 0 (`cooperative`, `priority`, ...).
    pub const fn int_at0(&self) -> i32 {
        i32::from_ne_bytes([self.bytes[0], self.bytes[1], self.bytes[2], self.bytes[3]])
    }
}

/// `CUlaunchAttribute`: an id (`CU_LAUNCH_ATTRIBUTE_*`), 4 bytes of padding,
/// then the value.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUlaunchAttribute {
    pub id: c_uint,
    pub pad: [c_char; 4],
    pub value: CUlaunchAttributeValue,
}
const _: () = assert!(size_of::<CUlaunchAttribute>() == 72);

/// `CUlaunchConfig`, the input of `cuLaunchKernelEx`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUlaunchConfig {
    pub gridDimX: c_uint,
    pub gridDimY: c_uint,
    pub gridDimZ: c_uint,
    pub blockDimX: c_uint,
    pub blockDimY: c_uint,
    pub blockDimZ: c_uint,
    pub sharedMemBytes: c_uint,
    pub hStream: CUstream,
    pub attrs: *mut CUlaunchAttribute,
    pub numAttrs: c_uint,
}
const _: () = assert!(size_of::<CUlaunchConfig>() == 56);
const _: () = assert!(core::mem::offset_of!(CUlaunchConfig, hStream) == 32);

/// `CUDA_LAUNCH_PARAMS`: one device's part of `cuLaunchCooperativeKernelMultiDevice`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUDA_LAUNCH_PARAMS {
    pub function: CUfunction,
    pub gridDimX: c_uint,
    pub gridDimY: c_uint,
    pub gridDimZ: c_uint,
    pub blockDimX: c_uint,
    pub blockDimY: c_uint,
    pub blockDimZ: c_uint,
    pub sharedMemBytes: c_uint,
    pub hStream: CUstream,
    pub kernelParams: *mut *mut c_void,
}
const _: () = assert!(size_of::<CUDA_LAUNCH_PARAMS>() == 56);

/// `CUDA_KERNEL_NODE_PARAMS` (v1, used by `cuGraphAddKernelNode`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUDA_KERNEL_NODE_PARAMS {
    pub func: CUfunction,
    pub gridDimX: c_uint,
    pub gridDimY: c_uint,
    pub gridDimZ: c_uint,
    pub blockDimX: c_uint,
    pub blockDimY: c_uint,
    pub blockDimZ: c_uint,
    pub sharedMemBytes: c_uint,
    pub kernelParams: *mut *mut c_void,
    pub extra: *mut *mut c_void,
}
const _: () = assert!(size_of::<CUDA_KERNEL_NODE_PARAMS>() == 56);

/// `CUDA_KERNEL_NODE_PARAMS_v2` (used by `cuGraphAddKernelNode_v2`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUDA_KERNEL_NODE_PARAMS_v2 {
    pub func: CUfunction,
    pub gridDimX: c_uint,
    pub gridDimY: c_uint,
    pub gridDimZ: c_uint,
    pub blockDimX: c_uint,
    pub blockDimY: c_uint,
    pub blockDimZ: c_uint,
    pub sharedMemBytes: c_uint,
    pub kernelParams: *mut *mut c_void,
    pub extra: *mut *mut c_void,
    pub kern: CUkernel,
    pub ctx: CUcontext,
}
const _: () = assert!(size_of::<CUDA_KERNEL_NODE_PARAMS_v2>() == 72);

/// `CUDA_MEM_ALLOC_NODE_PARAMS` (v1): input and output of
/// `cuGraphAddMemAllocNode` (`dptr` is written by the driver).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUDA_MEM_ALLOC_NODE_PARAMS {
    pub poolProps: CUmemPoolProps,
    pub accessDescs: *const CUmemAccessDesc,
    pub accessDescCount: usize,
    pub bytesize: usize,
    pub dptr: CUdeviceptr,
}
const _: () = assert!(size_of::<CUDA_MEM_ALLOC_NODE_PARAMS>() == 120);

/// `CUDA_MEMSET_NODE_PARAMS` (v1).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct CUDA_MEMSET_NODE_PARAMS {
    pub dst: CUdeviceptr,
    pub pitch: usize,
    pub value: c_uint,
    pub elementSize: c_uint,
    pub width: usize,
    pub height: usize,
}
const _: () = assert!(size_of::<CUDA_MEMSET_NODE_PARAMS>() == 40);

/// `CUmulticastObjectProp`, the input of `cuMulticastCreate`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct CUmulticastObjectProp {
    pub numDevices: c_uint,
    pub size: usize,
    pub handleTypes: u64,
    pub flags: u64,
}
const _: () = assert!(size_of::<CUmulticastObjectProp>() == 32);

/// `CUexecAffinityParam`: a type and (for `CU_EXEC_AFFINITY_TYPE_SM_COUNT`)
/// an SM count.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct CUexecAffinityParam {
    pub type_: c_uint,
    pub smCount: c_uint,
}
const _: () = assert!(size_of::<CUexecAffinityParam>() == 8);

/// `CUctxCreateParams`, the input of `cuCtxCreate_v4` (12.5+).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUctxCreateParams {
    pub execAffinityParams: *mut CUexecAffinityParam,
    pub numExecAffinityParams: c_int,
    /// `CUctxCigParam*`; unused by the simulator.
    pub cigParams: *mut c_void,
}
const _: () = assert!(size_of::<CUctxCreateParams>() == 24);

/// `CUdevprop` (deprecated `cuDeviceGetProperties`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct CUdevprop {
    pub maxThreadsPerBlock: c_int,
    pub maxThreadsDim: [c_int; 3],
    pub maxGridSize: [c_int; 3],
    pub sharedMemPerBlock: c_int,
    pub totalConstantMemory: c_int,
    pub SIMDWidth: c_int,
    pub memPitch: c_int,
    pub regsPerBlock: c_int,
    pub clockRate: c_int,
    pub textureAlign: c_int,
}
const _: () = assert!(size_of::<CUdevprop>() == 56);

/// `CUDA_POINTER_ATTRIBUTE_P2P_TOKENS`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct CUDA_POINTER_ATTRIBUTE_P2P_TOKENS {
    pub p2pToken: u64,
    pub vaSpaceToken: c_uint,
}
const _: () = assert!(size_of::<CUDA_POINTER_ATTRIBUTE_P2P_TOKENS>() == 16);

/// The `subresource` union of `CUarrayMapInfo`: 32 bytes, 8-aligned, kept
/// as raw words so that reading it needs no `unsafe`. `sparseLevel` is eight
/// `unsigned int` (level, layer, offsetX/Y/Z, extentWidth/Height/Depth);
/// `miptail` is an `unsigned int` layer, then (at byte 8) two
/// `unsigned long long`, offset and size.
#[repr(C, align(8))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CUarraySubresource {
    pub words: [c_uint; 8],
}
const _: () = assert!(size_of::<CUarraySubresource>() == 32);

impl CUarraySubresource {
    /// A `sparseLevel` member.
    pub const fn sparse_level(level: c_uint, layer: c_uint, offset: [c_uint; 3], extent: [c_uint; 3]) -> CUarraySubresource {
        CUarraySubresource { words: [level, layer, offset[0], offset[1], offset[2], extent[0], extent[1], extent[2]] }
    }

    /// A `miptail` member.
    pub fn miptail(layer: c_uint, offset: u64, size: u64) -> CUarraySubresource {
        let (o, s) = (offset.to_ne_bytes(), size.to_ne_bytes());
        let w = |b: [u8; 8], i: usize| c_uint::from_ne_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        CUarraySubresource { words: [layer, 0, w(o, 0), w(o, 4), w(s, 0), w(s, 4), 0, 0] }
    }

    /// The `unsigned long long` at word `i` (native byte order).
    const fn u64_at(&self, i: usize) -> u64 {
        let (a, b) = (self.words[i].to_ne_bytes(), self.words[i + 1].to_ne_bytes());
        u64::from_ne_bytes([a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]])
    }

    /// The member `CUarrayMapInfo::subresourceType` names: `None` for an
    /// unknown type. Only that member's bytes are read (the other's padding
    /// may be anything).
    pub const fn tiles(&self, subresource_type: c_uint) -> Option<SparseTiles> {
        let w = &self.words;
        match subresource_type {
            crate::consts::CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_SPARSE_LEVEL => {
                Some(SparseTiles::Level { level: w[0], layer: w[1], offset: [w[2], w[3], w[4]], extent: [w[5], w[6], w[7]] })
            }
            crate::consts::CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_MIPTAIL => Some(SparseTiles::MipTail { layer: w[0], offset: self.u64_at(2), size: self.u64_at(4) }),
            _ => None,
        }
    }
}

/// The part of a sparse array one `CUarrayMapInfo` entry names: a box of
/// one mip level of one layer, or a byte range of one layer's mip tail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SparseTiles {
    Level { level: c_uint, layer: c_uint, offset: [c_uint; 3], extent: [c_uint; 3] },
    MipTail { layer: c_uint, offset: u64, size: u64 },
}

impl SparseTiles {
    /// The least value in the derived order (the start of a range scan).
    pub const MIN: SparseTiles = SparseTiles::Level { level: 0, layer: 0, offset: [0; 3], extent: [0; 3] };

    /// What is left of `self` once the tiles of `cut` are taken out of it:
    /// `None` when the two do not overlap (`self` is untouched), else the
    /// disjoint boxes (or byte ranges) that cover the rest, none when `cut`
    /// covers all of `self`. A box loses at most two slabs along each axis,
    /// so there are at most six pieces (two for a mip tail). A zero extent
    /// counts as 1, as the height and depth of 1D and 2D arrays do. Boxes
    /// of another level or layer, or a box and a mip tail, never overlap.
    /// Bounds past `u32` (which
    /// the driver refuses) give `None`: the range is kept whole.
    pub fn minus(&self, cut: &SparseTiles) -> Option<TilePieces> {
        let span = |o: u64, n: u64| (o, o.saturating_add(n.max(1)));
        match (self, cut) {
            (SparseTiles::Level { level, layer, offset, extent }, SparseTiles::Level { level: cl, layer: cy, offset: co, extent: ce }) if level == cl && layer == cy => {
                let a: [(u64, u64); 3] = core::array::from_fn(|i| span(offset[i] as u64, extent[i] as u64));
                let b: [(u64, u64); 3] = core::array::from_fn(|i| span(co[i] as u64, ce[i] as u64));
                let both: [(u64, u64); 3] = core::array::from_fn(|i| (a[i].0.max(b[i].0), a[i].1.min(b[i].1)));
                if both.iter().any(|(lo, hi)| lo >= hi) {
                    return None;
                }
                let boxed = |r: [(u64, u64); 3]| -> Option<SparseTiles> {
                    let mut offset = [0; 3];
                    let mut extent = [0; 3];
                    for i in 0..3 {
                        offset[i] = c_uint::try_from(r[i].0).ok()?;
                        extent[i] = c_uint::try_from(r[i].1 - r[i].0).ok()?;
                    }
                    Some(SparseTiles::Level { level: *level, layer: *layer, offset, extent })
                };
                let mut rest = TilePieces::default();
                let mut left = a;
                for i in 0..3 {
                    if left[i].0 < both[i].0 {
                        let mut r = left;
                        r[i] = (left[i].0, both[i].0);
                        rest.push(boxed(r)?);
                    }
                    if both[i].1 < left[i].1 {
                        let mut r = left;
                        r[i] = (both[i].1, left[i].1);
                        rest.push(boxed(r)?);
                    }
                    left[i] = both[i];
                }
                Some(rest)
            }
            (SparseTiles::MipTail { layer, offset, size }, SparseTiles::MipTail { layer: cy, offset: co, size: cs }) if layer == cy => {
                let (a, b) = (span(*offset, *size), span(*co, *cs));
                let (lo, hi) = (a.0.max(b.0), a.1.min(b.1));
                if lo >= hi {
                    return None;
                }
                let mut rest = TilePieces::default();
                if a.0 < lo {
                    rest.push(SparseTiles::MipTail { layer: *layer, offset: a.0, size: lo - a.0 });
                }
                if hi < a.1 {
                    rest.push(SparseTiles::MipTail { layer: *layer, offset: hi, size: a.1 - hi });
                }
                Some(rest)
            }
            _ => None,
        }
    }
}

/// The pieces [`SparseTiles::minus`] leaves: at most six, in a fixed array
/// (this crate does not allocate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TilePieces {
    items: [SparseTiles; 6],
    len: usize,
}

impl Default for TilePieces {
    fn default() -> Self {
        TilePieces { items: [SparseTiles::MIN; 6], len: 0 }
    }
}

impl TilePieces {
    fn push(&mut self, t: SparseTiles) {
        self.items[self.len] = t;
        self.len += 1;
    }

    pub fn as_slice(&self) -> &[SparseTiles] {
        &self.items[..self.len]
    }
}

/// `CUarrayMapInfo`, one entry of `cuMemMapArrayAsync`: maps (or unmaps)
/// part of a sparse array or mipmapped array to (from) a `cuMemCreate`
/// handle at `offset`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUarrayMapInfo {
    /// `CU_RESOURCE_TYPE_ARRAY` or `CU_RESOURCE_TYPE_MIPMAPPED_ARRAY`.
    pub resourceType: c_uint,
    /// The `resource` union: a `CUarray` or a `CUmipmappedArray`.
    pub resource: *mut c_void,
    /// `CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_*`.
    pub subresourceType: c_uint,
    pub subresource: CUarraySubresource,
    /// `CU_MEM_OPERATION_TYPE_MAP` or `_UNMAP`.
    pub memOperationType: c_uint,
    /// `CU_MEM_HANDLE_TYPE_GENERIC`.
    pub memHandleType: c_uint,
    /// The `memHandle` union's one member.
    pub memHandle: CUmemGenericAllocationHandle,
    /// Offset into the handle's memory.
    pub offset: u64,
    pub deviceBitMask: c_uint,
    pub flags: c_uint,
    pub reserved: [c_uint; 2],
}
const _: () = assert!(size_of::<CUarrayMapInfo>() == 96);
const _: () = assert!(core::mem::offset_of!(CUarrayMapInfo, subresource) == 24);
const _: () = assert!(core::mem::offset_of!(CUarrayMapInfo, memOperationType) == 56);
const _: () = assert!(core::mem::offset_of!(CUarrayMapInfo, memHandle) == 64);
const _: () = assert!(core::mem::offset_of!(CUarrayMapInfo, deviceBitMask) == 80);

/// `CUdevResource` (CUDA 12.4+), as far as anyone outside the driver reads
/// it: the type, and for `CU_DEV_RESOURCE_TYPE_SM` the SM count, which
/// begins the union after 92 bytes of the driver's own. 144 bytes in CUDA
/// 12.4 to 13.5 (13.x ends with a `nextResource` pointer where 12.x's union
/// was 8 bytes longer).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUdevResource {
    pub type_: c_uint,
    pub _internal_padding: [u8; 92],
    /// `sm.smCount` for an SM resource.
    pub sm_count: c_uint,
    pub _union_rest: [u8; 36],
    pub next_resource: *mut c_void,
}
const _: () = assert!(size_of::<CUdevResource>() == 144);

impl Default for CUdevResource {
    fn default() -> Self {
        CUdevResource { type_: 0, _internal_padding: [0; 92], sm_count: 0, _union_rest: [0; 36], next_resource: core::ptr::null_mut() }
    }
}
