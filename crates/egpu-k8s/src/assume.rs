//! The extender's **assume cache**: units it has bound pods to, which the
//! nodes' annotations do not show yet.
//!
//! A node's `egpu.io/gpus` annotation lags the node: the kubelet admits a
//! bound pod, the plugin reads the kubelet's list on its next refresh, and
//! the patch reaches the scheduler's node cache a round trip later. A
//! second pod filtered in that window would be told the first pod's GPU
//! is still free. So when the extender binds a pod (the scheduler's
//! `bindVerb`), it remembers the pod's units on that node, and every
//! filter and prioritize takes them off the annotation's free units: each
//! container in the pod's order, on the GPU the pod's hint names
//! ([`crate::hint`]) while that GPU has the room, else best fit, ties to
//! the lower GPU UUID (or whole GPUs for a container larger than one), as
//! the plugin's preferred allocation places them when the kubelet admits
//! the containers in that order (an approximation: the kubelet admits
//! several pending pods in its own order). An assumption ends when the
//! node's annotation says the pod holds all its units there (they are then
//! in `free`; a pod admitted container by container is still counted whole
//! until then, on the safe side), or after its time to live (a pod that
//! failed admission or was deleted, a plugin too old to name its pods, or
//! an annotation that stayed stale that long).
//!
//! Pure: time is passed in, so the rules are tested without waiting.

use crate::annotation::NodeGpus;
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// Pods' demands kept from `filter` for `bind` (a pod's bind follows its
/// filter); older ones are forgotten first, and `bind` then reads the pod.
pub const DEMANDS: usize = 10_000;

/// One bound pod on one node.
#[derive(Debug, Clone)]
struct Entry {
    /// `namespace/name`, as the annotation names pods.
    pod: String,
    /// Units per container, in the pod's order.
    units: Vec<u32>,
    /// The GPU (UUID) the pod's hint names for each container, where it
    /// names one.
    gpus: Vec<Option<String>>,
    at: Instant,
}

/// The cache: assumptions per node, and recent pods' demands by UID.
#[derive(Debug, Default)]
pub struct Assumed {
    nodes: HashMap<String, Vec<Entry>>,
    demands: HashMap<String, Vec<u32>>,
    order: VecDeque<String>,
}

impl Assumed {
    /// Keeps a pod's units (per container, in the pod's order) for its bind.
    pub fn remember(&mut self, uid: &str, units: &[u32]) {
        if uid.is_empty() {
            return;
        }
        if self.demands.insert(uid.to_string(), units.to_vec()).is_none() {
            self.order.push_back(uid.to_string());
        }
        while self.order.len() > DEMANDS {
            if let Some(old) = self.order.pop_front() {
                self.demands.remove(&old);
            }
        }
    }

    /// The units `remember` kept for this pod.
    pub fn demand(&self, uid: &str) -> Option<Vec<u32>> {
        self.demands.get(uid).cloned()
    }

    /// Records that `pod` (`namespace/name`) is being bound to `node` with
    /// these units; a second bind of the same pod to the same node replaces
    /// the first. Expired assumptions on every node are dropped here too.
    pub fn assume(&mut self, node: &str, pod: &str, units: Vec<u32>, now: Instant, ttl: Duration) {
        self.assume_on(node, pod, units, Vec::new(), now, ttl);
    }

    /// [`Assumed::assume`] with the GPU the pod's hint names for each
    /// container (`gpus[i]` for `units[i]`; `None`, or a shorter list,
    /// where it names none).
    pub fn assume_on(&mut self, node: &str, pod: &str, units: Vec<u32>, gpus: Vec<Option<String>>, now: Instant, ttl: Duration) {
        for (n, entries) in self.nodes.iter_mut() {
            entries.retain(|e| !(n == node && e.pod == pod) && now.saturating_duration_since(e.at) < ttl);
        }
        self.nodes.retain(|_, e| !e.is_empty());
        if !units.is_empty() {
            self.nodes.entry(node.to_string()).or_default().push(Entry { pod: pod.to_string(), units, gpus, at: now });
        }
    }

    /// [`Assumed::assume`], unless `pod` is already assumed on `node` (a
    /// resync must not restart an assumption's time to live).
    pub fn assume_if_absent(&mut self, node: &str, pod: &str, units: Vec<u32>, now: Instant, ttl: Duration) -> bool {
        if self.nodes.get(node).is_some_and(|e| e.iter().any(|e| e.pod == pod)) {
            return false;
        }
        self.assume(node, pod, units, now, ttl);
        true
    }

    /// Forgets that `pod` is bound to `node` (the API server refused it).
    pub fn release(&mut self, node: &str, pod: &str) {
        if let Some(entries) = self.nodes.get_mut(node) {
            entries.retain(|e| e.pod != pod);
            if entries.is_empty() {
                self.nodes.remove(node);
            }
        }
    }

    /// What `node` has free once its live assumptions are taken off the
    /// annotation `g`. Assumptions the annotation already counts in full
    /// (the pod holds all its units there) or that have expired are
    /// dropped.
    pub fn view(&mut self, node: &str, g: NodeGpus, now: Instant, ttl: Duration) -> NodeGpus {
        self.view_except(node, g, now, ttl, None)
    }

    /// [`Assumed::view`] without the assumption of pod `except` (a pod being
    /// bound again is placed on the node as it is without it).
    pub fn view_except(&mut self, node: &str, mut g: NodeGpus, now: Instant, ttl: Duration, except: Option<&str>) -> NodeGpus {
        let Some(entries) = self.nodes.get_mut(node) else { return g };
        let held = |pod: &str| g.pods.as_ref().and_then(|p| p.get(pod)).copied().unwrap_or(0);
        entries.retain(|e| u64::from(held(&e.pod)) < e.units.iter().map(|&u| u64::from(u)).sum::<u64>() && now.saturating_duration_since(e.at) < ttl);
        for e in entries.iter().filter(|e| Some(e.pod.as_str()) != except) {
            for (i, &u) in e.units.iter().enumerate() {
                // Where the plugin's preferred allocation puts it: the
                // hinted GPU while it has the room, else best fit. A pod
                // that fits no GPU any more was bound in a race the plugin
                // refuses at admission; it takes nothing here.
                if !e.gpus.get(i).and_then(Option::as_deref).is_some_and(|uuid| g.take_on(uuid, u)) {
                    g.take(u);
                }
            }
        }
        if entries.is_empty() {
            self.nodes.remove(node);
        }
        g
    }

    /// Whether anything is assumed on `node` (only then does [`Assumed::view`]
    /// need the annotation's pod list).
    pub fn has(&self, node: &str) -> bool {
        self.nodes.contains_key(node)
    }

    /// Assumptions kept, over all nodes (expired ones go at the next
    /// assume or look at their node).
    pub fn len(&self) -> usize {
        self.nodes.values().map(Vec::len).sum()
    }

    /// Assumptions younger than `ttl` (the metric; those a node's
    /// annotation already counts go at the next look at that node).
    pub fn live(&self, now: Instant, ttl: Duration) -> usize {
        self.nodes.values().flatten().filter(|e| now.saturating_duration_since(e.at) < ttl).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::annotation::{GpuFree, VERSION};

    const TTL: Duration = Duration::from_secs(120);

    /// A node's annotation; `pods` names each pod with the units it holds.
    fn gpus(free: &[u32], pods: Option<&[(&str, u32)]>) -> NodeGpus {
        NodeGpus {
            v: VERSION,
            unit_bytes: 1 << 30,
            gpus: free.iter().enumerate().map(|(i, &f)| GpuFree { index: i as u32, uuid: format!("GPU-{i}"), model: "m".into(), units: 16, free: f, nvlink: None, numa: None, pcie: None }).collect(),
            pods: pods.map(|p| p.iter().map(|(s, u)| (s.to_string(), *u)).collect()),
            holds: None,
        }
    }

    fn free(g: &NodeGpus) -> Vec<u32> {
        g.gpus.iter().map(|x| x.free).collect()
    }

    #[test]
    fn a_hinted_container_takes_its_gpu_while_it_has_room_else_best_fit() {
        let t0 = Instant::now();
        let mut a = Assumed::default();
        // The hint names GPU-1 for the first container: best fit would
        // take GPU-0's 10. The second container has no hint: best fit,
        // GPU-1's 8 left.
        a.assume_on("n1", "default/p", vec![8, 4], vec![Some("GPU-1".into())], t0, TTL);
        assert_eq!(free(&a.view("n1", gpus(&[10, 16], Some(&[])), t0, TTL)), [10, 4]);
        // The hinted GPU has no room any more (or is not on the node): best
        // fit, as the plugin falls back.
        assert_eq!(free(&a.view("n1", gpus(&[10, 6], Some(&[])), t0, TTL)), [2, 2]);
        a.assume_on("n2", "default/q", vec![4], vec![Some("GPU-9".into())], t0, TTL);
        assert_eq!(free(&a.view("n2", gpus(&[16, 10], Some(&[])), t0, TTL)), [16, 6]);
    }

    #[test]
    fn a_bound_pod_takes_its_units_best_fit_until_the_annotation_names_it() {
        let t0 = Instant::now();
        let mut a = Assumed::default();
        a.assume("n1", "default/p", vec![8], t0, TTL);
        // Best fit: the GPU with 10 free, not the one with 16.
        assert_eq!(free(&a.view("n1", gpus(&[16, 10], Some(&[])), t0, TTL)), [16, 2]);
        // Other nodes are untouched.
        assert_eq!(free(&a.view("n2", gpus(&[16, 10], Some(&[])), t0, TTL)), [16, 10]);
        // The annotation counts it: nothing more is taken, and the
        // assumption is gone for good.
        assert_eq!(free(&a.view("n1", gpus(&[16, 2], Some(&[("default/p", 8)])), t0, TTL)), [16, 2]);
        assert!(a.is_empty());
        assert_eq!(free(&a.view("n1", gpus(&[16, 12], Some(&[])), t0, TTL)), [16, 12]);
    }

    #[test]
    fn containers_go_in_the_pods_order_and_a_half_admitted_pod_counts_whole() {
        let t0 = Instant::now();
        let mut a = Assumed::default();
        // Spec order 4 then 10 on [10, 16]: 4 takes the 10 (best fit), then
        // 10 the 16, as the kubelet would allocate them: [6, 6], not the
        // [0, 12] that largest-first gives.
        a.assume("n1", "default/p", vec![4, 10], t0, TTL);
        assert_eq!(free(&a.view("n1", gpus(&[10, 16], Some(&[])), t0, TTL)), [6, 6]);
        // The kubelet has allocated the first container only: the pod is
        // listed with 4 units, and still counted whole.
        assert_eq!(free(&a.view("n1", gpus(&[6, 16], Some(&[("default/p", 4)])), t0, TTL)), [2, 6]);
        assert_eq!(a.len(), 1);
        // Ties go to the lower UUID, whatever the order in the annotation.
        let mut g = gpus(&[8, 8], Some(&[]));
        g.gpus.reverse();
        a.assume("n2", "default/q", vec![3], t0, TTL);
        let v = a.view("n2", g, t0, TTL);
        assert_eq!(v.gpus.iter().map(|x| (x.uuid.as_str(), x.free)).collect::<Vec<_>>(), [("GPU-1", 8), ("GPU-0", 5)]);
    }

    #[test]
    fn assumptions_expire_and_a_rebind_replaces() {
        let t0 = Instant::now();
        let mut a = Assumed::default();
        a.assume("n1", "default/p", vec![4, 2], t0, TTL);
        // An annotation without the pod list (an older plugin) keeps it for
        // its time to live.
        assert_eq!(free(&a.view("n1", gpus(&[16], None), t0 + TTL / 2, TTL)), [10]);
        assert_eq!((a.len(), a.live(t0 + TTL / 2, TTL), a.live(t0 + TTL, TTL)), (1, 1, 0));
        assert_eq!(free(&a.view("n1", gpus(&[16], None), t0 + TTL, TTL)), [16]);
        assert!(a.is_empty());
        // Bound again to the same node: one assumption, the last. A bind to
        // another node (which the API server refuses) leaves it, and is
        // released alone.
        a.assume("n1", "default/p", vec![2], t0, TTL);
        a.assume("n1", "default/p", vec![4], t0, TTL);
        a.assume("n2", "default/p", vec![4], t0, TTL);
        assert_eq!(a.len(), 2);
        a.release("n2", "default/p");
        assert_eq!(free(&a.view("n1", gpus(&[16], Some(&[])), t0, TTL)), [12]);
        assert_eq!(free(&a.view("n2", gpus(&[16], Some(&[])), t0, TTL)), [16]);
        a.release("n1", "default/p");
        // A resync adds what is missing and leaves the rest as it is.
        assert!(a.assume_if_absent("n1", "default/p", vec![3], t0, TTL));
        assert!(!a.assume_if_absent("n1", "default/p", vec![5], t0 + TTL / 2, TTL));
        assert_eq!(free(&a.view("n1", gpus(&[16], Some(&[])), t0 + TTL / 2, TTL)), [13]);
        assert_eq!(free(&a.view("n1", gpus(&[16], Some(&[])), t0 + TTL, TTL)), [16], "its time to live was not restarted");
        // A pod that fits no GPU any more takes nothing (and nothing wraps).
        a.assume("n3", "default/q", vec![9], t0, TTL);
        assert_eq!(free(&a.view("n3", gpus(&[8, 8], Some(&[])), t0, TTL)), [8, 8]);
        // Expired ones on other nodes go when anything is assumed.
        a.assume("n4", "default/r", vec![1], t0 + TTL, TTL);
        assert_eq!(a.len(), 1);
    }

    proptest::proptest! {
        /// Assumptions only take units away, never more than they asked,
        /// never below zero, and nothing once the annotation names them.
        #[test]
        fn a_view_takes_at_most_what_was_assumed(before in proptest::collection::vec(0u32..=16, 1..6), pods in proptest::collection::vec(proptest::collection::vec(1u32..=16, 1..3), 0..6)) {
            let t0 = Instant::now();
            let mut a = Assumed::default();
            for (k, units) in pods.iter().enumerate() {
                a.assume("n", &format!("ns/p{k}"), units.clone(), t0, TTL);
            }
            let after = free(&a.view("n", gpus(&before, Some(&[])), t0, TTL));
            let taken: u32 = before.iter().zip(&after).map(|(b, a)| b - a).sum();
            proptest::prop_assert!(before.iter().zip(&after).all(|(b, a)| a <= b));
            proptest::prop_assert!(taken <= pods.iter().flatten().sum::<u32>());
            let names: Vec<String> = (0..pods.len()).map(|k| format!("ns/p{k}")).collect();
            let named: Vec<(&str, u32)> = names.iter().zip(&pods).map(|(n, u)| (n.as_str(), u.iter().sum())).collect();
            proptest::prop_assert_eq!(free(&a.view("n", gpus(&before, Some(&named)), t0, TTL)), before.clone());
            proptest::prop_assert!(a.is_empty());
        }
    }

    #[test]
    fn units_past_u32_summed_do_not_overflow() {
        // Two containers of 3G units each (resync assumes any bound pod).
        let mut a = Assumed::default();
        let now = Instant::now();
        a.assume("n", "p", vec![3_000_000_000, 3_000_000_000], now, TTL);
        let g = a.view("n", gpus(&[16], Some(&[("p", 16)])), now, TTL);
        assert_eq!(free(&g), [16], "it fits no GPU: it takes nothing");
        assert_eq!(a.live(now, TTL), 1, "and stays assumed: the annotation holds less than it asks");
    }

    #[test]
    fn demands_are_kept_for_bind_and_bounded() {
        let mut a = Assumed::default();
        a.remember("", &[3]);
        assert_eq!(a.demand(""), None, "no UID, nothing kept");
        for i in 0..=DEMANDS {
            a.remember(&format!("u{i}"), &[i as u32]);
        }
        a.remember("u5", &[7]);
        assert_eq!(a.demand("u0"), None, "the oldest goes first");
        assert_eq!(a.demand("u5"), Some(vec![7]), "a pod filtered again keeps its place and takes its new demand");
        assert_eq!(a.demand(&format!("u{DEMANDS}")), Some(vec![DEMANDS as u32]));
        assert_eq!(a.demands.len(), DEMANDS);
    }
}
