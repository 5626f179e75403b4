//! `egpu-probe retain-race`: several threads make the process's first
//! `cuDevicePrimaryCtxRetain` of one device at the same moment, round after
//! round, and the slice's usage is read through NVML (which needs no
//! context) before, while they hold it and after they all released it.

use crate::Global;
use crate::common::die;
use egpu_cuda::*;
use egpu_workloads::api::Api;
use egpu_workloads::out::emit;
use egpu_workloads::{call, exit};
use serde_json::json;

#[derive(clap::Args)]
pub struct RaceArgs {
    /// Threads retaining at once.
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// Rounds (each ends with every reference released, destroying the context).
    #[arg(long, default_value_t = 20)]
    rounds: u32,
}

pub fn run(api: Api, g: &Global, a: RaceArgs) -> i32 {
    call!(api, cuInit(0)).unwrap_or_else(|e| die(e, exit::INIT));
    let mut dev: CUdevice = 0;
    call!(api, cuDeviceGet(&mut dev, g.device)).unwrap_or_else(|e| die(e, exit::INIT));
    call!(api, nvmlInit_v2()).unwrap_or_else(|e| die(e, exit::INIT));
    let mut h: nvmlDevice_t = std::ptr::null_mut();
    call!(api, nvmlDeviceGetHandleByIndex_v2(0, &mut h)).unwrap_or_else(|e| die(e, exit::INIT));
    let used = || {
        let mut m = nvmlMemory_t::default();
        call!(api, nvmlDeviceGetMemoryInfo(h, &mut m)).map(|_| m.used).unwrap_or_else(|e| die(e, exit::FAILED))
    };
    let n = a.threads.max(1);
    let barrier = std::sync::Barrier::new(n);
    let mut failed = 0u32;
    for round in 0..a.rounds {
        let base = used();
        let codes: Vec<u32> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..n)
                .map(|_| {
                    s.spawn(|| {
                        let mut ctx: CUcontext = std::ptr::null_mut();
                        barrier.wait();
                        call!(api, cuDevicePrimaryCtxRetain(&mut ctx, dev)).err().map_or(0, |e| e.code)
                    })
                })
                .collect();
            hs.into_iter().map(|t| t.join().unwrap_or(u32::MAX)).collect()
        });
        let held = used();
        let retained = codes.iter().filter(|&&c| c == 0).count();
        for _ in 0..retained {
            if call!(api, cuDevicePrimaryCtxRelease_v2(dev)).is_err() {
                failed += 1;
            }
        }
        let after = used();
        emit(json!({"event": "round", "round": round, "base": base, "held": held, "after": after, "codes": codes}));
    }
    emit(json!({"event": "summary", "rounds": a.rounds, "release_errors": failed}));
    if failed == 0 { exit::OK } else { exit::FAILED }
}

#[derive(clap::Args)]
pub struct SettleArgs {
    /// Threads asking cuMemGetInfo (which settles the pools) in a loop.
    #[arg(long, default_value_t = 16)]
    threads: usize,
    /// Allocations from the stream-ordered allocator, each checked and freed.
    #[arg(long, default_value_t = 3000)]
    rounds: u32,
    /// Bytes of each allocation.
    #[arg(long, default_value = "256MiB", value_parser = egpu_workloads::parse_bytes)]
    size: u64,
}

/// `egpu-probe settle-race`: while threads settle the pools (each
/// `cuMemGetInfo` does), the main thread allocates `--size` with
/// `cuMemAllocAsync` and checks that the slice's free memory went down by
/// it (a settle that read the pool's size before the allocation grew it
/// must not take the charge back), then frees and synchronises. Event
/// "summary": rounds run and "missed", the rounds whose allocation was not
/// counted (the first one's free memory in "first_miss").
pub fn settle(api: Api, g: &Global, a: SettleArgs) -> i32 {
    let cu = crate::common::setup(api, g.device, g.own_ctx);
    let api = &cu.api;
    let mut stream: CUstream = std::ptr::null_mut();
    call!(api, cuStreamCreate(&mut stream, 0)).unwrap_or_else(|e| die(e, exit::FAILED));
    let free = || {
        let (mut f, mut t) = (0usize, 0usize);
        call!(api, cuMemGetInfo_v2(&mut f, &mut t)).map(|_| f as u64).unwrap_or_else(|e| die(e, exit::FAILED))
    };
    let base = free();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let ctx = cu.ctx as usize;
    let (mut missed, mut first_miss, mut rounds) = (0u32, None, 0u32);
    std::thread::scope(|s| {
        for _ in 0..a.threads {
            s.spawn(|| {
                let _ = call!(api, cuCtxSetCurrent(ctx as CUcontext));
                let (mut f, mut t) = (0usize, 0usize);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _ = call!(api, cuMemGetInfo_v2(&mut f, &mut t));
                }
            });
        }
        for _ in 0..a.rounds {
            let mut p: CUdeviceptr = 0;
            if let Err(e) = call!(api, cuMemAllocAsync(&mut p, a.size as usize, stream)) {
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
                die(e, exit::FAILED);
            }
            let f = free();
            if f + a.size > base {
                missed += 1;
                first_miss.get_or_insert(f);
            }
            let _ = call!(api, cuMemFreeAsync(p, stream));
            let _ = call!(api, cuStreamSynchronize(stream));
            rounds += 1;
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    emit(json!({"event": "summary", "rounds": rounds, "missed": missed, "base_free": base, "first_miss": first_miss}));
    exit::OK
}
