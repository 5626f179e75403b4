//! Loader for the genai-2026 usage trace: per-pod GPU duty cycle and GPU
//! memory used, one row per pod per minute (`value`, `timestamp_anon`,
//! `container_ip`, in any column order), optionally gzip-compressed.

use std::collections::HashMap;
use std::io::Read;

/// A loading error with the file and 1-based line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}: {msg}")]
pub struct UsageError {
    pub file: String,
    pub line: u64,
    pub msg: String,
}

/// Per-pod usage on a common minute grid. `NaN` marks a minute without a sample.
#[derive(Debug, Clone, Default)]
pub struct Usage {
    pub pods: Vec<String>,
    pub minutes: usize,
    /// Busy fraction of one GPU, 0..=1, `[pod][minute]`.
    pub duty: Vec<Vec<f32>>,
    /// GPU memory used, bytes, `[pod][minute]`.
    pub mem: Vec<Vec<f32>>,
    pub skipped_rows: usize,
}

/// Decompress if the bytes start with the gzip magic.
pub fn maybe_gunzip(file: &str, bytes: &[u8]) -> Result<String, UsageError> {
    let err = |msg: String| UsageError { file: file.to_string(), line: 0, msg };
    if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut s = String::new();
        flate2::read::MultiGzDecoder::new(bytes).read_to_string(&mut s).map_err(|e| err(format!("cannot decompress: {e}")))?;
        Ok(s)
    } else {
        String::from_utf8(bytes.to_vec()).map_err(|e| err(format!("not UTF-8 text: {e}")))
    }
}

/// One sample: (pod, timestamp in seconds, value).
pub type Sample = (String, f64, f64);

/// Samples of one metric file, and how many rows were skipped.
pub fn parse_metric(file: &str, text: &str, lenient: bool) -> Result<(Vec<Sample>, usize), UsageError> {
    let mut rd = csv::ReaderBuilder::new().flexible(true).trim(csv::Trim::All).from_reader(text.as_bytes());
    let err = |line: u64, msg: String| UsageError { file: file.to_string(), line, msg };
    let headers = rd.headers().map_err(|e| err(1, format!("cannot read the header: {e}")))?.clone();
    let col = |name: &str| headers.iter().position(|h| h == name).ok_or_else(|| err(1, format!("missing column '{name}'")));
    let (vi, ti, pi) = (col("value")?, col("timestamp_anon")?, col("container_ip")?);
    let mut out = Vec::new();
    let mut skipped = 0;
    let mut last_err_byte = None;
    for rec in rd.records() {
        let row = match rec {
            Ok(r) => {
                let line = r.position().map_or(0, |p| p.line());
                let get = |i: usize, what: &str| r.get(i).ok_or_else(|| err(line, format!("truncated row: no {what}")));
                (|| {
                    let v: f64 = get(vi, "value")?.parse().map_err(|_| err(line, "value is not a number".into()))?;
                    let t: f64 = get(ti, "timestamp")?.parse().map_err(|_| err(line, "timestamp is not a number".into()))?;
                    let p = get(pi, "container_ip")?.to_string();
                    if !v.is_finite() || v < 0.0 || !t.is_finite() || p.is_empty() {
                        return Err(err(line, "value must be a finite non-negative number with a timestamp and a pod".into()));
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
                Err(err(e.position().map_or(0, |p| p.line()), format!("unreadable row: {e}")))
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

/// Align duty-cycle rows (values in percent) and memory rows (bytes) on a
/// minute grid starting at the earliest timestamp.
pub fn align(duty: &[Sample], mem: &[Sample]) -> Usage {
    let t0 = duty.iter().chain(mem).map(|r| r.1).fold(f64::INFINITY, f64::min);
    let t1 = duty.iter().chain(mem).map(|r| r.1).fold(f64::NEG_INFINITY, f64::max);
    if !t0.is_finite() {
        return Usage::default();
    }
    let mut index: HashMap<&str, usize> = HashMap::new();
    let mut pods = Vec::new();
    for r in duty.iter().chain(mem) {
        index.entry(r.0.as_str()).or_insert_with(|| {
            pods.push(r.0.clone());
            pods.len() - 1
        });
    }
    // Bound the grid (pods × minutes) so hostile timestamps cannot exhaust memory.
    let minutes = (((t1 - t0) / 60.0).round() as usize).min(50_000_000 / pods.len().max(1)) + 1;
    let mut u = Usage { minutes, duty: vec![vec![f32::NAN; minutes]; pods.len()], mem: vec![vec![f32::NAN; minutes]; pods.len()], pods, skipped_rows: 0 };
    for (rows, dst, scale) in [(duty, 0, 0.01), (mem, 1, 1.0)] {
        for (p, t, v) in rows {
            let m = ((t - t0) / 60.0).round() as usize;
            let Some(&i) = index.get(p.as_str()) else { continue };
            let grid = if dst == 0 { &mut u.duty } else { &mut u.mem };
            if let Some(slot) = grid[i].get_mut(m) {
                *slot = if dst == 0 { (v * scale).clamp(0.0, 1.0) as f32 } else { *v as f32 };
            }
        }
    }
    u
}
