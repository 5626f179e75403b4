//! `egpu-probe alloc`.

use crate::Global;
use crate::common::setup;
use crate::family::{self, Family};
use egpu_workloads::api::Api;
use egpu_workloads::out::emit;
use egpu_workloads::{exit, parse_bytes};
use serde_json::json;

#[derive(clap::Args)]
pub struct AllocArgs {
    /// mem, pitch, managed, array, mipmap, async, pool, managedpool, defaultpool, vmm, multicast, graph, graph10, graphkeep, capturedpool, ctx, host, hostvmm.
    #[arg(long, default_value = "mem")]
    family: Family,
    /// Bytes per allocation (e.g. 64MiB).
    #[arg(long, default_value = "64MiB", value_parser = parse_bytes)]
    size: u64,
    /// How many allocations (stops earlier at out-of-memory).
    #[arg(long, default_value_t = 1)]
    count: u64,
    /// Keep allocating until out-of-memory (then exit 0).
    #[arg(long)]
    until_oom: bool,
    /// After allocating, print "holding" and wait until stdin is closed.
    #[arg(long)]
    hold: bool,
    /// After setting up the context, print "ready" and wait for a line on stdin.
    #[arg(long)]
    wait_go: bool,
    /// Exit without freeing (like a crash; the slice reclaims the record).
    #[arg(long)]
    no_free: bool,
    /// After allocating, print "allocated" and wait for a line on stdin; then
    /// end the context with the allocations still in it (destroy: cuCtxDestroy
    /// of the --own-ctx context; reset: cuDevicePrimaryCtxReset; release: the
    /// last cuDevicePrimaryCtxRelease), print "ctx-dropped", wait until stdin
    /// is closed and exit without freeing (the driver freed them).
    #[arg(long, value_parser = ["destroy", "reset", "release"])]
    drop_ctx: Option<String>,
    /// A second thread makes a first driver call while this one attaches to
    /// the slice, and finishes attaching after this thread has allocated
    /// (needs a debug libegpu.so with EGPU_HOOK_TEST_INIT_DELAY_MS and
    /// EGPU_HOOK_TEST_INIT_MARK); joined before "holding".
    #[arg(long)]
    pub racing_init: bool,
    /// Allocate on a stream created in --device's context while device N's
    /// primary context is current (async and pool families: the driver
    /// takes the stream's device, not the current one).
    #[arg(long, value_name = "N")]
    current_device: Option<i32>,
    /// `defaultpool`: the default pool of device N (default: --device's).
    #[arg(long, value_name = "N")]
    pool_device: Option<i32>,
    /// After freeing (graph executables destroyed included), allocate once
    /// more, FAMILY of --size, and report it (event "after": ok, or the
    /// error code): what freeing really gave back to the slice.
    #[arg(long, value_name = "FAMILY")]
    after: Option<Family>,
    /// After allocating, cuMemPoolDestroy the default pool of --device
    /// (which the driver refuses); event "pool-destroy" with the code.
    #[arg(long)]
    destroy_default_pool: bool,
    /// Before --after: cuDeviceGraphMemTrim on --device (the graph memory
    /// pool gives back what no graph uses); event "trimmed".
    #[arg(long)]
    trim: bool,
    /// Before freeing: cuMemPoolDestroy the run's pool (pool families);
    /// event "pool-destroyed".
    #[arg(long)]
    destroy_pool_first: bool,
}

/// `--drop-ctx`: ends the context that holds the allocations.
fn drop_ctx(cu: &crate::common::Cuda, how: &str, n: u64) -> i32 {
    emit(json!({"event": "allocated", "allocated": n, "pid": std::process::id(), "mem": cu.mem_info()}));
    crate::common::wait_go_quiet();
    let r = match how {
        "destroy" => egpu_workloads::call!(cu.api, cuCtxDestroy_v2(cu.ctx)),
        "reset" => egpu_workloads::call!(cu.api, cuDevicePrimaryCtxReset_v2(cu.dev)),
        _ => egpu_workloads::call!(cu.api, cuDevicePrimaryCtxRelease_v2(cu.dev)),
    };
    emit(json!({"event": "ctx-dropped", "how": how, "code": r.as_ref().err().map_or(0, |e| e.code)}));
    crate::common::wait_stdin();
    if r.is_ok() { exit::OK } else { exit::FAILED }
}

/// `--racing-init`: started before the process's first driver call (see
/// `main`), it makes the second attachment once the first has begun.
pub fn spawn_racer(g: &Global) -> std::thread::JoinHandle<bool> {
    let (via, ptds) = (g.via, g.ptds);
    std::thread::spawn(move || {
        if !crate::common::wait_init_mark(1) {
            return false;
        }
        let api = egpu_workloads::via::load(via, ptds, &crate::direct::table());
        egpu_workloads::call!(api, cuInit(0)).is_ok()
    })
}

pub fn run(api: Api, g: &Global, a: AllocArgs, racer: Option<std::thread::JoinHandle<bool>>) -> i32 {
    let cu = setup(api, g.device, g.own_ctx);
    let mut st = family::Ctx { pool_device: a.pool_device, per_thread: g.ptds, ..Default::default() };
    if let Some(n) = a.current_device {
        use egpu_workloads::call;
        let die = |e| crate::common::die(e, exit::FAILED);
        call!(cu.api, cuStreamCreate(&mut st.stream, 0)).unwrap_or_else(die);
        let (mut other, mut ctx) = (0, std::ptr::null_mut());
        call!(cu.api, cuDeviceGet(&mut other, n)).unwrap_or_else(die);
        call!(cu.api, cuDevicePrimaryCtxRetain(&mut ctx, other)).unwrap_or_else(die);
        call!(cu.api, cuCtxSetCurrent(ctx)).unwrap_or_else(die);
    }
    if a.wait_go {
        crate::common::wait_go();
    }
    let mut held = Vec::new();
    let (mut stopped, mut code) = ("count", 0u32);
    let want = if a.until_oom { u64::MAX } else { a.count };
    let bytes = family::expected_bytes(a.family, a.size as usize);
    let mut i = 0u64;
    while i < want && i < 1_000_000 {
        match family::alloc(&cu, &mut st, a.family, a.size as usize) {
            Ok(h) => {
                held.push(h);
                emit(json!({"event": "alloc", "family": a.family.name(), "i": i, "ok": true, "bytes": bytes}));
            }
            Err(e) => {
                code = e.code;
                stopped = if e.code == egpu_cuda::CUDA_ERROR_OUT_OF_MEMORY { "oom" } else { "error" };
                emit(json!({"event": stopped, "family": a.family.name(), "i": i, "call": e.call, "code": e.code}));
                break;
            }
        }
        i += 1;
    }
    let n = held.len() as u64;
    if let Some(how) = &a.drop_ctx {
        return drop_ctx(&cu, how, n);
    }
    if let Some(t) = racer {
        emit(json!({"event": "racer-done", "ok": t.join().unwrap_or(false)}));
    }
    if a.destroy_default_pool {
        use egpu_workloads::call;
        let mut pool: egpu_cuda::CUmemoryPool = std::ptr::null_mut();
        let r = call!(cu.api, cuDeviceGetDefaultMemPool(&mut pool, cu.dev)).and_then(|_| call!(cu.api, cuMemPoolDestroy(pool)));
        emit(json!({"event": "pool-destroy", "code": r.as_ref().err().map_or(0, |e| e.code)}));
    }
    if a.hold {
        emit(json!({"event": "holding", "allocated": n, "pid": std::process::id(), "mem": cu.mem_info()}));
        crate::common::hold(&cu);
    }
    if a.no_free {
        emit(json!({"event": "exit-without-free", "allocated": n}));
        std::process::exit(exit::OK);
    }
    if a.destroy_pool_first {
        family::finish(&cu, &mut st);
        emit(json!({"event": "pool-destroyed", "mem": cu.mem_info()}));
    }
    let mut free_err = None;
    for h in held {
        if let Err(e) = family::free(&cu, &st, h) {
            free_err = Some(e);
        }
    }
    if a.trim {
        let r = egpu_workloads::call!(cu.api, cuDeviceGraphMemTrim(cu.dev));
        emit(json!({"event": "trimmed", "code": r.as_ref().err().map_or(0, |e| e.code), "mem": cu.mem_info()}));
    }
    if let Some(f) = a.after {
        match family::alloc(&cu, &mut st, f, a.size as usize) {
            Ok(h) => {
                emit(json!({"event": "after", "family": f.name(), "ok": true, "mem": cu.mem_info()}));
                if let Err(e) = family::free(&cu, &st, h) {
                    free_err = Some(e);
                }
            }
            Err(e) => emit(json!({"event": "after", "family": f.name(), "ok": false, "call": e.call, "code": e.code, "mem": cu.mem_info()})),
        }
    }
    family::finish(&cu, &mut st);
    let mem_after = cu.mem_info();
    cu.teardown(g.own_ctx);
    emit(json!({"event": "summary", "family": a.family.name(), "via": g.via_name(), "allocated": n, "bytes": n * bytes,
                "stopped": stopped, "code": code, "free_error": free_err.map(|e| e.to_string()), "mem_after_free": mem_after}));
    match (stopped, free_err) {
        (_, Some(_)) | ("error", _) => exit::FAILED,
        ("oom", _) if !a.until_oom => exit::OOM,
        _ => exit::OK,
    }
}
