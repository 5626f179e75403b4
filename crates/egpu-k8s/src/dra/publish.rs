//! The ResourceSlice this node publishes: one device per GPU, with what
//! slices made outside the driver hold left out; and the digest that says
//! whether the stored one is current.

use super::{COMPUTE, MEMORY, MIN_MEMORY, SLICE_PREFIX, device_name};
use crate::tokens::Gpu;
use egpu_node::proto as node;
use k8s_openapi::api::resource::v1 as res;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::collections::BTreeMap;
use std::time::Duration;

fn quantity(v: u64) -> Quantity {
    Quantity(v.to_string())
}

/// What egpud has promised on a GPU to slices this driver did not make
/// (`egpu create` on the node, another plugin's), and the burst memory it
/// has lent: published capacities leave it out, so the scheduler does not
/// promise it again.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reserved {
    pub memory_bytes: u64,
    pub compute_bps: u32,
}

/// What the scheduler must not promise to claims, per GPU index: the
/// guarantees of slices not made by this driver, and the burst memory egpud
/// has lent to any slice (egpud admits no guarantee into lent memory, so a
/// claim scheduled there could not be prepared until the loan comes back).
pub fn reserved_elsewhere(slices: &[node::Slice]) -> BTreeMap<u32, Reserved> {
    let mut out: BTreeMap<u32, Reserved> = BTreeMap::new();
    for s in slices {
        let outside = !s.name.starts_with(SLICE_PREFIX);
        for d in &s.devices {
            let r = out.entry(d.device).or_default();
            let guaranteed = if outside { d.memory_limit_bytes } else { 0 };
            r.memory_bytes = r.memory_bytes.saturating_add(guaranteed).saturating_add(d.memory_granted_bytes);
            if outside {
                r.compute_bps = r.compute_bps.saturating_add(d.compute_share_bps);
            }
        }
    }
    out
}

/// Kubernetes' standard device attributes (`resource.kubernetes.io/`):
/// the NUMA node nearest the device (left out where sysfs says -1), its
/// PCI address, and its PCIe root complex (`pci<domain>:<bus>`).
pub const NUMA_NODE_ATTRIBUTE: &str = "resource.kubernetes.io/numaNode";
pub const PCI_BUS_ID_ATTRIBUTE: &str = "resource.kubernetes.io/pciBusID";
pub const PCIE_ROOT_ATTRIBUTE: &str = "resource.kubernetes.io/pcieRoot";

/// The spec of this node's ResourceSlice: one pool, named after the node,
/// with one device per GPU, its capacities less what `reserved` holds (a
/// GPU with under [`MIN_MEMORY`] left is left out).
pub fn resource_slice_spec(driver: &str, node: &str, gpus: &[Gpu], reserved: &BTreeMap<u32, Reserved>, generation: i64) -> res::ResourceSliceSpec {
    let devices = gpus
        .iter()
        .filter_map(|g| {
            let r = reserved.get(&g.index).copied().unwrap_or_default();
            let memory_bytes = g.memory_bytes.saturating_sub(r.memory_bytes);
            // Whole percents: a guarantee made outside takes its share rounded up.
            let compute_pct = 100u64.saturating_sub(u64::from(r.compute_bps).div_ceil(100));
            if memory_bytes < MIN_MEMORY {
                return None;
            }
            let attr_s = |s: &str| res::DeviceAttribute { string: Some(s.to_string()), ..Default::default() };
            let attr_i = |n: u32| res::DeviceAttribute { int: Some(i64::from(n)), ..Default::default() };
            let mut attributes = BTreeMap::from([("index".to_string(), attr_i(g.index)), ("uuid".to_string(), attr_s(&g.uuid)), ("model".to_string(), attr_s(&g.model))]);
            // Where the GPU is, when egpud knows: its NVLink group (ours),
            // and the standard attributes Kubernetes defines so that one
            // claim's devices of several drivers (a GPU and a NIC) can be
            // kept together with matchAttribute.
            let located = [
                ("nvlinkGroup", g.nvlink.map(attr_i)),
                ("pcieSwitchGroup", g.pcie.map(attr_i)),
                (NUMA_NODE_ATTRIBUTE, g.numa.map(attr_i)),
                (PCI_BUS_ID_ATTRIBUTE, g.pci_bus_id.as_deref().map(attr_s)),
                (PCIE_ROOT_ATTRIBUTE, g.pcie_root.as_deref().map(attr_s)),
            ];
            attributes.extend(located.into_iter().filter_map(|(name, v)| v.map(|v| (name.to_string(), v))));
            // A claim that names no amount gets the whole GPU's memory and no
            // compute guarantee (it still uses idle compute up to its cap).
            let memory = res::DeviceCapacity {
                value: quantity(memory_bytes),
                request_policy: Some(res::CapacityRequestPolicy {
                    default: Some(quantity(memory_bytes)),
                    valid_range: Some(res::CapacityRequestPolicyRange { min: quantity(MIN_MEMORY), max: Some(quantity(memory_bytes)), step: None }),
                    valid_values: None,
                }),
            };
            let compute = res::DeviceCapacity {
                value: quantity(compute_pct),
                request_policy: Some(res::CapacityRequestPolicy {
                    default: Some(quantity(0)),
                    valid_range: Some(res::CapacityRequestPolicyRange { min: quantity(0), max: Some(quantity(compute_pct)), step: None }),
                    valid_values: None,
                }),
            };
            Some(res::Device {
                name: device_name(g.index),
                attributes: Some(attributes),
                capacity: Some(BTreeMap::from([(MEMORY.to_string(), memory), (COMPUTE.to_string(), compute)])),
                allow_multiple_allocations: Some(true),
                ..Default::default()
            })
        })
        .collect();
    res::ResourceSliceSpec {
        driver: driver.to_string(),
        node_name: Some(node.to_string()),
        pool: res::ResourcePool { name: node.to_string(), generation, resource_slice_count: 1 },
        devices: Some(devices),
        ..Default::default()
    }
}

/// The annotation on the ResourceSlice that names what it was written
/// from: a digest of the spec as the plugin built it. The API server may
/// drop fields (of features that are off) and rewrites quantities in its
/// own canonical form, so the stored spec is not compared itself.
pub const DIGEST_ANNOTATION: &str = "egpu.io/spec-digest";

/// A digest of a spec (FNV-1a over its JSON, in hex): the same spec gives
/// the same digest in every build.
pub fn digest(spec: &res::ResourceSliceSpec) -> String {
    let json = serde_json::to_vec(spec).unwrap_or_default();
    let h = json.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3));
    format!("{h:016x}")
}

/// The ResourceSlice is read back this often even when nothing changed on
/// the node: the kubelet deletes its node's slices when it starts, and
/// anyone may delete one.
pub const REPUBLISH_EVERY: Duration = Duration::from_secs(60);
