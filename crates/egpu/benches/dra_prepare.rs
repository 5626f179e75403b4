//! `cargo bench -p egpu --bench dra_prepare [-- N]`: how long the kubelet
//! waits for `egpu-dra-plugin`, per claim, against what egpud alone takes
//! for the same slice, measured in one run (N rounds each, default 300).
//!
//! - **baseline**: egpud's `CreateSlice` then `DeleteSlice` of a 4 GiB,
//!   10% slice on GPU 0, through its gRPC socket (egpud writes and removes
//!   the slice's CDI spec within these calls);
//! - **prepare**: `NodePrepareResources` of a claim allocated that slice,
//!   over the plugin's socket: the plugin reads the ResourceClaim from the
//!   API-server stand-in (HTTP), reads egpud's GPUs and slices, creates the
//!   slice and checks its CDI spec; **unprepare**: `NodeUnprepareResources`.
//!
//! The rig is tests/dra.rs's (tests/common/dra.rs), with the plugin reading
//! egpud every 5 s (its default), so its refresh seldom competes.

#[path = "../tests/common/mod.rs"]
mod common;

use common::dra::{Rig, claim};
use egpu_node::proto as node;
use std::time::{Duration, Instant};

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort_unstable();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    let n: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(300);
    let rig = Rig::start();
    let _plugin = rig.plugin_polling("5s");
    let info = rig.register();
    rig.add(claim("bench", "uid-bench", &[("gpu", "gpu-0", Some(("4Gi", "10")))], None));
    let spec = node::DeviceShareSpec { device: 0, memory_bytes: 4 << 30, compute_share_bps: 1000, compute_limit_bps: 10_000, memory_burst_bytes: 0 };
    let (mut base, mut prep, mut unprep) = (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
    rig.rt.block_on(async {
        let mut egpud = egpu_node::client::connect(&rig.node.socket()).await.unwrap();
        let ch = egpu_k8s::unix_channel(std::path::Path::new(&info.endpoint), Duration::from_secs(30)).await.unwrap();
        let mut kubelet = egpu_k8s::dra::v1::dra_plugin_client::DraPluginClient::new(ch);
        let c = egpu_k8s::dra::v1::Claim { namespace: "default".into(), uid: "uid-bench".into(), name: "bench".into() };
        // Interleaved, with a warm-up round of each.
        for i in 0..=n {
            let t = Instant::now();
            let req = node::CreateSliceRequest { name: "bench-base".into(), devices: vec![spec], ..Default::default() };
            egpud.create_slice(req).await.unwrap();
            egpud.delete_slice(node::DeleteSliceRequest { name: "bench-base".into(), force: false }).await.unwrap();
            let b = t.elapsed();
            let t = Instant::now();
            let r = kubelet.node_prepare_resources(egpu_k8s::dra::v1::NodePrepareResourcesRequest { claims: vec![c.clone()] }).await.unwrap().into_inner();
            let p = t.elapsed();
            assert_eq!(r.claims["uid-bench"].error, "");
            let t = Instant::now();
            let r = kubelet.node_unprepare_resources(egpu_k8s::dra::v1::NodeUnprepareResourcesRequest { claims: vec![c.clone()] }).await.unwrap().into_inner();
            let u = t.elapsed();
            assert_eq!(r.claims["uid-bench"].error, "");
            if i > 0 {
                base.push(b);
                prep.push(p);
                unprep.push(u);
            }
        }
    });
    let base50 = pct(&mut base, 0.5);
    println!("{n} rounds each; p50 / p99, and p50 ÷ the baseline's p50");
    for (name, v) in [("egpud create + delete (baseline)", &mut base), ("NodePrepareResources", &mut prep), ("NodeUnprepareResources", &mut unprep)] {
        let (p50, p99) = (pct(v, 0.5), pct(v, 0.99));
        println!("{name:34} {:8.3} ms {:8.3} ms {:6.2}", p50.as_secs_f64() * 1e3, p99.as_secs_f64() * 1e3, p50.as_secs_f64() / base50.as_secs_f64());
    }
}
