//! `egpud --metrics-addr`: a real HTTP scrape of /metrics on a simulated
//! node, with a slice, a live resize and an egpu-burn workload under
//! libegpu.so (so the arbiter's true GPU time comes from the simulated
//! driver's `nvmlDeviceGetProcessUtilization`).

mod common;

use common::{Node, http_get, sample as value, target_dir, wait_until};
use std::process::Stdio;
use std::time::Duration;

fn start_with_metrics() -> (Node, String) {
    let mut n = Node { dir: tempfile::tempdir().unwrap(), spec: "1x16GiB".into(), daemon: None, extra: Vec::new(), env: Vec::new() };
    let log = std::fs::File::create(n.log_path()).unwrap();
    let child = n.daemon_cmd().args(["--metrics-addr", "127.0.0.1:0"]).stdout(Stdio::null()).stderr(log).spawn().unwrap();
    n.daemon = Some(child);
    let addr_file = n.run_dir().join("metrics.addr");
    assert!(
        wait_until(Duration::from_secs(30), || n.egpu(&["devices"]).status.success() && addr_file.exists()),
        "egpud with --metrics-addr did not come up; log:\n{}",
        n.log()
    );
    let addr = std::fs::read_to_string(addr_file).unwrap().trim().to_string();
    assert!(n.log().contains(&format!("http://{addr}/metrics")), "the bound address is logged");
    (n, addr)
}

#[test]
fn metrics_are_served_over_http_and_follow_slices_resizes_and_workloads() {
    let (n, addr) = start_with_metrics();
    n.ok(&["create", "--name", "a", "--gpu-memory", "1GiB", "--gpu-memory-burst", "2GiB", "--gpu-compute", "30%", "--gpu-compute-limit", "50%"]);
    let (status, ctype, body) = http_get(&addr, "/metrics");
    assert_eq!(status, 200, "{body}");
    assert!(ctype.starts_with("application/openmetrics-text"), "{ctype}");
    assert_eq!(value(&body, r#"egpu_slice_memory_limit_bytes{slice="a",device="0"}"#), Some(1073741824.0), "{body}");
    assert_eq!(value(&body, r#"egpu_slice_memory_burst_bytes{slice="a",device="0"}"#), Some(2147483648.0), "{body}");
    assert_eq!(value(&body, r#"egpu_slice_memory_granted_bytes{slice="a",device="0"}"#), Some(0.0), "{body}");
    assert_eq!(value(&body, r#"egpu_slice_compute_share_ratio{slice="a",device="0"}"#), Some(0.3));
    assert_eq!(value(&body, r#"egpu_slice_compute_limit_ratio{slice="a",device="0"}"#), Some(0.5));
    assert_eq!(value(&body, r#"egpu_slice_resizes_total{slice="a"}"#), Some(0.0));
    assert_eq!(value(&body, r#"egpu_slice_usage_file_repairs_total{slice="a"}"#), Some(0.0));
    assert_eq!(value(&body, "egpu_slices_unadopted"), Some(0.0));
    assert_eq!(value(&body, "egpu_slices_recovered_from_limits"), Some(0.0));
    assert_eq!(value(&body, "egpu_arbiter_period_seconds"), Some(0.01));
    assert!(body.contains(r#"egpu_device_compute_share_allocated_ratio{device="0",uuid="GPU-"#), "{body}");
    assert!(body.contains("# TYPE egpu_arbiter_tick_seconds histogram"));
    assert!(body.contains(r#"egpu_arbiter_tick_seconds_bucket{le="+Inf"}"#));
    // The arbiter ticks and publishes a budget for the slice: alone and idle it
    // gets its share plus headroom up to its cap, 50% of a 10 ms period.
    assert!(wait_until(Duration::from_secs(10), || value(&http_get(&addr, "/metrics").2, r#"egpu_slice_compute_budget_seconds{slice="a",device="0"}"#).is_some()));
    let body = http_get(&addr, "/metrics").2;
    let ticks = value(&body, "egpu_arbiter_ticks_total").unwrap();
    assert!(ticks >= 1.0);
    let inf = value(&body, r#"egpu_arbiter_tick_seconds_bucket{le="+Inf"}"#).unwrap();
    assert_eq!(inf, value(&body, "egpu_arbiter_tick_seconds_count").unwrap());
    assert!(inf >= ticks && inf <= ticks + 2.0, "histogram count {inf} vs {ticks} ticks (a tick may land between the two reads)");
    assert_eq!(value(&body, r#"egpu_slice_compute_budget_seconds{slice="a",device="0"}"#), Some(0.005), "{body}");

    // A live resize shows at once in the limits and within a period in the budget.
    n.ok(&["resize", "a", "--gpu-compute", "60%", "--gpu-compute-limit", "60%"]);
    assert!(wait_until(Duration::from_secs(10), || {
        let b = http_get(&addr, "/metrics").2;
        value(&b, r#"egpu_slice_compute_budget_seconds{slice="a",device="0"}"#) == Some(0.006) && value(&b, r#"egpu_slice_resizes_total{slice="a"}"#) == Some(1.0)
    }));

    // A saturating workload: one attached process, and true GPU time accumulates.
    let burn = target_dir().join("egpu-burn");
    assert!(burn.exists(), "build the workspace first (cargo build --workspace): {} is missing", burn.display());
    let mut w = n.cli().args(["exec", "a", "--"]).arg(&burn).args(["--seconds", "20"]).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let ok = wait_until(Duration::from_secs(20), || {
        let b = http_get(&addr, "/metrics").2;
        value(&b, r#"egpu_slice_processes{slice="a"}"#) == Some(1.0) && value(&b, r#"egpu_slice_compute_used_seconds_total{slice="a",device="0"}"#).is_some_and(|v| v > 0.05)
    });
    let last = http_get(&addr, "/metrics").2;
    // `egpu ls -o json` shows the same compute view.
    let ls = n.slices();
    let d = &ls[0]["devices"][0];
    // SIGTERM, which `egpu exec` forwards to the burner (a SIGKILL would
    // leave the burner running on its own).
    common::signal(w.id(), libc::SIGTERM);
    let _ = w.wait();
    assert!(ok, "no GPU time seen for the workload:\n{last}\nlog:\n{}", n.log());
    assert_eq!((ls[0]["priority"].as_str(), d["compute_share_percent"].as_f64(), d["compute_limit_percent"].as_f64()), (Some("normal"), Some(60.0), Some(60.0)));
    assert!(d["compute_used_seconds"].as_f64().unwrap() > 0.0, "{d}");
    assert!(d["compute_usage_percent"].as_f64().is_some() && d["compute_throttled_seconds"].as_f64().is_some(), "{d}");
}

#[test]
fn healthz_answers_and_metrics_addr_names_only_a_running_egpud() {
    let (mut n, addr) = start_with_metrics();
    let (status, _, body) = http_get(&addr, "/healthz");
    assert_eq!((status, body.trim()), (200, "ok"));
    let addr_file = n.run_dir().join("metrics.addr");
    assert!(!n.run_dir().join("metrics.addr.tmp").exists(), "written through a temporary file, renamed into place");
    // A clean stop removes it.
    assert!(n.terminate().success(), "log:\n{}", n.log());
    assert!(!addr_file.exists(), "a stopped egpud's metrics.addr is left behind");
    // A crash leaves it; the next egpud, without --metrics-addr, removes it.
    n.extra = vec!["--metrics-addr".into(), "127.0.0.1:0".into()];
    n.restart();
    assert!(wait_until(Duration::from_secs(10), || addr_file.exists()), "log:\n{}", n.log());
    n.kill9();
    assert!(addr_file.exists());
    n.extra.clear();
    n.restart();
    assert!(!addr_file.exists(), "metrics.addr of a crashed egpud names no server");
}
