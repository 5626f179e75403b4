//! `preempt`: the scheduler's victims judged GPU by GPU.

use super::{Demand, Extender, MetaPod, MetaVictims, PreemptionArgs, PreemptionResult, RequestError};
use std::collections::BTreeMap;

impl Extender {
    /// `preempt`: of the nodes where the scheduler would evict victims for
    /// the pod, keeps those where, once the victims' units are back on the
    /// GPUs they hold (the annotation's `holds`), each of the pod's
    /// containers fits on one GPU (or whole GPUs), as `filter` judges; the
    /// victims stay as the scheduler chose them. The scheduler's own
    /// preemption counts only the node's total units, so without this it
    /// could evict pods spread over several GPUs and still leave no GPU
    /// with room: evictions for nothing, and again at the next attempt.
    /// Dropped: a node whose annotation cannot be read, and one the
    /// victims cannot make room on. A pod that asks for no units keeps
    /// every node. Without a node cache (the scheduler then sends no
    /// nodes) nothing can be judged and every node is kept.
    pub fn preempt(&self, args: PreemptionArgs) -> Result<PreemptionResult, RequestError> {
        let pod = args.pod.filter(serde_json::Value::is_object).ok_or(RequestError::NoPod)?;
        let demand = Demand::of_pod(&pod, &self.resource)?;
        let victims: BTreeMap<String, MetaVictims> = match (args.node_name_to_meta_victims, args.node_name_to_victims) {
            (Some(meta), _) => meta,
            (None, Some(full)) => full
                .into_iter()
                .map(|(node, v)| {
                    let pods = v.pods.iter().map(|p| MetaPod { uid: p["metadata"]["uid"].as_str().unwrap_or_default().to_string() }).collect();
                    (node, MetaVictims { pods, num_pdb_violations: v.num_pdb_violations })
                })
                .collect(),
            (None, None) => BTreeMap::new(),
        };
        if demand.units.is_empty() || self.nodes.is_none() {
            return Ok(PreemptionResult { node_name_to_meta_victims: victims });
        }
        let candidates = self.candidates(None, Some(victims.keys().cloned().collect()))?;
        let mut out = PreemptionResult::default();
        let (mut kept, mut dropped) = (0, 0);
        for (name, free) in self.frees(&candidates, true) {
            let Some(v) = victims.get(&name) else { continue };
            let uids: Vec<&str> = v.pods.iter().map(|p| p.uid.as_str()).collect();
            let fits = free.is_ok_and(|mut g| {
                g.release(&uids);
                demand.misfit(&g).is_none()
            });
            if fits {
                out.node_name_to_meta_victims.insert(name, v.clone());
                kept += 1;
            } else {
                dropped += 1;
            }
        }
        self.metrics.preempted(kept, dropped);
        Ok(out)
    }
}
