//! Latency of the scheduler extender on a 10,000-GPU cluster: 1,250 nodes
//! × 8 GPUs of 80 units (GiB), about 90% of the units taken, in the two ways
//! kube-scheduler can ask: every node sent whole (`nodeCacheCapable:
//! false`), with labels, conditions and an image list like a real Node's,
//! and an annotation that names the pods holding units (~10 units each); or
//! node names only (`nodeCacheCapable: true`), the annotations coming from
//! the extender's node cache, filled here from the same nodes.
//!
//! `cargo bench -p egpu-k8s --bench extender` prints p50 / p99 over 200
//! requests of each kind, in one run: parsing the request with Node objects
//! alone (the baseline every extender without a cache pays), and filter
//! and prioritize as the HTTP handlers run them (parse, decide, serialise
//! the answer: filter sends the passing Node objects, or names, back),
//! preemption as the scheduler asks it (125 candidate nodes, two victims
//! each, by UID), and their ratios to the baseline.

use egpu_k8s::annotation::{GpuFree, NodeGpus, VERSION};
use egpu_k8s::extender::{Extender, ExtenderArgs, NodeCache};
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use std::hint::black_box;
use std::time::{Duration, Instant};

const NODES: usize = 1250;
const GPUS: usize = 8;
const UNITS: u32 = 80;

fn node(i: usize, rng: &mut rand_chacha::ChaCha8Rng) -> Value {
    let gpus: Vec<GpuFree> = (0..GPUS)
        .map(|g| {
            // ~90% taken: most GPUs full, some with holes.
            let free = if rng.random_bool(0.6) { 0 } else { rng.random_range(0..=UNITS / 2) };
            GpuFree { index: g as u32, uuid: format!("GPU-{i:04}-{g}-0000-0000-000000000000"), model: "NVIDIA H100 80GB HBM3".into(), units: UNITS, free, nvlink: None, numa: None, pcie: None }
        })
        .collect();
    // The pods holding units, named as a Deployment names them: up to 10
    // units each, one GPU each; by name, and by UID with their GPU.
    let (mut pods, mut holds) = (std::collections::BTreeMap::new(), std::collections::BTreeMap::new());
    for g in &gpus {
        let mut left = g.units - g.free;
        while left > 0 {
            let (k, units) = (pods.len(), left.min(10));
            pods.insert(format!("team-{}/inference-{:09x}-{:05x}", k % 7, i * 977 + k, k * 31 + 7), units);
            holds.insert(pod_uid(i, k), [(g.index, units)].into());
            left -= units;
        }
    }
    let ann = NodeGpus { v: VERSION, unit_bytes: 1 << 30, gpus, pods: Some(pods), holds: Some(holds) }.to_json();
    let labels: serde_json::Map<String, Value> = (0..20).map(|k| (format!("example.com/label-{k}"), json!(format!("value-{k}-{i}")))).collect();
    let images: Vec<Value> = (0..30).map(|k| json!({"names": [format!("registry.example.com/team/image-{k}@sha256:{:064x}", k * 7919 + i), format!("registry.example.com/team/image-{k}:v1.{k}")], "sizeBytes": 123_456_789 + k})).collect();
    let conditions: Vec<Value> = ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"]
        .iter()
        .map(|t| json!({"type": t, "status": "False", "lastHeartbeatTime": "2026-11-30T10:00:00Z", "lastTransitionTime": "2026-11-01T10:00:00Z", "reason": format!("Kubelet{t}"), "message": "kubelet has sufficient resources"}))
        .collect();
    json!({
        "metadata": {"name": format!("gpu-node-{i:04}"), "uid": format!("{i:08}-0000-0000-0000-000000000000"), "labels": labels, "annotations": {"egpu.io/gpus": ann, "node.alpha.kubernetes.io/ttl": "0"}},
        "spec": {"podCIDR": "10.0.0.0/24", "providerID": format!("provider://node/{i}")},
        "status": {
            "capacity": {"cpu": "128", "memory": "1056000000Ki", "pods": "110", "egpu.io/gpu-memory": "640"},
            "allocatable": {"cpu": "127", "memory": "1050000000Ki", "pods": "110", "egpu.io/gpu-memory": "640"},
            "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": format!("10.1.{}.{}", i / 250, i % 250)}, {"type": "Hostname", "address": format!("gpu-node-{i:04}")}],
            "nodeInfo": {"kubeletVersion": "v1.33.2", "containerRuntimeVersion": "containerd://2.0.5", "kernelVersion": "6.8.0", "osImage": "Ubuntu 24.04", "architecture": "amd64", "operatingSystem": "linux"},
            "images": images,
        }
    })
}

/// The UID of node `i`'s `k`th pod.
fn pod_uid(i: usize, k: usize) -> String {
    format!("{i:08x}-{k:04x}-4000-8000-000000000000")
}

fn percentile(mut v: Vec<Duration>, q: f64) -> Duration {
    v.sort_unstable();
    v[((v.len() as f64 - 1.0) * q).round() as usize]
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` runs it once, quickly.
    let quick = !std::env::args().any(|a| a == "--bench");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let nodes: Vec<Value> = (0..NODES).map(|i| node(i, &mut rng)).collect();
    let free: u64 = nodes.iter().map(|n| NodeGpus::parse(n["metadata"]["annotations"]["egpu.io/gpus"].as_str()).unwrap().gpus.iter().map(|g| u64::from(g.free)).sum::<u64>()).sum();
    let body = |units: u32| {
        json!({"Pod": {"metadata": {"name": "p", "namespace": "default"}, "spec": {"containers": [{"name": "main", "resources": {"limits": {"egpu.io/gpu-memory": units.to_string()}}}]}}, "Nodes": {"items": nodes}})
            .to_string()
    };
    let bodies: Vec<String> = [4, 10, 20, 30].iter().map(|&u| body(u)).collect();
    let ext = Extender::new("egpu.io/gpu-memory");
    let runs = if quick { 2 } else { 200 };
    // Each of `runs` requests, cycling through the request bodies.
    let time_over = |bodies: &[String], f: &dyn Fn(&str)| -> Vec<Duration> {
        (0..runs)
            .map(|r| {
                let b = &bodies[r % bodies.len()];
                let t = Instant::now();
                f(b);
                t.elapsed()
            })
            .collect()
    };
    let time = |f: &dyn Fn(&str)| time_over(&bodies, f);
    let parse = time(&|b| {
        black_box(serde_json::from_str::<ExtenderArgs>(b).unwrap());
    });
    // Filter and prioritize as the HTTP handlers run them: parse, decide, write the answer.
    let filter = time(&|b| {
        black_box(serde_json::to_vec(&ext.filter(serde_json::from_str(b).unwrap())).unwrap());
    });
    let prioritize = time(&|b| {
        black_box(serde_json::to_vec(&ext.prioritize(serde_json::from_str(b).unwrap()).unwrap()).unwrap());
    });
    // With the node cache (nodeCacheCapable: true): the request names the
    // nodes, and the annotations come from the cache the watch keeps.
    let cache = std::sync::Arc::new(NodeCache::new("egpu.io/enabled=true"));
    cache.replace(nodes.iter().map(|n| serde_json::from_value::<kube::api::ObjectMeta>(n["metadata"].clone()).unwrap()).collect());
    let cached = Extender::new("egpu.io/gpu-memory").with_node_cache(cache);
    let names: Vec<String> = [4, 10, 20, 30]
        .iter()
        .map(|u| {
            let names: Vec<&str> = nodes.iter().map(|n| n["metadata"]["name"].as_str().unwrap()).collect();
            json!({"Pod": {"metadata": {"name": "p", "namespace": "default"}, "spec": {"containers": [{"name": "main", "resources": {"limits": {"egpu.io/gpu-memory": u.to_string()}}}]}}, "NodeNames": names}).to_string()
        })
        .collect();
    let time_names = |f: &dyn Fn(&str)| time_over(&names, f);
    let filter_names = time_names(&|b| {
        black_box(serde_json::to_vec(&cached.filter(serde_json::from_str(b).unwrap())).unwrap());
    });
    let prioritize_names = time_names(&|b| {
        black_box(serde_json::to_vec(&cached.prioritize(serde_json::from_str(b).unwrap()).unwrap()).unwrap());
    });
    // Preemption as kube-scheduler asks it by default: candidates on 10% of
    // the nodes (its minCandidateNodesPercentage), two victims each, by UID.
    let preempt_bodies: Vec<String> = [20, 30, 40, 60]
        .iter()
        .map(|u| {
            let victims: serde_json::Map<String, Value> = nodes
                .iter()
                .take(NODES / 10)
                .enumerate()
                .map(|(i, n)| (n["metadata"]["name"].as_str().unwrap().to_string(), json!({"Pods": [{"UID": pod_uid(i, 0)}, {"UID": pod_uid(i, 1)}], "NumPDBViolations": 0})))
                .collect();
            json!({"Pod": {"metadata": {"name": "p", "namespace": "default"}, "spec": {"containers": [{"name": "main", "resources": {"limits": {"egpu.io/gpu-memory": u.to_string()}}}]}}, "NodeNameToMetaVictims": victims}).to_string()
        })
        .collect();
    let preempt = time_over(&preempt_bodies, &|b| {
        black_box(serde_json::to_vec(&cached.preempt(serde_json::from_str(b).unwrap()).unwrap()).unwrap());
    });
    let kept = cached.preempt(serde_json::from_str(&preempt_bodies[1]).unwrap()).unwrap().node_name_to_meta_victims.len();
    let passed = ext.filter(serde_json::from_str(&bodies[1]).unwrap()).nodes.map_or(0, |n| n.items.len());
    assert_eq!(cached.filter(serde_json::from_str(&names[1]).unwrap()).node_names.map_or(0, |n| n.len()), passed, "both paths pass the same nodes");
    println!(
        "extender: {NODES} nodes x {GPUS} GPUs of {UNITS} units, {:.1}% of units taken, request {:.1} MB; a 10-unit pod passes filter on {passed} nodes",
        100.0 - 100.0 * free as f64 / (NODES * GPUS) as f64 / f64::from(UNITS),
        bodies[1].len() as f64 / 1e6
    );
    let base = percentile(parse.clone(), 0.5);
    println!("(node names: request {:.3} MB; preempt: {} candidate nodes, request {:.3} MB, a 30-unit pod keeps {kept})", names[1].len() as f64 / 1e6, NODES / 10, preempt_bodies[1].len() as f64 / 1e6);
    for (name, v) in [("parse (baseline)", parse), ("filter", filter), ("prioritize", prioritize), ("filter, names", filter_names), ("prioritize, names", prioritize_names), ("preempt, names", preempt)] {
        let p50 = percentile(v.clone(), 0.5);
        println!("{name:>18}: p50 {:>8.2} ms  p99 {:>8.2} ms  ({:.2}x the parse p50)", p50.as_secs_f64() * 1e3, percentile(v, 0.99).as_secs_f64() * 1e3, p50.as_secs_f64() / base.as_secs_f64());
    }
}
