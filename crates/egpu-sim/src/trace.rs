//! Loaders for the openb trace format (Alibaba clusterdata, CC BY 4.0):
//! a node list (`sn,cpu_milli,memory_mib,gpu,model`) and a pod list
//! (`name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,...`).
//!
//! Columns are found by header name, so extra columns (times, phase) are
//! ignored. Every bad row gives an error naming the file and the line; with
//! `lenient` it is counted as skipped instead. Nothing here panics on any
//! input: the loaders are fuzzed and property-tested.

use egpu_place::{Cluster, MILLI, NodeSpec, Pod, Qos, TypeSet};
use std::fmt;

/// Kubernetes' default pods-per-node limit in the published simulator's node files.
pub const MAX_PODS_PER_NODE: u32 = 1001;

/// A loading error, with the file and the 1-based line it is about (0:
/// the whole file, as for a gzip file that does not unpack).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{}{msg}", if *.line > 0 { format!("{line}: ") } else { " ".to_string() })]
pub struct TraceError {
    pub file: String,
    pub line: u64,
    pub msg: String,
}

/// Rows skipped in lenient mode: how many, and the first few reasons.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Skipped {
    pub count: usize,
    pub examples: Vec<String>,
}

impl Skipped {
    fn add(&mut self, e: TraceError) {
        self.count += 1;
        if self.examples.len() < 5 {
            self.examples.push(e.to_string());
        }
    }
}

impl fmt::Display for Skipped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} rows skipped", self.count)?;
        for e in &self.examples {
            write!(f, "\n  {e}")?;
        }
        Ok(())
    }
}

/// A pod of a trace, with its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TracePod {
    pub name: String,
    pub pod: Pod,
}

/// GPU memory of the types the openb trace names (G1–G3 are undisclosed: 0).
pub fn gpu_memory_mib(model: &str) -> u64 {
    match model {
        "V100M16" | "P100" | "T4" => 16 * 1024,
        "V100M32" => 32 * 1024,
        "A10" => 24 * 1024,
        "A100" | "H100" => 80 * 1024,
        _ => 0,
    }
}

struct Table<'a> {
    file: &'a str,
    reader: csv::Reader<&'a [u8]>,
    columns: Vec<(&'static str, Option<usize>)>,
    header_len: usize,
    last_error_byte: Option<u64>,
    lines: crate::text::Lines<'a>,
}

impl<'a> Table<'a> {
    fn open(file: &'a str, text: &'a str, required: &[&'static str], optional: &[&'static str]) -> Result<Table<'a>, TraceError> {
        let mut reader = csv::ReaderBuilder::new().flexible(true).trim(csv::Trim::All).from_reader(text.as_bytes());
        let err = |msg: String| TraceError { file: file.to_string(), line: 1, msg };
        if text.trim().is_empty() {
            return Err(err(format!("the file is empty: it needs a header naming the columns {}", required.join(","))));
        }
        let headers = reader.headers().map_err(|e| err(format!("cannot read the header: {e}")))?.clone();
        // A column named twice would be read from its first field only,
        // whichever the file meant: refused, as the usage loader refuses it.
        let find = |name: &str| match headers.iter().enumerate().filter(|(_, h)| h.eq_ignore_ascii_case(name)).map(|(i, _)| i).collect::<Vec<_>>()[..] {
            [] => Ok(None),
            [i] => Ok(Some(i)),
            ref all => Err(err(format!("column '{name}' appears {} (fields {}): keep one", times(all.len()), fields(all)))),
        };
        let mut columns = Vec::new();
        for &name in required {
            let idx = find(name)?.ok_or_else(|| err(format!("missing column '{name}' (header is: {})", headers.iter().collect::<Vec<_>>().join(","))))?;
            columns.push((name, Some(idx)));
        }
        for &name in optional {
            columns.push((name, find(name)?));
        }
        Ok(Table { file, reader, columns, header_len: headers.len(), last_error_byte: None, lines: crate::text::Lines::new(text) })
    }

    /// Next row as (line, fields by column order), or an error for that row.
    fn next_row(&mut self) -> Option<Result<(u64, Vec<String>), TraceError>> {
        let mut rec = csv::StringRecord::new();
        // A line of spaces is as blank as an empty one.
        let mut read = self.reader.read_record(&mut rec);
        while matches!(read, Ok(true)) && rec.iter().all(str::is_empty) {
            read = self.reader.read_record(&mut rec);
        }
        match read {
            Ok(false) => None,
            Ok(true) => {
                let line = rec.position().map_or(0, |p| self.lines.line(p.byte()));
                // A field too many is a value split by a comma (several GPU
                // types are written `A|B`), not something to drop quietly.
                if rec.len() > self.header_len {
                    return Some(Err(self.err(line, format!("{} fields but the header has {}: a value holds a comma (write several GPU types as A|B)", rec.len(), self.header_len))));
                }
                let mut out = Vec::with_capacity(self.columns.len());
                for &(name, idx) in &self.columns {
                    match idx.map(|i| rec.get(i)) {
                        Some(Some(v)) => out.push(v.to_string()),
                        Some(None) => return Some(Err(self.err(line, format!("truncated row: no value for column '{name}'")))),
                        None => out.push(String::new()),
                    }
                }
                Some(Ok((line, out)))
            }
            Err(e) => {
                let line = e.position().map_or(0, |p| self.lines.line(p.byte()));
                let byte = e.position().map(|p| p.byte());
                if byte.is_some() && byte == self.last_error_byte {
                    return None; // no progress: stop rather than loop
                }
                self.last_error_byte = byte;
                // The csv reader cannot resume after an IO-level error; a
                // per-record error (bad UTF-8) leaves it usable.
                Some(Err(self.err(line, format!("unreadable row: {e}"))))
            }
        }
    }

    fn err(&self, line: u64, msg: String) -> TraceError {
        TraceError { file: self.file.to_string(), line, msg }
    }
}

/// "twice", "3 times", …
pub(crate) fn times(n: usize) -> String {
    if n == 2 { "twice".to_string() } else { format!("{n} times") }
}

/// 0-based field indices as 1-based positions: "2 and 5", "1, 2 and 5".
pub(crate) fn fields(idx: &[usize]) -> String {
    let n: Vec<String> = idx.iter().map(|i| (i + 1).to_string()).collect();
    match n.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        _ => n.join(""),
    }
}

fn int(t: &Table, line: u64, col: &str, v: &str) -> Result<u64, TraceError> {
    let v = v.trim();
    if let Ok(n) = v.parse::<u64>() {
        return Ok(n);
    }
    // Some exports write integers as floats ("1000.0"), exact up to 2^53.
    let whole = "write a whole number of at least 0";
    let digits = v.strip_prefix('+').unwrap_or(v);
    let why = match v.parse::<f64>() {
        Ok(f) if f.is_finite() && f >= 0.0 && f.fract() == 0.0 && f <= FLOAT_MAX => return Ok(f as u64),
        // Digits only, so past u64.
        _ if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) => format!("is too large: at most {}; check the value and its unit", u64::MAX),
        // "nan", "inf", "infinity"; "1e999" is a number too large.
        Ok(f) if f.is_nan() || (f.is_infinite() && !v.bytes().any(|b| b.is_ascii_digit())) => format!("is not a number: {whole}"),
        Ok(f) if f < 0.0 => format!("is negative: {whole}"),
        Ok(f) if f > FLOAT_MAX => format!("is too large for a number with a decimal point or an exponent (at most {FLOAT_MAX:e}); check the value and its unit, and write it in digits alone (at most {})", u64::MAX),
        Ok(_) => format!("is not a whole number: {whole}"),
        Err(_) if v.is_empty() => format!("is empty: {whole}"),
        Err(_) => format!("is not a number: {whole}"),
    };
    Err(t.err(line, format!("column '{col}': '{v}' {why}")))
}

/// Largest integer accepted in float form ("1e15", "1000.0"): well within
/// the integers an `f64` holds exactly.
const FLOAT_MAX: f64 = 1e15;

/// Load a node list into a new cluster. GPU nodes need a model; nodes
/// without GPUs are kept (CPU-only pods may use them).
pub fn load_nodes(file: &str, text: &str, lenient: bool) -> Result<(Cluster, Skipped), TraceError> {
    let mut t = Table::open(file, text, &["sn", "cpu_milli", "memory_mib", "gpu"], &["model"])?;
    let mut cluster = Cluster::new();
    let mut skipped = Skipped::default();
    let mut seen: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
    while let Some(row) = t.next_row() {
        let res = row.and_then(|(line, f)| {
            // A repeated node would silently add capacity.
            let name = f[0].trim().to_string();
            if let Some(first) = seen.get(&name) {
                return Err(t.err(line, format!("node '{name}' is listed again (first at line {first})")));
            }
            node_row(&t, &mut cluster, line, &f)?;
            seen.insert(name, line);
            Ok(())
        });
        match res {
            Ok(()) => {}
            Err(e) if lenient => skipped.add(e),
            Err(e) => return Err(e),
        }
    }
    if cluster.nodes().is_empty() {
        return Err(TraceError { file: file.to_string(), line: 1, msg: "no nodes in the node list".into() });
    }
    Ok((cluster, skipped))
}

fn node_row(t: &Table, cluster: &mut Cluster, line: u64, f: &[String]) -> Result<(), TraceError> {
    let name = f[0].trim();
    if name.is_empty() {
        return Err(t.err(line, "empty node name (column 'sn')".into()));
    }
    let cpu = int(t, line, "cpu_milli", &f[1])?;
    let mem = int(t, line, "memory_mib", &f[2])?;
    let gpus = int(t, line, "gpu", &f[3])?;
    // GPU models are compared without regard to case: one spelling each.
    let model = f[4].trim().to_ascii_uppercase();
    let model = model.as_str();
    if gpus > egpu_place::model::MAX_GPUS_PER_NODE as u64 {
        return Err(t.err(line, format!("{gpus} GPUs on one node is more than the supported {}", egpu_place::model::MAX_GPUS_PER_NODE)));
    }
    let gpu_type = if gpus == 0 {
        None
    } else {
        if model.is_empty() || model.eq_ignore_ascii_case("nan") {
            return Err(t.err(line, format!("node '{name}' has {gpus} GPUs but no GPU model")));
        }
        Some(cluster.gpu_type_or_insert(model, gpu_memory_mib(model)).map_err(|e| t.err(line, e.to_string()))?)
    };
    let spec = NodeSpec { name: name.to_string(), cpu_milli: cpu, memory_mib: mem, gpu_type, nvlink_groups: vec![0; gpus as usize], max_pods: MAX_PODS_PER_NODE };
    cluster.add_node(spec).map_err(|e| t.err(line, e.to_string()))?;
    Ok(())
}

/// Load a pod list for `cluster`. GPU types in `gpu_spec` must exist in the
/// cluster, and every pod must fit at least one empty node.
pub fn load_pods(file: &str, text: &str, cluster: &Cluster, lenient: bool) -> Result<(Vec<TracePod>, Skipped), TraceError> {
    let mut t = Table::open(file, text, &["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"], &["gpu_spec", "qos"])?;
    let mut pods = Vec::new();
    let mut skipped = Skipped::default();
    while let Some(row) = t.next_row() {
        match row.and_then(|(line, f)| pod_row(&t, cluster, line, &f)) {
            Ok(p) => pods.push(p),
            Err(e) if lenient => skipped.add(e),
            Err(e) => return Err(e),
        }
    }
    Ok((pods, skipped))
}

/// Whether some node of the (still empty) cluster could hold `pod`: node
/// by node, since the largest CPU, memory and GPU count may be on
/// different nodes.
pub(crate) fn possible(cluster: &Cluster, pod: &Pod) -> bool {
    cluster.nodes().iter().any(|n| n.fits(pod))
}

fn pod_row(t: &Table, cluster: &Cluster, line: u64, f: &[String]) -> Result<TracePod, TraceError> {
    let name = f[0].trim();
    if name.is_empty() {
        return Err(t.err(line, "empty pod name".into()));
    }
    let cpu = int(t, line, "cpu_milli", &f[1])?;
    let mem = int(t, line, "memory_mib", &f[2])?;
    let count = int(t, line, "num_gpu", &f[3])?;
    // A CPU-only pod's gpu_milli is not read (it may be empty).
    let milli = if count == 0 { 0 } else { int(t, line, "gpu_milli", &f[4])? };
    if count > egpu_place::model::MAX_GPUS_PER_NODE as u64 {
        return Err(t.err(line, format!("pod '{name}' asks for {count} GPUs, more than any node can have")));
    }
    // A CPU-only pod's gpu_milli is meaningless; a multi-GPU pod takes whole GPUs.
    let milli = if count == 0 { 0 } else if count > 1 && milli == 0 { u64::from(MILLI) } else { milli };
    if count > 0 && !(1..=u64::from(MILLI)).contains(&milli) {
        return Err(t.err(line, format!("pod '{name}': gpu_milli {milli} is outside 1..=1000")));
    }
    let types = parse_gpu_spec(cluster, &f[5]).map_err(|m| t.err(line, format!("pod '{name}': {m}")))?;
    let qos = match f[6].trim().to_ascii_uppercase().as_str() {
        "LS" => Qos::Ls,
        "BURSTABLE" => Qos::Burstable,
        "BE" | "" => Qos::Be,
        "GUARANTEED" => Qos::Guaranteed,
        _ => Qos::Other,
    };
    let pod = Pod::new(cpu, mem, count as u32, milli as u32, types, qos).map_err(|e| t.err(line, format!("pod '{name}': {e}")))?;
    if !possible(cluster, &pod) {
        let any_type = Pod::new(cpu, mem, count as u32, milli as u32, TypeSet::ANY, qos).is_ok_and(|p| possible(cluster, &p));
        let why = if any_type { format!("no node of its gpu_spec '{}' is large enough, though nodes of other GPU types are", f[5].trim()) } else { "no node in the node list is large enough".to_string() };
        return Err(t.err(line, format!("pod '{name}' can never be placed: {why} (cpu {cpu}m, memory {mem}MiB, {count} GPUs)")));
    }
    Ok(TracePod { name: name.to_string(), pod })
}

/// Parse `V100M16|V100M32` into a type set; empty or `nan` means any.
pub fn parse_gpu_spec(cluster: &Cluster, spec: &str) -> Result<TypeSet, String> {
    let spec = spec.trim();
    if spec.is_empty() || spec.eq_ignore_ascii_case("nan") {
        return Ok(TypeSet::ANY);
    }
    let mut set = TypeSet::ANY;
    for name in spec.split('|').map(str::trim).filter(|s| !s.is_empty()) {
        let known: Vec<&str> = cluster.gpu_types().iter().map(|t| t.name.as_str()).collect();
        let t = cluster.gpu_type(&name.to_ascii_uppercase()).ok_or_else(|| format!("unknown GPU type '{name}' in gpu_spec (the node list has: {})", known.join(", ")))?;
        set = set.with(t);
    }
    Ok(set)
}
