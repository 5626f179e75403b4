//! `cargo +nightly fuzz run fuzz_extender_preempt`: the extender's
//! preemption must answer any node annotation and any request body without
//! panicking, keep only nodes it was sent, each with the victims it was
//! sent, and give a victim back no more than its GPUs hold. The input's
//! first line is the node's `egpu.io/gpus` annotation, the rest the
//! `ExtenderPreemptionArgs` body.
#![no_main]
use egpu_k8s::annotation::NodeGpus;
use egpu_k8s::extender::{Extender, NodeCache, PreemptionArgs};
use libfuzzer_sys::fuzz_target;
use std::sync::Arc;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let (annotation, body) = text.split_once('\n').unwrap_or((text, ""));
    // The annotation parser and release, alone.
    if let Ok(mut g) = NodeGpus::parse(Some(annotation)) {
        let uids: Vec<String> = g.holds.iter().flat_map(|h| h.keys().cloned()).collect();
        let uids: Vec<&str> = uids.iter().map(String::as_str).collect();
        let before: u64 = g.gpus.iter().map(|x| u64::from(x.free)).sum();
        let back = g.release(&uids);
        assert!(g.gpus.iter().all(|x| x.free <= x.units));
        assert_eq!(g.gpus.iter().map(|x| u64::from(x.free)).sum::<u64>(), before + back);
    }
    let Ok(args) = serde_json::from_str::<PreemptionArgs>(body) else { return };
    let sent = args.node_name_to_meta_victims.clone().unwrap_or_default();
    let sent_full: Vec<String> = args.node_name_to_victims.as_ref().map(|v| v.keys().cloned().collect()).unwrap_or_default();
    let cache = Arc::new(NodeCache::new("egpu.io/enabled=true"));
    let meta = serde_json::json!({"name": "n", "annotations": {"egpu.io/gpus": annotation}});
    cache.replace(vec![serde_json::from_value(meta).expect("node metadata")]);
    let ext = Extender::new("egpu.io/gpu-memory").with_node_cache(cache);
    let full = args.node_name_to_meta_victims.is_none();
    if let Ok(r) = ext.preempt(args) {
        for (node, v) in &r.node_name_to_meta_victims {
            if full {
                assert!(sent_full.contains(node), "a node it was not sent");
            } else {
                assert_eq!(sent.get(node), Some(v), "a node or victims it was not sent");
            }
        }
    }
});
