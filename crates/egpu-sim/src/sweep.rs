//! Running many (trace, policy, seed) simulations in parallel.

use crate::sim::{self, RunResult};
use crate::trace::TracePod;
use crate::workload;
use egpu_place::{Cluster, Pod, PolicyKind, TargetWorkload};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// One loaded trace, ready to simulate.
pub struct Trace {
    pub name: String,
    pub cluster: Cluster,
    pub pods: Vec<TracePod>,
    pub target: TargetWorkload,
}

impl Trace {
    /// `coverage` is the share of pods the target workload covers (0.95 in FGD).
    pub fn new(name: String, cluster: Cluster, pods: Vec<TracePod>, coverage: f64) -> Trace {
        let target = TargetWorkload::from_pods(pods.iter().map(|p| &p.pod), coverage);
        Trace { name, cluster, pods, target }
    }
}

/// A sweep request.
pub struct Sweep<'a> {
    pub trace: &'a Trace,
    pub policies: &'a [PolicyKind],
    pub seeds: &'a [u64],
    pub inflation: f64,
    pub threads: usize,
    /// Node names as the published simulator renames them (see
    /// [`workload::shuffled_node_names`]): ties then go to a random node
    /// order fixed per seed instead of the trace's names.
    pub shuffle_nodes: bool,
    /// Choose the GPU inside the policy's node by best fit
    /// ([`egpu_place::policy::BestFitInside`]), as the Kubernetes device
    /// plugin does, instead of taking the policy's GPU.
    pub best_fit_inside: bool,
}

/// Run every (policy, seed); `progress` is called after each run finishes.
/// Results come back in (policy, seed) order.
pub fn run(s: &Sweep, progress: &(dyn Fn(&RunResult) + Sync)) -> Vec<RunResult> {
    let jobs: Vec<(PolicyKind, u64)> = s.policies.iter().flat_map(|&p| s.seeds.iter().map(move |&seed| (p, seed))).collect();
    let pods: Vec<Pod> = s.trace.pods.iter().map(|p| p.pod.clone()).collect();
    let next = AtomicUsize::new(0);
    let out: Mutex<Vec<Option<RunResult>>> = Mutex::new(vec![None; jobs.len()]);
    std::thread::scope(|scope| {
        for _ in 0..s.threads.max(1).min(jobs.len().max(1)) {
            scope.spawn(|| {
                loop {
                    let j = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&(kind, seed)) = jobs.get(j) else { break };
                    let order = workload::arrivals(&s.trace.pods, s.trace.cluster.gpu_capacity_milli(), s.inflation, seed);
                    let mut policy = kind.build(&s.trace.target, seed);
                    if s.best_fit_inside {
                        policy = Box::new(egpu_place::policy::BestFitInside::new(policy));
                    }
                    let renamed;
                    let cluster = if s.shuffle_nodes {
                        let names: Vec<&str> = s.trace.cluster.nodes().iter().map(|n| n.name()).collect();
                        let mut c = s.trace.cluster.clone();
                        for (id, name) in workload::shuffled_node_names(&names, seed).into_iter().enumerate() {
                            let _ = c.rename_node(id, name);
                        }
                        renamed = c;
                        &renamed
                    } else {
                        &s.trace.cluster
                    };
                    let r = sim::run(cluster, &pods, &order, policy.as_mut(), &s.trace.target, seed);
                    progress(&r);
                    if let Ok(mut o) = out.lock() {
                        o[j] = Some(r);
                    }
                }
            });
        }
    });
    out.into_inner().unwrap_or_default().into_iter().flatten().collect()
}
