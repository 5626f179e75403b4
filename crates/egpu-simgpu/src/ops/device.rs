//! Initialisation, version, devices and their attributes.

use crate::cptr::{R, cstr, write, write_str};
use crate::rt::{self, Proc, cu};
use egpu_cuda::*;
use std::ffi::c_char;

/// The driver version the simulator reports (CUDA 12.8).
pub const DRIVER_VERSION: i32 = 12080;

pub fn init(flags: u32) -> R<()> {
    if flags != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let p = rt::attach_logged().ok_or(CUDA_ERROR_NOT_INITIALIZED)?;
    p.shm.sweep(&p.locks);
    rt::set_initialized();
    if p.ndev() == 0 {
        return Err(CUDA_ERROR_NO_DEVICE);
    }
    Ok(())
}

pub fn driver_get_version(v: *mut i32) -> R<()> {
    write(v, DRIVER_VERSION)
}

pub fn device_get(out: *mut CUdevice, ordinal: i32) -> R<()> {
    let p = cu()?;
    p.phys(ordinal)?;
    write(out, ordinal)
}

pub fn device_get_count(out: *mut i32) -> R<()> {
    let p = cu()?;
    write(out, p.ndev() as i32)
}

pub fn device_get_name(name: *mut c_char, len: i32, dev: CUdevice) -> R<()> {
    let p = cu()?;
    let d = p.phys(dev)?;
    write_str(name, usize::try_from(len).map_err(|_| CUDA_ERROR_INVALID_VALUE)?, &p.cfg.spec.devices[d].name)
}

/// The 16 UUID bytes of a `GPU-xxxxxxxx-...` string.
pub fn uuid_bytes(uuid: &str) -> [u8; 16] {
    let hex: Vec<u8> = uuid.trim_start_matches("GPU-").bytes().filter(u8::is_ascii_hexdigit).collect();
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        let s = std::str::from_utf8(hex.get(2 * i..2 * i + 2).unwrap_or(b"00")).unwrap_or("00");
        *o = u8::from_str_radix(s, 16).unwrap_or(0);
    }
    out
}

pub fn device_get_uuid(out: *mut CUuuid, dev: CUdevice) -> R<()> {
    let p = cu()?;
    let d = p.phys(dev)?;
    let b = uuid_bytes(&p.cfg.spec.devices[d].uuid);
    write(out, CUuuid { bytes: b.map(|x| x as c_char) })
}

pub fn device_total_mem(out: *mut usize, dev: CUdevice) -> R<()> {
    let p = cu()?;
    let d = p.phys(dev)?;
    write(out, p.shm.devs[d].total as usize)
}

/// PCI bus number of physical device `d` (domain 0, device 0, function 0).
pub fn pci_bus(d: usize) -> u32 {
    0x10 + d as u32
}

fn attribute(p: &Proc, attr: u32, d: usize) -> i32 {
    let sms = p.cfg.spec.devices[d].sm_count as i32;
    match attr {
        CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK => 1024,
        CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X | CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y => 1024,
        CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z => 64,
        CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X => i32::MAX,
        CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y | CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z => 65535,
        CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK => 48 << 10,
        CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY => 64 << 10,
        CU_DEVICE_ATTRIBUTE_WARP_SIZE => 32,
        CU_DEVICE_ATTRIBUTE_MAX_PITCH => i32::MAX,
        CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK | CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR => 65536,
        CU_DEVICE_ATTRIBUTE_CLOCK_RATE => 1_980_000,
        CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE => 2_619_000,
        CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH => 5120,
        CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE => 50 << 20,
        CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT => 512,
        CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT => 32,
        CU_DEVICE_ATTRIBUTE_GPU_OVERLAP => 1,
        CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT => sms,
        CU_DEVICE_ATTRIBUTE_INTEGRATED | CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT | CU_DEVICE_ATTRIBUTE_TCC_DRIVER => 0,
        CU_DEVICE_ATTRIBUTE_COMPUTE_MODE => 0,
        CU_DEVICE_ATTRIBUTE_PCI_BUS_ID => pci_bus(d) as i32,
        CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID | CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID => 0,
        CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR => 2048,
        CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT => 3,
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR => 9,
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR => 0,
        CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR => 228 << 10,
        CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN => 227 << 10,
        CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR => 32,
        CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK => 1024,
        CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE => 30 << 20,
        CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE => 128 << 20,
        CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES => CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR as i32,
        CU_DEVICE_ATTRIBUTE_MEM_SYNC_DOMAIN_COUNT => 4,
        CU_DEVICE_ATTRIBUTE_NUMA_CONFIG => 0,
        CU_DEVICE_ATTRIBUTE_NUMA_ID | CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID => -1,
        CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD_GROUP_ID => d as i32,
        CU_DEVICE_ATTRIBUTE_SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO => 2,
        // Everything the runtime, allocators and NCCL check for: supported.
        CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY
        | CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS
        | CU_DEVICE_ATTRIBUTE_ECC_ENABLED
        | CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING
        | CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED
        | CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED
        | CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED
        | CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY
        | CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS
        | CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED
        | CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM
        | CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH
        | CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED
        | CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
        | CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
        | CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED
        | CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED
        | CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH
        | CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS
        | CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR
        | CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED
        | CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED
        | CU_DEVICE_ATTRIBUTE_UNIFIED_FUNCTION_POINTERS
        | CU_DEVICE_ATTRIBUTE_DEFERRED_MAPPING_CUDA_ARRAY_SUPPORTED
        | CU_DEVICE_ATTRIBUTE_TENSOR_MAP_ACCESS_SUPPORTED => 1,
        _ => 0,
    }
}

pub fn device_get_attribute(out: *mut i32, attr: u32, dev: CUdevice) -> R<()> {
    let p = cu()?;
    let d = p.phys(dev)?;
    if attr == 0 || attr > 200 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    write(out, attribute(p, attr, d))
}

pub fn compute_capability(major: *mut i32, minor: *mut i32, dev: CUdevice) -> R<()> {
    cu()?.phys(dev)?;
    write(major, 9)?;
    write(minor, 0)
}

pub fn get_properties(out: *mut CUdevprop, dev: CUdevice) -> R<()> {
    let p = cu()?;
    let d = p.phys(dev)?;
    let a = |x| attribute(p, x, d);
    write(
        out,
        CUdevprop {
            maxThreadsPerBlock: 1024,
            maxThreadsDim: [1024, 1024, 64],
            maxGridSize: [i32::MAX, 65535, 65535],
            sharedMemPerBlock: a(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK),
            totalConstantMemory: a(CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY),
            SIMDWidth: 32,
            memPitch: i32::MAX,
            regsPerBlock: 65536,
            clockRate: a(CU_DEVICE_ATTRIBUTE_CLOCK_RATE),
            textureAlign: 512,
        },
    )
}

/// `DDDD:BB:DD.F` as the driver writes it.
pub fn pci_bus_id(d: usize) -> String {
    format!("{:04X}:{:02X}:{:02X}.0", 0, pci_bus(d), 0)
}

/// Parses `[domain:]bus:device[.function]` (hex, any case); returns the bus.
pub fn parse_bus_id(s: &str) -> Option<u32> {
    let s = s.trim();
    let main = s.split('.').next()?;
    let parts: Vec<&str> = main.split(':').collect();
    let (dom, bus, dev) = match parts.as_slice() {
        [b, d] => ("0", *b, *d),
        [dm, b, d] => (*dm, *b, *d),
        _ => return None,
    };
    if u64::from_str_radix(dom, 16).ok()? != 0 || u32::from_str_radix(dev, 16).ok()? != 0 {
        return None;
    }
    u32::from_str_radix(bus, 16).ok()
}

pub fn device_get_pci_bus_id(buf: *mut c_char, len: i32, dev: CUdevice) -> R<()> {
    let p = cu()?;
    let d = p.phys(dev)?;
    write_str(buf, usize::try_from(len).map_err(|_| CUDA_ERROR_INVALID_VALUE)?, &pci_bus_id(d))
}

pub fn device_get_by_pci_bus_id(out: *mut CUdevice, id: *const c_char) -> R<()> {
    let p = cu()?;
    let bus = parse_bus_id(&cstr(id)?).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let ord = p.visible.iter().position(|&d| pci_bus(d) == bus).ok_or(CUDA_ERROR_INVALID_DEVICE)?;
    write(out, ord as CUdevice)
}

pub fn can_access_peer(out: *mut i32, dev: CUdevice, peer: CUdevice) -> R<()> {
    let p = cu()?;
    let (a, b) = (p.phys(dev)?, p.phys(peer)?);
    write(out, (a != b) as i32)
}

pub fn p2p_attribute(out: *mut i32, attr: u32, src: CUdevice, dst: CUdevice) -> R<()> {
    let p = cu()?;
    let (a, b) = (p.phys(src)?, p.phys(dst)?);
    if a == b {
        return Err(CUDA_ERROR_INVALID_DEVICE);
    }
    let nvlink = p.cfg.nvlink.linked(a, b);
    let v = match attr {
        CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK => (!nvlink) as i32,
        CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED | CU_DEVICE_P2P_ATTRIBUTE_CUDA_ARRAY_ACCESS_SUPPORTED => 1,
        CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED => nvlink as i32,
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    };
    write(out, v)
}

pub fn exec_affinity_support(out: *mut i32, _ty: u32, dev: CUdevice) -> R<()> {
    cu()?.phys(dev)?;
    write(out, 0)
}

/// Static C strings for cuGetErrorName / cuGetErrorString.
fn error_text(code: CUresult, name: bool) -> Option<*const c_char> {
    use std::ffi::CString;
    use std::sync::OnceLock;
    static NAMES: OnceLock<Vec<(CUresult, CString, CString)>> = OnceLock::new();
    let t = NAMES.get_or_init(|| {
        CU_RESULT_NAMES
            .iter()
            .map(|&(c, n)| {
                let text = n.trim_start_matches("CUDA_ERROR_").trim_start_matches("CUDA_").replace('_', " ").to_lowercase();
                (c, CString::new(n).unwrap_or_default(), CString::new(text).unwrap_or_default())
            })
            .collect()
    });
    t.iter().find(|(c, _, _)| *c == code).map(|(_, n, s)| if name { n.as_ptr() } else { s.as_ptr() })
}

pub fn get_error_name(code: CUresult, out: *mut *const c_char) -> R<()> {
    match error_text(code, true) {
        Some(s) => write(out, s),
        None => {
            crate::cptr::write_opt(out, std::ptr::null());
            Err(CUDA_ERROR_INVALID_VALUE)
        }
    }
}

pub fn get_error_string(code: CUresult, out: *mut *const c_char) -> R<()> {
    match error_text(code, false) {
        Some(s) => write(out, s),
        None => {
            crate::cptr::write_opt(out, std::ptr::null());
            Err(CUDA_ERROR_INVALID_VALUE)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_and_bus_ids() {
        let u = egpu_core::simspec::sim_uuid(3);
        let b = uuid_bytes(&u);
        assert_eq!(b[0], 0x5e);
        assert_eq!(b[15], 0x03);
        assert_eq!(pci_bus_id(2), "0000:12:00.0");
        assert_eq!(parse_bus_id("0000:12:00.0"), Some(0x12));
        assert_eq!(parse_bus_id("00000000:12:00.0"), Some(0x12));
        assert_eq!(parse_bus_id("12:00"), Some(0x12));
        assert_eq!(parse_bus_id("0001:12:00.0"), None);
        assert_eq!(parse_bus_id("junk"), None);
    }
}
