//! `egpu-probe info`: what the program sees of its GPUs.

use crate::Global;
use crate::common::setup;
use egpu_cuda::*;
use egpu_workloads::api::Api;
use egpu_workloads::call;
use egpu_workloads::exit;
use egpu_workloads::out::emit;
use serde_json::{Value, json};
use std::ffi::{CStr, c_char};

fn uuid(u: &CUuuid) -> String {
    let b: Vec<u8> = u.bytes.iter().map(|&c| c as u8).collect();
    let h = |r: std::ops::Range<usize>| b[r].iter().map(|x| format!("{x:02x}")).collect::<String>();
    format!("GPU-{}-{}-{}-{}-{}", h(0..4), h(4..6), h(6..8), h(8..10), h(10..16))
}

fn nvml(api: &Api) -> Value {
    if let Err(e) = call!(api, nvmlInit_v2()) {
        return json!({"error": e.code});
    }
    let mut n: u32 = 0;
    if let Err(e) = call!(api, nvmlDeviceGetCount_v2(&mut n)) {
        return json!({"error": e.code});
    }
    let mut devs = Vec::new();
    for i in 0..n {
        let mut h: nvmlDevice_t = std::ptr::null_mut();
        if let Err(e) = call!(api, nvmlDeviceGetHandleByIndex_v2(i, &mut h)) {
            devs.push(json!({"index": i, "error": e.code}));
            continue;
        }
        let mut buf = [0 as c_char; NVML_DEVICE_UUID_V2_BUFFER_SIZE];
        let u = call!(api, nvmlDeviceGetUUID(h, buf.as_mut_ptr(), buf.len() as u32))
            // SAFETY: NVML wrote a NUL-terminated string into buf.
            .map(|_| unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut m = nvmlMemory_t::default();
        let mem = call!(api, nvmlDeviceGetMemoryInfo(h, &mut m)).map(|_| json!({"total": m.total, "free": m.free, "used": m.used})).unwrap_or_else(|e| json!({"error": e.code}));
        let mut m2 = nvmlMemory_v2_t { version: nvmlMemory_v2, ..Default::default() };
        let mem2 = call!(api, nvmlDeviceGetMemoryInfo_v2(h, &mut m2)).map(|_| json!({"total": m2.total, "free": m2.free, "used": m2.used})).unwrap_or_else(|e| json!({"error": e.code}));
        let mut idx: u32 = u32::MAX;
        let index = call!(api, nvmlDeviceGetIndex(h, &mut idx)).map(|_| json!(idx)).unwrap_or_else(|e| json!({"error": e.code}));
        let mut cnt: u32 = 64;
        let mut procs = vec![nvmlProcessInfo_t::default(); 64];
        let plist = call!(api, nvmlDeviceGetComputeRunningProcesses_v3(h, &mut cnt, procs.as_mut_ptr()))
            .map(|_| procs[..cnt as usize].iter().map(|p| json!({"pid": p.pid, "used": p.usedGpuMemory})).collect::<Vec<_>>())
            .map(Value::from)
            .unwrap_or_else(|e| json!({"error": e.code}));
        devs.push(json!({"index": i, "nvml_index": index, "uuid": u, "memory": mem, "memory_v2": mem2, "processes": plist}));
    }
    json!({"count": n, "devices": devs})
}

pub fn run(api: Api, g: &Global) -> i32 {
    let nv = nvml(&api);
    // NVML first and on its own line: it is answered even when no context can be made.
    emit(json!({"event": "nvml", "nvml": nv.clone()}));
    let cu = setup(api, g.device, g.own_ctx);
    let mut count: i32 = 0;
    let _ = call!(cu.api, cuDeviceGetCount(&mut count));
    let mut devices = Vec::new();
    for i in 0..count {
        let mut d: CUdevice = 0;
        let _ = call!(cu.api, cuDeviceGet(&mut d, i));
        let mut u = CUuuid::default();
        let id = call!(cu.api, cuDeviceGetUuid_v2(&mut u, d)).map(|_| uuid(&u)).unwrap_or_default();
        let mut t: usize = 0;
        let total = call!(cu.api, cuDeviceTotalMem_v2(&mut t, d)).map(|_| json!(t)).unwrap_or_else(|e| json!({"error": e.code}));
        devices.push(json!({"ordinal": i, "uuid": id, "total_mem": total}));
    }
    let mem = cu.mem_info();
    cu.teardown(g.own_ctx);
    emit(json!({"event": "info", "via": g.via_name(), "device": g.device, "device_count": count, "devices": devices, "mem_get_info": mem, "nvml": nv, "pid": std::process::id()}));
    exit::OK
}
