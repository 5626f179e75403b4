//! `cargo +nightly fuzz run fuzz_trace_nodes`: the openb node-list loader must never panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    for lenient in [false, true] {
        let _ = egpu_sim::trace::load_nodes("fuzz", &text, lenient);
    }
});
