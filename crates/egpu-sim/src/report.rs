//! Simulation reports: a summary table (unallocated GPU at 100 % arrival,
//! mean ± sd over seeds), the curves as CSV and JSON, and an SVG chart of
//! allocation ratio against arrived workload.

use crate::sim::{MAX_ARRIVED_PCT, RunResult};
use plotters::prelude::*;
use serde::Serialize;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Errors writing a report.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("cannot write {path}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot encode the JSON report")]
    Json(#[from] serde_json::Error),
    #[error("cannot draw the chart {path}: {msg}")]
    Chart { path: String, msg: String },
}

/// One policy's line of the summary.
#[derive(Debug, Clone, Serialize)]
pub struct PolicySummary {
    pub policy: String,
    /// Runs (seeds) whose arrivals reached 100% of capacity, which the
    /// figures below average; all of them unless the cluster is too small
    /// for its inflation to land on the 100% bin.
    pub seeds: usize,
    /// Runs of this policy.
    pub runs: usize,
    /// Unallocated GPU at 100 % arrival, % of capacity: mean and sample sd.
    pub unallocated_mean: f64,
    pub unallocated_sd: f64,
    /// Fragmentation ratio at 100 % arrival, %: mean.
    pub frag_mean: f64,
    pub failed_pods_mean: f64,
}

/// Mean and sample standard deviation.
pub fn mean_sd(v: &[f64]) -> (f64, f64) {
    if v.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let n = v.len() as f64;
    let m = v.iter().sum::<f64>() / n;
    let sd = if v.len() > 1 { (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0)).sqrt() } else { 0.0 };
    (m, sd)
}

/// Summaries per policy, in the order policies first appear in `runs`.
pub fn summarize(runs: &[RunResult]) -> Vec<PolicySummary> {
    let mut names: Vec<&str> = Vec::new();
    for r in runs {
        if !names.contains(&r.policy.as_str()) {
            names.push(&r.policy);
        }
    }
    names
        .into_iter()
        .map(|name| {
            let rs: Vec<&RunResult> = runs.iter().filter(|r| r.policy == name).collect();
            let un: Vec<f64> = rs.iter().filter_map(|r| r.unallocated_at(100)).collect();
            let fr: Vec<f64> = rs.iter().filter_map(|r| r.frag_pct.get(100).copied().flatten()).collect();
            let (m, sd) = mean_sd(&un);
            let failed: Vec<f64> = rs.iter().map(|r| r.failed as f64).collect();
            PolicySummary { policy: name.to_string(), seeds: un.len(), runs: rs.len(), unallocated_mean: m, unallocated_sd: sd, frag_mean: mean_sd(&fr).0, failed_pods_mean: mean_sd(&failed).0 }
        })
        .collect()
}

/// The summary as a Markdown table.
pub fn summary_table(trace: &str, s: &[PolicySummary]) -> String {
    let mut out = format!("Unallocated GPU at 100% arrived workload, trace `{trace}` (% of cluster GPU capacity, mean ± sd over seeds)\n\n");
    out.push_str("| policy | seeds | unallocated % | frag ratio % | failed pods |\n|---|---|---|---|---|\n");
    for p in s {
        if p.seeds == 0 {
            let _ = writeln!(out, "| {} | 0 of {} | n/a: no run has an event at 100% arrival (it stopped short, or one pod's GPUs are over 1% of this cluster's and the arrivals stepped past it) | | {:.0} |", p.policy, p.runs, p.failed_pods_mean);
            continue;
        }
        let seeds = if p.seeds < p.runs { format!("{} of {}", p.seeds, p.runs) } else { p.seeds.to_string() };
        let _ = writeln!(out, "| {} | {seeds} | {:.2} ± {:.2} | {:.1} | {:.0} |", p.policy, p.unallocated_mean, p.unallocated_sd, p.frag_mean, p.failed_pods_mean);
    }
    out
}

/// Curves as CSV: policy,seed,arrived_pct,alloc_pct,frag_pct.
pub fn curves_csv(runs: &[RunResult]) -> String {
    let mut out = String::from("policy,seed,arrived_pct,alloc_pct,frag_pct\n");
    for r in runs {
        for x in 0..=MAX_ARRIVED_PCT {
            let f = |v: Option<&Option<f64>>| v.copied().flatten().map_or(String::new(), |v| format!("{v:.4}"));
            let _ = writeln!(out, "{},{},{},{},{}", r.policy, r.seed, x, f(r.alloc_pct.get(x)), f(r.frag_pct.get(x)));
        }
    }
    out
}

/// Mean allocation curve of one policy over its seeds.
pub fn mean_curve(runs: &[RunResult], policy: &str) -> Vec<(f64, f64)> {
    (0..=MAX_ARRIVED_PCT)
        .filter_map(|x| {
            let v: Vec<f64> = runs.iter().filter(|r| r.policy == policy).filter_map(|r| r.alloc_pct.get(x).copied().flatten()).collect();
            (!v.is_empty()).then(|| (x as f64, mean_sd(&v).0))
        })
        .collect()
}

fn write(path: &Path, text: &str) -> Result<(), ReportError> {
    std::fs::write(path, text).map_err(|source| ReportError::Io { path: path.display().to_string(), source })
}

/// The files of one report, each written first under a hidden name beside
/// it and renamed into place only once all are written, so that a run
/// that fails part-way leaves the directory's earlier report whole, never
/// new files beside old ones. The first file staged (the summary) is
/// renamed last, and its earlier copy removed before anything moves: a
/// summary is only ever beside the files of its own run. The hidden files
/// of a failed run are removed.
#[derive(Default)]
pub(crate) struct Staged {
    /// (hidden name, final name), in the order staged.
    files: Vec<(PathBuf, PathBuf)>,
}

impl Staged {
    /// Where to write `path` for now.
    pub(crate) fn stage(&mut self, path: &Path) -> PathBuf {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let name = path.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let tmp = path.with_file_name(format!(".{name}.egpu-tmp-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)));
        self.files.push((tmp.clone(), path.to_path_buf()));
        tmp
    }

    /// Write `text` as `path`, for now under its hidden name.
    pub(crate) fn write(&mut self, path: &Path, text: &str) -> Result<(), ReportError> {
        let tmp = self.stage(path);
        write(&tmp, text).map_err(|e| named(e, path))
    }

    /// Put every file in place, the first staged last.
    pub(crate) fn commit(mut self) -> Result<(), ReportError> {
        let io = |path: &Path, source| ReportError::Io { path: path.display().to_string(), source };
        // A directory cannot be replaced by a file: found before anything moves.
        if let Some((_, to)) = self.files.iter().find(|(_, to)| to.symlink_metadata().is_ok_and(|m| m.is_dir())) {
            return Err(io(to, std::io::Error::new(std::io::ErrorKind::IsADirectory, "a directory is where the report writes this file")));
        }
        // The earlier summary goes first, the new one comes last.
        if let Some((_, summary)) = self.files.first() {
            match std::fs::remove_file(summary) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(summary, e)),
                _ => self.files.rotate_left(1),
            }
        }
        while let Some((tmp, to)) = self.files.first() {
            std::fs::rename(tmp, to).map_err(|e| io(to, e))?;
            self.files.remove(0);
        }
        Ok(())
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        for (tmp, _) in &self.files {
            let _ = std::fs::remove_file(tmp);
        }
    }
}

/// The error `e` about a hidden file, told of the file it stands for.
pub(crate) fn named(e: ReportError, path: &Path) -> ReportError {
    let path = path.display().to_string();
    match e {
        ReportError::Io { source, .. } => ReportError::Io { path, source },
        ReportError::Chart { msg, .. } => ReportError::Chart { path, msg },
        e => e,
    }
}

/// Everything in the JSON report.
#[derive(Serialize)]
struct JsonReport<'a> {
    trace: &'a str,
    source: &'a str,
    inflation: f64,
    elapsed_s: f64,
    left_out: LeftOut,
    summary: &'a [PolicySummary],
    runs: &'a [RunResult],
}

/// What `--lenient` left out of the trace files, kept in the report
/// (`results.json`'s `left_out`, a line of `summary.md`) so a result read
/// later says it came from part of the files.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct LeftOut {
    pub node_rows: usize,
    pub pod_rows: usize,
    /// Lines that are not UTF-8, in both files.
    pub non_utf8_lines: usize,
}

/// The files [`write_all`] writes into its directory.
pub const FILES: [&str; 4] = ["summary.md", "results.json", "curves.csv", "allocation.svg"];

/// Write `summary.md`, `results.json`, `curves.csv` and `allocation.svg`
/// into `dir`: all of them, or (on an error) none, leaving an earlier
/// report there as it was.
pub fn write_all(dir: &Path, trace: &str, source: &str, inflation: f64, elapsed_s: f64, left_out: LeftOut, runs: &[RunResult]) -> Result<Vec<PolicySummary>, ReportError> {
    std::fs::create_dir_all(dir).map_err(|source| ReportError::Io { path: dir.display().to_string(), source })?;
    let summary = summarize(runs);
    let mut md = summary_table(trace, &summary);
    let _ = write!(md, "\nInflation {inflation}; data: {source}\n");
    if left_out != LeftOut::default() {
        let _ = write!(md, "\n**Part of the input was left out** (`--lenient`): {} node rows, {} pod rows and {} lines that are not UTF-8 skipped.\n", left_out.node_rows, left_out.pod_rows, left_out.non_utf8_lines);
    }
    // Into place together once all are written (the summary last).
    let mut staged = Staged::default();
    staged.write(&dir.join("summary.md"), &md)?;
    let json = serde_json::to_string_pretty(&JsonReport { trace, source, inflation, elapsed_s, left_out, summary: &summary, runs })?;
    staged.write(&dir.join("results.json"), &json)?;
    staged.write(&dir.join("curves.csv"), &curves_csv(runs))?;
    let names: Vec<String> = summary.iter().map(|s| s.policy.clone()).collect();
    let series: Vec<(String, Vec<(f64, f64)>)> = names.iter().map(|n| (n.clone(), mean_curve(runs, n))).collect();
    let caption = format!("GPU allocation vs arrived workload ({trace})");
    let svg = dir.join("allocation.svg");
    line_chart(&staged.stage(&svg), &caption, "arrived workload (% of GPU capacity)", "allocated GPU (%)", (0.0, 130.0), (0.0, 100.0), &series, true).map_err(|e| named(e, &svg))?;
    staged.commit()?;
    Ok(summary)
}

/// Draw a line chart with one series per entry; `ideal` adds y = min(x, 100).
#[allow(clippy::too_many_arguments)]
pub fn line_chart(path: &Path, caption: &str, xlabel: &str, ylabel: &str, xr: (f64, f64), yr: (f64, f64), series: &[(String, Vec<(f64, f64)>)], ideal: bool) -> Result<(), ReportError> {
    let err = |e: String| ReportError::Chart { path: path.display().to_string(), msg: e };
    let root = SVGBackend::new(path, (960, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(56)
        .build_cartesian_2d(xr.0..xr.1, yr.0..yr.1)
        .map_err(|e| err(e.to_string()))?;
    chart.configure_mesh().x_desc(xlabel).y_desc(ylabel).draw().map_err(|e| err(e.to_string()))?;
    if ideal {
        let pts = vec![(0.0, 0.0), (100.0, 100.0), (xr.1, 100.0)];
        chart.draw_series(LineSeries::new(pts, BLACK.mix(0.3))).map_err(|e| err(e.to_string()))?.label("ideal").legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLACK.mix(0.3)));
    }
    lines(&mut chart, series, SeriesLabelPosition::LowerRight, &err)?;
    root.present().map_err(|e| err(e.to_string()))?;
    Ok(())
}

/// Draw one coloured line per series on a chart, and their legend at `at`.
pub(crate) fn lines<'a, DB: DrawingBackend + 'a, CT: plotters::coord::CoordTranslate<From = (f64, f64)>>(chart: &mut ChartContext<'a, DB, CT>, series: &[(String, Vec<(f64, f64)>)], at: SeriesLabelPosition, err: &dyn Fn(String) -> ReportError) -> Result<(), ReportError> {
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
            .map_err(|e| err(e.to_string()))?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
    }
    chart.configure_series_labels().position(at).border_style(BLACK).background_style(WHITE.mix(0.9)).draw().map_err(|e| err(e.to_string()))?;
    Ok(())
}
