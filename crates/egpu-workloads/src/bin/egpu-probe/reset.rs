//! `egpu-probe ctx-reset`: two users of one primary context, and one of
//! them resets it.
//!
//! A (the probe's set-up retain) and B (a second retain) share the primary
//! context. B allocates, resets the context (`cuDevicePrimaryCtxReset`),
//! retains it again and allocates once more; then A releases the reference
//! it took before the reset. The CUDA documentation says a reset does not
//! release the context: A's reference then still counts, and B's new
//! context and its memory live on after A's release. The probe reports
//! what the driver did (`model`, from `cuDevicePrimaryCtxGetState`) and
//! holds B's memory until stdin closes, so that the slice's charge can be
//! compared with what the driver holds.

use crate::Global;
use crate::common::{die, setup, wait_stdin};
use egpu_cuda::*;
use egpu_workloads::api::Api;
use egpu_workloads::out::emit;
use egpu_workloads::{call, exit, parse_bytes};
use serde_json::json;

#[derive(clap::Args)]
pub struct ResetArgs {
    /// Bytes per allocation, before the reset and after it.
    #[arg(long, default_value = "64MiB", value_parser = parse_bytes)]
    size: u64,
    /// Allocations before the reset and again after it.
    #[arg(long, default_value_t = 2)]
    count: u32,
}

/// Whether the device's primary context is active (exits on a driver error).
fn active(cu: &crate::common::Cuda) -> bool {
    let (mut flags, mut active) = (0u32, 0i32);
    call!(cu.api, cuDevicePrimaryCtxGetState(cu.dev, &mut flags, &mut active)).unwrap_or_else(|e| die(e, exit::FAILED));
    active != 0
}

fn alloc(cu: &crate::common::Cuda, a: &ResetArgs) -> Vec<CUdeviceptr> {
    (0..a.count)
        .map(|_| {
            let mut p: CUdeviceptr = 0;
            call!(cu.api, cuMemAlloc_v2(&mut p, a.size as usize)).unwrap_or_else(|e| die(e, exit::FAILED));
            p
        })
        .collect()
}

pub fn run(api: Api, g: &Global, a: ResetArgs) -> i32 {
    if g.own_ctx {
        eprintln!("ctx-reset works on the primary context: drop --own-ctx");
        return exit::USAGE;
    }
    let cu = setup(api, g.device, false);
    let mut b: CUcontext = std::ptr::null_mut();
    call!(cu.api, cuDevicePrimaryCtxRetain(&mut b, cu.dev)).unwrap_or_else(|e| die(e, exit::FAILED));
    let before = alloc(&cu, &a);
    call!(cu.api, cuDevicePrimaryCtxReset_v2(cu.dev)).unwrap_or_else(|e| die(e, exit::FAILED));
    let after_reset = active(&cu);
    call!(cu.api, cuDevicePrimaryCtxRetain(&mut b, cu.dev)).unwrap_or_else(|e| die(e, exit::FAILED));
    call!(cu.api, cuCtxSetCurrent(b)).unwrap_or_else(|e| die(e, exit::FAILED));
    let held = alloc(&cu, &a);
    // A's reference, taken before the reset.
    call!(cu.api, cuDevicePrimaryCtxRelease_v2(cu.dev)).unwrap_or_else(|e| die(e, exit::FAILED));
    let alive = active(&cu);
    emit(json!({
        "event": "holding",
        "pid": std::process::id(),
        "model": if alive { "keeps-retains" } else { "drops-retains" },
        "active_after_reset": after_reset,
        "active_after_release": alive,
        "freed_by_reset": before.len() as u64 * a.size,
        "allocated": if alive { held.len() as u64 * a.size } else { 0 },
        "mem": if alive { cu.mem_info() } else { json!(null) },
    }));
    wait_stdin();
    let mut releases = 0;
    if alive {
        for p in held {
            call!(cu.api, cuMemFree_v2(p)).unwrap_or_else(|e| die(e, exit::FAILED));
        }
        // B's references (one, or two when the reset kept the first).
        while active(&cu) && releases < 4 {
            call!(cu.api, cuDevicePrimaryCtxRelease_v2(cu.dev)).unwrap_or_else(|e| die(e, exit::FAILED));
            releases += 1;
        }
    }
    emit(json!({"event": "done", "releases": releases, "active": active(&cu)}));
    exit::OK
}
