//! `egpu-probe green-ctx`: a green context (CUDA 12.4+) made before
//! anything else touched the device's primary context. The driver retains
//! the primary context for it (making it), and a later
//! `cuDevicePrimaryCtxRetain` finds it active: the slice must still be
//! charged for that context.

use crate::Global;
use crate::common::{die, mem_info, wait_stdin};
use egpu_cuda::*;
use egpu_workloads::api::Api;
use egpu_workloads::out::emit;
use egpu_workloads::{call, exit, parse_bytes};
use serde_json::json;

#[derive(clap::Args)]
pub struct GreenArgs {
    /// Bytes per allocation, made in the green context.
    #[arg(long, default_value = "64MiB", value_parser = parse_bytes)]
    size: u64,
    /// Allocations.
    #[arg(long, default_value_t = 2)]
    count: u32,
}

pub fn run(api: Api, g: &Global, a: GreenArgs) -> i32 {
    let fail = |e| die(e, exit::FAILED);
    call!(api, cuInit(0)).unwrap_or_else(|e| die(e, exit::INIT));
    let mut dev: CUdevice = 0;
    call!(api, cuDeviceGet(&mut dev, g.device)).unwrap_or_else(|e| die(e, exit::INIT));
    let mut res = CUdevResource::default();
    call!(api, cuDeviceGetDevResource(dev, &mut res, CU_DEV_RESOURCE_TYPE_SM)).unwrap_or_else(fail);
    let mut desc: CUdevResourceDesc = std::ptr::null_mut();
    call!(api, cuDevResourceGenerateDesc(&mut desc, &mut res, 1)).unwrap_or_else(fail);
    let mut green: CUgreenCtx = std::ptr::null_mut();
    call!(api, cuGreenCtxCreate(&mut green, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM)).unwrap_or_else(fail);
    let mut ctx: CUcontext = std::ptr::null_mut();
    call!(api, cuCtxFromGreenCtx(&mut ctx, green)).unwrap_or_else(fail);
    call!(api, cuCtxSetCurrent(ctx)).unwrap_or_else(fail);
    let held: Vec<CUdeviceptr> = (0..a.count)
        .map(|_| {
            let mut p: CUdeviceptr = 0;
            call!(api, cuMemAlloc_v2(&mut p, a.size as usize)).unwrap_or_else(fail);
            p
        })
        .collect();
    // A later user of the device's primary context: it is active already.
    let mut primary: CUcontext = std::ptr::null_mut();
    call!(api, cuDevicePrimaryCtxRetain(&mut primary, dev)).unwrap_or_else(fail);
    emit(json!({"event": "holding", "pid": std::process::id(), "sm_count": res.sm_count, "allocated": u64::from(a.count) * a.size, "mem": mem_info(&api)}));
    wait_stdin();
    for p in held {
        call!(api, cuMemFree_v2(p)).unwrap_or_else(fail);
    }
    call!(api, cuDevicePrimaryCtxRelease_v2(dev)).unwrap_or_else(fail);
    call!(api, cuGreenCtxDestroy(green)).unwrap_or_else(fail);
    emit(json!({"event": "done"}));
    exit::OK
}
