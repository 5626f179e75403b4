//! GPU discovery behind a trait: NVML loaded at run time (real or simulated
//! driver, one code path), and a fake for unit tests.

use std::ffi::OsString;
use std::sync::Mutex;

/// One device as the agent knows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct DeviceInfo {
    /// Node-local index, NVML order.
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub memory_bytes: u64,
    /// 0 when the driver does not say.
    pub sm_count: u32,
    /// The device's NVLink group: the lowest index of the devices it is
    /// joined to by NVLink, directly or through others (its own index when
    /// it has no NVLink peer); `None` when the driver cannot say.
    pub nvlink_group: Option<u32>,
    /// Its PCI address as sysfs writes it (`0000:3b:00.0`), from the
    /// driver; `None` when the driver cannot say.
    pub pci_bus_id: Option<String>,
    /// The NUMA node nearest the device (sysfs `numa_node`): the CPUs and
    /// host memory a workload on it should use. `None` on a host without
    /// NUMA affinity for it (sysfs says -1), or when it cannot be read.
    pub numa_node: Option<u32>,
    /// The PCIe root complex it hangs from (`pci0000:3a`, the first
    /// component of its sysfs device path): devices under one root talk
    /// without crossing the CPUs' interconnect. `None` when unknown.
    pub pcie_root: Option<String>,
    /// Its PCIe switch group: the lowest index of the devices it reaches
    /// through PCIe switches alone, without a host bridge
    /// (`nvmlDeviceGetTopologyCommonAncestor` at most
    /// `NVML_TOPOLOGY_MULTIPLE`), directly or through others; its own index
    /// when it shares no switch. `None` when the driver cannot say.
    pub pcie_switch_group: Option<u32>,
}

/// What discovery found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inventory {
    pub devices: Vec<DeviceInfo>,
    pub driver_version: String,
}

#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("cannot load NVML from {lib}: is an NVIDIA driver installed? On a machine without a GPU start egpud with --simulate 2x16GiB")]
    Load {
        lib: String,
        #[source]
        source: nvml_wrapper::error::NvmlError,
    },
    #[error("NVML call {call} failed")]
    Nvml {
        call: &'static str,
        #[source]
        source: nvml_wrapper::error::NvmlError,
    },
    #[error("NVML reports no GPU on this node; start egpud with --simulate 2x16GiB to use simulated GPUs")]
    NoDevices,
    #[error("device {0} does not exist")]
    NoSuchDevice(u32),
}

/// Access to the node's GPUs. `Send + Sync`: the agent queries it from several tasks.
pub trait Gpus: Send + Sync {
    fn inventory(&self) -> Result<Inventory, DeviceError>;
    /// Memory in use on device `index`, as the driver reports it.
    fn used_bytes(&self, index: u32) -> Result<u64, DeviceError>;
    /// Per-process utilisation samples on device `index` newer than
    /// `last_seen_us` (`nvmlDeviceGetProcessUtilization`), or `None` when the
    /// driver cannot say. The compute arbiter integrates them into each
    /// slice's true GPU time.
    fn process_samples(&self, index: u32, last_seen_us: u64) -> Result<Option<Vec<ProcSample>>, DeviceError> {
        let _ = (index, last_seen_us);
        Ok(None)
    }
    /// Device memory each process holds on device `index`, as the driver
    /// reports it (`nvmlDeviceGetComputeRunningProcesses` and the graphics
    /// list; a process in both counted once, at the larger figure), or
    /// `None` when the driver cannot say. The memory audit compares it with
    /// what the hook charged ([`crate::audit`]).
    fn process_memory(&self, index: u32) -> Result<Option<Vec<ProcMemory>>, DeviceError> {
        let _ = index;
        Ok(None)
    }
}

/// One process's device memory as the driver reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcMemory {
    pub pid: u32,
    pub bytes: u64,
}

/// One process's SM utilisation over the sample interval ending at `timestamp_us`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcSample {
    pub pid: u32,
    pub timestamp_us: u64,
    /// Percent of the interval the process had kernels running.
    pub sm_util: u32,
}

/// NVML, loaded with `dlopen` at run time (never linked), from `lib`.
pub struct NvmlGpus {
    nvml: nvml_wrapper::Nvml,
    /// SM counts by index when known from elsewhere (the simulated spec); NVML has no SM-count query.
    sm_counts: Vec<u32>,
    /// Where the host's sysfs is (`/sys`), for each device's NUMA node and
    /// PCIe root; `None`: not read (they are reported unknown).
    sysfs: Option<std::path::PathBuf>,
}

impl NvmlGpus {
    /// Loads NVML from `lib` (e.g. `libnvidia-ml.so.1`, or the simulated one's path).
    pub fn load(lib: &std::path::Path, sm_counts: Vec<u32>) -> Result<NvmlGpus, DeviceError> {
        let os: OsString = lib.as_os_str().to_owned();
        let nvml = nvml_wrapper::Nvml::builder()
            .lib_path(&os)
            .init()
            .map_err(|source| DeviceError::Load { lib: lib.display().to_string(), source })?;
        Ok(NvmlGpus { nvml, sm_counts, sysfs: None })
    }

    /// Reads each device's NUMA node and PCIe root from the sysfs at `root`.
    pub fn with_sysfs(mut self, root: Option<std::path::PathBuf>) -> NvmlGpus {
        self.sysfs = root;
        self
    }
}

/// `path`'s text if it is a regular file (not a FIFO, whose open would
/// block, nor a device) of at most 64 bytes.
pub(crate) fn read_small(path: &std::path::Path) -> Option<String> {
    use std::io::Read;
    if !std::fs::metadata(path).ok()?.is_file() {
        return None;
    }
    let f = std::fs::File::open(path).ok()?;
    let mut buf = Vec::new();
    f.take(65).read_to_end(&mut buf).ok()?;
    (buf.len() <= 64).then_some(())?;
    String::from_utf8(buf).ok()
}

/// An NVML PCI bus ID (`00000000:3B:00.0`, an 8-digit domain) in the form
/// sysfs names the device by (`0000:3b:00.0`); `None` when it is not one.
pub fn sysfs_bus_id(nvml: &str) -> Option<String> {
    let (domain, rest) = nvml.trim().split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (dev, func) = rest.split_once('.')?;
    // Hex digits only (`from_str_radix` alone would take a sign).
    let hex = |s: &str, len: usize, max: u32| (!s.is_empty() && s.len() <= len && s.bytes().all(|b| b.is_ascii_hexdigit())).then(|| u32::from_str_radix(s, 16).ok()).flatten().filter(|&v| v <= max);
    let (domain, bus, dev, func) = (hex(domain, 8, u32::MAX)?, hex(bus, 2, 0xff)?, hex(dev, 2, 0x1f)?, hex(func, 1, 7)?);
    Some(format!("{domain:04x}:{bus:02x}:{dev:02x}.{func}"))
}

/// The NUMA node and the PCIe root of the PCI device `bus_id` (sysfs form)
/// under the sysfs at `root`: its `numa_node` (-1, none: `None`) and the
/// first `pci<domain>:<bus>` component of the path its
/// `bus/pci/devices/<bus_id>` link points to. Either is `None` when it
/// cannot be read.
pub fn pci_locality(root: &std::path::Path, bus_id: &str) -> (Option<u32>, Option<String>) {
    let dev = root.join("bus/pci/devices").join(bus_id);
    // A kernel never writes a NUMA node of 1024 or more (MAX_NUMNODES).
    let numa = read_small(&dev.join("numa_node")).and_then(|s| s.trim().parse::<i64>().ok()).filter(|n| (0..1024).contains(n)).map(|n| n as u32);
    let is_root = |c: &str| {
        let Some((domain, bus)) = c.strip_prefix("pci").and_then(|r| r.split_once(':')) else { return false };
        // The kernel writes the domain with at least four digits (more
        // for the domains above 0xffff of some virtual machines and VMD).
        domain.len() >= 4 && bus.len() == 2 && domain.chars().chain(bus.chars()).all(|ch| ch.is_ascii_hexdigit())
    };
    let pcie_root = std::fs::read_link(&dev).ok().and_then(|target| target.components().filter_map(|c| c.as_os_str().to_str()).find(|c| is_root(c)).map(str::to_string));
    (numa, pcie_root)
}

fn nv<T>(call: &'static str, r: Result<T, nvml_wrapper::error::NvmlError>) -> Result<T, DeviceError> {
    r.map_err(|source| DeviceError::Nvml { call, source })
}

impl NvmlGpus {
    /// Each device's NVLink group ([`DeviceInfo::nvlink_group`]), from the
    /// driver's NVLink P2P status of every pair (`nvmlDeviceGetP2PStatus`);
    /// a pair the driver answers "not supported" for is not linked.
    fn nvlink_groups(&self, n: u32) -> Vec<Option<u32>> {
        use nvml_wrapper::enum_wrappers::device::{P2pCapabilitiesIndex, P2pStatus};
        self.pair_groups(n, "NVLink status", |a, b| match a.p2p_status(&b, P2pCapabilitiesIndex::NvLink) {
            Ok(s) => Ok(s == P2pStatus::Ok),
            Err(nvml_wrapper::error::NvmlError::NotSupported) => Ok(false),
            Err(e) => Err(e),
        })
    }

    /// Each device's PCIe switch group ([`DeviceInfo::pcie_switch_group`]),
    /// from the driver's common ancestor of every pair
    /// (`nvmlDeviceGetTopologyCommonAncestor`).
    fn pcie_switch_groups(&self, n: u32) -> Vec<Option<u32>> {
        use nvml_wrapper::enum_wrappers::device::TopologyLevel;
        self.pair_groups(n, "PCIe topology", |a, b| a.topology_common_ancestor(b).map(|l| matches!(l, TopologyLevel::Internal | TopologyLevel::Single | TopologyLevel::Multiple)))
    }

    /// The groups ([`connected_groups`]) of the `n` devices that `joined`
    /// joins pair by pair; all `None` when a pair cannot be asked, with a
    /// warning naming `what` (a driver that does not support the query at
    /// all is only logged at debug level).
    fn pair_groups(&self, n: u32, what: &str, joined: impl Fn(&nvml_wrapper::Device, nvml_wrapper::Device) -> Result<bool, nvml_wrapper::error::NvmlError>) -> Vec<Option<u32>> {
        let mut pairs = Vec::new();
        for a in 0..n {
            for b in a + 1..n {
                // A handle of each (the topology call takes the other by value).
                let handles = self.nvml.device_by_index(a).and_then(|da| self.nvml.device_by_index(b).map(|db| (da, db)));
                match handles.and_then(|(da, db)| joined(&da, db)) {
                    Ok(true) => pairs.push((a as usize, b as usize)),
                    Ok(false) => {}
                    Err(nvml_wrapper::error::NvmlError::NotSupported) => {
                        tracing::debug!("the driver does not report the {what} of GPUs {a} and {b}; the node reports no groups by it");
                        return vec![None; n as usize];
                    }
                    Err(e) => {
                        tracing::warn!("cannot read the {what} of GPUs {a} and {b} ({e}); the node reports no groups by it, and whole GPUs are picked without them");
                        return vec![None; n as usize];
                    }
                }
            }
        }
        connected_groups(n as usize, &pairs).into_iter().map(Some).collect()
    }
}

/// The group of each of `n` devices joined by the `linked` pairs (by
/// NVLink, or by PCIe switches): the lowest index of its connected set.
pub fn connected_groups(n: usize, linked: &[(usize, usize)]) -> Vec<u32> {
    let mut group: Vec<u32> = (0..n as u32).collect();
    // Merge until no pair joins two groups (n is at most a few dozen).
    let mut changed = true;
    while changed {
        changed = false;
        for &(a, b) in linked.iter().filter(|(a, b)| *a < n && *b < n) {
            let low = group[a].min(group[b]);
            for side in [a, b] {
                let old = group[side];
                if old != low {
                    group.iter_mut().filter(|g| **g == old).for_each(|g| *g = low);
                    changed = true;
                }
            }
        }
    }
    group
}

impl Gpus for NvmlGpus {
    fn inventory(&self) -> Result<Inventory, DeviceError> {
        let n = nv("nvmlDeviceGetCount", self.nvml.device_count())?;
        if n == 0 {
            return Err(DeviceError::NoDevices);
        }
        let mut devices = Vec::with_capacity(n as usize);
        for i in 0..n {
            let d = nv("nvmlDeviceGetHandleByIndex", self.nvml.device_by_index(i))?;
            let mem = nv("nvmlDeviceGetMemoryInfo", d.memory_info())?;
            let pci_bus_id = d.pci_info().ok().and_then(|p| sysfs_bus_id(&p.bus_id));
            let (numa_node, pcie_root) = match (&self.sysfs, &pci_bus_id) {
                (Some(root), Some(id)) => pci_locality(root, id),
                _ => (None, None),
            };
            devices.push(DeviceInfo {
                index: i,
                uuid: nv("nvmlDeviceGetUUID", d.uuid())?,
                name: nv("nvmlDeviceGetName", d.name())?,
                memory_bytes: mem.total,
                sm_count: self.sm_counts.get(i as usize).copied().unwrap_or(0),
                nvlink_group: None,
                pci_bus_id,
                numa_node,
                pcie_root,
                pcie_switch_group: None,
            });
        }
        for ((d, g), p) in devices.iter_mut().zip(self.nvlink_groups(n)).zip(self.pcie_switch_groups(n)) {
            d.nvlink_group = g;
            d.pcie_switch_group = p;
        }
        if let Some(root) = &self.sysfs
            && devices.iter().all(|d| d.numa_node.is_none() && d.pcie_root.is_none())
        {
            tracing::warn!(sysfs = %root.display(), "no GPU's PCI address ({}) is under {}/bus/pci/devices with a NUMA node or a PCIe root: the node reports neither (is --sysfs the host's sysfs?)",
                devices.iter().map(|d| d.pci_bus_id.as_deref().unwrap_or("unknown")).collect::<Vec<_>>().join(", "), root.display());
        }
        let driver_version = self.nvml.sys_driver_version().unwrap_or_else(|_| "unknown".into());
        Ok(Inventory { devices, driver_version })
    }

    fn used_bytes(&self, index: u32) -> Result<u64, DeviceError> {
        let d = nv("nvmlDeviceGetHandleByIndex", self.nvml.device_by_index(index))?;
        Ok(nv("nvmlDeviceGetMemoryInfo", d.memory_info())?.used)
    }

    fn process_samples(&self, index: u32, last_seen_us: u64) -> Result<Option<Vec<ProcSample>>, DeviceError> {
        use nvml_wrapper::error::NvmlError;
        let d = nv("nvmlDeviceGetHandleByIndex", self.nvml.device_by_index(index))?;
        match d.process_utilization_stats(last_seen_us) {
            Ok(v) => Ok(Some(v.into_iter().map(|s| ProcSample { pid: s.pid, timestamp_us: s.timestamp, sm_util: s.sm_util }).collect())),
            // No process ran since `last_seen_us`.
            Err(NvmlError::NotFound) => Ok(Some(Vec::new())),
            Err(NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_) | NvmlError::FunctionNotFound | NvmlError::NoPermission) => Ok(None),
            Err(source) => Err(DeviceError::Nvml { call: "nvmlDeviceGetProcessUtilization", source }),
        }
    }

    fn process_memory(&self, index: u32) -> Result<Option<Vec<ProcMemory>>, DeviceError> {
        use nvml_wrapper::enums::device::UsedGpuMemory;
        use nvml_wrapper::error::NvmlError;
        let d = nv("nvmlDeviceGetHandleByIndex", self.nvml.device_by_index(index))?;
        let lists = [("nvmlDeviceGetComputeRunningProcesses", d.running_compute_processes()), ("nvmlDeviceGetGraphicsRunningProcesses", d.running_graphics_processes())];
        let mut out: Vec<ProcMemory> = Vec::new();
        let mut any = false;
        for (call, list) in lists {
            let list = match list {
                Ok(v) => v,
                Err(NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_) | NvmlError::FunctionNotFound | NvmlError::NoPermission) => continue,
                Err(source) => return Err(DeviceError::Nvml { call, source }),
            };
            any = true;
            for p in list {
                // Not available: a driver that does not account per process
                // (e.g. in some virtual machines); nothing to compare.
                let UsedGpuMemory::Used(bytes) = p.used_gpu_memory else { continue };
                match out.iter_mut().find(|o| o.pid == p.pid) {
                    Some(o) => o.bytes = o.bytes.max(bytes),
                    None => out.push(ProcMemory { pid: p.pid, bytes }),
                }
            }
        }
        Ok(any.then_some(out))
    }
}

/// A fixed set of devices, for unit tests.
pub struct FakeGpus {
    pub devices: Vec<DeviceInfo>,
    pub used: Mutex<Vec<u64>>,
    /// Per device, what [`Gpus::process_memory`] answers (`None`: the
    /// driver cannot say).
    pub procs: Mutex<Vec<Option<Vec<ProcMemory>>>>,
}

impl FakeGpus {
    /// `n` devices of `memory_bytes` each.
    pub fn new(n: u32, memory_bytes: u64) -> FakeGpus {
        let devices = (0..n)
            .map(|index| DeviceInfo {
                index,
                uuid: format!("GPU-fake-{index}"),
                name: "Fake GPU".into(),
                memory_bytes,
                sm_count: 108,
                nvlink_group: Some(0),
                ..DeviceInfo::default()
            })
            .collect();
        FakeGpus { devices, used: Mutex::new(vec![0; n as usize]), procs: Mutex::new(vec![None; n as usize]) }
    }
}

impl Gpus for FakeGpus {
    fn inventory(&self) -> Result<Inventory, DeviceError> {
        Ok(Inventory { devices: self.devices.clone(), driver_version: "fake".into() })
    }

    fn used_bytes(&self, index: u32) -> Result<u64, DeviceError> {
        let used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        used.get(index as usize).copied().ok_or(DeviceError::NoSuchDevice(index))
    }

    fn process_memory(&self, index: u32) -> Result<Option<Vec<ProcMemory>>, DeviceError> {
        let procs = self.procs.lock().unwrap_or_else(|e| e.into_inner());
        procs.get(index as usize).cloned().ok_or(DeviceError::NoSuchDevice(index))
    }
}

#[cfg(test)]
mod tests {
    use super::{connected_groups, pci_locality, sysfs_bus_id};

    #[test]
    fn nvlink_groups_are_the_lowest_index_of_each_connected_set() {
        assert_eq!(connected_groups(4, &[(0, 1), (2, 3)]), [0, 0, 2, 2], "pairs");
        assert_eq!(connected_groups(4, &[]), [0, 1, 2, 3], "no NVLink: each GPU alone");
        // Joined through another GPU (a ring, or links found out of order).
        assert_eq!(connected_groups(5, &[(3, 4), (1, 3), (0, 2)]), [0, 1, 0, 1, 1]);
        assert_eq!(connected_groups(3, &[(2, 1), (1, 0)]), [0, 0, 0]);
        assert_eq!(connected_groups(2, &[(0, 7)]), [0, 1], "a pair past the devices is ignored");
    }

    #[test]
    fn nvml_bus_ids_become_sysfs_names() {
        assert_eq!(sysfs_bus_id("00000000:3B:00.0").as_deref(), Some("0000:3b:00.0"));
        assert_eq!(sysfs_bus_id("00000001:c1:1F.7").as_deref(), Some("0001:c1:1f.7"));
        assert_eq!(sysfs_bus_id("0000:3b:00.0").as_deref(), Some("0000:3b:00.0"), "already short");
        assert_eq!(sysfs_bus_id("00010000:3B:00.0").as_deref(), Some("10000:3b:00.0"), "a domain above 0xffff keeps its digits");
        for bad in ["", "3B:00.0", "00000000:3B:00", "00000000:3B:20.0", "00000000:3B:00.8", "00000000:3BB:00.0", "x:3B:00.0", "00000000:3B:00.0/..", "0000:+f:00.0", "+000:3b:00.0", "000000000:3b:00.0"] {
            assert_eq!(sysfs_bus_id(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn numa_node_and_pcie_root_come_from_the_devices_sysfs_link() {
        let root = tempfile::tempdir().unwrap();
        let devices = root.path().join("bus/pci/devices");
        std::fs::create_dir_all(&devices).unwrap();
        let add = |bdf: &str, path: &str, numa: Option<&str>| {
            let real = root.path().join("devices").join(path);
            std::fs::create_dir_all(&real).unwrap();
            if let Some(n) = numa {
                std::fs::write(real.join("numa_node"), n).unwrap();
            }
            std::os::unix::fs::symlink(format!("../../../devices/{path}"), devices.join(bdf)).unwrap();
        };
        add("0000:3b:00.0", "pci0000:3a/0000:3a:00.0/0000:3b:00.0", Some("1\n"));
        add("0000:18:00.0", "pci0000:17/0000:17:01.0/0000:18:00.0", Some("-1\n"));
        add("0000:99:00.0", "platform/0000:99:00.0", None);
        add("10000:01:00.0", "pci10000:00/10000:00:02.0/10000:01:00.0", Some("0"));
        add("0000:20:00.0", "pci0000:1f/0000:20:00.0", Some("4294967295"));
        assert_eq!(pci_locality(root.path(), "0000:20:00.0").0, None, "no kernel writes such a node");
        add("0000:22:00.0", "pci0000:1f/0000:22:00.0", Some(&format!("{}1\n", "0".repeat(70))));
        assert_eq!(pci_locality(root.path(), "0000:22:00.0").0, None, "longer than any numa_node: not cut to its first bytes");
        // A numa_node that is a FIFO is not read (a read would block).
        add("0000:21:00.0", "pci0000:1f/0000:21:00.0", None);
        let fifo = root.path().join("devices/pci0000:1f/0000:21:00.0/numa_node");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        assert_eq!(pci_locality(root.path(), "0000:21:00.0"), (None, Some("pci0000:1f".into())));
        assert_eq!(pci_locality(root.path(), "10000:01:00.0"), (Some(0), Some("pci10000:00".into())), "a five-digit domain");
        assert_eq!(pci_locality(root.path(), "0000:3b:00.0"), (Some(1), Some("pci0000:3a".into())));
        assert_eq!(pci_locality(root.path(), "0000:18:00.0"), (None, Some("pci0000:17".into())), "-1: no NUMA affinity");
        assert_eq!(pci_locality(root.path(), "0000:99:00.0"), (None, None), "no root in the path, no numa_node");
        assert_eq!(pci_locality(root.path(), "0000:01:00.0"), (None, None), "not in sysfs");
    }
}
