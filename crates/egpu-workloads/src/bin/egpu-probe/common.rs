//! Set-up shared by the subcommands: the function table, a context, memory
//! queries, and waiting for the controlling test.

use egpu_cuda::*;
use egpu_workloads::api::{Api, CallError};
use egpu_workloads::call;
use egpu_workloads::exit;
use egpu_workloads::out::emit;
use serde_json::json;
use std::io::Read;

pub struct Cuda {
    pub api: Api,
    pub dev: CUdevice,
    pub ctx: CUcontext,
}

/// Prints the error as JSON and exits with `code`.
pub fn die(e: CallError, code: i32) -> ! {
    emit(json!({"event": "error", "call": e.call, "code": e.code}));
    std::process::exit(code)
}

/// `cuInit`, the device, and a current context (primary unless `own_ctx`).
pub fn setup(api: Api, ordinal: i32, own_ctx: bool) -> Cuda {
    call!(api, cuInit(0)).unwrap_or_else(|e| die(e, exit::INIT));
    let mut dev: CUdevice = 0;
    call!(api, cuDeviceGet(&mut dev, ordinal)).unwrap_or_else(|e| die(e, exit::INIT));
    let mut ctx: CUcontext = std::ptr::null_mut();
    if own_ctx {
        call!(api, cuCtxCreate_v2(&mut ctx, 0, dev)).unwrap_or_else(|e| die(e, exit::INIT));
    } else {
        call!(api, cuDevicePrimaryCtxRetain(&mut ctx, dev)).unwrap_or_else(|e| die(e, exit::INIT));
        call!(api, cuCtxSetCurrent(ctx)).unwrap_or_else(|e| die(e, exit::INIT));
    }
    Cuda { api, dev, ctx }
}

/// `cuMemGetInfo_v2` of the current context as JSON (or the error).
pub fn mem_info(api: &Api) -> serde_json::Value {
    let (mut f, mut t) = (0usize, 0usize);
    match call!(api, cuMemGetInfo_v2(&mut f, &mut t)) {
        Ok(()) => json!({"free": f, "total": t}),
        Err(e) => json!({"error": e.code}),
    }
}

impl Cuda {
    /// Pinned device memory on this device for `cuMemCreate`, with the
    /// given handle types and usage flags, and `size` rounded up to its
    /// minimum granularity (exits on a driver error).
    pub fn vmm_prop(&self, size: u64, handle_types: u32, usage: u16) -> (CUmemAllocationProp, usize) {
        let prop = CUmemAllocationProp {
            type_: CU_MEM_ALLOCATION_TYPE_PINNED,
            requestedHandleTypes: handle_types,
            location: CUmemLocation { type_: CU_MEM_LOCATION_TYPE_DEVICE, id: self.dev },
            win32HandleMetaData: std::ptr::null_mut(),
            allocFlags: CUmemAllocationPropAllocFlags { usage, ..Default::default() },
        };
        let mut gran: usize = 0;
        call!(self.api, cuMemGetAllocationGranularity(&mut gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM)).unwrap_or_else(|e| die(e, exit::FAILED));
        (prop, (size as usize).div_ceil(gran.max(1)) * gran.max(1))
    }

    /// `cuMemGetInfo_v2` as JSON (or the error).
    pub fn mem_info(&self) -> serde_json::Value {
        mem_info(&self.api)
    }

    /// Releases the context made by [`setup`].
    pub fn teardown(&self, own_ctx: bool) {
        if own_ctx {
            let _ = call!(self.api, cuCtxDestroy_v2(self.ctx));
        } else {
            let _ = call!(self.api, cuDevicePrimaryCtxRelease_v2(self.dev));
        }
    }
}

/// Blocks until stdin reaches end of file (the controlling test closes it).
pub fn wait_stdin() {
    let mut buf = [0u8; 256];
    let mut i = std::io::stdin().lock();
    while matches!(i.read(&mut buf), Ok(n) if n > 0) {}
}

/// Like [`wait_stdin`]; each line `info` on stdin prints `{"event":"mem",...}` (cuMemGetInfo now).
pub fn hold(cu: &Cuda) {
    let mut l = String::new();
    while matches!(std::io::stdin().read_line(&mut l), Ok(n) if n > 0) {
        if l.trim() == "info" {
            emit(json!({"event": "mem", "mem": cu.mem_info()}));
        }
        l.clear();
    }
}

/// Prints "ready" and blocks until a line arrives on stdin (lets a test start
/// several probes' allocations together, after all have their contexts).
pub fn wait_go() {
    emit(json!({"event": "ready", "pid": std::process::id()}));
    wait_go_quiet();
}

/// Blocks until a line arrives on stdin.
pub fn wait_go_quiet() {
    let mut l = String::new();
    let _ = std::io::stdin().read_line(&mut l);
}

/// Waits (up to 20 s) until the debug libegpu.so has created
/// `$EGPU_HOOK_TEST_INIT_MARK.k`, i.e. its k-th attachment has begun; false
/// if the variable is unset or the mark never appears.
pub fn wait_init_mark(k: usize) -> bool {
    let Some(mark) = std::env::var_os("EGPU_HOOK_TEST_INIT_MARK") else { return false };
    let mut path = mark;
    path.push(format!(".{k}"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !std::path::Path::new(&path).exists() {
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    true
}
