//! What the kubelet is told (the device list, the CDI devices) and what the
//! Node's annotation says, from egpud's inventory and slices. Pure.

use super::{HEALTHY, Holder, PluginConfig, PodAnnotations, UNHEALTHY};
use crate::annotation::{self, GpuFree, NodeGpus};
use crate::deviceplugin as dp;
use crate::tokens::{self, Inventory, SLICE_PREFIX};
use egpu_node::proto as node;
use std::collections::{HashMap, HashSet};

/// The device list for the kubelet: every token, healthy except as many of
/// each GPU's highest-numbered tokens no container holds as the memory
/// egpud has promised elsewhere covers (rounded up): the guarantees of
/// slices made outside Kubernetes, of plugin slices no container holds any
/// more (known only when the kubelet's list could be read), and burst
/// memory lent to any slice. With `numa`, each unit carries its GPU's
/// NUMA node for the kubelet's Topology Manager, if egpud knows every
/// GPU's: once any device of a resource has one, the kubelet counts only
/// devices with one, so a GPU of unknown node would never be chosen.
pub(super) fn advertise(inv: &Inventory, slices: &[node::Slice], held: Option<&Vec<Vec<String>>>, numa: bool) -> Vec<dp::Device> {
    let live: Option<HashSet<String>> = held.map(|h| h.iter().map(|ids| tokens::slice_name(ids)).collect());
    let mut foreign: HashMap<u32, u64> = HashMap::new();
    for s in slices {
        // A plugin slice whose units a container holds is counted by those
        // units; one no container holds any more (waiting for the sweep)
        // still has its memory in egpud, but the kubelet has freed its units.
        let counted = !s.name.starts_with(SLICE_PREFIX) || live.as_ref().is_some_and(|l| !l.contains(&s.name));
        for d in &s.devices {
            // Burst memory lent to a slice cannot be guaranteed to a new one either.
            *foreign.entry(d.device).or_default() += if counted { d.memory_limit_bytes } else { 0 } + d.memory_granted_bytes;
        }
    }
    let held: HashSet<&str> = held.map(|h| h.iter().flatten().map(String::as_str).collect()).unwrap_or_default();
    let numa = numa && inv.numa_known();
    let mut out = Vec::new();
    for g in &inv.gpus {
        let n = inv.tokens_of(g);
        let mut reserve = foreign.get(&g.index).copied().unwrap_or(0).div_ceil(inv.unit_bytes);
        let mut health = vec![HEALTHY; n as usize];
        for k in (0..n).rev() {
            if reserve == 0 {
                break;
            }
            if !held.contains(tokens::token_id(&g.uuid, k).as_str()) {
                health[k as usize] = UNHEALTHY;
                reserve -= 1;
            }
        }
        // The GPU's NUMA node, for the kubelet's Topology Manager to align
        // the container's CPUs and memory with (none: no preference).
        let topology = g.numa.filter(|_| numa).map(|n| dp::TopologyInfo { nodes: vec![dp::NumaNode { id: i64::from(n) }] });
        out.extend((0..n).map(|k| dp::Device { id: tokens::token_id(&g.uuid, k), health: health[k as usize].into(), topology: topology.clone() }));
    }
    out
}

/// gRPC's default limit on a received message, which the kubelet's
/// device-plugin client keeps: a longer `ListAndWatch` answer ends the
/// stream, and the kubelet sees no device.
pub(super) const KUBELET_MAX_MESSAGE: usize = 4 << 20;

/// `Err` saying which `--memory-unit` would do when the `ListAndWatch`
/// answer with `devices` (units of `unit_bytes`) exceeds
/// [`KUBELET_MAX_MESSAGE`].
pub(super) fn check_list_size(devices: &[dp::Device], unit_bytes: u64) -> Result<(), String> {
    let len: usize = devices.iter().map(|d| prost::encoding::message::encoded_len(1, d)).sum();
    if len <= KUBELET_MAX_MESSAGE {
        return Ok(());
    }
    // The list shrinks with the number of units: scale the unit by the
    // excess, in whole MiB, rounded up to a power of two (fewer units also
    // have shorter IDs, so the list then fits with room to spare).
    let mib = (u128::from(unit_bytes) * len as u128).div_ceil(KUBELET_MAX_MESSAGE as u128 * (1 << 20));
    let fits = egpu_core::quantity::Bytes(u64::try_from(mib).unwrap_or(u64::MAX / 2).next_power_of_two() << 20);
    Err(format!(
        "the node's {} units of {} make a device list of {len} B, above the kubelet's 4 MiB limit on a gRPC message (it would end the ListAndWatch stream and see no device); use --memory-unit {fits} or larger",
        devices.len(),
        egpu_core::quantity::Bytes(unit_bytes)
    ))
}

/// The CDI devices a container gets: its slice, and its GPUs from the
/// vendor's spec when `--gpu-cdi-kind` names one.
pub(super) fn cdi_devices<'a>(cfg: &PluginConfig, slice: &str, gpus: impl Iterator<Item = &'a tokens::Gpu>) -> Vec<dp::CdiDevice> {
    let mut out = vec![dp::CdiDevice { name: egpu_node::cdi::device_name(slice) }];
    if let Some(kind) = cfg.gpu_cdi_kind.as_deref().filter(|k| !k.is_empty()) {
        out.extend(gpus.map(|g| dp::CdiDevice { name: super::gpu_cdi_device(kind, g.index) }));
    }
    out
}

/// A slice's default guaranteed compute on `gpu`, in basis points: its
/// memory's fraction of the GPU, or all of it for every unit of the GPU (a
/// GPU's memory is seldom a whole number of units: an H100 80 GB's
/// 81,559 MiB is 79 units of 1 GiB, whose fraction would leave 0.8% idle).
pub(super) fn default_share(inv: &Inventory, gpu: &tokens::Gpu, memory: u64) -> u32 {
    if memory >= u64::from(inv.tokens_of(gpu)) * inv.unit_bytes {
        return 10_000;
    }
    u32::try_from((u128::from(memory) * 10_000 / u128::from(gpu.memory_bytes.max(1))).min(10_000)).unwrap_or(10_000)
}

/// The node annotation: per GPU, its units and those that are healthy and
/// held by no container (of `holders`, or of `also_held`: the units of
/// the kubelet's checkpoint while its list is not synced); the pods that
/// hold units; and, for the pods of the followed list (`pods`, by name:
/// their UIDs), which GPUs they hold.
pub(super) fn node_gpus(inv: &Inventory, devices: &[dp::Device], holders: &[Holder], also_held: &[Vec<String>], pods_known: Option<&PodAnnotations>) -> NodeGpus {
    let held: HashSet<&str> = holders.iter().flat_map(|h| &h.ids).chain(also_held.iter().flatten()).map(String::as_str).collect();
    let mut pods: std::collections::BTreeMap<String, u32> = std::collections::BTreeMap::new();
    let mut holds: std::collections::BTreeMap<String, std::collections::BTreeMap<u32, u32>> = std::collections::BTreeMap::new();
    // A token counts once, as in `free`, even if listed twice.
    let mut placed: HashSet<&str> = HashSet::new();
    for h in holders {
        *pods.entry(format!("{}/{}", h.namespace, h.pod)).or_default() += u32::try_from(h.ids.len()).unwrap_or(u32::MAX);
        let Some(info) = pods_known.and_then(|p| p.get(&(h.namespace.clone(), h.pod.clone()))).filter(|i| !i.uid.is_empty()) else { continue };
        let per_gpu = holds.entry(info.uid.clone()).or_default();
        for (uuid, _) in h.ids.iter().filter(|id| placed.insert(id.as_str())).filter_map(|id| tokens::parse_token(id)) {
            if let Some(g) = inv.gpus.iter().find(|g| g.uuid == uuid) {
                *per_gpu.entry(g.index).or_default() += 1;
            }
        }
    }
    let healthy: HashSet<&str> = devices.iter().filter(|d| d.health == HEALTHY).map(|d| d.id.as_str()).collect();
    let gpus = inv
        .gpus
        .iter()
        .map(|g| {
            let units = inv.tokens_of(g);
            let free = (0..units)
                .map(|k| tokens::token_id(&g.uuid, k))
                .filter(|id| !held.contains(id.as_str()) && healthy.contains(id.as_str()))
                .count();
            GpuFree { index: g.index, uuid: g.uuid.clone(), model: g.model.clone(), units, free: u32::try_from(free).unwrap_or(u32::MAX), nvlink: g.nvlink, numa: g.numa, pcie: g.pcie }
        })
        .collect();
    NodeGpus { v: annotation::VERSION, unit_bytes: inv.unit_bytes, gpus, pods: Some(pods), holds: Some(holds) }
}
