//! `cargo +nightly fuzz run fuzz_extender_args`: the scheduler extender must
//! answer any request body without panicking, keep only nodes it was sent,
//! and score every node it was sent from 0 to 10.
#![no_main]
use egpu_k8s::extender::{Extender, ExtenderArgs, MAX_SCORE};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let ext = Extender::new("egpu.io/gpu-memory");
    let parse = || serde_json::from_slice::<ExtenderArgs>(data).ok();
    let Some(args) = parse() else { return };
    let sent = args.nodes.as_ref().map_or(0, |n| n.items.len());
    let r = ext.filter(args);
    if let Some(n) = &r.nodes {
        assert!(n.items.len() <= sent);
    }
    if let Ok(scores) = ext.prioritize(parse().expect("parsed once")) {
        assert_eq!(scores.len(), sent);
        assert!(scores.iter().all(|h| (0..=MAX_SCORE).contains(&h.score)));
    }
});
