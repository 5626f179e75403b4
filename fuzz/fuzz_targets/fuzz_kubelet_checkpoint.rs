//! `RUSTC_BOOTSTRAP=1 cargo fuzz run fuzz_kubelet_checkpoint`: the reader of
//! the kubelet's device checkpoint must answer any bytes without panicking,
//! and whatever it reads must come back the same when written again in the
//! kubelet's format.
#![no_main]
use egpu_k8s::checkpoint::{held, parse};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(entries) = parse(data) else { return };
    let raw: Vec<serde_json::Value> = entries
        .iter()
        .map(|e| serde_json::json!({"PodUID": e.pod_uid, "ContainerName": e.container, "ResourceName": e.resource, "DeviceIDs": {"0": e.ids}}))
        .collect();
    let again = parse(serde_json::json!({"Data": {"PodDeviceEntries": raw}}).to_string().as_bytes()).expect("written back, it parses");
    assert_eq!(again, entries);
    for e in &entries {
        assert!(held(&entries, &e.resource).len() <= entries.len());
    }
});
