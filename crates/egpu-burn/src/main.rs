//! `egpu-burn`: a busy-kernel loop through the CUDA driver API, for compute
//! isolation tests, demos and the device check.
//!
//! Contract: loads `libcuda.so.1` at run time (so `libegpu.so` can intercept
//! it), loads a hand-written PTX kernel with `cuModuleLoadData`, and runs
//! unchanged on the simulated GPU and on real GPUs. Modes:
//! - `saturate`: keeps `--inflight` launches queued (an event after each;
//!   waits for the oldest when full), reports kernels/s and the latency of
//!   the `cuLaunchKernel` call (where a compute gate adds its cost);
//! - `latency`: one kernel then `cuStreamSynchronize` per iteration, reports
//!   the per-iteration latency.
//!
//! Output: one line per `--report-every` interval, human or `-o json`
//! (JSON lines), then a final line for the whole run.

mod driver;
mod ptx;
mod stats;

use anyhow::Result;
use clap::{Parser, ValueEnum};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    Saturate,
    Latency,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Output {
    Text,
    Json,
}

/// Launch a busy kernel in a loop and report throughput and latency.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// How long to run, seconds.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Blocks per launch.
    #[arg(long, default_value_t = 64)]
    grid: u32,
    /// Threads per block.
    #[arg(long, default_value_t = 128)]
    block: u32,
    /// Loop steps per thread (the kernel's work on a real GPU).
    #[arg(long, default_value_t = 10_000)]
    iters: u32,
    #[arg(long, value_enum, default_value_t = Mode::Saturate)]
    mode: Mode,
    /// Launches kept queued ahead in saturate mode.
    #[arg(long, default_value_t = 4)]
    inflight: usize,
    /// Device ordinal.
    #[arg(long, default_value_t = 0)]
    device: i32,
    /// Report interval, e.g. 1s or 500ms.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    report_every: Duration,
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Text)]
    output: Output,
    /// Before burning, begin a stream capture on another stream and end it
    /// with an invalid argument (the driver refuses it): the launches that
    /// follow must still be gated.
    #[arg(long)]
    failed_capture: bool,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let d = driver::Driver::load()?;
    let b = driver::Burner::new(&d, args.device, ptx::PTX, ptx::ENTRY)?;
    if args.failed_capture {
        let r = b.failed_capture()?;
        eprintln!("egpu-burn: a stream capture ended with error {r}");
    }
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(args.seconds);
    let mode = match args.mode {
        Mode::Saturate => "saturate",
        Mode::Latency => "latency",
    };
    let emit = |r: &stats::Report| match args.output {
        Output::Json => println!("{}", serde_json::to_string(r).unwrap_or_default()),
        Output::Text => println!(
            "t={:.1}s {} kernels/s={:.1} latency p50={:.1}us p99={:.1}us gpu_busy={}",
            r.t_s,
            r.mode,
            r.kernels_per_s,
            r.latency_p50_us,
            r.latency_p99_us,
            r.gpu_busy_frac.map_or("n/a".into(), |f| format!("{:.1}%", f * 100.0))
        ),
    };
    let mut iv = stats::Interval::default();
    let mut all = stats::Interval::default();
    let mut iv_start = start;
    // Events: a free pool and the in-flight queue (oldest first).
    let mut free: Vec<_> = (0..args.inflight.max(1) + 1).map(|_| b.new_event()).collect::<Result<_>>()?;
    let mut queued: VecDeque<egpu_cuda::CUevent> = VecDeque::new();
    let mut last_done: Option<egpu_cuda::CUevent> = None;
    let mut complete_oldest = |queued: &mut VecDeque<_>, free: &mut Vec<_>, iv: &mut stats::Interval| -> Result<()> {
        if let Some(e) = queued.pop_front() {
            b.wait(e)?;
            if let Some(prev) = last_done.replace(e) {
                if let Some(ns) = b.elapsed_ns(prev, e) {
                    *iv.gpu_ns.get_or_insert(0) += ns;
                }
                free.push(prev);
            }
        }
        Ok(())
    };
    while Instant::now() < end {
        match args.mode {
            Mode::Saturate => {
                if queued.len() >= args.inflight.max(1) {
                    complete_oldest(&mut queued, &mut free, &mut iv)?;
                }
                let t0 = Instant::now();
                b.launch(args.grid, args.block, args.iters)?;
                iv.latencies_ns.push(t0.elapsed().as_nanos() as u64);
                let e = free.pop().map_or_else(|| b.new_event(), Ok)?;
                b.record(e)?;
                queued.push_back(e);
            }
            Mode::Latency => {
                let t0 = Instant::now();
                b.launch(args.grid, args.block, args.iters)?;
                b.sync()?;
                iv.latencies_ns.push(t0.elapsed().as_nanos() as u64);
            }
        }
        iv.kernels += 1;
        let now = Instant::now();
        if now.duration_since(iv_start) >= args.report_every {
            let done = std::mem::take(&mut iv);
            all.kernels += done.kernels;
            all.latencies_ns.extend_from_slice(&done.latencies_ns);
            if let Some(g) = done.gpu_ns {
                *all.gpu_ns.get_or_insert(0) += g;
            }
            emit(&done.report(now.duration_since(start).as_secs_f64(), now.duration_since(iv_start).as_secs_f64(), mode));
            iv_start = now;
        }
    }
    while !queued.is_empty() {
        complete_oldest(&mut queued, &mut free, &mut iv)?;
    }
    all.kernels += iv.kernels;
    all.latencies_ns.extend_from_slice(&iv.latencies_ns);
    if let Some(g) = iv.gpu_ns {
        *all.gpu_ns.get_or_insert(0) += g;
    }
    let total = start.elapsed().as_secs_f64();
    emit(&all.report(total, total, if args.mode == Mode::Saturate { "saturate-total" } else { "latency-total" }));
    Ok(())
}
