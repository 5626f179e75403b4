//! Per-pod decision latency of FGD and eGPU's policy on a synthetic
//! 10,000-GPU cluster (1,250 nodes × 8 GPUs) held at about 90% GPU
//! allocation with churn: each step places one pod and releases an old one,
//! so caches see the invalidations a live cluster causes.
//!
//! `cargo bench -p egpu-place --bench place_latency` prints criterion's
//! mean, then p50/p99 of single decisions and the model's memory.

use criterion::{Criterion, criterion_group};
use egpu_place::{Cluster, MILLI, NodeSpec, Placement, Pod, Policy, PolicyKind, Qos, TargetWorkload, TypeSet};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::VecDeque;
use std::hint::black_box;
use std::time::Instant;

/// A pod mix shaped like the openb default trace.
fn pod(rng: &mut ChaCha8Rng) -> Pod {
    let cpu = [2000, 4000, 6000, 8000, 12000][rng.random_range(0..5)];
    let x = rng.random_range(0..100);
    let (n, m) = match x {
        0..12 => (0, 0),
        12..60 => (1, MILLI),
        60..73 => (1, 810),
        73..82 => (1, 470),
        82..86 => (1, 320),
        86..89 => (1, 650),
        89..95 => (1, [230, 460, 590, 550, 160][rng.random_range(0..5)]),
        95..97 => (2, MILLI),
        97..99 => (4, MILLI),
        _ => (8, MILLI),
    };
    Pod::new(cpu, 16_384, n, m, TypeSet::ANY, Qos::Be).unwrap()
}

struct Bench {
    cluster: Cluster,
    live: VecDeque<Placement>,
    rng: ChaCha8Rng,
    policy: Box<dyn Policy>,
}

fn setup(kind: PolicyKind) -> Bench {
    let mut cluster = Cluster::new();
    let t = cluster.gpu_type_or_insert("G2", 80 * 1024).unwrap();
    for i in 0..1250 {
        cluster.add_node(NodeSpec { name: format!("node-{i:04}"), cpu_milli: 128_000, memory_mib: 1 << 20, gpu_type: Some(t), nvlink_groups: vec![0, 0, 0, 0, 1, 1, 1, 1], max_pods: 1000 }).unwrap();
    }
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let sample: Vec<Pod> = (0..2000).map(|_| pod(&mut rng)).collect();
    let target = TargetWorkload::from_pods(&sample, 0.95);
    let mut policy = kind.build(&target, 1);
    let mut live = VecDeque::new();
    while cluster.gpu_allocated_milli() < cluster.gpu_capacity_milli() * 9 / 10 {
        let p = pod(&mut rng);
        if let Some(pl) = policy.place(&cluster, &p) {
            cluster.apply(&pl).unwrap();
            live.push_back(pl);
        }
    }
    Bench { cluster, live, rng, policy }
}

impl Bench {
    /// One decision (timed by the caller), then commit it and release the oldest pod.
    fn step(&mut self) -> Option<Placement> {
        let p = pod(&mut self.rng);
        let out = self.policy.place(&self.cluster, &p);
        if let Some(pl) = &out {
            self.cluster.apply(pl).unwrap();
            self.live.push_back(pl.clone());
        }
        while self.cluster.gpu_allocated_milli() > self.cluster.gpu_capacity_milli() * 9 / 10 {
            let old = self.live.pop_front().unwrap();
            self.cluster.release(&old).unwrap();
        }
        out
    }
}

fn decisions(c: &mut Criterion) {
    for kind in [PolicyKind::Fgd, PolicyKind::Egpu] {
        let mut b = setup(kind);
        c.bench_function(&format!("place_10k_gpus_90pct/{}", kind.name()), |bench| bench.iter(|| black_box(b.step())));
    }
}

fn percentiles() {
    for kind in [PolicyKind::Fgd, PolicyKind::Egpu] {
        let mut b = setup(kind);
        for _ in 0..2000 {
            b.step();
        }
        let mut ns: Vec<u128> = Vec::with_capacity(20_000);
        for _ in 0..20_000 {
            let p = pod(&mut b.rng);
            let t = Instant::now();
            let out = b.policy.place(&b.cluster, &p);
            ns.push(t.elapsed().as_nanos());
            if let Some(pl) = out {
                b.cluster.apply(&pl).unwrap();
                b.live.push_back(pl);
            }
            while b.cluster.gpu_allocated_milli() > b.cluster.gpu_capacity_milli() * 9 / 10 {
                let old = b.live.pop_front().unwrap();
                b.cluster.release(&old).unwrap();
            }
        }
        ns.sort_unstable();
        let q = |x: f64| ns[((ns.len() - 1) as f64 * x) as usize] as f64 / 1000.0;
        let alloc = b.cluster.gpu_allocated_milli() as f64 / b.cluster.gpu_capacity_milli() as f64 * 100.0;
        println!("{:>5}: per-pod decision over 20000 pods at {alloc:.1}% allocation: p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs", kind.name(), q(0.5), q(0.99), q(1.0));
    }
    // Model memory: nodes + GPU vectors + names (the policy caches add one
    // (version, score) slot per node per pod shape seen).
    let b = setup(PolicyKind::Egpu);
    let node = std::mem::size_of::<egpu_place::Node>();
    let gpus: usize = b.cluster.nodes().iter().map(|n| std::mem::size_of_val(n.gpus()) + n.name().len()).sum();
    let model = std::mem::size_of_val(b.cluster.nodes()) + gpus;
    println!("model memory for {} GPUs: {:.1} KiB ({} B per node struct); cache slot {} B per node per shape", b.cluster.gpu_count(), model as f64 / 1024.0, node, std::mem::size_of::<(u64, (i64, u8))>());
}

criterion_group!(benches, decisions);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    percentiles();
}
