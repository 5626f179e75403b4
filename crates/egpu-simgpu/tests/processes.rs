//! Whole-process tests of the simulated GPU: every scenario runs in child
//! processes (this binary re-executed with `SIMTEST_ROLE`), each with its own
//! `EGPU_SIM_STATE`, and synchronises with the parent over pipes.

mod common;

use common::*;
use egpu_cuda::*;
use egpu_simgpu::state::Shared;
use std::ffi::c_void;
use std::sync::atomic::Ordering::SeqCst;

const MIB: u64 = 1 << 20;
const CTX: u64 = 32 * MIB;

fn say(k: &str, v: impl std::fmt::Display) {
    println!("@{k} {v}");
}

/// The child side: runs the role named by `SIMTEST_ROLE`.
#[test]
fn child() {
    let Ok(role) = std::env::var("SIMTEST_ROLE") else { return };
    let s = Sim::load();
    match role.as_str() {
        // Allocate N MiB, report, hold until told, then exit.
        "hold" => {
            s.ctx0();
            let n: usize = std::env::var("MIB").unwrap().parse().unwrap();
            let d = s.alloc(n << 20);
            s.cuMemsetD8_v2(d, 0xAB, 4096);
            let mut h = CUipcMemHandle { reserved: [0; 64] };
            assert_eq!(s.cuIpcGetMemHandle(&mut h, d), CUDA_SUCCESS);
            say("ready", std::process::id());
            say("ipc", h.reserved.iter().map(|&b| format!("{:02x}", b as u8)).collect::<String>());
            wait_parent();
            // After the importer wrote, the exporter sees its bytes.
            let mut buf = [0u8; 16];
            assert_eq!(s.cuMemcpyDtoH_v2(buf.as_mut_ptr() as *mut c_void, d, 16), CUDA_SUCCESS);
            say("bytes", format!("{:02x}{:02x}", buf[0], buf[15]));
            wait_parent();
        }
        // Report NVML's view of device 0.
        "observe" => {
            let (used, procs) = s.nvml0();
            say("used", used);
            say("procs", format!("{procs:?}"));
        }
        // Import an IPC handle, check the bytes, write others, check charges.
        "import" => {
            s.ctx0();
            let hex = std::env::var("HANDLE").unwrap();
            let mut h = CUipcMemHandle { reserved: [0; 64] };
            for i in 0..64 {
                h.reserved[i] = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap() as _;
            }
            let mut d = 0;
            assert_eq!(s.cuIpcOpenMemHandle_v2(&mut d, h, 1), CUDA_SUCCESS);
            let mut buf = [0u8; 4096];
            assert_eq!(s.cuMemcpyDtoH_v2(buf.as_mut_ptr() as *mut c_void, d, 4096), CUDA_SUCCESS);
            say("seen", buf.iter().all(|&b| b == 0xAB));
            assert_eq!(s.cuMemsetD8_v2(d, 0xCD, 16), CUDA_SUCCESS);
            let (used, procs) = s.nvml0();
            say("used", used);
            say("procs", format!("{procs:?}"));
            assert_eq!(s.cuIpcCloseMemHandle(d), CUDA_SUCCESS);
            assert_eq!(s.cuIpcCloseMemHandle(d), CUDA_ERROR_INVALID_VALUE);
        }
        // Queue one long kernel (never synchronised) and hold.
        "long_kernel" => {
            s.ctx0();
            let f = s.func();
            assert_eq!(s.launch(f, 1 << 30, std::ptr::null_mut()), CUDA_SUCCESS);
            say("ready", std::process::id());
            wait_parent();
        }
        // A tiny kernel behind someone else's long one: not done yet.
        "short_kernel" => {
            s.ctx0();
            let f = s.func();
            let (mut e0, mut e1) = (std::ptr::null_mut(), std::ptr::null_mut());
            assert_eq!(s.cuEventCreate(&mut e0, 0), CUDA_SUCCESS);
            assert_eq!(s.cuEventCreate(&mut e1, 0), CUDA_SUCCESS);
            assert_eq!(s.cuEventRecord(e0, std::ptr::null_mut()), CUDA_SUCCESS);
            assert_eq!(s.launch(f, 1024, std::ptr::null_mut()), CUDA_SUCCESS);
            assert_eq!(s.cuEventRecord(e1, std::ptr::null_mut()), CUDA_SUCCESS);
            say("e0", s.cuEventQuery(e0));
            say("e1", s.cuEventQuery(e1));
            let mut ms = 0f32;
            say("elapsed", s.cuEventElapsedTime(&mut ms, e0, e1));
        }
        // Two kernels timed with events in one process.
        "timed" => {
            s.ctx0();
            let f = s.func();
            let mut st = std::ptr::null_mut();
            assert_eq!(s.cuStreamCreate(&mut st, 0), CUDA_SUCCESS);
            let mut ev = [std::ptr::null_mut(); 3];
            for e in &mut ev {
                assert_eq!(s.cuEventCreate(e, 0), CUDA_SUCCESS);
            }
            assert_eq!(s.cuEventRecord(ev[0], st), CUDA_SUCCESS);
            assert_eq!(s.launch(f, 2 << 20, st), CUDA_SUCCESS); // 2 Mi threads x 1 ns
            assert_eq!(s.cuEventRecord(ev[1], st), CUDA_SUCCESS);
            assert_eq!(s.launch(f, 2 << 20, st), CUDA_SUCCESS);
            assert_eq!(s.cuEventRecord(ev[2], st), CUDA_SUCCESS);
            assert_eq!(s.cuEventSynchronize(ev[2]), CUDA_SUCCESS);
            assert_eq!(s.cuEventQuery(ev[2]), CUDA_SUCCESS);
            let (mut a, mut b) = (0f32, 0f32);
            assert_eq!(s.cuEventElapsedTime(&mut a, ev[0], ev[1]), CUDA_SUCCESS);
            assert_eq!(s.cuEventElapsedTime(&mut b, ev[0], ev[2]), CUDA_SUCCESS);
            say("first_ms", a);
            say("both_ms", b);
        }
        other => panic!("unknown role {other}"),
    }
}

fn env<'a>(state: &'a str, extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut v = vec![("EGPU_SIM_STATE", state), ("EGPU_SIM_GPUS", "2x16GiB")];
    v.extend_from_slice(extra);
    v
}

fn attach(state: &str) -> &'static Shared {
    Shared::attach(std::path::Path::new(state), &egpu_simgpu::config::canonical(&"2x16GiB".parse().unwrap()), "2x16GiB", &[16 << 30; 2])
        .unwrap()
}

#[test]
fn two_processes_see_one_device_and_ipc_is_charged_once() {
    let dir = tempfile::tempdir().unwrap();
    let st = state_path(&dir);
    let mut a = spawn("child", "hold", &env(&st, &[("MIB", "100")]));
    let pid_a: u32 = a.expect("ready").parse().unwrap();
    let handle = a.expect("ipc");

    let mut o = spawn("child", "observe", &env(&st, &[]));
    assert_eq!(o.expect("used"), (100 * MIB + CTX).to_string());
    assert_eq!(o.expect("procs"), format!("{:?}", vec![(pid_a, 100 * MIB + CTX)]));
    o.finish();

    let mut b = spawn("child", "import", &env(&st, &[("HANDLE", &handle)]));
    assert_eq!(b.expect("seen"), "true", "the importer sees the exporter's bytes");
    // The importer pays for its context only, not for the imported memory.
    assert_eq!(b.expect("used"), (100 * MIB + 2 * CTX).to_string());
    let procs = b.expect("procs");
    assert!(procs.contains(&format!("({pid_a}, {})", 100 * MIB + CTX)), "{procs}");
    assert!(procs.contains(&format!(", {CTX})")), "{procs}");
    b.finish();

    a.tell("read");
    assert_eq!(a.expect("bytes"), "cdcd", "the exporter sees the importer's write");
    a.tell("exit");
    a.finish();
}

#[test]
fn sigkilled_process_memory_is_reclaimed_by_the_next_sweep() {
    let dir = tempfile::tempdir().unwrap();
    let st = state_path(&dir);
    let mut a = spawn("child", "hold", &env(&st, &[("MIB", "1024")]));
    a.expect("ready");
    assert_eq!(attach(&st).used(0), 1024 * MIB + CTX);
    // SAFETY: kill on our own child's pid.
    assert_eq!(unsafe { libc::kill(a.child.id() as i32, libc::SIGKILL) }, 0);
    a.child.wait().unwrap();
    // The record is still there until someone sweeps...
    assert_eq!(attach(&st).used(0), 1024 * MIB + CTX);
    // ... and an NVML query sweeps it.
    let mut o = spawn("child", "observe", &env(&st, &[]));
    assert_eq!(o.expect("used"), "0");
    assert_eq!(o.expect("procs"), "[]");
    o.finish();
}

#[test]
fn kernels_of_two_processes_are_serialised() {
    let dir = tempfile::tempdir().unwrap();
    let st = state_path(&dir);
    let shm = attach(&st);
    let mut a = spawn("child", "long_kernel", &env(&st, &[("EGPU_SIM_NS_PER_THREAD", "100")]));
    let pid_a: u32 = a.expect("ready").parse().unwrap();
    let long = (1u64 << 30) * 100; // ~107 s of device time, never waited for
    let end_a = shm.devs[0].busy_until.load(SeqCst);
    assert_eq!(shm.devs[0].busy_total.load(SeqCst), long);

    let mut b = spawn("child", "short_kernel", &env(&st, &[("EGPU_SIM_NS_PER_THREAD", "100")]));
    assert_eq!(b.expect("e0"), CUDA_SUCCESS.to_string(), "nothing queued before e0 in this process");
    assert_eq!(b.expect("e1"), CUDA_ERROR_NOT_READY.to_string(), "the tiny kernel waits for the other process's");
    assert_eq!(b.expect("elapsed"), CUDA_ERROR_NOT_READY.to_string());
    b.finish();
    // B's kernel was queued right behind A's: one device, one queue.
    assert_eq!(shm.devs[0].busy_until.load(SeqCst), end_a + 1024 * 100);
    let busy: Vec<u64> = (0..egpu_simgpu::state::MAX_SLOTS)
        .filter(|&i| shm.slot_owner(i).0 == pid_a)
        .map(|i| shm.slots[i].busy[0].load(SeqCst))
        .collect();
    assert_eq!(busy, vec![long], "GPU time is recorded per process");
    a.tell("exit");
    a.finish();
}

#[test]
fn event_times_cover_the_kernels() {
    let dir = tempfile::tempdir().unwrap();
    let st = state_path(&dir);
    let mut a = spawn("child", "timed", &env(&st, &[]));
    let first: f32 = a.expect("first_ms").parse().unwrap();
    let both: f32 = a.expect("both_ms").parse().unwrap();
    a.finish();
    let k = (2u64 << 20) as f32 / 1e6; // ms per kernel
    assert!(first >= k * 0.999, "{first} < {k}");
    assert!(both >= 2.0 * k * 0.999, "{both} < 2 x {k}");
    assert!(both >= first);
}
