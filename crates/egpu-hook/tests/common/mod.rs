//! Harness for whole-process tests on the simulated GPU: builds the hook,
//! the simulated driver and `egpu-probe` once, creates slices directly with
//! `egpu_abi` (the test plays `egpud`), and runs probes under `LD_PRELOAD`.
#![allow(dead_code)]

use egpu_abi::limits::DeviceInit;
use egpu_abi::{DeviceLimitsSnapshot, LimitsWriter, UsageFile, paths};
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::OnceLock;

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// target/<profile>, from this test executable's path (target/<profile>/deps/x).
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent().and_then(Path::parent).expect("target/<profile>").to_path_buf()
}

/// Runs `cargo build -q -p PKG...` in this test's profile, unless
/// `EGPU_TEST_PREBUILT` is set: `scripts/test.sh` builds the whole workspace
/// first and sets it, so that each of the many test processes does not queue
/// on cargo's build lock only to find nothing to do.
pub fn cargo_build(packages: &[&str]) {
    if std::env::var_os("EGPU_TEST_PREBUILT").is_some() {
        return;
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut c = Command::new(cargo);
    c.args(["build", "-q"]);
    for p in packages {
        c.args(["-p", p]);
    }
    if target_dir().file_name().is_some_and(|n| n == "release") {
        c.arg("--release");
    }
    let st = c.status().expect("run cargo build");
    assert!(st.success(), "cargo build of {packages:?} failed");
}

/// Builds libegpu.so, the simulated driver, egpu-probe and egpu-burn (same profile as this test).
pub fn build() -> &'static PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let dir = target_dir();
        cargo_build(&["egpu-hook", "egpu-simgpu", "egpu-workloads", "egpu-burn"]);
        for f in ["libegpu.so", "libegpu_simgpu.so", "egpu-probe", "egpu-burn"] {
            assert!(dir.join(f).exists(), "{} missing after build", dir.join(f).display());
        }
        dir
    })
}

pub fn sim_uuid(i: u32) -> String {
    egpu_core::simspec::sim_uuid(i)
}

/// A simulated machine: its own state file and library directory.
pub struct World {
    pub tmp: tempfile::TempDir,
    pub gpus: String,
    pub lib: PathBuf,
    pub state: PathBuf,
    pub bin: PathBuf,
}

impl World {
    pub fn new(gpus: &str) -> World {
        let bin = build().clone();
        let tmp = tempfile::tempdir().expect("tempdir");
        let lib = tmp.path().join("lib");
        egpu_simgpu::link_dir(&bin.join("libegpu_simgpu.so"), &lib).expect("simulated driver links");
        let state = tmp.path().join("sim.state");
        World { gpus: gpus.into(), lib, state, bin, tmp }
    }

    /// A slice over host devices `devs` with the given limits (slice order).
    pub fn slice(&self, name: &str, devs: &[(u32, u64)]) -> Slice {
        let dir = self.tmp.path().join("slices").join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let init: Vec<DeviceInit> = devs
            .iter()
            .map(|&(h, l)| DeviceInit { uuid: sim_uuid(h), host_index: h, limits: DeviceLimitsSnapshot { host_index: h, mem_limit: l, compute_share_bps: 10_000, compute_limit_bps: 10_000 } })
            .collect();
        let writer = LimitsWriter::create(&paths::limits_path(&dir), name, 1, &init).unwrap();
        let usage = UsageFile::create(&paths::usage_path(&dir), devs.len()).unwrap();
        Slice { dir, writer, usage, uuids: devs.iter().map(|&(h, _)| sim_uuid(h)).collect() }
    }

    /// `egpu-probe ARGS` on the simulated GPU, without the hook.
    pub fn bare(&self, args: &[&str]) -> Command {
        let mut c = Command::new(self.bin.join("egpu-probe"));
        c.args(args)
            .env("LD_LIBRARY_PATH", &self.lib)
            .env("EGPU_SIM_GPUS", &self.gpus)
            .env("EGPU_SIM_STATE", &self.state)
            .env("EGPU_SIM_NS_PER_THREAD", "0")
            .env_remove("LD_PRELOAD")
            .env_remove("EGPU_SLICE_DIR")
            .env_remove("CUDA_VISIBLE_DEVICES")
            .env_remove("EGPU_PROBE_VIA");
        c
    }

    /// `egpu-probe ARGS` in `slice`, under the hook.
    pub fn probe(&self, slice: &Slice, args: &[&str]) -> Command {
        let mut c = self.bare(args);
        c.env("LD_PRELOAD", self.bin.join("libegpu.so")).env("EGPU_SLICE_DIR", &slice.dir).env("CUDA_VISIBLE_DEVICES", slice.uuids.join(","));
        c
    }

    /// The simulated driver's own device memory in use (NVML, no hook): the independent witness.
    pub fn sim_used(&self, host_index: usize) -> u64 {
        let out = run_json(self.bare(&["info"]));
        let v = out.last().expect("info line");
        v["nvml"]["devices"][host_index]["memory"]["used"].as_u64().unwrap_or_else(|| panic!("no NVML used for device {host_index}: {v}"))
    }
}

pub struct Slice {
    pub dir: PathBuf,
    pub writer: LimitsWriter,
    pub usage: UsageFile,
    pub uuids: Vec<String>,
}

impl Slice {
    /// Sum of charged records on slice device `d`.
    pub fn used(&self, d: usize) -> u64 {
        self.usage.used(d)
    }

    /// Publishes new memory limits (slice order), as `egpud` does on resize.
    pub fn set_limits(&self, limits: &[u64]) {
        let mut v = self.writer.snapshot().devices().to_vec();
        for (d, l) in v.iter_mut().zip(limits) {
            d.mem_limit = *l;
        }
        self.writer.publish(1, &v).unwrap();
    }
}

/// Runs to completion; returns the JSON lines (panics on non-JSON stdout lines).
pub fn run_json(mut c: Command) -> Vec<Value> {
    let out = c.output().expect("spawn egpu-probe");
    parse_lines(&String::from_utf8_lossy(&out.stdout), &String::from_utf8_lossy(&out.stderr))
}

pub fn parse_lines(stdout: &str, stderr: &str) -> Vec<Value> {
    stdout.lines().filter(|l| !l.trim().is_empty()).map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l:?} ({e}); stderr: {stderr}"))).collect()
}

/// Output of a finished probe.
pub struct Done {
    pub code: i32,
    pub lines: Vec<Value>,
    pub stderr: String,
}

impl Done {
    pub fn event(&self, name: &str) -> &Value {
        self.lines.iter().find(|v| v["event"] == name).unwrap_or_else(|| panic!("no '{name}' event in {:?}; stderr: {}", self.lines, self.stderr))
    }
}

pub fn run(mut c: Command) -> Done {
    let out = c.output().expect("spawn egpu-probe");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    Done { code: out.status.code().unwrap_or(-1), lines: parse_lines(&String::from_utf8_lossy(&out.stdout), &stderr), stderr }
}

/// A running probe whose JSON lines are read as they come; closing stdin releases a `--hold`.
pub struct Running {
    pub child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    pub seen: Vec<Value>,
}

impl Running {
    pub fn start(mut c: Command) -> Running {
        c.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit());
        let mut child = c.spawn().expect("spawn egpu-probe");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Running { child, stdin, stdout, seen: Vec::new() }
    }

    /// Reads lines until an event named `name` (panics at EOF).
    pub fn wait_for(&mut self, name: &str) -> Value {
        loop {
            let mut l = String::new();
            let n = self.stdout.read_line(&mut l).expect("read probe stdout");
            assert!(n > 0, "probe exited before '{name}'; saw {:?}", self.seen);
            let v: Value = serde_json::from_str(l.trim()).unwrap_or_else(|e| panic!("not JSON: {l:?} ({e})"));
            self.seen.push(v.clone());
            if v["event"] == name {
                return v;
            }
        }
    }

    /// Closes stdin (ends a hold) and waits; returns the exit code and the remaining lines.
    pub fn finish(mut self) -> (i32, Vec<Value>) {
        drop(self.stdin.take());
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut self.stdout, &mut rest);
        let st = self.child.wait().expect("wait probe");
        (st.code().unwrap_or(-1), parse_lines(&rest, ""))
    }

    pub fn write(&mut self, s: &str) {
        if let Some(i) = self.stdin.as_mut() {
            let _ = i.write_all(s.as_bytes());
        }
    }
}
