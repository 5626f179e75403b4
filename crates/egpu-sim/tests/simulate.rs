//! End-to-end simulation on a subsample of the embedded openb trace, small
//! enough for the dev profile.

use egpu_place::PolicyKind;
use egpu_sim::sweep::{self, Sweep, Trace};
use egpu_sim::{data, elastic, report, trace, workload};

fn small_trace() -> Trace {
    let (cluster, _) = trace::load_nodes("nodes", data::OPENB_NODES, false).unwrap();
    // Every 8th node and every 8th pod keep the trace's mix at 1/8 scale.
    let mut small = egpu_place::Cluster::new();
    for (i, n) in cluster.nodes().iter().enumerate().filter(|(i, _)| i % 8 == 0) {
        let t = n.gpu_type().map(|t| &cluster.gpu_types()[usize::from(t.0)]);
        let gpu_type = t.map(|t| small.gpu_type_or_insert(&t.name, t.memory_mib).unwrap());
        small.add_node(egpu_place::NodeSpec { name: format!("{}-{i}", n.name()), cpu_milli: n.cpu_capacity(), memory_mib: n.mem_capacity_mib(), gpu_type, nvlink_groups: vec![0; n.gpus().len()], max_pods: 1001 }).unwrap();
    }
    let (pods, _) = trace::load_pods("pods", data::OPENB_DEFAULT_PODS, &small, true).unwrap();
    let pods = pods.into_iter().step_by(8).collect();
    Trace::new("default/8".into(), small, pods, 0.95)
}

#[test]
fn inflation_reaches_the_target_and_seeds_reproduce() {
    let t = small_trace();
    let cap = t.cluster.gpu_capacity_milli();
    let a = workload::arrivals(&t.pods, cap, 1.3, 7);
    assert_eq!(a, workload::arrivals(&t.pods, cap, 1.3, 7));
    assert_ne!(a, workload::arrivals(&t.pods, cap, 1.3, 8));
    let total: u64 = a.iter().map(|&i| t.pods[i].pod.total_gpu_milli()).sum();
    assert!(total as f64 <= 1.3 * cap as f64 && total as f64 > 1.3 * cap as f64 - 8000.0, "total {total} vs capacity {cap}");
}

#[test]
fn sweep_produces_curves_and_fgd_beats_random() {
    let t = small_trace();
    let runs = sweep::run(&Sweep { trace: &t, policies: &[PolicyKind::Random, PolicyKind::Fgd, PolicyKind::Egpu], seeds: &[1], inflation: 1.3, threads: 2, shuffle_nodes: false, best_fit_inside: false }, &|_| {});
    assert_eq!(runs.len(), 3);
    for r in &runs {
        assert_eq!(r.invalid, 0);
        assert_eq!(r.placed + r.failed, r.pods);
        let a: Vec<f64> = r.alloc_pct.iter().flatten().copied().collect();
        assert!(a.len() > 120, "curve has gaps");
        assert!(a.windows(2).all(|w| w[1] + 1e-9 >= w[0] - 1.0), "allocation should not drop");
        assert!(a.iter().all(|&x| (0.0..=100.0).contains(&x)));
    }
    let un = |p: &str| runs.iter().find(|r| r.policy == p).and_then(|r| r.unallocated_at(100)).unwrap();
    assert!(un("fgd") < un("random"), "fgd {} vs random {}", un("fgd"), un("random"));
    let dir = std::env::temp_dir().join(format!("egpu-sim-test-{}", std::process::id()));
    let s = report::write_all(&dir, "default/8", "test", 1.3, 0.0, report::LeftOut::default(), &runs).unwrap();
    assert_eq!(s.len(), 3);
    for f in ["summary.md", "results.json", "curves.csv", "allocation.svg"] {
        assert!(std::fs::metadata(dir.join(f)).unwrap().len() > 100, "{f} is empty");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn elastic_strategies_are_ordered_and_count_violations() {
    // Two pods on a 10-minute grid: one steady, one that bursts late.
    let mut rows_d = Vec::new();
    let mut rows_m = Vec::new();
    for t in 0..10 {
        rows_d.push(("a".to_string(), 60.0 * t as f64, 10.0));
        rows_d.push(("b".to_string(), 60.0 * t as f64, if t < 8 { 10.0 } else { 90.0 }));
        rows_m.push(("a".to_string(), 60.0 * t as f64, 10.0 * (1u64 << 30) as f64));
        rows_m.push(("b".to_string(), 60.0 * t as f64, if t < 8 { 5.0 } else { 30.0 } * (1u64 << 30) as f64));
    }
    let u = elastic::load::align(&rows_d, &rows_m);
    let e = elastic::evaluate(&u, elastic::ElasticConfig { gpu_mem_gib: 80.0, resize_every: 5, window: 5, headroom: 0.1, compute_floor: 0.0, mem_floor_gib: 0.0, ..Default::default() });
    let g: Vec<usize> = e.outcomes.iter().map(|o| o.gpus).collect();
    assert_eq!(g[0], 2, "exclusive: one GPU per pod");
    assert_eq!(g[1], 1, "static peak: 10%+90% compute and 10+30 GiB fit one GPU");
    assert_eq!(e.lower_bound, 1, "at most 100% compute and 40 GiB at any minute");
    // b's memory jumps from 5 to 30 GiB between resizes: refused memory at minutes 8 and 9.
    let el = &e.outcomes[2];
    assert!(el.violation_minutes >= 2 && el.refused_mem_gib_minutes > 40.0, "{el:?}");
    let by = |n: &str| e.outcomes.iter().find(|o| o.strategy == n).unwrap_or_else(|| panic!("no {n}"));
    assert_eq!(by("elastic-no-migration").migrations, 0);
    // The oracle sizes memory to the coming period's peak: nothing refused.
    assert_eq!(by("oracle-next-period").refused_mem_gib_minutes, 0.0);
}

#[test]
fn repacking_frees_gpus_that_eviction_keeps() {
    // a (50 GiB) and b (50 GiB) arrive first and take one GPU each; c
    // (20 GiB) joins a. At minute 5 a shrinks to 10 GiB; the resize at
    // minute 10 (which sees minute 9) re-packs everything onto one GPU,
    // sticky placement keeps two.
    let g = (1u64 << 30) as f64;
    let (mut d, mut m) = (Vec::new(), Vec::new());
    for t in 0..12 {
        for (p, gib) in [("a", if t < 5 { 50.0 } else { 10.0 }), ("b", 50.0), ("c", 20.0)] {
            d.push((p.to_string(), 60.0 * t as f64, 1.0));
            m.push((p.to_string(), 60.0 * t as f64, gib * g));
        }
    }
    let u = elastic::load::align(&d, &m);
    let cfg = |moves| elastic::ElasticConfig { gpu_mem_gib: 80.0, resize_every: 5, window: 1, moves, ..Default::default() };
    let last = |e: &elastic::Evaluation| e.outcomes.iter().find(|o| o.strategy == "elastic").map(|o| (*o.in_use.last().unwrap_or(&0), o.migrations)).unwrap_or_default();
    let (evict, moved) = last(&elastic::evaluate(&u, cfg(elastic::Moves::Evict)));
    let (repack, migrations) = last(&elastic::evaluate(&u, cfg(elastic::Moves::Repack)));
    assert_eq!((evict, moved), (2, 0));
    assert_eq!(repack, 1);
    assert!(migrations >= 1, "a move is a migration");
}

/// Per-minute rows for pods given as (name, duty %, GiB) per minute.
fn usage(rows: &[(&str, Vec<(f64, f64)>)]) -> elastic::Usage {
    let g = (1u64 << 30) as f64;
    let (mut d, mut m) = (Vec::new(), Vec::new());
    for (p, series) in rows {
        for (t, &(duty, gib)) in series.iter().enumerate() {
            d.push((p.to_string(), 60.0 * t as f64, duty));
            m.push((p.to_string(), 60.0 * t as f64, gib * g));
        }
    }
    elastic::load::align(&d, &m)
}

#[test]
fn online_slices_do_not_see_the_minute_they_serve() {
    // Memory steps from 10 to 30 GiB at minute 6 and stays: an online slice
    // for minute 6 (resized every minute from the last 5 minutes, no
    // headroom) cannot know it, so minute 6 is refused 20 GiB; from minute
    // 7 on the slice has caught up.
    let series: Vec<(f64, f64)> = (0..10).map(|t| (10.0, if t < 6 { 10.0 } else { 30.0 })).collect();
    let u = usage(&[("a", series)]);
    let e = elastic::evaluate(&u, elastic::ElasticConfig { gpu_mem_gib: 80.0, resize_every: 1, window: 5, ..Default::default() });
    let el = e.outcomes.iter().find(|o| o.strategy == "elastic").unwrap();
    assert_eq!((el.violation_minutes, el.mem_violation_minutes), (1, 1), "{el:?}");
    assert!((el.refused_mem_gib_minutes - 20.0).abs() < 1e-6, "{el:?}");
    let oracle = e.outcomes.iter().find(|o| o.strategy == "oracle-next-period").unwrap();
    assert_eq!(oracle.violation_minutes, 0);
}

#[test]
fn gpu_risk_packs_anti_correlated_pods_together() {
    // a and b alternate 90% / 10% duty out of phase: each pod's 0.8
    // quantile is 90%, so shares alone need two GPUs, but their sum is
    // 100% every minute, so the summed-trace check puts both on one GPU,
    // and nothing is short-changed (demand never exceeds the GPU).
    let alt = |phase: usize| -> Vec<(f64, f64)> { (0..30).map(|t| (if (t + phase).is_multiple_of(2) { 90.0 } else { 10.0 }, 1.0)).collect() };
    let u = usage(&[("a", alt(0)), ("b", alt(1))]);
    let base = elastic::ElasticConfig { gpu_mem_gib: 80.0, resize_every: 1, window: 5, ..Default::default() };
    let peak_after = |e: &elastic::Evaluation| {
        let o = e.outcomes.iter().find(|o| o.strategy == "elastic").unwrap();
        (o.in_use[10..].iter().copied().max().unwrap_or(0), o.violation_minutes)
    };
    assert_eq!(peak_after(&elastic::evaluate(&u, base)).0, 2);
    let risk = elastic::ElasticConfig { gpu_risk: Some(elastic::GpuRisk { window: 5, quantile: 1.0 }), ..base };
    assert_eq!(peak_after(&elastic::evaluate(&u, risk)), (1, 0));
}

/// A policy that puts every pod on one free-enough GPU of the first node
/// that fits it, whatever the pod's GPU count: it over-allocates nothing.
struct OneGpu;

impl egpu_place::Policy for OneGpu {
    fn name(&self) -> &str {
        "one-gpu"
    }
    fn place(&mut self, cluster: &egpu_place::Cluster, pod: &egpu_place::Pod) -> Option<egpu_place::Placement> {
        let node = cluster.nodes().iter().position(|n| n.fits(pod))?;
        let n = &cluster.nodes()[node];
        let gpus: Vec<u8> = if pod.gpu_count() == 0 { Vec::new() } else { vec![(0..n.gpus().len()).find(|&g| n.gpu_fits(g, pod))? as u8] };
        Some(egpu_place::Placement::new(node, pod, &gpus))
    }
}

#[test]
fn a_placement_that_is_not_the_pod_s_counts_as_invalid() {
    let (c, _) = trace::load_nodes("n.csv", "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,100000,8,G2\nn1,64000,100000,8,G2\n", false).unwrap();
    let (pods, _) = trace::load_pods("p.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1000,100,1,500\nb,1000,100,4,1000\nc,1000,100,0,0\n", &c, false).unwrap();
    let pods: Vec<egpu_place::Pod> = pods.into_iter().map(|p| p.pod).collect();
    let target = egpu_place::TargetWorkload::from_pods(&pods, 0.95);
    let r = egpu_sim::sim::run(&c, &pods, &[0, 1, 2], &mut OneGpu, &target, 1);
    // The 4-GPU pod on one GPU fits the node but is not what it asked for.
    assert_eq!((r.placed, r.invalid, r.failed), (2, 1, 0), "{r:?}");
}

#[test]
fn a_trace_above_the_target_loses_random_pods_until_it_fits() {
    // 40 pods of one GPU each on 16 GPUs: 2.5× capacity, target 1.3× = 20.8.
    let (c, _) = trace::load_nodes("n.csv", "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,100000,8,G2\nn1,64000,100000,8,G2\n", false).unwrap();
    let rows: String = (0..40).map(|i| format!("p{i:02},1000,100,1,1000\n")).collect();
    let (pods, _) = trace::load_pods("p.csv", &format!("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n{rows}"), &c, false).unwrap();
    let a = workload::arrivals(&pods, c.gpu_capacity_milli(), 1.3, 7);
    assert_eq!(a.len(), 20, "{a:?}");
    let mut distinct = a.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), 20, "dropping never repeats a pod");
    assert_ne!(a, workload::arrivals(&pods, c.gpu_capacity_milli(), 1.3, 8), "another seed drops others");
}

#[test]
fn an_inflation_whose_arrivals_never_reach_capacity_is_refused() {
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: egpu_sim::cli::SimulateArgs,
    }
    let out = std::env::temp_dir().join(format!("egpu-inflation-{}", std::process::id()));
    let cli = <Cli as clap::Parser>::try_parse_from(["simulate", "--inflation", "0.9", "--no-progress", "--out", out.to_str().unwrap()]).expect("parses");
    let e = egpu_sim::cli::run(cli.args).expect_err("refused").to_string();
    assert!(e.contains("--inflation must be between 1 and 10") && e.contains("100% of capacity"), "{e}");
    assert!(!out.exists(), "nothing written");
}

#[test]
fn a_run_that_never_reaches_full_arrival_is_not_averaged_as_nan() {
    // 3-GPU pods on 16 GPUs at inflation 1.0 stop at 15 of 16 GPUs
    // (94%): there is no 100% bin to read.
    let (c, _) = trace::load_nodes("n.csv", "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,100000,8,G2\nn1,64000,100000,8,G2\n", false).unwrap();
    let (pods, _) = trace::load_pods("p.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1000,100,3,1000\nb,1000,100,3,1000\n", &c, false).unwrap();
    let arrivals = workload::arrivals(&pods, c.gpu_capacity_milli(), 1.0, 3);
    let plain: Vec<egpu_place::Pod> = pods.iter().map(|p| p.pod.clone()).collect();
    let target = egpu_place::TargetWorkload::from_pods(&plain, 0.95);
    let mut fgd = egpu_place::PolicyKind::Fgd.build(&target, 3);
    let r = egpu_sim::sim::run(&c, &plain, &arrivals, fgd.as_mut(), &target, 3);
    assert_eq!(r.unallocated_at(100), None, "{:?}", r.alloc_pct.iter().rposition(Option::is_some));
    let s = report::summarize(&[r]);
    assert_eq!((s[0].seeds, s[0].runs), (0, 1));
    let table = report::summary_table("tiny", &s);
    assert!(table.contains("| fgd | 0 of 1 | n/a: no run has an event at 100% arrival (") && !table.contains("NaN"), "{table}");
}

#[test]
fn on_a_type_constrained_workload_egpu_honours_the_types_and_keeps_its_lead() {
    // A third of the GPU pods confined to one or two GPU types: eGPU
    // measures fragmentation against the type-agnostic target (FGD keeps
    // the typed one, as published), and every placement must still be the
    // pod's, allowed type included (the simulator counts any other as
    // invalid).
    let base = small_trace();
    let mut pods = base.pods.clone();
    let constrained = egpu_sim::gpuspec::constrain(&base.cluster, &mut pods, 0.33, 1);
    assert!(constrained > 50, "{constrained}");
    let t = Trace::new("default/8+spec".into(), base.cluster.clone(), pods, 0.95);
    let runs = sweep::run(&Sweep { trace: &t, policies: &[PolicyKind::Fgd, PolicyKind::Egpu], seeds: &[1, 2], inflation: 1.3, threads: 2, shuffle_nodes: true, best_fit_inside: false }, &|_| {});
    assert!(runs.iter().all(|r| r.invalid == 0), "{runs:?}");
    let mean = |p: &str| runs.iter().filter(|r| r.policy == p).filter_map(|r| r.unallocated_at(100)).sum::<f64>() / 2.0;
    // Measured: eGPU 6.15, FGD 7.44 (% unallocated at 100% arrival, this
    // 1/8-scale trace, two seeds); with the typed target eGPU was 6.59,
    // which this bound refuses. Deterministic: fixed seeds and code.
    assert!(mean("egpu") + 1.0 < mean("fgd"), "egpu {} vs fgd {}", mean("egpu"), mean("fgd"));
}

#[test]
fn best_fit_inside_the_node_keeps_every_placement_valid_and_says_so() {
    // The live cluster's GPU choice (the device plugin's best fit) on the
    // policy's node: every placement still the pod's, and the runs named
    // for it so a report cannot pass it off as the policy's own.
    let t = small_trace();
    let s = |best_fit_inside| sweep::run(&Sweep { trace: &t, policies: &[PolicyKind::Egpu], seeds: &[1], inflation: 1.3, threads: 1, shuffle_nodes: true, best_fit_inside }, &|_| {});
    let (own, live) = (s(false), s(true));
    assert_eq!((own[0].invalid, live[0].invalid), (0, 0));
    assert_eq!((own[0].policy.as_str(), live[0].policy.as_str()), ("egpu", "egpu/bestfit-gpu"));
    assert_eq!(own[0].pods, live[0].pods, "the same arrivals");
    // The GPU choice matters on this trace: the curves differ.
    assert_ne!(own[0].alloc_pct, live[0].alloc_pct);
}

/// Names in `dir`, sorted.
fn names(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

#[test]
fn a_report_that_fails_part_way_leaves_the_earlier_one_whole() {
    let t = small_trace();
    let runs = sweep::run(&Sweep { trace: &t, policies: &[PolicyKind::Fgd], seeds: &[1], inflation: 1.3, threads: 1, shuffle_nodes: false, best_fit_inside: false }, &|_| {});
    let dir = std::env::temp_dir().join(format!("egpu-sim-partial-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("curves.csv")).unwrap();
    for f in ["summary.md", "results.json", "allocation.svg"] {
        std::fs::write(dir.join(f), "earlier run").unwrap();
    }
    // curves.csv cannot be written (a directory holds its name): none of
    // the new files is, so no new summary sits beside the earlier results.
    let e = report::write_all(&dir, "default/8", "test", 1.3, 0.0, report::LeftOut::default(), &runs).unwrap_err();
    assert!(e.to_string().contains("curves.csv"), "{e}");
    for f in ["summary.md", "results.json", "allocation.svg"] {
        assert_eq!(std::fs::read_to_string(dir.join(f)).unwrap(), "earlier run", "{f}");
    }
    assert_eq!(names(&dir), ["allocation.svg", "curves.csv", "results.json", "summary.md"], "no file of the failed run is left");
    std::fs::remove_dir(dir.join("curves.csv")).unwrap();
    report::write_all(&dir, "default/8", "test", 1.3, 0.0, report::LeftOut::default(), &runs).unwrap();
    assert_eq!(names(&dir), ["allocation.svg", "curves.csv", "results.json", "summary.md"]);
    assert!(std::fs::read_to_string(dir.join("summary.md")).unwrap().contains("| fgd |"));
    assert!(std::fs::read_to_string(dir.join("allocation.svg")).unwrap().starts_with("<svg"));

    // The elastic report likewise.
    let series: Vec<(f64, f64)> = (0..10).map(|_| (10.0, 10.0)).collect();
    let e = elastic::evaluate(&usage(&[("a", series)]), elastic::ElasticConfig { gpu_mem_gib: 80.0, resize_every: 1, window: 5, ..Default::default() });
    for f in ["elastic.md", "elastic.json"] {
        std::fs::write(dir.join(f), "earlier run").unwrap();
    }
    std::fs::create_dir(dir.join(elastic::chart_file(80.0))).unwrap();
    let err = elastic::write_report(&dir, "test", std::slice::from_ref(&e)).unwrap_err();
    assert!(err.to_string().contains(&elastic::chart_file(80.0)), "{err}");
    for f in ["elastic.md", "elastic.json"] {
        assert_eq!(std::fs::read_to_string(dir.join(f)).unwrap(), "earlier run", "{f}");
    }
    assert!(names(&dir).iter().all(|n| !n.starts_with('.')), "{:?}", names(&dir));
    std::fs::remove_dir(dir.join(elastic::chart_file(80.0))).unwrap();
    elastic::write_report(&dir, "test", &[e]).unwrap();
    assert!(std::fs::read_to_string(dir.join("elastic.md")).unwrap().starts_with("# Elastic sharing on test"));
    assert!(names(&dir).iter().all(|n| !n.starts_with('.')), "{:?}", names(&dir));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A pod with no sample for longer than `--max-gap` periods is gone over the
/// gap and a new pod after it; a shorter gap repeats its last sample. Two
/// pods of 50 GiB that never run at the same time then fit one 80 GiB GPU
/// at the bound, where filling the absence made them overlap.
#[test]
fn a_long_absence_is_not_filled_with_the_last_sample() {
    let g = (1u64 << 30) as f64;
    let (mut d, mut m) = (Vec::new(), Vec::new());
    let mut put = |p: &str, t: usize, gib: f64| {
        d.push((p.to_string(), 60.0 * t as f64, 10.0));
        m.push((p.to_string(), 60.0 * t as f64, gib * g));
    };
    // a: minutes 0-9, absent 10-89, back at 90-99. b: minutes 20-79.
    // c: minutes 0-99 with a 5-minute gap (a short one: filled).
    for t in (0..10).chain(90..100) {
        put("a", t, 50.0);
    }
    for t in 20..80 {
        put("b", t, 50.0);
    }
    for t in (0..40).chain(45..100) {
        put("c", t, 1.0);
    }
    let base = elastic::load::align(&d, &m);
    let lb = |u: &elastic::Usage| elastic::evaluate(u, elastic::ElasticConfig { gpu_mem_gib: 80.0, resize_every: 1, window: 5, ..Default::default() }).lower_bound;
    assert_eq!(lb(&base), 2, "filled: a's 50 GiB held through b's life");
    let mut split = base.clone();
    assert_eq!(split.split_absences(60), 1, "a's 80-minute absence; c's 5-minute gap is not one");
    assert_eq!(split.pods, ["a", "b", "c", "a~2"]);
    assert!(split.duty[0][90].is_nan() && !split.duty[3][90].is_nan() && split.duty[3][5].is_nan());
    assert_eq!(lb(&split), 1, "a is gone while b runs");
    let mut kept = base.clone();
    assert_eq!(kept.split_absences(0), 0, "0: every gap filled");
    assert_eq!(kept.pods.len(), 3);
    assert_eq!(lb(&kept), 2);
}
