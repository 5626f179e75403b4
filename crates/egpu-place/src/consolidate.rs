//! Consolidation: room for a pod that fits nowhere, made by moving a few
//! running pods elsewhere, each re-placed by the same policy.
//!
//! A cluster of shared GPUs ends up with free capacity scattered in pieces
//! too small for the pod that waits: 0.3 of one GPU here, 0.4 there. When
//! the policy finds no place for a pod, [`consolidate`] looks for the node
//! where the fewest running pods (at most `max_moves`) would have to move
//! to make room, and checks that every one of them finds a place elsewhere
//! by the policy itself. It answers with a [`Plan`]; nothing changes until
//! the caller carries it out ([`Plan::apply`]).
//!
//! The search, per node that could hold the pod at all: on each GPU, the
//! running pods with the largest shares first until the GPU has the pod's
//! share free; the pod's GPU count of the GPUs that need the fewest moves;
//! then, if the node is still short of CPU or memory, its pods with the
//! most of it. The candidates are tried fewest moves first (then the least
//! GPU moved), at most [`MAX_TRIES`] of them, each by placing the pod and
//! the moved pods for real and taking it all back.

use crate::{Cluster, ModelError, NodeId, Placement, Pod, Policy};
use std::collections::HashMap;

/// The most candidate nodes tried (placed for real, then taken back) for
/// one pod.
pub const MAX_TRIES: usize = 16;

/// A running pod moved: its index in the running list, and where it goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Move {
    pub pod: usize,
    pub to: Placement,
}

/// The moves that make room, and where the waiting pod then goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub moves: Vec<Move>,
    pub placement: Placement,
}

impl Plan {
    /// Carries the plan out on the cluster it was made for: releases each
    /// moved pod, places the waiting pod, places the moved pods anew, and
    /// updates their entries in `running`. An error (a plan made for
    /// another state) leaves the cluster as far as it got.
    pub fn apply(&self, cluster: &mut Cluster, running: &mut [(Pod, Placement)]) -> Result<(), ModelError> {
        for m in &self.moves {
            cluster.release(&running[m.pod].1)?;
        }
        cluster.apply(&self.placement)?;
        for m in &self.moves {
            cluster.apply(&m.to)?;
            running[m.pod].1 = m.to.clone();
        }
        Ok(())
    }
}

/// One node's way to make room: the pods to move and the GPUs to use.
struct Candidate {
    node: NodeId,
    gpus: Vec<u8>,
    movers: Vec<usize>,
    moved_milli: u64,
}

/// Room for `pod` by moving at most `max_moves` of the `running` pods
/// (each with its placement on `cluster`), or `None`. The cluster is left
/// as it was either way; `policy` places the moved pods (and may update its
/// caches). Pods that ask for no GPU are not consolidated for.
pub fn consolidate(cluster: &mut Cluster, running: &[(Pod, Placement)], pod: &Pod, policy: &mut dyn Policy, max_moves: usize) -> Option<Plan> {
    if pod.gpu_count() == 0 || max_moves == 0 {
        return None;
    }
    let mut by_node: HashMap<NodeId, Vec<usize>> = HashMap::new();
    for (i, (_, p)) in running.iter().enumerate() {
        by_node.entry(p.node).or_default().push(i);
    }
    let mut candidates: Vec<Candidate> = cluster.nodes().iter().enumerate().filter_map(|(n, _)| candidate(cluster, running, by_node.get(&n).map_or(&[][..], Vec::as_slice), n, pod, max_moves)).collect();
    candidates.sort_by_key(|c| (c.movers.len(), c.moved_milli, c.node));
    candidates.into_iter().take(MAX_TRIES).find_map(|c| attempt(cluster, running, pod, policy, c))
}

/// The fewest pods to move off node `n` so that `pod` fits there, if at
/// most `max_moves`.
fn candidate(cluster: &Cluster, running: &[(Pod, Placement)], on_node: &[usize], n: NodeId, pod: &Pod, max_moves: usize) -> Option<Candidate> {
    let node = cluster.node(n)?;
    if node.gpu_type().is_none() || !pod.gpu_types().allows(node.gpu_type()) || node.gpus().len() < pod.gpu_count() as usize {
        return None;
    }
    if node.cpu_capacity() < pod.cpu_milli() || node.mem_capacity_mib() < pod.mem_mib() {
        return None;
    }
    // Per GPU: the pods to move, largest share first, until the pod's share is free.
    let mut per_gpu: Vec<(Vec<usize>, u8)> = Vec::new();
    for (g, gpu) in node.gpus().iter().enumerate() {
        let (need_c, need_m) = (pod.gpu_milli().saturating_sub(gpu.free_milli), pod.gpu_mem_milli().saturating_sub(gpu.free_mem_milli));
        let mut on_gpu: Vec<(usize, u32, u32)> = on_node
            .iter()
            .filter_map(|&i| running[i].1.gpus.iter().find(|s| usize::from(s.index) == g).map(|s| (i, s.milli, s.mem_milli)))
            .collect();
        on_gpu.sort_by_key(|&(i, c, m)| (std::cmp::Reverse(c.max(m)), i));
        let (mut freed_c, mut freed_m, mut movers) = (0, 0, Vec::new());
        for (i, c, m) in on_gpu {
            if freed_c >= need_c && freed_m >= need_m {
                break;
            }
            freed_c += c;
            freed_m += m;
            movers.push(i);
        }
        if freed_c >= need_c && freed_m >= need_m {
            per_gpu.push((movers, g as u8));
        }
    }
    if per_gpu.len() < pod.gpu_count() as usize {
        return None;
    }
    per_gpu.sort_by_key(|(movers, g)| (movers.len(), *g));
    let gpus: Vec<u8> = per_gpu.iter().take(pod.gpu_count() as usize).map(|(_, g)| *g).collect();
    let mut movers: Vec<usize> = per_gpu.iter().take(pod.gpu_count() as usize).flat_map(|(m, _)| m.iter().copied()).collect();
    movers.sort_unstable();
    movers.dedup();
    // CPU and memory: more of the node's pods, those with the most of it first.
    let freed = |movers: &[usize]| movers.iter().fold((0, 0), |(c, m), &i| (c + running[i].1.cpu_milli, m + running[i].1.mem_mib));
    for (need, take) in [(pod.cpu_milli(), 0), (pod.mem_mib(), 1)] {
        let free = |movers: &[usize]| if take == 0 { node.cpu_free() + freed(movers).0 } else { node.mem_free_mib() + freed(movers).1 };
        let mut rest: Vec<usize> = on_node.iter().copied().filter(|i| !movers.contains(i)).collect();
        rest.sort_by_key(|&i| (std::cmp::Reverse(if take == 0 { running[i].1.cpu_milli } else { running[i].1.mem_mib }), i));
        for i in rest {
            if free(&movers) >= need {
                break;
            }
            movers.push(i);
        }
        if free(&movers) < need {
            return None;
        }
    }
    if movers.is_empty() || movers.len() > max_moves {
        return None;
    }
    let moved_milli = movers.iter().map(|&i| running[i].1.gpu_milli()).sum();
    Some(Candidate { node: n, gpus, movers, moved_milli })
}

/// Tries a candidate for real: releases its movers, places the pod, lets
/// the policy place each mover (the largest first); takes it all back and
/// answers with the plan if every mover found a place.
fn attempt(cluster: &mut Cluster, running: &[(Pod, Placement)], pod: &Pod, policy: &mut dyn Policy, c: Candidate) -> Option<Plan> {
    let mut released = Vec::new();
    for &i in &c.movers {
        if cluster.release(&running[i].1).is_err() {
            break;
        }
        released.push(i);
    }
    let placement = Placement::new(c.node, pod, &c.gpus);
    let mut placed = released.len() == c.movers.len() && cluster.apply(&placement).is_ok();
    let pod_placed = placed;
    let mut order = c.movers.clone();
    order.sort_by_key(|&i| (std::cmp::Reverse(running[i].0.total_gpu_milli()), i));
    let mut moves: Vec<Move> = Vec::new();
    for &i in &order {
        if !placed {
            break;
        }
        let mover = &running[i].0;
        match policy.place(cluster, mover) {
            Some(to) if cluster.node(to.node).is_some_and(|n| to.serves(mover, n)) && cluster.apply(&to).is_ok() => moves.push(Move { pod: i, to }),
            _ => placed = false,
        }
    }
    // Back to how it was.
    for m in moves.iter().rev() {
        cluster.release(&m.to).expect("releasing a placement just applied");
    }
    if pod_placed {
        cluster.release(&placement).expect("releasing a placement just applied");
    }
    for &i in released.iter().rev() {
        cluster.apply(&running[i].1).expect("re-applying a placement just released");
    }
    placed.then(|| {
        moves.sort_by_key(|m| c.movers.iter().position(|&i| i == m.pod));
        Plan { moves, placement }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::BestFit;
    use crate::{NodeSpec, Qos, TypeSet};
    use proptest::prelude::*;

    /// `gpus` one-GPU nodes of one type, with room for many pods.
    fn cluster(nodes: usize, gpus_each: usize) -> (Cluster, TypeSet) {
        let mut c = Cluster::new();
        let t = c.gpu_type_or_insert("T4", 16_384).unwrap();
        for n in 0..nodes {
            c.add_node(NodeSpec { name: format!("n{n}"), cpu_milli: 64_000, memory_mib: 262_144, gpu_type: Some(t), nvlink_groups: vec![0; gpus_each], max_pods: 110 }).unwrap();
        }
        (c, TypeSet::only(t))
    }

    fn share(milli: u32, types: TypeSet) -> Pod {
        Pod::new(1000, 1024, 1, milli, types, Qos::Be).unwrap()
    }

    /// Places `pod` on `node`'s GPU `gpu` and records it.
    fn put(c: &mut Cluster, running: &mut Vec<(Pod, Placement)>, pod: Pod, node: NodeId, gpus: &[u8]) {
        let p = Placement::new(node, &pod, gpus);
        c.apply(&p).unwrap();
        running.push((pod, p));
    }

    fn free_milli(c: &Cluster) -> Vec<Vec<u32>> {
        c.nodes().iter().map(|n| n.gpus().iter().map(|g| g.free_milli).collect()).collect()
    }

    #[test]
    fn one_move_makes_room_that_no_gpu_had() {
        let (mut c, t) = cluster(2, 1);
        let mut running = Vec::new();
        put(&mut c, &mut running, share(300, t), 0, &[0]);
        put(&mut c, &mut running, share(300, t), 0, &[0]);
        put(&mut c, &mut running, share(500, t), 1, &[0]);
        let waiting = share(600, t);
        let mut policy = BestFit::default();
        assert!(policy.place(&c, &waiting).is_none(), "0.4 and 0.5 free: no room for 0.6");
        let before = free_milli(&c);
        let plan = consolidate(&mut c, &running, &waiting, &mut policy, 2).expect("a plan");
        assert_eq!(free_milli(&c), before, "the search leaves the cluster as it was");
        assert_eq!(plan.moves.len(), 1);
        assert_eq!((plan.moves[0].to.node, plan.placement.node), (1, 0), "a 0.3 moves to the other GPU, the pod takes its place");
        plan.apply(&mut c, &mut running).unwrap();
        assert_eq!(free_milli(&c), vec![vec![100], vec![200]]);
        assert_eq!(c.gpu_allocated_milli(), running.iter().map(|(_, p)| p.gpu_milli()).sum::<u64>() + 600);
    }

    #[test]
    fn no_plan_beyond_the_move_budget_or_without_room_anywhere() {
        let (mut c, t) = cluster(2, 1);
        let mut running = Vec::new();
        for _ in 0..3 {
            put(&mut c, &mut running, share(200, t), 0, &[0]);
        }
        put(&mut c, &mut running, share(900, t), 1, &[0]);
        let mut policy = BestFit::default();
        // 0.6 needs a 0.2 off GPU 0, which GPU 1 (0.1 free) cannot take;
        // GPU 1's 0.9 fits nowhere either.
        assert!(consolidate(&mut c, &running, &share(600, t), &mut policy, 1).is_none());
        assert!(consolidate(&mut c, &running, &share(600, t), &mut policy, 3).is_none());
        // A whole GPU: both are busy, and neither's pods fit on the other.
        assert!(consolidate(&mut c, &running, &share(1000, t), &mut policy, 8).is_none());
        assert_eq!(free_milli(&c), vec![vec![400], vec![100]]);
        // With one 0.2 fewer on GPU 0 and room for it on GPU 1, one move does it.
        c.release(&running.pop().unwrap().1).unwrap();
        put(&mut c, &mut running, share(700, t), 1, &[0]);
        assert_eq!(consolidate(&mut c, &running, &share(600, t), &mut policy, 1).map(|p| p.moves.len()), Some(1));
        // No moves allowed, or a pod without GPUs: nothing to do.
        assert!(consolidate(&mut c, &running, &share(500, t), &mut policy, 0).is_none());
        assert!(consolidate(&mut c, &running, &Pod::new(1000, 1024, 0, 0, TypeSet::default(), Qos::Be).unwrap(), &mut policy, 4).is_none());
    }

    #[test]
    fn a_multi_gpu_pod_gets_whole_gpus_freed_on_one_node() {
        let (mut c, t) = cluster(2, 2);
        let mut running = Vec::new();
        put(&mut c, &mut running, share(500, t), 0, &[0]);
        put(&mut c, &mut running, share(500, t), 0, &[1]);
        put(&mut c, &mut running, share(250, t), 1, &[0]);
        let two = Pod::new(2000, 2048, 2, 1000, t, Qos::Be).unwrap();
        let mut policy = BestFit::default();
        assert!(policy.place(&c, &two).is_none());
        // Node 1 needs one move (its 0.25 goes to node 0), node 0 two: node 1 it is.
        let plan = consolidate(&mut c, &running, &two, &mut policy, 2).expect("a plan");
        assert_eq!((plan.placement.node, plan.moves.len(), plan.moves[0].to.node), (1, 1, 0));
        plan.apply(&mut c, &mut running).unwrap();
        let free = free_milli(&c);
        assert_eq!((free[0].iter().sum::<u32>(), &free[1]), (750, &vec![0, 0]));
        // Node 0's two halves cannot both go anywhere now.
        assert!(consolidate(&mut c, &running, &two, &mut policy, 4).is_none());
    }

    proptest! {
        /// Whatever the cluster and the pods: a plan applies cleanly, moves
        /// at most the budget, serves the waiting pod, and keeps the
        /// accounting exact; no plan leaves the cluster untouched.
        #[test]
        fn plans_apply_and_keep_the_accounting_exact(
            nodes in 1usize..5,
            gpus in 1usize..4,
            pods in proptest::collection::vec((0u32..8, 1u32..1000), 1..60),
            budget in 1usize..4,
        ) {
            let (mut c, t) = cluster(nodes, gpus);
            let mut policy = BestFit::default();
            let mut running: Vec<(Pod, Placement)> = Vec::new();
            // Mostly shares of one GPU; one in eight a whole GPU, one in eight two.
            for (kind, milli) in pods {
                let pod = match kind {
                    0 => Pod::new(500, 512, 2.min(gpus as u32), 1000, t, Qos::Be).unwrap(),
                    1 => Pod::new(500, 512, 1, 1000, t, Qos::Be).unwrap(),
                    _ => share(milli, t),
                };
                if let Some(p) = policy.place(&c, &pod) {
                    c.apply(&p).unwrap();
                    running.push((pod, p));
                    continue;
                }
                let before = free_milli(&c);
                match consolidate(&mut c, &running, &pod, &mut policy, budget) {
                    None => prop_assert_eq!(free_milli(&c), before),
                    Some(plan) => {
                        prop_assert!(!plan.moves.is_empty() && plan.moves.len() <= budget);
                        prop_assert!(plan.placement.serves(&pod, c.node(plan.placement.node).unwrap()));
                        plan.apply(&mut c, &mut running).unwrap();
                        running.push((pod, plan.placement.clone()));
                    }
                }
                prop_assert_eq!(c.gpu_allocated_milli(), running.iter().map(|(_, p)| p.gpu_milli()).sum::<u64>());
            }
        }
    }
}
