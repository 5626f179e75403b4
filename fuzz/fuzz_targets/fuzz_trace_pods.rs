//! `cargo +nightly fuzz run fuzz_trace_pods`: the openb pod-list loader must never panic,
//! and every pod it accepts must fit some empty node.
#![no_main]
use libfuzzer_sys::fuzz_target;

const NODES: &str = "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,P100\nn1,96000,393216,8,G2\n";

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let Ok((cluster, _)) = egpu_sim::trace::load_nodes("nodes", NODES, false) else { return };
    for lenient in [false, true] {
        if let Ok((pods, _)) = egpu_sim::trace::load_pods("fuzz", &text, &cluster, lenient) {
            for p in pods {
                assert!(cluster.nodes().iter().any(|n| n.fits(&p.pod)));
            }
        }
    }
});
