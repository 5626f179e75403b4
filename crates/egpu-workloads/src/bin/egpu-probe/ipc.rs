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

pub fn fork(api: Api, g: &Global, a: ForkArgs) -> i32 {
    let mut held = None;
    let cu = if a.parent_cuda {
        let cu = setup(api, g.device, g.own_ctx);
        let mut p: CUdeviceptr = 0;
        call!(cu.api, cuMemAlloc_v2(&mut p, a.size as usize)).unwrap_or_else(|e| die(e, exit::FAILED));
        held = Some(p);
        emit(json!({"event": "parent-alloc", "pid": std::process::id(), "mem": cu.mem_info()}));
        Some(cu)
    } else {
        None
    };
    // SAFETY: fork in a single-threaded program; the child only makes driver calls and exits.
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
    // SAFETY: waits for the child we forked.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    let child_ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    if let (Some(cu), Some(p)) = (&cu, held) {
        let _ = call!(cu.api, cuMemFree_v2(p));
    }
    emit(json!({"event": "parent-done", "child_ok": child_ok, "mem": cu.as_ref().map(|c| c.mem_info())}));
    if let Some(c) = &cu {
        c.teardown(g.own_ctx);
    }
    if child_ok { exit::OK } else { exit::FAILED }
}
