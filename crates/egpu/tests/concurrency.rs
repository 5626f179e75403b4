//! Concurrency and crash safety: 32 egpu-probe processes in 4 slices
//! allocate and free at random for 30 s while a random one is SIGKILLed
//! (and replaced) every second, and egpud itself is `kill -9`ed and
//! restarted half-way. Afterwards the accounting is exact: slice usage from
//! the usage records == what live processes hold (allocations plus their
//! context, which the hook charges too) == the simulated driver's used memory
//! (NVML), and everything returns to zero.

mod common;
use common::*;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const SLICES: [(&str, &str); 4] = [("c0", "0"), ("c1", "0"), ("c2", "1"), ("c3", "1")];
const PER_SLICE: usize = 8;
const LOAD: Duration = Duration::from_secs(30);
const MIB64: u64 = 64 << 20;

struct Churner {
    slice: usize,
    child: Child,
    log: std::path::PathBuf,
}

fn probe(env: &[(String, String)]) -> Command {
    let mut c = Command::new(probe_path());
    c.envs(env.iter().map(|(k, v)| (k, v))).stdout(Stdio::null()).stderr(Stdio::null());
    c
}

fn spawn_churner(dir: &std::path::Path, envs: &[Vec<(String, String)>], slice: usize, seed: u64, seconds: f64) -> Churner {
    let log = dir.join(format!("churn-{seed}.log"));
    let mut c = probe(&envs[slice]);
    c.stdout(std::fs::File::create(&log).unwrap()).stderr(std::fs::File::create(log.with_extension("err")).unwrap());
    c.args(["churn", "--max", "400MiB", "--max-alloc", "64MiB", "--seed", &seed.to_string(), "--seconds", &format!("{seconds:.2}")]);
    Churner { slice, child: c.spawn().unwrap(), log }
}

#[test]
fn churn_kills_and_agent_crash_keep_accounting_exact() {
    let mut node = Node::start("2x16GiB");
    for (name, dev) in SLICES {
        node.ok(&["create", "--name", name, "--gpu-memory", "3GiB", "--device", dev, "--gpu-compute", "20%"]);
    }
    let envs: Vec<_> = SLICES.iter().map(|(n, _)| node.slice_env(n)).collect();
    let start = Instant::now();
    let mut seed = 1u64;
    let mut live: Vec<Churner> = Vec::new();
    for s in 0..SLICES.len() {
        for _ in 0..PER_SLICE {
            seed += 1;
            live.push(spawn_churner(node.dir.path(), &envs, s, seed, LOAD.as_secs_f64()));
        }
    }
    let mut finished: Vec<(usize, std::process::ExitStatus, std::path::PathBuf)> = Vec::new();
    let (mut rng, mut kills, mut crashed) = (0x2545_f491_4f6c_dd1du64, 0, false);
    let mut next_kill = start + Duration::from_secs(1);
    let mut max_untracked = 0u64;
    while start.elapsed() < LOAD {
        // Reap the ones that finished on their own.
        live.retain_mut(|c| match c.child.try_wait().unwrap() {
            Some(st) => {
                finished.push((c.slice, st, c.log.clone()));
                false
            }
            None => true,
        });
        if Instant::now() >= next_kill && !live.is_empty() {
            next_kill += Duration::from_secs(1);
            // egpud's memory audit (on by default) reads the driver against
            // the records once a second: churn and kills are no untracked memory.
            let untracked: u64 = node.slices().iter().map(|s| s["devices"][0]["untracked_bytes"].as_u64().unwrap()).sum();
            max_untracked = max_untracked.max(untracked);
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let mut victim = live.swap_remove((rng % live.len() as u64) as usize);
            victim.child.kill().unwrap();
            victim.child.wait().unwrap();
            kills += 1;
            let left = LOAD.saturating_sub(start.elapsed()).as_secs_f64();
            if left > 1.0 {
                seed += 1;
                live.push(spawn_churner(node.dir.path(), &envs, victim.slice, seed, left));
            }
        }
        if !crashed && start.elapsed() >= LOAD / 2 {
            crashed = true;
            let before = node.slices();
            let attached_before = live_pids(&before);
            node.kill9();
            // Workloads keep running (and charging) with egpud gone.
            std::thread::sleep(Duration::from_millis(300));
            node.restart();
            let after = node.slices();
            assert_eq!(limits_only(&before), limits_only(&after), "slices and limits survive kill -9 of egpud");
            let ours: Vec<u32> = live.iter().map(|c| c.child.id()).collect();
            let attached_after = live_pids(&after);
            for pid in &attached_before {
                if ours.contains(pid) && !attached_after.contains(pid) {
                    // Only acceptable if the churner ended in between.
                    let c = live.iter_mut().find(|c| c.child.id() == *pid).unwrap();
                    assert!(c.child.try_wait().unwrap().is_some(), "live process {pid} not adopted after restart: {after:?}");
                }
            }
            assert!(!attached_after.is_empty(), "adopted slices list their live processes");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(crashed && kills >= 25, "kills={kills}");
    assert_eq!(max_untracked, 0, "the memory audit counted churn or kills as untracked memory; log:\n{}", node.log());

    // Nothing hangs: every churner ends within a bounded time, cleanly.
    let deadline = Instant::now() + Duration::from_secs(90);
    for mut c in live {
        let st = loop {
            if let Some(st) = c.child.try_wait().unwrap() {
                break st;
            }
            if Instant::now() > deadline {
                let pid = c.child.id();
                let _ = c.child.kill();
                let _ = c.child.wait();
                panic!("churner {pid} hung");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        finished.push((c.slice, st, c.log.clone()));
    }
    let mut refused_at_start = 0;
    for (slice, st, log) in &finished {
        let out = std::fs::read_to_string(log).unwrap_or_default() + &std::fs::read_to_string(log.with_extension("err")).unwrap_or_default();
        // A context is charged to the slice too, so a process that starts while its
        // slice is full is refused its context (probe exit 4, CUDA_ERROR_OUT_OF_MEMORY):
        // that is the limit working, not a failure.
        if st.code() == Some(4) && out.contains("\"code\":2") && out.contains("Ctx") {
            refused_at_start += 1;
            continue;
        }
        assert!(st.success(), "churner in slice {slice} failed: {st}: {out}");
    }
    assert!(refused_at_start < finished.len() / 4, "{refused_at_start} of {} churners could not start", finished.len());

    // Everything returns to zero: records of killed processes are reclaimed, the driver freed their memory.
    assert!(
        wait_until(Duration::from_secs(10), || {
            let s = node.slices();
            s.iter().all(|s| s["devices"][0]["used_bytes"] == 0 && s["processes"].as_array().unwrap().is_empty()) && node.driver_used() == [0, 0]
        }),
        "usage did not return to zero: {:?} driver {:?}",
        node.slices(),
        node.driver_used()
    );

    // Exactness with live holders: 2 processes per slice holding known amounts.
    let mut holders = Vec::new();
    for (i, env) in envs.iter().enumerate() {
        for k in [i + 1, 2 * i + 3] {
            let mut c = probe(env);
            c.args(["alloc", "--family", "mem", "--size", "64MiB", "--count", &k.to_string(), "--hold"]);
            let mut l = Lines::spawn(c);
            let h = l.wait_event("holding", Duration::from_secs(30)).unwrap_or_else(|| panic!("holder never held: {:?}", l.seen));
            assert_eq!(h["allocated"], k as u64);
            holders.push((i, l.pid(), k as u64 * MIB64, l));
        }
    }
    let slices = node.slices();
    let mut per_device = [0u64; 2];
    let mut ctx_cost = None;
    for (i, (name, dev)) in SLICES.iter().enumerate() {
        let s = slices.iter().find(|s| s["name"] == *name).unwrap();
        let procs = s["processes"].as_array().unwrap();
        assert_eq!(procs.len(), 2, "slice {name}: {s}");
        let mut sum = 0;
        for p in procs {
            let pid = p["pid"].as_u64().unwrap() as u32;
            let h = holders.iter().find(|h| h.0 == i && h.1 == pid).unwrap_or_else(|| panic!("unknown process {pid} in {name}"));
            let rec = p["bytes"][0].as_u64().unwrap();
            // Each record holds exactly the process's allocations plus one context.
            let ctx = *ctx_cost.get_or_insert(rec - h.2);
            assert_eq!(rec, h.2 + ctx, "pid {pid}");
            sum += rec;
        }
        assert_eq!(s["devices"][0]["used_bytes"], sum, "slice {name}: usage == sum of its records");
        per_device[dev.parse::<usize>().unwrap()] += sum;
    }
    assert!(ctx_cost.unwrap() > 0);
    assert_eq!(node.driver_used(), per_device.to_vec(), "driver (NVML) used == sum of slice usage");
    for (_, _, _, mut l) in holders {
        assert!(l.finish(Duration::from_secs(30)).is_some_and(|s| s.success()));
    }
    assert!(wait_until(Duration::from_secs(10), || node.driver_used() == [0, 0] && node.slices().iter().all(|s| s["devices"][0]["used_bytes"] == 0)));
}
