//! `egpu-probe sparse`: VMM handles mapped into a sparse array
//! (`cuMemMapArrayAsync`) and released while still mapped. The array holds
//! their memory, so it must stay charged to the slice until the tiles are
//! unmapped or the array destroyed.

use crate::Global;
use crate::common::{die, setup};
use egpu_cuda::*;
use egpu_workloads::api::Api;
use egpu_workloads::out::emit;
use egpu_workloads::{call, exit, parse_bytes};
use serde_json::json;

#[derive(clap::Args)]
pub struct SparseArgs {
    /// Size of each handle (rounded up to the granularity).
    #[arg(long, default_value = "64MiB", value_parser = parse_bytes)]
    size: u64,
    /// Handles to create and map, each into its own tile range; stops at
    /// the first out-of-memory.
    #[arg(long, default_value_t = 8)]
    count: u32,
    /// Keep each handle after mapping it (by default it is released at once,
    /// leaving the array the only holder of its memory).
    #[arg(long)]
    keep_handles: bool,
}

/// Texels of a 64 KiB tile of a 2D float4 array, along x and y.
const TILE: u32 = 64;

/// Tiles of level 0 that each handle backs: two, side by side, so that a
/// range can be unmapped in pieces.
const PER_HANDLE: u32 = 2;

/// The `n` tiles along x from tile `first`, one tile high.
fn tiles(first: u32, n: u32) -> CUarraySubresource {
    CUarraySubresource::sparse_level(0, 0, [first * TILE, 0, 0], [n * TILE, TILE, 1])
}

/// One map or unmap entry (an unmap names no handle) on device `dev`.
fn entry(array: CUarray, sub: CUarraySubresource, op: u32, handle: CUmemGenericAllocationHandle, dev: CUdevice) -> CUarrayMapInfo {
    CUarrayMapInfo {
        resourceType: CU_RESOURCE_TYPE_ARRAY,
        resource: array,
        subresourceType: CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_SPARSE_LEVEL,
        subresource: sub,
        memOperationType: op,
        memHandleType: CU_MEM_HANDLE_TYPE_GENERIC,
        memHandle: handle,
        offset: 0,
        deviceBitMask: 1 << dev,
        flags: 0,
        reserved: [0; 2],
    }
}

/// After `{"event":"mapped","count":n}`, lines on stdin: `unmap` unmaps the
/// whole level in one entry (`{"event":"unmapped"}`); `unmap-piece K`
/// unmaps tile K (0 or 1) of every handle's range in one call
/// (`{"event":"unmapped-piece","piece":K}`), so a range goes in pieces;
/// `destroy` destroys the
/// array (`{"event":"destroyed"}`); `info` prints `{"event":"mem"}`. End of
/// input exits: 0 if all --count were mapped, 3 if out-of-memory stopped it.
pub fn run(api: Api, g: &Global, a: SparseArgs) -> i32 {
    let cu = setup(api, g.device, g.own_ctx);
    let (prop, size) = cu.vmm_prop(a.size, CU_MEM_HANDLE_TYPE_NONE, CU_MEM_CREATE_USAGE_TILE_POOL);
    let desc = CUDA_ARRAY3D_DESCRIPTOR { Width: (TILE * PER_HANDLE * a.count.max(1)) as usize, Height: TILE as usize, Depth: 0, Format: CU_AD_FORMAT_FLOAT, NumChannels: 4, Flags: CUDA_ARRAY3D_SPARSE };
    let mut array: CUarray = std::ptr::null_mut();
    call!(cu.api, cuArray3DCreate_v2(&mut array, &desc)).unwrap_or_else(|e| die(e, exit::FAILED));
    emit(json!({"event": "array", "mem": cu.mem_info()}));
    let mut held = Vec::new();
    let mut stopped = None;
    let mut mapped = 0u32;
    for i in 0..a.count {
        let mut h: CUmemGenericAllocationHandle = 0;
        if let Err(e) = call!(cu.api, cuMemCreate(&mut h, size, &prop, 0)) {
            stopped = Some(e.code);
            break;
        }
        let mut m = [entry(array, tiles(i * PER_HANDLE, PER_HANDLE), CU_MEM_OPERATION_TYPE_MAP, h, cu.dev)];
        call!(cu.api, cuMemMapArrayAsync(m.as_mut_ptr(), 1, std::ptr::null_mut())).unwrap_or_else(|e| die(e, exit::FAILED));
        mapped += 1;
        if a.keep_handles {
            held.push(h);
        } else {
            call!(cu.api, cuMemRelease(h)).unwrap_or_else(|e| die(e, exit::FAILED));
        }
    }
    emit(json!({"event": "mapped", "count": mapped, "oom": stopped, "bytes": size, "mem": cu.mem_info()}));
    let mut alive = true;
    let mut line = String::new();
    while matches!(std::io::stdin().read_line(&mut line), Ok(n) if n > 0) {
        match line.trim() {
            cmd if alive && cmd.starts_with("unmap-piece ") => {
                let Some(k) = cmd["unmap-piece ".len()..].trim().parse::<u32>().ok().filter(|k| *k < PER_HANDLE) else {
                    emit(json!({"event": "unknown-command", "line": cmd}));
                    line.clear();
                    continue;
                };
                let mut m: Vec<CUarrayMapInfo> = (0..mapped).map(|i| entry(array, tiles(i * PER_HANDLE + k, 1), CU_MEM_OPERATION_TYPE_UNMAP, 0, cu.dev)).collect();
                match call!(cu.api, cuMemMapArrayAsync(m.as_mut_ptr(), m.len() as u32, std::ptr::null_mut())) {
                    Ok(()) => emit(json!({"event": "unmapped-piece", "piece": k, "mem": cu.mem_info()})),
                    Err(e) => emit(json!({"event": "unmapped-piece", "piece": k, "code": e.code})),
                }
            }
            "unmap" if alive => {
                let mut m = [entry(array, tiles(0, PER_HANDLE * a.count.max(1)), CU_MEM_OPERATION_TYPE_UNMAP, 0, cu.dev)];
                match call!(cu.api, cuMemMapArrayAsync(m.as_mut_ptr(), 1, std::ptr::null_mut())) {
                    Ok(()) => emit(json!({"event": "unmapped", "mem": cu.mem_info()})),
                    Err(e) => emit(json!({"event": "unmapped", "code": e.code})),
                }
            }
            "destroy" if alive => {
                match call!(cu.api, cuArrayDestroy(array)) {
                    Ok(()) => emit(json!({"event": "destroyed", "mem": cu.mem_info()})),
                    Err(e) => emit(json!({"event": "destroyed", "code": e.code})),
                }
                alive = false;
            }
            "info" => emit(json!({"event": "mem", "mem": cu.mem_info()})),
            other => emit(json!({"event": "unknown-command", "line": other})),
        }
        line.clear();
    }
    for h in held {
        let _ = call!(cu.api, cuMemRelease(h));
    }
    if alive {
        let _ = call!(cu.api, cuArrayDestroy(array));
    }
    cu.teardown(g.own_ctx);
    emit(json!({"event": "done"}));
    if stopped.is_some() { exit::OOM } else { exit::OK }
}
