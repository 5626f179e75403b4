//! `egpu demo` and `egpu bench resize` run start to finish on a simulated node
//! and clean up after themselves.

mod common;
use common::*;

#[test]
fn demo_runs_and_cleans_up() {
    let o = std::process::Command::new(EGPU).args(["demo", "--force-simulated"]).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}\n{}", String::from_utf8_lossy(&o.stderr));
    for needle in ["B reached its limit", "CUDA_ERROR_OUT_OF_MEMORY", "B now holds its 2GiB", "C grew to 3GiB with no resize", "burst 4GiB)", "workload A exited 0, workload B exited 0", "compute-b` to 40% first", "Cleaning up"] {
        assert!(out.contains(needle), "demo output lacks {needle:?}:\n{out}");
    }
    // Compute: A's share of the kernels follows the live resize from 30/70 to 60/40.
    let line = out.lines().find(|l| l.starts_with("Compute: A's share of the kernels was")).unwrap_or_else(|| panic!("no compute summary:\n{out}"));
    let shares: Vec<f64> = line.split_whitespace().filter_map(|w| w.strip_suffix('%')?.parse().ok()).collect();
    let [before, after] = shares[..] else { panic!("compute summary without two percentages: {line}") };
    assert!(before < 50.0 && after > 50.0 && after > before, "A's share of kernels did not follow 30/70 -> 60/40: {line}\n{out}");
    let pid_line = out.lines().find(|l| l.contains("egpud pid")).unwrap();
    let pid: u32 = pid_line.split_whitespace().nth(2).unwrap().parse().unwrap();
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists() || std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap().contains(" Z "), "egpud {pid} still runs");
    let dir = pid_line.split_whitespace().nth(4).unwrap();
    assert!(!std::path::Path::new(dir).exists(), "demo left {dir} behind");
}

#[test]
fn demo_to_a_reader_that_went_away_runs_to_its_end() {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let o = std::process::Command::new(EGPU).args(["demo", "--force-simulated"]).stdout(writer).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn resize_bench_measures_every_resize() {
    let o = std::process::Command::new(EGPU).args(["bench", "resize", "--count", "50", "--json"]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for k in ["from_return", "from_call", "call"] {
        assert_eq!(v[k]["count"], 50, "{v}");
        assert!(v[k]["median_ns"].as_u64().unwrap() <= v[k]["p99_ns"].as_u64().unwrap());
    }
    // Issued-to-seen can never be shorter than returned-to-seen.
    assert!(v["from_call"]["median_ns"].as_u64().unwrap() >= v["from_return"]["median_ns"].as_u64().unwrap());
}

#[test]
fn demo_help_names_every_step_of_the_tour() {
    let o = std::process::Command::new(EGPU).args(["demo", "--help"]).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}");
    for needle in ["limit", "resize live", "burst", "30/70 then 60/40", "clean up"] {
        assert!(out.contains(needle), "`egpu demo --help` lacks {needle:?}:\n{out}");
    }
}
