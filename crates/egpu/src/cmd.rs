//! The commands that talk to egpud.

use crate::cli::{BenchCommand, Cli, Command, Format, LimitArgs};
use crate::exit::{self, Failure};
use crate::output;
use egpu_core::Percent;
use egpu_node::client::{self, Client};
use egpu_node::proto;
use egpu_node::wire::{env_from_wire, priority_to_wire};
use std::path::Path;

/// Runs a parsed command line; returns the exit code.
pub async fn run(cli: Cli) -> anyhow::Result<i32> {
    let socket = &cli.socket();
    match cli.command {
        Command::Devices(o) => {
            let n = output::node_out(get_node(&mut connect(socket).await?).await?);
            print_out(o.format, &n, output::devices_table)?;
        }
        Command::Ls(o) => {
            let mut c = connect(socket).await?;
            let list = c.list_slices(proto::ListSlicesRequest {}).await.map_err(exit::status)?.into_inner();
            // Not in the list (they have no limits egpud can read), but
            // their memory is reserved: say which and why, beside it.
            for u in &list.unadopted {
                eprintln!("egpu: slice '{}' ({}) is stored but egpud could not open its slice-table files, so it is not listed; its memory stays reserved at its burst cap and egpud tries again at every sweep: {}", u.name, u.id, u.error);
            }
            let slices: Vec<_> = list.slices.into_iter().map(output::slice_out).collect();
            print_out(o.format, &slices, |s| output::slices_table(s))?;
        }
        Command::Get { name, out } => {
            let mut c = connect(socket).await?;
            let s = output::slice_out(c.get_slice(proto::GetSliceRequest { name }).await.map_err(exit::status)?.into_inner());
            print_out(out.format, &s, |s| output::slices_table(std::slice::from_ref(s)))?;
        }
        Command::Create { name, limits } => {
            let mut c = connect(socket).await?;
            let s = create(&mut c, name, &limits, false).await?;
            output::print(&format!("{}\n", s.id))?;
        }
        Command::Resize { name, limits } => {
            let mut c = connect(socket).await?;
            let s = c.resize_slice(resize_request(name, &limits)?).await.map_err(exit::status)?.into_inner();
            let limits: Vec<String> = s.devices.iter().map(|d| format!("device {}: {}", d.device, egpu_core::Bytes(d.memory_limit_bytes))).collect();
            output::print(&format!("resized {} ({})\n", s.name, limits.join(", ")))?;
        }
        Command::Rm { name, force } => {
            let mut c = connect(socket).await?;
            let r = c.delete_slice(proto::DeleteSliceRequest { name: name.clone(), force }).await.map_err(exit::status)?.into_inner();
            if r.attached_pids.is_empty() {
                output::print(&format!("removed {name}\n"))?;
            } else {
                output::print(&format!("removed {name}; processes {:?} keep running but can no longer allocate\n", r.attached_pids))?;
            }
        }
        Command::Env { name } => {
            let mut c = connect(socket).await?;
            for e in launch_env(&mut c, &name).await? {
                let v = egpu_node::launch::combine(&e, std::env::var(&e.name).ok().as_deref());
                output::print(&format!("export {}='{}'\n", e.name, v.replace('\'', "'\\''")))?;
            }
        }
        Command::Exec { name, cmd } => {
            let mut c = connect(socket).await?;
            let env = launch_env(&mut c, &name).await?;
            drop(c);
            return crate::process::run(&cmd, &env).await;
        }
        Command::Run { name, limits, cmd } => return run_ephemeral(socket, name, &limits, &cmd).await,
        Command::Simulate(args) => {
            tokio::task::spawn_blocking(move || egpu_sim::cli::run(*args)).await??;
        }
        Command::Top(args) => return crate::top::run(socket, args).await,
        Command::Demo(args) => return crate::demo::run(args).await,
        Command::Bench(BenchCommand::Resize(args)) => return crate::bench::resize(socket, args).await,
        Command::ExecGate { fd, cmd } => return Ok(crate::process::exec_gate(fd, &cmd)),
    }
    Ok(0)
}

fn print_out<T: serde::Serialize>(format: Format, v: &T, table: impl Fn(&T) -> String) -> std::io::Result<()> {
    output::print(&match format {
        Format::Json => output::json(v),
        Format::Table => table(v),
    })
}

pub async fn connect(socket: &Path) -> anyhow::Result<Client> {
    Ok(client::connect(socket).await?)
}

pub async fn get_node(c: &mut Client) -> anyhow::Result<proto::GetNodeResponse> {
    Ok(c.get_node(proto::GetNodeRequest {}).await.map_err(exit::status)?.into_inner())
}

pub async fn launch_env(c: &mut Client, name: &str) -> anyhow::Result<Vec<egpu_node::launch::EnvEntry>> {
    let r = c.launch_env(proto::LaunchEnvRequest { name: name.into() }).await.map_err(exit::status)?.into_inner();
    Ok(r.env.iter().map(env_from_wire).collect())
}

/// Devices for a new slice: the ones asked for, or the first device with room.
async fn pick_devices(c: &mut Client, limits: &LimitArgs, memory: u64) -> anyhow::Result<Vec<u32>> {
    if !limits.devices.is_empty() {
        return Ok(limits.devices.clone());
    }
    let node = get_node(c).await?;
    let share = limits.compute_share.unwrap_or(Percent::ZERO).0;
    let free = |d: &proto::Device| d.memory_bytes.saturating_sub(d.allocated_memory_bytes).saturating_sub(d.lent_memory_bytes);
    let fits = node.devices.iter().find(|d| free(d) >= memory && 10_000 - d.allocated_compute_bps.min(10_000) >= share);
    // Nothing fits: ask for the roomiest device so egpud's refusal names what is free.
    let pick = fits.or_else(|| node.devices.iter().max_by_key(|d| free(d)));
    pick.map(|d| vec![d.index]).ok_or_else(|| Failure::new(exit::NOT_FOUND, "egpud reports no devices").into())
}

pub async fn create(c: &mut Client, name: String, limits: &LimitArgs, ephemeral: bool) -> anyhow::Result<proto::Slice> {
    let memory = limits
        .memory
        .ok_or_else(|| Failure::new(exit::USAGE, "a slice needs a memory limit: add --gpu-memory SIZE (e.g. --gpu-memory 4GiB)"))?
        .0;
    let devices = pick_devices(c, limits, memory).await?;
    let req = proto::CreateSliceRequest {
        name,
        priority: limits.priority.map(|p| priority_to_wire(p) as i32).unwrap_or(0),
        devices: devices
            .into_iter()
            .map(|device| proto::DeviceShareSpec {
                device,
                memory_bytes: memory,
                compute_share_bps: limits.compute_share.map(|p| p.0).unwrap_or(0),
                compute_limit_bps: limits.compute_limit.map(|p| p.0).unwrap_or(0),
                memory_burst_bytes: limits.memory_burst.map(|b| b.0).unwrap_or(0),
            })
            .collect(),
        ephemeral,
        owner_pid: if ephemeral { std::process::id() } else { 0 },
    };
    Ok(c.create_slice(req).await.map_err(exit::status)?.into_inner())
}

pub fn resize_request(name: String, l: &LimitArgs) -> anyhow::Result<proto::ResizeSliceRequest> {
    if l.memory.is_none() && l.memory_burst.is_none() && l.compute_share.is_none() && l.compute_limit.is_none() && l.priority.is_none() {
        return Err(Failure::new(exit::USAGE, "nothing to change: give --gpu-memory, --gpu-memory-burst, --gpu-compute, --gpu-compute-limit or --priority").into());
    }
    Ok(proto::ResizeSliceRequest {
        name,
        devices: l.devices.clone(),
        memory_bytes: l.memory.map(|b| b.0),
        memory_burst_bytes: l.memory_burst.map(|b| b.0),
        compute_share_bps: l.compute_share.map(|p| p.0),
        compute_limit_bps: l.compute_limit.map(|p| p.0),
        priority: l.priority.map(|p| priority_to_wire(p) as i32).unwrap_or(0),
    })
}

/// `egpu run`: a slice that lives as long as the program.
async fn run_ephemeral(socket: &Path, name: Option<String>, limits: &LimitArgs, cmd: &[String]) -> anyhow::Result<i32> {
    let mut c = connect(socket).await?;
    let name = name.unwrap_or_else(|| format!("run-{}", std::process::id()));
    let slice = create(&mut c, name.clone(), limits, true).await?;
    let result = async {
        let env = launch_env(&mut c, &slice.name).await?;
        // The program is started held (`egpu internal-exec-gate`, same pid) and
        // only becomes PROG once egpud knows its pid: were this command killed
        // before, the held process sees EOF and never starts PROG, rather than
        // running PROG in a slice egpud is about to collect.
        let (running, release) = crate::process::start_gated(cmd, &env)?;
        // Tell egpud which process the slice runs, so that it keeps the slice while that
        // process lives even if we die first. An egpud without this call keeps the older rule.
        let report = proto::SetWorkloadRequest { name: slice.name.clone(), pid: running.pid() };
        #[cfg(debug_assertions)]
        if std::env::var_os("EGPU_TEST_EXIT_BEFORE_REGISTER").is_some() {
            eprintln!("egpu: test: exiting before registering pid {}", running.pid());
            std::process::exit(99);
        }
        // If registering fails or hangs, the program still starts (the slice
        // lives while this command does), with a warning.
        match tokio::time::timeout(std::time::Duration::from_secs(10), c.set_workload(report)).await {
            Ok(Ok(_)) => {}
            Ok(Err(s)) if s.code() == tonic::Code::Unimplemented => {}
            Ok(Err(s)) => eprintln!("egpu: could not register the program with egpud: {} (if this command dies, the slice may be removed under it)", s.message()),
            Err(_) => eprintln!("egpu: egpud did not answer the program's registration within 10 s; starting it anyway (if this command dies, the slice may be removed under it)"),
        }
        release.go();
        running.wait().await
    }
    .await;
    // Remove the slice whatever happened; egpud also collects it if we die first.
    // By id: if the slice was removed meanwhile and another took its name,
    // that one is not ours to remove. Not forced: processes PROG left
    // running in the background keep the slice, and its reservation, until
    // they exit; egpud's sweeper removes it then (this command, its owner,
    // is gone by then).
    let removed = c.delete_slice(proto::DeleteSliceRequest { name: slice.id.clone(), force: false }).await;
    match removed {
        Ok(_) => {}
        // Somebody removed it already.
        Err(s) if s.code() == tonic::Code::NotFound => {}
        Err(s) if s.code() == tonic::Code::FailedPrecondition => eprintln!(
            "egpu: {} exited, but processes it started are still attached to slice {}; the slice keeps its limits until they exit, then egpud removes it (`egpu rm --force {}` removes it now)",
            cmd[0], slice.name, slice.name
        ),
        Err(s) => eprintln!("egpu: could not remove slice {}: {} (egpud removes it once this process is gone)", slice.name, s.message()),
    }
    result
}
