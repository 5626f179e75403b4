//! `egpu-probe`: a CUDA driver API / NVML test program for eGPU.
//!
//! Every event is one JSON object per line on stdout. Exit codes: 0 done;
//! 1 unexpected driver error; 2 usage; 3 stopped at out-of-memory before the
//! requested count; 4 the driver could not be initialised (e.g. the hook
//! failed closed). See `egpu-probe --help` and `docs/hook.md`.

mod alloc;
mod bench;
mod common;
mod deepbind;
mod direct;
mod family;
mod green;
mod info;
mod ipc;
mod loops;
mod race;
mod reimport;
mod reserve;
mod reset;
mod sparse;

use clap::{Args, Parser, Subcommand};
use egpu_workloads::via::{self, Via};

#[derive(Parser)]
#[command(name = "egpu-probe", version, about = "CUDA driver API / NVML probe for eGPU slices (JSON lines on stdout)")]
#[command(after_help = "Exit codes: 0 done, 1 driver error, 2 usage, 3 stopped at out-of-memory, 4 driver initialisation refused.\nEnvironment: LD_PRELOAD=libegpu.so, EGPU_SLICE_DIR, CUDA_VISIBLE_DEVICES; on the simulated GPU LD_LIBRARY_PATH, EGPU_SIM_GPUS, EGPU_SIM_STATE.")]
struct Cli {
    #[command(flatten)]
    g: Global,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Args, Clone)]
pub struct Global {
    /// How to reach the driver: direct (link-time), dlopen (dlopen+dlsym) or procaddr (cuGetProcAddress).
    #[arg(long, global = true, default_value = "procaddr", env = "EGPU_PROBE_VIA")]
    via: Via,
    /// Use the per-thread-default-stream variants (_ptsz) of stream functions.
    #[arg(long, global = true)]
    ptds: bool,
    /// CUDA device ordinal.
    #[arg(long, global = true, default_value_t = 0)]
    device: i32,
    /// Create an own context (cuCtxCreate) instead of retaining the primary one.
    #[arg(long, global = true)]
    own_ctx: bool,
    /// Write device memory locations (vmm, pool and graph families) as CUDA
    /// 13.4's DEVICE_LOCALITY_DOMAIN, domain 0, instead of DEVICE.
    #[arg(long, global = true)]
    locality_domain: bool,
}

#[derive(Subcommand)]
enum Cmd {
    /// Print cuMemGetInfo / cuDeviceTotalMem / NVML memory, device count and UUIDs.
    Info,
    /// Allocate --count objects of --family (or until OOM), optionally hold them.
    Alloc(alloc::AllocArgs),
    /// Allocate --step at a time up to --until; on OOM report "blocked" and retry every --retry-us (default 1 ms) until it fits.
    Grow(loops::GrowArgs),
    /// Random allocate/free loop for --seconds, holding at most --max.
    Churn(loops::ChurnArgs),
    /// Allocate --size, print its CUDA IPC handle, hold until stdin closes.
    IpcExport(ipc::ExportArgs),
    /// Open an IPC handle from ipc-export, report memory info, hold until stdin closes.
    IpcImport(ipc::ImportArgs),
    /// Allocate in the parent, fork, allocate in the child; report both.
    Fork(ipc::ForkArgs),
    /// Median ns per call of cuMemAlloc+cuMemFree and of cuLaunchKernel (1-thread kernel).
    Bench(bench::BenchArgs),
    /// Device memory the driver commits outside allocation calls: free memory
    /// (cuMemGetInfo) around cuCtxSetLimit of the malloc heap and the stack,
    /// a kernel launch, and loading a module with a large __device__ global.
    Reserve(reserve::ReserveArgs),
    /// Threads make the process's first cuDevicePrimaryCtxRetain at once,
    /// --rounds times; the slice's usage (NVML) before, held and released.
    RetainRace(race::RaceArgs),
    /// Threads settle the pools (cuMemGetInfo) while the main thread
    /// allocates from the stream-ordered allocator, --rounds times: how many
    /// allocations the slice's view missed.
    SettleRace(race::SettleArgs),
    /// Export a VMM allocation, import it back, map the import and release
    /// the original: memory the hook cannot follow (for egpud's memory audit).
    VmmReimport(reimport::ReimportArgs),
    /// Map VMM handles into a sparse array (cuMemMapArrayAsync) and release
    /// them while mapped; unmap or destroy the array on stdin.
    Sparse(sparse::SparseArgs),
    /// Two users of the primary context, one resets it and retains it again,
    /// the other then releases its pre-reset reference: what the driver does
    /// with it (`model`), holding the new context's memory until stdin closes.
    CtxReset(reset::ResetArgs),
    /// A green context made first (the driver retains the primary context
    /// for it), allocations in it, then a primary retain; holds until stdin closes.
    GreenCtx(green::GreenArgs),
    /// Open --plugin with RTLD_DEEPBIND and let it allocate through its own
    /// dlopen/dlsym of libcuda.so.1 (event "deepbind": how many it got).
    Deepbind(deepbind::DeepbindArgs),
}

fn main() {
    let cli = Cli::parse();
    family::LOCALITY_DOMAIN.store(cli.g.locality_domain, std::sync::atomic::Ordering::Relaxed);
    let direct = if cli.g.via == Via::Direct { direct::table() } else { Vec::new() };
    let load = || via::load(cli.g.via, cli.g.ptds, &direct);
    // `fork --during-init` must make its process's first driver call itself.
    if let Cmd::Fork(a) = cli.cmd {
        std::process::exit(ipc::fork(&load, &cli.g, a));
    }
    // The plugin reaches the driver itself; the probe does not.
    if let Cmd::Deepbind(a) = cli.cmd {
        std::process::exit(deepbind::run(&cli.g, a));
    }
    let racer = match &cli.cmd {
        Cmd::Alloc(a) if a.racing_init => Some(alloc::spawn_racer(&cli.g)),
        _ => None,
    };
    let api = load();
    let code = match cli.cmd {
        Cmd::Info => info::run(api, &cli.g),
        Cmd::Alloc(a) => alloc::run(api, &cli.g, a, racer),
        Cmd::Grow(a) => loops::grow(api, &cli.g, a),
        Cmd::Churn(a) => loops::churn(api, &cli.g, a),
        Cmd::IpcExport(a) => ipc::export(api, &cli.g, a),
        Cmd::IpcImport(a) => ipc::import(api, &cli.g, a),
        Cmd::Fork(_) | Cmd::Deepbind(_) => unreachable!("handled above"),
        Cmd::Bench(a) => bench::run(api, &cli.g, a),
        Cmd::Reserve(a) => reserve::run(api, &cli.g, a),
        Cmd::RetainRace(a) => race::run(api, &cli.g, a),
        Cmd::SettleRace(a) => race::settle(api, &cli.g, a),
        Cmd::CtxReset(a) => reset::run(api, &cli.g, a),
        Cmd::GreenCtx(a) => green::run(api, &cli.g, a),
        Cmd::VmmReimport(a) => reimport::run(api, &cli.g, a),
        Cmd::Sparse(a) => sparse::run(api, &cli.g, a),
    };
    std::process::exit(code);
}

impl Global {
    pub fn via_name(&self) -> &'static str {
        match self.via {
            Via::Direct => "direct",
            Via::Dlopen => "dlopen",
            Via::Procaddr => "procaddr",
        }
    }
}
