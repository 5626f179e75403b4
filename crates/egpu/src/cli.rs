//! The `egpu` command line (clap).

use clap::{Args, Parser, Subcommand, ValueEnum};
use egpu_core::{Bytes, Percent, Priority};
use std::path::PathBuf;

pub use egpu_node::config::DEFAULT_SOCKET;

#[derive(Debug, Parser)]
#[command(name = "egpu", version, about = "Elastic GPU slices: hard memory limits and compute shares, resizable while workloads run")]
pub struct Cli {
    /// egpud's socket [env: EGPU_SOCKET; default: /run/egpu/egpud.sock].
    // Not clap's `env`: an empty EGPU_SOCKET would then refuse even an
    // explicit --socket ("a value is required"); empty reads as unset.
    #[arg(long, global = true)]
    pub socket: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// egpud's socket: `--socket`, else a non-empty `EGPU_SOCKET`, else
    /// [`DEFAULT_SOCKET`].
    pub fn socket(&self) -> PathBuf {
        self.socket.clone().or_else(|| std::env::var_os("EGPU_SOCKET").filter(|v| !v.is_empty()).map(PathBuf::from)).unwrap_or_else(|| DEFAULT_SOCKET.into())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum Format {
    #[default]
    Table,
    Json,
}

#[derive(Debug, Args)]
pub struct OutputArgs {
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

/// Limits of a slice, as flags (shared by run, create and resize).
#[derive(Debug, Args, Clone, Default)]
pub struct LimitArgs {
    /// Hard GPU-memory limit per device, e.g. 8GiB, 512MiB, 1.5GB (with
    /// --gpu-memory-burst: the guarantee, reserved).
    #[arg(long = "gpu-memory", value_name = "SIZE", allow_negative_numbers = true)]
    pub memory: Option<Bytes>,
    /// Burst cap per device: above --gpu-memory (which stays reserved), the
    /// limit grows on demand up to SIZE while the device has memory no slice
    /// reserved, and shrinks back when unused. 0 turns bursting off.
    #[arg(long = "gpu-memory-burst", value_name = "SIZE", allow_negative_numbers = true)]
    pub memory_burst: Option<Bytes>,
    /// Guaranteed share of each device's time, e.g. 30% (new slice: 0%).
    #[arg(long = "gpu-compute", value_name = "PERCENT", allow_negative_numbers = true)]
    pub compute_share: Option<Percent>,
    /// Cap on each device's time (at least the share, above 0%), e.g. 80%
    /// (new slice: 100%).
    #[arg(long = "gpu-compute-limit", value_name = "PERCENT", value_parser = compute_cap, allow_negative_numbers = true)]
    pub compute_limit: Option<Percent>,
    /// Priority class: high, normal or best-effort (new slice: normal).
    #[arg(long)]
    pub priority: Option<Priority>,
    /// Device indices, comma-separated (e.g. 0,1). Default for a new slice:
    /// the first device with room; for a resize: every device of the slice.
    #[arg(long = "device", value_delimiter = ',', value_name = "N[,N...]", allow_negative_numbers = true)]
    pub devices: Vec<u32>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// List the node's GPUs with what slices hold on them.
    Devices(OutputArgs),
    /// List slices with their limits and usage.
    #[command(alias = "list")]
    Ls(OutputArgs),
    /// Show one slice.
    Get {
        name: String,
        #[command(flatten)]
        out: OutputArgs,
    },
    /// Create a slice and print its id.
    Create {
        #[arg(long)]
        name: String,
        #[command(flatten)]
        limits: LimitArgs,
    },
    /// Change a slice's limits while its workloads run.
    Resize {
        name: String,
        #[command(flatten)]
        limits: LimitArgs,
    },
    /// Remove a slice. Refused while live processes are attached, unless --force.
    #[command(alias = "delete")]
    Rm {
        name: String,
        /// Remove even with live processes attached (they keep running but can no longer allocate).
        #[arg(long)]
        force: bool,
    },
    /// Run a program in an existing slice.
    Exec {
        name: String,
        #[arg(trailing_var_arg = true, required = true, value_name = "PROG [ARGS]...")]
        cmd: Vec<String>,
    },
    /// Run a program in a new slice that is removed when the program exits.
    Run {
        /// Name of the slice (default: run-<pid>).
        #[arg(long)]
        name: Option<String>,
        #[command(flatten)]
        limits: LimitArgs,
        #[arg(trailing_var_arg = true, required = true, value_name = "PROG [ARGS]...")]
        cmd: Vec<String>,
    },
    /// Print the environment a workload of the slice needs, as shell `export` lines.
    Env { name: String },
    /// Trace-driven placement simulator (capacity planning; same policy code as the scheduler).
    Simulate(Box<egpu_sim::cli::SimulateArgs>),
    /// Live view of devices and slices: memory, compute use vs share/limit, processes.
    Top(crate::top::TopArgs),
    /// Start a throw-away node (simulated GPUs unless there is a real one), run two workloads, hit a limit, resize live,
    /// burst past a memory guarantee, split compute 30/70 then 60/40, and clean up.
    Demo(crate::demo::DemoArgs),
    /// Benchmarks against a live egpud.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// (Internal, used by `egpu run`.) Waits for one byte on --fd, then
    /// becomes PROG; exits without starting it if the fd reaches EOF.
    #[command(name = "internal-exec-gate", hide = true)]
    ExecGate {
        #[arg(long)]
        fd: i32,
        #[arg(trailing_var_arg = true, required = true, value_name = "PROG [ARGS]...")]
        cmd: Vec<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Resize latency: from the resize call returning to a blocked workload's next allocation succeeding.
    Resize(crate::bench::ResizeBenchArgs),
}

/// `--gpu-compute-limit`: a percentage above 0 (a cap of 0% would stop
/// the slice, and 0 means "no cap" to egpud).
fn compute_cap(s: &str) -> Result<Percent, String> {
    let p: Percent = s.parse().map_err(|e: egpu_core::QuantityError| e.to_string())?;
    if p.0 == 0 {
        return Err("a cap of 0% would never let the slice run: give a cap above 0%, or leave the flag out for no cap".into());
    }
    Ok(p)
}

/// A size above 0 bytes (`egpu bench resize --step`).
pub fn nonzero_size(s: &str) -> Result<Bytes, String> {
    let b: Bytes = s.parse().map_err(|e: egpu_core::QuantityError| e.to_string())?;
    if b.0 == 0 {
        return Err("must be above 0 bytes, e.g. 2MiB".into());
    }
    Ok(b)
}
