//! Shared helpers for the whole-process tests: load the built cdylib, run
//! scenarios in child processes (re-executing this test binary with
//! `SIMTEST_ROLE` set), and talk to them over stdin/stdout.
#![allow(dead_code, non_snake_case)]

use egpu_cuda::*;
use std::ffi::{c_char, c_void};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// `target/<profile>/libegpu_simgpu.so`, next to this test's `deps/`.
pub fn lib_path() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let p = dir.join("libegpu_simgpu.so");
    assert!(p.exists(), "{} not built", p.display());
    p
}

pub struct Sim {
    pub lib: libloading::Library,
}

impl Sim {
    pub fn load() -> Sim {
        Self::load_from(&lib_path())
    }
    pub fn load_from(p: &std::path::Path) -> Sim {
        // SAFETY: loading the simulator runs no constructors (it has none).
        Sim { lib: unsafe { libloading::Library::new(p) }.unwrap() }
    }
    pub fn sym(&self, name: &str) -> *mut c_void {
        let c = format!("{name}\0");
        // SAFETY: looking a symbol up does not call it.
        unsafe { self.lib.get::<*mut c_void>(c.as_bytes()).map(|s| *s).unwrap_or(std::ptr::null_mut()) }
    }
}

macro_rules! api {
    ($($name:ident ( $($a:ident : $t:ty),* ) -> $r:ty;)*) => {
        impl Sim { $(
            #[allow(clippy::too_many_arguments)]
            pub fn $name(&self, $($a: $t),*) -> $r {
                let name = concat!(stringify!($name), "\0");
                // SAFETY: the simulator exports this symbol with exactly this C
                // signature, and the tests pass valid pointers.
                unsafe {
                    let f: libloading::Symbol<unsafe extern "C" fn($($t),*) -> $r> = self.lib.get(name.as_bytes()).expect(name);
                    f($($a),*)
                }
            }
        )* }
    };
}

api! {
    cuInit(f: u32) -> CUresult;
    cuDeviceGetCount(c: *mut i32) -> CUresult;
    cuDeviceGetUuid(u: *mut CUuuid, d: i32) -> CUresult;
    cuDeviceTotalMem_v2(b: *mut usize, d: i32) -> CUresult;
    cuDevicePrimaryCtxRetain(c: *mut CUcontext, d: i32) -> CUresult;
    cuCtxSetCurrent(c: CUcontext) -> CUresult;
    cuMemAlloc_v2(d: *mut u64, n: usize) -> CUresult;
    cuMemFree_v2(d: u64) -> CUresult;
    cuMemGetInfo_v2(f: *mut usize, t: *mut usize) -> CUresult;
    cuMemsetD8_v2(d: u64, v: u8, n: usize) -> CUresult;
    cuMemcpyHtoD_v2(d: u64, s: *const c_void, n: usize) -> CUresult;
    cuMemcpyDtoH_v2(d: *mut c_void, s: u64, n: usize) -> CUresult;
    cuIpcGetMemHandle(h: *mut CUipcMemHandle, d: u64) -> CUresult;
    cuIpcOpenMemHandle_v2(d: *mut u64, h: CUipcMemHandle, f: u32) -> CUresult;
    cuIpcCloseMemHandle(d: u64) -> CUresult;
    cuModuleLoadData(m: *mut CUmodule, i: *const c_void) -> CUresult;
    cuModuleGetFunction(f: *mut CUfunction, m: CUmodule, n: *const c_char) -> CUresult;
    cuLaunchKernel(f: CUfunction, gx: u32, gy: u32, gz: u32, bx: u32, by: u32, bz: u32, sm: u32, s: CUstream, p: *mut *mut c_void, e: *mut *mut c_void) -> CUresult;
    cuStreamCreate(s: *mut CUstream, f: u32) -> CUresult;
    cuStreamSynchronize(s: CUstream) -> CUresult;
    cuStreamBeginCapture_v2(s: CUstream, m: u32) -> CUresult;
    cuStreamBeginCaptureToGraph(s: CUstream, g: CUgraph, d: *const CUgraphNode, e: *const c_void, n: usize, m: u32) -> CUresult;
    cuStreamBeginRecaptureToGraph(s: CUstream, m: u32, g: CUgraph, cb: *mut c_void, u: *mut c_void) -> CUresult;
    cuStreamEndCapture(s: CUstream, g: *mut CUgraph) -> CUresult;
    cuStreamIsCapturing(s: CUstream, st: *mut u32) -> CUresult;
    cuThreadExchangeStreamCaptureMode(m: *mut u32) -> CUresult;
    cuGraphCreate(g: *mut CUgraph, f: u32) -> CUresult;
    cuEventCreate(e: *mut CUevent, f: u32) -> CUresult;
    cuEventRecord(e: CUevent, s: CUstream) -> CUresult;
    cuEventQuery(e: CUevent) -> CUresult;
    cuEventSynchronize(e: CUevent) -> CUresult;
    cuEventElapsedTime(ms: *mut f32, a: CUevent, b: CUevent) -> CUresult;
    cuGetProcAddress(s: *const c_char, p: *mut *mut c_void, v: i32, f: u64) -> CUresult;
    cuGetProcAddress_v2(s: *const c_char, p: *mut *mut c_void, v: i32, f: u64, st: *mut u32) -> CUresult;
    cuMemAllocAsync(d: *mut u64, n: usize, s: CUstream) -> CUresult;
    cuMemFreeAsync(d: u64, s: CUstream) -> CUresult;
    cuDeviceGetDefaultMemPool(p: *mut CUmemoryPool, d: i32) -> CUresult;
    cuMemPoolGetAttribute(p: CUmemoryPool, a: u32, v: *mut c_void) -> CUresult;
    cuMemCreate(h: *mut u64, n: usize, p: *const CUmemAllocationProp, f: u64) -> CUresult;
    cuMemRelease(h: u64) -> CUresult;
    cuMemAddressReserve(p: *mut u64, n: usize, a: usize, addr: u64, f: u64) -> CUresult;
    cuMemMap(p: u64, n: usize, o: usize, h: u64, f: u64) -> CUresult;
    cuMemUnmap(p: u64, n: usize) -> CUresult;
    cuMemSetAccess(p: u64, n: usize, d: *const CUmemAccessDesc, c: usize) -> CUresult;
    cuArray3DCreate_v2(a: *mut CUarray, d: *const CUDA_ARRAY3D_DESCRIPTOR) -> CUresult;
    cuArrayDestroy(a: CUarray) -> CUresult;
    cuMipmappedArrayCreate(m: *mut CUmipmappedArray, d: *const CUDA_ARRAY3D_DESCRIPTOR, n: u32) -> CUresult;
    cuMipmappedArrayDestroy(m: CUmipmappedArray) -> CUresult;
    cuMipmappedArrayGetLevel(a: *mut CUarray, m: CUmipmappedArray, l: u32) -> CUresult;
    cuMemMapArrayAsync(m: *mut CUarrayMapInfo, n: u32, s: CUstream) -> CUresult;
    cuMemExportToShareableHandle(o: *mut c_void, h: u64, t: u32, f: u64) -> CUresult;
    cuMemImportFromShareableHandle(h: *mut u64, os: *mut c_void, t: u32) -> CUresult;
    nvmlInit_v2() -> nvmlReturn_t;
    nvmlDeviceGetCount_v2(c: *mut u32) -> nvmlReturn_t;
    nvmlDeviceGetHandleByIndex_v2(i: u32, d: *mut nvmlDevice_t) -> nvmlReturn_t;
    nvmlDeviceGetMemoryInfo(d: nvmlDevice_t, m: *mut nvmlMemory_t) -> nvmlReturn_t;
    nvmlDeviceGetComputeRunningProcesses_v3(d: nvmlDevice_t, c: *mut u32, i: *mut nvmlProcessInfo_t) -> nvmlReturn_t;
    nvmlDeviceGetComputeRunningProcesses(d: nvmlDevice_t, c: *mut u32, i: *mut nvmlProcessInfo_v1_t) -> nvmlReturn_t;
}

impl Sim {
    /// cuInit + primary context of device 0 made current.
    pub fn ctx0(&self) {
        assert_eq!(self.cuInit(0), CUDA_SUCCESS);
        let mut c: CUcontext = std::ptr::null_mut();
        assert_eq!(self.cuDevicePrimaryCtxRetain(&mut c, 0), CUDA_SUCCESS);
        assert_eq!(self.cuCtxSetCurrent(c), CUDA_SUCCESS);
    }

    pub fn alloc(&self, n: usize) -> u64 {
        let mut d = 0;
        assert_eq!(self.cuMemAlloc_v2(&mut d, n), CUDA_SUCCESS);
        d
    }

    pub fn func(&self) -> CUfunction {
        let mut m: CUmodule = std::ptr::null_mut();
        assert_eq!(self.cuModuleLoadData(&mut m, c"fatbin".as_ptr() as *const c_void), CUDA_SUCCESS);
        let mut f: CUfunction = std::ptr::null_mut();
        assert_eq!(self.cuModuleGetFunction(&mut f, m, c"k".as_ptr()), CUDA_SUCCESS);
        f
    }

    /// Launches a kernel of `threads` threads (multiple of 1024) on `s`.
    pub fn launch(&self, f: CUfunction, threads: u32, s: CUstream) -> CUresult {
        let n = std::ptr::null_mut();
        self.cuLaunchKernel(f, threads / 1024, 1, 1, 1024, 1, 1, 0, s, n, n)
    }

    /// (used, list of (pid, bytes)) of device 0 through NVML.
    pub fn nvml0(&self) -> (u64, Vec<(u32, u64)>) {
        assert_eq!(self.nvmlInit_v2(), NVML_SUCCESS);
        let mut d: nvmlDevice_t = std::ptr::null_mut();
        assert_eq!(self.nvmlDeviceGetHandleByIndex_v2(0, &mut d), NVML_SUCCESS);
        let mut m = nvmlMemory_t::default();
        assert_eq!(self.nvmlDeviceGetMemoryInfo(d, &mut m), NVML_SUCCESS);
        let mut n = 0u32;
        let r = self.nvmlDeviceGetComputeRunningProcesses_v3(d, &mut n, std::ptr::null_mut());
        assert!(r == NVML_SUCCESS || r == NVML_ERROR_INSUFFICIENT_SIZE);
        let mut v = vec![nvmlProcessInfo_t::default(); n as usize];
        assert_eq!(self.nvmlDeviceGetComputeRunningProcesses_v3(d, &mut n, v.as_mut_ptr()), NVML_SUCCESS);
        let mut list: Vec<(u32, u64)> = v.iter().map(|p| (p.pid, p.usedGpuMemory)).collect();
        list.sort();
        (m.used, list)
    }
}

/// A child process running role `role` of this test binary.
pub struct Kid {
    pub child: Child,
    pub out: BufReader<ChildStdout>,
    pub stdin: Option<ChildStdin>,
}

impl Kid {
    /// Next `@key value` line from the child (skipping harness output).
    pub fn expect(&mut self, key: &str) -> String {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.out.read_line(&mut line).unwrap();
            assert!(n > 0, "child exited before printing @{key}");
            // libtest may print "test child ... " before the first line.
            let Some(at) = line.find('@') else { continue };
            let tagged = line[at..].trim_end();
            if let Some(rest) = tagged.strip_prefix(&format!("@{key} ")) {
                return rest.trim().to_string();
            }
            panic!("expected @{key}, got {tagged}");
        }
    }

    pub fn tell(&mut self, msg: &str) {
        let s = self.stdin.as_mut().unwrap();
        writeln!(s, "{msg}").unwrap();
        s.flush().unwrap();
    }

    /// Waits for a clean exit.
    pub fn finish(mut self) {
        drop(self.stdin.take());
        let st = self.child.wait().unwrap();
        assert!(st.success(), "child failed: {st:?}");
    }
}

impl Drop for Kid {
    /// A child left behind by a failing assertion is killed, never waited on
    /// forever.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Spawns this test binary as role `role` with extra env vars.
pub fn spawn(test_name: &str, role: &str, env: &[(&str, &str)]) -> Kid {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args([test_name, "--exact", "--nocapture", "--test-threads=1"]).env("SIMTEST_ROLE", role);
    c.env_remove("CUDA_VISIBLE_DEVICES");
    for (k, v) in env {
        c.env(k, v);
    }
    let mut child = c.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    let stdin = child.stdin.take();
    Kid { child, out, stdin }
}

/// Reads one line the parent sent (blocks).
pub fn wait_parent() -> String {
    let mut s = String::new();
    std::io::stdin().read_line(&mut s).unwrap();
    s.trim().to_string()
}

/// A fresh state-file path for one test.
pub fn state_path(dir: &tempfile::TempDir) -> String {
    dir.path().join("state").display().to_string()
}
