//! `cargo +nightly fuzz run fuzz_trace_usage`: the usage loaders (genai-2026
//! CSV, a trace of your own as CSV or Prometheus range-query JSON, gzip or
//! plain) and the grid alignment must never panic.
#![no_main]
use egpu_sim::elastic::load;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok((text, _)) = load::decode("fuzz", data, data.first().is_some_and(|b| b & 1 == 1)) else { return };
    if let Ok((rows, _)) = load::parse_metric("fuzz", &text, true) {
        let _ = load::align(&rows, &rows);
    }
    if let Ok(m) = load::parse_usage_file("fuzz", &text, true) {
        let _ = load::align(&m.samples, &m.samples);
    }
});
