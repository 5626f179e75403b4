//! Turning a pod list into an arrival sequence, following the FGD paper's
//! methodology: creation and deletion times are dropped (pods only
//! arrive); the pods are sorted by name and shuffled with the seed; then
//! the workload is inflated by sampling trace pods uniformly with
//! replacement and appending them, until the next sample would push the
//! total GPU request above `inflation` × the cluster's GPU capacity (or,
//! if the trace already asks for more, random pods are dropped until it
//! does not).

use crate::trace::TracePod;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The arrival order: indices into the (name-sorted) pod list; an index may
/// repeat when inflation samples it again.
pub fn arrivals(pods: &[TracePod], capacity_milli: u64, inflation: f64, seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..pods.len()).collect();
    order.sort_by(|&a, &b| pods[a].name.cmp(&pods[b].name));
    let by_name = order.clone();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    order.shuffle(&mut rng);
    if pods.is_empty() || inflation <= 0.0 {
        return order;
    }
    let target = inflation * capacity_milli as f64;
    let mut total: u64 = order.iter().map(|&i| pods[i].pod.total_gpu_milli()).sum();
    if (total as f64) > target {
        while (total as f64) > target && !order.is_empty() {
            let k = rng.random_range(0..order.len());
            total -= pods[order[k]].pod.total_gpu_milli();
            order.remove(k);
        }
        return order;
    }
    // A trace without GPU pods could never reach the target.
    if !pods.iter().any(|p| p.pod.total_gpu_milli() > 0) {
        return order;
    }
    loop {
        let i = by_name[rng.random_range(0..by_name.len())];
        let add = pods[i].pod.total_gpu_milli();
        if (total + add) as f64 > target {
            break;
        }
        total += add;
        order.push(i);
    }
    order
}
