//! `cargo +nightly fuzz run fuzz_dra_claim`: the DRA plugin must turn any
//! ResourceClaim the API could send into a slice plan or a reason, without
//! panicking, and a plan never guarantees more than a GPU, never caps below
//! the guarantee, and only names GPUs of the node. The input is the
//! claim's JSON; the Kubernetes quantity reader is run on every consumed
//! amount it holds, alone.
#![no_main]
use egpu_k8s::dra::{DEFAULT_DRIVER, plan};
use egpu_k8s::tokens::Gpu;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(claim) = serde_json::from_slice::<k8s_openapi::api::resource::v1::ResourceClaim>(data) else { return };
    for r in claim.status.iter().flat_map(|s| s.allocation.iter()).flat_map(|a| a.devices.iter()).flat_map(|d| d.results.iter().flatten()) {
        for q in r.consumed_capacity.iter().flat_map(|c| c.values()) {
            let _ = egpu_k8s::quantity::ceil_times(&q.0, 100);
        }
    }
    let gpus: Vec<Gpu> = (0..2).map(|i| Gpu { index: i, uuid: format!("GPU-{i}"), model: "m".into(), memory_bytes: 16 << 30 }).collect();
    if let Ok(p) = plan(&claim, DEFAULT_DRIVER, "node-a", &gpus) {
        assert!(!p.devices.is_empty() && !p.results.is_empty());
        for d in &p.devices {
            assert!(d.device < 2 && d.memory_bytes > 0 && d.compute_share_bps <= 10_000);
            assert!(d.compute_limit_bps >= d.compute_share_bps && d.compute_limit_bps <= 10_000);
            assert!(d.memory_burst_bytes == 0 || d.memory_burst_bytes >= d.memory_bytes);
        }
    }
});
