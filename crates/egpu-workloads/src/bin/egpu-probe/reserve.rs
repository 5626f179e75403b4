//! `egpu-probe reserve`: how much device memory the driver commits outside
//! any allocation call, and when. Run without the hook, it measures the real
//! driver (the device check records it); under the hook, what the slice
//! view shows of it. One `reserve` event with the free memory after each
//! step and each step's drop.

use crate::Global;
use crate::common::{die, setup};
use egpu_cuda::*;
use egpu_workloads::api::Api;
use egpu_workloads::out::emit;
use egpu_workloads::{call, exit, parse_bytes};
use serde_json::json;

#[derive(clap::Args)]
pub struct ReserveArgs {
    /// The device malloc heap to ask for (cuCtxSetLimit CU_LIMIT_MALLOC_HEAP_SIZE).
    #[arg(long, default_value = "1GiB", value_parser = parse_bytes)]
    heap: u64,
    /// The per-thread stack to ask for (CU_LIMIT_STACK_SIZE).
    #[arg(long, default_value = "64KiB", value_parser = parse_bytes)]
    stack: u64,
    /// Size of the module's __device__ global.
    #[arg(long, default_value = "256MiB", value_parser = parse_bytes)]
    global: u64,
}

/// PTX of a kernel that does nothing and a global of `bytes` bytes.
fn module_ptx(bytes: u64) -> Vec<u8> {
    // sm_52 JIT-compiles on every GPU a CUDA 12/13 driver supports.
    format!(".version 6.0\n.target sm_52\n.address_size 64\n.visible .global .align 8 .b8 egpu_reserve_global[{bytes}];\n.visible .entry egpu_reserve_noop()\n{{\n\tret;\n}}\n\0").into_bytes()
}

pub fn run(api: Api, g: &Global, a: ReserveArgs) -> i32 {
    let cu = setup(api, g.device, g.own_ctx);
    let free = || {
        let (mut f, mut t) = (0usize, 0usize);
        call!(cu.api, cuMemGetInfo_v2(&mut f, &mut t)).unwrap_or_else(|e| die(e, exit::FAILED));
        f as u64
    };
    let mut steps = vec![("start", free())];
    let heap = call!(cu.api, cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, a.heap as usize)).err().map(|e| e.code);
    steps.push(("heap_set", free()));
    let stack = call!(cu.api, cuCtxSetLimit(CU_LIMIT_STACK_SIZE, a.stack as usize)).err().map(|e| e.code);
    steps.push(("stack_set", free()));
    let ptx = module_ptx(a.global);
    let mut m: CUmodule = std::ptr::null_mut();
    let module = call!(cu.api, cuModuleLoadData(&mut m, ptx.as_ptr().cast())).err().map(|e| e.code);
    steps.push(("module_loaded", free()));
    let mut launch = None;
    if module.is_none() {
        let mut f: CUfunction = std::ptr::null_mut();
        launch = call!(cu.api, cuModuleGetFunction(&mut f, m, c"egpu_reserve_noop".as_ptr()))
            .and_then(|_| call!(cu.api, cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut())))
            .and_then(|_| call!(cu.api, cuCtxSynchronize()))
            .err()
            .map(|e| e.code);
    }
    steps.push(("launched", free()));
    if module.is_none() {
        let _ = call!(cu.api, cuModuleUnload(m));
    }
    steps.push(("module_unloaded", free()));
    let drops: serde_json::Map<String, serde_json::Value> =
        steps.windows(2).map(|w| (w[1].0.to_string(), json!(w[0].1 as i128 - w[1].1 as i128))).collect();
    emit(json!({"event": "reserve", "heap": a.heap, "stack": a.stack, "global": a.global,
        "free": steps.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
        "drop": drops, "errors": {"heap": heap, "stack": stack, "module": module, "launch": launch}}));
    cu.teardown(g.own_ctx);
    exit::OK
}
