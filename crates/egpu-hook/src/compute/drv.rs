//! The real driver functions the compute gate calls on its own events and
//! streams (never our detours).

use egpu_cuda::*;
use std::ffi::c_uint;

crate::detour::real_fns! {
    lib: Cuda;
    fn cuEventCreate(e: *mut CUevent, flags: c_uint) -> CUresult;
    fn cuEventDestroy_v2(e: CUevent) -> CUresult;
    fn cuEventRecord(e: CUevent, s: CUstream) -> CUresult;
    fn cuEventQuery(e: CUevent) -> CUresult;
    fn cuEventSynchronize(e: CUevent) -> CUresult;
    fn cuEventElapsedTime(ms: *mut f32, a: CUevent, b: CUevent) -> CUresult;
    fn cuStreamIsCapturing(s: CUstream, status: *mut c_uint) -> CUresult;
    fn cuThreadExchangeStreamCaptureMode(mode: *mut c_uint) -> CUresult;
}

/// The capture status of stream `s` (`cuStreamIsCapturing`), if the driver says.
pub fn capture_status(s: usize) -> Option<c_uint> {
    let f = real::cuStreamIsCapturing.get()?;
    let mut st: c_uint = 0;
    // SAFETY: writes one capture status into `st`; a bad handle only returns an error.
    (unsafe { f(s as CUstream, &mut st) } == 0).then_some(st)
}

/// Sets the calling thread's stream capture mode
/// (`cuThreadExchangeStreamCaptureMode`); returns the one it had, if the driver has the call.
pub fn exchange_capture_mode(mode: c_uint) -> Option<c_uint> {
    let f = real::cuThreadExchangeStreamCaptureMode.get()?;
    let mut m = mode;
    // SAFETY: `m` is a valid in/out pointer holding a documented mode.
    (unsafe { f(&mut m) } == 0).then_some(m)
}

/// Creates an event with timing, in the current context.
pub fn create() -> Result<usize, CUresult> {
    let f = real::cuEventCreate.get().ok_or(CUDA_ERROR_NOT_SUPPORTED)?;
    let mut e: CUevent = std::ptr::null_mut();
    // SAFETY: `e` is a valid out-pointer; flags are a documented value.
    let r = unsafe { f(&mut e, CU_EVENT_BLOCKING_SYNC) };
    if r != 0 { Err(r) } else { Ok(e as usize) }
}

pub fn destroy(e: usize) {
    if let Some(f) = real::cuEventDestroy_v2.get() {
        // SAFETY: `e` came from cuEventCreate; a stale handle only returns an error.
        let _ = unsafe { f(e as CUevent) };
    }
}

pub fn record(e: usize, stream: usize) -> CUresult {
    match real::cuEventRecord.get() {
        // SAFETY: our event on the caller's stream (a handle the caller just launched on).
        Some(f) => unsafe { f(e as CUevent, stream as CUstream) },
        None => CUDA_ERROR_NOT_SUPPORTED,
    }
}

pub fn query(e: usize) -> CUresult {
    match real::cuEventQuery.get() {
        // SAFETY: our event; a stale handle only returns an error.
        Some(f) => unsafe { f(e as CUevent) },
        None => CUDA_ERROR_NOT_SUPPORTED,
    }
}

pub fn synchronize(e: usize) -> CUresult {
    match real::cuEventSynchronize.get() {
        // SAFETY: our event; a stale handle only returns an error.
        Some(f) => unsafe { f(e as CUevent) },
        None => CUDA_ERROR_NOT_SUPPORTED,
    }
}

/// GPU time from `a` to `b` (both complete), ns; negative values are 0.
pub fn elapsed_ns(a: usize, b: usize) -> Option<u64> {
    let f = real::cuEventElapsedTime.get()?;
    let mut ms = 0f32;
    // SAFETY: `ms` is a valid out-pointer; both events are ours.
    let r = unsafe { f(&mut ms, a as CUevent, b as CUevent) };
    (r == 0).then(|| (f64::from(ms) * 1e6).max(0.0) as u64)
}
