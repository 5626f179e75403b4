//! `egpu-probe vmm-reimport`: memory the hook cannot follow. A VMM
//! allocation is exported as a file descriptor and imported back into the
//! same process; the import is mapped and the original handle released. The
//! hook charges `cuMemCreate` and uncharges at the original's release, but
//! an imported handle is never charged (its memory is charged where it was
//! made), so the mapped memory ends up uncharged. `egpud`'s memory audit
//! finds it in the driver's per-process accounting.

use crate::Global;
use crate::common::{die, setup};
use egpu_cuda::*;
use egpu_workloads::api::Api;
use egpu_workloads::out::emit;
use egpu_workloads::{call, exit, parse_bytes};
use serde_json::json;
use std::ffi::c_void;

#[derive(clap::Args)]
pub struct ReimportArgs {
    /// Size of the re-imported allocation (rounded up to the granularity).
    #[arg(long, default_value = "256MiB", value_parser = parse_bytes)]
    size: u64,
    /// What the `alloc` command on stdin asks of cuMemAlloc.
    #[arg(long, default_value = "64MiB", value_parser = parse_bytes)]
    alloc: u64,
}

/// After `{"event":"reimported"}`, lines on stdin: `alloc` tries cuMemAlloc
/// of --alloc and frees it again (`{"event":"alloc","ok":..}`); `release`
/// unmaps and releases the imported handle (`{"event":"released"}`); end of
/// input exits.
pub fn run(api: Api, g: &Global, a: ReimportArgs) -> i32 {
    let cu = setup(api, g.device, g.own_ctx);
    let (prop, size) = cu.vmm_prop(a.size, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    let mut original: CUmemGenericAllocationHandle = 0;
    call!(cu.api, cuMemCreate(&mut original, size, &prop, 0)).unwrap_or_else(|e| die(e, exit::OOM));
    let mut fd: i32 = -1;
    call!(cu.api, cuMemExportToShareableHandle(&mut fd as *mut i32 as *mut c_void, original, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)).unwrap_or_else(|e| die(e, exit::FAILED));
    let mut imported: CUmemGenericAllocationHandle = 0;
    call!(cu.api, cuMemImportFromShareableHandle(&mut imported, fd as usize as *mut c_void, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)).unwrap_or_else(|e| die(e, exit::FAILED));
    // SAFETY: the descriptor the driver exported for us; the import holds its own reference.
    unsafe { libc::close(fd) };
    let mut va: CUdeviceptr = 0;
    call!(cu.api, cuMemAddressReserve(&mut va, size, 0, 0, 0)).unwrap_or_else(|e| die(e, exit::FAILED));
    call!(cu.api, cuMemMap(va, size, 0, imported, 0)).unwrap_or_else(|e| die(e, exit::FAILED));
    let access = CUmemAccessDesc { location: prop.location, flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
    call!(cu.api, cuMemSetAccess(va, size, &access, 1)).unwrap_or_else(|e| die(e, exit::FAILED));
    call!(cu.api, cuMemRelease(original)).unwrap_or_else(|e| die(e, exit::FAILED));
    emit(json!({"event": "reimported", "bytes": size, "pid": std::process::id(), "mem": cu.mem_info()}));
    let mut mapped = true;
    let mut line = String::new();
    while matches!(std::io::stdin().read_line(&mut line), Ok(n) if n > 0) {
        match line.trim() {
            "alloc" => {
                let mut p: CUdeviceptr = 0;
                match call!(cu.api, cuMemAlloc_v2(&mut p, a.alloc as usize)) {
                    Ok(()) => {
                        let _ = call!(cu.api, cuMemFree_v2(p));
                        emit(json!({"event": "alloc", "ok": true, "bytes": a.alloc, "mem": cu.mem_info()}));
                    }
                    Err(e) => emit(json!({"event": "alloc", "ok": false, "bytes": a.alloc, "code": e.code, "mem": cu.mem_info()})),
                }
            }
            "release" if mapped => {
                let _ = call!(cu.api, cuMemUnmap(va, size));
                let _ = call!(cu.api, cuMemRelease(imported));
                let _ = call!(cu.api, cuMemAddressFree(va, size));
                mapped = false;
                emit(json!({"event": "released"}));
            }
            other => emit(json!({"event": "unknown-command", "line": other})),
        }
        line.clear();
    }
    if mapped {
        let _ = call!(cu.api, cuMemUnmap(va, size));
        let _ = call!(cu.api, cuMemRelease(imported));
        let _ = call!(cu.api, cuMemAddressFree(va, size));
    }
    cu.teardown(g.own_ctx);
    emit(json!({"event": "done"}));
    exit::OK
}
