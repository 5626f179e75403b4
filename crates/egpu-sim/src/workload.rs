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

/// The published simulator's node names for one seed: it sorts the nodes
/// by name and prefixes each with its index in a seeded random permutation
/// (`"0042-openb-node-0007"`), so the smallest-name tie-break of its
/// scheduler visits the nodes in a random order fixed for the run. The
/// permutation comes from a ChaCha8 stream of its own (Go's generator can
/// not be reproduced), so it does not disturb the arrival order.
pub fn shuffled_node_names(names: &[&str], seed: u64) -> Vec<String> {
    let mut by_name: Vec<usize> = (0..names.len()).collect();
    by_name.sort_by(|&a, &b| names[a].cmp(names[b]));
    let mut perm: Vec<usize> = (0..names.len()).collect();
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ NODE_ORDER_STREAM);
    perm.shuffle(&mut rng);
    // Zero-padded to one width, so that the names sort as the numbers do
    // (four digits, more past 9,999 nodes).
    let width = names.len().saturating_sub(1).to_string().len().max(4);
    let mut out = vec![String::new(); names.len()];
    for (rank, &id) in by_name.iter().enumerate() {
        out[id] = format!("{:0width$}-{}", perm[rank], names[id]);
    }
    out
}

/// Separates the node-order stream from the arrival stream of the same seed.
const NODE_ORDER_STREAM: u64 = 0x6e6f_6465_6f72_6472;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shuffled_names_prefix_a_seeded_permutation() {
        let names = ["n-b", "n-a", "n-d", "n-c", "n-e", "n-f", "n-g", "n-h"];
        let a = shuffled_node_names(&names, 7);
        assert_eq!(a, shuffled_node_names(&names, 7));
        // Every name keeps its own suffix and gets a distinct 4-digit prefix 0..n.
        let mut prefixes: Vec<usize> = a.iter().zip(names).map(|(x, n)| {
            assert_eq!(&x[5..], n);
            x[..4].parse().unwrap()
        }).collect();
        prefixes.sort_unstable();
        assert_eq!(prefixes, (0..names.len()).collect::<Vec<_>>());
        // Another seed gives another order (8! orders; these two differ).
        assert_ne!(a, shuffled_node_names(&names, 8));
        // Past 9,999 nodes the prefixes widen and still sort as numbers.
        let many: Vec<String> = (0..10_001).map(|i| format!("n{i}")).collect();
        let refs: Vec<&str> = many.iter().map(String::as_str).collect();
        let big = shuffled_node_names(&refs, 3);
        let mut by_name: Vec<&String> = big.iter().collect();
        by_name.sort();
        let order: Vec<usize> = by_name.iter().map(|x| x[..5].parse().unwrap()).collect();
        assert_eq!(order, (0..10_001).collect::<Vec<_>>());
    }
}
