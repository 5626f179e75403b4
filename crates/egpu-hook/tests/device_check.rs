//! `scripts/device-check.sh --simulate`: the device check's non-GPU parts
//! (egpud, the memory suite through `egpu exec`, the driver witness,
//! fail-closed, live resize, the overhead bench, the compute-isolation checks
//! with egpu-burn in slices) against the simulated GPU.

mod common;

use std::process::Command;

#[test]
fn device_check_passes_on_the_simulated_gpu() {
    let dir = common::build().clone();
    common::cargo_build(&["egpu", "egpu-burn"]);
    for f in ["egpud", "egpu"] {
        assert!(dir.join(f).exists(), "{} missing after build", dir.join(f).display());
    }
    let tmp = tempfile::tempdir().unwrap();
    let result = tmp.path().join("device-check.json");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/device-check.sh");
    let out = Command::new("bash").arg(script).arg("--simulate").arg("--dist").arg(&dir).arg(&result).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&result).unwrap_or_else(|e| panic!("no result file ({e}): {stderr}"))).unwrap();
    let checks = doc["checks"].as_array().unwrap();
    // A failure names each failed check with its numbers (a CI log is all one sees of it).
    let failed: Vec<String> = checks.iter().filter(|c| c["status"] == "fail").map(|c| c.to_string()).collect();
    let check = |name: &str| checks.iter().find(|c| c["name"] == name).unwrap_or_else(|| panic!("check {name} missing"));
    assert!(out.status.success(), "device-check failed: {:?}\nfailed checks:\n{}\n{stderr}", doc["failed"], failed.join("\n"));
    assert_eq!(doc["ok"], true);
    assert_eq!(doc["simulate"], true);
    // The records and the logs archive beside the result, kept up to date as
    // the run goes (a killed run still leaves them); this run ended normally.
    assert_eq!(doc["complete"], true, "stopped: {}", doc["stopped"]);
    for f in ["device-check.jsonl", "device-check-logs.tar.gz"] {
        assert!(tmp.path().join(f).metadata().is_ok_and(|m| m.len() > 0), "{f} missing beside the result");
    }
    for name in ["egpud-up", "preflight", "view-direct", "view-dlopen", "view-procaddr", "alloc-vmm-procaddr", "alloc-graph-direct", "alloc-capturedpool-procaddr", "alloc-vmm-locality-procaddr", "alloc-pool-locality-procaddr", "witness-holding", "ctx-reset-retains", "green-ctx", "fail-closed", "resize-probe", "burst-probe", "hook-overhead", "sparse-array"] {
        let c = check(name);
        assert_eq!(c["status"], "pass", "{c}");
    }
    // The environment the run found, for reading a real machine's result.
    let c = check("environment");
    assert_eq!(c["status"], "info", "{c}");
    assert!(c["details"]["glibc"].as_str().is_some_and(|v| v.starts_with("2.")), "{c}");
    assert!(c["details"]["pid_namespace"].as_str().is_some_and(|v| v.starts_with("pid:")), "{c}");
    // The driver's reservations outside allocation calls: measured, no verdict.
    let c = check("driver-reservations");
    assert_eq!(c["status"], "info", "{c}");
    for k in ["bare_driver", "in_slice"] {
        assert_eq!(c["details"][k]["event"], "reserve", "{k}: {c}");
        assert!(c["details"][k]["free"]["start"].as_u64().is_some_and(|f| f > 0), "{k}: {c}");
        for step in ["heap", "stack", "module", "launch"] {
            assert!(c["details"][k]["errors"][step].is_null(), "{k}: {step} failed: {c}");
        }
    }
    let num = |c: &serde_json::Value, k: &str| c["details"][k].as_f64().unwrap_or_else(|| panic!("{k} not a number: {c}"));
    // Compute isolation with real targets on the simulated GPU (~0.4 ms
    // kernels): a 40% limit at 40 +- 3 of an un-hooked solo run (observed
    // 40.1), and the same limit held beside an open stream capture that
    // still ends with a graph, and beside captures begun and ended again
    // and again (none invalidated).
    for name in ["compute-limit-40", "compute-open-capture-global", "compute-open-capture-to-graph", "compute-capture-churn"] {
        let c = check(name);
        assert_eq!(c["status"], "pass", "{c}");
    }
    // The host's wake-up latency, measured with vCPUs free to halt and with
    // every CPU kept busy (--simulate's compute checks run so).
    let c = check("host-wakeup");
    assert_eq!(c["status"], "info", "{c}");
    for k in ["halting", "spinners"] {
        assert!(c["details"][k]["late_p99_us"].as_f64().is_some_and(|v| v >= 0.0), "{k}: {c}");
    }
    // 30/70 with limit = share: the capped 30% slice is held within 3
    // points of 30 whatever the host does; the 70% slice's part also
    // measures how fast the host wakes its burner (a late wake-up idles the
    // device, and the capped neighbour may not take the time), so its
    // 70 +- 3 target is `info` here: 57-68% on the 2-core development VM,
    // whose 400 us sleeps woke 2.6-4 ms late at p99, 63-70% with the CPUs
    // kept busy, 69.0-69.9% on a calm host. What a broken gate cannot fake: the 70%
    // slice still gets well over half the device (a gate ignoring shares
    // gives a FIFO device ~50/50, one over-throttling far less).
    let c = check("compute-share-30-70");
    assert_eq!(c["status"], "info", "{c}");
    assert!(c["details"]["target_met"].is_boolean(), "{c}");
    let used = |i: usize| c["details"]["egpud_used_pct"][i].as_f64().unwrap_or_else(|| panic!("no egpud share {i}: {c}"));
    assert!((used(0) - 30.0).abs() <= 3.0, "the capped 30% slice got {}%: {c}", used(0));
    assert!(used(1) >= 50.0, "the 70% slice got {}%: {c}", used(1));
    // Work conservation compares two runs made one after the other (the
    // un-hooked solo, then the slice), so on a shared 2-core machine the
    // load of whatever else runs moves the ratio by more than its 5%
    // target (0.988 alone; two CI runs with other tests beside it missed
    // 0.95): in --simulate it is `info`, and what is asserted is what a
    // broken gate cannot fake: a lone 30%-share slice with a 100% limit
    // runs far above its share (held to it, the ratio would be ~0.3).
    let c = check("compute-work-conservation");
    assert_eq!(c["status"], "info", "{c}");
    assert!(num(c, "ratio") >= 0.6, "a lone slice with a 100% limit was held near its 30% share: {c}");
    // Recorded as `info` in --simulate (ran, numbers, target_met, no verdict):
    // - priority p99 within 10% of alone: the simulated GPU runs a high
    //   slice's kernel behind the best-effort kernels already queued on the
    //   device (no preemption model, 0.4 ms kernels), so p99 loaded/alone is
    //   ~5x there; what a real GPU's time-slicing gives is the device check's
    //   question;
    // - resize reached within 20 ms: 20 ms windows of egpud's used seconds
    //   hold ~50 simulated kernels and catch two or three of egpud's 10 ms
    //   accounting updates (egpu ls polling jitters on a loaded 2-core
    //   machine), so per-window splits alternate by +-7 points; converged_ms
    //   was 25 and 94 ms in two runs, the 2 s mean split 58/40.
    let c = check("compute-priority-latency");
    assert_eq!(c["status"], "info", "{c}");
    assert!(num(c, "p99_alone_us") > 0.0 && num(c, "p99_loaded_us") > 0.0 && num(c, "ratio") > 0.0, "{c}");
    assert!(c["details"]["target_met"].is_boolean(), "{c}");
    let c = check("compute-resize-convergence");
    assert_eq!(c["status"], "info", "{c}");
    assert_eq!(c["details"]["resize_rc"], serde_json::json!([0, 0]), "{c}");
    assert!(num(c, "windows") >= 10.0, "{c}");
    assert!(c["details"]["first_windows"][0]["a_split_pct"].is_number(), "{c}");
    // The split did move: the whole post-resize window is nearer 60/40 than 30/70.
    assert!(c["details"]["after"]["ra"].as_f64().unwrap() > 45.0, "{c}");
    let c = check("torch-gemm-overhead");
    assert_eq!(c["status"], "skip", "{c}");
    assert!(checks.len() >= 55, "{} checks", checks.len());
}
