//! End-to-end compute-isolation benchmarks on the simulated GPU (run by
//! `scripts/bench-compute.sh`; results in `docs/benchmarks.md`).
//!
//! Each scenario runs `egpu-burn` processes under libegpu.so, with the
//! arbiter's own `Arbiter::tick_tables` ticking every 10 ms (this program
//! plays `egpud`, truth from the simulated GPU's per-process busy time), and
//! reads what each slice achieved from the simulated GPU, not the hook.
//! Output: one JSON line per result.
//!
//! `compute-bench [accuracy|conservation|priority|resize|overhead|all] [WINDOW_S]`

#[path = "../tests/compute_common/mod.rs"]
mod compute_common;

use compute_common::*;
use egpu_core::Priority;
use egpu_simgpu::state::{MAX_SLOTS, SlotState};
use serde_json::json;
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

fn r1(v: f64) -> f64 {
    (v * 10.0).round() / 10.0
}

fn accuracy(window: f64) {
    for shares in [&[30u32, 70][..], &[20, 30, 50], &[10, 20, 30, 40]] {
        let m = Machine::new("1x80GiB");
        let slices: Vec<_> = shares.iter().enumerate().map(|(i, &s)| m.slice(&format!("s{i}"), 0, s, s, Priority::Normal)).collect();
        let _egpud = Egpud::start(&m, &slices);
        let secs = format!("{}", window + 3.0);
        // The first slice launches 64 ahead (only the queue bound holds it).
        let burns: Vec<_> = slices
            .iter()
            .enumerate()
            .map(|(i, s)| m.burn(s, &["--seconds", &secs, "--inflight", if i == 0 { "64" } else { "4" }]))
            .collect();
        let refs: Vec<&Burn> = burns.iter().collect();
        wait_running(&m, &refs, Duration::from_secs(30));
        std::thread::sleep(Duration::from_secs(1));
        let f = fractions(&m, &refs, Duration::from_secs_f64(window));
        let got: Vec<f64> = f.iter().map(|v| r1(v * 100.0)).collect();
        let err = shares.iter().zip(&got).map(|(&s, &g)| (g - s as f64).abs()).fold(0.0, f64::max);
        println!("{}", json!({"bench": "accuracy", "shares": shares, "achieved_pct": got, "max_err_pts": r1(err), "window_s": window}));
        for b in burns {
            b.finish();
        }
    }
}

fn conservation(window: f64) {
    for (share, limit) in [(30u32, 100u32), (30, 40)] {
        let m = Machine::new("1x80GiB");
        let s = m.slice("lone", 0, share, limit, Priority::Normal);
        let _egpud = Egpud::start(&m, std::slice::from_ref(&s));
        let b = m.burn(&s, &["--seconds", &format!("{}", window + 3.0)]);
        wait_running(&m, &[&b], Duration::from_secs(30));
        std::thread::sleep(Duration::from_secs(1));
        let f = fractions(&m, &[&b], Duration::from_secs_f64(window))[0];
        println!("{}", json!({"bench": "conservation", "share": share, "limit": limit, "achieved_pct": r1(f * 100.0), "window_s": window}));
        b.finish();
    }
}

fn latency_p99(b: Burn) -> f64 {
    let (_, lines, _) = b.finish();
    latency_total(&lines).map_or(f64::NAN, |(_, p99)| p99)
}

fn priority(window: f64) {
    // High: 25% share, 100% limit, a latency loop of 410 µs kernels (one kernel, then synchronise).
    // Best-effort: 3 saturating slices, no share, 100% limit, kernels of `be_us`.
    for be_grid in [8u32, 16, 32] {
        let be_us = be_grid as f64 * 128.0 * NS_PER_THREAD.parse::<f64>().unwrap() / 1000.0;
        let secs = format!("{window}");
        let alone = {
            let m = Machine::new("1x80GiB");
            let h = m.slice("high", 0, 25, 100, Priority::High);
            let _egpud = Egpud::start(&m, std::slice::from_ref(&h));
            latency_p99(m.burn(&h, &["--seconds", &secs, "--mode", "latency"]))
        };
        let m = Machine::new("1x80GiB");
        let h = m.slice("high", 0, 25, 100, Priority::High);
        let be: Vec<_> = (0..3).map(|i| m.slice(&format!("be{i}"), 0, 0, 100, Priority::BestEffort)).collect();
        let mut all = vec![h.clone()];
        all.extend(be.iter().cloned());
        let _egpud = Egpud::start(&m, &all);
        let g = be_grid.to_string();
        let bes: Vec<_> = be.iter().map(|s| m.burn(s, &["--seconds", &format!("{}", window + 1.0), "--grid", &g])).collect();
        std::thread::sleep(Duration::from_millis(500));
        let hb = m.burn(&h, &["--seconds", &secs, "--mode", "latency"]);
        let p99 = latency_p99(hb);
        for b in bes {
            b.finish();
        }
        println!("{}", json!({"bench": "priority", "be_kernel_us": r1(be_us), "alone_p99_us": r1(alone), "contended_p99_us": r1(p99), "ratio": (p99 / alone * 1000.0).round() / 1000.0}));
    }
}

/// Per-period fractions of two burners; counts periods until both are within
/// 3 points of the target for the next 5 periods.
///
/// The simulated GPU charges a kernel to its process when it is *queued*
/// (`Slot::busy`), so per 10 ms period the busy counters say what each
/// process queued, not what ran: off by the change of its queued work (up to
/// its queue bound, 2 ms = 20 points of a period), and a 5-period window by
/// up to 4 points. The device is one FIFO, so what has *run* by time `t` is
/// the first `E(t) = busy_total − (busy_until − t)` ns of the queue, in the
/// order the kernels were queued. A sampler thread logs `(t, busy_total,
/// busy_until, busy_a, busy_b)` every ~100 µs; a slice's executed time at
/// `t` is its queued time at the moment `busy_total` passed `E(t)`
/// (interpolated between samples). Both are reported: `all` / `periods_*`
/// from execution, `queued_*` from the queue-time counters (the old metric).
/// `RESIZE_TRACE=1` prints every resize's per-period shares;
/// `RESIZE_DUMP=PATH` writes the execution log as CSV (t, busy_total,
/// busy_until, busy_a, busy_b; ns).
fn resize(n: usize) {
    let m = Machine::new("1x80GiB");
    let a = m.slice("a", 0, 30, 30, Priority::Normal);
    let b = m.slice("b", 0, 70, 70, Priority::Normal);
    let _egpud = Egpud::start(&m, &[a.clone(), b.clone()]);
    let phase = Duration::from_millis(400);
    let secs = format!("{}", 2.0 + phase.as_secs_f64() * n as f64 + 1.0);
    let ba = m.burn(&a, &["--seconds", &secs]);
    let bb = m.burn(&b, &["--seconds", &secs]);
    wait_running(&m, &[&ba, &bb], Duration::from_secs(30));
    std::thread::sleep(Duration::from_secs(1));
    let period = Duration::from_millis(10);
    // The execution log (see above).
    let slot = |pid: u32| (0..MAX_SLOTS).find(|&i| m.sim.slot_owner(i) == (pid, SlotState::Live)).expect("burner slot");
    let (sa, sb, sim) = (slot(ba.pid()), slot(bb.pid()), m.sim);
    let log: std::sync::Arc<std::sync::Mutex<Vec<[u64; 5]>>> = Default::default();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (log, stop) = (log.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let d = &sim.devs[0];
                let until = d.busy_until.load(Ordering::SeqCst);
                let now = monotonic_ns();
                let total = d.busy_total.load(Ordering::SeqCst);
                let e = [now, total, until, sim.slots[sa].busy[0].load(Ordering::SeqCst), sim.slots[sb].busy[0].load(Ordering::SeqCst)];
                log.lock().unwrap().push(e);
                std::thread::sleep(Duration::from_micros(100));
            }
        })
    };
    // Executed ns of (a, b) by time t.
    let executed = |log: &[[u64; 5]], t: u64| -> (f64, f64) {
        let i = log.partition_point(|e| e[0] <= t).max(1) - 1;
        let e = log[i];
        let ran = e[1].saturating_sub(e[2].saturating_sub(e[0])) as f64;
        let j = log.partition_point(|x| (x[1] as f64) <= ran);
        if j == 0 {
            return (log[0][3] as f64, log[0][4] as f64);
        }
        let (x0, x1) = (log[j - 1], log[j.min(log.len() - 1)]);
        let f = if x1[1] > x0[1] { (ran - x0[1] as f64) / (x1[1] - x0[1]) as f64 } else { 0.0 };
        let lerp = |k: usize| x0[k] as f64 + f * (x1[k] as f64 - x0[k] as f64);
        (lerp(3), lerp(4))
    };
    let mut conv = Vec::new();
    let mut conv_q = Vec::new();
    // Per direction (to 60/40, to 30/70): the slices' per-period fractions,
    // summed over the resizes, period by period.
    let mut traj = [vec![(0.0f64, 0.0f64, 0u32); 40], vec![(0.0, 0.0, 0); 40]];
    let mut phases = Vec::new();
    for k in 0..n {
        let (ta, tb) = if k % 2 == 0 { (60.0, 40.0) } else { (30.0, 70.0) };
        a.set_compute(ta as u32, ta as u32);
        b.set_compute(tb as u32, tb as u32);
        let t0 = Instant::now();
        let mut per = Vec::new();
        let mut edges = vec![monotonic_ns()];
        let mut prev = (edges[0], m.busy_of(ba.pid(), 0).unwrap(), m.busy_of(bb.pid(), 0).unwrap());
        while t0.elapsed() < phase {
            let next = t0 + period * (per.len() as u32 + 1);
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
            let now = (monotonic_ns(), m.busy_of(ba.pid(), 0).unwrap(), m.busy_of(bb.pid(), 0).unwrap());
            let dt = (now.0 - prev.0) as f64;
            per.push(((now.1 - prev.1) as f64 / dt * 100.0, (now.2 - prev.2) as f64 / dt * 100.0));
            edges.push(now.0);
            prev = now;
        }
        phases.push((ta, tb, edges, per));
    }
    // Let the queue drain past the last edge before reading the log.
    std::thread::sleep(Duration::from_millis(50));
    stop.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    let log = log.lock().unwrap();
    if let Some(path) = std::env::var_os("RESIZE_DUMP") {
        let text: String = log.iter().map(|e| format!("{},{},{},{},{}\n", e[0], e[1], e[2], e[3], e[4])).collect();
        std::fs::write(path, text).expect("RESIZE_DUMP");
    }
    // Convergence: first period p such that periods p..p+5 average within 3 points.
    let converged = |per: &[(f64, f64)], ta: f64, tb: f64| {
        let ok = |i: usize| {
            let w = &per[i..(i + 5).min(per.len())];
            let (sa, sb) = w.iter().fold((0.0, 0.0), |acc, x| (acc.0 + x.0, acc.1 + x.1));
            ((sa / w.len() as f64) - ta).abs() <= 3.0 && ((sb / w.len() as f64) - tb).abs() <= 3.0
        };
        (0..per.len().saturating_sub(5)).find(|&i| ok(i)).map_or(per.len(), |i| i + 1)
    };
    for (k, (ta, tb, edges, queued)) in phases.iter().enumerate() {
        let (ta, tb) = (*ta, *tb);
        let ex: Vec<(f64, f64)> = edges.iter().map(|&t| executed(&log, t)).collect();
        let per: Vec<(f64, f64)> = edges
            .windows(2)
            .zip(ex.windows(2))
            .map(|(t, x)| {
                let dt = (t[1] - t[0]) as f64;
                ((x[1].0 - x[0].0) / dt * 100.0, (x[1].1 - x[0].1) / dt * 100.0)
            })
            .collect();
        let c = converged(&per, ta, tb);
        conv_q.push(converged(queued, ta, tb));
        if std::env::var_os("RESIZE_TRACE").is_some() {
            eprintln!("resize {k} -> {ta}/{tb}: conv {c}: {:?}", per.iter().map(|x| (x.0.round() as i64, x.1.round() as i64)).collect::<Vec<_>>());
        }
        conv.push(c);
        for (t, x) in traj[k % 2].iter_mut().zip(&per) {
            *t = (t.0 + x.0, t.1 + x.1, t.2 + 1);
        }
    }
    ba.finish();
    bb.finish();
    conv.sort_unstable();
    conv_q.sort_unstable();
    let q = |v: &[usize], f: f64| v[((v.len() - 1) as f64 * f).round() as usize];
    println!(
        "{}",
        json!({"bench": "resize", "resizes": n, "metric": "executed (FIFO order from the queue-time counters)", "periods_median": q(&conv, 0.5), "periods_p99": q(&conv, 0.99), "periods_max": conv[conv.len() - 1], "all": conv,
               "queued_median": q(&conv_q, 0.5), "queued_p99": q(&conv_q, 0.99), "queued_all": conv_q})
    );
    // The same averaged over the resizes of each direction, period by period:
    // what the controller does, with the per-period noise (a 410 µs kernel
    // is 4 points of a 10 ms period; the host's wake-ups) averaged out.
    // Converged: the first period from which the mean stays within 3 points.
    for (dir, (ta, tb), t) in [("to 60/40", (60.0, 40.0), &traj[0]), ("to 30/70", (30.0, 70.0), &traj[1])] {
        let mean: Vec<(f64, f64)> = t.iter().filter(|x| x.2 > 0).map(|x| (x.0 / f64::from(x.2), x.1 / f64::from(x.2))).collect();
        let within = |x: &(f64, f64)| (x.0 - ta).abs() <= 3.0 && (x.1 - tb).abs() <= 3.0;
        let conv = (0..mean.len()).find(|&i| mean[i..].iter().all(within)).map_or(mean.len(), |i| i + 1);
        let first: Vec<(f64, f64)> = mean.iter().take(8).map(|x| (r1(x.0), r1(x.1))).collect();
        println!("{}", json!({"bench": "resize-mean", "direction": dir, "periods": conv, "first_periods_pct": first}));
    }
}

/// Launch-call cost: bare driver, hook without arbiter, hook gated (default
/// adaptive events, an event every launch, every 16), in one run, alternating.
fn overhead(rounds: usize) {
    let m = Machine::new("1x80GiB");
    let s = m.slice("ovh", 0, 100, 100, Priority::Normal);
    // Gated runs see the queue bounds egpud publishes for a lone 100% slice
    // (4 launches, a fifth of the period), with the allowance never reached.
    let run = |hook: bool, gated: bool, every: &str| -> f64 {
        let l = s.writer.region();
        l.arbiter_period_ns.store(if gated { 10_000_000 } else { 0 }, Ordering::Relaxed);
        l.devices[0].queue_launches.store(4, Ordering::Relaxed);
        l.devices[0].queue_ns.store(2_000_000, Ordering::Relaxed);
        l.devices[0].allowance_ns.store(u64::MAX / 4, Ordering::Relaxed);
        l.devices[0].epoch_start_ns.store(monotonic_ns() + 3_600_000_000_000, Ordering::Relaxed);
        let mut c = Command::new(m.bin.join("egpu-probe"));
        c.args(["--via", "procaddr", "bench", "--op", "launch", "--calls", "200000"])
            .env("LD_LIBRARY_PATH", &m.lib)
            .env("EGPU_SIM_GPUS", &m.gpus)
            .env("EGPU_SIM_STATE", &m.state)
            .env("EGPU_SIM_NS_PER_THREAD", "0")
            .env_remove("EGPU_HOOK_EVENT_EVERY");
        if !every.is_empty() {
            c.env("EGPU_HOOK_EVENT_EVERY", every);
        }
        if hook {
            c.env("LD_PRELOAD", m.bin.join("libegpu.so")).env("EGPU_SLICE_DIR", &s.dir).env("CUDA_VISIBLE_DEVICES", &s.uuid);
        }
        let out = c.output().expect("egpu-probe");
        let v: serde_json::Value = String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| serde_json::from_str(l).ok()).find(|v: &serde_json::Value| v["op"] == "launch").unwrap_or_else(|| panic!("no bench line: {}", String::from_utf8_lossy(&out.stderr)));
        v["median_ns"].as_f64().unwrap()
    };
    let kinds = [
        ("bare", false, false, ""),
        ("hook, no arbiter", true, false, ""),
        ("hook, gated, default (adaptive events)", true, true, ""),
        ("hook, gated, event every launch", true, true, "1"),
        ("hook, gated, event every 16", true, true, "16"),
    ];
    let mut res: Vec<Vec<f64>> = vec![Vec::new(); kinds.len()];
    for _ in 0..rounds {
        for (i, k) in kinds.iter().enumerate() {
            res[i].push(run(k.1, k.2, k.3));
        }
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let bare = med(&mut res[0]);
    for (i, k) in kinds.iter().enumerate() {
        let x = med(&mut res[i]);
        println!("{}", json!({"bench": "overhead", "kind": k.0, "median_ns": r1(x), "added_ns": r1(x - bare), "ratio": (x / bare * 1000.0).round() / 1000.0}));
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let what = args.first().map_or("all", String::as_str);
    let window: f64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(10.0);
    build();
    if what == "overhead" || what == "all" {
        overhead(5);
    }
    if what == "accuracy" || what == "all" {
        accuracy(window);
    }
    if what == "conservation" || what == "all" {
        conservation(window);
    }
    if what == "priority" || what == "all" {
        priority(window);
    }
    if what == "resize" || what == "all" {
        resize(40);
    }
}
