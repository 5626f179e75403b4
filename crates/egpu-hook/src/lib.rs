//! `libegpu.so`: the eGPU data plane. Preloaded into every workload process,
//! it intercepts the CUDA driver API and NVML and enforces its slice's
//! memory limits.
//!
//! Contract (details in `docs/hook.md`, threat model in `docs/threat-model.md`):
//!
//! - **Ways in.** Exported versioned `cu*`/`nvml*` symbols (direct binding
//!   under `LD_PRELOAD`); an exported `dlsym` for every glibc version
//!   ([`dlsym`]); and `cuGetProcAddress(_v2)` ([`cuda::init`]). Real pointers
//!   are mapped to detours by address ([`procaddr`]), never by guessed
//!   version suffixes. The real driver is `dlopen("libcuda.so.1")` /
//!   `libnvidia-ml.so.1` ([`real`]).
//! - **Memory.** Every allocation family is charged to the slice's usage
//!   table before the real allocation, per slice device, and uncharged on
//!   free ([`cuda`], [`ledger`], [`state`]). Imported and host memory is
//!   never charged. An allocation past the limit returns
//!   `CUDA_ERROR_OUT_OF_MEMORY`; the process stays healthy. A lowered limit
//!   kills nothing. `cuMemGetInfo`/`cuDeviceTotalMem` and NVML report the
//!   slice's view ([`nvml`]).
//! - **Fail closed.** No usable slice table → every intercepted CUDA call
//!   returns `CUDA_ERROR_NOT_INITIALIZED` (NVML: `NVML_ERROR_UNINITIALIZED`)
//!   with one line on stderr.
//! - **Robustness.** Lazy init on the first intercepted call, no thread, no
//!   constructor; `catch_unwind` in every export; a thread-local re-entry
//!   guard; fork children re-initialise. After a process's first launch
//!   (which claims its usage record and creates events) the launch path
//!   makes no system call and takes no lock.

pub mod compute;
pub mod cuda;
pub mod detour;
pub mod devmap;
pub mod dlopen;
pub mod dlsym;
pub mod ledger;
pub mod nvml;
pub mod procaddr;
pub mod real;
pub mod state;
pub mod util;
