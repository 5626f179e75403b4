//! `egpu-probe grow` (blocked until a live resize) and `egpu-probe churn`.

use crate::Global;
use crate::common::setup;
use crate::family::{self, Family};
use egpu_cuda::CUDA_ERROR_OUT_OF_MEMORY;
use egpu_workloads::api::Api;
use egpu_workloads::out::emit;
use egpu_workloads::{exit, monotonic_ns, parse_bytes};
use serde_json::json;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct GrowArgs {
    #[arg(long, default_value = "256MiB", value_parser = parse_bytes)]
    step: u64,
    #[arg(long, default_value = "3GiB", value_parser = parse_bytes)]
    until: u64,
    #[arg(long, default_value = "mem")]
    family: Family,
    /// Give up after this many seconds blocked (exit 3).
    #[arg(long, default_value_t = 600)]
    timeout: u64,
    /// After reaching --until, print "holding" and wait until stdin is closed.
    #[arg(long)]
    hold: bool,
    /// After setting up the context, print "ready" and wait for a line on stdin.
    #[arg(long)]
    wait_go: bool,
    /// Pause between retries while blocked, in microseconds (0: only yield the CPU).
    #[arg(long, default_value_t = 1000)]
    retry_us: u64,
}

pub fn grow(api: Api, g: &Global, a: GrowArgs) -> i32 {
    let cu = setup(api, g.device, g.own_ctx);
    let mut st = family::Ctx::default();
    if a.wait_go {
        crate::common::wait_go();
    }
    let mut held = Vec::new();
    let mut total = 0u64;
    let mut blocked_since: Option<Instant> = None;
    let mut blocked_ns = 0u64;
    while total < a.until {
        match family::alloc(&cu, &mut st, a.family, a.step as usize) {
            Ok(h) => {
                held.push(h);
                total += a.step;
                if blocked_since.take().is_some() {
                    let now = monotonic_ns();
                    emit(json!({"event": "unblocked", "t_ns": now, "blocked_at_ns": blocked_ns, "waited_ns": now - blocked_ns, "total": total}));
                } else {
                    emit(json!({"event": "alloc", "total": total}));
                }
            }
            Err(e) if e.code == CUDA_ERROR_OUT_OF_MEMORY => {
                match blocked_since {
                    None => {
                        blocked_since = Some(Instant::now());
                        blocked_ns = monotonic_ns();
                        emit(json!({"event": "blocked", "t_ns": blocked_ns, "total": total, "mem": cu.mem_info()}));
                    }
                    Some(t) if t.elapsed() > Duration::from_secs(a.timeout) => {
                        emit(json!({"event": "timeout", "total": total}));
                        return exit::OOM;
                    }
                    Some(_) => {}
                }
                if a.retry_us == 0 {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(Duration::from_micros(a.retry_us));
                }
            }
            Err(e) => {
                emit(json!({"event": "error", "call": e.call, "code": e.code}));
                return exit::FAILED;
            }
        }
    }
    emit(json!({"event": "done", "t_ns": monotonic_ns(), "total": total, "mem": cu.mem_info()}));
    if a.hold {
        emit(json!({"event": "holding", "total": total}));
        crate::common::hold(&cu);
    }
    for h in held {
        let _ = family::free(&cu, &st, h);
    }
    family::finish(&cu, &mut st);
    cu.teardown(g.own_ctx);
    exit::OK
}

#[derive(clap::Args)]
pub struct ChurnArgs {
    #[arg(long, default_value_t = 30.0)]
    seconds: f64,
    /// Most bytes held at once by this process.
    #[arg(long, default_value = "512MiB", value_parser = parse_bytes)]
    max: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[arg(long, default_value = "mem")]
    family: Family,
    /// Largest single allocation.
    #[arg(long, default_value = "64MiB", value_parser = parse_bytes)]
    max_alloc: u64,
    /// After setting up the context, print "ready" and wait for a line on stdin.
    #[arg(long)]
    wait_go: bool,
    /// Stop after this many operations (0: only --seconds).
    #[arg(long, default_value_t = 0)]
    ops: u64,
}

pub fn churn(api: Api, g: &Global, a: ChurnArgs) -> i32 {
    let cu = setup(api, g.device, g.own_ctx);
    let mut st = family::Ctx::default();
    if a.wait_go {
        crate::common::wait_go();
    }
    let mut rng = a.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut held: Vec<(family::Held, u64)> = Vec::new();
    let (mut allocs, mut frees, mut ooms, mut errors, mut cur, mut peak, mut ops) = (0u64, 0u64, 0u64, 0u64, 0u64, 0u64, 0u64);
    let end = Instant::now() + Duration::from_secs_f64(a.seconds);
    let unit = 1u64 << 20;
    while Instant::now() < end && (a.ops == 0 || ops < a.ops) {
        ops += 1;
        let r = next();
        if r % 3 != 0 || held.is_empty() {
            let size = (1 + next() % (a.max_alloc / unit).max(1)) * unit;
            if cur + size > a.max {
                continue;
            }
            match family::alloc(&cu, &mut st, a.family, size as usize) {
                Ok(h) => {
                    held.push((h, size));
                    allocs += 1;
                    cur += size;
                    peak = peak.max(cur);
                }
                Err(e) if e.code == CUDA_ERROR_OUT_OF_MEMORY => ooms += 1,
                Err(_) => errors += 1,
            }
        } else {
            let (h, size) = held.swap_remove((next() % held.len() as u64) as usize);
            if family::free(&cu, &st, h).is_err() {
                errors += 1;
            }
            frees += 1;
            cur -= size;
        }
    }
    for (h, _) in held.drain(..) {
        if family::free(&cu, &st, h).is_err() {
            errors += 1;
        }
        frees += 1;
    }
    family::finish(&cu, &mut st);
    let mem = cu.mem_info();
    cu.teardown(g.own_ctx);
    emit(json!({"event": "churn", "allocs": allocs, "frees": frees, "ooms": ooms, "errors": errors, "peak": peak, "ops": ops, "mem_after": mem, "pid": std::process::id()}));
    if errors > 0 { exit::FAILED } else { exit::OK }
}
