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
