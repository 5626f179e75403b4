//! Single-scenario API tests, each in its own child process (the library
//! reads its environment once per process).

mod common;

use common::*;
use egpu_cuda::*;
use std::ffi::{CString, c_void};

const MIB: u64 = 1 << 20;

fn say(k: &str, v: impl std::fmt::Display) {
    println!("@{k} {v}");
}

/// Device memory on device 0 that can be exported as a file descriptor.
fn exportable_prop() -> CUmemAllocationProp {
    CUmemAllocationProp {
        type_: CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        location: CUmemLocation { type_: CU_MEM_LOCATION_TYPE_DEVICE, id: 0 },
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: Default::default(),
    }
}

#[test]
fn child() {
    let Ok(role) = std::env::var("SIMTEST_ROLE") else { return };
    let s = Sim::load();
    match role.as_str() {
        "procaddr" => {
            assert_eq!(s.cuInit(0), CUDA_SUCCESS);
            let get = |name: &str, ver: i32, flags: u64| {
                let c = CString::new(name).unwrap();
                let mut p = std::ptr::null_mut();
                let mut st = 99u32;
                let r = s.cuGetProcAddress_v2(c.as_ptr(), &mut p, ver, flags, &mut st);
                (r, p, st)
            };
            let ptds = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
            let ok = |name: &str, ver: i32, flags: u64, sym: &str| {
                let (r, p, st) = get(name, ver, flags);
                r == CUDA_SUCCESS && st == CU_GET_PROC_ADDRESS_SUCCESS && p == s.sym(sym) && !p.is_null()
            };
            say("memalloc", ok("cuMemAlloc", 12000, 0, "cuMemAlloc_v2"));
            say("ctxcreate", ok("cuCtxCreate", 11040, 0, "cuCtxCreate_v3") && ok("cuCtxCreate", 12080, 0, "cuCtxCreate_v4"));
            say("self", ok("cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2") && ok("cuGetProcAddress", 11030, 0, "cuGetProcAddress"));
            say("ptsz", ok("cuLaunchKernel", 12000, ptds, "cuLaunchKernel_ptsz") && ok("cuLaunchKernel", 12000, 0, "cuLaunchKernel"));
            let (r, p, st) = get("cuNoSuchFunction", 12000, 0);
            say("unknown", format!("{r} {} {st}", p.is_null()));
            let (r, p, st) = get("cuMemAllocAsync", 11000, 0);
            say("tooold", format!("{r} {} {st}", p.is_null()));
            // The 12.0 signature without symbolStatus.
            let c = CString::new("cuMemFree").unwrap();
            let mut p = std::ptr::null_mut();
            say("v1", s.cuGetProcAddress(c.as_ptr(), &mut p, 12000, 0) == CUDA_SUCCESS && p == s.sym("cuMemFree_v2"));
            // Every versioned name of the 12.x driver is a real ELF symbol.
            let missing: Vec<&str> = egpu_simgpu::procaddr::all_symbols().filter(|n| s.sym(n).is_null()).collect();
            say("missing", format!("{missing:?}"));
            // An unimplemented one answers NOT_SUPPORTED.
            let f = s.sym("cuTexRefSetArray");
            // SAFETY: the stub takes no arguments and returns CUresult.
            let r = unsafe { std::mem::transmute::<*mut c_void, extern "C" fn() -> u32>(f)() };
            say("stub", r);
        }
        "visible" => {
            let r = s.cuInit(0);
            let mut n = -1;
            let _ = s.cuDeviceGetCount(&mut n);
            let mut uuid = CUuuid::default();
            let _ = s.cuDeviceGetUuid(&mut uuid, 0);
            let mut nv = 0u32;
            assert_eq!(s.nvmlInit_v2(), NVML_SUCCESS);
            assert_eq!(s.nvmlDeviceGetCount_v2(&mut nv), NVML_SUCCESS);
            say("init", r);
            say("count", n);
            say("uuid15", uuid.bytes[15] as u8);
            say("nvml", nv);
        }
        "init_only" => {
            say("init", s.cuInit(0));
            say("nvml", s.nvmlInit_v2());
        }
        "one_instance" => {
            let dir = std::path::PathBuf::from(std::env::var("LINKDIR").unwrap());
            let a = Sim::load_from(&dir.join("libcuda.so.1"));
            let b = Sim::load_from(&dir.join("libnvidia-ml.so.1"));
            say("same", a.sym("cuInit") == b.sym("cuInit") && a.sym("nvmlInit_v2") == b.sym("nvmlInit_v2"));
            // State is shared: a context made through one handle is seen via the other.
            a.ctx0();
            let (used, _) = b.nvml0();
            say("used", used);
        }
        "pool" => {
            s.ctx0();
            let mut pool = std::ptr::null_mut();
            assert_eq!(s.cuDeviceGetDefaultMemPool(&mut pool, 0), CUDA_SUCCESS);
            let reserved = |s: &Sim| {
                let mut v = 0u64;
                assert_eq!(s.cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &mut v as *mut u64 as *mut c_void), CUDA_SUCCESS);
                v
            };
            let mut st = std::ptr::null_mut();
            assert_eq!(s.cuStreamCreate(&mut st, 0), CUDA_SUCCESS);
            let mut d = 0;
            assert_eq!(s.cuMemAllocAsync(&mut d, MIB as usize, st), CUDA_SUCCESS);
            say("after_alloc", reserved(&s));
            say("nvml_alloc", s.nvml0().0);
            assert_eq!(s.cuMemFreeAsync(d, st), CUDA_SUCCESS);
            say("after_free", reserved(&s));
            assert_eq!(s.cuStreamSynchronize(st), CUDA_SUCCESS);
            say("after_sync", reserved(&s));
            say("nvml_sync", s.nvml0().0);
        }
        "vmm_export" => {
            s.ctx0();
            let prop = exportable_prop();
            let size = 2 * MIB as usize;
            let mut h = 0;
            assert_eq!(s.cuMemCreate(&mut h, size, &prop, 0), CUDA_SUCCESS);
            let mut va = 0;
            assert_eq!(s.cuMemAddressReserve(&mut va, size, 0, 0, 0), CUDA_SUCCESS);
            assert_eq!(s.cuMemMap(va, size, 0, h, 0), CUDA_SUCCESS);
            // Not accessible before cuMemSetAccess: an error, not a fault.
            say("before_access", s.cuMemsetD8_v2(va, 1, 16));
            let desc = CUmemAccessDesc { location: prop.location, flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
            assert_eq!(s.cuMemSetAccess(va, size, &desc, 1), CUDA_SUCCESS);
            assert_eq!(s.cuMemsetD8_v2(va, 0x5A, size), CUDA_SUCCESS);
            let mut fd = -1i32;
            assert_eq!(s.cuMemExportToShareableHandle(&mut fd as *mut i32 as *mut c_void, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), CUDA_SUCCESS);
            say("ready", format!("{} {fd}", std::process::id()));
            wait_parent();
            assert_eq!(s.cuMemUnmap(va, size), CUDA_SUCCESS);
            assert_eq!(s.cuMemRelease(h), CUDA_SUCCESS);
            say("released", s.nvml0().0);
        }
        "vmm_reimport" => {
            s.ctx0();
            let prop = exportable_prop();
            let size = 4 * MIB as usize;
            let (mut h, mut other) = (0, 0);
            assert_eq!(s.cuMemCreate(&mut h, size, &prop, 0), CUDA_SUCCESS);
            // An unrelated allocation with its own memfd: the charge must not move to it.
            assert_eq!(s.cuMemCreate(&mut other, 2 * MIB as usize, &prop, 0), CUDA_SUCCESS);
            let mut fd = -1i32;
            assert_eq!(s.cuMemExportToShareableHandle(&mut fd as *mut i32 as *mut c_void, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), CUDA_SUCCESS);
            let mut imported = 0;
            assert_eq!(s.cuMemImportFromShareableHandle(&mut imported, fd as usize as *mut c_void, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), CUDA_SUCCESS);
            say("imported", s.nvml0().0);
            assert_eq!(s.cuMemRelease(h), CUDA_SUCCESS);
            say("original_released", s.nvml0().0);
            assert_eq!(s.cuMemRelease(imported), CUDA_SUCCESS);
            say("import_released", s.nvml0().0);
            assert_eq!(s.cuMemRelease(other), CUDA_SUCCESS);
            say("all_released", s.nvml0().0);
        }
        "sparse" => {
            s.ctx0();
            let prop = exportable_prop();
            let size = 4 * MIB as usize;
            let desc = CUDA_ARRAY3D_DESCRIPTOR { Width: 256, Height: 64, Depth: 0, Format: CU_AD_FORMAT_FLOAT, NumChannels: 4, Flags: CUDA_ARRAY3D_SPARSE };
            let (mut a, mut plain, mut mip, mut level) = (std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut());
            assert_eq!(s.cuArray3DCreate_v2(&mut a, &desc), CUDA_SUCCESS);
            say("sparse_array", s.nvml0().0);
            assert_eq!(s.cuArray3DCreate_v2(&mut plain, &CUDA_ARRAY3D_DESCRIPTOR { Flags: 0, ..desc }), CUDA_SUCCESS);
            assert_eq!(s.cuMipmappedArrayCreate(&mut mip, &desc, 2), CUDA_SUCCESS);
            assert_eq!(s.cuMipmappedArrayGetLevel(&mut level, mip, 0), CUDA_SUCCESS);
            let (mut h1, mut h2) = (0, 0);
            assert_eq!(s.cuMemCreate(&mut h1, size, &prop, 0), CUDA_SUCCESS);
            assert_eq!(s.cuMemCreate(&mut h2, size, &prop, 0), CUDA_SUCCESS);
            let box_at = |x: u32, w: u32| CUarraySubresource::sparse_level(0, 0, [x, 0, 0], [w, 64, 1]);
            let e = |res: *mut c_void, ty: u32, sub: CUarraySubresource, op: u32, h: u64| CUarrayMapInfo {
                resourceType: ty,
                resource: res,
                subresourceType: CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_SPARSE_LEVEL,
                subresource: sub,
                memOperationType: op,
                memHandleType: CU_MEM_HANDLE_TYPE_GENERIC,
                memHandle: h,
                offset: 0,
                deviceBitMask: 1,
                flags: 0,
                reserved: [0; 2],
            };
            let call = |mut v: Vec<CUarrayMapInfo>| s.cuMemMapArrayAsync(v.as_mut_ptr(), v.len() as u32, std::ptr::null_mut());
            let map = CU_MEM_OPERATION_TYPE_MAP;
            let unmap = CU_MEM_OPERATION_TYPE_UNMAP;
            // Refused: a plain array, a level of a mipmapped array, an unmap
            // naming a handle, no device bit.
            let good = e(a, CU_RESOURCE_TYPE_ARRAY, box_at(0, 64), map, h1);
            let refused = [
                call(vec![good, e(plain, CU_RESOURCE_TYPE_ARRAY, box_at(0, 64), map, h1)]),
                call(vec![good, e(level, CU_RESOURCE_TYPE_ARRAY, box_at(0, 64), map, h1)]),
                call(vec![good, e(a, CU_RESOURCE_TYPE_ARRAY, box_at(0, 64), unmap, h1)]),
                call(vec![CUarrayMapInfo { deviceBitMask: 0, ..good }]),
            ];
            say("refused", format!("{refused:?}"));
            // Both handles mapped (h2 into the mipmapped array too), then released.
            assert_eq!(call(vec![good, e(a, CU_RESOURCE_TYPE_ARRAY, box_at(64, 64), map, h2), e(mip, CU_RESOURCE_TYPE_MIPMAPPED_ARRAY, box_at(0, 64), map, h2)]), CUDA_SUCCESS);
            assert_eq!(s.cuMemRelease(h1), CUDA_SUCCESS);
            assert_eq!(s.cuMemRelease(h2), CUDA_SUCCESS);
            say("released_mapped", s.nvml0().0);
            // Unmapping half of h1's range frees nothing; a box around it frees h1.
            assert_eq!(call(vec![e(a, CU_RESOURCE_TYPE_ARRAY, box_at(0, 32), unmap, 0)]), CUDA_SUCCESS);
            say("half_unmapped", s.nvml0().0);
            assert_eq!(call(vec![e(a, CU_RESOURCE_TYPE_ARRAY, box_at(0, 64), unmap, 0)]), CUDA_SUCCESS);
            say("h1_unmapped", s.nvml0().0);
            // h2 lives while the mipmapped array maps it, after the array is gone.
            assert_eq!(s.cuArrayDestroy(a), CUDA_SUCCESS);
            say("array_destroyed", s.nvml0().0);
            assert_eq!(s.cuMipmappedArrayDestroy(mip), CUDA_SUCCESS);
            say("mipmap_destroyed", s.nvml0().0);
            assert_eq!(s.cuArrayDestroy(plain), CUDA_SUCCESS);
        }
        "vmm_import" => {
            s.ctx0();
            let src = std::env::var("SRC").unwrap();
            let f = std::fs::OpenOptions::new().read(true).write(true).open(&src).unwrap();
            let fd = std::os::fd::IntoRawFd::into_raw_fd(f);
            let mut h = 0;
            assert_eq!(s.cuMemImportFromShareableHandle(&mut h, fd as usize as *mut c_void, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), CUDA_SUCCESS);
            let size = 2 * MIB as usize;
            let mut va = 0;
            assert_eq!(s.cuMemAddressReserve(&mut va, size, 0, 0, 0), CUDA_SUCCESS);
            assert_eq!(s.cuMemMap(va, size, 0, h, 0), CUDA_SUCCESS);
            let desc = CUmemAccessDesc {
                location: CUmemLocation { type_: CU_MEM_LOCATION_TYPE_DEVICE, id: 0 },
                flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            };
            assert_eq!(s.cuMemSetAccess(va, size, &desc, 1), CUDA_SUCCESS);
            let mut b = [0u8; 2];
            assert_eq!(s.cuMemcpyDtoH_v2(b.as_mut_ptr() as *mut c_void, va + size as u64 - 1, 1), CUDA_SUCCESS);
            say("byte", b[0]);
            say("used", s.nvml0().0);
        }
        "bad_pointers" => {
            s.ctx0();
            let mut buf = [0u8; 8];
            say("unknown", s.cuMemcpyDtoH_v2(buf.as_mut_ptr() as *mut c_void, 0xdead_0000, 8));
            let d = s.alloc(4096);
            say("overrun", s.cuMemcpyDtoH_v2(buf.as_mut_ptr() as *mut c_void, d + 4090, 8));
            say("free_twice", format!("{} {}", s.cuMemFree_v2(d), s.cuMemFree_v2(d)));
            let mut total = 0;
            assert_eq!(s.cuDeviceTotalMem_v2(&mut total, 0), CUDA_SUCCESS);
            let mut d2 = 0;
            say("oom", s.cuMemAlloc_v2(&mut d2, total));
        }
        "forker" => {
            s.ctx0();
            s.alloc(64 << 20);
            // SAFETY: the child only calls the simulator and exits with _exit.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                // The child re-attaches with its own slot; the parent's
                // context is not valid here, so it makes its own.
                s.ctx0();
                s.alloc(16 << 20);
                let (_, procs) = s.nvml0();
                say("child", format!("{} {procs:?}", std::process::id()));
                // SAFETY: leave without running the parent's atexit/test code.
                unsafe { libc::_exit(0) };
            }
            let mut status = 0;
            // SAFETY: waiting for our own child.
            assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
            say("status", status);
            // The child's slot is dead now and swept.
            say("after", format!("{:?}", s.nvml0().1));
        }
        "forkidle" => {
            s.ctx0();
            s.alloc(64 << 20);
            // SAFETY: the child calls nothing but pause until it is killed.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                // Never touches the simulator.
                loop {
                    // SAFETY: pause has no preconditions.
                    unsafe { libc::pause() };
                }
            }
            say("ready", pid);
            wait_parent();
        }
        "used" => say("used", s.nvml0().0),
        "capture_modes" => {
            s.ctx0();
            let f = s.func();
            let stream = || {
                let mut st: CUstream = std::ptr::null_mut();
                assert_eq!(s.cuStreamCreate(&mut st, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
                st
            };
            let (cap, other) = (stream(), stream());
            let mut e: CUevent = std::ptr::null_mut();
            assert_eq!(s.cuEventCreate(&mut e, 0), CUDA_SUCCESS);
            assert_eq!(s.cuEventRecord(e, other), CUDA_SUCCESS);
            let status = || {
                let mut st = 9;
                assert_eq!(s.cuStreamIsCapturing(cap, &mut st), CUDA_SUCCESS);
                st
            };
            let end = || {
                let mut g: CUgraph = 1usize as CUgraph;
                let r = s.cuStreamEndCapture(cap, &mut g);
                (r, g as usize)
            };
            let set_mode = |m: u32| {
                let mut m = m;
                assert_eq!(s.cuThreadExchangeStreamCaptureMode(&mut m), CUDA_SUCCESS);
                m
            };
            // The capturing thread's own query, in the default (global) mode.
            assert_eq!(s.cuStreamBeginCapture_v2(cap, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
            say("own_query", s.cuEventQuery(e));
            say("status", status());
            say("launch_into_invalid", s.launch(f, 1024, cap));
            let (r, g) = end();
            say("end_invalid", format!("{r} {g}"));
            say("status_after", status());
            // The same query in the relaxed mode leaves the capture whole.
            assert_eq!(s.cuStreamBeginCapture_v2(cap, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
            say("old_mode", set_mode(CU_STREAM_CAPTURE_MODE_RELAXED));
            say("relaxed_query", s.cuEventQuery(e));
            say("restored", set_mode(CU_STREAM_CAPTURE_MODE_GLOBAL));
            assert_eq!(s.launch(f, 1024, cap), CUDA_SUCCESS);
            let (r, g) = end();
            say("end_relaxed", format!("{r} {}", g != 0));
            // Another thread: a global capture forbids its global-mode
            // queries only; a thread-local capture forbids none of them.
            // Handles cross threads as integers (raw pointers are not Send).
            let (e_h, cap_h) = (e as usize, cap as usize);
            let in_thread = |m: u32| {
                std::thread::scope(|sc| {
                    sc.spawn(|| {
                        s.ctx0();
                        set_mode(m);
                        s.cuEventQuery(e_h as CUevent)
                    })
                    .join()
                    .unwrap()
                })
            };
            assert_eq!(s.cuStreamBeginCapture_v2(cap, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
            say("other_thread_local", in_thread(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
            say("other_intact", status());
            say("other_global", in_thread(CU_STREAM_CAPTURE_MODE_GLOBAL));
            say("end_other", end().0);
            assert_eq!(s.cuStreamBeginCapture_v2(cap, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), CUDA_SUCCESS);
            say("tl_other_global", in_thread(CU_STREAM_CAPTURE_MODE_GLOBAL));
            say("end_tl", end().0);
            // A non-relaxed capture is ended by the thread that began it.
            assert_eq!(s.cuStreamBeginCapture_v2(cap, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
            let wrong = std::thread::scope(|sc| {
                sc.spawn(|| {
                    s.ctx0();
                    let mut g: CUgraph = std::ptr::null_mut();
                    s.cuStreamEndCapture(cap_h as CUstream, &mut g)
                })
                .join()
                .unwrap()
            });
            say("wrong_thread", wrong);
            say("end_right_thread", end().0);
            // Capture into the caller's graph: the end hands that graph back.
            let mut mine: CUgraph = std::ptr::null_mut();
            assert_eq!(s.cuGraphCreate(&mut mine, 0), CUDA_SUCCESS);
            let none = std::ptr::null();
            say("to_unknown_graph", s.cuStreamBeginCaptureToGraph(cap, 0xdead_0000usize as CUgraph, std::ptr::null(), none, 0, 0));
            assert_eq!(s.cuStreamBeginCaptureToGraph(cap, mine, std::ptr::null(), none, 0, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
            say("to_graph_status", status());
            assert_eq!(s.launch(f, 1024, cap), CUDA_SUCCESS);
            let (r, g) = end();
            say("to_graph_end", format!("{r} {}", g == mine as usize));
            // Recapture into it: the same node sequence again succeeds; a
            // second kernel where there was one fails at the end.
            assert_eq!(s.cuStreamBeginRecaptureToGraph(cap, CU_STREAM_CAPTURE_MODE_GLOBAL, mine, std::ptr::null_mut(), std::ptr::null_mut()), CUDA_SUCCESS);
            say("recapture_status", status());
            assert_eq!(s.launch(f, 1024, cap), CUDA_SUCCESS);
            let (r, g) = end();
            say("recapture_same", format!("{r} {}", g == mine as usize));
            assert_eq!(s.cuStreamBeginRecaptureToGraph(cap, CU_STREAM_CAPTURE_MODE_GLOBAL, mine, std::ptr::null_mut(), std::ptr::null_mut()), CUDA_SUCCESS);
            assert_eq!(s.launch(f, 1024, cap), CUDA_SUCCESS);
            assert_eq!(s.launch(f, 1024, cap), CUDA_SUCCESS);
            say("recapture_diverged", end().0);
        }
        other => panic!("unknown role {other}"),
    }
}

fn run(role: &str, env: &[(&str, &str)]) -> Kid {
    spawn("child", role, env)
}

#[test]
fn get_proc_address_follows_the_driver_versions() {
    let dir = tempfile::tempdir().unwrap();
    let st = state_path(&dir);
    let mut k = run("procaddr", &[("EGPU_SIM_STATE", &st)]);
    for key in ["memalloc", "ctxcreate", "self", "ptsz"] {
        assert_eq!(k.expect(key), "true", "{key}");
    }
    assert_eq!(k.expect("unknown"), format!("{CUDA_ERROR_NOT_FOUND} true {CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND}"));
    assert_eq!(k.expect("tooold"), format!("{CUDA_ERROR_NOT_FOUND} true {CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT}"));
    assert_eq!(k.expect("v1"), "true");
    assert_eq!(k.expect("missing"), "[]");
    assert_eq!(k.expect("stub"), CUDA_ERROR_NOT_SUPPORTED.to_string());
    k.finish();
}

#[test]
fn cuda_visible_devices_filters_cuda_but_not_nvml() {
    let dir = tempfile::tempdir().unwrap();
    let st = state_path(&dir);
    let base = [("EGPU_SIM_STATE", st.as_str()), ("EGPU_SIM_GPUS", "4x16GiB")];
    let mut k = run("visible", &[base[0], base[1], ("CUDA_VISIBLE_DEVICES", "2,0,9,1")]);
    assert_eq!(k.expect("init"), "0");
    assert_eq!(k.expect("count"), "2", "parsing stops at the invalid 9");
    assert_eq!(k.expect("uuid15"), "2", "ordinal 0 is physical device 2");
    assert_eq!(k.expect("nvml"), "4");
    k.finish();
    let uuid3 = egpu_core::simspec::sim_uuid(3);
    let mut k = run("visible", &[base[0], base[1], ("CUDA_VISIBLE_DEVICES", &uuid3)]);
    assert_eq!(k.expect("init"), "0");
    assert_eq!(k.expect("count"), "1");
    assert_eq!(k.expect("uuid15"), "3");
    k.finish();
    let mut k = run("visible", &[base[0], base[1], ("CUDA_VISIBLE_DEVICES", "")]);
    assert_eq!(k.expect("init"), CUDA_ERROR_NO_DEVICE.to_string());
    assert_eq!(k.expect("count"), "0");
    k.finish();
}

#[test]
fn a_state_file_of_another_spec_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let st = state_path(&dir);
    let mut k = run("init_only", &[("EGPU_SIM_STATE", &st), ("EGPU_SIM_GPUS", "2x16GiB")]);
    assert_eq!(k.expect("init"), "0");
    k.finish();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["child", "--exact", "--nocapture"])
        .env("SIMTEST_ROLE", "init_only")
        .env("EGPU_SIM_STATE", &st)
        .env("EGPU_SIM_GPUS", "1x80GiB")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stdout.contains(&format!("@init {CUDA_ERROR_NOT_INITIALIZED}")), "{stdout}");
    assert!(stdout.contains(&format!("@nvml {NVML_ERROR_UNKNOWN}")), "{stdout}");
    let msgs: Vec<&str> = stderr.lines().filter(|l| l.starts_with("egpu-simgpu:")).collect();
    assert_eq!(msgs.len(), 1, "one line, once: {stderr}");
    assert!(msgs[0].contains("2x16GiB") && msgs[0].contains("1x80GiB") && msgs[0].contains(&st), "{}", msgs[0]);
}

#[test]
fn link_dir_gives_one_library_for_both_names() {
    let dir = tempfile::tempdir().unwrap();
    let st = state_path(&dir);
    let links = dir.path().join("lib");
    egpu_simgpu::link_dir(&lib_path(), &links).unwrap();
    egpu_simgpu::link_dir(&lib_path(), &links).unwrap(); // idempotent
    for n in egpu_simgpu::LINK_NAMES {
        assert_eq!(std::fs::canonicalize(links.join(n)).unwrap(), std::fs::canonicalize(lib_path()).unwrap());
    }
    let mut k = run("one_instance", &[("EGPU_SIM_STATE", &st), ("LINKDIR", links.to_str().unwrap())]);
    assert_eq!(k.expect("same"), "true");
    assert_eq!(k.expect("used"), (32 * MIB).to_string(), "the context made via libcuda shows in libnvidia-ml");
    k.finish();
}

#[test]
fn pools_charge_their_reservation_until_the_next_sync() {
    let dir = tempfile::tempdir().unwrap();
    let st = state_path(&dir);
    let mut k = run("pool", &[("EGPU_SIM_STATE", &st)]);
    assert_eq!(k.expect("after_alloc"), (32 * MIB).to_string());
    assert_eq!(k.expect("nvml_alloc"), (64 * MIB).to_string(), "context + one 32 MiB chunk");
    assert_eq!(k.expect("after_free"), (32 * MIB).to_string(), "kept until a sync");
    assert_eq!(k.expect("after_sync"), "0", "release threshold 0");
    assert_eq!(k.expect("nvml_sync"), (32 * MIB).to_string());
    k.finish();
}

#[test]
fn vmm_memory_exported_as_fd_is_shared_and_charged_once() {
    let dir = tempfile::tempdir().unwrap();
    let st = state_path(&dir);
    let mut a = run("vmm_export", &[("EGPU_SIM_STATE", &st)]);
    let ready = a.expect("before_access");
    assert_eq!(ready, CUDA_ERROR_INVALID_VALUE.to_string());
    let ready = a.expect("ready");
    let (pid, fd) = ready.split_once(' ').unwrap();
    let src = format!("/proc/{pid}/fd/{fd}");
    let mut b = run("vmm_import", &[("EGPU_SIM_STATE", &st), ("SRC", &src)]);
    assert_eq!(b.expect("byte"), "90", "0x5A written by the exporter");
    assert_eq!(b.expect("used"), (2 * MIB + 2 * 32 * MIB).to_string(), "2 MiB once + two contexts");
    b.finish();
    a.tell("go");
    assert_eq!(a.expect("released"), (32 * MIB).to_string());
    a.finish();
}

/// Sparse arrays are charged nothing; a handle mapped into one lives (and
/// stays charged) after its release until every range mapping it is
/// unmapped or its array destroyed; bad lists are refused whole.
#[test]
fn sparse_array_tiles_keep_their_handles_alive() {
    let dir = tempfile::tempdir().unwrap();
    let st = state_path(&dir);
    let mut k = run("sparse", &[("EGPU_SIM_STATE", &st)]);
    let ctx = 32 * MIB;
    assert_eq!(k.expect("sparse_array"), ctx.to_string(), "a sparse array has no memory of its own");
    let inv = CUDA_ERROR_INVALID_VALUE;
    assert_eq!(k.expect("refused"), format!("[{inv}, {inv}, {inv}, {inv}]"));
    // The plain array is charged 256 x 64 x 16 bytes.
    let plain = 256 * 64 * 16;
    assert_eq!(k.expect("released_mapped"), (ctx + plain + 8 * MIB).to_string());
    assert_eq!(k.expect("half_unmapped"), (ctx + plain + 8 * MIB).to_string());
    assert_eq!(k.expect("h1_unmapped"), (ctx + plain + 4 * MIB).to_string());
    assert_eq!(k.expect("array_destroyed"), (ctx + plain + 4 * MIB).to_string());
    assert_eq!(k.expect("mipmap_destroyed"), (ctx + plain).to_string());
    k.finish();
}

#[test]
fn memory_a_process_holds_through_its_own_reimported_export_stays_counted() {
    let dir = tempfile::tempdir().unwrap();
    let st = state_path(&dir);
    let mut k = run("vmm_reimport", &[("EGPU_SIM_STATE", &st)]);
    let ctx = 32 * MIB;
    assert_eq!(k.expect("imported"), (ctx + 6 * MIB).to_string(), "an import is not charged again");
    assert_eq!(k.expect("original_released"), (ctx + 6 * MIB).to_string(), "the import still holds the 4 MiB");
    assert_eq!(k.expect("import_released"), (ctx + 2 * MIB).to_string());
    assert_eq!(k.expect("all_released"), ctx.to_string());
    k.finish();
}

#[test]
fn bad_pointers_are_errors_not_faults() {
    let dir = tempfile::tempdir().unwrap();
    let st = state_path(&dir);
    let mut k = run("bad_pointers", &[("EGPU_SIM_STATE", &st)]);
    assert_eq!(k.expect("unknown"), CUDA_ERROR_INVALID_VALUE.to_string());
    assert_eq!(k.expect("overrun"), CUDA_ERROR_INVALID_VALUE.to_string());
    assert_eq!(k.expect("free_twice"), format!("0 {CUDA_ERROR_INVALID_VALUE}"));
    assert_eq!(k.expect("oom"), CUDA_ERROR_OUT_OF_MEMORY.to_string(), "the context already uses some");
    k.finish();
}

#[test]
fn a_forked_child_reattaches_with_its_own_pid() {
    let dir = tempfile::tempdir().unwrap();
    let st = state_path(&dir);
    let mut k = run("forker", &[("EGPU_SIM_STATE", &st)]);
    let parent = k.child.id();
    let line = k.expect("child");
    let (cpid, procs) = line.split_once(' ').unwrap();
    let want = format!("{:?}", {
        let mut v = vec![(parent, 64 * MIB + 32 * MIB), (cpid.parse::<u32>().unwrap(), 16 * MIB + 32 * MIB)];
        v.sort();
        v
    });
    assert_eq!(procs, want);
    assert_eq!(k.expect("status"), "0");
    assert_eq!(k.expect("after"), format!("{:?}", vec![(parent, 64 * MIB + 32 * MIB)]));
    k.finish();
}

#[test]
fn a_killed_parents_memory_is_reclaimed_while_its_forked_child_lives() {
    // The child shared the parent's lock description at fork; it closes its
    // reference there, so the parent's death frees the parent's slot.
    let dir = tempfile::tempdir().unwrap();
    let st = state_path(&dir);
    let mut k = run("forkidle", &[("EGPU_SIM_STATE", &st)]);
    let child: i32 = k.expect("ready").parse().unwrap();
    // SAFETY: kill(2) of our own child.
    assert_eq!(unsafe { libc::kill(k.child.id() as i32, libc::SIGKILL) }, 0);
    k.child.wait().unwrap();
    let mut o = run("used", &[("EGPU_SIM_STATE", &st)]);
    let used = o.expect("used");
    o.finish();
    // SAFETY: kill(2) of the orphaned grandchild this test made.
    unsafe { libc::kill(child, libc::SIGKILL) };
    assert_eq!(used, "0", "the dead parent's memory is still charged while its child lives");
}

#[test]
fn stream_capture_refuses_the_calls_its_modes_forbid() {
    let dir = tempfile::tempdir().unwrap();
    let st = state_path(&dir);
    let mut k = run("capture_modes", &[("EGPU_SIM_STATE", &st)]);
    let (unsupported, invalidated) = (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED.to_string(), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    assert_eq!(k.expect("own_query"), unsupported, "a global capture forbids its own thread's event query");
    assert_eq!(k.expect("status"), CU_STREAM_CAPTURE_STATUS_INVALIDATED.to_string());
    assert_eq!(k.expect("launch_into_invalid"), invalidated.to_string());
    assert_eq!(k.expect("end_invalid"), format!("{invalidated} 0"), "an invalidated capture ends with an error and no graph");
    assert_eq!(k.expect("status_after"), CU_STREAM_CAPTURE_STATUS_NONE.to_string());
    assert_eq!(k.expect("old_mode"), CU_STREAM_CAPTURE_MODE_GLOBAL.to_string());
    assert_eq!(k.expect("relaxed_query"), "0", "the relaxed mode may query");
    assert_eq!(k.expect("restored"), CU_STREAM_CAPTURE_MODE_RELAXED.to_string());
    assert_eq!(k.expect("end_relaxed"), "0 true");
    assert_eq!(k.expect("other_thread_local"), "0", "another thread in the thread-local mode may query");
    assert_eq!(k.expect("other_intact"), CU_STREAM_CAPTURE_STATUS_ACTIVE.to_string());
    assert_eq!(k.expect("other_global"), unsupported, "another thread in the global mode may not");
    assert_eq!(k.expect("end_other"), invalidated.to_string());
    assert_eq!(k.expect("tl_other_global"), "0", "a thread-local capture does not bind other threads");
    assert_eq!(k.expect("end_tl"), "0");
    assert_eq!(k.expect("wrong_thread"), CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD.to_string());
    assert_eq!(k.expect("end_right_thread"), "0");
    assert_eq!(k.expect("to_unknown_graph"), CUDA_ERROR_INVALID_VALUE.to_string());
    assert_eq!(k.expect("to_graph_status"), CU_STREAM_CAPTURE_STATUS_ACTIVE.to_string());
    assert_eq!(k.expect("to_graph_end"), "0 true", "a capture into the caller's graph ends with that graph");
    assert_eq!(k.expect("recapture_status"), CU_STREAM_CAPTURE_STATUS_ACTIVE.to_string());
    assert_eq!(k.expect("recapture_same"), "0 true", "a recapture that repeats the graph's nodes ends with that graph");
    assert_eq!(k.expect("recapture_diverged"), CUDA_ERROR_GRAPH_RECAPTURE_FAILURE.to_string());
    k.finish();
}
