//! Harness for end-to-end compute-isolation tests on the simulated GPU.
//!
//! The test plays `egpud`: it writes slice tables with shares, limits and
//! priorities, and runs the real arbiter (`Arbiter::tick_tables`) every
//! period in a thread, with each slice's *true* GPU time taken from the
//! simulated GPU's own per-process busy time. Workloads are `egpu-burn`
//! processes under `LD_PRELOAD=libegpu.so`. What a slice achieved is read
//! from the simulated GPU (the independent witness), never from the hook.
#![allow(dead_code)]

use egpu_abi::limits::DeviceInit;
use egpu_abi::{DeviceLimitsSnapshot, LimitsWriter, UsageFile, paths};
use egpu_arbiter::{Arbiter, ArbiterConfig, TableRef};
use egpu_core::Priority;
use egpu_simgpu::state::{MAX_SLOTS, Shared, SlotState};
use serde_json::Value;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Simulated ns per thread: egpu-burn's default 64×128 grid is a 410 µs kernel
/// (long enough that a burner woken a little late still finds work queued).
pub const NS_PER_THREAD: &str = "50";

#[path = "../common/mod.rs"]
mod base;
/// The one-time build of the binaries, shared with the memory tests (used
/// by `compute-bench`; `Machine::new` builds through `World::new`).
#[allow(unused_imports)]
pub use base::build;

/// A simulated machine with its own state file.
pub struct Machine {
    pub tmp: tempfile::TempDir,
    pub gpus: String,
    pub lib: PathBuf,
    pub state: PathBuf,
    pub bin: PathBuf,
    pub sim: &'static Shared,
}

/// One slice's table, as `egpud` holds it.
pub struct TestSlice {
    pub dir: PathBuf,
    pub writer: LimitsWriter,
    pub usage: UsageFile,
    pub uuid: String,
    pub host: u32,
    /// Processes of the slice (the harness maps them to true GPU time).
    pub pids: Mutex<Vec<u32>>,
    /// The arbiter loop to wake on a resize (set by [`Egpud::start`]).
    wake: Mutex<Option<Arc<Wake>>>,
}

/// A resize notification for the arbiter loop (egpud's Resize RPC wakes its
/// loop the same way).
#[derive(Default)]
struct Wake {
    resized: Mutex<bool>,
    cv: std::sync::Condvar,
}

impl TestSlice {
    /// A compute resize (share, limit in %), as `egpud` publishes it.
    pub fn set_compute(&self, share: u32, limit: u32) {
        let snap = self.writer.snapshot();
        let mut v = snap.devices().to_vec();
        v[0].compute_share_bps = share * 100;
        v[0].compute_limit_bps = limit * 100;
        self.writer.publish(snap.priority, &v).unwrap();
        if let Some(w) = self.wake.lock().unwrap().as_ref() {
            *w.resized.lock().unwrap() = true;
            w.cv.notify_one();
        }
    }
}

impl Machine {
    pub fn new(gpus: &str) -> Machine {
        let base::World { tmp, gpus, lib, state, bin } = base::World::new(gpus);
        let spec: egpu_core::SimSpec = gpus.parse().expect("sim spec");
        let totals: Vec<u64> = spec.devices.iter().map(|d| d.memory.0).collect();
        let sim = Shared::attach(&state, &egpu_simgpu::config::canonical(&spec), &gpus, &totals).expect("attach simulated GPU state");
        Machine { gpus, lib, state, bin, tmp, sim }
    }

    /// A one-device slice on host device `host`: share and limit in %.
    pub fn slice(&self, name: &str, host: u32, share: u32, limit: u32, prio: Priority) -> Arc<TestSlice> {
        let dir = self.tmp.path().join("slices").join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let uuid = egpu_core::simspec::sim_uuid(host);
        let init = DeviceInit {
            uuid: uuid.clone(),
            host_index: host,
            limits: DeviceLimitsSnapshot { host_index: host, mem_limit: 4 << 30, compute_share_bps: share * 100, compute_limit_bps: limit * 100 },
        };
        let writer = LimitsWriter::create(&paths::limits_path(&dir), name, prio.code(), &[init]).unwrap();
        let usage = UsageFile::create(&paths::usage_path(&dir), 1).unwrap();
        Arc::new(TestSlice { dir, writer, usage, uuid, host, pids: Mutex::new(Vec::new()), wake: Mutex::new(None) })
    }

    /// `egpu-burn ARGS -o json` in `slice` under the hook; registered as the slice's process.
    /// `c` set up to run in `slice` on this machine's simulated GPU, hooked.
    pub fn in_slice<'c>(&self, c: &'c mut Command, slice: &TestSlice) -> &'c mut Command {
        c.env("LD_LIBRARY_PATH", &self.lib)
            .env("EGPU_SIM_GPUS", &self.gpus)
            .env("EGPU_SIM_STATE", &self.state)
            .env("EGPU_SIM_NS_PER_THREAD", NS_PER_THREAD)
            .env("LD_PRELOAD", self.bin.join("libegpu.so"))
            .env("EGPU_SLICE_DIR", &slice.dir)
            .env("CUDA_VISIBLE_DEVICES", &slice.uuid)
    }

    pub fn burn(&self, slice: &TestSlice, args: &[&str]) -> Burn {
        self.burn_env(slice, args, &[])
    }

    /// [`Machine::burn`] with extra environment variables.
    pub fn burn_env(&self, slice: &TestSlice, args: &[&str], env: &[(&str, &str)]) -> Burn {
        let mut c = Command::new(self.bin.join("egpu-burn"));
        c.args(args).args(["-o", "json"]).envs(env.iter().copied());
        self.in_slice(&mut c, slice)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = c.spawn().expect("spawn egpu-burn");
        slice.pids.lock().unwrap().push(child.id());
        Burn { child, host: slice.host }
    }

    /// The simulated GPU's kernel time of `pid` on host device `host` that has
    /// run by now (None: no live slot).
    pub fn busy_of(&self, pid: u32, host: u32) -> Option<u64> {
        (0..MAX_SLOTS).find(|&i| self.sim.slot_owner(i) == (pid, SlotState::Live)).map(|i| self.sim.executed(i, host as usize, monotonic_ns()))
    }
}

pub struct Burn {
    pub child: Child,
    pub host: u32,
}

impl Burn {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for exit; returns (exit code, JSON lines, stderr).
    pub fn finish(self) -> (i32, Vec<Value>, String) {
        let out = self.child.wait_with_output().expect("wait egpu-burn");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let lines = stdout.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
        (out.status.code().unwrap_or(-1), lines, String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// The (p50, p99) latency, µs, of a `--mode latency` burn's whole run (its
/// `latency-total` report among the JSON lines `Burn::finish` returns).
pub fn latency_total(lines: &[Value]) -> Option<(f64, f64)> {
    let t = lines.iter().rev().find(|v| v["mode"] == "latency-total")?;
    Some((t["latency_p50_us"].as_f64()?, t["latency_p99_us"].as_f64()?))
}

/// The arbiter loop `egpud` runs, in a thread: every period, true GPU time
/// per slice from the simulated GPU (what has run, as NVML accounting
/// reports it), then `tick_tables`; woken by [`TestSlice::set_compute`]
/// between ticks, `replan_tables` (as egpud's Resize RPC wakes its loop).
pub struct Egpud {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<u64>>,
}

impl Egpud {
    pub fn start(m: &Machine, slices: &[Arc<TestSlice>]) -> Egpud {
        let stop = Arc::new(AtomicBool::new(false));
        let slices: Vec<Arc<TestSlice>> = slices.to_vec();
        let wake = Arc::new(Wake::default());
        for s in &slices {
            *s.wake.lock().unwrap() = Some(wake.clone());
        }
        let sim = m.sim;
        let st = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut arb = Arbiter::new(ArbiterConfig::default());
            let period = Duration::from_nanos(arb.config().period_ns);
            // Last seen busy per pid (kept after exit: truth stays monotonic).
            let mut last: std::collections::HashMap<u32, u64> = Default::default();
            let mut next = Instant::now();
            let mut ticks = 0;
            let trace = std::env::var_os("EGPU_ARBITER_TRACE").is_some();
            while !st.load(Ordering::Relaxed) {
                let truth: Vec<[Option<u64>; 1]> = slices
                    .iter()
                    .map(|s| {
                        let pids = s.pids.lock().unwrap().clone();
                        let mut sum = 0;
                        for p in pids {
                            if let Some(i) = (0..MAX_SLOTS).find(|&i| sim.slot_owner(i) == (p, SlotState::Live)) {
                                last.insert(p, sim.executed(i, s.host as usize, monotonic_ns()));
                            }
                            sum += last.get(&p).copied().unwrap_or(0);
                        }
                        [Some(sum)]
                    })
                    .collect();
                let refs: Vec<TableRef<'_>> = slices
                    .iter()
                    .zip(&truth)
                    .enumerate()
                    .map(|(i, (s, t))| TableRef { slice: i as u64, limits: &s.writer, usage: &s.usage, true_ns: t })
                    .collect();
                let (budgets, errs) = arb.tick_tables(monotonic_ns(), &refs);
                assert!(errs.is_empty(), "{errs:?}");
                if trace {
                    // Per slice: true use last period, budget, scale (×100), hungry; in 10 µs.
                    let row: Vec<String> = budgets
                        .iter()
                        .map(|b| format!("{}/{}/{}{}", b.used_ns / 10_000, b.budget_ns / 10_000, b.scale_ppm / 10_000, if b.hungry { "h" } else { "" }))
                        .collect();
                    eprintln!("tick {ticks}: {}", row.join(" "));
                }
                ticks += 1;
                next += period;
                let now = Instant::now();
                if next <= now {
                    next = now;
                }
                // Until the next tick; a resize is re-planned at once (at
                // most once between two ticks, as in egpud).
                let mut resized = wake.resized.lock().unwrap();
                let mut replanned = false;
                loop {
                    if !replanned && std::mem::take(&mut *resized) {
                        replanned = true;
                        drop(resized);
                        let none = [None];
                        let refs: Vec<TableRef<'_>> =
                            slices.iter().enumerate().map(|(i, s)| TableRef { slice: i as u64, limits: &s.writer, usage: &s.usage, true_ns: &none }).collect();
                        let (_, errs) = arb.replan_tables(&refs);
                        assert!(errs.is_empty(), "{errs:?}");
                        resized = wake.resized.lock().unwrap();
                        continue;
                    }
                    let now = Instant::now();
                    if now >= next || st.load(Ordering::Relaxed) {
                        break;
                    }
                    resized = wake.cv.wait_timeout(resized, next - now).unwrap().0;
                }
            }
            ticks
        });
        Egpud { stop, thread: Some(thread) }
    }

    /// Stops ticking (as a dead agent would); returns the ticks made.
    pub fn stop(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().expect("egpud thread")
    }
}

impl Drop for Egpud {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid out-pointer; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Polls until every pid has a live simulated-GPU slot with some busy time (bounded).
pub fn wait_running(m: &Machine, burns: &[&Burn], within: Duration) {
    let deadline = Instant::now() + within;
    while !burns.iter().all(|b| m.busy_of(b.pid(), b.host).is_some_and(|v| v > 0)) {
        assert!(Instant::now() < deadline, "burners did not start launching within {within:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Fraction of wall time each burner kept the device busy over `window`,
/// measured by the simulated GPU.
pub fn fractions(m: &Machine, burns: &[&Burn], window: Duration) -> Vec<f64> {
    let t0 = monotonic_ns();
    let b0: Vec<u64> = burns.iter().map(|b| m.busy_of(b.pid(), b.host).expect("burner slot")).collect();
    std::thread::sleep(window);
    let t1 = monotonic_ns();
    let b1: Vec<u64> = burns.iter().map(|b| m.busy_of(b.pid(), b.host).expect("burner still running at the end of the window")).collect();
    b0.iter().zip(&b1).map(|(a, b)| (b - a) as f64 / (t1 - t0) as f64).collect()
}
