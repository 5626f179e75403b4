//! `egpu-probe ipc-export`, `ipc-import` and `fork`.

use crate::Global;
use crate::common::{die, setup, wait_stdin};
use egpu_cuda::*;
use egpu_workloads::api::Api;
use egpu_workloads::out::emit;
use egpu_workloads::{call, exit, parse_bytes};
use serde_json::json;

#[derive(clap::Args)]
pub struct ExportArgs {
    #[arg(long, default_value = "64MiB", value_parser = parse_bytes)]
    size: u64,
}

#[derive(clap::Args)]
pub struct ImportArgs {
    /// The hex handle printed by ipc-export.
    #[arg(long)]
    handle: String,
}

#[derive(clap::Args)]
pub struct ForkArgs {
    #[arg(long, default_value = "64MiB", value_parser = parse_bytes)]
    size: u64,
    /// Initialise CUDA in the parent before forking (real drivers do not
    /// allow the child to use CUDA then; the simulated GPU does).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    parent_cuda: bool,
    /// Fork while another thread makes the process's first driver call and
    /// is attaching to the slice (needs a debug libegpu.so with
    /// EGPU_HOOK_TEST_INIT_DELAY_MS and EGPU_HOOK_TEST_INIT_MARK, whose mark
    /// says when the attachment has begun); implies --parent-cuda false.
    #[arg(long)]
    during_init: bool,
    /// Give up on the child after this many seconds (reported as blocked).
    #[arg(long, default_value_t = 20)]
    child_timeout_s: u64,
}

pub fn export(api: Api, g: &Global, a: ExportArgs) -> i32 {
    let cu = setup(api, g.device, g.own_ctx);
    let mut p: CUdeviceptr = 0;
    call!(cu.api, cuMemAlloc_v2(&mut p, a.size as usize)).unwrap_or_else(|e| die(e, exit::FAILED));
    let mut h = CUipcMemHandle { reserved: [0; CU_IPC_HANDLE_SIZE] };
    call!(cu.api, cuIpcGetMemHandle(&mut h, p)).unwrap_or_else(|e| die(e, exit::FAILED));
    let hex: String = h.reserved.iter().map(|&b| format!("{:02x}", b as u8)).collect();
    emit(json!({"event": "exported", "handle": hex, "bytes": a.size, "pid": std::process::id(), "mem": cu.mem_info()}));
    wait_stdin();
    let _ = call!(cu.api, cuMemFree_v2(p));
    cu.teardown(g.own_ctx);
    emit(json!({"event": "done"}));
    exit::OK
}

pub fn import(api: Api, g: &Global, a: ImportArgs) -> i32 {
    let mut h = CUipcMemHandle { reserved: [0; CU_IPC_HANDLE_SIZE] };
    if a.handle.len() != 2 * CU_IPC_HANDLE_SIZE {
        eprintln!("--handle must be {} hex digits", 2 * CU_IPC_HANDLE_SIZE);
        return exit::USAGE;
    }
    for (i, b) in h.reserved.iter_mut().enumerate() {
        match u8::from_str_radix(&a.handle[2 * i..2 * i + 2], 16) {
            Ok(v) => *b = v as std::ffi::c_char,
            Err(_) => return exit::USAGE,
        }
    }
    let cu = setup(api, g.device, g.own_ctx);
    let mut p: CUdeviceptr = 0;
    call!(cu.api, cuIpcOpenMemHandle_v2(&mut p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)).unwrap_or_else(|e| die(e, exit::FAILED));
    emit(json!({"event": "imported", "pid": std::process::id(), "mem": cu.mem_info()}));
    wait_stdin();
    let _ = call!(cu.api, cuIpcCloseMemHandle(p));
    cu.teardown(g.own_ctx);
    emit(json!({"event": "done"}));
    exit::OK
}

pub fn fork(load: &dyn Fn() -> Api, g: &Global, a: ForkArgs) -> i32 {
    let mut held = None;
    let mut first_call = None;
    if a.during_init {
        let (via, ptds) = (g.via, g.ptds);
        first_call = Some(std::thread::spawn(move || {
            let api = egpu_workloads::via::load(via, ptds, &crate::direct::table());
            call!(api, cuInit(0)).is_ok()
        }));
        // Fork only once that thread is inside the hook's attachment.
        let inside = crate::common::wait_init_mark(1);
        emit(json!({"event": "init-entered", "inside": inside}));
        if !inside {
            return exit::FAILED;
        }
    }
    let cu = if a.parent_cuda && !a.during_init {
        let cu = setup(load(), g.device, g.own_ctx);
        let mut p: CUdeviceptr = 0;
        call!(cu.api, cuMemAlloc_v2(&mut p, a.size as usize)).unwrap_or_else(|e| die(e, exit::FAILED));
        held = Some(p);
        emit(json!({"event": "parent-alloc", "pid": std::process::id(), "mem": cu.mem_info()}));
        Some(cu)
    } else {
        None
    };
    // SAFETY: the child only makes driver calls through libegpu.so and the
    // driver and exits; with --during-init another thread of ours is inside
    // the hook at the fork, which is what this command tests (the hook takes
    // no lock that such a thread could hold: it must not block the child).
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let api = egpu_workloads::via::load(g.via, g.ptds, &crate::direct::table());
        let c = setup(api, g.device, g.own_ctx);
        let mut p: CUdeviceptr = 0;
        let r = call!(c.api, cuMemAlloc_v2(&mut p, a.size as usize));
        emit(json!({"event": "child", "pid": std::process::id(), "ok": r.is_ok(), "code": r.err().map(|e| e.code), "mem": c.mem_info()}));
        if r.is_ok() {
            let _ = call!(c.api, cuMemFree_v2(p));
        }
        c.teardown(g.own_ctx);
        std::process::exit(if r.is_ok() { exit::OK } else { exit::FAILED });
    }
    let mut status = 0;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(a.child_timeout_s);
    let mut blocked = false;
    // SAFETY: polls the child we forked.
    while unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == 0 {
        if std::time::Instant::now() > deadline {
            blocked = true;
            // SAFETY: kills and reaps our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let child_ok = !blocked && libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    let first_call_ok = first_call.map(|t| t.join().unwrap_or(false));
    if let (Some(cu), Some(p)) = (&cu, held) {
        let _ = call!(cu.api, cuMemFree_v2(p));
    }
    emit(json!({"event": "parent-done", "child_ok": child_ok, "child_blocked": blocked, "first_call_ok": first_call_ok, "mem": cu.as_ref().map(|c| c.mem_info())}));
    if let Some(c) = &cu {
        c.teardown(g.own_ctx);
    }
    if child_ok { exit::OK } else { exit::FAILED }
}
