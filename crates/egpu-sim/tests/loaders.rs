//! Loader behaviour: line-numbered errors, lenient skipping, and no panic
//! on any input (property-tested; the same functions are fuzzed under fuzz/).

use egpu_sim::elastic::load as usage;
use egpu_sim::trace::{load_nodes, load_pods};
use proptest::prelude::*;

const NODES: &str = "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,P100\nn1,96000,393216,8,G2\n";

#[test]
fn good_rows_load() {
    let (c, s) = load_nodes("nodes.csv", NODES, false).unwrap();
    assert_eq!((c.nodes().len(), c.gpu_count(), s.count), (2, 10, 0));
    let pods = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase\np0,1000,100,1,500,,LS,Running\np1,2000,100,2,1000,G2|P100,BE,Running\np2,500,10,0,0,,BE,Running\np3,500,10,0,,,BE,Running\n";
    let (p, _) = load_pods("pods.csv", pods, &c, false).unwrap();
    assert_eq!(p.len(), 4, "a CPU-only pod's gpu_milli is not read, and may be empty");
    assert_eq!(p[3].pod.total_gpu_milli(), 0);
    assert!(p[1].pod.gpu_types().allows(c.gpu_type("G2")));
    assert!(!p[1].pod.gpu_types().allows(None));
}

fn pod_err(row: &str) -> String {
    let (c, _) = load_nodes("nodes.csv", NODES, false).unwrap();
    let text = format!("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np0,1000,100,1,500,\n{row}\n");
    load_pods("pods.csv", &text, &c, false).unwrap_err().to_string()
}

#[test]
fn bad_rows_name_the_line_and_the_problem() {
    assert!(pod_err("p1,abc,100,1,500,").starts_with("pods.csv:3: column 'cpu_milli'"), "{}", pod_err("p1,abc,100,1,500,"));
    assert!(pod_err("p1,1000,100").contains("pods.csv:3: truncated row"));
    assert!(pod_err("p1,1000,100,1,500,A100").contains("unknown GPU type 'A100'"));
    assert!(pod_err("p1,1000,100,1,1500,").contains("outside 1..=1000"));
    assert!(pod_err("p1,1000,100,9,1000,").contains("can never be placed"));
    // An error about the whole file (a gzip file that does not unpack) has no line 0.
    let whole = egpu_sim::trace::TraceError { file: "p.csv.gz".into(), line: 0, msg: "cannot decompress".into() };
    assert_eq!(whole.to_string(), "p.csv.gz: cannot decompress");
    let e = pod_err("p1,1000,100,9,1000,");
    assert!(e.contains("no node in the node list is large enough"), "{e}");
    // 4 GPUs fit the G2 node, not the 2-GPU P100 one the spec asks for.
    let e = pod_err("p1,1000,100,4,1000,P100");
    assert!(e.contains("no node of its gpu_spec 'P100' is large enough, though nodes of other GPU types are"), "{e}");
    assert!(pod_err("p1,1000,100,2,500,").contains("whole"));
    let e = load_nodes("nodes.csv", "sn,cpu_milli,memory_mib,gpu,model\nn0,1,1,2,\n", false).unwrap_err();
    assert_eq!((e.line, e.msg.contains("no GPU model")), (2, true));
    assert!(load_nodes("n.csv", "sn,cpu\n", false).unwrap_err().msg.contains("missing column 'cpu_milli'"));
}

#[test]
fn rows_that_would_silently_change_the_cluster_are_refused() {
    // A node listed twice would add capacity.
    let e = load_nodes("n.csv", "sn,cpu_milli,memory_mib,gpu,model\nn0,1000,100,1,T4\nn1,1000,100,1,T4\nn0,1000,100,1,T4\n", false).unwrap_err();
    assert_eq!(e.to_string(), "n.csv:4: node 'n0' is listed again (first at line 2)");
    let (c, s) = load_nodes("n.csv", "sn,cpu_milli,memory_mib,gpu,model\nn0,1000,100,1,T4\nn0,1000,100,1,T4\n", true).unwrap();
    assert_eq!((c.nodes().len(), s.count), (1, 1));
    // A comma inside gpu_spec shifts the columns: refused, not truncated.
    assert!(pod_err("p1,1000,100,1,500,G2,P100").contains("pods.csv:3: 7 fields but the header has 6"), "{}", pod_err("p1,1000,100,1,500,G2,P100"));
    // GPU models match whatever their case.
    let (c, _) = load_nodes("n.csv", "sn,cpu_milli,memory_mib,gpu,model\nn0,8000,1000,1,v100m16\nn1,8000,1000,1,T4\n", false).unwrap();
    assert_eq!(c.gpu_types().len(), 2);
    let (p, _) = load_pods("p.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np0,1000,100,1,500,V100M16\np1,1000,100,1,500,t4|v100M16\n", &c, false).unwrap();
    assert!(c.nodes().iter().filter(|n| n.fits(&p[0].pod)).count() == 1 && c.nodes().iter().filter(|n| n.fits(&p[1].pod)).count() == 2);
    // The most CPU and the most GPUs on different nodes: no node holds a
    // pod that needs both.
    let (c, _) = load_nodes("n.csv", "sn,cpu_milli,memory_mib,gpu,model\nsmall,16000,1000,8,G2\nbig,128000,1000,1,G2\n", false).unwrap();
    let e = load_pods("p.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,64000,100,8,1000\n", &c, false).unwrap_err();
    assert!(e.to_string().contains("p.csv:2: pod 'p0' can never be placed"), "{e}");
}

#[test]
fn a_column_named_twice_is_refused_not_read_from_its_first_field() {
    // Read from its first field, this node would have 0 GPUs, and a pod
    // would then be blamed for fitting no node.
    let e = load_nodes("n.csv", "sn,cpu_milli,memory_mib,gpu,model,gpu\na,64000,262144,0,P100,8\n", false).unwrap_err();
    assert_eq!(e.to_string(), "n.csv:1: column 'gpu' appears twice (fields 4 and 6): keep one");
    // Without regard to case, an optional column too, even with --lenient.
    let e = load_nodes("n.csv", "sn,cpu_milli,memory_mib,gpu,Model,MODEL,model\na,1,1,1,P100,T4,A10\n", true).unwrap_err();
    assert_eq!(e.to_string(), "n.csv:1: column 'model' appears 3 times (fields 5, 6 and 7): keep one");
    let (c, _) = load_nodes("nodes.csv", NODES, false).unwrap();
    let e = load_pods("p.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli,QOS,qos\np0,1,1,1,500,LS,BE\n", &c, false).unwrap_err();
    assert_eq!(e.to_string(), "p.csv:1: column 'qos' appears twice (fields 6 and 7): keep one");
    // A column the loader does not read may repeat.
    assert_eq!(load_nodes("n.csv", "sn,cpu_milli,memory_mib,gpu,model,note,note\na,1,1,1,P100,x,y\n", false).unwrap().0.gpu_count(), 1);
    // The usage files too.
    let e = usage::parse_metric("d.csv", "pod,timestamp,value,Value\na,0,10,20\n", false).unwrap_err();
    assert_eq!(e.to_string(), "d.csv:1: column 'value' appears twice (fields 3 and 4): keep one");
    let e = usage::parse_metric("d.csv", "pod,timestamp,value,pod\na,0,10,b\n", false).unwrap_err();
    assert_eq!(e.to_string(), "d.csv:1: column 'pod' appears twice (fields 1 and 4): keep one");
}

#[test]
fn a_bad_number_is_told_apart_from_one_too_large() {
    let err = |v: &str| pod_err(&format!("p1,{v},100,1,500,"));
    for (v, why) in [
        ("99999999999999999999999", "'99999999999999999999999' is too large: at most 18446744073709551615; check the value and its unit"),
        ("+99999999999999999999999", "is too large: at most 18446744073709551615"),
        ("1e16", "'1e16' is too large for a number with a decimal point or an exponent (at most 1e15); check the value and its unit, and write it in digits alone (at most 18446744073709551615)"),
        ("1e999", "is too large for a number with a decimal point"),
        ("-5", "'-5' is negative: write a whole number of at least 0"),
        ("-1e999", "is negative"),
        ("1.5", "'1.5' is not a whole number: write a whole number of at least 0"),
        ("abc", "'abc' is not a number: write a whole number of at least 0"),
        ("nan", "'nan' is not a number"),
        ("inf", "'inf' is not a number"),
        ("", "'' is empty: write a whole number of at least 0"),
    ] {
        let e = err(v);
        assert!(e.starts_with("pods.csv:3: column 'cpu_milli': ") && e.contains(why), "{v}: {e}");
    }
    // What is accepted stays so: digits up to u64, and floats that are
    // whole numbers up to 1e15.
    let (c, _) = load_nodes("n.csv", "sn,cpu_milli,memory_mib,gpu,model\nn0,18446744073709551615,1e15,1,T4\nn1,1000.0,+100,1,T4\n", false).unwrap();
    assert_eq!(c.nodes().len(), 2);
}

#[test]
fn lenient_mode_counts_what_it_skips() {
    let (c, _) = load_nodes("nodes.csv", NODES, false).unwrap();
    let text = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1,1,1,500\np1,x,1,1,500\np2,1,1\np3,1,1,0,0\n";
    let (p, s) = load_pods("pods.csv", text, &c, true).unwrap();
    assert_eq!((p.len(), s.count), (2, 2));
    assert!(s.examples[0].starts_with("pods.csv:3:"));
}

#[test]
fn usage_rows_parse_and_align() {
    let duty = "value,timestamp_anon,container_ip\n50.0,60.0,a\n100.0,120.0,a\n";
    let mem = "timestamp_anon,value,container_ip\n60.0,1073741824.0,a\n";
    let (d, _) = usage::parse_metric("d", duty, false).unwrap();
    let (m, _) = usage::parse_metric("m", mem, false).unwrap();
    let u = usage::align(&d, &m);
    assert_eq!((u.pods.len(), u.minutes), (1, 2));
    assert_eq!(u.duty[0], vec![0.5, 1.0]);
    assert!(u.mem[0][1].is_nan());
    assert!(usage::parse_metric("d", "value,timestamp_anon,container_ip\n-1,0,a\n", false).unwrap_err().to_string().starts_with("d:2:"));
}

#[test]
fn the_usage_grid_steps_by_the_trace_own_period_and_loses_no_sample() {
    // genai-2026 samples every 57 s: a 60 s grid would put two samples of
    // 72 periods in one slot. On the trace's own step each has its own.
    let (mut d, mut m) = (Vec::new(), Vec::new());
    for k in 0..100 {
        let t = 1_000.0 + 57.0 * f64::from(k);
        d.push(("a".to_string(), t, f64::from(k % 100)));
        m.push(("a".to_string(), t, 1e9 + f64::from(k)));
    }
    let u = usage::align(&d, &m);
    assert_eq!((u.minutes, u.step_s, u.dropped_samples), (100, 57.0, 0));
    for k in 0..100 {
        assert!((f64::from(u.duty[0][k]) - (k % 100) as f64 / 100.0).abs() < 1e-6, "period {k}: {}", u.duty[0][k]);
        assert_eq!(f64::from(u.mem[0][k]), f64::from((1e9 + k as f64) as f32));
    }
    // Two samples in one period (jitter): duty averaged, memory the larger.
    d.push(("a".to_string(), 1_000.0 + 57.0 * 10.0 + 5.0, 90.0));
    m.push(("a".to_string(), 1_000.0 + 57.0 * 10.0 + 5.0, 5e9));
    let u = usage::align(&d, &m);
    assert_eq!((u.minutes, u.step_s), (100, 57.0));
    assert!((u.duty[0][10] - 0.5).abs() < 1e-6 && u.mem[0][10] == 5e9, "{} {}", u.duty[0][10], u.mem[0][10]);
    assert_eq!(usage::sampling_step(&[&[("a".to_string(), 5.0, 0.0)]]), 60.0);
    // 70,000 samples of one pod in one period: still one average.
    let many: Vec<(String, f64, f64)> = (0..70_000).map(|k| ("a".to_string(), 1_000.0 + f64::from(k % 2), if k % 2 == 0 { 20.0 } else { 40.0 })).collect();
    let u = usage::align_with(&many, &[], Some(60.0), usage::MAX_CELLS);
    assert!((u.duty[0][0] - 0.3).abs() < 1e-6, "{}", u.duty[0][0]);
}

#[test]
fn the_step_comes_from_each_pod_s_own_gaps_not_from_pods_sampled_at_other_moments() {
    // 20 pods every 60 s, each at its own phase and with ±2 s of jitter:
    // pooled, their timestamps are seconds apart; per pod, 60 s.
    let mut d = Vec::new();
    let mut seed = 7u64;
    for p in 0..20u32 {
        for k in 0..50u32 {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let jitter = (seed >> 33) as f64 / (1u64 << 31) as f64 * 4.0 - 2.0;
            d.push((format!("p{p}"), 1_000.0 + f64::from(p) * 2.9 + 60.0 * f64::from(k) + jitter, 50.0));
        }
    }
    let u = usage::align(&d, &d);
    assert_eq!(u.step_s, 60.0);
    assert!((50..=52).contains(&u.minutes), "{}", u.minutes);
    // A duty file and a memory file queried from different starts: same.
    let later: Vec<_> = d.iter().map(|(p, t, v)| (p.clone(), t + 3.0, *v)).collect();
    assert_eq!(usage::align(&d, &later).step_s, 60.0);
    // The step can be given.
    assert_eq!(usage::align_with(&d, &d, Some(120.0), usage::MAX_CELLS).step_s, 120.0);
}

#[test]
fn a_grid_too_large_is_cut_and_the_samples_past_it_are_counted() {
    let d = vec![("a".to_string(), 0.0, 10.0), ("a".to_string(), 60.0, 10.0), ("a".to_string(), 6.0e10, 10.0)];
    let u = usage::align_with(&d, &[], None, 1_000);
    assert_eq!((u.step_s, u.minutes, u.dropped_samples), (60.0, 1_000, 1));
    assert_eq!(u.duty[0][1], 0.1);
    assert_eq!((u.first_s, u.last_s), (0.0, 6.0e10));
}

#[test]
fn values_no_gpu_could_have_are_refused_with_their_line() {
    let e = usage::parse_metric("m", "value,timestamp,pod\n1e9,0,a\n1e40,60,a\n", false).unwrap_err();
    assert!(e.to_string().starts_with("m:3: value 1e40 is not a number from 0 to 1e18"), "{e}");
    assert_eq!(usage::parse_metric("m", "value,timestamp,pod\n1e9,0,a\n1e40,60,a\n", true).unwrap().1, 1);
    // What is not a number is quoted, as the JSON reader quotes it.
    let e = usage::parse_metric("m", "value,timestamp,pod\nten,0,a\n", false).unwrap_err();
    assert!(e.to_string().starts_with("m:2: value 'ten' is not a number"), "{e}");
    let e = usage::parse_metric("m", "value,timestamp,pod\n1,noon,a\n", false).unwrap_err();
    assert!(e.to_string().starts_with("m:2: timestamp 'noon' is not a number"), "{e}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Any samples within a grid's bound align without a panic, and every
    /// (pod, period) that has a sample has a cell: nothing is dropped.
    #[test]
    fn align_keeps_every_sampled_period(rows in prop::collection::vec(("[ab]", 0.0f64..1e7, 0.0f64..150.0), 0..40)) {
        let rows: Vec<(String, f64, f64)> = rows;
        let u = usage::align(&rows, &rows);
        prop_assert!(u.pods.len() * u.minutes <= usage::MAX_CELLS);
        // 1e7 s at a step of at least 1 s fits in 25M periods a pod.
        prop_assert_eq!(u.dropped_samples, 0);
        let t0 = rows.iter().map(|r| r.1).fold(f64::INFINITY, f64::min);
        let mut sampled: Vec<(String, i64)> = rows.iter().map(|r| (r.0.clone(), ((r.1 - t0) / u.step_s).round() as i64)).collect();
        sampled.sort();
        sampled.dedup();
        let cells = |g: &Vec<Vec<f32>>| g.iter().flatten().filter(|x| !x.is_nan()).count();
        prop_assert_eq!((cells(&u.duty), cells(&u.mem)), (sampled.len(), sampled.len()), "step {}", u.step_s);
        prop_assert!(u.duty.iter().flatten().all(|x| x.is_nan() || (0.0..=1.0).contains(x)));
    }

    #[test]
    fn loaders_never_panic(text in "\\PC{0,400}", lenient: bool) {
        let _ = load_nodes("n", &text, lenient);
        let (c, _) = load_nodes("nodes.csv", NODES, false).unwrap();
        let _ = load_pods("p", &text, &c, lenient);
        let _ = usage::parse_metric("u", &text, lenient);
        let _ = usage::parse_usage_file("u", &text, lenient);
        let _ = usage::parse_usage_file("u", &format!("{{{text}"), lenient);
        let _ = usage::parse_usage_file("u", &format!("[{text}"), lenient);
    }

    /// Prometheus range-query JSON with arbitrary labels and sample values:
    /// never a panic; what loads is finite and non-negative; an error names
    /// the file, and one about a sample names its series and sample.
    #[test]
    fn prometheus_json_never_panics_and_keeps_only_good_samples(
        series in prop::collection::vec((
            prop::collection::btree_map("(pod|namespace|gpu|UUID|exported_pod|__name__|x)", "[a-z0-9]{0,3}", 0..4),
            prop::collection::vec((-1e3f64..1e10, "(-?[0-9]{1,4}(\\.[0-9])?|NaN|\\+Inf|x|)"), 0..6),
        ), 0..5),
        status in "(success|error)",
        kind in "(matrix|vector)",
        lenient: bool,
    ) {
        let list: Vec<String> = series.iter().map(|(labels, values)| {
            let labels: Vec<String> = labels.iter().map(|(k, v)| format!("\"{k}\":\"{v}\"")).collect();
            let values: Vec<String> = values.iter().map(|(t, v)| format!("[{t},\"{v}\"]")).collect();
            format!("{{\"metric\":{{{}}},\"values\":[{}]}}", labels.join(","), values.join(","))
        }).collect();
        let text = format!("{{\"status\":\"{status}\",\"data\":{{\"resultType\":\"{kind}\",\"result\":[{}]}}}}", list.join(","));
        match usage::parse_usage_file("p.json", &text, lenient) {
            Ok(m) => {
                prop_assert!(status == "success" && kind == "matrix");
                prop_assert!(m.samples.iter().all(|s| s.1.is_finite() && s.2.is_finite() && s.2 >= 0.0));
                let total: usize = series.iter().map(|s| s.1.len()).sum();
                prop_assert!(m.samples.len() + m.skipped <= total);
            }
            Err(e) => {
                let msg = e.to_string();
                prop_assert!(msg.starts_with("p.json:"), "{}", msg);
                if status == "success" && kind == "matrix" {
                    prop_assert!(!lenient && msg.contains("series ") && msg.contains("sample "), "{}", msg);
                }
            }
        }
    }

    #[test]
    fn structured_rows_never_panic_and_errors_have_lines(
        rows in prop::collection::vec((
            "[a-z0-9]{0,4}", "-?[0-9]{0,7}(\\.[05])?", "[0-9x]{0,6}", "-?[0-9]{0,2}", "-?[0-9]{0,5}", "(|nan|P100|G2|V100|P100\\|G2)", "(LS|BE|x|)"
        ), 0..20),
        lenient: bool,
    ) {
        let mut text = String::from("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos\n");
        for r in &rows {
            text.push_str(&format!("{},{},{},{},{},{},{}\n", r.0, r.1, r.2, r.3, r.4, r.5, r.6));
        }
        let (c, _) = load_nodes("nodes.csv", NODES, false).unwrap();
        match load_pods("pods.csv", &text, &c, lenient) {
            Ok((pods, skipped)) => {
                prop_assert_eq!(pods.len() + skipped.count, rows.len());
                for p in &pods {
                    prop_assert!(p.pod.gpu_milli() <= 1000);
                    prop_assert!(c.nodes().iter().any(|n| n.fits(&p.pod)), "loaded a pod no empty node fits");
                }
            }
            Err(e) => {
                prop_assert!(!lenient);
                prop_assert!(e.line >= 2 && e.line <= rows.len() as u64 + 1, "line {} out of range", e.line);
            }
        }
    }

    /// Whatever the line ends (`\n` or `\r\n`) and however many blank
    /// lines sit between rows, an error names the bad row's own line, in
    /// the pod list and in a usage CSV alike.
    #[test]
    fn errors_name_the_bad_row_s_own_line(
        rows in prop::collection::vec((any::<bool>(), 0usize..3), 1..12),
        bad in any::<prop::sample::Index>(),
    ) {
        let bad = bad.index(rows.len());
        let (mut pods, mut duty) = (String::new(), String::new());
        let mut want = 0;
        let mut line = 1;
        for (k, &(crlf, blanks)) in rows.iter().enumerate() {
            let end = if crlf { "\r\n" } else { "\n" };
            if k == 0 {
                pods.push_str(&format!("name,cpu_milli,memory_mib,num_gpu,gpu_milli{end}"));
                duty.push_str(&format!("pod,timestamp,value{end}"));
            }
            for _ in 0..blanks {
                pods.push_str(end);
                duty.push_str(end);
                line += 1;
            }
            line += 1;
            if k == bad {
                want = line;
                pods.push_str(&format!("p{k},y,1,1,500{end}"));
                duty.push_str(&format!("a,{k},y{end}"));
            } else {
                pods.push_str(&format!("p{k},1,1,1,500{end}"));
                duty.push_str(&format!("a,{k},1{end}"));
            }
        }
        let (c, _) = load_nodes("nodes.csv", NODES, false).unwrap();
        let e = load_pods("pods.csv", &pods, &c, false).unwrap_err();
        prop_assert_eq!(e.line, want, "{}", e);
        let e = usage::parse_metric("duty.csv", &duty, false).unwrap_err();
        prop_assert_eq!(e.line, want, "{}", e);
    }
}

#[test]
fn usage_csv_files_concatenated_with_their_headers_load() {
    let text = "Pod,Timestamp,Value\na,0,10\nb,0,20\n\u{feff}pod,timestamp,value\na,60,30\n   \n";
    let (rows, skipped) = usage::parse_metric("cat.csv", text, false).unwrap();
    assert_eq!((rows.len(), skipped), (3, 0), "the repeated header (with its byte-order mark) is no row, header names are not case-sensitive, a line of spaces is blank");
    let e = usage::parse_metric("cr.csv", "pod,timestamp,value\ra,0,10\rc,60,y\r", false).unwrap_err();
    assert!(e.to_string().starts_with("cr.csv:3:"), "a \\r alone ends a line: {e}");
    let (c, _) = load_nodes("nodes.csv", NODES, false).unwrap();
    let (p, _) = load_pods("p.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n  \np0,1,1,1,500\n \t \n", &c, false).unwrap();
    assert_eq!(p.len(), 1);
    let e = usage::parse_metric("x.csv", "pod,timestamp,value\na,0,10,5\n", false).unwrap_err();
    assert!(e.to_string().starts_with("x.csv:2: 4 fields but the header has 3"), "{e}");
    assert_eq!(usage::parse_metric("x.csv", "pod,timestamp,value\n\"a,b\",0,10\n", false).unwrap().0[0].0, "a,b", "a quoted comma is fine");
    let e = usage::parse_metric("x.csv", "pod,container_ip,timestamp,value\na,b,0,10\n", false).unwrap_err();
    assert!(e.to_string().contains("both a 'container_ip' and a 'pod' column"), "{e}");
    let e = usage::parse_metric("empty.csv", " \n", false).unwrap_err();
    assert!(e.to_string().starts_with("empty.csv:1: the file is empty"), "{e}");
    let e = load_nodes("empty.csv", "", false).unwrap_err();
    assert!(e.to_string().starts_with("empty.csv:1: the file is empty"), "{e}");
}

#[test]
fn a_stray_timestamp_cannot_stretch_the_grid_past_its_period_bound() {
    let duty = vec![("a".to_string(), 0.0, 10.0), ("a".to_string(), 60.0, 10.0), ("a".to_string(), 1e15, 10.0)];
    let mem = vec![("a".to_string(), 0.0, 1e9), ("a".to_string(), 60.0, 1e9)];
    let u = usage::align(&duty, &mem);
    assert_eq!((u.minutes, u.dropped_samples), (usage::MAX_PERIODS, 1));
}
