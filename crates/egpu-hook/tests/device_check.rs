//! `scripts/device-check.sh --simulate`: the device check's non-GPU parts
//! (egpud, the memory suite through `egpu exec`, the driver witness,
//! fail-closed, live resize, the overhead bench) against the simulated GPU.

mod common;

use std::process::Command;

#[test]
fn device_check_passes_on_the_simulated_gpu() {
    let dir = common::build().clone();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut c = Command::new(cargo);
    c.args(["build", "-q", "-p", "egpu"]);
    if dir.file_name().is_some_and(|n| n == "release") {
        c.arg("--release");
    }
    assert!(c.status().unwrap().success(), "building egpud/egpu failed");
    let tmp = tempfile::tempdir().unwrap();
    let result = tmp.path().join("device-check.json");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/device-check.sh");
    let out = Command::new("bash").arg(script).arg("--simulate").arg("--dist").arg(&dir).arg(&result).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&result).unwrap_or_else(|e| panic!("no result file ({e}): {stderr}"))).unwrap();
    assert!(out.status.success(), "device-check failed: {:?}\n{stderr}", doc["failed"]);
    assert_eq!(doc["ok"], true);
    assert_eq!(doc["simulate"], true);
    let checks = doc["checks"].as_array().unwrap();
    for name in ["egpud-up", "view-direct", "view-dlopen", "view-procaddr", "alloc-vmm-procaddr", "alloc-graph-direct", "witness-holding", "fail-closed", "resize-probe", "hook-overhead"] {
        let c = checks.iter().find(|c| c["name"] == name).unwrap_or_else(|| panic!("check {name} missing"));
        assert_eq!(c["status"], "pass", "{c}");
    }
    assert!(checks.len() >= 38, "{} checks", checks.len());
}
