//! Loader for the genai-2026 usage trace: per-pod GPU duty cycle and GPU
//! memory used, one row per pod per sample (`value`, `timestamp_anon`,
//! `container_ip`, in any column order), optionally gzip-compressed.

use std::collections::HashMap;

/// A loading error with the file and 1-based line (0: the message says
/// where, as for a JSON series).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{}{msg}", if *.line > 0 { format!("{line}: ") } else { " ".to_string() })]
pub struct UsageError {
    pub file: String,
    pub line: u64,
    pub msg: String,
}

/// Per-pod usage on a common grid of sampling periods. `NaN` marks a
/// period without a sample.
#[derive(Debug, Clone)]
pub struct Usage {
    pub pods: Vec<String>,
    /// Periods on the grid. The evaluation calls them minutes: one sample
    /// of a pod stands for one period, whatever its length.
    pub minutes: usize,
    /// Length of a period, seconds: the trace's own sampling step.
    pub step_s: f64,
    /// First and last timestamp seen, seconds.
    pub first_s: f64,
    pub last_s: f64,
    /// Busy fraction of one GPU, 0..=1, `[pod][period]`.
    pub duty: Vec<Vec<f32>>,
    /// GPU memory used, bytes, `[pod][period]`.
    pub mem: Vec<Vec<f32>>,
    /// What `--lenient` left out of the files (all 0 without it, where
    /// each of these is an error instead).
    pub left_out: LeftOut,
    /// Samples past the grid's size bound ([`MAX_CELLS`], [`MAX_PERIODS`]), not used.
    pub dropped_samples: usize,
    /// Absences [`Usage::split_absences`] cut pods at (each a new pod after it).
    pub absences: usize,
}

impl Usage {
    /// A pod with no sample in either metric for more than `max_gap`
    /// periods is taken as gone, and as a new pod (`<name>~2`, `~3`, ...)
    /// when samples come again: its slice is given back over the absence
    /// instead of holding its last sample's usage, which a shorter gap
    /// repeats. Returns how many absences were cut. `max_gap` 0 cuts none.
    pub fn split_absences(&mut self, max_gap: usize) -> usize {
        if max_gap == 0 {
            return 0;
        }
        let mut cut = 0;
        for i in 0..self.pods.len() {
            let seen: Vec<usize> = (0..self.minutes).filter(|&t| !self.duty[i][t].is_nan() || !self.mem[i][t].is_nan()).collect();
            let starts: Vec<usize> = seen.windows(2).filter(|w| w[1] - w[0] - 1 > max_gap).map(|w| w[1]).collect();
            for (k, &from) in starts.iter().enumerate() {
                let to = starts.get(k + 1).copied().unwrap_or(self.minutes);
                let mut duty = vec![f32::NAN; self.minutes];
                let mut mem = vec![f32::NAN; self.minutes];
                duty[from..to].copy_from_slice(&self.duty[i][from..to]);
                mem[from..to].copy_from_slice(&self.mem[i][from..to]);
                self.duty[i][from..to].fill(f32::NAN);
                self.mem[i][from..to].fill(f32::NAN);
                self.pods.push(format!("{}~{}", self.pods[i], k + 2));
                self.duty.push(duty);
                self.mem.push(mem);
                cut += 1;
            }
        }
        self.absences += cut;
        cut
    }
}

/// What `--lenient` left out of a usage trace, kept in the report
/// (`elastic.json`'s `left_out`, a line of `elastic.md`) so a result read
/// later says it came from part of the files.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct LeftOut {
    /// Rows (CSV), samples (Prometheus JSON) and lines that are not UTF-8
    /// skipped, in both files.
    pub rows_or_samples: usize,
    /// Pods that only one of the two files names (with `--lenient`; the
    /// genai-2026 trace's one such pod always).
    pub pods_in_one_file: usize,
    /// Samples past the grid's size bound ([`Usage::dropped_samples`]).
    pub samples_past_grid: usize,
}

impl LeftOut {
    /// `true` when nothing was left out.
    pub fn is_empty(&self) -> bool {
        *self == LeftOut::default()
    }
}

impl Default for Usage {
    fn default() -> Self {
        Usage { pods: Vec::new(), minutes: 0, step_s: 60.0, first_s: 0.0, last_s: 0.0, duty: Vec::new(), mem: Vec::new(), left_out: LeftOut::default(), dropped_samples: 0, absences: 0 }
    }
}

/// Most pod × period cells a grid may have. Each cell costs 12 bytes here
/// (f32 duty and memory, a sample count while aligning) and about 24 while
/// the evaluation runs (f64 copies), so the bound is about 1.2 GB.
pub const MAX_CELLS: usize = 50_000_000;

/// Most periods a grid may have, whatever its pods: a million (1.9 years
/// at one sample a minute). It bounds a one-pod trace whose stray
/// timestamp [`MAX_CELLS`] alone would let run to 50 million periods.
pub const MAX_PERIODS: usize = 1_000_000;

/// Largest value a sample may have (bytes of memory, or percent): beyond
/// it, it is no GPU's usage, and it would not survive the f32 grid.
pub const MAX_VALUE: f64 = 1e18;

/// The file's text ([`crate::text::decode`]: gzip or plain, a byte-order
/// mark dropped), and with `lenient` how many lines were blanked for
/// bytes that are not UTF-8.
pub fn decode(file: &str, bytes: &[u8], lenient: bool) -> Result<(String, usize), UsageError> {
    crate::text::decode(bytes, lenient).map_err(|(line, msg)| UsageError { file: file.to_string(), line, msg })
}

/// A number for a message: as written when short, else in `e` notation
/// (`1e40`, not forty digits).
pub fn short(x: f64) -> String {
    if x.is_finite() && x.abs() >= 1e15 { format!("{x:e}") } else { x.to_string() }
}

/// One sample: (pod, timestamp in seconds, value).
pub type Sample = (String, f64, f64);

/// Samples of one metric file, and how many rows were skipped.
pub fn parse_metric(file: &str, text: &str, lenient: bool) -> Result<(Vec<Sample>, usize), UsageError> {
    let mut rd = csv::ReaderBuilder::new().flexible(true).trim(csv::Trim::All).from_reader(text.as_bytes());
    let err = |line: u64, msg: String| UsageError { file: file.to_string(), line, msg };
    if text.trim().is_empty() {
        return Err(err(1, "the file is empty: it needs a header (value, timestamp, pod) and one row per sample".into()));
    }
    let headers = rd.headers().map_err(|e| err(1, format!("cannot read the header: {e}")))?.clone();
    // A column named twice would be read from its first field only.
    let find = |name: &str| match headers.iter().enumerate().filter(|(_, h)| h.eq_ignore_ascii_case(name)).map(|(i, _)| i).collect::<Vec<_>>()[..] {
        [] => Ok(None),
        [i] => Ok(Some(i)),
        ref all => Err(err(1, format!("column '{name}' appears {} (fields {}): keep one", crate::trace::times(all.len()), crate::trace::fields(all)))),
    };
    let col = |name: &str| find(name)?.ok_or_else(|| err(1, format!("missing column '{name}'")));
    // genai-2026 names, or the plain ones of a trace of your own.
    let either = |a: &str, b: &str| match (find(a)?, find(b)?) {
        (Some(_), Some(_)) => Err(err(1, format!("both a '{a}' and a '{b}' column: keep one, so that it is clear which is meant"))),
        (Some(i), None) | (None, Some(i)) => Ok(i),
        (None, None) => Err(err(1, format!("missing column '{b}' (or '{a}'): the header needs value, timestamp and pod"))),
    };
    let (vi, ti, pi) = (col("value")?, either("timestamp_anon", "timestamp")?, either("container_ip", "pod")?);
    let mut out = Vec::new();
    let mut skipped = 0;
    let mut last_err_byte = None;
    let mut lines = crate::text::Lines::new(text);
    for rec in rd.records() {
        let row = match rec {
            // A line of spaces is as blank as an empty one.
            Ok(r) if r.iter().all(str::is_empty) => continue,
            // The header again: files concatenated with their headers.
            Ok(r) if r.len() == headers.len() && r.iter().zip(headers.iter()).all(|(a, b)| a.trim_start_matches('\u{feff}').eq_ignore_ascii_case(b)) => continue,
            Ok(r) => {
                let line = r.position().map_or(0, |p| lines.line(p.byte()));
                let get = |i: usize, what: &str| r.get(i).ok_or_else(|| err(line, format!("truncated row: no {what}")));
                (|| {
                    // A field too many is most often a pod name with a comma in it.
                    if r.len() > headers.len() {
                        return Err(err(line, format!("{} fields but the header has {}: quote a value that holds a comma", r.len(), headers.len())));
                    }
                    let number = |i: usize, what: &str| -> Result<f64, UsageError> {
                        let text = get(i, what)?;
                        let shown: String = text.chars().take(40).collect();
                        let more = if text.chars().count() > 40 { "…" } else { "" };
                        text.parse().map_err(|_| err(line, format!("{what} '{shown}{more}' is not a number")))
                    };
                    let v = number(vi, "value")?;
                    let t = number(ti, "timestamp")?;
                    let p = get(pi, "pod")?.to_string();
                    if !t.is_finite() {
                        return Err(err(line, format!("timestamp {} is not a finite number of seconds", short(t))));
                    }
                    if p.is_empty() {
                        return Err(err(line, "no pod name".into()));
                    }
                    if !(0.0..=MAX_VALUE).contains(&v) {
                        return Err(err(line, format!("value {} is not a number from 0 to {MAX_VALUE:e}", short(v))));
                    }
                    Ok((p, t, v))
                })()
            }
            Err(e) => {
                let b = e.position().map(|p| p.byte());
                if b.is_some() && b == last_err_byte {
                    break;
                }
                last_err_byte = b;
                Err(err(e.position().map_or(0, |p| lines.line(p.byte())), format!("unreadable row: {e}")))
            }
        };
        match row {
            Ok(r) => out.push(r),
            Err(_) if lenient => skipped += 1,
            Err(e) => return Err(e),
        }
    }
    Ok((out, skipped))
}

/// The trace's sampling step, seconds: the median gap between consecutive
/// distinct timestamps *of one pod in one file* (so that pods scraped at
/// different moments do not shrink it, and jitter averages out), to the
/// nearest second and at least one second; 60 when no pod has two
/// samples.
pub fn sampling_step(files: &[&[Sample]]) -> f64 {
    let mut gaps: Vec<f64> = Vec::new();
    for rows in files {
        let mut by_pod: HashMap<&str, Vec<f64>> = HashMap::new();
        for (p, t, _) in rows.iter() {
            if t.is_finite() {
                by_pod.entry(p.as_str()).or_default().push(*t);
            }
        }
        for ts in by_pod.values_mut() {
            ts.sort_by(f64::total_cmp);
            ts.dedup_by(|a, b| (*a - *b).abs() < 1e-3);
            gaps.extend(ts.windows(2).map(|w| w[1] - w[0]));
        }
    }
    if gaps.is_empty() {
        return 60.0;
    }
    let mid = (gaps.len() - 1) / 2;
    let (_, median, _) = gaps.select_nth_unstable_by(mid, f64::total_cmp);
    median.round().clamp(1.0, 1e12)
}

/// One metric of a usage trace of your own: its samples (pod, seconds,
/// value in the file's unit), the metric's name if the file gives one (a
/// Prometheus series' `__name__`), rows or samples skipped with
/// `--lenient`, and Prometheus series that belong to no pod (a GPU no pod
/// holds), left out.
#[derive(Debug, Clone, Default)]
pub struct Metric {
    pub samples: Vec<Sample>,
    pub name: Option<String>,
    pub skipped: usize,
    pub series_without_pod: usize,
}

/// Parse a usage file of your own: a CSV with `value`, `timestamp` and
/// `pod` columns (or genai-2026's names), or the JSON of a Prometheus range
/// query (`/api/v1/query_range`: `{"status":"success","data":{"resultType":
/// "matrix","result":[...]}}`, or just the `result` array). Which one is
/// decided by the first character that is not white space: `{` or `[` is
/// JSON.
pub fn parse_usage_file(file: &str, text: &str, lenient: bool) -> Result<Metric, UsageError> {
    match text.trim_start().chars().next() {
        Some('{' | '[') => parse_prometheus(file, text, lenient),
        _ => parse_metric(file, text, lenient).map(|(samples, skipped)| Metric { samples, skipped, ..Metric::default() }),
    }
}

#[derive(serde::Deserialize)]
struct PromResponse {
    status: String,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    data: Option<PromData>,
}

#[derive(serde::Deserialize)]
struct PromData {
    #[serde(rename = "resultType")]
    result_type: String,
    result: serde_json::Value,
}

#[derive(serde::Deserialize)]
struct PromSeries {
    #[serde(default)]
    metric: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    values: Vec<(f64, String)>,
    /// Only in an instant query's result.
    #[serde(default)]
    value: Option<serde_json::Value>,
}

/// Which labels name a series' pod, decided once per file: `exported_pod`
/// / `exported_namespace` if any series has them (Prometheus renames the
/// workload's labels so when it scrapes dcgm-exporter without
/// `honor_labels`, and `pod` is then the exporter's own pod), else `pod` /
/// `namespace`, else none (a host without Kubernetes: each series is named
/// by all its labels, one workload per GPU).
#[derive(Clone, Copy, PartialEq)]
enum PodLabels {
    Exported,
    Plain,
    None,
}

/// The pod a Prometheus series belongs to: `namespace/pod` by the file's
/// [`PodLabels`], with `#<gpu>` when the series names its GPU (`gpu`, else
/// `UUID`, else `device`), since each GPU of a pod is a slice of its own.
/// `None`: the series has no pod (a GPU no pod holds).
fn series_pod(labels: &std::collections::BTreeMap<String, String>, by: PodLabels) -> Option<String> {
    let get = |names: &[&str]| names.iter().find_map(|n| labels.get(*n)).filter(|v| !v.is_empty()).cloned();
    let gpu = get(&["gpu", "UUID", "device"]).map(|g| format!("#{g}")).unwrap_or_default();
    let (pod, ns) = match by {
        PodLabels::Exported => ("exported_pod", "exported_namespace"),
        PodLabels::Plain => ("pod", "namespace"),
        PodLabels::None => return Some(labels.iter().filter(|(k, _)| k.as_str() != "__name__").map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")),
    };
    let p = get(&[pod])?;
    Some(match get(&[ns]) {
        Some(n) => format!("{n}/{p}{gpu}"),
        None => format!("{p}{gpu}"),
    })
}

fn parse_prometheus(file: &str, text: &str, lenient: bool) -> Result<Metric, UsageError> {
    let err = |line: u64, msg: String| UsageError { file: file.to_string(), line, msg };
    let json = |e: serde_json::Error| err(e.line() as u64, format!("not the JSON of a Prometheus range query: {e}"));
    let result = if text.trim_start().starts_with('[') {
        serde_json::from_str::<serde_json::Value>(text).map_err(json)?
    } else {
        let r: PromResponse = serde_json::from_str(text).map_err(json)?;
        if r.status != "success" {
            return Err(err(0, format!("the query failed (status '{}'): {}", r.status, r.error.unwrap_or_default())));
        }
        let d = r.data.ok_or_else(|| err(0, "no 'data' in the response".into()))?;
        if d.result_type != "matrix" {
            return Err(err(0, format!("result type '{}', not 'matrix': export with a range query (/api/v1/query_range, with start, end and step), not an instant query", d.result_type)));
        }
        d.result
    };
    let series: Vec<PromSeries> = serde_json::from_value(result).map_err(|e| err(0, format!("the result is not a list of series with 'metric' labels and '[time, \"value\"]' samples: {e}")))?;
    if series.iter().any(|s| s.value.is_some() && s.values.is_empty()) {
        return Err(err(0, "series with one 'value' and no 'values': this is an instant query; export with a range query (/api/v1/query_range, with start, end and step)".into()));
    }
    let has = |label: &str| series.iter().any(|s| s.metric.get(label).is_some_and(|v| !v.is_empty()));
    let by = if has("exported_pod") {
        PodLabels::Exported
    } else if has("pod") {
        PodLabels::Plain
    } else {
        PodLabels::None
    };
    let mut m = Metric { name: series.iter().find_map(|s| s.metric.get("__name__").cloned()), ..Metric::default() };
    for (k, s) in series.iter().enumerate() {
        let Some(pod) = series_pod(&s.metric, by) else {
            m.series_without_pod += 1;
            continue;
        };
        for (j, (t, v)) in s.values.iter().enumerate() {
            let bad = |what: String| err(0, format!("series {} ({pod}), sample {}: {what} (pass --lenient to skip such samples)", k + 1, j + 1));
            let r = match v.parse::<f64>() {
                Ok(x) if (0.0..=MAX_VALUE).contains(&x) && t.is_finite() => Ok((pod.clone(), *t, x)),
                Ok(x) => Err(bad(format!("value {} at time {} is not a number from 0 to {MAX_VALUE:e}", short(x), short(*t)))),
                Err(_) => Err(bad(format!("value '{v}' is not a number"))),
            };
            match r {
                Ok(x) => m.samples.push(x),
                Err(_) if lenient => m.skipped += 1,
                Err(e) => return Err(e),
            }
        }
    }
    Ok(m)
}

/// Align duty-cycle rows (values in percent) and memory rows (bytes) on a
/// grid that starts at the earliest timestamp and steps by the trace's own
/// sampling period ([`sampling_step`]), so that every sample of a regular
/// trace has a period of its own. Samples of one pod that fall in the same
/// period (a trace sampled faster than its usual step, or with jitter) are
/// combined: duty cycle averaged, memory its largest. A grid above
/// [`MAX_CELLS`] or [`MAX_PERIODS`] is cut short and the samples past it are counted in
/// [`Usage::dropped_samples`].
pub fn align(duty: &[Sample], mem: &[Sample]) -> Usage {
    align_with(duty, mem, None, MAX_CELLS)
}

/// [`align`] with the step given (`Some`, seconds) instead of found, and
/// the grid's bound.
pub fn align_with(duty: &[Sample], mem: &[Sample], step: Option<f64>, max_cells: usize) -> Usage {
    let t0 = duty.iter().chain(mem).map(|r| r.1).fold(f64::INFINITY, f64::min);
    let t1 = duty.iter().chain(mem).map(|r| r.1).fold(f64::NEG_INFINITY, f64::max);
    if !t0.is_finite() {
        return Usage::default();
    }
    let step = step.filter(|s| s.is_finite() && *s > 0.0).unwrap_or_else(|| sampling_step(&[duty, mem]));
    let mut index: HashMap<&str, usize> = HashMap::new();
    let mut pods = Vec::new();
    for r in duty.iter().chain(mem) {
        index.entry(r.0.as_str()).or_insert_with(|| {
            pods.push(r.0.clone());
            pods.len() - 1
        });
    }
    // Bound the grid (pods × periods) so hostile timestamps cannot exhaust memory.
    let span = ((t1 - t0) / step).round().min(1e15) as usize;
    let minutes = span.min((max_cells / pods.len().max(1)).saturating_sub(1)).min(MAX_PERIODS - 1) + 1;
    let n = pods.len();
    let mut u = Usage { minutes, step_s: step, first_s: t0, last_s: t1, duty: vec![vec![f32::NAN; minutes]; n], mem: vec![vec![f32::NAN; minutes]; n], pods, left_out: LeftOut::default(), dropped_samples: 0, absences: 0 };
    // Duty: a running mean per cell (its sample count beside it).
    let mut count = vec![vec![0u32; minutes]; n];
    for (p, t, v) in duty {
        let Some(&i) = index.get(p.as_str()) else { continue };
        let m = ((t - t0) / step).round() as usize;
        let (Some(slot), Some(k)) = (u.duty[i].get_mut(m), count[i].get_mut(m)) else {
            u.dropped_samples += 1;
            continue;
        };
        let x = (v * 0.01).clamp(0.0, 1.0);
        *k = k.saturating_add(1);
        *slot = if *k == 1 { x as f32 } else { (f64::from(*slot) + (x - f64::from(*slot)) / f64::from(*k)) as f32 };
    }
    for (p, t, v) in mem {
        let Some(&i) = index.get(p.as_str()) else { continue };
        let x = v.clamp(0.0, f64::from(f32::MAX)) as f32;
        match u.mem[i].get_mut(((t - t0) / step).round() as usize) {
            Some(slot) => *slot = if slot.is_nan() { x } else { slot.max(x) },
            None => u.dropped_samples += 1,
        }
    }
    u
}
