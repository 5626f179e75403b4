//! `egpu-mkslice`: writes a slice table directly (what `egpud` does), for
//! benchmarks and tests that run without the node agent.
//!
//! `egpu-mkslice DIR UUID:HOST_INDEX:LIMIT...` creates `DIR/limits` and
//! `DIR/usage`; `egpu-mkslice --resize DIR LIMIT...` publishes new limits.

use anyhow::{Context, bail};
use egpu_abi::limits::DeviceInit;
use egpu_abi::{DeviceLimitsSnapshot, LimitsWriter, UsageFile, paths};
use std::path::PathBuf;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--resize") {
        let dir = PathBuf::from(args.get(1).context("usage: egpu-mkslice --resize DIR LIMIT...")?);
        let w = LimitsWriter::open(&paths::limits_path(&dir))?;
        let mut v = w.snapshot().devices().to_vec();
        for (d, l) in v.iter_mut().zip(&args[2..]) {
            d.mem_limit = egpu_workloads::parse_bytes(l).map_err(anyhow::Error::msg)?;
        }
        w.publish(w.snapshot().priority, &v)?;
        return Ok(());
    }
    if args.len() < 2 {
        bail!("usage: egpu-mkslice DIR UUID:HOST_INDEX:LIMIT... | egpu-mkslice --resize DIR LIMIT...");
    }
    let dir = PathBuf::from(&args[0]);
    std::fs::create_dir_all(&dir)?;
    let mut devs = Vec::new();
    for spec in &args[1..] {
        let mut it = spec.rsplitn(3, ':');
        let (limit, host, uuid) = (it.next(), it.next(), it.next());
        let (Some(limit), Some(host), Some(uuid)) = (limit, host, uuid) else { bail!("device '{spec}' is not UUID:HOST_INDEX:LIMIT") };
        let host: u32 = host.parse().context("host index")?;
        let mem_limit = egpu_workloads::parse_bytes(limit).map_err(anyhow::Error::msg)?;
        devs.push(DeviceInit { uuid: uuid.into(), host_index: host, limits: DeviceLimitsSnapshot { host_index: host, mem_limit, compute_share_bps: 10_000, compute_limit_bps: 10_000 } });
    }
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("slice");
    LimitsWriter::create(&paths::limits_path(&dir), name, 1, &devs)?;
    UsageFile::create(&paths::usage_path(&dir), devs.len())?;
    println!("{}", dir.display());
    Ok(())
}
