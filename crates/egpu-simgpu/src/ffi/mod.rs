//! The exported C symbols: one line per entry point, each mapping the ELF
//! name to a safe function in [`crate::ops`] / [`crate::nvml`]. Every entry
//! point catches panics (a panic never crosses FFI: it becomes
//! `CUDA_ERROR_UNKNOWN` / `NVML_ERROR_UNKNOWN`).

use egpu_cuda::{CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_UNKNOWN, CUDA_SUCCESS, CUresult, NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_UNKNOWN, NVML_SUCCESS, nvmlReturn_t};
use std::panic::{AssertUnwindSafe, catch_unwind};

pub(crate) fn guard(f: impl FnOnce() -> Result<(), CUresult>) -> CUresult {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => CUDA_SUCCESS,
        Ok(Err(e)) => e,
        Err(_) => CUDA_ERROR_UNKNOWN,
    }
}

pub(crate) fn guard_nvml(f: impl FnOnce() -> Result<(), nvmlReturn_t>) -> nvmlReturn_t {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => NVML_SUCCESS,
        Ok(Err(e)) => e,
        Err(_) => NVML_ERROR_UNKNOWN,
    }
}

pub(crate) fn unimplemented(name: &str) -> CUresult {
    guard(|| {
        crate::rt::log_unimplemented(name);
        Err(CUDA_ERROR_NOT_SUPPORTED)
    })
}

pub(crate) fn unimplemented_nvml(name: &str) -> nvmlReturn_t {
    guard_nvml(|| {
        crate::rt::log_unimplemented(name);
        Err(NVML_ERROR_NOT_SUPPORTED)
    })
}

/// `name(args) => body;` exports `extern "C" fn name(args) -> CUresult`
/// evaluating `body: Result<(), CUresult>` under [`guard`].
macro_rules! cu_exports {
    ($( $name:ident ( $($a:ident : $t:ty),* $(,)? ) => $body:expr ; )*) => {$(
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments, non_snake_case, unused_variables)]
        pub extern "C" fn $name($($a: $t),*) -> egpu_cuda::CUresult {
            crate::ffi::guard(|| $body)
        }
    )*};
}

/// Like [`cu_exports`] for NVML (`nvmlReturn_t`).
macro_rules! nvml_exports {
    ($( $name:ident ( $($a:ident : $t:ty),* $(,)? ) => $body:expr ; )*) => {$(
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments, non_snake_case, unused_variables)]
        pub extern "C" fn $name($($a: $t),*) -> egpu_cuda::nvmlReturn_t {
            crate::ffi::guard_nvml(|| $body)
        }
    )*};
}

/// Entry points that exist in the real library but are not simulated: they
/// take no arguments here (the C ABI lets a callee ignore its arguments),
/// log once and return `CUDA_ERROR_NOT_SUPPORTED`.
macro_rules! cu_stubs {
    ($($name:ident),* $(,)?) => {$(
        #[unsafe(no_mangle)]
        #[allow(non_snake_case)]
        pub extern "C" fn $name() -> egpu_cuda::CUresult {
            crate::ffi::unimplemented(stringify!($name))
        }
    )*};
}

macro_rules! nvml_stubs {
    ($($name:ident),* $(,)?) => {$(
        #[unsafe(no_mangle)]
        #[allow(non_snake_case)]
        pub extern "C" fn $name() -> egpu_cuda::nvmlReturn_t {
            crate::ffi::unimplemented_nvml(stringify!($name))
        }
    )*};
}

pub(crate) use cu_stubs;

mod cuda;
mod nvml;
mod stubs;
