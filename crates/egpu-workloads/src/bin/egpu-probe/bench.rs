//! `egpu-probe bench`: per-call cost of cuMemAlloc_v2+cuMemFree_v2 and of
//! cuLaunchKernel. Run it with and without `LD_PRELOAD=libegpu.so` in the
//! same session to get the hook's added cost (scripts/bench-hook.sh).

use crate::Global;
use crate::common::{die, setup};
use egpu_cuda::*;
use egpu_workloads::api::Api;
use egpu_workloads::out::emit;
use egpu_workloads::{call, exit};
use serde_json::json;
use std::time::Instant;

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Calls per operation.
    #[arg(long, default_value_t = 200_000)]
    calls: u64,
    /// Calls per timed batch (the median over batches is reported).
    #[arg(long, default_value_t = 1000)]
    batch: u64,
    /// alloc, launch or all.
    #[arg(long, default_value = "all")]
    op: String,
}

/// A kernel that does nothing, as PTX (JIT-compiled by real drivers; any image works on the simulated GPU).
const NOOP_PTX: &[u8] = b".version 7.0\n.target sm_75\n.address_size 64\n.visible .entry egpu_noop()\n{\n\tret;\n}\n\0";

fn stats(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    let q = |f: f64| v[((v.len() - 1) as f64 * f) as usize];
    (q(0.5), q(0.1), q(0.9))
}

pub fn run(api: Api, g: &Global, a: BenchArgs) -> i32 {
    let cu = setup(api, g.device, g.own_ctx);
    let batches = (a.calls / a.batch).max(1);
    let hooked = std::env::var("LD_PRELOAD").is_ok_and(|v| v.contains("libegpu"));
    if a.op == "alloc" || a.op == "all" {
        let mut per = Vec::new();
        for _ in 0..batches {
            let t = Instant::now();
            for _ in 0..a.batch {
                let mut p: CUdeviceptr = 0;
                call!(cu.api, cuMemAlloc_v2(&mut p, 1 << 20)).unwrap_or_else(|e| die(e, exit::FAILED));
                call!(cu.api, cuMemFree_v2(p)).unwrap_or_else(|e| die(e, exit::FAILED));
            }
            per.push(t.elapsed().as_nanos() as f64 / (2 * a.batch) as f64);
        }
        let (m, p10, p90) = stats(per);
        emit(json!({"event": "bench", "op": "alloc_free", "hooked": hooked, "via": g.via_name(), "calls": batches * a.batch * 2, "median_ns": m, "p10_ns": p10, "p90_ns": p90}));
    }
    if a.op == "launch" || a.op == "all" {
        let mut m: CUmodule = std::ptr::null_mut();
        call!(cu.api, cuModuleLoadData(&mut m, NOOP_PTX.as_ptr().cast())).unwrap_or_else(|e| die(e, exit::FAILED));
        let mut f: CUfunction = std::ptr::null_mut();
        call!(cu.api, cuModuleGetFunction(&mut f, m, c"egpu_noop".as_ptr())).unwrap_or_else(|e| die(e, exit::FAILED));
        let stream: CUstream = std::ptr::null_mut();
        let mut per = Vec::new();
        for _ in 0..batches {
            let t = Instant::now();
            for _ in 0..a.batch {
                call!(cu.api, cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, stream, std::ptr::null_mut(), std::ptr::null_mut())).unwrap_or_else(|e| die(e, exit::FAILED));
            }
            per.push(t.elapsed().as_nanos() as f64 / a.batch as f64);
            call!(cu.api, cuCtxSynchronize()).unwrap_or_else(|e| die(e, exit::FAILED));
        }
        let _ = call!(cu.api, cuModuleUnload(m));
        let (md, p10, p90) = stats(per);
        emit(json!({"event": "bench", "op": "launch", "hooked": hooked, "via": g.via_name(), "calls": batches * a.batch, "median_ns": md, "p10_ns": p10, "p90_ns": p90}));
    }
    cu.teardown(g.own_ctx);
    exit::OK
}
