//! The elastic-sharing evaluation: how many GPUs would elastic slices save
//! on a real usage trace (genai-2026: per-pod GPU duty cycle and memory,
//! each minute)?
//!
//! [`load`] reads the trace, [`eval`] compares exclusive GPUs, static
//! peak-sized slices and eGPU's elastic slices against the lower bound, and
//! [`write_report`] writes the table, JSON and a chart.

pub mod eval;
pub mod fleet;
pub mod load;

pub use eval::{ElasticConfig, Evaluation, GpuRisk, Moves, Outcome, evaluate, evaluate_with};
pub use fleet::{FleetConfig, FleetRun, FleetSearch, Share, run_fleet, run_fleet_foresight, run_fleet_hindsight, search_fleet};
pub use load::{LeftOut, Usage, UsageError};

use crate::report::{ReportError, Staged, line_chart, named};
use std::fmt::Write as _;
use std::path::Path;

/// The results table as Markdown.
pub fn table(evals: &[Evaluation]) -> String {
    let mut s = String::from("| GPU | strategy | GPUs | utilisation | violation pod-min | % of pod-min | of which memory | refused mem (GiB·min, max GiB) | migrations | saving vs exclusive |\n|---|---|---|---|---|---|---|---|---|---|\n");
    for e in evals {
        for o in &e.outcomes {
            let pct = 100.0 * o.violation_minutes as f64 / o.pod_minutes.max(1) as f64;
            let _ = writeln!(s, "| {} GiB | {} | {} | {:.1}% | {} | {:.3}% | {} | {:.1}, {:.2} | {} | {:.2}× |", e.config.gpu_mem_gib, o.strategy, o.gpus, 100.0 * o.utilization, o.violation_minutes, pct, o.mem_violation_minutes, o.refused_mem_gib_minutes, o.max_refused_gib, o.migrations, o.saving_vs_exclusive);
        }
        let lb = e.lower_bound as f64;
        let el = e.outcomes.iter().find(|o| o.strategy == "elastic").map_or(0, |o| o.gpus) as f64;
        let _ = writeln!(s, "| {} GiB | lower bound | {} ({:.2}) | | | | | | | {:.2}× |", e.config.gpu_mem_gib, e.lower_bound, e.lower_bound_exact, e.outcomes[0].gpus as f64 / lb.max(1.0));
        let _ = writeln!(s, "| {} GiB | elastic ÷ lower bound | {:.3} | | | | | | | |", e.config.gpu_mem_gib, el / lb.max(1.0));
        if let Some(f) = &e.fleet {
            let _ = writeln!(s, "| {} GiB | elastic-fleet ÷ lower bound | {:.3} | | | | | | | |", e.config.gpu_mem_gib, f.gpus as f64 / lb.max(1.0));
        }
    }
    s
}

/// How bad the violations are, as Markdown: the GPU time compute cuts
/// delayed, what a cut pod still got, and how the violation minutes spread
/// over the pods.
pub fn severity(evals: &[Evaluation]) -> String {
    let long = evals.first().map_or(60.0, |e| f64::from(eval::LONG_LIVED) * e.step_s / 60.0);
    let mut s = format!("| GPU | strategy | compute cut in its minute (% of the pods' own duty; carried work counts each minute it waits) | cut pod-minutes got (median, p10 of asked) | pods with a violation | violated minutes of a pod living ≥ {} minutes ({long:.0} min) (p90, max) |\n|---|---|---|---|---|---|\n", eval::LONG_LIVED);
    for e in evals {
        for o in &e.outcomes {
            let lost = 100.0 * o.short_gpu_minutes / o.demand_gpu_minutes.max(1e-9);
            let long_lived = match (o.pod_violation_p90, o.pod_violation_max) {
                (Some(p90), Some(max)) => format!("{:.2}%, {:.2}%", 100.0 * p90, 100.0 * max),
                _ => "n/a: no pod lived that long".to_string(),
            };
            let _ = writeln!(s, "| {} GiB | {} | {:.3}% | {:.0}%, {:.0}% | {} | {long_lived} |", e.config.gpu_mem_gib, o.strategy, lost, 100.0 * o.cut_served_p50, 100.0 * o.cut_served_p10, o.pods_violated);
        }
    }
    s
}

/// Most points a chart line gets: a long trace is drawn by its envelope.
const CHART_POINTS: usize = 2_000;

/// A per-period series as chart points (`x(period)`, value): as is up to
/// [`CHART_POINTS`] periods, else the largest value of each of
/// [`CHART_POINTS`] equal runs of periods (GPUs in use: the peaks stay
/// visible), so a chart stays small whatever the trace's length.
fn envelope(values: impl ExactSizeIterator<Item = f64>, x: impl Fn(usize) -> f64) -> Vec<(f64, f64)> {
    let per = values.len().div_ceil(CHART_POINTS).max(1);
    let mut out: Vec<(f64, f64)> = Vec::with_capacity(values.len().min(CHART_POINTS));
    for (t, v) in values.enumerate() {
        if t % per == 0 {
            out.push((x(t), v));
        } else if let Some(last) = out.last_mut() {
            last.1 = last.1.max(v);
        }
    }
    out
}

/// The chart's file name for GPUs of `gpu_mem_gib`.
pub fn chart_file(gpu_mem_gib: f64) -> String {
    format!("elastic-{gpu_mem_gib}GiB.svg")
}

/// The fleet search's chart for GPUs of `gpu_mem_gib`: violations against
/// fleet size.
pub fn fleet_chart_file(gpu_mem_gib: f64) -> String {
    format!("elastic-fleet-{gpu_mem_gib}GiB.svg")
}

/// Draw what the fleet search found: violation pod-minutes (% of all)
/// at each size tried, counted both ways, the floor under any compute
/// split, and the budget, on a log scale (from the bound, violations fall
/// by orders of magnitude; the sizes around the budget stay readable).
fn fleet_chart(path: &Path, gpu_mem_gib: f64, budget: f64, f: &fleet::FleetSearch) -> Result<(), ReportError> {
    use plotters::prelude::*;
    let err = |e: String| ReportError::Chart { path: path.display().to_string(), msg: e };
    // The axis' foot: half the smallest value above zero (a zero, at
    // minus infinity on this scale, is drawn there).
    let positive = f.tried.iter().map(|t| t.1).chain(f.first_come_tried.iter().copied()).chain(f.floors.iter().copied()).chain([budget]).filter(|&x| x > 0.0);
    let bottom = (100.0 * positive.fold(f64::INFINITY, f64::min) / 2.0).clamp(1e-4, 1.0);
    let pct = |v: &[f64]| -> Vec<(f64, f64)> { f.tried.iter().zip(v).map(|(&(n, _), &x)| (n as f64, (100.0 * x).max(bottom))).collect() };
    let violations: Vec<f64> = f.tried.iter().map(|t| t.1).collect();
    let (lo, hi) = (f.tried.first().map_or(0, |t| t.0) as f64 - 0.5, f.tried.last().map_or(1, |t| t.0) as f64 + 0.5);
    let mut series = vec![("violations (every borrower of an overflowing pool refused)".to_string(), pct(&violations))];
    if !f.first_come_tried.is_empty() {
        series.push(("violations, memory refused first come".to_string(), pct(&f.first_come_tried)));
    }
    series.push(("floor under any compute split".to_string(), pct(&f.floors)));
    series.push((format!("budget {:.2}%", 100.0 * budget), vec![(lo, (100.0 * budget).max(bottom)), (hi, (100.0 * budget).max(bottom))]));
    let top = series.iter().flat_map(|s| s.1.iter().map(|p| p.1)).fold(1.0, f64::max) * 1.5;
    let root = SVGBackend::new(path, (960, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("elastic fleet: violations by fleet size, {gpu_mem_gib} GiB GPUs"), ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(lo..hi, (bottom..top).log_scale())
        .map_err(|e| err(e.to_string()))?;
    chart.configure_mesh().max_light_lines(1).x_desc("GPUs in the fleet").y_desc("violation pod-minutes (% of all, log scale)").x_labels(f.tried.len().clamp(2, 12) + 1).x_label_formatter(&whole_label).draw().map_err(|e| err(e.to_string()))?;
    crate::report::lines(&mut chart, &series, SeriesLabelPosition::UpperRight, &err)?;
    root.present().map_err(|e| err(e.to_string()))
}

/// A fleet size's tick label: only at whole numbers of GPUs (on a search
/// of a few sizes the axis puts ticks between them, and rounded they
/// repeat the sizes beside them).
fn whole_label(x: &f64) -> String {
    if (x - x.round()).abs() < 1e-6 { format!("{x:.0}") } else { String::new() }
}

/// Write `elastic.md`, `elastic.json`, one `elastic-<size>GiB.svg` per GPU
/// size and, with the fleet, one `elastic-fleet-<size>GiB.svg`: all of
/// them, or (on an error) none, leaving an earlier report as it was.
pub fn write_report(dir: &Path, source: &str, evals: &[Evaluation]) -> Result<String, ReportError> {
    std::fs::create_dir_all(dir).map_err(|e| ReportError::Io { path: dir.display().to_string(), source: e })?;
    let mut md = format!("# Elastic sharing on {source}\n\n");
    if let Some(e) = evals.first() {
        let c = e.config;
        let _ = write!(md, "{} pods, {} sampling periods of {} s (the trace's own step; \"minutes\" below are these periods). Elastic: resize every {} min; memory from the last {} min, headroom {:.0}%, floor {:.1} GiB; compute from the last {} min, headroom {:.0}%, floor {:.2} GPU. Slices decided at minute t see samples up to t − 1. {}\n\nConfig: `{:?}`\n\n", e.pods, e.minutes, e.step_s, c.resize_every, c.window, 100.0 * c.mem_headroom.unwrap_or(c.headroom), c.mem_floor_gib, c.compute_window.unwrap_or(c.window), 100.0 * c.headroom, c.compute_floor, if c.carry_unserved { "Compute work a saturated GPU could not serve in its minute waits for the next minute (--unserved-compute carry)." } else { "Compute work a saturated GPU could not serve in its minute is dropped (--unserved-compute drop: understates the violations)." }, c);
    }
    if let Some(n) = evals.first().map(|e| e.absences).filter(|&n| n > 0) {
        let _ = write!(md, "{n} absences longer than `--max-gap` periods cut pods in two: a pod is gone over such an absence and comes back as a new pod (`<name>~2`, counted among the pods above).\n\n");
    }
    if let Some(l) = evals.first().map(|e| e.left_out).filter(|l| !l.is_empty()) {
        let _ = write!(md, "**Part of the input was left out**: {} rows or samples skipped (`--lenient`), {} pods that only one file names (skipped with `--lenient`; genai-2026's one such pod always), {} samples past the grid's size bound (`--lenient`).\n\n", l.rows_or_samples, l.pods_in_one_file, l.samples_past_grid);
    }
    md.push_str(&table(evals));
    md.push('\n');
    md.push_str(&severity(evals));
    for e in evals {
        if let Some(f) = &e.fleet {
            let tried: Vec<String> = f
                .tried
                .iter()
                .zip(&f.floors)
                .enumerate()
                .map(|(k, ((n, v), fl))| match f.first_come_tried.get(k) {
                    Some(fc) => format!("{n}: {:.3}% (first come {:.3}%; floor {:.3}%)", 100.0 * v, 100.0 * fc, 100.0 * fl),
                    None => format!("{n}: {:.3}% (floor {:.3}%)", 100.0 * v, 100.0 * fl),
                })
                .collect();
            let verdict = if f.met { format!("smallest within {:.2}%", 100.0 * e.config.fleet.map_or(0.0, |c| c.budget)) } else { "budget NOT met".to_string() };
            let memory = match e.config.fleet {
                Some(c) if c.burst && c.first_come => "memory above the base slices lent from a per-GPU burst pool; an overflowing minute refuses the borrowers that no longer fit, first come in a seeded random order",
                Some(c) if c.burst => "memory above the base slices lent from a per-GPU burst pool; an overflowing minute counts every borrower as refused",
                _ => "memory above the base slices split into fixed per-pod limits",
            };
            let first_come = match (f.first_come_tried.is_empty(), f.first_come_gpus) {
                (true, _) => String::new(),
                (false, Some(n)) => format!("; counting an overflowing pool's refusals first come instead (an estimate of the expected count, where the count above is a bound): {n} GPUs"),
                (false, None) => "; counting an overflowing pool's refusals first come instead: no size tried within budget".to_string(),
            };
            let _ = write!(md, "\nelastic-fleet, {} GiB ({memory}): {} GPUs ({verdict}; {} pod-minutes on a GPU whose base slices did not fit, {} GPU-minutes with summed duty above 100%, {} violation pod-minutes that no compute split could avoid{first_come}); fleet sizes tried (GPUs: violation pod-minutes, and the floor under any compute split, both with the count above): {}\n", e.config.gpu_mem_gib, f.gpus, f.overflow_pod_minutes, f.saturated_gpu_minutes, f.floor_pod_minutes, tried.join(", "));
        }
        // A reference placement's line: its name, how it was placed, and its search.
        let mut reference = |name: &str, placed: &str, h: &FleetSearch| {
            let tried: Vec<String> = h.tried.iter().map(|(n, v)| format!("{n}: {:.3}%", 100.0 * v)).collect();
            let verdict = if h.met { "within budget" } else { "budget NOT met" };
            let _ = write!(md, "\n{name}, {} GiB (a reference, not a policy: {placed}): {} GPUs ({verdict}; {} GPU-minutes with summed duty above 100%); sizes tried: {}\n", e.config.gpu_mem_gib, h.gpus, h.saturated_gpu_minutes, tried.join(", "));
        };
        if let Some(h) = &e.hindsight {
            reference("fleet-hindsight-static", "pods never move, placed knowing the whole trace", h);
        }
        if let (Some(h), Some(w)) = (&e.foresight, e.config.fleet.and_then(|c| c.foresight)) {
            let (name, knowing) = if let Some(c) = e.config.fleet.filter(|c| c.foresight_shuffled) { ("fleet-foresight-shuffled", format!("each pod's levels in the next {w} minutes but not their timing, planned against {} draw{} of it", c.foresight_draws, if c.foresight_draws == 1 { "" } else { "s" })) } else { ("fleet-foresight", format!("the next {w} minutes of usage exactly")) };
            reference(name, &format!("pods re-placed every {w} minutes knowing {knowing}"), h);
        }
    }
    // Name the charts of this run: an earlier run with other sizes may have
    // left others in the directory.
    let charts: Vec<String> = evals.iter().flat_map(|e| std::iter::once(chart_file(e.config.gpu_mem_gib)).chain(e.fleet.as_ref().map(|_| fleet_chart_file(e.config.gpu_mem_gib)))).collect();
    let _ = write!(md, "\nCharts of this run: {}\n", charts.join(", "));
    // Into place together once all are written (elastic.md last), so that
    // a failure part-way leaves an earlier report whole.
    let mut staged = Staged::default();
    staged.write(&dir.join("elastic.md"), &md)?;
    staged.write(&dir.join("elastic.json"), &serde_json::to_string_pretty(evals)?)?;
    for e in evals {
        // Hours of trace time: a period lasts the trace's own step.
        let hours = |t: usize| t as f64 * e.step_s / 3600.0;
        let mut series: Vec<(String, Vec<(f64, f64)>)> = e.outcomes.iter().map(|o| (o.strategy.clone(), envelope(o.in_use.iter().map(|&g| f64::from(g)), hours))).collect();
        series.push(("lower bound".into(), envelope(e.lower_bound_series.iter().copied(), hours)));
        let ymax = e.outcomes.iter().map(|o| o.gpus).max().unwrap_or(1) as f64 * 1.1;
        let path = dir.join(chart_file(e.config.gpu_mem_gib));
        line_chart(&staged.stage(&path), &format!("GPUs in use, {} GiB GPUs", e.config.gpu_mem_gib), "hours", "GPUs", (0.0, hours(e.minutes)), (0.0, ymax.max(1.0)), &series, false).map_err(|err| named(err, &path))?;
        if let (Some(f), Some(c)) = (&e.fleet, e.config.fleet) {
            let path = dir.join(fleet_chart_file(e.config.gpu_mem_gib));
            fleet_chart(&staged.stage(&path), e.config.gpu_mem_gib, c.budget, f).map_err(|err| named(err, &path))?;
        }
    }
    staged.commit()?;
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_series_is_charted_by_its_envelope() {
        let short: Vec<f64> = (0..10).map(f64::from).collect();
        assert_eq!(envelope(short.iter().copied(), |t| t as f64), short.iter().enumerate().map(|(t, &v)| (t as f64, v)).collect::<Vec<_>>());
        // A million periods with one peak: 2,000 points, and the peak kept.
        let long = (0..1_000_000).map(|t| if t == 777_777 { 9.0 } else { 1.0 });
        let pts = envelope(long, |t| t as f64);
        assert_eq!(pts.len(), CHART_POINTS);
        assert_eq!(pts.iter().filter(|p| p.1 == 9.0).count(), 1);
        assert_eq!(pts.iter().find(|p| p.1 == 9.0).map(|p| p.0), Some(777_500.0), "at the start of its run of periods");
    }
}
