//! `egpu simulate`: the command-line front end (the only place `anyhow` is used).
//!
//! With no arguments it simulates all policies over 10 seeds on the openb
//! default trace embedded in the binary and writes a report directory.
//! `--elastic` runs the elastic-sharing evaluation on genai-2026 instead.

use crate::elastic::{self, ElasticConfig};
use crate::sweep::{self, Sweep, Trace};
use crate::{data, report, trace};
use anyhow::{Context, Result, bail};
use egpu_place::PolicyKind;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Flags of `egpu simulate`, as clap's derive reads them: use
/// [`SimulateArgs`], which adds the check clap leaves out.
#[derive(clap::Args, Debug, Clone)]
pub struct SimulateFlags {
    /// Directory holding openb_node_list_gpu_node.csv and openb_pod_list_<TRACE>.csv
    /// (default: the openb default trace embedded in the binary).
    #[arg(long, conflicts_with = "elastic")]
    pub trace_dir: Option<PathBuf>,
    /// Pod list name inside --trace-dir: default, gpushare40, multigpu50, cpu250, ...
    #[arg(long, default_value = "default", conflicts_with = "elastic")]
    pub trace: String,
    /// Pod list file (overrides --trace-dir/--trace).
    #[arg(long, conflicts_with = "elastic")]
    pub pod_list: Option<PathBuf>,
    /// Node list file (overrides --trace-dir).
    #[arg(long, conflicts_with = "elastic")]
    pub node_list: Option<PathBuf>,
    /// Comma-separated policies: random,dotprod,clustering,packing,bestfit,fgd,egpu.
    #[arg(long, default_value = "random,dotprod,clustering,packing,bestfit,fgd,egpu", value_delimiter = ',', conflicts_with = "elastic")]
    pub policies: Vec<String>,
    /// Number of seeds (1 to 100,000).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=100_000), conflicts_with = "elastic")]
    pub seeds: u64,
    /// First seed (seeds are FIRST, FIRST+1, ...).
    #[arg(long, default_value_t = 42, conflicts_with = "elastic")]
    pub first_seed: u64,
    /// Inflate the workload to this multiple of cluster GPU capacity.
    #[arg(long, default_value_t = 1.3, conflicts_with = "elastic")]
    pub inflation: f64,
    /// Share of pods the FGD/eGPU target workload covers.
    #[arg(long, default_value_t = 0.95, conflicts_with = "elastic")]
    pub coverage: f64,
    /// Give this fraction of GPU pods a GPU-type constraint (synthetic
    /// gpu_spec workload: the GPU type of a random node, plus, half of the
    /// time, the type of another random node; seeded by --first-seed).
    #[arg(long, default_value_t = 0.0, conflicts_with = "elastic")]
    pub gpu_spec_fraction: f64,
    /// Skip malformed rows (counted and reported) instead of failing.
    #[arg(long)]
    pub lenient: bool,
    /// Node order for tie-breaks: `shuffled` (as the published simulator:
    /// node names get a seeded random-permutation prefix) or `name` (the
    /// trace's node names).
    #[arg(long, default_value = "shuffled", value_parser = ["shuffled", "name"], conflicts_with = "elastic")]
    pub node_order: String,
    /// GPU inside the chosen node: `policy` (the GPUs the policy names, as
    /// the Kubernetes device plugin places a pod whose GPU hint it follows)
    /// or `best-fit` (a sharing pod fills the tightest GPU that fits, as the
    /// device plugin places a pod without a hint it can follow).
    #[arg(long, default_value = "policy", value_parser = ["policy", "best-fit"], conflicts_with = "elastic")]
    pub gpu_choice: String,
    /// Worker threads (default: all cores).
    #[arg(long, value_parser = count(1), conflicts_with = "elastic")]
    pub threads: Option<usize>,
    /// Report directory.
    #[arg(long, short = 'o', default_value = "egpu-report")]
    pub out: PathBuf,
    /// No progress bar.
    #[arg(long)]
    pub no_progress: bool,
    /// Run the elastic-sharing evaluation instead: on genai-2026, or on your
    /// own trace with --usage-duty and --usage-memory.
    #[arg(long)]
    pub elastic: bool,
    /// genai-2026 directory (pod_gpu_duty_cycle_anon.csv.gz, pod_gpu_memory_used_bytes_anon.csv.gz).
    #[arg(long, conflicts_with_all = ["usage_duty", "usage_memory"], requires = "elastic")]
    pub genai_dir: Option<PathBuf>,
    /// Elastic on your own workload: each pod's GPU duty cycle over time, as
    /// a CSV (value,timestamp,pod) or the JSON of a Prometheus range query
    /// (e.g. of DCGM_FI_DEV_GPU_UTIL); gzip is fine. Needs --usage-memory.
    #[arg(long, requires_all = ["usage_memory", "elastic"])]
    pub usage_duty: Option<PathBuf>,
    /// Elastic on your own workload: each pod's GPU memory used over time,
    /// same formats (e.g. DCGM_FI_DEV_FB_USED). Needs --usage-duty.
    #[arg(long, requires_all = ["usage_duty", "elastic"])]
    pub usage_memory: Option<PathBuf>,
    /// Sampling step of --usage-duty/--usage-memory, seconds (default: the
    /// median gap between a pod's consecutive samples). The
    /// evaluation's "minutes" are periods of this length.
    #[arg(long, requires = "usage_duty", value_parser = positive_seconds)]
    pub usage_step: Option<f64>,
    /// Unit of --usage-duty: percent, fraction (0..1), or auto (fraction for
    /// DCGM_FI_PROF_GR_ENGINE_ACTIVE / DCGM_FI_PROF_SM_ACTIVE, else percent).
    #[arg(long, default_value = "auto", value_parser = ["auto", "percent", "fraction"], requires = "usage_duty")]
    pub duty_unit: String,
    /// Unit of --usage-memory: bytes, kib, mib, gib, or auto (MiB for
    /// DCGM_FI_DEV_FB_USED, else bytes).
    #[arg(long, default_value = "auto", value_parser = ["auto", "bytes", "kib", "mib", "gib"], requires = "usage_memory")]
    pub memory_unit: String,
    /// Elastic: a pod with no sample for more than this many periods is
    /// taken as gone over the gap, and as a new pod after it (shorter gaps
    /// repeat its last sample); 0 repeats the last sample over any gap.
    #[arg(long, default_value_t = 60, requires = "elastic")]
    pub max_gap: usize,
    /// Elastic: GPU memory sizes to evaluate, GiB (each from 1 to 4096).
    #[arg(long, default_value = "80,96", value_delimiter = ',', value_parser = gpu_gib, allow_negative_numbers = true, requires = "elastic")]
    pub gpu_mem_gib: Vec<f64>,
    /// Elastic: resize slices every N minutes.
    #[arg(long, default_value_t = 1, value_parser = count(1), requires = "elastic")]
    pub resize_every: usize,
    /// Elastic: size memory slices from the last N minutes of usage.
    #[arg(long, default_value_t = 120, value_parser = count(1), requires = "elastic")]
    pub window: usize,
    /// Elastic: headroom over recent peak usage (0.15 = 15%).
    #[arg(long, default_value_t = 0.0, value_parser = non_negative, allow_negative_numbers = true, requires = "elastic")]
    pub headroom: f64,
    /// Elastic: memory added to every slice, GiB.
    #[arg(long, default_value_t = 2.0, value_parser = non_negative, allow_negative_numbers = true, requires = "elastic")]
    pub mem_floor_gib: f64,
    /// Elastic: compute share added to every slice (0.02 = 2% of a GPU).
    #[arg(long, default_value_t = 0.0, value_parser = fraction, allow_negative_numbers = true, requires = "elastic")]
    pub compute_floor: f64,
    /// Elastic: how slices move at a resize: none, evict (move a pod whose
    /// GPU overflows) or repack (also re-pack first-fit-decreasing when that
    /// frees GPUs; every move is counted as a migration).
    #[arg(long, default_value = "repack", value_parser = ["none", "evict", "repack"], requires = "elastic")]
    pub moves: String,
    /// Elastic: size compute shares from this quantile of the window's duty
    /// cycle (1 = its peak; 0 = use the mean instead).
    #[arg(long, default_value_t = 0.8, value_parser = fraction, allow_negative_numbers = true, requires = "elastic")]
    pub compute_quantile: f64,
    /// Elastic: window for compute shares, minutes.
    #[arg(long, default_value = "5", value_parser = count(1), requires = "elastic")]
    pub compute_window: Option<usize>,
    /// Elastic: correlation-aware compute packing: a pod joins a GPU only
    /// if this quantile of the GPU's summed duty over the last
    /// --gpu-risk-window minutes stays within one GPU (0 = off: pack by the
    /// sum of the pods' shares).
    #[arg(long, default_value_t = 1.0, value_parser = fraction, allow_negative_numbers = true, requires = "elastic")]
    pub gpu_risk_quantile: f64,
    /// Elastic: minutes of summed duty the per-GPU check looks at.
    #[arg(long, default_value_t = 5, value_parser = count(1), requires = "elastic")]
    pub gpu_risk_window: usize,
    /// Elastic: headroom for memory only (0.1 = 10%; default 0.1).
    #[arg(long, default_value = "0.1", value_parser = non_negative, allow_negative_numbers = true, requires = "elastic")]
    pub mem_headroom: Option<f64>,
    /// Elastic: adopt a re-pack only when it frees at least this many GPUs.
    #[arg(long, default_value_t = 1, value_parser = count(1), requires = "elastic")]
    pub repack_gain: usize,
    /// Elastic: compute work that a saturated GPU could not give a pod in
    /// its minute: carry (it waits, added to the pod's next minute, until it
    /// is served) or drop (forgotten: the accounting before carrying, kept
    /// for comparison). Every strategy.
    #[arg(long, default_value = "carry", value_parser = ["carry", "drop"], requires = "elastic")]
    pub unserved_compute: String,
    /// Elastic: skip the fixed-fleet strategy (`elastic-fleet`).
    #[arg(long, requires = "elastic")]
    pub no_fleet: bool,
    /// Elastic fleet: evaluate this many GPUs instead of searching for the
    /// smallest fleet within --fleet-budget.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100_000), requires = "elastic", conflicts_with = "no_fleet")]
    pub fleet_gpus: Option<u32>,
    /// Elastic fleet: violation budget, fraction of pod-minutes (0.01 = 1%).
    #[arg(long, default_value_t = 0.01, value_parser = fraction, allow_negative_numbers = true, requires = "elastic", conflicts_with = "no_fleet")]
    pub fleet_budget: f64,
    /// Elastic fleet: base memory = peak of this many past minutes …
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=100_000), requires = "elastic", conflicts_with = "no_fleet")]
    pub fleet_mem_window: u32,
    /// Elastic fleet: … × (1 + this) …
    #[arg(long, default_value_t = 0.0, value_parser = non_negative, allow_negative_numbers = true, requires = "elastic", conflicts_with = "no_fleet")]
    pub fleet_mem_headroom: f64,
    /// Elastic fleet: … + this many GiB.
    #[arg(long, default_value_t = 0.0, value_parser = non_negative, allow_negative_numbers = true, requires = "elastic", conflicts_with = "no_fleet")]
    pub fleet_mem_floor_gib: f64,
    /// Elastic fleet: base compute share = this quantile (0 < q ≤ 1; 1 = peak) …
    #[arg(long, default_value_t = 0.5, value_parser = positive_fraction, allow_negative_numbers = true, requires = "elastic", conflicts_with = "no_fleet")]
    pub fleet_compute_quantile: f64,
    /// Elastic fleet: … of this many past minutes of duty.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=100_000), requires = "elastic", conflicts_with = "no_fleet")]
    pub fleet_compute_window: u32,
    /// Elastic fleet: the pods' compute shares on a GPU, and how its spare
    /// memory goes to them with --fleet-memory split: even (every pod the
    /// same compute share, 1 ÷ the GPU's pods; memory spare equally),
    /// equal (base plus an equal part of the spare), base (the spare in
    /// proportion to the base slice), volatility (to the largest recent
    /// one-minute rise) or reach (first what brings each pod back to its
    /// peak of the last --fleet-vol-window minutes, then equally).
    #[arg(long, default_value = "even", value_parser = ["even", "equal", "base", "volatility", "reach"], requires = "elastic", conflicts_with = "no_fleet")]
    pub fleet_share: String,
    /// Elastic fleet: memory above the base slices is a burst pool per GPU
    /// (burst: a pod borrows on demand what no base slice reserved, as
    /// `egpu create --gpu-memory-burst` does, and a minute whose borrows
    /// exceed the pool counts every borrower as refused; burst-first-come:
    /// the same pool, but borrowers are served in a seeded random order and
    /// only those that no longer fit count) or is split into fixed per-pod
    /// limits by --fleet-share (split).
    #[arg(long, default_value = "burst", value_parser = ["burst", "burst-first-come", "split"], requires = "elastic", conflicts_with = "no_fleet")]
    pub fleet_memory: String,
    /// Elastic fleet: minutes of history for --fleet-share volatility.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u32).range(1..=100_000), requires = "elastic", conflicts_with = "no_fleet")]
    pub fleet_vol_window: u32,
    /// Elastic fleet: at most this many rebalancing moves per resize (from
    /// the GPU with the least spare memory to the one with the most) …
    #[arg(long, default_value_t = 0, value_parser = count(0), requires = "elastic", conflicts_with = "no_fleet")]
    pub fleet_rebalance: usize,
    /// Elastic fleet: … while the least spare memory is below this, GiB.
    #[arg(long, default_value_t = 0.0, value_parser = non_negative, allow_negative_numbers = true, requires = "elastic", conflicts_with = "no_fleet")]
    pub fleet_min_spare_gib: f64,
    /// Elastic fleet: compute-risk window, minutes (0 = off): a GPU's risk
    /// is how many of these past minutes its pods' summed duty exceeded
    /// 100%; placement prefers GPUs with little risk.
    #[arg(long, default_value_t = 0, value_parser = count(0), requires = "elastic", conflicts_with = "no_fleet")]
    pub fleet_risk_window: usize,
    /// Elastic fleet: weight of the risk (saturated fraction of the window)
    /// against the room left (fraction of a GPU) when placing a pod.
    #[arg(long, default_value_t = 1.0, value_parser = non_negative, allow_negative_numbers = true, requires = "elastic", conflicts_with = "no_fleet")]
    pub fleet_risk_weight: f64,
    /// Elastic fleet: at most this many moves per resize off the riskiest
    /// GPU, each only if it lowers the summed risk.
    #[arg(long, default_value_t = 0, value_parser = count(0), requires = "elastic", conflicts_with = "no_fleet")]
    pub fleet_risk_moves: usize,
    /// Elastic fleet: also evaluate the same fleet with every pod held on
    /// one GPU chosen knowing the whole trace (`fleet-hindsight-static`, a
    /// reference for what placement alone can buy, not a policy; slower).
    #[arg(long, requires = "elastic", conflicts_with = "no_fleet")]
    pub fleet_hindsight: bool,
    /// Elastic fleet: also evaluate the same fleet re-placed every MINUTES
    /// knowing the next MINUTES of usage exactly (`fleet-foresight`, a
    /// reference for how far ahead a placement must see, not a policy).
    #[arg(long, value_name = "MINUTES", value_parser = count(1), requires = "elastic", conflicts_with = "no_fleet")]
    pub fleet_foresight: Option<usize>,
    /// Elastic fleet: the foresight reference knows each pod's levels in
    /// the coming minutes but not their timing (its samples shuffled within
    /// each window, seeded; `fleet-foresight-shuffled`): what a forecaster
    /// of levels alone would buy.
    #[arg(long, requires = "elastic", requires = "fleet_foresight", conflicts_with = "no_fleet")]
    pub fleet_foresight_shuffled: bool,
    /// Elastic fleet: … the shuffled foresight plans against this many
    /// draws of the shuffle at once (their mean cost; 1 to 64, each a copy
    /// of the trace), so that it plans for each pod's levels, not for one
    /// draw's chance coincidences.
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=64), requires = "elastic", requires = "fleet_foresight_shuffled", conflicts_with = "no_fleet")]
    pub fleet_foresight_draws: usize,
    /// Elastic fleet: every this many minutes (0 = never), re-place the
    /// pods with the foresight planner fed the last --fleet-replan-lookback
    /// minutes, as if they would repeat (an online policy).
    #[arg(long, value_name = "MINUTES", default_value_t = 0, value_parser = count(0), requires = "elastic", conflicts_with = "no_fleet")]
    pub fleet_replan: usize,
    /// Elastic fleet: … the minutes of history that re-planning looks at.
    #[arg(long, value_name = "MINUTES", default_value_t = 240, value_parser = count(1), requires = "elastic", conflicts_with = "no_fleet")]
    pub fleet_replan_lookback: usize,
}

/// A whole number from `min` to 100,000 (minutes, moves, threads).
fn count(min: u64) -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::<usize>::new().range(min..=100_000)
}

/// A GPU memory size, GiB: from 1 to 4096.
fn gpu_gib(s: &str) -> Result<f64, String> {
    number(s).and_then(|v| if (1.0..=4096.0).contains(&v) { Ok(v) } else { Err(format!("{v} GiB is not a GPU memory size from 1 to 4096 GiB")) })
}

fn number(s: &str) -> Result<f64, String> {
    s.parse::<f64>().ok().filter(|v| v.is_finite()).ok_or_else(|| format!("'{s}' is not a finite number"))
}

fn non_negative(s: &str) -> Result<f64, String> {
    number(s).and_then(|v| if v >= 0.0 { Ok(v) } else { Err(format!("{v} is negative")) })
}

fn fraction(s: &str) -> Result<f64, String> {
    number(s).and_then(|v| if (0.0..=1.0).contains(&v) { Ok(v) } else { Err(format!("{v} is not between 0 and 1")) })
}

fn positive_fraction(s: &str) -> Result<f64, String> {
    fraction(s).and_then(|v| if v > 0.0 { Ok(v) } else { Err("must be above 0".into()) })
}

/// A bad flag, flag value or combination of flags: `egpu` exits 2 for
/// it (`docs/cli.md`), where other failures exit 1.
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// Return a [`UsageError`] with this message.
macro_rules! usage {
    ($($t:tt)*) => {
        return Err(anyhow::Error::new(UsageError(format!($($t)*))))
    };
}

/// Print to standard output; a reader that went away (`| head`) is no
/// error, since the report is already written.
fn say(text: &str) -> Result<()> {
    use std::io::Write;
    match writeln!(std::io::stdout().lock(), "{text}") {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r.context("writing to standard output"),
    }
}

/// Make the report directory before the run, so that a bad `--out` fails
/// at once (a file, a broken link, a directory it cannot write, a report
/// name taken by a directory), and refuse to write a report file over one
/// of the inputs (by file identity: a symbolic or hard link is caught too).
fn prepare_out(out: &Path, inputs: &[&Path], writes: &[String]) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    if out.symlink_metadata().is_ok() && !out.exists() {
        usage!("--out {} is a broken symbolic link: point it at a directory, or name another", out.display());
    }
    if out.exists() && !out.is_dir() {
        usage!("--out {} is a file: name a directory for the report", out.display());
    }
    std::fs::create_dir_all(out).with_context(|| format!("cannot create the report directory {}", out.display()))?;
    let id = |p: &Path| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
    let inputs: Vec<(&Path, (u64, u64))> = inputs.iter().filter_map(|p| id(p).map(|i| (*p, i))).collect();
    for name in writes {
        let target = out.join(name);
        if target.is_dir() {
            usage!("{} is a directory, where the report writes its {name}: choose another --out", target.display());
        }
        if let Some((input, _)) = id(&target).and_then(|t| inputs.iter().find(|(_, i)| *i == t)) {
            usage!("the report would overwrite the input {} (its {name}): choose another --out", input.display());
        }
    }
    // Can the report be written there at all?
    let probe = out.join(format!(".egpu-write-check-{}", std::process::id()));
    std::fs::write(&probe, b"").with_context(|| format!("cannot write in the report directory {}: choose another --out", out.display()))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// The flags of `egpu simulate`, checked: clap's derive checks every
/// `requires` except one whose required flag conflicts with a flag that is
/// present (clap counts such a flag as rightly missing), so
/// `--gpu-mem-gib 80 --seeds 1` would run the placement simulator and drop
/// `--gpu-mem-gib` unseen, and `--elastic --genai-dir D --duty-unit
/// percent` would drop `--duty-unit`. Parsing this type refuses both, as
/// clap refuses the same flag alone.
#[derive(Debug, Clone)]
pub struct SimulateArgs(pub SimulateFlags);

impl std::ops::Deref for SimulateArgs {
    type Target = SimulateFlags;
    fn deref(&self) -> &SimulateFlags {
        &self.0
    }
}

/// Flags both modes take; every other flag belongs to one mode: those
/// that conflict with `--elastic` to the placement simulator, the rest to
/// the elastic evaluation.
const SHARED_FLAGS: [&str; 4] = ["lenient", "out", "no_progress", "elastic"];
/// Flags that read one usage file, and the flag that names it.
const USAGE_FILE_FLAGS: [(&str, &str); 3] = [("usage_step", "usage_duty"), ("duty_unit", "usage_duty"), ("memory_unit", "usage_memory")];

fn check_modes(m: &clap::ArgMatches) -> Result<(), clap::Error> {
    use clap::error::ErrorKind;
    let given = |id: &str| m.try_contains_id(id).unwrap_or(false) && m.value_source(id) == Some(clap::parser::ValueSource::CommandLine);
    let flag = |id: &str| format!("--{}", id.replace('_', "-"));
    if !m.get_flag("elastic") {
        let cmd = <SimulateFlags as clap::Args>::augment_args(clap::Command::new("simulate"));
        let placement: Vec<&str> = cmd.get_arguments().filter(|a| cmd.get_arg_conflicts_with(a).iter().any(|c| c.get_id() == "elastic")).map(|a| a.get_id().as_str()).collect();
        if let Some(a) = cmd.get_arguments().map(|a| a.get_id().as_str()).find(|id| !SHARED_FLAGS.contains(id) && !placement.contains(id) && given(id)) {
            return Err(clap::Error::raw(ErrorKind::MissingRequiredArgument, format!("{} is a flag of the elastic evaluation: add --elastic, or leave it out to run the placement simulator", flag(a))));
        }
    }
    // --pod-list names the file itself, so --trace would be dropped unseen.
    if given("trace") && given("pod_list") {
        return Err(clap::Error::raw(ErrorKind::ArgumentConflict, "--trace names a pod list inside --trace-dir, and --pod-list names the file itself: give one of them"));
    }
    for (id, file) in USAGE_FILE_FLAGS {
        if given(id) && !given(file) {
            return Err(clap::Error::raw(ErrorKind::MissingRequiredArgument, format!("{} reads your own usage files: it needs {} (with --genai-dir, or neither, it has nothing to apply to)", flag(id), flag(file))));
        }
    }
    Ok(())
}

impl clap::FromArgMatches for SimulateArgs {
    fn from_arg_matches(m: &clap::ArgMatches) -> Result<Self, clap::Error> {
        check_modes(m)?;
        SimulateFlags::from_arg_matches(m).map(SimulateArgs)
    }
    /// An update's matches hold only the flags it changes, so the modes
    /// (which need the whole command line) are not checked here.
    fn update_from_arg_matches(&mut self, m: &clap::ArgMatches) -> Result<(), clap::Error> {
        self.0.update_from_arg_matches(m)
    }
}

impl clap::Args for SimulateArgs {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        SimulateFlags::augment_args(cmd)
    }
    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        SimulateFlags::augment_args_for_update(cmd)
    }
}

/// Run `egpu simulate`.
pub fn run(args: SimulateArgs) -> Result<()> {
    let args = args.0;
    if args.elastic {
        return run_elastic(&args);
    }
    if !(1.0..=10.0).contains(&args.inflation) {
        usage!("--inflation must be between 1 and 10 (the FGD methodology uses 1.3): the summary reads allocation at 100% of capacity arrived, which arrivals must reach");
    }
    if !(0.0..=1.0).contains(&args.gpu_spec_fraction) || !(0.0..=1.0).contains(&args.coverage) {
        usage!("--gpu-spec-fraction and --coverage must be between 0 and 1");
    }
    let mut policies: Vec<PolicyKind> = Vec::new();
    for p in &args.policies {
        let Some(k) = PolicyKind::parse(p) else { usage!("unknown policy '{p}' in --policies: use random, dotprod, clustering, packing, bestfit, fgd or egpu") };
        if policies.contains(&k) {
            usage!("policy '{p}' is listed twice in --policies: list each once (--seeds sets the runs per policy)");
        }
        policies.push(k);
    }
    let shuffle_nodes = args.node_order == "shuffled";
    let Some(last_seed) = args.first_seed.checked_add(args.seeds - 1) else {
        usage!("--first-seed {} with --seeds {} runs past the largest seed ({}): start lower", args.first_seed, args.seeds, u64::MAX);
    };
    if args.trace_dir.is_none() && args.pod_list.is_none() && args.trace != "default" {
        usage!("--trace {} needs --trace-dir: only the default trace is embedded (pass the directory holding openb_pod_list_{}.csv, or --pod-list with the file)", args.trace, args.trace);
    }
    let (t, source, left_out) = load_trace(&args)?;
    let inputs: Vec<PathBuf> = [node_file(&args), pod_file(&args)].into_iter().flatten().collect();
    prepare_out(&args.out, &inputs.iter().map(PathBuf::as_path).collect::<Vec<_>>(), &report::FILES.map(String::from))?;
    let seeds: Vec<u64> = (args.first_seed..=last_seed).collect();
    let threads = args.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let total = (policies.len() * seeds.len()) as u64;
    let bar = if args.no_progress { ProgressBar::hidden() } else { ProgressBar::new(total) };
    bar.set_style(ProgressStyle::with_template("{bar:40} {pos}/{len} runs {elapsed} {msg}").unwrap_or_else(|_| ProgressStyle::default_bar()));
    eprintln!("simulating {} pods on {} nodes ({} GPUs), {} policies x {} seeds, {} threads", t.pods.len(), t.cluster.nodes().len(), t.cluster.gpu_count(), policies.len(), seeds.len(), threads);
    let start = Instant::now();
    let runs = sweep::run(&Sweep { trace: &t, policies: &policies, seeds: &seeds, inflation: args.inflation, threads, shuffle_nodes, best_fit_inside: args.gpu_choice == "best-fit" }, &|r| {
        bar.set_message(format!("{} seed {}", r.policy, r.seed));
        bar.inc(1);
    });
    bar.finish_and_clear();
    let elapsed = start.elapsed().as_secs_f64();
    if let Some(bad) = runs.iter().find(|r| r.invalid > 0) {
        bail!("policy {} returned {} placements the cluster refused: this is a bug, please report it", bad.policy, bad.invalid);
    }
    let summary = report::write_all(&args.out, &t.name, &source, args.inflation, elapsed, left_out, &runs).context("writing the report")?;
    say(&format!("{}\n{} runs in {elapsed:.1} s; report in {}", report::summary_table(&t.name, &summary), runs.len(), args.out.display()))
}

/// A trace file's text: plain or gzip; with `lenient`, lines that are not
/// UTF-8 are skipped (said, and counted in the second value), else they
/// are an error naming the line.
fn read(path: &Path, lenient: bool) -> Result<(String, usize)> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let (text, bad) = crate::text::decode(&bytes, lenient).map_err(|(line, msg)| trace::TraceError { file: path.display().to_string(), line, msg })?;
    if bad > 0 {
        eprintln!("warning: {}: {bad} lines that are not UTF-8 text skipped", path.display());
    }
    Ok((text, bad))
}

/// The node list file to read: `--node-list`, else the one in
/// `--trace-dir`; `None` for the embedded one.
fn node_file(args: &SimulateFlags) -> Option<PathBuf> {
    args.node_list.clone().or_else(|| args.trace_dir.as_ref().map(|d| d.join("openb_node_list_gpu_node.csv")))
}

/// The pod list file to read: `--pod-list`, else `--trace`'s in
/// `--trace-dir`; `None` for the embedded default.
fn pod_file(args: &SimulateFlags) -> Option<PathBuf> {
    args.pod_list.clone().or_else(|| args.trace_dir.as_ref().map(|d| d.join(format!("openb_pod_list_{}.csv", args.trace))))
}

/// The trace, how the report names its source, and what `--lenient` left out of it.
fn load_trace(args: &SimulateFlags) -> Result<(Trace, String, report::LeftOut)> {
    let mut left_out = report::LeftOut::default();
    let (nodes_name, nodes_text) = match node_file(args) {
        Some(p) => {
            let (text, bad) = read(&p, args.lenient)?;
            left_out.non_utf8_lines += bad;
            (p.display().to_string(), text)
        }
        None => ("embedded openb_node_list_gpu_node.csv".to_string(), data::OPENB_NODES.to_string()),
    };
    let (pods_name, pods_text, name) = match pod_file(args) {
        Some(p) => {
            // A file of your own is named by its stem, one of --trace-dir by --trace.
            let name = if args.pod_list.is_some() { p.file_stem().map_or("pods".into(), |s| s.to_string_lossy().into_owned()) } else { args.trace.clone() };
            let (text, bad) = read(&p, args.lenient)?;
            left_out.non_utf8_lines += bad;
            (p.display().to_string(), text, name)
        }
        None => {
            // `run` refuses another --trace without --trace-dir.
            debug_assert_eq!(args.trace, "default");
            ("embedded openb_pod_list_default.csv".to_string(), data::OPENB_DEFAULT_PODS.to_string(), "default".to_string())
        }
    };
    let (cluster, skipped_nodes) = trace::load_nodes(&nodes_name, &nodes_text, args.lenient)?;
    let (mut pods, skipped_pods) = trace::load_pods(&pods_name, &pods_text, &cluster, args.lenient)?;
    (left_out.node_rows, left_out.pod_rows) = (skipped_nodes.count, skipped_pods.count);
    for s in [skipped_nodes, skipped_pods] {
        if s.count > 0 {
            eprintln!("warning: {s}");
        }
    }
    if !pods.iter().any(|p| p.pod.gpu_count() > 0) {
        let why = if pods.is_empty() { "no pods" } else { "no pod that asks for a GPU" };
        let skipped = if left_out.pod_rows > 0 { format!(" ({} rows skipped)", left_out.pod_rows) } else { String::new() };
        bail!("{pods_name}: {why}{skipped}: the simulation fills the cluster's GPUs with the pod list's GPU pods, so it needs at least one");
    }
    let mut name = name;
    if args.gpu_spec_fraction > 0.0 {
        let n = crate::gpuspec::constrain(&cluster, &mut pods, args.gpu_spec_fraction, args.first_seed);
        eprintln!("gave {n} GPU pods a GPU-type constraint");
        name = format!("{name}+gpuspec{:.0}", 100.0 * args.gpu_spec_fraction);
    }
    let source = if args.trace_dir.is_none() && args.pod_list.is_none() { data::ATTRIBUTION.to_string() } else { format!("{pods_name} on {nodes_name}") };
    Ok((Trace::new(name, cluster, pods, args.coverage), source, left_out))
}

fn positive_seconds(s: &str) -> std::result::Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x.is_finite() && x >= 1.0 => Ok(x),
        _ => Err(format!("'{s}' is not a number of seconds of at least 1")),
    }
}

fn default_genai_dir() -> Option<PathBuf> {
    let candidates = [PathBuf::from("../shared/data/genai-2026"), PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/data/genai-2026"))];
    candidates.into_iter().find(|p| p.is_dir())
}

/// Read one usage file (CSV or Prometheus JSON, gzip or not).
fn read_usage(path: &Path, lenient: bool) -> Result<elastic::load::Metric> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let name = path.display().to_string();
    let (text, bad) = elastic::load::decode(&name, &bytes, lenient)?;
    let mut m = elastic::load::parse_usage_file(&name, &text, lenient)?;
    m.skipped += bad;
    if m.skipped > 0 {
        eprintln!("warning: {name}: {} rows or samples skipped", m.skipped);
    }
    if m.series_without_pod > 0 {
        eprintln!("note: {name}: {} series without a pod (GPUs no pod holds) left out", m.series_without_pod);
    }
    Ok(m)
}

/// The pods `a` names and `b` does not, sorted, once each.
fn only<'a>(a: &'a [elastic::load::Sample], b: &[elastic::load::Sample]) -> Vec<&'a str> {
    let names: std::collections::HashSet<&str> = b.iter().map(|s| s.0.as_str()).collect();
    let mut missing: Vec<&str> = a.iter().map(|s| s.0.as_str()).filter(|p| !names.contains(p)).collect();
    missing.sort_unstable();
    missing.dedup();
    missing
}

/// The trace to evaluate, and how the report names it: genai-2026, or
/// your own duty and memory files converted to percent and bytes.
fn load_usage(args: &SimulateFlags) -> Result<(elastic::Usage, String)> {
    if let (Some(dp), Some(mp)) = (&args.usage_duty, &args.usage_memory) {
        let (d, m) = (read_usage(dp, args.lenient)?, read_usage(mp, args.lenient)?);
        let skipped_rows = d.skipped + m.skipped;
        let named = |m: &elastic::load::Metric, names: &[&str]| m.name.as_deref().is_some_and(|n| names.contains(&n));
        let to_percent = match args.duty_unit.as_str() {
            "fraction" => 100.0,
            "auto" if named(&d, &["DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_SM_ACTIVE"]) => 100.0,
            _ => 1.0,
        };
        let to_bytes = match args.memory_unit.as_str() {
            "kib" => 1024.0,
            "mib" => 1024.0 * 1024.0,
            "gib" => 1024.0 * 1024.0 * 1024.0,
            "auto" if named(&m, &["DCGM_FI_DEV_FB_USED"]) => 1024.0 * 1024.0,
            _ => 1.0,
        };
        for (file, metric) in [(dp, &d), (mp, &m)] {
            if metric.samples.is_empty() {
                bail!("{}: no samples{}", file.display(), if metric.series_without_pod > 0 { format!(" ({} series, none with a pod)", metric.series_without_pod) } else { String::new() });
            }
        }
        // A duty cycle above 100% is another metric or another unit.
        if let Some((p, t, v)) = d.samples.iter().find(|s| s.2 * to_percent > 100.5) {
            let (read, other) = if to_percent == 1.0 { (format!("{v} read as percent"), "fraction") } else { (format!("{v} read as a fraction of 1"), "percent") };
            bail!("{}: pod {p} at time {t}: duty cycle {read} is above 100%: pass --duty-unit {other} if that is the file's unit, else the file holds another metric", dp.display());
        }
        if to_percent == 1.0 && d.samples.iter().all(|s| s.2 <= 1.0) && d.samples.iter().any(|s| s.2 > 0.0) {
            eprintln!("warning: {}: every duty cycle is at most 1 (%): if they are fractions of 1, pass --duty-unit fraction", dp.display());
        }
        if to_bytes == 1.0 && m.samples.iter().all(|s| s.2 < 1024.0 * 1024.0) && m.samples.iter().any(|s| s.2 > 0.0) {
            eprintln!("warning: {}: every memory value is under 1 MiB read as bytes: if they are MiB (as DCGM_FI_DEV_FB_USED), pass --memory-unit mib", mp.display());
        }
        let scale = |v: Vec<(String, f64, f64)>, k: f64| -> Vec<(String, f64, f64)> { v.into_iter().map(|(p, t, x)| (p, t, x * k)).collect() };
        let (mut duty, mut mem) = (scale(d.samples, to_percent), scale(m.samples, to_bytes));
        // A pod in one file only is most often a naming mismatch (a label
        // on one metric only), which would split one pod in two.
        // With --lenient such pods are skipped, not evaluated with the
        // missing metric as 0 (a pod that is not there would add a GPU to
        // the exclusive baseline and to every saving).
        let mut skip: std::collections::HashSet<String> = std::collections::HashSet::new();
        for (what, list) in [("a duty cycle but no memory", only(&duty, &mem)), ("memory but no duty cycle", only(&mem, &duty))] {
            if !list.is_empty() {
                let msg = format!("{} pods have {what} samples, e.g. {}: both files must name a pod the same way", list.len(), list[..list.len().min(3)].join(", "));
                if !args.lenient {
                    bail!("{msg} (its missing metric would count as 0); pass --lenient to skip them");
                }
                eprintln!("warning: {msg}; skipped (--lenient)");
                skip.extend(list.into_iter().map(str::to_string));
            }
        }
        if !skip.is_empty() {
            duty.retain(|s| !skip.contains(&s.0));
            mem.retain(|s| !skip.contains(&s.0));
        }
        if !skip.is_empty() && (duty.is_empty() || mem.is_empty()) {
            bail!("no pod is named the same way in {} and {}: every pod was skipped (see the warnings above)", dp.display(), mp.display());
        }
        let mut usage = elastic::load::align_with(&duty, &mem, args.usage_step, elastic::load::MAX_CELLS);
        if usage.pods.is_empty() {
            bail!("no usage samples in {} and {}", dp.display(), mp.display());
        }
        usage.left_out.rows_or_samples = skipped_rows;
        usage.left_out.pods_in_one_file = skip.len();
        return Ok((usage, format!("your trace ({}, {})", dp.display(), mp.display())));
    }
    let dir = match &args.genai_dir {
        Some(d) => d.clone(),
        None => default_genai_dir().context("genai-2026 not found: pass --genai-dir <DIR> (it holds pod_gpu_duty_cycle_anon.csv.gz and pod_gpu_memory_used_bytes_anon.csv.gz), or your own trace with --usage-duty and --usage-memory")?,
    };
    let duty = read_usage(&dir.join("pod_gpu_duty_cycle_anon.csv.gz"), args.lenient)?;
    let mem = read_usage(&dir.join("pod_gpu_memory_used_bytes_anon.csv.gz"), args.lenient)?;
    // As for your own files, a pod that only one file names is left out (its
    // missing metric would count as 0): genai-2026 has one, a single
    // 0-byte memory sample, which the trace's 143 pods do not count.
    let (mut d, mut m) = (duty.samples, mem.samples);
    let one_file: std::collections::HashSet<String> = only(&d, &m).into_iter().chain(only(&m, &d)).map(str::to_string).collect();
    d.retain(|s| !one_file.contains(&s.0));
    m.retain(|s| !one_file.contains(&s.0));
    let mut usage = elastic::load::align(&d, &m);
    if usage.pods.is_empty() {
        bail!("no usage rows in {}", dir.display());
    }
    usage.left_out.rows_or_samples = duty.skipped + mem.skipped;
    usage.left_out.pods_in_one_file = one_file.len();
    Ok((usage, "genai-2026 (Alibaba clusterdata, CC BY 4.0)".to_string()))
}

fn run_elastic(args: &SimulateFlags) -> Result<()> {
    if let Some(g) = args.gpu_mem_gib.iter().enumerate().find_map(|(i, g)| args.gpu_mem_gib[..i].contains(g).then_some(g)) {
        usage!("--gpu-mem-gib lists {g} twice: list each GPU size once");
    }
    let (mut usage, source) = load_usage(args)?;
    if usage.dropped_samples > 0 {
        let what = format!(
            "{} pods × {}-second periods from the first timestamp ({}) to the last ({}) is more than {} cells or {} periods: {} samples past period {} would be left out",
            usage.pods.len(),
            usage.step_s,
            elastic::load::short(usage.first_s),
            elastic::load::short(usage.last_s),
            elastic::load::MAX_CELLS,
            elastic::load::MAX_PERIODS,
            usage.dropped_samples,
            usage.minutes
        );
        if !args.lenient {
            bail!("{what}; check for a stray timestamp, shorten the trace, or give a longer --usage-step (or pass --lenient to use the first {} periods)", usage.minutes);
        }
        eprintln!("warning: {what}");
        usage.left_out.samples_past_grid = usage.dropped_samples;
    }
    let absences = usage.split_absences(args.max_gap);
    if absences > 0 && usage.pods.len().saturating_mul(usage.minutes) > elastic::load::MAX_CELLS {
        usage!(
            "cutting the pods at their {absences} absences longer than --max-gap {} periods makes {} pods × {} periods, more than {} cells: give a larger --max-gap, or 0 to fill every gap",
            args.max_gap,
            usage.pods.len(),
            usage.minutes,
            elastic::load::MAX_CELLS
        );
    }
    // The shuffled foresight holds one copy of the trace per draw: no more
    // cells in all than the grid itself may have.
    let cells = usage.pods.len().max(1) * usage.minutes.max(1);
    if args.fleet_foresight_shuffled && args.fleet_foresight_draws * cells > elastic::load::MAX_CELLS {
        usage!(
            "--fleet-foresight-draws {} would hold {} shuffled copies of a trace of {} pods × {} periods ({} cells), more than {} cells in all: give at most {} draws",
            args.fleet_foresight_draws,
            args.fleet_foresight_draws,
            usage.pods.len(),
            usage.minutes,
            cells,
            elastic::load::MAX_CELLS,
            elastic::load::MAX_CELLS / cells
        );
    }
    // A pod bigger than a GPU fits no slice on it (its excess is refused
    // memory in every strategy); often a wrong --memory-unit.
    let peak: Vec<(usize, f32)> = usage.mem.iter().enumerate().map(|(i, m)| (i, m.iter().copied().filter(|x| !x.is_nan()).fold(0.0, f32::max))).collect();
    for &g in &args.gpu_mem_gib {
        let big: Vec<&(usize, f32)> = peak.iter().filter(|p| f64::from(p.1) > g * (1u64 << 30) as f64).collect();
        if let Some(&&(i, m)) = big.iter().max_by(|a, b| a.1.total_cmp(&b.1)) {
            eprintln!("warning: {} pods use more memory than a {g} GiB GPU (the most: {}, {:.1} GiB); their excess counts as refused in every strategy", big.len(), usage.pods[i], f64::from(m) / (1u64 << 30) as f64);
        }
    }
    let moves = match args.moves.as_str() {
        "none" => elastic::Moves::None,
        "evict" => elastic::Moves::Evict,
        _ => elastic::Moves::Repack,
    };
    let inputs: Vec<&Path> = [&args.usage_duty, &args.usage_memory].into_iter().flatten().map(PathBuf::as_path).collect();
    let writes: Vec<String> = ["elastic.md".to_string(), "elastic.json".to_string()].into_iter().chain(args.gpu_mem_gib.iter().flat_map(|g| [elastic::chart_file(*g), elastic::fleet_chart_file(*g)])).collect();
    prepare_out(&args.out, &inputs, &writes)?;
    // One setting for every strategy, the fleet's included.
    let carry_unserved = args.unserved_compute == "carry";
    let fleet = (!args.no_fleet).then(|| elastic::FleetConfig {
        mem_window: args.fleet_mem_window as usize,
        mem_headroom: args.fleet_mem_headroom,
        mem_floor_gib: args.fleet_mem_floor_gib,
        compute_quantile: args.fleet_compute_quantile,
        compute_window: args.fleet_compute_window as usize,
        share: elastic::Share::parse(&args.fleet_share).unwrap_or(elastic::Share::Even),
        burst: args.fleet_memory != "split",
        first_come: args.fleet_memory == "burst-first-come",
        vol_window: args.fleet_vol_window as usize,
        min_spare_gib: args.fleet_min_spare_gib,
        rebalance: args.fleet_rebalance,
        risk_window: args.fleet_risk_window,
        risk_weight: args.fleet_risk_weight,
        risk_moves: args.fleet_risk_moves,
        budget: args.fleet_budget,
        gpus: args.fleet_gpus.map(|n| n as usize),
        hindsight: args.fleet_hindsight,
        foresight: args.fleet_foresight,
        foresight_shuffled: args.fleet_foresight_shuffled,
        foresight_draws: args.fleet_foresight_draws,
        replan: args.fleet_replan,
        replan_lookback: args.fleet_replan_lookback,
        carry_unserved,
    });
    // Long traces take minutes: a line says what is being evaluated.
    let bar = if args.no_progress { ProgressBar::hidden() } else { ProgressBar::new_spinner() };
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    let note = |what: &str| bar.set_message(what.to_string());
    let evals: Vec<_> = args
        .gpu_mem_gib
        .iter()
        .map(|&g| elastic::evaluate_with(&usage, ElasticConfig { gpu_mem_gib: g, resize_every: args.resize_every, window: args.window, headroom: args.headroom, compute_floor: args.compute_floor, mem_floor_gib: args.mem_floor_gib, moves, compute_quantile: (args.compute_quantile > 0.0).then_some(args.compute_quantile), compute_window: args.compute_window, gpu_risk: (args.gpu_risk_quantile > 0.0).then_some(elastic::GpuRisk { window: args.gpu_risk_window, quantile: args.gpu_risk_quantile }), repack_gain: args.repack_gain, mem_headroom: args.mem_headroom, fleet, carry_unserved }, &note))
        .collect();
    bar.finish_and_clear();
    let md = elastic::write_report(&args.out, &source, &evals).context("writing the elastic report")?;
    say(&format!("{md}\nreport in {}", args.out.display()))
}
