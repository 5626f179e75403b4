//! Kernel and graph launches: every entry point is gated against the
//! slice's compute allowance and measured with an event on its stream
//! ([`crate::compute`]). Without an arbiter (period 0) each detour adds one
//! atomic load to the fail-closed check and passes through. Host-function
//! launches are not gated (they use no GPU time).
//!
//! `_ptsz` entry points have their own `ops` functions: stream 0 there means
//! the per-thread default stream, and the completion event must go to the
//! same stream as the launch.

use crate::compute::drv::capture_status;
use super::sig;
use crate::compute;
use crate::detour::Outcome;
use egpu_cuda::{CUDA_LAUNCH_PARAMS, CUfunction, CUgraph, CUgraphExec, CUgraphNode, CUlaunchConfig, CUresult, CUstream};
use std::ffi::{c_int, c_uint, c_void};

/// One gated launch on `stream`: admit (may wait), call the driver, measure.
#[inline(always)]
fn gated(stream: CUstream, ptsz: bool, call: impl FnOnce() -> CUresult) -> Outcome {
    if let Err(e) = crate::state::gate() {
        return Outcome::Error(e);
    }
    match compute::admit(stream, ptsz) {
        Err(e) => Outcome::Error(e),
        Ok(None) => Outcome::Passthrough,
        Ok(Some(t)) => {
            let r = call();
            compute::after(t, r == 0);
            Outcome::from_code(r)
        }
    }
}

macro_rules! kernel {
    ($name:ident, $sig:ident, $ptsz:expr, $alias:literal) => {
        #[doc = concat!("`", $alias, "`.")]
        #[doc(alias = $alias)]
        #[allow(clippy::too_many_arguments)]
        #[inline(always)]
        pub(crate) fn $name(real: sig::$sig, f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void) -> Outcome {
            // SAFETY: the real function with the caller's arguments, unchanged.
            gated(stream, $ptsz, || unsafe { real(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra) })
        }
    };
}
kernel!(launch_kernel, cuLaunchKernel, false, "cuLaunchKernel");
kernel!(launch_kernel_ptsz, cuLaunchKernel_ptsz, true, "cuLaunchKernel_ptsz");

/// The stream of a `CUlaunchConfig` (null config: let the driver refuse it).
fn config_stream(config: *const CUlaunchConfig) -> Option<CUstream> {
    if config.is_null() {
        return None;
    }
    // SAFETY: a non-null config points at a CUlaunchConfig for the call (the driver reads it too).
    Some(unsafe { (*config).hStream })
}

/// `cuLaunchKernelEx`.
#[doc(alias = "cuLaunchKernelEx")]
#[inline(always)]
pub(crate) fn launch_kernel_ex(real: sig::cuLaunchKernelEx, config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void) -> Outcome {
    let Some(stream) = config_stream(config) else { return Outcome::Passthrough };
    // SAFETY: the real function with the caller's arguments.
    gated(stream, false, || unsafe { real(config, f, params, extra) })
}

/// `cuLaunchKernelEx_ptsz`.
#[doc(alias = "cuLaunchKernelEx_ptsz")]
#[inline(always)]
pub(crate) fn launch_kernel_ex_ptsz(real: sig::cuLaunchKernelEx_ptsz, config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void) -> Outcome {
    let Some(stream) = config_stream(config) else { return Outcome::Passthrough };
    // SAFETY: the real function with the caller's arguments.
    gated(stream, true, || unsafe { real(config, f, params, extra) })
}

macro_rules! cooperative {
    ($name:ident, $sig:ident, $ptsz:expr, $alias:literal) => {
        #[doc = concat!("`", $alias, "`.")]
        #[doc(alias = $alias)]
        #[allow(clippy::too_many_arguments)]
        #[inline(always)]
        pub(crate) fn $name(real: sig::$sig, f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, stream: CUstream, params: *mut *mut c_void) -> Outcome {
            // SAFETY: the real function with the caller's arguments, unchanged.
            gated(stream, $ptsz, || unsafe { real(f, gx, gy, gz, bx, by, bz, shmem, stream, params) })
        }
    };
}
cooperative!(launch_cooperative, cuLaunchCooperativeKernel, false, "cuLaunchCooperativeKernel");
cooperative!(launch_cooperative_ptsz, cuLaunchCooperativeKernel_ptsz, true, "cuLaunchCooperativeKernel_ptsz");

/// `cuLaunchCooperativeKernelMultiDevice` (deprecated): one gated launch per
/// device in the list, each admitted in its stream's context.
#[doc(alias = "cuLaunchCooperativeKernelMultiDevice")]
pub(crate) fn launch_cooperative_multi_device(real: sig::cuLaunchCooperativeKernelMultiDevice, list: *mut CUDA_LAUNCH_PARAMS, n: c_uint, flags: c_uint) -> Outcome {
    if let Err(e) = crate::state::gate() {
        return Outcome::Error(e);
    }
    if list.is_null() || n == 0 || n as usize > egpu_abi::MAX_DEVICES {
        return Outcome::Passthrough;
    }
    // SAFETY: the caller passes `n` CUDA_LAUNCH_PARAMS at `list` for the call.
    let params: Vec<CUDA_LAUNCH_PARAMS> = unsafe { std::slice::from_raw_parts(list, n as usize) }.to_vec();
    let mut tickets = Vec::with_capacity(params.len());
    for p in &params {
        match super::ctx::in_stream_ctx(p.hStream, || compute::admit(p.hStream, false)) {
            Ok(Ok(t)) => tickets.push(t),
            Ok(Err(e)) | Err(e) => {
                for t in tickets.into_iter().flatten() {
                    // Taking a launch back makes no driver call: no context needed.
                    compute::after(t, false);
                }
                return Outcome::Error(e);
            }
        }
    }
    // SAFETY: the real function with the caller's arguments.
    let r = unsafe { real(list, n, flags) };
    for (t, p) in tickets.into_iter().zip(&params) {
        if let Some(t) = t
            && super::ctx::in_stream_ctx(p.hStream, || compute::after(t, r == 0)).is_err()
        {
            // The stream's context could not be made current (nothing ran):
            // the launch is taken back unmeasured rather than left counted
            // (and published to the slice's other processes) for ever.
            compute::after(t, false);
        }
    }
    Outcome::from_code(r)
}

/// `cuGraphLaunch`: one gated launch; its event covers the whole graph
/// (graph memory was charged at instantiation).
#[doc(alias = "cuGraphLaunch")]
#[inline(always)]
pub(crate) fn graph_launch(real: sig::cuGraphLaunch, exec: CUgraphExec, stream: CUstream) -> Outcome {
    // SAFETY: the real function with the caller's arguments.
    gated(stream, false, || unsafe { real(exec, stream) })
}

/// `cuGraphLaunch_ptsz`.
#[doc(alias = "cuGraphLaunch_ptsz")]
#[inline(always)]
pub(crate) fn graph_launch_ptsz(real: sig::cuGraphLaunch_ptsz, exec: CUgraphExec, stream: CUstream) -> Outcome {
    // SAFETY: the real function with the caller's arguments.
    gated(stream, true, || unsafe { real(exec, stream) })
}

/// `cuLaunch` (pre-CUDA 4.0, legacy stream).
#[doc(alias = "cuLaunch")]
pub(crate) fn launch_legacy(real: sig::cuLaunch, f: CUfunction) -> Outcome {
    // SAFETY: the real function with the caller's arguments.
    gated(std::ptr::null_mut(), false, || unsafe { real(f) })
}

/// `cuLaunchGrid` (pre-CUDA 4.0, legacy stream).
#[doc(alias = "cuLaunchGrid")]
pub(crate) fn launch_grid(real: sig::cuLaunchGrid, f: CUfunction, w: c_int, h: c_int) -> Outcome {
    // SAFETY: the real function with the caller's arguments.
    gated(std::ptr::null_mut(), false, || unsafe { real(f, w, h) })
}

/// `cuLaunchGridAsync` (pre-CUDA 4.0).
#[doc(alias = "cuLaunchGridAsync")]
pub(crate) fn launch_grid_async(real: sig::cuLaunchGridAsync, f: CUfunction, w: c_int, h: c_int, stream: CUstream) -> Outcome {
    // SAFETY: the real function with the caller's arguments.
    gated(stream, false, || unsafe { real(f, w, h, stream) })
}

/// `cuStreamBeginCapture*`: while a capture runs, the launches on the
/// capturing streams are recorded into a graph instead of running, so the
/// gate steps aside for them (and only them, see [`compute::admit`]). The
/// capture is counted from just before the driver is asked, so another
/// thread's gate calls are already made capture-safe while it begins.
pub(crate) fn begin_capture(begin: impl FnOnce() -> CUresult) -> Outcome {
    compute::capture_starting();
    let r = begin();
    if r != 0 {
        compute::capture_ended(true);
    }
    Outcome::from_code(r)
}

macro_rules! begin_capture {
    ($name:ident, $sig:ident ( $($arg:ident : $ty:ty),* )) => {
        #[doc = concat!("`", stringify!($sig), "`: counted as a capture in progress.")]
        pub(crate) fn $name(real: sig::$sig, $($arg: $ty),*) -> Outcome {
            // SAFETY: the real function with the caller's arguments.
            begin_capture(|| unsafe { real($($arg),*) })
        }
    };
}
begin_capture!(begin_capture_v1, cuStreamBeginCapture(s: CUstream));
begin_capture!(begin_capture_v1_ptsz, cuStreamBeginCapture_ptsz(s: CUstream));
begin_capture!(begin_capture_v2, cuStreamBeginCapture_v2(s: CUstream, mode: c_uint));
begin_capture!(begin_capture_v2_ptsz, cuStreamBeginCapture_v2_ptsz(s: CUstream, mode: c_uint));
begin_capture!(begin_capture_to_graph, cuStreamBeginCaptureToGraph(s: CUstream, graph: CUgraph, deps: *const CUgraphNode, data: *const c_void, n: usize, mode: c_uint));
begin_capture!(begin_capture_to_graph_ptsz, cuStreamBeginCaptureToGraph_ptsz(s: CUstream, graph: CUgraph, deps: *const CUgraphNode, data: *const c_void, n: usize, mode: c_uint));
begin_capture!(begin_recapture_to_graph, cuStreamBeginRecaptureToGraph(s: CUstream, mode: c_uint, graph: CUgraph, callback: *mut c_void, user: *mut c_void));
begin_capture!(begin_recapture_to_graph_ptsz, cuStreamBeginRecaptureToGraph_ptsz(s: CUstream, mode: c_uint, graph: CUgraph, callback: *mut c_void, user: *mut c_void));

/// `cuStreamEndCapture` / `_ptsz`.
#[doc(alias = "cuStreamEndCapture")]
pub(crate) fn end_capture(real: sig::cuStreamEndCapture, s: CUstream, graph: *mut egpu_cuda::CUgraph) -> Outcome {
    end_capture_on(real, s, graph, s)
}

/// `cuStreamEndCapture_ptsz`: a null stream is the calling thread's default stream.
pub(crate) fn end_capture_ptsz(real: sig::cuStreamEndCapture, s: CUstream, graph: *mut egpu_cuda::CUgraph) -> Outcome {
    end_capture_on(real, s, graph, super::per_thread(s))
}

/// Ends the capture on `s`; `asked` is the same stream as `cuStreamIsCapturing` names it.
fn end_capture_on(real: sig::cuStreamEndCapture, s: CUstream, graph: *mut egpu_cuda::CUgraph, asked: CUstream) -> Outcome {
    let before = capture_status(asked as usize);
    // SAFETY: the real function with the caller's arguments.
    let r = unsafe { real(s, graph) };
    // Success and an invalidated capture end it. Another failure may or
    // may not have (a driver that took the capture and then could not write
    // the graph out): the stream says, when it can; else it did not.
    let ended = r == 0
        || r == egpu_cuda::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
        || matches!((before, capture_status(asked as usize)), (Some(was), Some(now)) if was != egpu_cuda::CU_STREAM_CAPTURE_STATUS_NONE && now == egpu_cuda::CU_STREAM_CAPTURE_STATUS_NONE);
    compute::capture_ended(ended);
    Outcome::from_code(r)
}

/// `cuEventSynchronize`: the caller waited; reap the gate's completed events.
#[doc(alias = "cuEventSynchronize")]
pub(crate) fn event_synchronize(real: sig::cuEventSynchronize, e: egpu_cuda::CUevent) -> Outcome {
    // SAFETY: the real function with the caller's argument.
    let r = unsafe { real(e) };
    compute::after_sync();
    Outcome::from_code(r)
}
