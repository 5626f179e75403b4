//! The kubelet's device-manager checkpoint: which container holds which
//! devices of each extended resource, as the kubelet last wrote it down in
//! `<kubelet dir>/device-plugins/kubelet_internal_checkpoint`.
//!
//! The device plugin reads it only while the kubelet's pod-resources list
//! cannot be trusted to name every container: a kubelet that restarted
//! and has not reached the API server lists no pod the API server gave it,
//! yet it restores its device allocations from this file, and once synced
//! restarts the pods' stopped containers with them, without a new
//! `Allocate`. A slice whose units the checkpoint names is then not swept.
//!
//! The format is the kubelet's (JSON): `{"Data": {"PodDeviceEntries":
//! [{"PodUID", "ContainerName", "ResourceName", "DeviceIDs", "AllocResp"}],
//! "RegisteredDevices": {…}}, "Checksum": n}`. `DeviceIDs` maps a NUMA node
//! to its device IDs (kubelets since 1.20); a plain list (older kubelets)
//! is read too. Fields this reader does not use are ignored, so are fields
//! a later kubelet may add. The checksum is not verified: it is a hash of
//! the Go structure's printed form, which only Go reproduces. The kubelet
//! writes the file whole (a temporary file renamed over it), so a read sees
//! one complete version.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The checkpoint's file name, in the kubelet's `device-plugins/`.
pub const FILE: &str = "kubelet_internal_checkpoint";

/// A checkpoint larger than this is refused (a kubelet writes a few hundred
/// bytes per container).
pub const MAX_BYTES: u64 = 64 << 20;

/// One container's devices of one resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub pod_uid: String,
    pub container: String,
    pub resource: String,
    /// The device IDs, NUMA nodes in order.
    pub ids: Vec<String>,
}

/// Why the checkpoint could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("cannot read the kubelet's device checkpoint {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("the kubelet's device checkpoint {path} is {size} bytes, over the {MAX_BYTES} this plugin reads; is it the kubelet's?")]
    TooLarge { path: PathBuf, size: u64 },
    #[error("the kubelet's device checkpoint {path} does not parse ({why}); the kubelet rewrites it at its next allocation")]
    Parse { path: PathBuf, why: String },
}

#[derive(Deserialize)]
struct RawFile {
    #[serde(rename = "Data")]
    data: RawData,
}

#[derive(Deserialize)]
struct RawData {
    /// `null` when the kubelet holds no allocation (Go's nil slice).
    #[serde(rename = "PodDeviceEntries", default)]
    entries: Option<Vec<RawEntry>>,
}

#[derive(Deserialize)]
struct RawEntry {
    #[serde(rename = "PodUID", default)]
    pod_uid: String,
    #[serde(rename = "ContainerName", default)]
    container: String,
    #[serde(rename = "ResourceName")]
    resource: String,
    #[serde(rename = "DeviceIDs", default)]
    ids: Option<RawIds>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawIds {
    /// NUMA node (a decimal, -1 for none) → IDs.
    PerNuma(BTreeMap<String, Option<Vec<String>>>),
    /// Kubelets before 1.20.
    Flat(Vec<String>),
}

/// Parses a checkpoint's bytes.
pub fn parse(bytes: &[u8]) -> Result<Vec<Entry>, String> {
    let raw: RawFile = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    let entries = raw.data.entries.unwrap_or_default();
    let mut out = Vec::with_capacity(entries.len());
    for e in entries {
        let ids = match e.ids {
            None => Vec::new(),
            Some(RawIds::Flat(ids)) => ids,
            Some(RawIds::PerNuma(by_node)) => {
                let mut nodes = Vec::with_capacity(by_node.len());
                for (node, ids) in by_node {
                    let n: i64 = node.parse().map_err(|_| format!("NUMA node '{node}' of pod {} is not a number", e.pod_uid))?;
                    nodes.push((n, ids.unwrap_or_default()));
                }
                nodes.sort_by_key(|(n, _)| *n);
                nodes.into_iter().flat_map(|(_, ids)| ids).collect()
            }
        };
        out.push(Entry { pod_uid: e.pod_uid, container: e.container, resource: e.resource, ids });
    }
    Ok(out)
}

/// Reads the checkpoint in `device_plugin_dir`: `None` when there is none
/// (a kubelet that has never allocated a device).
pub fn read(device_plugin_dir: &Path) -> Result<Option<Vec<Entry>>, CheckpointError> {
    use std::io::Read;
    let path = device_plugin_dir.join(FILE);
    let file = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(CheckpointError::Read { path, source }),
    };
    let mut bytes = Vec::new();
    file.take(MAX_BYTES + 1).read_to_end(&mut bytes).map_err(|source| CheckpointError::Read { path: path.clone(), source })?;
    if bytes.len() as u64 > MAX_BYTES {
        let size = std::fs::metadata(&path).map_or(bytes.len() as u64, |m| m.len());
        return Err(CheckpointError::TooLarge { path, size });
    }
    parse(&bytes).map(Some).map_err(|why| CheckpointError::Parse { path, why })
}

/// The device IDs each container holds of `resource` (containers holding
/// none left out).
pub fn held(entries: &[Entry], resource: &str) -> Vec<Vec<String>> {
    entries.iter().filter(|e| e.resource == resource && !e.ids.is_empty()).map(|e| e.ids.clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// As a kubelet of 1.20 or later writes it (AllocResp is base64 of the
    /// device plugin's protobuf answer).
    const CURRENT: &str = r#"{"Data":{"PodDeviceEntries":[
        {"PodUID":"u1","ContainerName":"main","ResourceName":"egpu.io/gpu-memory","DeviceIDs":{"1":["GPU-a_5"],"-1":["GPU-a_3","GPU-a_4"]},"AllocResp":"CgQKAkFCEgA="},
        {"PodUID":"u2","ContainerName":"side","ResourceName":"nvidia.com/gpu","DeviceIDs":{"0":["GPU-b"]},"AllocResp":null},
        {"PodUID":"u3","ContainerName":"empty","ResourceName":"egpu.io/gpu-memory","DeviceIDs":{"0":null}}
    ],"RegisteredDevices":{"egpu.io/gpu-memory":["GPU-a_0","GPU-a_1"]}},"Checksum":3101519870}"#;

    #[test]
    fn reads_the_current_format_numa_nodes_in_order() {
        let e = parse(CURRENT.as_bytes()).unwrap();
        assert_eq!(e.len(), 3);
        assert_eq!(e[0], Entry { pod_uid: "u1".into(), container: "main".into(), resource: "egpu.io/gpu-memory".into(), ids: vec!["GPU-a_3".into(), "GPU-a_4".into(), "GPU-a_5".into()] });
        assert_eq!(held(&e, "egpu.io/gpu-memory"), vec![vec!["GPU-a_3".to_string(), "GPU-a_4".into(), "GPU-a_5".into()]]);
        assert_eq!(held(&e, "nvidia.com/gpu"), vec![vec!["GPU-b".to_string()]]);
    }

    #[test]
    fn reads_the_format_before_numa_nodes_and_an_empty_kubelet() {
        let old = r#"{"Data":{"PodDeviceEntries":[{"PodUID":"u","ContainerName":"c","ResourceName":"r/x","DeviceIDs":["d2","d1"],"AllocResp":"AA=="}],"RegisteredDevices":null},"Checksum":1}"#;
        assert_eq!(held(&parse(old.as_bytes()).unwrap(), "r/x"), vec![vec!["d2".to_string(), "d1".into()]]);
        let empty = r#"{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{}},"Checksum":0}"#;
        assert!(parse(empty.as_bytes()).unwrap().is_empty());
        // A field a later kubelet adds is ignored.
        let newer = r#"{"Version":3,"Data":{"PodDeviceEntries":[{"PodUID":"u","ContainerName":"c","ResourceName":"r/x","DeviceIDs":{"0":["d"]},"Extra":{"k":1}}]},"Checksum":1}"#;
        assert_eq!(held(&parse(newer.as_bytes()).unwrap(), "r/x"), vec![vec!["d".to_string()]]);
    }

    #[test]
    fn refuses_what_is_not_a_checkpoint_with_the_reason() {
        for (bad, why) in [
            ("", "EOF"),
            ("{\"Data\":{\"PodDeviceEntries\":[{\"PodUID\":\"u\"", "EOF"),
            ("[]", "expected struct"),
            ("{\"Checksum\":1}", "missing field `Data`"),
            (r#"{"Data":{"PodDeviceEntries":[{"PodUID":"u","DeviceIDs":["d"]}]}}"#, "missing field `ResourceName`"),
            (r#"{"Data":{"PodDeviceEntries":[{"PodUID":"u9","ResourceName":"r","DeviceIDs":{"zero":["d"]}}]}}"#, "NUMA node 'zero' of pod u9"),
            (r#"{"Data":{"PodDeviceEntries":[{"PodUID":"u","ResourceName":"r","DeviceIDs":7}]}}"#, "did not match any variant"),
        ] {
            let e = parse(bad.as_bytes()).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn a_missing_file_is_none_and_a_bad_one_names_its_path() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        assert!(read(dir).unwrap().is_none());
        std::fs::write(dir.join(FILE), CURRENT).unwrap();
        assert_eq!(read(dir).unwrap().unwrap().len(), 3);
        std::fs::write(dir.join(FILE), "{\"Data\":").unwrap();
        let e = read(dir).unwrap_err().to_string();
        assert!(e.contains(FILE) && e.contains("does not parse"), "{e}");
        std::fs::write(dir.join(FILE), vec![b' '; usize::try_from(MAX_BYTES).unwrap() + 1]).unwrap();
        let e = read(dir).unwrap_err().to_string();
        assert!(e.contains("over the"), "{e}");
    }

    proptest! {
        /// Any bytes: an answer, never a panic.
        #[test]
        fn any_bytes_parse_or_are_refused(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = parse(&bytes);
        }

        /// What a kubelet writes comes back: every entry, its IDs in NUMA
        /// order.
        #[test]
        fn written_entries_come_back(entries in proptest::collection::vec(("[a-z0-9-]{1,12}", "[a-z]{1,8}/[a-z]{1,8}", proptest::collection::btree_map(-1i64..4, proptest::collection::vec("[A-Za-z0-9_-]{1,10}", 0..4), 0..3)), 0..6)) {
            let raw: Vec<serde_json::Value> = entries.iter().map(|(uid, res, by_node)| serde_json::json!({
                "PodUID": uid, "ContainerName": "c", "ResourceName": res,
                "DeviceIDs": by_node.iter().map(|(n, ids)| (n.to_string(), serde_json::json!(ids))).collect::<serde_json::Map<_, _>>(),
                "AllocResp": "AA==",
            })).collect();
            let text = serde_json::json!({"Data": {"PodDeviceEntries": raw, "RegisteredDevices": {}}, "Checksum": 1}).to_string();
            let got = parse(text.as_bytes()).unwrap();
            prop_assert_eq!(got.len(), entries.len());
            for (g, (uid, res, by_node)) in got.iter().zip(&entries) {
                prop_assert_eq!(&g.pod_uid, uid);
                prop_assert_eq!(&g.resource, res);
                let want: Vec<String> = by_node.values().flatten().cloned().collect();
                prop_assert_eq!(&g.ids, &want);
            }
        }
    }
}
