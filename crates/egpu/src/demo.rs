//! `egpu demo`: a guided tour on a throw-away node. Two workloads in two
//! slices; one hits its memory limit and is refused cleanly; its limit is
//! raised live and it continues; a summary; everything cleaned up.

use crate::cmd;
use crate::localnode::{LocalNode, Workload, real_gpu_present};
use crate::output;
use egpu_core::Bytes;
use egpu_node::client::Client;
use egpu_node::proto;
use std::time::Duration;

#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Simulated GPUs to use when the machine has no NVIDIA GPU.
    #[arg(long, default_value = "2x16GiB")]
    pub simulate: String,
    /// Use the simulated GPU even when a real one is present.
    #[arg(long)]
    pub force_simulated: bool,
}

const T: Duration = Duration::from_secs(60);

fn step(n: u32, text: &str) {
    println!("\n[{n}] {text}");
}

async fn show_slices(c: &mut Client) -> anyhow::Result<()> {
    let list = c.list_slices(proto::ListSlicesRequest {}).await.map_err(crate::exit::status)?.into_inner();
    let slices: Vec<_> = list.slices.into_iter().map(output::slice_out).collect();
    for line in output::slices_table(&slices).lines() {
        println!("    {line}");
    }
    Ok(())
}

pub async fn run(args: DemoArgs) -> anyhow::Result<i32> {
    let real = !args.force_simulated && real_gpu_present();
    let simulate = (!real).then(|| args.simulate.clone());
    println!("eGPU demo: GPU slices with hard memory limits, resized while the workload runs.");
    step(1, &match &simulate {
        Some(s) => format!("No NVIDIA GPU here: starting egpud on simulated GPUs ({s}) in a temporary directory."),
        None => "NVIDIA GPU found: starting egpud on the real GPU(s) in a temporary directory.".into(),
    });
    let (node, mut c) = LocalNode::start(simulate).await?;
    let result = tour(&node, &mut c).await;
    step(8, "Cleaning up: stopping egpud and removing the temporary directory.");
    node.stop().await;
    result?;
    println!("\nDone. Try it yourself: see `egpu --help` and docs/cli.md.");
    Ok(0)
}

async fn tour(node: &LocalNode, c: &mut Client) -> anyhow::Result<()> {
    let n = cmd::get_node(c).await?;
    println!("    egpud pid {} serves {} ({} device(s)):", node.daemon_pid().unwrap_or(0), node.socket.display(), n.devices.len());
    for d in &n.devices {
        println!("      GPU {}: {} with {}", d.index, d.name, Bytes(d.memory_bytes));
    }
    let second = if n.devices.len() > 1 { 1 } else { 0 };

    step(2, "Creating two slices: `steady` (2GiB) and `small` (1GiB).");
    let mk = |name: &str, mem: u64, dev: u32| proto::CreateSliceRequest {
        name: name.into(),
        devices: vec![proto::DeviceShareSpec { device: dev, memory_bytes: mem, compute_share_bps: 0, compute_limit_bps: 0 }],
        ..Default::default()
    };
    c.create_slice(mk("steady", 2 << 30, second)).await.map_err(crate::exit::status)?;
    c.create_slice(mk("small", 1 << 30, 0)).await.map_err(crate::exit::status)?;
    show_slices(c).await?;

    step(3, "Workload A (in `steady`) allocates 1GiB in 64MiB pieces and holds it.");
    let mut a = Workload::probe(c, "steady", &["alloc", "--family", "mem", "--size", "64MiB", "--count", "16", "--hold"]).await?;
    let held = a.wait_event(&["holding"], T).await?;
    println!("    A holds {} allocations: fine, it is within its 2GiB.", held["allocated"]);

    step(4, "Workload B (in `small`) wants 2GiB, 256MiB at a time, but its slice allows 1GiB.");
    let mut b = Workload::probe(c, "small", &["grow", "--step", "256MiB", "--until", "2GiB", "--hold"]).await?;
    let blocked = b.wait_event(&["blocked", "holding"], T).await?;
    if blocked["event"] != "blocked" {
        anyhow::bail!("workload B was never limited: {blocked}");
    }
    println!(
        "    B reached its limit: the next cuMemAlloc was refused with CUDA_ERROR_OUT_OF_MEMORY after {} ({} free in its view).",
        Bytes(blocked["total"].as_u64().unwrap_or(0)),
        Bytes(blocked["mem"]["free"].as_u64().unwrap_or(0))
    );
    println!("    B keeps running and retries every millisecond; nothing was killed, A is unaffected.");
    show_slices(c).await?;

    step(5, "Raising `small` to 3GiB live (`egpu resize small --gpu-memory 3GiB`).");
    let t0 = egpu_abi::monotonic_ns();
    let req = proto::ResizeSliceRequest { name: "small".into(), memory_bytes: Some(3 << 30), ..Default::default() };
    c.resize_slice(req).await.map_err(crate::exit::status)?;
    let t1 = egpu_abi::monotonic_ns();
    let un = b.wait_event(&["unblocked"], T).await?;
    let seen = un["t_ns"].as_u64().unwrap_or(t1);
    println!(
        "    The resize call took {:.3} ms; B's next allocation succeeded {:.3} ms after it returned (B retries every ~1 ms).",
        (t1 - t0) as f64 / 1e6,
        seen.saturating_sub(t1) as f64 / 1e6
    );
    b.wait_event(&["holding"], T).await?;
    println!("    B now holds its 2GiB, no restart needed.");

    step(6, "Slices now:");
    show_slices(c).await?;
    let n = cmd::get_node(c).await?;
    for d in &n.devices {
        println!("    GPU {}: driver reports {} used, slices reserve {}.", d.index, Bytes(d.driver_used_bytes), Bytes(d.allocated_memory_bytes));
    }

    step(7, "Stopping the workloads and removing the slices.");
    let (ca, cb) = (a.finish().await?, b.finish().await?);
    println!("    workload A exited {ca}, workload B exited {cb}.");
    for name in ["steady", "small"] {
        c.delete_slice(proto::DeleteSliceRequest { name: name.into(), force: false }).await.map_err(crate::exit::status)?;
    }
    println!("\nSummary: 2 slices (steady 2GiB, small 1GiB -> 3GiB); B was refused at its limit, then a live resize");
    println!("let it continue {:.3} ms after the resize returned.", seen.saturating_sub(t1) as f64 / 1e6);
    Ok(())
}
