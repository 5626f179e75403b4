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
    /// Latency mode: pause this long after each iteration, e.g. 3ms (a
    /// serving loop that leaves the device idle in between).
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    think: Duration,
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
    /// Keep a stream capture open on another stream for the whole burn: it
    /// is begun (and one launch captured) before, one more launch is
    /// captured after, then it is ended and must give a graph. The burn's
    /// own waits run in the relaxed capture mode, as a program that waits
    /// while it captures must.
    #[arg(long, value_enum)]
    open_capture: Option<OpenCapture>,
    /// The thread that holds the `--open-capture` capture.
    #[arg(long, value_enum, default_value_t = CaptureThread::Same)]
    capture_thread: CaptureThread,
    /// For the whole burn, a thread of its own begins a stream capture in
    /// this mode, captures one launch and ends it, again and again. Every
    /// capture must end with a graph: a call made by the burn's thread in
    /// a forbidden moment would invalidate it (the burn's own waits run in
    /// the relaxed mode). Prints how many were begun and how many failed,
    /// and fails if any did. Between two captures the thread pauses for a
    /// varying part of `--capture-churn-gap` (from none to twice it), so
    /// that the burn's launches meet captures beginning at any moment.
    #[arg(long, value_enum, conflicts_with = "open_capture")]
    capture_churn: Option<OpenCapture>,
    /// The mean pause between two `--capture-churn` captures, e.g. 50us.
    #[arg(long, default_value = "50us", value_parser = humantime::parse_duration)]
    capture_churn_gap: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum OpenCapture {
    /// `cuStreamBeginCapture_v2`, global mode.
    Global,
    /// `cuStreamBeginCapture_v2`, thread-local mode.
    ThreadLocal,
    /// `cuStreamBeginCapture_v2`, relaxed mode.
    Relaxed,
    /// `cuStreamBeginCaptureToGraph` (CUDA 12.3), global mode.
    ToGraph,
    /// `cuStreamBeginRecaptureToGraph` (CUDA 13.3) into a graph captured
    /// just before with the same launch, global mode.
    Recapture,
}

impl OpenCapture {
    fn kind(self) -> driver::CaptureKind {
        match self {
            OpenCapture::Global => driver::CaptureKind::Mode(egpu_cuda::CU_STREAM_CAPTURE_MODE_GLOBAL),
            OpenCapture::ThreadLocal => driver::CaptureKind::Mode(egpu_cuda::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
            OpenCapture::Relaxed => driver::CaptureKind::Mode(egpu_cuda::CU_STREAM_CAPTURE_MODE_RELAXED),
            OpenCapture::ToGraph => driver::CaptureKind::ToGraph,
            OpenCapture::Recapture => driver::CaptureKind::Recapture,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum CaptureThread {
    /// The burning thread.
    Same,
    /// A thread of its own (with a context of its own).
    Other,
}

/// A capture held by another thread: it says when the capture is open,
/// then waits for the burn to end before it captures again and ends it.
struct SideCapture {
    done: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<Result<u32>>,
}

/// Starts a thread with a burner (and a context) of its own on `device`.
/// `setup` runs first, and this returns once it has: its error is this
/// call's, `what` saying what it was doing. `run` then gets the burner and
/// what `setup` made; its result is the thread's.
fn side_thread<S, T: Send + 'static>(
    device: i32,
    what: &'static str,
    setup: impl for<'d> FnOnce(&driver::Burner<'d>) -> Result<S> + Send + 'static,
    run: impl for<'d> FnOnce(&driver::Burner<'d>, S) -> Result<T> + Send + 'static,
) -> Result<std::thread::JoinHandle<Result<T>>> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
    let thread = std::thread::spawn(move || -> Result<T> {
        let fail = |e: anyhow::Error| {
            let _ = ready_tx.send(Err(format!("{e:#}")));
            e
        };
        let d = driver::Driver::load().map_err(fail)?;
        let b = driver::Burner::new(&d, device, ptx::PTX, ptx::ENTRY).map_err(fail)?;
        let made = setup(&b).map_err(fail)?;
        let _ = ready_tx.send(Ok(()));
        run(&b, made)
    });
    match ready_rx.recv() {
        Ok(Ok(())) => Ok(thread),
        Ok(Err(e)) => anyhow::bail!("the capture thread could not {what}: {e}"),
        Err(_) => anyhow::bail!("the capture thread stopped before it could {what}"),
    }
}

fn side_capture(device: i32, kind: driver::CaptureKind) -> Result<SideCapture> {
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let thread = side_thread(
        device,
        "open its capture",
        move |b| b.open_capture(kind),
        move |b, mut c| {
            let _ = done_rx.recv();
            b.capture_one(&mut c)?;
            let n = c.launches;
            b.end_open_capture(c)?;
            Ok(n)
        },
    )?;
    Ok(SideCapture { done: done_tx, thread })
}

/// `--capture-churn`: captures begun and ended back to back on a thread of
/// its own until told to stop.
struct Churn {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Result<(u64, Vec<String>)>>,
}

fn capture_churn(device: i32, kind: driver::CaptureKind, gap: Duration) -> Result<Churn> {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stop.clone();
    let thread = side_thread(
        device,
        "start",
        |b| b.capture_stream(),
        move |b, stream| {
            let (mut begun, mut failed) = (0u64, Vec::new());
            while !flag.load(std::sync::atomic::Ordering::Acquire) {
                begun += 1;
                let r = b.open_capture_on(stream, kind).and_then(|c| b.end_open_capture(c));
                if let Err(e) = r {
                    failed.push(format!("{e:#}"));
                }
                // From none to twice the gap, in 64 steps (a fixed sequence:
                // the same run pauses alike).
                let step = (begun.wrapping_mul(2_654_435_761) >> 7) % 64;
                std::thread::sleep(gap * 2 * step as u32 / 64);
            }
            Ok((begun, failed))
        },
    )?;
    Ok(Churn { stop, thread })
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.open_capture == Some(OpenCapture::Recapture) {
        anyhow::bail!("--open-capture recapture is not supported: a recapture must repeat its graph's launches, and an open capture adds one after the burn; use --capture-churn recapture");
    }
    let d = driver::Driver::load()?;
    let b = driver::Burner::new(&d, args.device, ptx::PTX, ptx::ENTRY)?;
    if args.failed_capture {
        let r = b.failed_capture()?;
        eprintln!("egpu-burn: a stream capture ended with error {r}");
    }
    let mut same_capture = None;
    let mut other_capture = None;
    match (args.open_capture, args.capture_thread) {
        (None, _) => {}
        (Some(c), CaptureThread::Same) => same_capture = Some(b.open_capture(c.kind())?),
        (Some(c), CaptureThread::Other) => other_capture = Some(side_capture(args.device, c.kind())?),
    }
    let churn = match args.capture_churn {
        Some(c) => Some(capture_churn(args.device, c.kind(), args.capture_churn_gap)?),
        None => None,
    };
    // The burn's own waits, in the relaxed capture mode while a capture is open.
    let capturing = args.open_capture.is_some() || churn.is_some();
    let wait = |e| if capturing { b.relaxed(|| b.wait(e)) } else { b.wait(e) };
    let sync = || if capturing { b.relaxed(|| b.sync()) } else { b.sync() };
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
            wait(e)?;
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
                sync()?;
                iv.latencies_ns.push(t0.elapsed().as_nanos() as u64);
                if !args.think.is_zero() {
                    std::thread::sleep(args.think);
                }
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
    if let Some(mut c) = same_capture {
        b.capture_one(&mut c)?;
        let n = c.launches;
        b.end_open_capture(c)?;
        eprintln!("egpu-burn: the open capture (same thread) ended with a graph of {n} launches");
    }
    if let Some(side) = other_capture {
        let _ = side.done.send(());
        let n = side.thread.join().map_err(|_| anyhow::anyhow!("the capture thread panicked"))??;
        eprintln!("egpu-burn: the open capture (other thread) ended with a graph of {n} launches");
    }
    if let Some(churn) = churn {
        churn.stop.store(true, std::sync::atomic::Ordering::Release);
        let (begun, failed) = churn.thread.join().map_err(|_| anyhow::anyhow!("the capture thread panicked"))??;
        eprintln!("egpu-burn: {begun} captures begun and ended beside the burn, {} failed", failed.len());
        if let Some(first) = failed.first() {
            anyhow::bail!("{} of {begun} stream captures beside the burn failed; the first: {first}", failed.len());
        }
    }
    emit(&all.report(total, total, if args.mode == Mode::Saturate { "saturate-total" } else { "latency-total" }));
    Ok(())
}
