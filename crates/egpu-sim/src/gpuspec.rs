//! Synthetic GPU-type constraints, for workloads like the paper's
//! `gpuspec` traces (which are not in the public openb directory): a
//! seeded random share of GPU pods is restricted to the GPU type of a
//! randomly chosen node, plus, half of the time, one more random type.

use crate::trace::TracePod;
use egpu_place::{Cluster, Pod, TypeSet};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Constrain about `fraction` of the GPU pods; returns how many were.
pub fn constrain(cluster: &Cluster, pods: &mut [TracePod], fraction: f64, seed: u64) -> usize {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x0067_7075_7370_6563);
    let types: Vec<_> = cluster.nodes().iter().filter_map(|n| n.gpu_type()).collect();
    if types.is_empty() {
        return 0;
    }
    let mut n = 0;
    for tp in pods.iter_mut() {
        let p = &tp.pod;
        if p.gpu_count() == 0 || !rng.random_bool(fraction.clamp(0.0, 1.0)) {
            continue;
        }
        // Weighted by node count, so constraints follow the fleet's mix.
        let mut set = TypeSet::only(types[rng.random_range(0..types.len())]);
        if rng.random_bool(0.5) {
            set = set.with(types[rng.random_range(0..types.len())]);
        }
        // The pod must still fit some node of an allowed type.
        if let Ok(q) = Pod::new(p.cpu_milli(), p.mem_mib(), p.gpu_count(), p.gpu_milli(), set, p.qos())
            && crate::trace::possible(cluster, &q)
        {
            tp.pod = q;
            n += 1;
        }
    }
    n
}
