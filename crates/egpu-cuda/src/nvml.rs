//! NVML: `nvmlReturn_t` codes, handle, structs and constants (`nvml.h`,
//! API version 12).

use core::ffi::{c_char, c_uint, c_void};

/// NVML status code (`nvmlReturn_t`, an `int`-sized C enum).
pub type nvmlReturn_t = u32;

pub const NVML_SUCCESS: nvmlReturn_t = 0;
pub const NVML_ERROR_UNINITIALIZED: nvmlReturn_t = 1;
pub const NVML_ERROR_INVALID_ARGUMENT: nvmlReturn_t = 2;
pub const NVML_ERROR_NOT_SUPPORTED: nvmlReturn_t = 3;
pub const NVML_ERROR_NO_PERMISSION: nvmlReturn_t = 4;
pub const NVML_ERROR_ALREADY_INITIALIZED: nvmlReturn_t = 5;
pub const NVML_ERROR_NOT_FOUND: nvmlReturn_t = 6;
pub const NVML_ERROR_INSUFFICIENT_SIZE: nvmlReturn_t = 7;
pub const NVML_ERROR_INSUFFICIENT_POWER: nvmlReturn_t = 8;
pub const NVML_ERROR_DRIVER_NOT_LOADED: nvmlReturn_t = 9;
pub const NVML_ERROR_TIMEOUT: nvmlReturn_t = 10;
pub const NVML_ERROR_IRQ_ISSUE: nvmlReturn_t = 11;
pub const NVML_ERROR_LIBRARY_NOT_FOUND: nvmlReturn_t = 12;
pub const NVML_ERROR_FUNCTION_NOT_FOUND: nvmlReturn_t = 13;
pub const NVML_ERROR_CORRUPTED_INFOROM: nvmlReturn_t = 14;
pub const NVML_ERROR_GPU_IS_LOST: nvmlReturn_t = 15;
pub const NVML_ERROR_RESET_REQUIRED: nvmlReturn_t = 16;
pub const NVML_ERROR_OPERATING_SYSTEM: nvmlReturn_t = 17;
pub const NVML_ERROR_LIB_RM_VERSION_MISMATCH: nvmlReturn_t = 18;
pub const NVML_ERROR_IN_USE: nvmlReturn_t = 19;
pub const NVML_ERROR_MEMORY: nvmlReturn_t = 20;
pub const NVML_ERROR_NO_DATA: nvmlReturn_t = 21;
pub const NVML_ERROR_VGPU_ECC_NOT_SUPPORTED: nvmlReturn_t = 22;
pub const NVML_ERROR_INSUFFICIENT_RESOURCES: nvmlReturn_t = 23;
pub const NVML_ERROR_FREQ_NOT_SUPPORTED: nvmlReturn_t = 24;
pub const NVML_ERROR_ARGUMENT_VERSION_MISMATCH: nvmlReturn_t = 25;
pub const NVML_ERROR_DEPRECATED: nvmlReturn_t = 26;
pub const NVML_ERROR_NOT_READY: nvmlReturn_t = 27;
pub const NVML_ERROR_GPU_NOT_FOUND: nvmlReturn_t = 28;
pub const NVML_ERROR_INVALID_STATE: nvmlReturn_t = 29;
pub const NVML_ERROR_UNKNOWN: nvmlReturn_t = 999;

/// Every code above with the text `nvmlErrorString` gives for it.
pub const NVML_RETURN_NAMES: &[(nvmlReturn_t, &str)] = &[
    (NVML_SUCCESS, "Success"),
    (NVML_ERROR_UNINITIALIZED, "Uninitialized"),
    (NVML_ERROR_INVALID_ARGUMENT, "Invalid argument"),
    (NVML_ERROR_NOT_SUPPORTED, "Not supported"),
    (NVML_ERROR_NO_PERMISSION, "No permission"),
    (NVML_ERROR_ALREADY_INITIALIZED, "Already initialized"),
    (NVML_ERROR_NOT_FOUND, "Not found"),
    (NVML_ERROR_INSUFFICIENT_SIZE, "Insufficient size"),
    (NVML_ERROR_INSUFFICIENT_POWER, "Insufficient power"),
    (NVML_ERROR_DRIVER_NOT_LOADED, "Driver not loaded"),
    (NVML_ERROR_TIMEOUT, "Timeout"),
    (NVML_ERROR_IRQ_ISSUE, "Irq issue"),
    (NVML_ERROR_LIBRARY_NOT_FOUND, "Library not found"),
    (NVML_ERROR_FUNCTION_NOT_FOUND, "Function not found"),
    (NVML_ERROR_CORRUPTED_INFOROM, "Corrupted inforom"),
    (NVML_ERROR_GPU_IS_LOST, "Gpu is lost"),
    (NVML_ERROR_RESET_REQUIRED, "Reset required"),
    (NVML_ERROR_OPERATING_SYSTEM, "Operating system"),
    (NVML_ERROR_LIB_RM_VERSION_MISMATCH, "Lib rm version mismatch"),
    (NVML_ERROR_IN_USE, "In use"),
    (NVML_ERROR_MEMORY, "Memory"),
    (NVML_ERROR_NO_DATA, "No data"),
    (NVML_ERROR_VGPU_ECC_NOT_SUPPORTED, "Vgpu ecc not supported"),
    (NVML_ERROR_INSUFFICIENT_RESOURCES, "Insufficient resources"),
    (NVML_ERROR_FREQ_NOT_SUPPORTED, "Freq not supported"),
    (NVML_ERROR_ARGUMENT_VERSION_MISMATCH, "Argument version mismatch"),
    (NVML_ERROR_DEPRECATED, "Deprecated"),
    (NVML_ERROR_NOT_READY, "Not ready"),
    (NVML_ERROR_GPU_NOT_FOUND, "Gpu not found"),
    (NVML_ERROR_INVALID_STATE, "Invalid state"),
    (NVML_ERROR_UNKNOWN, "Unknown"),
];

/// An NVML device handle (`struct nvmlDevice_st*`), opaque to callers.
pub type nvmlDevice_t = *mut c_void;

/// `nvmlInitWithFlags` flags.
pub const NVML_INIT_FLAG_NO_GPUS: c_uint = 1;
pub const NVML_INIT_FLAG_NO_ATTACH: c_uint = 2;

/// Buffer sizes callers are told to use.
pub const NVML_DEVICE_UUID_BUFFER_SIZE: usize = 80;
pub const NVML_DEVICE_UUID_V2_BUFFER_SIZE: usize = 96;
pub const NVML_DEVICE_NAME_BUFFER_SIZE: usize = 64;
pub const NVML_DEVICE_NAME_V2_BUFFER_SIZE: usize = 96;
pub const NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE: usize = 80;
pub const NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE: usize = 80;
pub const NVML_DEVICE_SERIAL_BUFFER_SIZE: usize = 30;
pub const NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE: usize = 32;
pub const NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE: usize = 16;

/// `NVML_VALUE_NOT_AVAILABLE` as the `unsigned long long` NVML writes.
pub const NVML_VALUE_NOT_AVAILABLE_ULL: u64 = u64::MAX;
/// Maximum NVLinks per device (`NVML_NVLINK_MAX_LINKS`).
pub const NVML_NVLINK_MAX_LINKS: c_uint = 18;

/// `nvmlMemory_t` (v1): bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct nvmlMemory_t {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}
const _: () = assert!(size_of::<nvmlMemory_t>() == 24);

/// `nvmlMemory_v2_t`: `version` must be [`nvmlMemory_v2`].
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct nvmlMemory_v2_t {
    pub version: c_uint,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}
const _: () = assert!(size_of::<nvmlMemory_v2_t>() == 40);

/// `NVML_STRUCT_VERSION(Memory, 2)`: size in the low 24 bits, version above.
pub const nvmlMemory_v2: c_uint = size_of::<nvmlMemory_v2_t>() as c_uint | (2 << 24);

/// `nvmlProcessInfo_v1_t`, written by the unversioned `...RunningProcesses`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct nvmlProcessInfo_v1_t {
    pub pid: c_uint,
    pub usedGpuMemory: u64,
}
const _: () = assert!(size_of::<nvmlProcessInfo_v1_t>() == 16);

/// `nvmlProcessInfo_t` = `nvmlProcessInfo_v2_t`, written by the `_v2` and
/// `_v3` `...RunningProcesses` (the two share this layout).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct nvmlProcessInfo_t {
    pub pid: c_uint,
    pub usedGpuMemory: u64,
    /// `0xFFFFFFFF` when not in MIG mode.
    pub gpuInstanceId: c_uint,
    pub computeInstanceId: c_uint,
}
const _: () = assert!(size_of::<nvmlProcessInfo_t>() == 24);
pub type nvmlProcessInfo_v2_t = nvmlProcessInfo_t;

/// `nvmlProcessUtilizationSample_t`: one process's utilisation over one
/// sample interval ending at `timeStamp` (CPU time, µs), as returned by
/// `nvmlDeviceGetProcessUtilization`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct nvmlProcessUtilizationSample_t {
    pub pid: c_uint,
    pub timeStamp: u64,
    pub smUtil: c_uint,
    pub memUtil: c_uint,
    pub encUtil: c_uint,
    pub decUtil: c_uint,
}
const _: () = assert!(size_of::<nvmlProcessUtilizationSample_t>() == 32);

/// `nvmlPciInfo_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct nvmlPciInfo_t {
    /// `"%04X:%02X:%02X.0"` (domain, bus, device).
    pub busIdLegacy: [c_char; NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE],
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    /// Device id in the high 16 bits, vendor id (0x10DE) in the low 16.
    pub pciDeviceId: c_uint,
    pub pciSubSystemId: c_uint,
    /// `"%08X:%02X:%02X.0"` (domain, bus, device).
    pub busId: [c_char; NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE],
}
const _: () = assert!(size_of::<nvmlPciInfo_t>() == 68);

/// `nvmlUtilization_t`: percentages over the last sample period.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct nvmlUtilization_t {
    pub gpu: c_uint,
    pub memory: c_uint,
}

/// `nvmlValue_t`: an 8-byte C union (double / int / uint / ulong / ulonglong /
/// slonglong / ushort), kept as raw native-endian bytes so that it needs no
/// `unsafe`. Every member starts at offset 0.
#[repr(C, align(8))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct nvmlValue_t {
    pub bytes: [u8; 8],
}
const _: () = assert!(size_of::<nvmlValue_t>() == 8);

impl nvmlValue_t {
    /// The `uiVal` member.
    pub const fn from_uint(v: c_uint) -> Self {
        let b = v.to_ne_bytes();
        Self { bytes: [b[0], b[1], b[2], b[3], 0, 0, 0, 0] }
    }
    /// The `ullVal` member.
    pub const fn from_ulonglong(v: u64) -> Self {
        Self { bytes: v.to_ne_bytes() }
    }
    pub const fn uint(&self) -> c_uint {
        c_uint::from_ne_bytes([self.bytes[0], self.bytes[1], self.bytes[2], self.bytes[3]])
    }
    pub const fn ulonglong(&self) -> u64 {
        u64::from_ne_bytes(self.bytes)
    }
}

/// `nvmlValueType_t`.
pub const NVML_VALUE_TYPE_DOUBLE: c_uint = 0;
pub const NVML_VALUE_TYPE_UNSIGNED_INT: c_uint = 1;
pub const NVML_VALUE_TYPE_UNSIGNED_LONG: c_uint = 2;
pub const NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: c_uint = 3;
pub const NVML_VALUE_TYPE_SIGNED_LONG_LONG: c_uint = 4;
pub const NVML_VALUE_TYPE_SIGNED_INT: c_uint = 5;
pub const NVML_VALUE_TYPE_UNSIGNED_SHORT: c_uint = 6;

/// `nvmlFieldValue_t`: `fieldId` and `scopeId` are inputs, the rest outputs.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct nvmlFieldValue_t {
    pub fieldId: c_uint,
    pub scopeId: c_uint,
    pub timestamp: i64,
    pub latencyUsec: i64,
    pub valueType: c_uint,
    pub nvmlReturn: nvmlReturn_t,
    pub value: nvmlValue_t,
}
const _: () = assert!(size_of::<nvmlFieldValue_t>() == 40);

/// Field ids (`NVML_FI_*`) the simulator answers; others get
/// `NVML_ERROR_NOT_SUPPORTED` in `nvmlReturn`.
pub const NVML_FI_DEV_NVLINK_BANDWIDTH_C0_TOTAL: c_uint = 66;
pub const NVML_FI_DEV_NVLINK_SPEED_MBPS_L0: c_uint = 84;
pub const NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON: c_uint = 90;
pub const NVML_FI_DEV_NVLINK_LINK_COUNT: c_uint = 91;
pub const NVML_FI_DEV_NVLINK_REMOTE_NVLINK_ID: c_uint = 146;
pub const NVML_FI_DEV_NVSWITCH_CONNECTED_LINK_COUNT: c_uint = 147;
pub const NVML_FI_DEV_NVLINK_GET_SPEED: c_uint = 164;
pub const NVML_FI_DEV_NVLINK_GET_STATE: c_uint = 165;
pub const NVML_FI_DEV_NVLINK_GET_VERSION: c_uint = 166;
pub const NVML_FI_DEV_C2C_LINK_COUNT: c_uint = 170;
pub const NVML_FI_DEV_C2C_LINK_GET_STATUS: c_uint = 171;

/// `nvmlEnableState_t`.
pub const NVML_FEATURE_DISABLED: c_uint = 0;
pub const NVML_FEATURE_ENABLED: c_uint = 1;

/// `nvmlNvLinkCapability_t`.
pub const NVML_NVLINK_CAP_P2P_SUPPORTED: c_uint = 0;
pub const NVML_NVLINK_CAP_SYSMEM_ACCESS: c_uint = 1;
pub const NVML_NVLINK_CAP_P2P_ATOMICS: c_uint = 2;
pub const NVML_NVLINK_CAP_SYSMEM_ATOMICS: c_uint = 3;
pub const NVML_NVLINK_CAP_SLI_BRIDGE: c_uint = 4;
pub const NVML_NVLINK_CAP_VALID: c_uint = 5;

/// `nvmlIntNvLinkDeviceType_t`.
pub const NVML_NVLINK_DEVICE_TYPE_GPU: c_uint = 0x00;
pub const NVML_NVLINK_DEVICE_TYPE_SWITCH: c_uint = 0x02;
pub const NVML_NVLINK_DEVICE_TYPE_UNKNOWN: c_uint = 0xFF;

/// `nvmlGpuTopologyLevel_t`.
pub const NVML_TOPOLOGY_INTERNAL: c_uint = 0;
pub const NVML_TOPOLOGY_SINGLE: c_uint = 10;
pub const NVML_TOPOLOGY_MULTIPLE: c_uint = 20;
pub const NVML_TOPOLOGY_HOSTBRIDGE: c_uint = 30;
pub const NVML_TOPOLOGY_NODE: c_uint = 40;
pub const NVML_TOPOLOGY_SYSTEM: c_uint = 50;

/// `nvmlGpuP2PStatus_t`.
pub const NVML_P2P_STATUS_OK: c_uint = 0;
pub const NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED: c_uint = 1;
pub const NVML_P2P_STATUS_GPU_NOT_SUPPORTED: c_uint = 2;
pub const NVML_P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED: c_uint = 3;
pub const NVML_P2P_STATUS_DISABLED_BY_REGKEY: c_uint = 4;
pub const NVML_P2P_STATUS_NOT_SUPPORTED: c_uint = 5;
pub const NVML_P2P_STATUS_UNKNOWN: c_uint = 6;

/// `nvmlGpuP2PCapsIndex_t`.
pub const NVML_P2P_CAPS_INDEX_READ: c_uint = 0;
pub const NVML_P2P_CAPS_INDEX_WRITE: c_uint = 1;
pub const NVML_P2P_CAPS_INDEX_NVLINK: c_uint = 2;
pub const NVML_P2P_CAPS_INDEX_ATOMICS: c_uint = 3;
pub const NVML_P2P_CAPS_INDEX_PCI: c_uint = 4;
pub const NVML_P2P_CAPS_INDEX_UNKNOWN: c_uint = 5;

/// `nvmlBrandType_t` (subset).
pub const NVML_BRAND_UNKNOWN: c_uint = 0;
pub const NVML_BRAND_TESLA: c_uint = 2;
pub const NVML_BRAND_NVIDIA: c_uint = 14;
