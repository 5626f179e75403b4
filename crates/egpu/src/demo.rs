//! `egpu demo`: a guided tour on a throw-away node. Two workloads in two
//! slices; one hits its memory limit and is refused cleanly; its limit is
//! raised live and it continues; a third grows past its slice's memory
//! guarantee into its burst cap with no resize; the memory summary; then two
//! compute-bound workloads share one GPU 30/70, are resized live to 60/40,
//! and their kernels/s follow; everything cleaned up.

use crate::cmd;
use crate::localnode::{LocalNode, Workload, real_gpu_present};
use crate::output;
use egpu_core::Bytes;
use egpu_node::client::Client;
use egpu_node::proto;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};

#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Simulated GPUs to use when the machine has no NVIDIA GPU.
    #[arg(long, default_value = "2x16GiB", value_parser = crate::daemon::sim_spec)]
    pub simulate: String,
    /// Use the simulated GPU even when a real one is present.
    #[arg(long)]
    pub force_simulated: bool,
}

const T: Duration = Duration::from_secs(60);

fn step(n: u32, text: &str) {
    say!("\n[{n}] {text}");
}

async fn show_slices(c: &mut Client) -> anyhow::Result<()> {
    let list = c.list_slices(proto::ListSlicesRequest {}).await.map_err(crate::exit::status)?.into_inner();
    let slices: Vec<_> = list.slices.into_iter().map(output::slice_out).collect();
    for line in output::slices_table(&slices).lines() {
        say!("    {line}");
    }
    Ok(())
}

pub async fn run(args: DemoArgs) -> anyhow::Result<i32> {
    let real = !args.force_simulated && real_gpu_present();
    let simulate = (!real).then(|| args.simulate.clone());
    say!("eGPU demo: GPU slices with hard memory limits, resized while the workload runs.");
    step(1, &match &simulate {
        Some(s) => format!("No NVIDIA GPU here: starting egpud on simulated GPUs ({s}) in a temporary directory."),
        None => "NVIDIA GPU found: starting egpud on the real GPU(s) in a temporary directory.".into(),
    });
    let (node, mut c) = LocalNode::start(simulate).await?;
    let result = tour(&node, &mut c).await;
    step(12, "Cleaning up: stopping egpud and removing the temporary directory.");
    node.stop().await;
    result?;
    say!("\nDone. Try it yourself: see `egpu --help` and docs/cli.md.");
    Ok(0)
}

async fn tour(node: &LocalNode, c: &mut Client) -> anyhow::Result<()> {
    let n = cmd::get_node(c).await?;
    say!("    egpud pid {} serves {} ({} device(s)):", node.daemon_pid().unwrap_or(0), node.socket.display(), n.devices.len());
    for d in &n.devices {
        say!("      GPU {}: {} with {}", d.index, d.name, Bytes(d.memory_bytes));
    }
    let second = if n.devices.len() > 1 { 1 } else { 0 };

    step(2, "Creating two slices: `steady` (2GiB) and `small` (1GiB).");
    let mk = |name: &str, mem: u64, dev: u32| proto::CreateSliceRequest {
        name: name.into(),
        devices: vec![proto::DeviceShareSpec { device: dev, memory_bytes: mem, compute_share_bps: 0, compute_limit_bps: 0, memory_burst_bytes: 0 }],
        ..Default::default()
    };
    c.create_slice(mk("steady", 2 << 30, second)).await.map_err(crate::exit::status)?;
    c.create_slice(mk("small", 1 << 30, 0)).await.map_err(crate::exit::status)?;
    show_slices(c).await?;

    step(3, "Workload A (in `steady`) allocates 1GiB in 64MiB pieces and holds it.");
    let mut a = Workload::probe(c, "steady", &["alloc", "--family", "mem", "--size", "64MiB", "--count", "16", "--hold"]).await?;
    let held = a.wait_event(&["holding"], T).await?;
    say!("    A holds {} allocations: fine, it is within its 2GiB.", held["allocated"]);

    step(4, "Workload B (in `small`) wants 2GiB, 256MiB at a time, but its slice allows 1GiB.");
    let mut b = Workload::probe(c, "small", &["grow", "--step", "256MiB", "--until", "2GiB", "--hold"]).await?;
    let blocked = b.wait_event(&["blocked", "holding"], T).await?;
    if blocked["event"] != "blocked" {
        anyhow::bail!("workload B was never limited: {blocked}");
    }
    say!(
        "    B reached its limit: the next cuMemAlloc was refused with CUDA_ERROR_OUT_OF_MEMORY after {} ({} free in its view).",
        Bytes(blocked["total"].as_u64().unwrap_or(0)),
        Bytes(blocked["mem"]["free"].as_u64().unwrap_or(0))
    );
    say!("    B keeps running and retries every millisecond; nothing was killed, A is unaffected.");
    show_slices(c).await?;

    step(5, "Raising `small` to 3GiB live (`egpu resize small --gpu-memory 3GiB`).");
    let t0 = egpu_abi::monotonic_ns();
    let req = proto::ResizeSliceRequest { name: "small".into(), memory_bytes: Some(3 << 30), ..Default::default() };
    c.resize_slice(req).await.map_err(crate::exit::status)?;
    let t1 = egpu_abi::monotonic_ns();
    let un = b.wait_event(&["unblocked"], T).await?;
    let seen = un["t_ns"].as_u64().unwrap_or(t1);
    say!(
        "    The resize call took {:.3} ms; B's next allocation succeeded {:.3} ms after it returned (B retries every ~1 ms).",
        (t1 - t0) as f64 / 1e6,
        seen.saturating_sub(t1) as f64 / 1e6
    );
    b.wait_event(&["holding"], T).await?;
    say!("    B now holds its 2GiB, no restart needed.");

    step(6, "Slices now:");
    show_slices(c).await?;
    let n = cmd::get_node(c).await?;
    for d in &n.devices {
        say!("    GPU {}: driver reports {} used, slices reserve {}.", d.index, Bytes(d.driver_used_bytes), Bytes(d.allocated_memory_bytes));
    }

    step(7, "Burst memory: slice `bursty` guarantees 1GiB and may burst to 4GiB (`--gpu-memory 1GiB --gpu-memory-burst 4GiB`).");
    let burst = proto::CreateSliceRequest {
        name: "bursty".into(),
        devices: vec![proto::DeviceShareSpec { device: 0, memory_bytes: 1 << 30, compute_share_bps: 0, compute_limit_bps: 0, memory_burst_bytes: 4 << 30 }],
        ..Default::default()
    };
    c.create_slice(burst).await.map_err(crate::exit::status)?;
    let mut w = Workload::probe(c, "bursty", &["grow", "--step", "256MiB", "--until", "3GiB", "--hold"]).await?;
    w.wait_event(&["holding"], T).await?;
    say!("    Workload C grew to 3GiB with no resize: past its 1GiB guarantee, egpud lent it memory no slice reserves.");
    show_slices(c).await?;
    let cw = w.finish().await?;
    c.delete_slice(proto::DeleteSliceRequest { name: "bursty".into(), force: false }).await.map_err(crate::exit::status)?;
    say!("    C exited {cw}; what it borrowed is back in GPU 0's pool for any bursting slice.");

    step(8, "Stopping the workloads and removing the slices.");
    let (ca, cb) = (a.finish().await?, b.finish().await?);
    say!("    workload A exited {ca}, workload B exited {cb}.");
    for name in ["steady", "small"] {
        c.delete_slice(proto::DeleteSliceRequest { name: name.into(), force: false }).await.map_err(crate::exit::status)?;
    }
    say!("\nSummary: 2 slices (steady 2GiB, small 1GiB -> 3GiB); B was refused at its limit, then a live resize");
    say!("let it continue {:.3} ms after the resize returned.", seen.saturating_sub(t1) as f64 / 1e6);
    let (before, after) = compute_tour(c).await?;
    say!(
        "Compute: A's share of the kernels was {:.1}% at shares 30/70 and {:.1}% after the live resize to 60/40 (A:B ratio {:.2} -> {:.2}).",
        before.share_a() * 100.0,
        after.share_a() * 100.0,
        before.ratio(),
        after.ratio()
    );
    Ok(())
}

/// Kernels/s of the two compute workloads over one measurement window.
#[derive(Debug, Clone, Copy)]
struct Rates {
    a: f64,
    b: f64,
}

impl Rates {
    fn share_a(&self) -> f64 {
        self.a / (self.a + self.b).max(1e-9)
    }
    fn ratio(&self) -> f64 {
        self.a / self.b.max(1e-9)
    }
}

/// An `egpu-burn --mode saturate` in a slice; a task adds up the kernels of
/// its JSON report lines.
struct Burner {
    child: tokio::process::Child,
    kernels: Arc<AtomicU64>,
}

impl Burner {
    async fn start(c: &mut Client, slice: &str, seconds: u32) -> anyhow::Result<Burner> {
        let burn = crate::localnode::exe_dir().join("egpu-burn");
        if !burn.exists() {
            anyhow::bail!("{} not found: build the workspace first (cargo build --release --workspace)", burn.display());
        }
        let env = cmd::launch_env(c, slice).await?;
        let argv: Vec<String> = [&burn.display().to_string(), "--mode", "saturate", "--seconds", &seconds.to_string(), "--report-every", "100ms", "-o", "json"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let mut cmd = crate::process::command(&argv, &env);
        // On the simulated GPU: 50 ns per thread makes egpu-burn's kernel ~410 us, so device
        // time (what shares divide), not launch overhead, bounds kernels/s. Real GPUs ignore it.
        cmd.env("EGPU_SIM_NS_PER_THREAD", "50");
        let mut child = cmd.stdout(std::process::Stdio::piped()).kill_on_drop(true).spawn()?;
        let kernels = Arc::new(AtomicU64::new(0));
        let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
        let k = kernels.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line)
                    && v["mode"] == "saturate"
                {
                    k.fetch_add(v["kernels"].as_u64().unwrap_or(0), Ordering::Relaxed);
                }
            }
        });
        Ok(Burner { child, kernels })
    }

    fn kernels(&self) -> u64 {
        self.kernels.load(Ordering::Relaxed)
    }

    async fn stop(mut self) -> anyhow::Result<()> {
        let _ = self.child.start_kill();
        tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await.map_err(|_| anyhow::anyhow!("egpu-burn did not exit"))??;
        Ok(())
    }
}

/// Prints kernels/s of both burners once a second for `secs` seconds; returns the window's rates.
async fn measure(a: &mut Burner, b: &mut Burner, secs: u32) -> anyhow::Result<Rates> {
    let (a0, b0, t0) = (a.kernels(), b.kernels(), Instant::now());
    let (mut pa, mut pb, mut pt) = (a0, b0, t0);
    for _ in 0..secs {
        tokio::time::sleep(Duration::from_secs(1)).await;
        for w in [&mut *a, &mut *b] {
            if let Some(st) = w.child.try_wait()? {
                anyhow::bail!("egpu-burn exited early ({st})");
            }
        }
        let (ka, kb, t) = (a.kernels(), b.kernels(), Instant::now());
        let dt = t.duration_since(pt).as_secs_f64();
        let r = Rates { a: (ka - pa) as f64 / dt, b: (kb - pb) as f64 / dt };
        say!("    A {:>9.0} kernels/s   B {:>9.0} kernels/s   A's share {:>5.1}%", r.a, r.b, r.share_a() * 100.0);
        (pa, pb, pt) = (ka, kb, t);
    }
    let dt = pt.duration_since(t0).as_secs_f64();
    Ok(Rates { a: (pa - a0) as f64 / dt, b: (pb - b0) as f64 / dt })
}

async fn set_compute(c: &mut Client, name: &str, pct: u32) -> anyhow::Result<()> {
    let req = proto::ResizeSliceRequest {
        name: name.into(),
        compute_share_bps: Some(pct * 100),
        compute_limit_bps: Some(pct * 100),
        ..Default::default()
    };
    c.resize_slice(req).await.map_err(crate::exit::status)?;
    Ok(())
}

/// Steps 9-11: two saturating workloads at compute 30/70, resized live to 60/40.
async fn compute_tour(c: &mut Client) -> anyhow::Result<(Rates, Rates)> {
    step(9, "Compute: slices `compute-a` (share 30%) and `compute-b` (share 70%) on GPU 0, each capped at its share.");
    for (name, pct) in [("compute-a", 30u32), ("compute-b", 70)] {
        let req = proto::CreateSliceRequest {
            name: name.into(),
            devices: vec![proto::DeviceShareSpec { device: 0, memory_bytes: 512 << 20, compute_share_bps: pct * 100, compute_limit_bps: pct * 100, memory_burst_bytes: 0 }],
            ..Default::default()
        };
        c.create_slice(req).await.map_err(crate::exit::status)?;
    }
    show_slices(c).await?;
    say!("    Workloads A and B each run egpu-burn --mode saturate: they would take the whole GPU if they could.");
    let mut a = Burner::start(c, "compute-a", 30).await?;
    let mut b = Burner::start(c, "compute-b", 30).await?;
    let result = async {
        let deadline = Instant::now() + T;
        while a.kernels() == 0 || b.kernels() == 0 {
            if Instant::now() > deadline {
                anyhow::bail!("egpu-burn reported no kernels within {T:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let before = measure(&mut a, &mut b, 3).await?;
        step(10, "Resizing live: `compute-b` to 40% first, then `compute-a` to 60% (the shares never add up to more than 100%).");
        set_compute(c, "compute-b", 40).await?;
        set_compute(c, "compute-a", 60).await?;
        show_slices(c).await?;
        // One second for the arbiter's usage average to follow the new budgets.
        tokio::time::sleep(Duration::from_secs(1)).await;
        step(11, "The same workloads, no restart, after the resize:");
        let after = measure(&mut a, &mut b, 3).await?;
        Ok((before, after))
    }
    .await;
    let (sa, sb) = (a.stop().await, b.stop().await);
    let (before, after) = result?;
    sa?;
    sb?;
    for name in ["compute-a", "compute-b"] {
        c.delete_slice(proto::DeleteSliceRequest { name: name.into(), force: false }).await.map_err(crate::exit::status)?;
    }
    say!(
        "    kernels/s A:B was {:.0}:{:.0} ({:.1}% for A) at 30/70, {:.0}:{:.0} ({:.1}% for A) at 60/40.",
        before.a,
        before.b,
        before.share_a() * 100.0,
        after.a,
        after.b,
        after.share_a() * 100.0
    );
    Ok((before, after))
}
