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
/// `n` samples 60 s apart. A series with an empty pod has no pod labels
/// (Prometheus drops empty labels): a GPU no pod holds.
fn prom(metric: &str, series: &[(&str, &str, &str)], n: usize) -> String {
    let list: Vec<(String, String)> = series
        .iter()
        .map(|(pod, gpu, v)| {
            let owner = if pod.is_empty() { String::new() } else { format!(r#""namespace":"ns","pod":"{pod}","#) };
            (format!(r#"{owner}"gpu":"{gpu}","UUID":"GPU-{gpu}","Hostname":"node1""#), v.to_string())
        })
        .collect();
    prom_labels(metric, &list, n)
}

/// [`prom`] with each series' labels written out (JSON members).
fn prom_labels(metric: &str, series: &[(String, String)], n: usize) -> String {
    let list: Vec<String> = series
        .iter()
        .map(|(labels, v)| {
            let values: Vec<String> = (0..n).map(|k| format!("[{}, \"{v}\"]", 1_700_000_000 + 60 * k)).collect();
            format!(r#"{{"metric":{{"__name__":"{metric}",{labels}}},"values":[{}]}}"#, values.join(","))
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
    // Pod b holds two GPUs: two slices. The series without a pod label is
    // a GPU nobody holds and is left out.
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
    assert!(e.contains("pod ns/a#0") && e.contains("250 read as percent is above 100%") && e.contains("--duty-unit fraction"), "{e}");
    let e = err(r#"{"status":"error","errorType":"bad_data","error":"invalid parameter \"query\""}"#, &[]);
    assert!(e.contains("the query failed") && e.contains("invalid parameter"), "{e}");
    let e = err(r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#, &[]);
    assert!(e.contains("'vector', not 'matrix'") && e.contains("query_range"), "{e}");
    let bad_value = prom("DCGM_FI_DEV_GPU_UTIL", &[("a", "0", "10")], 5).replacen("\"10\"]", "\"ten\"]", 2).replacen("\"ten\"]", "\"10\"]", 1);
    let e = err(&bad_value, &[]);
    assert!(e.contains("series 1 (ns/a#0), sample 2: value 'ten' is not a number") && e.contains("--lenient"), "{e}");
    let nan = prom("DCGM_FI_DEV_GPU_UTIL", &[("a", "0", "NaN")], 5);
    assert!(err(&nan, &[]).contains("value NaN at time 1700000000 is not a number from 0 to 1e18"));
    // --lenient skips what is bad and keeps the rest.
    let p = write(&d, "duty.json", &bad_value);
    let j = run(&d, &["--usage-duty", &p, "--usage-memory", &mem, "--lenient"]).expect("lenient runs");
    // The report says what was left out, for whoever reads it later.
    assert_eq!(j[0]["left_out"], serde_json::json!({"rows_or_samples": 1, "pods_in_one_file": 0, "samples_past_grid": 0}), "{}", j[0]);
    let md = std::fs::read_to_string(d.join("report/elastic.md")).unwrap();
    assert!(md.contains("Part of the input was left out**: 1 rows or samples skipped (`--lenient`)"), "{md}");
    let j = run(&d, &["--usage-duty", &write(&d, "duty.json", &prom("DCGM_FI_DEV_GPU_UTIL", &[("a", "0", "10")], 5)), "--usage-memory", &mem]).expect("runs");
    assert_eq!(j[0]["left_out"]["rows_or_samples"], 0, "{}", j[0]);
    assert!(!std::fs::read_to_string(d.join("report/elastic.md")).unwrap().contains("left out"));
    let e = err("{\"status\":\"success\",\n\"data\": {", &[]);
    assert!(e.contains("duty.json:2: not the JSON of a Prometheus range query"), "{e}");
    // An instant query, even as a bare result array, is not a trace.
    let e = err(r#"[{"metric":{"pod":"a"},"value":[1700000000,"10"]}]"#, &[]);
    assert!(e.contains("instant query") && e.contains("query_range"), "{e}");
    // A file that yields no samples.
    let e = err(r#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#, &[]);
    assert!(e.contains("duty.json: no samples"), "{e}");
    // Both files are needed, with --elastic, and not with --genai-dir.
    let e = Cli::try_parse_from(["simulate", "--usage-duty", "x", "--usage-memory", "y"]).err().expect("needs --elastic").to_string();
    assert!(e.contains("--elastic"), "{e}");
    let e = Cli::try_parse_from(["simulate", "--elastic", "--usage-duty", "x"]).err().expect("needs memory").to_string();
    assert!(e.contains("--usage-memory"), "{e}");
    let e = Cli::try_parse_from(["simulate", "--elastic", "--usage-duty", "x", "--usage-memory", "y", "--genai-dir", "z"]).err().expect("conflict").to_string();
    assert!(e.contains("--genai-dir") && e.contains("cannot be used with"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn workload_labels_renamed_by_prometheus_win_over_the_exporter_s_own() {
    // Scraped without honor_labels: `pod`/`namespace` are dcgm-exporter's
    // own, the workload's are `exported_*`. GPU 2 holds no workload.
    let d = dir("exported");
    let series = |v: [&str; 3]| -> Vec<(String, String)> {
        let exporter = r#""namespace":"gpu-operator","pod":"nvidia-dcgm-exporter-abcde""#;
        vec![
            (format!(r#"{exporter},"exported_namespace":"ml","exported_pod":"train-a","gpu":"0""#), v[0].to_string()),
            (format!(r#"{exporter},"exported_namespace":"ml","exported_pod":"train-b","gpu":"1""#), v[1].to_string()),
            (format!(r#"{exporter},"gpu":"2""#), v[2].to_string()),
        ]
    };
    let duty = write(&d, "duty.json", &prom_labels("DCGM_FI_DEV_GPU_UTIL", &series(["30", "30", "0"]), 10));
    let mem = write(&d, "mem.json", &prom_labels("DCGM_FI_DEV_FB_USED", &series(["1000", "1000", "0"]), 10));
    let m = parse_usage_file("mem.json", &std::fs::read_to_string(&mem).unwrap(), false).unwrap();
    let mut pods: Vec<&str> = m.samples.iter().map(|s| s.0.as_str()).collect();
    pods.dedup();
    assert_eq!((pods, m.series_without_pod), (vec!["ml/train-a#0", "ml/train-b#1"], 1));
    let j = run(&d, &["--usage-duty", &duty, "--usage-memory", &mem]).expect("runs");
    assert_eq!(j[0]["pods"].as_u64(), Some(2));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_pod_named_differently_in_the_two_files_is_an_error_unless_lenient() {
    // The memory series lack the gpu label: "ns/a" is not "ns/a#0".
    let d = dir("names");
    // Pod b is named the same way in both.
    let duty = write(&d, "duty.json", &prom("DCGM_FI_DEV_GPU_UTIL", &[("a", "0", "30"), ("b", "1", "40")], 5));
    let mem = write(
        &d,
        "mem.json",
        &prom_labels("DCGM_FI_DEV_FB_USED", &[(r#""namespace":"ns","pod":"a""#.to_string(), "1000".to_string()), (r#""namespace":"ns","pod":"b","gpu":"1""#.to_string(), "2000".to_string())], 5),
    );
    let e = run(&d, &["--usage-duty", &duty, "--usage-memory", &mem]).expect_err("mismatch").to_string();
    assert!(e.contains("1 pods have a duty cycle but no memory samples, e.g. ns/a#0") && e.contains("--lenient"), "{e}");
    // Lenient: both halves of the mismatch are skipped, not evaluated with
    // a metric of 0 (which would add a pod, and a GPU to the exclusive
    // baseline); b is evaluated.
    let j = run(&d, &["--usage-duty", &duty, "--usage-memory", &mem, "--lenient"]).expect("runs when lenient");
    assert_eq!(j[0]["pods"].as_u64(), Some(1), "{}", j[0]);
    assert_eq!((j[0]["outcomes"][0]["strategy"].as_str(), j[0]["outcomes"][0]["gpus"].as_u64()), (Some("exclusive"), Some(1)), "{}", j[0]);
    assert_eq!((j[0]["left_out"]["pods_in_one_file"].as_u64(), j[0]["left_out"]["rows_or_samples"].as_u64()), (Some(2), Some(0)), "{}", j[0]);
    // Lenient with no pod named alike in both: said so, not "no samples".
    let mem_a = write(&d, "mem-a.json", &prom_labels("DCGM_FI_DEV_FB_USED", &[(r#""namespace":"ns","pod":"a""#.to_string(), "1000".to_string())], 5));
    let e = run(&d, &["--usage-duty", &duty, "--usage-memory", &mem_a, "--lenient"]).expect_err("nothing left").to_string();
    assert!(e.contains("no pod is named the same way") && e.contains("every pod was skipped"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn shuffled_foresight_draws_are_refused_past_the_grid_s_size() {
    // Two pods sampled in minutes 0–2, one of them again at minute 499,999
    // (--max-gap 0: gaps repeat the last sample): 2 × 500,000 = 1,000,000 cells.
    // 64 draws would hold 64 million cells, past the grid's 50 million.
    let d = dir("draws");
    let (mut duty, mut mem) = (String::from("pod,timestamp,value\n"), String::from("pod,timestamp,value\n"));
    for (pod, minutes) in [("a", vec![0, 1, 2, 499_999]), ("b", vec![0, 1, 2])] {
        for k in minutes {
            duty.push_str(&format!("{pod},{},50\n", 60 * k));
            mem.push_str(&format!("{pod},{},1000000000\n", 60 * k));
        }
    }
    let (dp, mp) = (write(&d, "duty.csv", &duty), write(&d, "mem.csv", &mem));
    let e = run(&d, &["--usage-duty", &dp, "--usage-memory", &mp, "--max-gap", "0", "--fleet-foresight", "15", "--fleet-foresight-shuffled", "--fleet-foresight-draws", "64"]).expect_err("too many draws");
    assert!(e.is::<egpu_sim::cli::UsageError>(), "{e:#}");
    let e = e.to_string();
    assert!(e.contains("2 pods × 500000 periods (1000000 cells)") && e.contains("give at most 50 draws"), "{e}");
    assert!(!d.join("report").exists(), "refused before anything is written");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn the_step_can_be_given_and_units_can_be_named() {
    let d = dir("step");
    let mut duty = String::from("pod,timestamp,value\n");
    let mut mem = String::from("pod,timestamp,value\n");
    for k in 0..20 {
        duty.push_str(&format!("a,{},50\n", 60 * k));
        mem.push_str(&format!("a,{},100\n", 60 * k));
    }
    let (dp, mp) = (write(&d, "duty.csv", &duty), write(&d, "mem.csv", &mem));
    // 100 GiB on an 80 GiB GPU: two GPUs at the lower bound.
    let j = run(&d, &["--usage-duty", &dp, "--usage-memory", &mp, "--memory-unit", "gib", "--usage-step", "120"]).expect("runs");
    assert_eq!((j[0]["step_s"].as_f64(), j[0]["minutes"].as_u64(), j[0]["lower_bound"].as_u64()), (Some(120.0), Some(11), Some(2)), "{}", j[0]);
    // A pod bigger than the GPU fits no slice: its excess is refused in
    // every strategy, none pretends to hold it.
    for o in j[0]["outcomes"].as_array().unwrap() {
        assert_eq!(o["mem_violation_minutes"].as_u64(), Some(11), "{o}");
    }
    let j = run(&d, &["--usage-duty", &dp, "--usage-memory", &mp, "--memory-unit", "kib"]).expect("runs");
    assert_eq!((j[0]["step_s"].as_f64(), j[0]["minutes"].as_u64(), j[0]["lower_bound"].as_u64()), (Some(60.0), Some(20), Some(1)));
    let e = Cli::try_parse_from(["simulate", "--elastic", "--usage-duty", "x", "--usage-memory", "y", "--usage-step", "0.5"]).err().expect("bad step").to_string();
    assert!(e.contains("not a number of seconds of at least 1"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}

/// A genai-2026 layout whose memory file names a pod the duty file does not:
/// the pod is left out (its duty would count as 0), as for your own files
/// with --lenient, and the report says so.
#[test]
fn a_genai_pod_in_one_file_only_is_left_out() {
    use std::io::Write;
    let d = dir("genai-one-file");
    let gz = |name: &str, text: &str| {
        let mut e = flate2::write::GzEncoder::new(std::fs::File::create(d.join(name)).unwrap(), flate2::Compression::fast());
        e.write_all(text.as_bytes()).unwrap();
        e.finish().unwrap();
    };
    let (mut duty, mut mem) = (String::from("value,timestamp_anon,container_ip\n"), String::from("timestamp_anon,value,container_ip\n"));
    for k in 0..30 {
        let t = 1_662_858_720 + 57 * k;
        for pod in ["a", "b"] {
            duty.push_str(&format!("20.0,{t}.0,{pod}\n"));
            mem.push_str(&format!("{t}.0,1000000000.0,{pod}\n"));
        }
    }
    mem.push_str("1662859917.0,0.0,only-memory\n");
    gz("pod_gpu_duty_cycle_anon.csv.gz", &duty);
    gz("pod_gpu_memory_used_bytes_anon.csv.gz", &mem);
    let j = run(&d, &["--genai-dir", d.to_str().unwrap()]).expect("runs");
    let e = &j[0];
    assert_eq!(e["pods"], 2, "{e}");
    assert_eq!(e["left_out"]["pods_in_one_file"], 1, "{}", e["left_out"]);
    let md = std::fs::read_to_string(d.join("report").join("elastic.md")).unwrap();
    assert!(md.contains("1 pods that only one file names"), "{md}");
    let _ = std::fs::remove_dir_all(&d);
}
