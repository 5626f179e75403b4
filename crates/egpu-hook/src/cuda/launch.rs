//! Kernel launches: the hot path. Each detour does one atomic load (is the
//! slice attached and healthy?) plus the thread-local re-entry check in the
//! runner, then calls the real function. No system call, no lock. Compute
//! gating (arbiter budgets) plugs in here.

use super::sig;
use crate::detour::Outcome;
use egpu_cuda::{CUfunction, CUgraphExec, CUlaunchConfig, CUstream};
use std::ffi::{c_uint, c_void};

#[inline(always)]
fn gate() -> Outcome {
    match crate::state::gate() {
        Ok(()) => Outcome::Passthrough,
        Err(e) => Outcome::Error(e),
    }
}

/// `cuLaunchKernel` / `_ptsz`.
#[doc(alias = "cuLaunchKernel")]
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) fn launch_kernel(_real: sig::cuLaunchKernel, _f: CUfunction, _gx: c_uint, _gy: c_uint, _gz: c_uint, _bx: c_uint, _by: c_uint, _bz: c_uint, _shmem: c_uint, _stream: CUstream, _params: *mut *mut c_void, _extra: *mut *mut c_void) -> Outcome {
    gate()
}

/// `cuLaunchKernelEx` / `_ptsz`.
#[doc(alias = "cuLaunchKernelEx")]
#[inline(always)]
pub(crate) fn launch_kernel_ex(_real: sig::cuLaunchKernelEx, _config: *const CUlaunchConfig, _f: CUfunction, _params: *mut *mut c_void, _extra: *mut *mut c_void) -> Outcome {
    gate()
}

/// `cuLaunchCooperativeKernel` / `_ptsz`.
#[doc(alias = "cuLaunchCooperativeKernel")]
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) fn launch_cooperative(_real: sig::cuLaunchCooperativeKernel, _f: CUfunction, _gx: c_uint, _gy: c_uint, _gz: c_uint, _bx: c_uint, _by: c_uint, _bz: c_uint, _shmem: c_uint, _stream: CUstream, _params: *mut *mut c_void) -> Outcome {
    gate()
}

/// `cuGraphLaunch` / `_ptsz` (graph memory was charged at instantiation).
#[doc(alias = "cuGraphLaunch")]
#[inline(always)]
pub(crate) fn graph_launch(_real: sig::cuGraphLaunch, _exec: CUgraphExec, _stream: CUstream) -> Outcome {
    gate()
}
