//! `egpu simulate --elastic` on a usage trace of your own: Prometheus range
//! query JSON (as dcgm-exporter's metrics export) or plain CSV.

use clap::Parser;
use egpu_sim::elastic::load::parse_usage_file;
use std::path::{Path, PathBuf};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: egpu_sim::cli::SimulateArgs,
}

/// A fresh directory for one test.
fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("egpu-own-trace-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// A Prometheus range-query response: one series per (labels, value),
/// `n` samples 60 s apart.
fn prom(metric: &str, series: &[(&str, &str, &str)], n: usize) -> String {
    let list: Vec<String> = series
        .iter()
        .map(|(pod, gpu, v)| {
            let values: Vec<String> = (0..n).map(|k| format!("[{}, \"{v}\"]", 1_700_000_000 + 60 * k)).collect();
            format!(r#"{{"metric":{{"__name__":"{metric}","namespace":"ns","pod":"{pod}","gpu":"{gpu}","UUID":"GPU-{pod}-{gpu}","Hostname":"node1"}},"values":[{}]}}"#, values.join(","))
        })
        .collect();
    format!(r#"{{"status":"success","data":{{"resultType":"matrix","result":[{}]}}}}"#, list.join(","))
}

fn run(d: &Path, extra: &[&str]) -> anyhow::Result<serde_json::Value> {
    let out = d.join("report");
    let mut argv: Vec<String> = ["simulate", "--elastic", "--gpu-mem-gib", "80", "--no-progress", "--out"].iter().map(|s| s.to_string()).collect();
    argv.push(out.display().to_string());
    argv.extend(extra.iter().map(|s| s.to_string()));
    let cli = Cli::try_parse_from(argv)?;
    egpu_sim::cli::run(cli.args)?;
    Ok(serde_json::from_str(&std::fs::read_to_string(out.join("elastic.json"))?)?)
}

fn write(d: &Path, name: &str, text: &str) -> String {
    let p = d.join(name);
    std::fs::write(&p, text).expect("write");
    p.display().to_string()
}

#[test]
fn dcgm_exporter_series_become_one_slice_per_pod_gpu_in_the_right_units() {
    let d = dir("dcgm");
    // Pod b holds two GPUs: two slices. The series with an empty pod label
    // is a GPU nobody holds and is left out.
    let duty = write(&d, "duty.json", &prom("DCGM_FI_DEV_GPU_UTIL", &[("a", "0", "20"), ("b", "0", "20"), ("b", "1", "10"), ("", "2", "0")], 30));
    // MiB: 50,000 + 50,000 + 10,000 MiB = 107.4 GiB, more than one 80 GiB
    // GPU; read as bytes it would be nothing.
    let mem = write(&d, "mem.json", &prom("DCGM_FI_DEV_FB_USED", &[("a", "0", "50000"), ("b", "0", "50000"), ("b", "1", "10000"), ("", "2", "0")], 30));
    let j = run(&d, &["--usage-duty", &duty, "--usage-memory", &mem]).expect("runs");
    let e = &j[0];
    assert_eq!((e["pods"].as_u64(), e["minutes"].as_u64(), e["step_s"].as_f64()), (Some(3), Some(30), Some(60.0)), "{e}");
    assert_eq!(e["lower_bound"].as_u64(), Some(2), "{e}");
    let gpus = |s: &str| e["outcomes"].as_array().unwrap().iter().find(|o| o["strategy"] == s).map(|o| o["gpus"].as_u64().unwrap());
    assert_eq!(gpus("exclusive"), Some(3));
    assert_eq!(gpus("elastic-fleet"), Some(2));
    let md = std::fs::read_to_string(d.join("report/elastic.md")).unwrap();
    assert!(md.contains("your trace (") && md.contains("duty.json"), "{md}");
    // The unit can be forced: as bytes, memory no longer binds.
    let j = run(&d, &["--usage-duty", &duty, "--usage-memory", &mem, "--memory-unit", "bytes"]).expect("runs");
    assert_eq!(j[0]["lower_bound"].as_u64(), Some(1));
    let m = parse_usage_file("mem.json", &std::fs::read_to_string(&mem).unwrap(), false).unwrap();
    assert_eq!((m.name.as_deref(), m.series_without_pod, m.samples.len()), (Some("DCGM_FI_DEV_FB_USED"), 1, 90));
    let mut pods: Vec<&str> = m.samples.iter().map(|s| s.0.as_str()).collect();
    pods.dedup();
    assert_eq!(pods, ["ns/a#0", "ns/b#0", "ns/b#1"]);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_fraction_metric_and_a_plain_csv_load_too() {
    let d = dir("csv");
    // GR_ENGINE_ACTIVE is a fraction of 1: 0.45 + 0.45 + 0.2 = 1.1 GPUs' worth.
    let duty = write(&d, "duty.json", &prom("DCGM_FI_PROF_GR_ENGINE_ACTIVE", &[("a", "0", "0.45"), ("b", "0", "0.45"), ("c", "0", "0.2")], 10));
    let mut csv = String::from("pod,timestamp,value\n");
    for k in 0..10 {
        for p in ["a", "b", "c"] {
            csv.push_str(&format!("ns/{p}#0,{},{}\n", 1_700_000_000 + 60 * k, 1u64 << 30));
        }
    }
    let mem = write(&d, "mem.csv", &csv);
    let j = run(&d, &["--usage-duty", &duty, "--usage-memory", &mem]).expect("runs");
    assert_eq!((j[0]["pods"].as_u64(), j[0]["lower_bound"].as_u64()), (Some(3), Some(2)), "{}", j[0]);
    // Read as percent it is 1.1% of one GPU.
    let j = run(&d, &["--usage-duty", &duty, "--usage-memory", &mem, "--duty-unit", "percent"]).expect("runs");
    assert_eq!(j[0]["lower_bound"].as_u64(), Some(1));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn bad_own_traces_get_errors_that_say_what_to_do() {
    let d = dir("bad");
    let mem = write(&d, "mem.json", &prom("DCGM_FI_DEV_FB_USED", &[("a", "0", "1000")], 5));
    let err = |duty: &str, extra: &[&str]| {
        let p = write(&d, "duty.json", duty);
        let mut args = vec!["--usage-duty", &p, "--usage-memory", &mem];
        args.extend(extra);
        run(&d, &args).expect_err("must fail").to_string()
    };
    let e = err(&prom("DCGM_FI_DEV_GPU_UTIL", &[("a", "0", "250")], 5), &[]);
    assert!(e.contains("pod ns/a#0") && e.contains("250% is above 100%") && e.contains("--duty-unit"), "{e}");
    let e = err(r#"{"status":"error","errorType":"bad_data","error":"invalid parameter \"query\""}"#, &[]);
    assert!(e.contains("the query failed") && e.contains("invalid parameter"), "{e}");
    let e = err(r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#, &[]);
    assert!(e.contains("'vector', not 'matrix'") && e.contains("query_range"), "{e}");
    let bad_value = prom("DCGM_FI_DEV_GPU_UTIL", &[("a", "0", "10")], 5).replacen("\"10\"]", "\"ten\"]", 2).replacen("\"ten\"]", "\"10\"]", 1);
    let e = err(&bad_value, &[]);
    assert!(e.contains("series 1 (ns/a#0), sample 2: value 'ten' is not a number") && e.contains("--lenient"), "{e}");
    let nan = prom("DCGM_FI_DEV_GPU_UTIL", &[("a", "0", "NaN")], 5);
    assert!(err(&nan, &[]).contains("not a finite non-negative number"));
    // --lenient skips what is bad and keeps the rest.
    let p = write(&d, "duty.json", &bad_value);
    assert!(run(&d, &["--usage-duty", &p, "--usage-memory", &mem, "--lenient"]).is_ok());
    let e = err("{\"status\":\"success\",\n\"data\": {", &[]);
    assert!(e.contains("duty.json:2: not the JSON of a Prometheus range query"), "{e}");
    // Both files are needed, and not with --genai-dir.
    let e = Cli::try_parse_from(["simulate", "--elastic", "--usage-duty", "x"]).err().expect("needs memory").to_string();
    assert!(e.contains("--usage-memory"), "{e}");
    let e = Cli::try_parse_from(["simulate", "--elastic", "--usage-duty", "x", "--usage-memory", "y", "--genai-dir", "z"]).err().expect("conflict").to_string();
    assert!(e.contains("--genai-dir") && e.contains("cannot be used with"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}
