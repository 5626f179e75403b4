//! Compute gating of a process with several threads, end to end on the
//! simulated GPU: the test plays `egpud` (see `compute_common`) and re-runs
//! itself under libegpu.so as the workload, a process of two threads.
//!
//! A thread can only reap its own launches (its event rings), so launches
//! another thread left unreaped, because it stopped calling CUDA, must
//! neither stall the launching thread nor let it past its slice's cap. The
//! gate used to tell such a thread to wait for them; it waited a whole
//! period for nothing, then launched past both the queue bound and the
//! allowance: a 50% slice alone on the device ran at 9%, and a 10% slice
//! with 20 ms kernels at 67%.

mod compute_common;

use compute_common::*;
use egpu_core::Priority;
use std::ffi::{CString, c_char, c_int, c_uint, c_void};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Set in the re-run workload: `GRID,SECONDS` of its main thread's kernels.
const WORKER: &str = "EGPU_TEST_THREADS_WORKER";
/// Threads per block of every launch (the simulated GPU times a kernel at
/// `NS_PER_THREAD` per thread: a grid of 160 is a 1 ms kernel).
const BLOCK: u32 = 128;

const PTX: &str = "\
.version 6.0
.target sm_52
.address_size 64

.visible .entry burn(
    .param .u32 burn_iters,
    .param .u64 burn_sink
)
{
    ret;
}
\0";

type R = c_int;

/// The driver calls the workload makes (through the hook).
struct Driver {
    init: unsafe extern "C" fn(c_uint) -> R,
    device_get: unsafe extern "C" fn(*mut c_int, c_int) -> R,
    ctx_create: unsafe extern "C" fn(*mut usize, c_uint, c_int) -> R,
    ctx_set: unsafe extern "C" fn(usize) -> R,
    module_load: unsafe extern "C" fn(*mut usize, *const c_void) -> R,
    module_function: unsafe extern "C" fn(*mut usize, usize, *const c_char) -> R,
    alloc: unsafe extern "C" fn(*mut u64, usize) -> R,
    stream_create: unsafe extern "C" fn(*mut usize, c_uint) -> R,
    stream_sync: unsafe extern "C" fn(usize) -> R,
    #[allow(clippy::type_complexity)]
    launch: unsafe extern "C" fn(usize, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, usize, *mut *mut c_void, *mut *mut c_void) -> R,
}

impl Driver {
    fn load() -> Driver {
        // SAFETY: dlopen of the (simulated) driver and dlsym of documented
        // entry points, each transmuted to its documented signature.
        unsafe {
            let h = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW);
            assert!(!h.is_null(), "dlopen libcuda.so.1");
            let sym = |n: &str| {
                let p = libc::dlsym(h, CString::new(n).unwrap().as_ptr());
                assert!(!p.is_null(), "dlsym {n}");
                p
            };
            Driver {
                init: fn_ptr(sym("cuInit")),
                device_get: fn_ptr(sym("cuDeviceGet")),
                ctx_create: fn_ptr(sym("cuCtxCreate_v2")),
                ctx_set: fn_ptr(sym("cuCtxSetCurrent")),
                module_load: fn_ptr(sym("cuModuleLoadData")),
                module_function: fn_ptr(sym("cuModuleGetFunction")),
                alloc: fn_ptr(sym("cuMemAlloc_v2")),
                stream_create: fn_ptr(sym("cuStreamCreate")),
                stream_sync: fn_ptr(sym("cuStreamSynchronize")),
                launch: fn_ptr(sym("cuLaunchKernel")),
            }
        }
    }
}

/// A symbol's address as the function pointer type `F`.
///
/// # Safety
/// `p` must be a function of signature `F`.
unsafe fn fn_ptr<F: Copy>(p: *mut c_void) -> F {
    assert_eq!(size_of::<F>(), size_of::<*mut c_void>());
    // SAFETY: a function pointer is a pointer-sized address (asserted); the caller vouches for the signature.
    unsafe { std::mem::transmute_copy(&p) }
}

fn ok(r: R, what: &str) {
    assert_eq!(r, 0, "{what} failed: {r}");
}

/// The workload: a second thread launches four 1 ms kernels, lets them
/// finish without a CUDA call and idles (alive, its launches unreaped);
/// then the main thread launches `grid`-block kernels for `secs`,
/// synchronising its stream every four launches. With `GRID,SECONDS,warm`
/// the main thread first runs eight 10 ms kernels to the end, so that the
/// second thread's launches carry an estimate (the first launches of a
/// process have none), and a large one: its queue bound then leaves one
/// launch unreaped, estimated at 10 ms.
fn worker(spec: &str) {
    let mut parts = spec.split(',');
    let (grid, secs): (u32, f64) = (parts.next().unwrap().parse().unwrap(), parts.next().expect("GRID,SECONDS").parse().unwrap());
    let warm = parts.next() == Some("warm");
    let d = Arc::new(Driver::load());
    // SAFETY: documented driver calls with valid out-pointers and a NUL-terminated image.
    let (ctx, f, sink) = unsafe {
        ok((d.init)(0), "cuInit");
        let mut dev = 0;
        ok((d.device_get)(&mut dev, 0), "cuDeviceGet");
        let mut ctx = 0;
        ok((d.ctx_create)(&mut ctx, 0, dev), "cuCtxCreate");
        let mut m = 0;
        ok((d.module_load)(&mut m, PTX.as_ptr().cast()), "cuModuleLoadData");
        let mut f = 0;
        ok((d.module_function)(&mut f, m, c"burn".as_ptr()), "cuModuleGetFunction");
        let mut sink = 0u64;
        ok((d.alloc)(&mut sink, 4), "cuMemAlloc");
        (ctx, f, sink)
    };
    let launch = move |d: &Driver, s: usize, grid: u32| {
        let (mut iters, mut p) = (1u32, sink);
        let mut params = [(&mut iters as *mut u32).cast::<c_void>(), (&mut p as *mut u64).cast::<c_void>()];
        // SAFETY: a loaded function, its two parameters, a stream of this context.
        ok(unsafe { (d.launch)(f, grid, 1, 1, BLOCK, 1, 1, 0, s, params.as_mut_ptr(), std::ptr::null_mut()) }, "cuLaunchKernel");
    };
    if warm {
        let mut s = 0;
        // SAFETY: an out-pointer for the stream; then a stream of this context.
        unsafe { ok((d.stream_create)(&mut s, 1), "cuStreamCreate") };
        for _ in 0..8 {
            launch(&d, s, 1600);
        }
        // SAFETY: as above.
        ok(unsafe { (d.stream_sync)(s) }, "cuStreamSynchronize");
    }
    let (done, ready) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let idle = {
        let (d, done, ready) = (d.clone(), done.clone(), ready.clone());
        std::thread::spawn(move || {
            let mut s = 0;
            // SAFETY: the context made above; an out-pointer for the stream.
            unsafe {
                ok((d.ctx_set)(ctx), "cuCtxSetCurrent");
                ok((d.stream_create)(&mut s, 1), "cuStreamCreate");
            }
            for _ in 0..4 {
                launch(&d, s, 160);
            }
            std::thread::sleep(Duration::from_millis(100));
            ready.store(true, Ordering::SeqCst);
            while !done.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    while !ready.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut s = 0;
    // SAFETY: an out-pointer for the stream.
    unsafe { ok((d.stream_create)(&mut s, 1), "cuStreamCreate") };
    let t0 = Instant::now();
    let mut n = 0u64;
    while t0.elapsed().as_secs_f64() < secs {
        launch(&d, s, grid);
        n += 1;
        if n.is_multiple_of(4) {
            // SAFETY: a stream of this context.
            ok(unsafe { (d.stream_sync)(s) }, "cuStreamSynchronize");
        }
    }
    // SAFETY: as above.
    ok(unsafe { (d.stream_sync)(s) }, "cuStreamSynchronize");
    done.store(true, Ordering::SeqCst);
    idle.join().unwrap();
    eprintln!("main thread: {n} launches in {:.2} s", t0.elapsed().as_secs_f64());
}

/// Starts the workload (`test`, this test re-run with `spec`) in slice `s`.
fn workload(m: &Machine, s: &TestSlice, test: &str, spec: &str) -> Burn {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["--exact", test, "--nocapture"]).env(WORKER, spec);
    let child = m
        .in_slice(&mut c, s)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn the workload");
    s.pids.lock().unwrap().push(child.id());
    Burn { child, host: s.host }
}

/// Runs the workload (`test`, this test re-run) in a slice with `share`/`limit`
/// (%) alone on the device, main-thread kernels of `grid` blocks; returns the
/// fraction of the device it kept busy after a warm-up, in %.
fn two_threads(test: &str, share: u32, limit: u32, grid: u32) -> f64 {
    let m = Machine::new("1x16GiB");
    let s = m.slice("threads", 0, share, limit, Priority::Normal);
    let egpud = Egpud::start(&m, std::slice::from_ref(&s));
    let b = workload(&m, &s, test, &format!("{grid},4"));
    wait_running(&m, &[&b], Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(700));
    let f = (fractions(&m, &[&b], Duration::from_millis(2500))[0] * 1000.0).round() / 10.0;
    let out = b.child.wait_with_output().expect("wait for the workload");
    egpud.stop();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let line = stderr.lines().find(|l| l.starts_with("main thread:")).unwrap_or_else(|| panic!("{stderr}"));
    eprintln!("{share}/{limit}, {:.1} ms kernels beside another thread's unreaped launches -> {f}% ({line})", f64::from(grid * BLOCK) * 50e-6);
    f
}

#[test]
fn another_threads_unreaped_launches_do_not_stall_a_thread() {
    if let Ok(spec) = std::env::var(WORKER) {
        return worker(&spec);
    }
    // 50% share, 100% limit, alone: it may use the whole device (it used 9%).
    let f = two_threads("another_threads_unreaped_launches_do_not_stall_a_thread", 50, 100, 160);
    assert!(f >= 60.0, "a lone 50%/100% slice ran at {f}% beside another thread's unreaped launches");
}

#[test]
fn another_threads_unreaped_launches_do_not_lift_the_cap() {
    if let Ok(spec) = std::env::var(WORKER) {
        return worker(&spec);
    }
    // A 10% cap with 20 ms kernels (it ran at 67%). Kernels longer than the
    // budget overshoot it (see docs/compute-arbiter.md, "Limits"), hence the margin.
    let f = two_threads("another_threads_unreaped_launches_do_not_lift_the_cap", 10, 10, 3125);
    assert!(f <= 25.0, "a 10%-capped slice ran at {f}% beside another thread's unreaped launches");
}

#[test]
fn another_threads_unreaped_launches_do_not_hold_back_the_slices_other_processes() {
    if let Ok(spec) = std::env::var(WORKER) {
        return worker(&spec);
    }
    // The workload (its side thread's launch unreaped, estimated at 10 ms;
    // its main thread launching 1 ms kernels) shares a 30% slice with an
    // egpu-burn. The slice's processes count each other's unfinished work;
    // counted, the side thread's 10 ms (more than the 3 ms budget) would
    // hold the burn back for as long as the main thread keeps the record
    // fresh.
    let m = Machine::new("1x16GiB");
    let s = m.slice("mixed", 0, 30, 30, Priority::Normal);
    let egpud = Egpud::start(&m, std::slice::from_ref(&s));
    let w = workload(&m, &s, "another_threads_unreaped_launches_do_not_hold_back_the_slices_other_processes", "160,4,warm");
    wait_running(&m, &[&w], Duration::from_secs(20));
    let b = m.burn(&s, &["--seconds", "3.5"]);
    wait_running(&m, &[&w, &b], Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(300));
    let f: Vec<f64> = fractions(&m, &[&w, &b], Duration::from_millis(2000)).iter().map(|x| (x * 1000.0).round() / 10.0).collect();
    let out = w.child.wait_with_output().expect("wait for the workload");
    let (code, _, stderr) = b.finish();
    egpud.stop();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(code, 0, "{stderr}");
    eprintln!("30% slice: the two-thread workload {}%, an egpu-burn beside it {}%", f[0], f[1]);
    assert!(f[1] >= 8.0, "the burn got {}% of a 30% slice beside a process with another thread's unreaped launches", f[1]);
    assert!(f[0] + f[1] <= 36.0, "the slice ran at {}% against its 30% cap", f[0] + f[1]);
}
