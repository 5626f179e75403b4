//! The node annotation `egpu.io/gpus`: what each GPU of a node has free, in
//! the plugin's memory units. The device plugin writes it on its own Node
//! (`--node-name`); the scheduler extender reads it from the Node objects
//! the scheduler sends, to check that a pod fits on *one* GPU (the kubelet
//! only counts the node's total) and to score nodes with the placement
//! policy.

use serde::{Deserialize, Serialize};

/// The annotation key.
pub const ANNOTATION: &str = "egpu.io/gpus";
/// The format version this code writes and reads.
pub const VERSION: u32 = 1;

/// One GPU of a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuFree {
    /// egpud's device index.
    pub index: u32,
    pub uuid: String,
    /// The GPU's model name, e.g. `NVIDIA H200`.
    pub model: String,
    /// Memory units (tokens) the GPU has.
    pub units: u32,
    /// Units neither held by a container nor reserved by a slice made
    /// outside Kubernetes.
    pub free: u32,
    /// The GPU's NVLink group (the lowest egpud index of the GPUs NVLink
    /// joins it to); absent when egpud cannot say, or from a plugin
    /// before this field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlink: Option<u32>,
    /// The NUMA node nearest the GPU; absent when there is none, egpud
    /// does not know it, or from a plugin before this field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa: Option<u32>,
    /// The GPU's PCIe switch group (the lowest egpud index of the GPUs
    /// PCIe switches join it to without a host bridge); absent when egpud
    /// cannot say, or from a plugin before this field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie: Option<u32>,
}

/// The annotation's value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeGpus {
    /// Format version ([`VERSION`]).
    pub v: u32,
    /// Bytes per unit.
    pub unit_bytes: u64,
    pub gpus: Vec<GpuFree>,
    /// The pods (`namespace/name`) whose containers hold units here, with
    /// the units they hold, from the same read of the kubelet's list as
    /// `free`: those units are counted in `free`. The extender's bind drops
    /// what it assumed for a pod once the pod holds all of it here. Absent
    /// (a plugin before this field): assumptions last their whole time to
    /// live.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<std::collections::BTreeMap<String, u32>>,
    /// Where each pod's units are, by pod UID: GPU index → units it holds
    /// there, from the same read as `free`. The extender's preemption
    /// (`preemptVerb`) gives a victim's units back to those GPUs. A pod
    /// whose UID the plugin has not seen (it follows the node's pods) is
    /// left out: its units are not given back, so preemption passes over a
    /// node rather than evicting pods that would not make room. Absent: a
    /// plugin before this field (skipped, like `pods`, where not needed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holds: Option<std::collections::BTreeMap<String, std::collections::BTreeMap<u32, u32>>>,
}

/// Why a node's annotation cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnnotationError {
    #[error("node has no {ANNOTATION} annotation: run egpu-device-plugin on it with --node-name (and RBAC to patch its Node)")]
    Missing,
    #[error("node's {ANNOTATION} annotation is not valid: {0}")]
    Invalid(String),
    #[error("node's {ANNOTATION} annotation has format version {0}; this scheduler reads version {VERSION}: upgrade the older of the two")]
    Version(u32),
}

impl NodeGpus {
    /// Parses and checks an annotation value.
    pub fn parse(value: Option<&str>) -> Result<NodeGpus, AnnotationError> {
        NodeGpus::parse_with(value, true)
    }

    /// [`NodeGpus::parse`], skipping the pod list unless `with_pods` (the
    /// extender needs it only for a node it has bound pods to; skipped, the
    /// list is scanned but its names are not allocated).
    pub fn parse_with(value: Option<&str>, with_pods: bool) -> Result<NodeGpus, AnnotationError> {
        #[derive(Deserialize)]
        struct Lean {
            v: u32,
            unit_bytes: u64,
            gpus: Vec<GpuFree>,
        }
        let value = value.ok_or(AnnotationError::Missing)?;
        #[derive(Deserialize)]
        struct Versioned {
            v: u32,
        }
        let v: Versioned = serde_json::from_str(value).map_err(|e| AnnotationError::Invalid(e.to_string()))?;
        if v.v != VERSION {
            return Err(AnnotationError::Version(v.v));
        }
        let invalid = |e: serde_json::Error| AnnotationError::Invalid(e.to_string());
        let n: NodeGpus = if with_pods {
            serde_json::from_str(value).map_err(invalid)?
        } else {
            let l: Lean = serde_json::from_str(value).map_err(invalid)?;
            NodeGpus { v: l.v, unit_bytes: l.unit_bytes, gpus: l.gpus, pods: None, holds: None }
        };
        if n.unit_bytes == 0 {
            return Err(AnnotationError::Invalid("unit_bytes is 0".into()));
        }
        if let Some(g) = n.gpus.iter().find(|g| g.free > g.units) {
            return Err(AnnotationError::Invalid(format!("GPU {} has {} units free of {}", g.index, g.free, g.units)));
        }
        // Placement names a GPU by UUID and preemption by index: two GPUs
        // with one name would take units off the wrong one. The plugin
        // never writes this; a hand edit or another writer of the Node can.
        let mut seen_uuid = std::collections::BTreeSet::new();
        let mut seen_index = std::collections::BTreeSet::new();
        for g in &n.gpus {
            if !seen_uuid.insert(g.uuid.as_str()) {
                return Err(AnnotationError::Invalid(format!("two GPUs have UUID {:?}; each GPU must be listed once (the device plugin rewrites the annotation when it next runs)", g.uuid)));
            }
            if !seen_index.insert(g.index) {
                return Err(AnnotationError::Invalid(format!("two GPUs have index {}; each GPU must be listed once (the device plugin rewrites the annotation when it next runs)", g.index)));
            }
        }
        Ok(n)
    }

    /// Takes one container's `units` off `free` where the device plugin
    /// would place them: on one GPU, best fit ([`crate::tokens::best_fit`]:
    /// the least free that holds them, then the lower UUID); or, for a container larger than any one
    /// GPU, whole free GPUs ([`crate::tokens::whole_gpus`]: of one size that
    /// divides `units`, the largest such, in one NVLink group when one has
    /// enough, lowest UUIDs). False, and nothing
    /// taken, when they do not fit.
    pub fn take(&mut self, units: u32) -> bool {
        let free: Vec<(&str, u32)> = self.gpus.iter().map(|g| (g.uuid.as_str(), g.free)).collect();
        if let Some(uuid) = crate::tokens::best_fit(&free, units).map(str::to_string)
            && let Some(g) = self.gpus.iter_mut().find(|g| g.uuid == uuid)
        {
            g.free -= units;
            return true;
        }
        if self.gpus.iter().any(|g| g.units >= units) {
            return false;
        }
        let free: Vec<(&str, u32, crate::tokens::Link)> = self.gpus.iter().filter(|g| g.units > 0 && g.free == g.units).map(|g| (g.uuid.as_str(), g.units, crate::tokens::Link { nvlink: g.nvlink, numa: g.numa, pcie: g.pcie })).collect();
        let Some(chosen) = crate::tokens::whole_gpus(&free, units, &[]) else { return false };
        let chosen: Vec<String> = chosen.into_iter().map(str::to_string).collect();
        for g in self.gpus.iter_mut().filter(|g| chosen.contains(&g.uuid)) {
            g.free = 0;
        }
        true
    }

    /// Takes `units` off the GPU `uuid` (where a hint puts a container,
    /// [`crate::hint`]); false, and nothing taken, when it has no such GPU
    /// or not that many units free.
    pub fn take_on(&mut self, uuid: &str, units: u32) -> bool {
        match self.gpus.iter_mut().find(|g| g.uuid == uuid && g.free >= units) {
            Some(g) => {
                g.free -= units;
                true
            }
            None => false,
        }
    }

    /// The GPUs alone, without the pod lists (what placing units needs).
    pub fn gpus_only(&self) -> NodeGpus {
        NodeGpus { v: self.v, unit_bytes: self.unit_bytes, gpus: self.gpus.clone(), pods: None, holds: None }
    }

    /// Gives back the units the pods `uids` hold here (per `holds`) to
    /// their GPUs' free units, never above a GPU's units: what the node
    /// would have free once those pods are gone. Returns the units given
    /// back (a pod `holds` does not name gives none; a UID named twice
    /// gives once).
    pub fn release(&mut self, uids: &[&str]) -> u64 {
        let Some(holds) = &self.holds else { return 0 };
        let uids: std::collections::BTreeSet<&str> = uids.iter().copied().collect();
        let mut back = 0;
        for per_gpu in uids.iter().filter_map(|u| holds.get(*u)) {
            for (&index, &units) in per_gpu {
                if let Some(g) = self.gpus.iter_mut().find(|g| g.index == index) {
                    let add = units.min(g.units.saturating_sub(g.free));
                    g.free += add;
                    back += u64::from(add);
                }
            }
        }
        back
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("plain data serialises")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> NodeGpus {
        NodeGpus {
            v: VERSION,
            unit_bytes: 1 << 30,
            gpus: vec![GpuFree { index: 0, uuid: "GPU-a".into(), model: "NVIDIA H200".into(), units: 141, free: 20, nvlink: None, numa: None, pcie: None }],
            pods: Some([("default/a".to_string(), 20)].into()),
            holds: Some([("uid-a".to_string(), [(0, 20)].into())].into()),
        }
    }

    #[test]
    fn take_places_as_the_plugin_does() {
        let node = |free: &[u32]| NodeGpus {
            v: VERSION,
            unit_bytes: 1 << 30,
            gpus: free.iter().enumerate().map(|(i, &f)| GpuFree { index: i as u32, uuid: format!("GPU-{i}"), model: "m".into(), units: 16, free: f, nvlink: None, numa: None, pcie: None }).collect(),
            pods: None,
            holds: None,
        };
        let free = |g: &NodeGpus| g.gpus.iter().map(|x| x.free).collect::<Vec<_>>();
        // One GPU, best fit, ties to the lower UUID.
        let mut g = node(&[16, 10, 10]);
        assert!(g.take(8));
        assert_eq!(free(&g), [16, 2, 10]);
        // Larger than a GPU: whole free GPUs only, a multiple of 16.
        let mut g = node(&[16, 15, 16, 16]);
        assert!(g.take(32));
        assert_eq!(free(&g), [0, 15, 0, 16]);
        assert!(!g.take(32), "one whole GPU left");
        assert!(!g.take(20), "not a multiple of a GPU");
        assert_eq!(free(&g), [0, 15, 0, 16], "nothing taken when it does not fit");
        assert!(!node(&[4]).take(5));
        // GPUs of two sizes: whole GPUs of one size that divides the request.
        let mut g = node(&[16, 16, 16]);
        g.gpus[0].units = 8;
        g.gpus[0].free = 8;
        assert!(g.take(32));
        assert_eq!(free(&g), [8, 0, 0]);
    }

    #[test]
    fn round_trips_and_refuses_what_it_cannot_use() {
        let s = sample();
        assert_eq!(NodeGpus::parse(Some(&s.to_json())), Ok(s.clone()));
        // Written before the pod list existed: read, with no list.
        let old = r#"{"v":1,"unit_bytes":1073741824,"gpus":[]}"#;
        assert_eq!(NodeGpus::parse(Some(old)).unwrap().pods, None);
        // Without the pod list: the rest the same.
        let lean = NodeGpus::parse_with(Some(&s.to_json()), false).unwrap();
        assert_eq!((lean.pods, lean.holds, lean.gpus), (None, None, s.gpus.clone()));
        assert!(s.to_json().contains(r#""holds":{"uid-a":{"0":20}}"#), "{}", s.to_json());
        assert_eq!(NodeGpus::parse(None), Err(AnnotationError::Missing));
        assert!(matches!(NodeGpus::parse(Some("{")), Err(AnnotationError::Invalid(_))));
        assert_eq!(NodeGpus::parse(Some(r#"{"v":2,"whatever":1}"#)), Err(AnnotationError::Version(2)));
        let mut bad = s.clone();
        bad.gpus[0].free = 142;
        let e = NodeGpus::parse(Some(&bad.to_json())).unwrap_err();
        assert!(e.to_string().contains("141"), "{e}");
        let mut bad = s.clone();
        bad.unit_bytes = 0;
        assert!(matches!(NodeGpus::parse(Some(&bad.to_json())), Err(AnnotationError::Invalid(_))));
        // One GPU listed twice, by UUID or by index: refused, with the name.
        let mut twice = s.clone();
        twice.gpus.push(GpuFree { index: 1, ..s.gpus[0].clone() });
        let e = NodeGpus::parse(Some(&twice.to_json())).unwrap_err();
        assert!(e.to_string().contains("two GPUs have UUID \"GPU-a\""), "{e}");
        let mut twice = s.clone();
        twice.gpus.push(GpuFree { uuid: "GPU-b".into(), ..s.gpus[0].clone() });
        let e = NodeGpus::parse_with(Some(&twice.to_json()), false).unwrap_err();
        assert!(e.to_string().contains("two GPUs have index 0"), "{e}");
    }

    proptest::proptest! {
        /// Whatever GPU list an annotation carries, what parses can be
        /// placed on: `take` never panics, never leaves a GPU with more
        /// free than it has or takes what was not free, and the units it
        /// takes are the ones asked for (or all of whole GPUs).
        #[test]
        fn any_parsed_annotation_takes_without_panicking(
            gpus in proptest::collection::vec((0u32..4, 0usize..4, 0u32..20, 0u32..24), 0..6),
            asks in proptest::collection::vec(0u32..50, 1..6),
        ) {
            let gpus: Vec<GpuFree> = gpus
                .into_iter()
                .map(|(index, u, units, free)| GpuFree { index, uuid: format!("GPU-{u}"), model: "m".into(), units, free, nvlink: None, numa: None, pcie: None })
                .collect();
            let json = NodeGpus { v: VERSION, unit_bytes: 1 << 30, gpus, pods: None, holds: None }.to_json();
            let Ok(mut n) = NodeGpus::parse(Some(&json)) else { return Ok(()) };
            for units in asks {
                let before: u64 = n.gpus.iter().map(|g| u64::from(g.free)).sum();
                let took = n.take(units);
                let after: u64 = n.gpus.iter().map(|g| u64::from(g.free)).sum();
                proptest::prop_assert!(n.gpus.iter().all(|g| g.free <= g.units));
                if took {
                    proptest::prop_assert!(before - after >= u64::from(units));
                } else {
                    proptest::prop_assert_eq!(before, after);
                }
            }
        }
    }

    #[test]
    fn release_gives_the_victims_units_back_to_their_gpus() {
        let gpu = |index: u32, free: u32| GpuFree { index, uuid: format!("GPU-{index}"), model: "m".into(), units: 16, free, nvlink: None, numa: None, pcie: None };
        let mut g = NodeGpus {
            v: VERSION,
            unit_bytes: 1 << 30,
            gpus: vec![gpu(0, 2), gpu(1, 0)],
            pods: None,
            holds: Some([("a".to_string(), [(0, 6), (1, 4)].into()), ("b".to_string(), [(1, 12)].into())].into()),
        };
        // An unknown UID gives nothing back.
        assert_eq!(g.release(&["zz"]), 0);
        assert_eq!(g.release(&["a", "a"]), 10, "named twice, given once");
        assert_eq!(g.gpus.iter().map(|x| x.free).collect::<Vec<_>>(), [8, 4]);
        // Never above a GPU's units, whatever a stale list says.
        g.gpus[1].free = 10;
        assert_eq!(g.release(&["b"]), 6);
        assert_eq!(g.gpus[1].free, 16);
        let mut none = NodeGpus { holds: None, ..g.clone() };
        assert_eq!(none.release(&["a"]), 0, "a plugin before `holds` gives nothing back");
    }
}
