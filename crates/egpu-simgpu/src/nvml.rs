//! NVML over the shared state. Devices are physical indices
//! (`CUDA_VISIBLE_DEVICES` is ignored, as by the real NVML); memory and
//! process lists are machine-wide truth, dead processes swept first.
//!
//! NVLink model (`EGPU_SIM_NVLINK`): a linked device has 18 links (NVLink 4,
//! 25 GB/s each); with `all`, link `i` of device `d` goes to the `i mod
//! (n-1)`-th other device; with `pairs`, all go to the partner. PCIe
//! topology (`EGPU_SIM_PCIE`): every pair of different devices meets at the
//! host bridge (`NVML_TOPOLOGY_HOSTBRIDGE`), or with `pairs`, devices 2k and
//! 2k+1 share a PCIe switch (`NVML_TOPOLOGY_SINGLE`).

use crate::config::NvLinkMode;
use crate::ops::device::{DRIVER_VERSION, pci_bus, pci_bus_id};
use crate::rt::{self, Proc};
use crate::state::timing::now_ns;
use egpu_cuda::*;
use std::ffi::c_char;
use std::sync::atomic::{AtomicU32, Ordering};

pub type NR<T> = Result<T, nvmlReturn_t>;

pub const DRIVER_STRING: &str = "570.124.06";
pub const LINKS: u32 = 18;
const H100_PCI_ID: u32 = 0x2330_10DE;

static INIT_COUNT: AtomicU32 = AtomicU32::new(0);
static HANDLES: [u8; MAX_HANDLES] = [0; MAX_HANDLES];
const MAX_HANDLES: usize = crate::state::MAX_DEVS;

fn arg<T>(r: crate::cptr::R<T>) -> NR<T> {
    r.map_err(|_| NVML_ERROR_INVALID_ARGUMENT)
}

fn w<T>(p: *mut T, v: T) -> NR<()> {
    arg(crate::cptr::write(p, v))
}

fn proc_() -> NR<&'static Proc> {
    if INIT_COUNT.load(Ordering::SeqCst) == 0 {
        return Err(NVML_ERROR_UNINITIALIZED);
    }
    rt::attach_logged().ok_or(NVML_ERROR_UNINITIALIZED)
}

fn handle(i: usize) -> nvmlDevice_t {
    &HANDLES[i] as *const u8 as nvmlDevice_t
}

/// (runtime, physical index) of a device handle.
fn dev(h: nvmlDevice_t) -> NR<(&'static Proc, usize)> {
    let p = proc_()?;
    let base = HANDLES.as_ptr() as usize;
    let i = (h as usize).wrapping_sub(base);
    if h.is_null() || i >= p.shm.ndev() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    Ok((p, i))
}

fn str_out(buf: *mut c_char, len: u32, s: &str) -> NR<()> {
    if buf.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    if (len as usize) < s.len() + 1 {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    arg(crate::cptr::write_str(buf, len as usize, s))
}

pub fn init(flags: u32) -> NR<()> {
    let _ = flags;
    let p = rt::attach_logged().ok_or(NVML_ERROR_UNKNOWN)?;
    p.shm.sweep(&p.locks);
    INIT_COUNT.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

pub fn shutdown() -> NR<()> {
    INIT_COUNT
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |c| c.checked_sub(1))
        .map(|_| ())
        .map_err(|_| NVML_ERROR_UNINITIALIZED)
}

pub fn error_string(code: nvmlReturn_t) -> *const c_char {
    use std::ffi::CString;
    use std::sync::OnceLock;
    static T: OnceLock<(Vec<(nvmlReturn_t, CString)>, CString)> = OnceLock::new();
    let (t, unknown) = T.get_or_init(|| {
        (
            NVML_RETURN_NAMES.iter().map(|&(c, s)| (c, CString::new(s).unwrap_or_default())).collect(),
            CString::new("Unknown Error").unwrap_or_default(),
        )
    });
    t.iter().find(|(c, _)| *c == code).map_or(unknown.as_ptr(), |(_, s)| s.as_ptr())
}

pub fn driver_version(buf: *mut c_char, len: u32) -> NR<()> {
    proc_()?;
    str_out(buf, len, DRIVER_STRING)
}

pub fn nvml_version(buf: *mut c_char, len: u32) -> NR<()> {
    proc_()?;
    str_out(buf, len, &format!("12.{DRIVER_STRING}"))
}

pub fn cuda_driver_version(out: *mut i32) -> NR<()> {
    proc_()?;
    w(out, DRIVER_VERSION)
}

pub fn count(out: *mut u32) -> NR<()> {
    w(out, proc_()?.shm.ndev() as u32)
}

pub fn by_index(i: u32, out: *mut nvmlDevice_t) -> NR<()> {
    let p = proc_()?;
    if i as usize >= p.shm.ndev() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    w(out, handle(i as usize))
}

pub fn by_uuid(uuid: *const c_char, out: *mut nvmlDevice_t) -> NR<()> {
    let p = proc_()?;
    let u = arg(crate::cptr::cstr(uuid))?;
    let i = p.cfg.spec.devices.iter().position(|d| d.uuid.eq_ignore_ascii_case(u.trim())).ok_or(NVML_ERROR_NOT_FOUND)?;
    w(out, handle(i))
}

pub fn by_pci_bus_id(id: *const c_char, out: *mut nvmlDevice_t) -> NR<()> {
    let p = proc_()?;
    let s = arg(crate::cptr::cstr(id))?;
    let bus = crate::ops::device::parse_bus_id(&s).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
    let i = (0..p.shm.ndev()).find(|&d| pci_bus(d) == bus).ok_or(NVML_ERROR_NOT_FOUND)?;
    w(out, handle(i))
}

pub fn index(h: nvmlDevice_t, out: *mut u32) -> NR<()> {
    w(out, dev(h)?.1 as u32)
}

pub fn name(h: nvmlDevice_t, buf: *mut c_char, len: u32) -> NR<()> {
    let (p, d) = dev(h)?;
    str_out(buf, len, &p.cfg.spec.devices[d].name)
}

pub fn uuid(h: nvmlDevice_t, buf: *mut c_char, len: u32) -> NR<()> {
    let (p, d) = dev(h)?;
    str_out(buf, len, &p.cfg.spec.devices[d].uuid)
}

pub fn serial(h: nvmlDevice_t, buf: *mut c_char, len: u32) -> NR<()> {
    let (_, d) = dev(h)?;
    str_out(buf, len, &format!("SIM{d:010}"))
}

fn mem(p: &Proc, d: usize) -> (u64, u64) {
    p.shm.sweep(&p.locks);
    let total = p.shm.devs[d].total;
    (total, p.shm.used(d).min(total))
}

pub fn memory_info(h: nvmlDevice_t, out: *mut nvmlMemory_t) -> NR<()> {
    let (p, d) = dev(h)?;
    let (total, used) = mem(p, d);
    w(out, nvmlMemory_t { total, free: total - used, used })
}

pub fn memory_info_v2(h: nvmlDevice_t, out: *mut nvmlMemory_v2_t) -> NR<()> {
    let (p, d) = dev(h)?;
    let v = arg(crate::cptr::read(out as *const nvmlMemory_v2_t))?;
    if v.version != nvmlMemory_v2 {
        return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    }
    let (total, used) = mem(p, d);
    w(out, nvmlMemory_v2_t { version: nvmlMemory_v2, total, reserved: 0, free: total - used, used })
}

fn pci(d: usize) -> nvmlPciInfo_t {
    let mut info = nvmlPciInfo_t { bus: pci_bus(d), pciDeviceId: H100_PCI_ID, pciSubSystemId: 0x16C1_10DE, ..Default::default() };
    let legacy = pci_bus_id(d);
    let long = format!("{:08X}:{:02X}:{:02X}.0", 0, pci_bus(d), 0);
    for (i, b) in legacy.bytes().enumerate() {
        info.busIdLegacy[i] = b as c_char;
    }
    for (i, b) in long.bytes().enumerate() {
        info.busId[i] = b as c_char;
    }
    info
}

pub fn pci_info(h: nvmlDevice_t, out: *mut nvmlPciInfo_t) -> NR<()> {
    w(out, pci(dev(h)?.1))
}

pub fn minor_number(h: nvmlDevice_t, out: *mut u32) -> NR<()> {
    w(out, dev(h)?.1 as u32)
}

pub fn compute_capability(h: nvmlDevice_t, major: *mut i32, minor: *mut i32) -> NR<()> {
    dev(h)?;
    w(major, 9)?;
    w(minor, 0)
}

/// Compute processes: `v1` selects the 16-byte `nvmlProcessInfo_v1_t`
/// layout, otherwise the 24-byte `nvmlProcessInfo_t` (v2 and v3).
pub fn compute_processes(h: nvmlDevice_t, count: *mut u32, infos: *mut u8, v1: bool, graphics: bool) -> NR<()> {
    let (p, d) = dev(h)?;
    let list = if graphics { Vec::new() } else { p.shm.procs_on(&p.locks, d) };
    let cap = arg(crate::cptr::read(count as *const u32))?;
    w(count, list.len() as u32)?;
    if (cap as usize) < list.len() {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (i, u) in list.iter().enumerate() {
        if v1 {
            arg(crate::cptr::write_at(infos as *mut nvmlProcessInfo_v1_t, i, nvmlProcessInfo_v1_t { pid: u.pid, usedGpuMemory: u.bytes }))?;
        } else {
            let e = nvmlProcessInfo_t { pid: u.pid, usedGpuMemory: u.bytes, gpuInstanceId: u32::MAX, computeInstanceId: u32::MAX };
            arg(crate::cptr::write_at(infos as *mut nvmlProcessInfo_t, i, e))?;
        }
    }
    Ok(())
}

pub fn utilization(h: nvmlDevice_t, out: *mut nvmlUtilization_t) -> NR<()> {
    let (p, d) = dev(h)?;
    w(out, nvmlUtilization_t { gpu: p.shm.utilization(d, now_ns()), memory: 0 })
}

/// What this process's earlier `nvmlDeviceGetProcessUtilization` calls
/// reported: (device, slot, pid) -> (sample time µs, busy ns reported so far).
type Sampled = std::collections::BTreeMap<(usize, usize, u32), (u64, u64)>;
static SAMPLED: std::sync::Mutex<Sampled> = std::sync::Mutex::new(std::collections::BTreeMap::new());

/// `nvmlDeviceGetProcessUtilization`: one sample per live process that has
/// run kernels on the device, covering the time since this caller's previous
/// sample of it (or since `last_seen_us` for a process not sampled before;
/// the first sample of a process with `last_seen_us == 0` is a 0% baseline).
/// `smUtil` is the share of that interval in which the process's kernels
/// *ran* (not were queued: [`crate::state::Shared::executed`]), in whole
/// percent, rounded down and capped at 100; what is not reported (rounding)
/// carries into the next sample, so summing
/// `smUtil × interval` over samples tracks the process's GPU time to within
/// one percent of one interval. Timestamps are CLOCK_MONOTONIC µs.
pub fn process_utilization(h: nvmlDevice_t, out: *mut nvmlProcessUtilizationSample_t, count: *mut u32, last_seen_us: u64) -> NR<()> {
    // No sweep here (it reads /proc per live process): a dead process's slot
    // only reports 0% until the next sweep frees it.
    let (p, d) = dev(h)?;
    let now = now_ns();
    // Queued time first, then the log (as `Shared::executed` does): a
    // kernel queued in between is subtracted, never counted as run early.
    let queued: Vec<(usize, u32, u64)> = (0..crate::state::MAX_SLOTS)
        .filter_map(|i| {
            let (pid, st) = p.shm.slot_owner(i);
            (st == crate::state::SlotState::Live).then(|| (i, pid, p.shm.slots[i].busy[d].load(Ordering::SeqCst)))
        })
        .collect();
    let mut pending = std::collections::HashMap::<u64, u64>::new();
    p.shm.pending_spans(d, now, |who, ns| *pending.entry(who).or_default() += ns);
    let live: Vec<(usize, u32, u64)> = queued
        .into_iter()
        .map(|(i, pid, q)| (i, pid, q.saturating_sub(pending.get(&crate::state::timing::span_owner(i, pid)).copied().unwrap_or(0))))
        .filter(|&(_, _, busy)| busy > 0)
        .collect();
    let cap = arg(crate::cptr::read(count as *const u32))?;
    w(count, live.len() as u32)?;
    if live.is_empty() {
        return Err(NVML_ERROR_NOT_FOUND);
    }
    if out.is_null() || (cap as usize) < live.len() {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    let now_us = now / 1000;
    let mut hist = SAMPLED.lock().unwrap_or_else(|e| e.into_inner());
    hist.retain(|&(hd, slot, pid), _| hd != d || live.iter().any(|&(s, p, _)| (s, p) == (slot, pid)));
    for (k, &(slot, pid, busy)) in live.iter().enumerate() {
        let e = hist.entry((d, slot, pid)).or_insert(if last_seen_us > 0 && last_seen_us <= now_us { (last_seen_us, 0) } else { (now_us, busy) });
        let dt = now_us.saturating_sub(e.0);
        let util = if dt == 0 { 0 } else { (busy.saturating_sub(e.1) / (dt * 10)).min(100) };
        *e = (now_us, e.1 + util * dt * 10);
        let sample = nvmlProcessUtilizationSample_t { pid, timeStamp: now_us, smUtil: util as u32, memUtil: 0, encUtil: 0, decUtil: 0 };
        arg(crate::cptr::write_at(out, k, sample))?;
    }
    Ok(())
}

/// The device at the other end of link `link` of `d`, if linked.
pub fn remote(mode: NvLinkMode, n: usize, d: usize, link: u32) -> Option<usize> {
    if link >= LINKS || n < 2 {
        return None;
    }
    match mode {
        NvLinkMode::None => None,
        NvLinkMode::Pairs => {
            let peer = d ^ 1;
            (peer < n).then_some(peer)
        }
        NvLinkMode::All => {
            let k = link as usize % (n - 1);
            Some(if k >= d { k + 1 } else { k })
        }
    }
}

fn link_peer(h: nvmlDevice_t, link: u32) -> NR<(&'static Proc, usize, usize)> {
    let (p, d) = dev(h)?;
    if link >= LINKS {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    let peer = remote(p.cfg.nvlink, p.shm.ndev(), d, link).ok_or(NVML_ERROR_NOT_SUPPORTED)?;
    Ok((p, d, peer))
}

pub fn nvlink_state(h: nvmlDevice_t, link: u32, out: *mut u32) -> NR<()> {
    link_peer(h, link)?;
    w(out, NVML_FEATURE_ENABLED)
}

pub fn nvlink_version(h: nvmlDevice_t, link: u32, out: *mut u32) -> NR<()> {
    link_peer(h, link)?;
    w(out, 4)
}

pub fn nvlink_capability(h: nvmlDevice_t, link: u32, cap: u32, out: *mut u32) -> NR<()> {
    link_peer(h, link)?;
    let v = match cap {
        NVML_NVLINK_CAP_P2P_SUPPORTED | NVML_NVLINK_CAP_P2P_ATOMICS | NVML_NVLINK_CAP_VALID => 1,
        NVML_NVLINK_CAP_SYSMEM_ACCESS | NVML_NVLINK_CAP_SYSMEM_ATOMICS | NVML_NVLINK_CAP_SLI_BRIDGE => 0,
        _ => return Err(NVML_ERROR_INVALID_ARGUMENT),
    };
    w(out, v)
}

pub fn nvlink_remote_pci(h: nvmlDevice_t, link: u32, out: *mut nvmlPciInfo_t) -> NR<()> {
    let (_, _, peer) = link_peer(h, link)?;
    w(out, pci(peer))
}

pub fn nvlink_remote_type(h: nvmlDevice_t, link: u32, out: *mut u32) -> NR<()> {
    link_peer(h, link)?;
    w(out, NVML_NVLINK_DEVICE_TYPE_GPU)
}

pub fn p2p_status(a: nvmlDevice_t, b: nvmlDevice_t, cap: u32, out: *mut u32) -> NR<()> {
    let (p, da) = dev(a)?;
    let (_, db) = dev(b)?;
    let linked = p.cfg.nvlink.linked(da, db);
    let st = match cap {
        NVML_P2P_CAPS_INDEX_NVLINK if !linked => NVML_P2P_STATUS_NOT_SUPPORTED,
        NVML_P2P_CAPS_INDEX_READ | NVML_P2P_CAPS_INDEX_WRITE | NVML_P2P_CAPS_INDEX_ATOMICS | NVML_P2P_CAPS_INDEX_PCI | NVML_P2P_CAPS_INDEX_NVLINK => {
            NVML_P2P_STATUS_OK
        }
        _ => NVML_P2P_STATUS_UNKNOWN,
    };
    w(out, st)
}

pub fn topology_common_ancestor(a: nvmlDevice_t, b: nvmlDevice_t, out: *mut u32) -> NR<()> {
    let (p, da) = dev(a)?;
    let (_, db) = dev(b)?;
    w(
        out,
        if da == db {
            NVML_TOPOLOGY_INTERNAL
        } else if p.cfg.pcie_pairs && da / 2 == db / 2 {
            NVML_TOPOLOGY_SINGLE
        } else {
            NVML_TOPOLOGY_HOSTBRIDGE
        },
    )
}

pub fn field_values(h: nvmlDevice_t, n: i32, values: *mut nvmlFieldValue_t) -> NR<()> {
    let (p, d) = dev(h)?;
    let ndev = p.shm.ndev();
    let linked = remote(p.cfg.nvlink, ndev, d, 0).is_some();
    for i in 0..n.max(0) as usize {
        let mut f = arg(crate::cptr::read_at(values as *const nvmlFieldValue_t, i))?;
        let link_ok = f.scopeId < LINKS && linked;
        let v: Option<(u32, u64)> = match f.fieldId {
            NVML_FI_DEV_NVLINK_LINK_COUNT => Some((NVML_VALUE_TYPE_UNSIGNED_INT, if linked { LINKS as u64 } else { 0 })),
            NVML_FI_DEV_NVLINK_GET_STATE if link_ok => Some((NVML_VALUE_TYPE_UNSIGNED_INT, 1)),
            NVML_FI_DEV_NVLINK_GET_VERSION if link_ok => Some((NVML_VALUE_TYPE_UNSIGNED_INT, 4)),
            NVML_FI_DEV_NVLINK_GET_SPEED | NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON if linked => {
                Some((NVML_VALUE_TYPE_UNSIGNED_INT, 25_000))
            }
            NVML_FI_DEV_NVSWITCH_CONNECTED_LINK_COUNT | NVML_FI_DEV_C2C_LINK_COUNT => Some((NVML_VALUE_TYPE_UNSIGNED_INT, 0)),
            _ => None,
        };
        f.timestamp = (now_ns() / 1000) as i64;
        match v {
            Some((ty, val)) => {
                f.valueType = ty;
                f.nvmlReturn = NVML_SUCCESS;
                f.value = if ty == NVML_VALUE_TYPE_UNSIGNED_INT { nvmlValue_t::from_uint(val as u32) } else { nvmlValue_t::from_ulonglong(val) };
            }
            None => f.nvmlReturn = NVML_ERROR_NOT_SUPPORTED,
        }
        arg(crate::cptr::write_at(values, i, f))?;
    }
    Ok(())
}

pub fn simple_u32(h: nvmlDevice_t, out: *mut u32, v: u32) -> NR<()> {
    dev(h)?;
    w(out, v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvlink_remotes() {
        // 4 devices, all linked: device 1's links cycle over 0, 2, 3.
        let r: Vec<_> = (0..6).map(|l| remote(NvLinkMode::All, 4, 1, l).unwrap()).collect();
        assert_eq!(r, vec![0, 2, 3, 0, 2, 3]);
        assert_eq!(remote(NvLinkMode::Pairs, 4, 2, 5), Some(3));
        assert_eq!(remote(NvLinkMode::Pairs, 3, 2, 0), None, "odd one out");
        assert_eq!(remote(NvLinkMode::None, 4, 0, 0), None);
        assert_eq!(remote(NvLinkMode::All, 1, 0, 0), None);
        assert_eq!(remote(NvLinkMode::All, 4, 0, LINKS), None);
        assert!(pci(1).busId.iter().map(|&c| c as u8 as char).collect::<String>().starts_with("00000000:11:00.0"));
    }
}
