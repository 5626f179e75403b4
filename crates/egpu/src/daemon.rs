//! `egpud` flags and their mapping onto [`egpu_node::NodeConfig`].

use clap::Parser;
use egpu_node::config::{DEFAULT_RUN_DIR, DEFAULT_STATE_DIR};
use egpu_node::NodeConfig;
use std::path::{Path, PathBuf};

#[derive(Debug, Parser)]
#[command(name = "egpud", version, about = "eGPU node agent: owns this machine's GPU slices and serves the egpu API on a unix socket")]
pub struct DaemonArgs {
    /// Directory for slice tables, the socket and the lock (shared with workloads).
    #[arg(long, default_value = DEFAULT_RUN_DIR)]
    pub run_dir: PathBuf,
    /// Directory of the persistent slice store.
    #[arg(long, default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// Socket to serve on [default: <run-dir>/egpud.sock].
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Use simulated GPUs instead of NVML's, e.g. 2x16GiB or 8xH100-80GB.
    #[arg(long, value_name = "SPEC", value_parser = sim_spec)]
    pub simulate: Option<String>,
    /// The interposer preloaded into workloads [default: libegpu.so next to egpud].
    #[arg(long)]
    pub hook_lib: Option<PathBuf>,
    /// The simulated driver [default: libegpu_simgpu.so next to egpud].
    #[arg(long)]
    pub sim_lib: Option<PathBuf>,
    /// Log filter: error, warn, info, debug, trace (or a tracing EnvFilter).
    #[arg(long, default_value = "info", env = "EGPU_LOG", value_parser = log_filter)]
    pub log: String,
    /// Serve Prometheus metrics over HTTP at ADDR (e.g. 127.0.0.1:9400; port 0 picks a free one).
    /// The bound address is logged and written to <run-dir>/metrics.addr.
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Keep a Container Device Interface spec per slice in DIR (usually
    /// /var/run/cdi), so that container runtimes put a container into a slice
    /// with `--device egpu.io/slice=NAME` (see docs/containers.md).
    #[arg(long, value_name = "DIR")]
    pub cdi_dir: Option<PathBuf>,
    /// The check a slice's CDI spec runs before a container starts [default: egpu-cdi-hook next to egpud].
    #[arg(long, value_name = "PATH")]
    pub cdi_hook: Option<PathBuf>,
    /// Once a second, compare what the driver says each slice's processes
    /// hold with what they were charged: off; report (listings, metrics,
    /// log); or charge, which also counts untracked memory against the
    /// slice's limit (see docs/node.md, "Memory audit").
    #[arg(long, value_name = "MODE", default_value = "report", value_parser = parse_audit)]
    pub memory_audit: egpu_node::audit::AuditMode,
    /// What the driver may hold per slice device beyond the charges before
    /// the memory audit counts it (page rounding), e.g. 64MiB.
    #[arg(long, value_name = "BYTES", default_value = "64MiB", value_parser = parse_slack)]
    pub memory_audit_slack: egpu_core::Bytes,
    /// Start even where the run directory holds live slices the store has
    /// no record of (after moving a damaged store aside, or to drop slices
    /// of another state directory): they are marked deleted, so their
    /// processes can allocate no more, and removed once none is attached.
    /// Without it egpud refuses to start and names them.
    #[arg(long)]
    pub drop_unstored_slices: bool,
    /// Start even where the run directory holds live slices the store has
    /// no record of, taking each back from the spec its limits file
    /// publishes (when the store lost them: a damaged store rolled back
    /// past their creation). They come back under their names, with new
    /// ids, as persistent slices (a slice of `egpu run` included: remove it
    /// when its program is done), and their processes keep running in them.
    /// All or nothing: where one cannot be taken back (a table of an older
    /// egpud, a GPU not on this node, no room beside the stored slices)
    /// egpud refuses to start, names it and says why.
    #[arg(long, conflicts_with = "drop_unstored_slices")]
    pub adopt_unstored_slices: bool,
    /// Where the host's sysfs is mounted, read for each GPU's NUMA node and
    /// PCIe root complex (published to the kubelet's Topology Manager and
    /// as DRA attributes) [default: /sys; with --simulate, none: the
    /// simulated GPUs' PCI addresses are not the host's].
    #[arg(long, value_name = "DIR", value_parser = sysfs_dir)]
    pub sysfs: Option<PathBuf>,
    /// Sweep period in milliseconds (dead-process reclaim, heartbeat).
    #[arg(long, default_value_t = 200, hide = true)]
    pub sweep_ms: u64,
}

use egpu_node::logging::log_filter;

fn parse_audit(s: &str) -> Result<egpu_node::audit::AuditMode, String> {
    s.parse()
}

fn parse_slack(s: &str) -> Result<egpu_core::Bytes, String> {
    s.parse::<egpu_core::Bytes>().map_err(|e| e.to_string())
}

fn next_to_exe(name: &str) -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .unwrap_or_default()
        .join(name)
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

impl DaemonArgs {
    pub fn config(&self) -> NodeConfig {
        NodeConfig {
            run_dir: absolute(&self.run_dir),
            state_dir: absolute(&self.state_dir),
            socket: self.socket.as_deref().map(absolute),
            simulate: self.simulate.clone(),
            hook_lib: absolute(&self.hook_lib.clone().unwrap_or_else(|| next_to_exe("libegpu.so"))),
            sim_lib: absolute(&self.sim_lib.clone().unwrap_or_else(|| next_to_exe("libegpu_simgpu.so"))),
            sweep_period_ms: self.sweep_ms,
            cdi_dir: self.cdi_dir.as_deref().map(absolute),
            cdi_hook: absolute(&self.cdi_hook.clone().unwrap_or_else(|| next_to_exe("egpu-cdi-hook"))),
            memory_audit: self.memory_audit,
            memory_audit_slack: self.memory_audit_slack.0,
            drop_unstored_slices: self.drop_unstored_slices,
            adopt_unstored_slices: self.adopt_unstored_slices,
            sysfs: match (&self.sysfs, &self.simulate) {
                (Some(dir), _) => Some(absolute(dir)),
                (None, None) => Some(PathBuf::from("/sys")),
                (None, Some(_)) => None,
            },
        }
    }
}

/// `--sysfs`: a directory.
fn sysfs_dir(s: &str) -> Result<PathBuf, String> {
    let p = PathBuf::from(s);
    if p.is_dir() { Ok(p) } else { Err(format!("{s} is not a directory; give where the host's sysfs is mounted (usually /sys)")) }
}

/// `--simulate`: checked when the flag is read, so a bad spec is a usage
/// error (exit 2) as every other bad flag is.
/// A `--simulate` value (`NxSIZE[,…]`), checked as egpud checks it.
pub fn sim_spec(s: &str) -> Result<String, String> {
    s.parse::<egpu_core::SimSpec>().map(|_| s.to_string()).map_err(|e| e.to_string())
}
