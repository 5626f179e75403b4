//! `egpu simulate` refuses bad flags, flag combinations and report
//! directories before it runs, as usage errors (exit 2 in `egpu`), and
//! never writes its report over an input.

use clap::Parser;
use egpu_sim::cli::UsageError;
use std::path::PathBuf;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: egpu_sim::cli::SimulateArgs,
}

fn parse(argv: &[&str]) -> Result<egpu_sim::cli::SimulateArgs, clap::Error> {
    Cli::try_parse_from(["simulate"].iter().chain(argv)).map(|c| c.args)
}

/// A fresh directory for one test.
fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("egpu-bad-flags-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

const NODES: &str = "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,P100\nn1,96000,393216,8,V100M32\n";
const PODS: &str = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,4000,8192,1,500\np1,8000,16384,2,1000\np2,1000,1024,0,0\n";

/// Run with these flags on the small trace in `d`; the error if any.
fn run(d: &std::path::Path, argv: &[&str]) -> anyhow::Result<()> {
    let (n, p) = (d.join("nodes.csv"), d.join("pods.csv"));
    if !n.exists() {
        std::fs::write(&n, NODES).unwrap();
        std::fs::write(&p, PODS).unwrap();
    }
    let mut all: Vec<String> = ["--node-list", n.to_str().unwrap(), "--no-progress"].iter().map(|s| s.to_string()).collect();
    if !argv.contains(&"--seeds") {
        all.extend(["--seeds".to_string(), "1".to_string()]);
    }
    if !argv.contains(&"--pod-list") {
        all.extend(["--pod-list".to_string(), p.display().to_string()]);
    }
    if !argv.contains(&"--out") {
        all.extend(["--out".to_string(), d.join("report").display().to_string()]);
    }
    all.extend(argv.iter().map(|s| s.to_string()));
    let refs: Vec<&str> = all.iter().map(String::as_str).collect();
    egpu_sim::cli::run(parse(&refs)?)
}

fn usage_error(r: anyhow::Result<()>) -> String {
    let e = r.expect_err("refused");
    assert!(e.downcast_ref::<UsageError>().is_some(), "not a usage error: {e:#}");
    e.to_string()
}

#[test]
fn out_of_range_values_are_refused_by_name() {
    for bad in [
        &["--elastic", "--gpu-mem-gib", "0"][..],
        &["--elastic", "--gpu-mem-gib", "-80"],
        &["--elastic", "--gpu-mem-gib", "nan"],
        &["--elastic", "--gpu-mem-gib", "80,inf"],
        &["--elastic", "--gpu-mem-gib", "0.000001"],
        &["--elastic", "--gpu-risk-window", "18446744073709551615"],
        &["--elastic", "--gpu-risk-window", "1000000000"],
        &["--elastic", "--window", "0"],
        &["--elastic", "--resize-every", "0"],
        &["--elastic", "--compute-window", "0"],
        &["--elastic", "--mem-floor-gib", "-100"],
        &["--elastic", "--mem-floor-gib", "NaN"],
        &["--elastic", "--headroom", "-5"],
        &["--elastic", "--mem-headroom", "-2"],
        &["--elastic", "--compute-floor", "5"],
        &["--elastic", "--compute-quantile", "2"],
        &["--elastic", "--compute-quantile", "-1"],
        &["--elastic", "--gpu-risk-quantile", "NaN"],
        &["--elastic", "--moves", "Repack"],
        &["--elastic", "--fleet-risk-window", "100001"],
        &["--elastic", "--fleet-foresight", "0"],
        &["--elastic", "--fleet-foresight", "100001"],
        &["--elastic", "--fleet-replan", "100001"],
        &["--elastic", "--fleet-replan-lookback", "0"],
        &["--elastic", "--fleet-foresight", "15", "--fleet-foresight-shuffled", "--fleet-foresight-draws", "0"],
        &["--elastic", "--fleet-foresight", "15", "--fleet-foresight-shuffled", "--fleet-foresight-draws", "65"],
        &["--seeds", "0"],
        &["--seeds", "10000000000000"],
        &["--threads", "0"],
        &["--node-order", "Name"],
    ] {
        let e = parse(bad).err().unwrap_or_else(|| panic!("{bad:?} accepted"));
        let flag = bad.iter().rev().find(|a| a.starts_with("--")).unwrap();
        assert!(e.to_string().contains(flag), "{bad:?}: {e}");
    }
    // The defaults of both modes, and every value at the edge of its range.
    parse(&[]).expect("defaults");
    parse(&["--elastic"]).expect("elastic defaults");
    parse(&["--elastic", "--gpu-mem-gib", "1,4096", "--compute-quantile", "0", "--gpu-risk-quantile", "0", "--gpu-risk-window", "100000"]).expect("edges");
    parse(&["--seeds", "100000", "--threads", "1", "--first-seed", "0"]).expect("edges");
    parse(&["--elastic", "--fleet-foresight", "100000", "--fleet-foresight-shuffled", "--fleet-replan", "0", "--fleet-replan-lookback", "100000"]).expect("edges");
    for draws in ["1", "64"] {
        parse(&["--elastic", "--fleet-foresight", "15", "--fleet-foresight-shuffled", "--fleet-foresight-draws", draws]).expect("edges");
    }
}

#[test]
fn flags_of_the_other_mode_are_refused() {
    for bad in [
        &["--elastic", "--policies", "fgd"][..],
        &["--elastic", "--inflation", "2"],
        &["--elastic", "--pod-list", "x.csv"],
        &["--elastic", "--seeds", "3"],
        &["--gpu-mem-gib", "80"],
        &["--window", "5"],
        &["--genai-dir", "/nonexistent"],
        &["--fleet-gpus", "40"],
        &["--elastic", "--no-fleet", "--fleet-gpus", "3"],
        &["--elastic", "--no-fleet", "--fleet-hindsight"],
        &["--elastic", "--no-fleet", "--fleet-foresight", "60"],
        &["--elastic", "--no-fleet", "--fleet-replan", "15"],
        &["--elastic", "--fleet-foresight-shuffled"],
        &["--elastic", "--fleet-foresight", "15", "--fleet-foresight-draws", "4"],
        &["--elastic", "--duty-unit", "fraction"],
    ] {
        assert!(parse(bad).is_err(), "{bad:?} accepted");
    }
}

/// Every flag of the elastic evaluation is refused without `--elastic`
/// also beside a flag of the placement simulator (clap alone lets it pass
/// there, unused), and the flags that read a usage file without that file.
#[test]
fn elastic_flags_are_refused_beside_placement_flags_too() {
    use clap::Args;
    let cmd = egpu_sim::cli::SimulateFlags::augment_args(clap::Command::new("simulate"));
    let placement: Vec<&str> = cmd.get_arguments().filter(|a| cmd.get_arg_conflicts_with(a).iter().any(|c| c.get_id() == "elastic")).map(|a| a.get_id().as_str()).collect();
    assert!(placement.contains(&"seeds") && placement.contains(&"policies"), "{placement:?}");
    let mut checked = 0;
    for a in cmd.get_arguments() {
        let id = a.get_id().as_str();
        if placement.contains(&id) || ["lenient", "out", "no_progress", "elastic"].contains(&id) {
            continue;
        }
        let long = format!("--{}", a.get_long().unwrap());
        let mut argv = vec!["--seeds".to_string(), "1".to_string(), long.clone()];
        if a.get_action().takes_values() {
            argv.push(a.get_default_values().first().map_or("1".to_string(), |v| v.to_string_lossy().into_owned()));
        }
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let e = parse(&argv).map(|_| ()).expect_err(&format!("{argv:?} accepted"));
        assert!(e.to_string().contains(&long), "{argv:?}: {e}");
        checked += 1;
    }
    assert!(checked >= 30, "only {checked} elastic flags");
    // The flags both modes take are fine with either.
    assert!(parse(&["--seeds", "1", "--lenient", "--no-progress"]).is_ok());
    // A usage file's unit or step with genai-2026 (or with no file) has
    // nothing to apply to; with the file it is fine.
    for bad in [&["--elastic", "--genai-dir", "/x", "--duty-unit", "percent"][..], &["--elastic", "--genai-dir", "/x", "--memory-unit", "mib"], &["--elastic", "--genai-dir", "/x", "--usage-step", "60"]] {
        let e = parse(bad).map(|_| ()).expect_err(&format!("{bad:?} accepted"));
        assert!(e.to_string().contains("reads your own usage files"), "{bad:?}: {e}");
    }
    assert!(parse(&["--elastic", "--usage-duty", "d", "--usage-memory", "m", "--duty-unit", "percent", "--usage-step", "60"]).is_ok());
}

#[test]
fn placement_flags_that_make_no_sense_are_usage_errors() {
    let d = dir("placement");
    let e = usage_error(run(&d, &["--policies", "fgd,FGD"]));
    assert!(e.contains("'FGD' is listed twice"), "{e}");
    let e = usage_error(run(&d, &["--policies", "fgd,fgdd"]));
    assert!(e.contains("unknown policy 'fgdd'"), "{e}");
    let e = usage_error(run(&d, &["--first-seed", "18446744073709551610", "--seeds", "10"]));
    assert!(e.contains("runs past the largest seed"), "{e}");
    // Another trace than the embedded one needs its directory.
    let out = d.join("report");
    let e = usage_error(egpu_sim::cli::run(parse(&["--trace", "gpushare40", "--seeds", "1", "--no-progress", "--out", out.to_str().unwrap()]).unwrap()));
    assert!(e.contains("--trace gpushare40 needs --trace-dir"), "{e}");
    assert!(!d.join("report").exists(), "nothing written");
    // --trace beside --pod-list (the file itself) would be dropped unseen.
    for trace in ["gpushare40", "default"] {
        let e = parse(&["--pod-list", "p.csv", "--trace", trace]).map(|_| ()).expect_err("refused");
        assert!(e.to_string().contains("--trace names a pod list inside --trace-dir, and --pod-list names the file itself"), "{e}");
        assert_eq!(e.exit_code(), 2);
    }
    parse(&["--trace-dir", "d", "--trace", "gpushare40"]).expect("a trace in its directory");
    // The last seed that fits is fine.
    run(&d, &["--first-seed", "18446744073709551615", "--policies", "fgd"]).expect("seed u64::MAX");
}

#[test]
fn a_pod_list_without_gpu_pods_is_an_error() {
    let d = dir("nogpu");
    for (name, text, why) in [("header.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n", "no pods"), ("cpu.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,10,0,0\n", "no pod that asks for a GPU")] {
        let p = d.join(name);
        std::fs::write(&p, text).unwrap();
        let e = run(&d, &["--pod-list", p.to_str().unwrap()]).expect_err("refused").to_string();
        assert!(e.contains(why) && e.contains(name), "{e}");
    }
    // Every row skipped with --lenient says so.
    let p = d.join("bad.csv");
    std::fs::write(&p, "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,x,10,1,500\n").unwrap();
    let e = run(&d, &["--pod-list", p.to_str().unwrap(), "--lenient"]).expect_err("refused").to_string();
    assert!(e.contains("no pods (1 rows skipped)"), "{e}");
}

#[test]
fn the_report_directory_is_checked_before_the_run_and_never_overwrites_an_input() {
    let d = dir("out");
    let file = d.join("a-file");
    std::fs::write(&file, "keep").unwrap();
    let e = usage_error(run(&d, &["--out", file.to_str().unwrap()]));
    assert!(e.contains("is a file"), "{e}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep");
    // A pod list named like a report file, inside the report directory.
    let out = d.join("report");
    std::fs::create_dir_all(&out).unwrap();
    let pods = out.join("curves.csv");
    std::fs::write(&pods, PODS).unwrap();
    let e = usage_error(run(&d, &["--pod-list", pods.to_str().unwrap(), "--out", out.to_str().unwrap()]));
    assert!(e.contains("would overwrite the input") && e.contains("curves.csv"), "{e}");
    assert_eq!(std::fs::read_to_string(&pods).unwrap(), PODS, "the input is untouched");
    // A hard link to the pod list is the same file under a report name.
    let linked = d.join("linked");
    std::fs::create_dir_all(&linked).unwrap();
    std::fs::hard_link(&pods, linked.join("summary.md")).unwrap();
    let e = usage_error(run(&d, &["--pod-list", pods.to_str().unwrap(), "--out", linked.to_str().unwrap()]));
    assert!(e.contains("would overwrite the input") && e.contains("summary.md"), "{e}");
    assert_eq!(std::fs::read_to_string(&pods).unwrap(), PODS, "the input is untouched");
    // A report name taken by a directory, and a broken link, fail at once.
    let taken = d.join("taken");
    std::fs::create_dir_all(taken.join("results.json")).unwrap();
    let e = usage_error(run(&d, &["--out", taken.to_str().unwrap()]));
    assert!(e.contains("is a directory, where the report writes its results.json"), "{e}");
    let broken = d.join("broken");
    std::os::unix::fs::symlink(d.join("nowhere"), &broken).unwrap();
    let e = usage_error(run(&d, &["--out", broken.to_str().unwrap()]));
    assert!(e.contains("is a broken symbolic link"), "{e}");
    // The same with the elastic report's files.
    let duty = out.join("elastic.json");
    std::fs::write(&duty, "pod,timestamp,value\na,0,10\na,60,20\n").unwrap();
    let mem = d.join("mem.csv");
    std::fs::write(&mem, "pod,timestamp,value\na,0,1e9\na,60,1e9\n").unwrap();
    let argv = ["--elastic", "--usage-duty", duty.to_str().unwrap(), "--usage-memory", mem.to_str().unwrap(), "--out", out.to_str().unwrap(), "--no-progress"];
    let e = usage_error(egpu_sim::cli::run(parse(&argv).unwrap()));
    assert!(e.contains("would overwrite the input") && e.contains("elastic.json"), "{e}");
    assert!(std::fs::read_to_string(&duty).unwrap().starts_with("pod,timestamp"));
    // Elsewhere it runs; a GPU size listed twice is refused.
    let other = d.join("elastic-report");
    let ok = ["--elastic", "--usage-duty", duty.to_str().unwrap(), "--usage-memory", mem.to_str().unwrap(), "--out", other.to_str().unwrap(), "--no-progress", "--gpu-mem-gib", "80"];
    egpu_sim::cli::run(parse(&ok).unwrap()).expect("runs");
    assert!(other.join("elastic-80GiB.svg").exists());
    let fleet = std::fs::read_to_string(other.join("elastic-fleet-80GiB.svg")).expect("the fleet search's chart");
    assert!(fleet.contains("violations by fleet size") && fleet.contains("budget 1.00%"), "{fleet}");
    // One size tried: the axis is labelled with it once, not with rounded
    // ticks on either side that repeat it.
    let whole: Vec<&str> = fleet.split("</text>").filter_map(|t| t.rsplit('>').next()).map(str::trim).filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit())).collect();
    assert_eq!(whole, ["1"], "{fleet}");
    let md = std::fs::read_to_string(other.join("elastic.md")).unwrap();
    assert!(md.contains("Charts of this run: elastic-80GiB.svg, elastic-fleet-80GiB.svg\n"), "{md}");
    // The fleet chart's name is a report file too: an input by that name is kept.
    let chart_named = other.join("elastic-fleet-80GiB.svg");
    std::fs::write(&chart_named, "pod,timestamp,value\na,0,1e9\na,60,1e9\n").unwrap();
    let clash = ["--elastic", "--usage-duty", duty.to_str().unwrap(), "--usage-memory", chart_named.to_str().unwrap(), "--out", other.to_str().unwrap(), "--gpu-mem-gib", "80"];
    let e = usage_error(egpu_sim::cli::run(parse(&clash).unwrap()));
    assert!(e.contains("elastic-fleet-80GiB.svg"), "{e}");
    let twice = ["--elastic", "--usage-duty", duty.to_str().unwrap(), "--usage-memory", mem.to_str().unwrap(), "--out", other.to_str().unwrap(), "--gpu-mem-gib", "80,80"];
    let e = usage_error(egpu_sim::cli::run(parse(&twice).unwrap()));
    assert!(e.contains("lists 80 twice"), "{e}");
}

#[test]
fn trace_files_may_be_gzip_and_a_bad_byte_names_its_line() {
    use std::io::Write;
    let d = dir("bytes");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(PODS.as_bytes()).unwrap();
    let p = d.join("pods.csv.gz");
    std::fs::write(&p, gz.finish().unwrap()).unwrap();
    run(&d, &["--pod-list", p.to_str().unwrap(), "--policies", "fgd"]).expect("gzip pod list");
    let bad = d.join("bad.csv");
    std::fs::write(&bad, b"name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,4000,8192,1,500\np\xff1,4000,8192,1,500\n").unwrap();
    let e = run(&d, &["--pod-list", bad.to_str().unwrap()]).expect_err("refused").to_string();
    assert!(e.contains("bad.csv:3: not UTF-8 text"), "{e}");
    let out = d.join("lenient-report");
    run(&d, &["--pod-list", bad.to_str().unwrap(), "--lenient", "--policies", "fgd", "--out", out.to_str().unwrap()]).expect("the line skipped");
    // The report keeps what was left out, for whoever reads it later.
    let j: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    assert_eq!(j["left_out"], serde_json::json!({"node_rows": 0, "pod_rows": 0, "non_utf8_lines": 1}), "{}", j["left_out"]);
    let md = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(md.contains("left out** (`--lenient`): 0 node rows, 0 pod rows and 1 lines that are not UTF-8 skipped"), "{md}");
    // Lone `\r` line ends: the bad line is skipped, not taken for the header.
    let cr = d.join("cr.csv");
    std::fs::write(&cr, b"name,cpu_milli,memory_mib,num_gpu,gpu_milli\rp0,4000,8192,1,500\rp\xff1,4000,8192,1,500\rp2,4000,8192,1,300\r").unwrap();
    let e = run(&d, &["--pod-list", cr.to_str().unwrap()]).expect_err("refused").to_string();
    assert!(e.contains("cr.csv:3: not UTF-8 text"), "{e}");
    run(&d, &["--pod-list", cr.to_str().unwrap(), "--lenient", "--policies", "fgd", "--out", out.to_str().unwrap()]).expect("the line skipped");
    let j: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    assert_eq!(j["left_out"]["non_utf8_lines"], 1, "{}", j["left_out"]);
    let bad_row = d.join("bad-row.csv");
    std::fs::write(&bad_row, "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,4000,8192,1,500\np1,x,8192,1,500\n").unwrap();
    run(&d, &["--pod-list", bad_row.to_str().unwrap(), "--lenient", "--policies", "fgd", "--out", out.to_str().unwrap()]).expect("the row skipped");
    let j: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    assert_eq!(j["left_out"]["pod_rows"], 1, "{}", j["left_out"]);
    // Without anything left out, the summary says nothing of it.
    run(&d, &["--pod-list", bad_row.to_str().unwrap(), "--policies", "fgd", "--out", out.to_str().unwrap()]).expect_err("strict refuses the row");
    run(&d, &["--policies", "fgd", "--out", out.to_str().unwrap()]).expect("clean input");
    assert!(!std::fs::read_to_string(out.join("summary.md")).unwrap().contains("left out"));
}
