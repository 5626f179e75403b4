//! A throw-away node for `egpu demo` and `egpu bench`: egpud started from
//! next to this executable in a temporary directory (simulated GPUs unless
//! NVML finds real ones), and workloads (egpu-probe) started in its slices
//! with the environment egpud computes.

use crate::process;
use anyhow::{Context, bail};
use egpu_node::client::{self, Client};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

pub fn exe_dir() -> PathBuf {
    std::env::current_exe().ok().and_then(|p| p.parent().map(Path::to_path_buf)).unwrap_or_default()
}

/// Whether this machine has an NVIDIA GPU that NVML can see.
pub fn real_gpu_present() -> bool {
    Path::new("/dev/nvidiactl").exists()
        && egpu_node::devices::NvmlGpus::load(Path::new("libnvidia-ml.so.1"), Vec::new())
            .and_then(|g| egpu_node::devices::Gpus::inventory(&g))
            .is_ok()
}

pub struct LocalNode {
    pub dir: PathBuf,
    pub socket: PathBuf,
    pub simulate: Option<String>,
    daemon: Option<Child>,
}

impl LocalNode {
    /// Starts egpud in a fresh temporary directory and connects to it.
    pub async fn start(simulate: Option<String>) -> anyhow::Result<(LocalNode, Client)> {
        let egpud = exe_dir().join("egpud");
        if !egpud.exists() {
            bail!("{} not found: build the workspace first (cargo build --release --workspace)", egpud.display());
        }
        let dir = std::env::temp_dir().join(format!("egpu-demo-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let run = dir.join("run");
        let socket = run.join("egpud.sock");
        let log = std::fs::File::create(dir.join("egpud.log"))?;
        let mut cmd = tokio::process::Command::new(&egpud);
        cmd.arg("--run-dir").arg(&run).arg("--state-dir").arg(dir.join("state")).stdout(Stdio::null()).stderr(log).kill_on_drop(true);
        if let Some(spec) = &simulate {
            cmd.args(["--simulate", spec]);
        }
        let mut daemon = cmd.spawn().with_context(|| format!("starting {}", egpud.display()))?;
        let deadline = Instant::now() + Duration::from_secs(30);
        let client = loop {
            if let Some(st) = daemon.try_wait()? {
                let log = std::fs::read_to_string(dir.join("egpud.log")).unwrap_or_default();
                bail!("egpud exited ({st}) while starting:\n{log}");
            }
            if let Ok(c) = client::connect(&socket).await {
                break c;
            }
            if Instant::now() > deadline {
                bail!("egpud did not answer on {} within 30 s", socket.display());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        Ok((LocalNode { dir, socket, simulate, daemon: Some(daemon) }, client))
    }

    pub fn daemon_pid(&self) -> Option<u32> {
        self.daemon.as_ref().and_then(|d| d.id())
    }

    /// Stops egpud (SIGTERM, then SIGKILL after 5 s) and removes the temporary directory.
    pub async fn stop(mut self) {
        if let Some(mut d) = self.daemon.take() {
            if let Some(pid) = d.id() {
                process::send_signal(pid, libc::SIGTERM);
            }
            if tokio::time::timeout(Duration::from_secs(5), d.wait()).await.is_err() {
                let _ = d.kill().await;
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A workload whose JSON-lines stdout is read event by event.
pub struct Workload {
    pub child: Child,
    stdin: Option<ChildStdin>,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Workload {
    /// Starts egpu-probe (next to this executable) with `args` in slice `name`.
    pub async fn probe(client: &mut Client, name: &str, args: &[&str]) -> anyhow::Result<Workload> {
        let probe = exe_dir().join("egpu-probe");
        if !probe.exists() {
            bail!("{} not found: build the workspace first (cargo build --release --workspace)", probe.display());
        }
        let env = crate::cmd::launch_env(client, name).await?;
        let mut argv = vec![probe.display().to_string()];
        argv.extend(args.iter().map(|s| s.to_string()));
        let mut child = process::command(&argv, &env).stdin(Stdio::piped()).stdout(Stdio::piped()).kill_on_drop(true).spawn()?;
        let stdin = child.stdin.take();
        let lines = BufReader::new(child.stdout.take().expect("piped")).lines();
        Ok(Workload { child, stdin, lines })
    }

    /// The next JSON line whose "event" is one of `events`, within `timeout`.
    pub async fn wait_event(&mut self, events: &[&str], timeout: Duration) -> anyhow::Result<serde_json::Value> {
        let fut = async {
            while let Some(line) = self.lines.next_line().await? {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line)
                    && events.iter().any(|e| v["event"] == *e)
                {
                    return Ok(v);
                }
            }
            bail!("workload exited before reporting {events:?}")
        };
        tokio::time::timeout(timeout, fut).await.with_context(|| format!("workload did not report {events:?} within {timeout:?}"))?
    }

    /// Closes stdin (a holding probe frees and exits) and waits.
    pub async fn finish(mut self) -> anyhow::Result<i32> {
        drop(self.stdin.take());
        let st = tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await.context("workload did not exit")??;
        Ok(process::exit_code(st))
    }
}
