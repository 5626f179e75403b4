//! Listings: a table for people, `-o json` for programs. The JSON shapes
//! are stable: fields are only ever added.

use egpu_core::{Bytes, Percent};
use std::io::Write;

/// Write `text` to standard output. A reader that has gone away
/// (`egpu ls | head -1`) is no error: the command did its work.
pub fn print(text: &str) -> std::io::Result<()> {
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r,
    }
}
use egpu_node::proto;
use serde::Serialize;

#[derive(Debug, Serialize)]
pub struct DeviceOut {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub memory_bytes: u64,
    pub sm_count: u32,
    /// Sum of the slices' memory guarantees.
    pub allocated_memory_bytes: u64,
    /// Lent now to bursting slices above their guarantees.
    pub lent_memory_bytes: u64,
    /// What a new guarantee can have now: memory − allocated − lent.
    pub free_memory_bytes: u64,
    pub allocated_compute_percent: f64,
    pub driver_used_bytes: u64,
    /// Held by processes in no slice, as the driver reports it (absent
    /// when egpud does not audit memory).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unmanaged_bytes: Option<u64>,
    /// The lowest index of the devices NVLink joins this one to (its own
    /// without NVLink peers); absent when the driver cannot say.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nvlink_group: Option<u32>,
    /// PCI address in sysfs form; absent when unknown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pci_bus_id: Option<String>,
    /// The NUMA node nearest the GPU; absent when there is none or egpud
    /// does not read sysfs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<u32>,
    /// The PCIe root complex it hangs from; absent when unknown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pcie_root: Option<String>,
    /// The lowest index of the devices PCIe switches join it to without a
    /// host bridge (its own when it shares none); absent when unknown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pcie_switch_group: Option<u32>,
}

#[derive(Debug, Serialize)]
pub struct NodeOut {
    pub hostname: String,
    pub simulated: bool,
    pub simulate_spec: String,
    pub driver_version: String,
    pub agent_version: String,
    pub abi_version: u32,
    pub run_dir: String,
    pub slice_count: u32,
    pub devices: Vec<DeviceOut>,
}

#[derive(Debug, Serialize)]
pub struct SliceDeviceOut {
    pub device: u32,
    pub uuid: String,
    /// Guaranteed memory (reserved; the hard limit unless the slice bursts).
    pub memory_limit_bytes: u64,
    /// Burst cap (0: no burst).
    pub memory_burst_bytes: u64,
    /// Memory lent to the slice now above its guarantee (its limit is the sum).
    pub memory_granted_bytes: u64,
    pub used_bytes: u64,
    /// What the driver reports the slice's processes hold (the memory
    /// audit's last reading; absent when egpud does not audit).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub driver_used_bytes: Option<u64>,
    /// What of it no charge covers: memory the hook could not follow.
    pub untracked_bytes: u64,
    pub compute_share_percent: f64,
    pub compute_limit_percent: f64,
    pub refused_allocations: u64,
    /// Recent GPU time as a share of the device (arbiter, ~0.5 s average).
    pub compute_usage_percent: f64,
    /// Cumulative GPU time (device accounting where the driver has it).
    pub compute_used_seconds: f64,
    /// Cumulative time the slice's processes waited for compute budget.
    pub compute_throttled_seconds: f64,
}

#[derive(Debug, Serialize)]
pub struct ProcessOut {
    pub pid: u32,
    pub bytes: Vec<u64>,
    pub alive: bool,
}

#[derive(Debug, Serialize)]
pub struct SliceOut {
    pub id: String,
    pub name: String,
    pub priority: String,
    pub ephemeral: bool,
    pub owner_pid: u32,
    pub generation: u64,
    pub created_unix: u64,
    pub slice_dir: String,
    pub devices: Vec<SliceDeviceOut>,
    pub processes: Vec<ProcessOut>,
}

fn pct(bps: u32) -> f64 {
    bps as f64 / 100.0
}

pub fn priority_name(p: i32) -> String {
    match proto::Priority::try_from(p) {
        Ok(proto::Priority::High) => "high",
        Ok(proto::Priority::BestEffort) => "best-effort",
        _ => "normal",
    }
    .to_string()
}

pub fn node_out(n: proto::GetNodeResponse) -> NodeOut {
    NodeOut {
        devices: n
            .devices
            .into_iter()
            .map(|d| DeviceOut {
                index: d.index,
                free_memory_bytes: d.memory_bytes.saturating_sub(d.allocated_memory_bytes).saturating_sub(d.lent_memory_bytes),
                lent_memory_bytes: d.lent_memory_bytes,
                allocated_compute_percent: pct(d.allocated_compute_bps),
                uuid: d.uuid,
                name: d.name,
                memory_bytes: d.memory_bytes,
                sm_count: d.sm_count,
                allocated_memory_bytes: d.allocated_memory_bytes,
                driver_used_bytes: d.driver_used_bytes,
                unmanaged_bytes: d.unmanaged_bytes,
                nvlink_group: d.nvlink_group,
                pci_bus_id: d.pci_bus_id,
                numa_node: d.numa_node,
                pcie_root: d.pcie_root,
                pcie_switch_group: d.pcie_switch_group,
            })
            .collect(),
        hostname: n.hostname,
        simulated: n.simulated,
        simulate_spec: n.simulate_spec,
        driver_version: n.driver_version,
        agent_version: n.agent_version,
        abi_version: n.abi_version,
        run_dir: n.run_dir,
        slice_count: n.slice_count,
    }
}

pub fn slice_out(s: proto::Slice) -> SliceOut {
    SliceOut {
        priority: priority_name(s.priority),
        devices: s
            .devices
            .into_iter()
            .map(|d| SliceDeviceOut {
                device: d.device,
                uuid: d.uuid,
                memory_limit_bytes: d.memory_limit_bytes,
                memory_burst_bytes: d.memory_burst_bytes,
                memory_granted_bytes: d.memory_granted_bytes,
                used_bytes: d.used_bytes,
                driver_used_bytes: d.driver_used_bytes,
                untracked_bytes: d.untracked_bytes,
                compute_share_percent: pct(d.compute_share_bps),
                compute_limit_percent: pct(d.compute_limit_bps),
                refused_allocations: d.refused,
                compute_usage_percent: pct(d.compute_usage_bps),
                compute_used_seconds: d.compute_used_ns as f64 / 1e9,
                compute_throttled_seconds: d.compute_throttled_ns as f64 / 1e9,
            })
            .collect(),
        processes: s.processes.into_iter().map(|p| ProcessOut { pid: p.pid, bytes: p.bytes, alive: p.alive }).collect(),
        id: s.id,
        name: s.name,
        ephemeral: s.ephemeral,
        owner_pid: s.owner_pid,
        generation: s.generation,
        created_unix: s.created_unix,
        slice_dir: s.slice_dir,
    }
}

/// Left-aligned columns separated by two spaces.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut w: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.len());
        }
    }
    let line = |cells: Vec<&str>| {
        let s: Vec<String> = cells.iter().enumerate().map(|(i, c)| format!("{c:<width$}", width = w[i])).collect();
        s.join("  ").trim_end().to_string() + "\n"
    };
    let mut out = line(header.to_vec());
    for r in rows {
        out += &line(r.iter().map(|s| s.as_str()).collect());
    }
    out
}

pub fn devices_table(n: &NodeOut) -> String {
    let rows: Vec<Vec<String>> = n
        .devices
        .iter()
        .map(|d| {
            vec![
                d.index.to_string(),
                d.name.clone(),
                Bytes(d.memory_bytes).to_string(),
                Bytes(d.allocated_memory_bytes).to_string(),
                Bytes(d.lent_memory_bytes).to_string(),
                Bytes(d.free_memory_bytes).to_string(),
                format!("{}%", d.allocated_compute_percent),
                Bytes(d.driver_used_bytes).to_string(),
                d.numa_node.map_or_else(|| "-".into(), |n| n.to_string()),
                d.uuid.clone(),
            ]
        })
        .collect();
    let kind = if n.simulated { format!("simulated ({})", n.simulate_spec) } else { format!("driver {}", n.driver_version) };
    format!(
        "{} device(s) on {}, {kind}, {} slice(s)\n{}",
        n.devices.len(),
        n.hostname,
        n.slice_count,
        table(&["INDEX", "NAME", "MEMORY", "ALLOCATED", "LENT", "FREE", "COMPUTE", "DRIVER-USED", "NUMA", "UUID"], &rows)
    )
}

pub fn slices_table(slices: &[SliceOut]) -> String {
    if slices.is_empty() {
        return "no slices (create one with `egpu create --name NAME --gpu-memory 4GiB`)\n".into();
    }
    let mut rows = Vec::new();
    for s in slices {
        let live = s.processes.iter().filter(|p| p.alive).count();
        for (i, d) in s.devices.iter().enumerate() {
            let first = i == 0;
            rows.push(vec![
                if first { s.name.clone() } else { String::new() },
                d.device.to_string(),
                memory_cell(d),
                used_cell(d),
                format!("{}/{}", Percent((d.compute_share_percent * 100.0) as u32), Percent((d.compute_limit_percent * 100.0) as u32)),
                if first { s.priority.clone() } else { String::new() },
                if first { live.to_string() } else { String::new() },
                if first { s.id.clone() } else { String::new() },
            ]);
        }
    }
    table(&["NAME", "DEVICE", "LIMIT", "USED", "COMPUTE", "PRIORITY", "PROCS", "ID"], &rows)
}

/// The USED cell: what the records charge, and what the memory audit found
/// the driver holding beyond it, e.g. `1GiB (+512MiB untracked)`.
fn used_cell(d: &SliceDeviceOut) -> String {
    if d.untracked_bytes == 0 {
        return Bytes(d.used_bytes).to_string();
    }
    format!("{} (+{} untracked)", Bytes(d.used_bytes), Bytes(d.untracked_bytes))
}

/// The LIMIT cell: the guarantee, and for a bursting slice what it has
/// been lent of its burst cap, e.g. `1GiB (+512MiB, burst 4GiB)`.
fn memory_cell(d: &SliceDeviceOut) -> String {
    if d.memory_burst_bytes == 0 {
        return Bytes(d.memory_limit_bytes).to_string();
    }
    format!("{} (+{}, burst {})", Bytes(d.memory_limit_bytes), Bytes(d.memory_granted_bytes), Bytes(d.memory_burst_bytes))
}

pub fn json<T: Serialize>(v: &T) -> String {
    serde_json::to_string_pretty(v).expect("output structs serialize") + "\n"
}
