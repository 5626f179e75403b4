//! `cuInit` (the fail-closed gate) and `cuGetProcAddress(_v2)` (a way in).

use super::sig;
use crate::detour::Outcome;
use crate::procaddr;
use crate::real::Lib;
use crate::util::{cstr, say};
use egpu_cuda::{CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, CUDA_ERROR_NOT_FOUND};
use std::ffi::{c_char, c_int, c_uint, c_void};

/// `cuInit`: refuses when the slice table is unusable, so the real driver
/// stays uninitialised and every other entry point fails as well.
#[doc(alias = "cuInit")]
pub(crate) fn init(_real: sig::cuInit, _flags: c_uint) -> Outcome {
    match crate::state::slice() {
        Ok(_) => Outcome::Passthrough,
        Err(e) => Outcome::Error(e),
    }
}

/// Replaces the pointer the real driver wrote to `*pfn` by our detour of the
/// same function; refuses guarded memory functions we cannot map.
fn fix(symbol: *const c_char, pfn: *mut *mut c_void, status: *mut c_uint) -> Outcome {
    if pfn.is_null() {
        return Outcome::Success;
    }
    // SAFETY: the real driver succeeded and wrote a pointer into the caller's `*pfn`.
    let p = unsafe { *pfn } as usize;
    if p == 0 {
        return Outcome::Success;
    }
    let name = cstr(symbol).unwrap_or("?");
    if procaddr::refuse_unknown(name, p) {
        say(&format!(
            "cuGetProcAddress(\"{name}\") returned {p:#x} in {}, which is not an entry point libegpu knows; refused so that memory cannot escape the slice's limit",
            crate::real::object_of(p)
        ));
        // SAFETY: pfn and status (if non-null) are the caller's out-parameters.
        unsafe {
            *pfn = std::ptr::null_mut();
            if !status.is_null() {
                *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
            }
        }
        return Outcome::Error(CUDA_ERROR_NOT_FOUND);
    }
    let q = procaddr::map_pointer(Lib::Cuda, p);
    crate::util::debug!("cuGetProcAddress({name}) -> {q:#x} (real {p:#x})");
    // SAFETY: as above; we replace it by a function with the identical signature.
    unsafe { *pfn = q as *mut c_void };
    Outcome::Success
}

/// `cuGetProcAddress` (CUDA 11.3+ signature, without the status argument).
#[doc(alias = "cuGetProcAddress")]
pub(crate) fn get_proc_address(real: sig::cuGetProcAddress, symbol: *const c_char, pfn: *mut *mut c_void, ver: c_int, flags: u64) -> Outcome {
    if let Err(e) = crate::state::gate() {
        return Outcome::Error(e);
    }
    // SAFETY: the real function with the caller's arguments.
    let r = unsafe { real(symbol, pfn, ver, flags) };
    if r != 0 {
        return Outcome::Error(r);
    }
    fix(symbol, pfn, std::ptr::null_mut())
}

/// `cuGetProcAddress_v2` (CUDA 12.0+, with `CUdriverProcAddressQueryResult*`).
#[doc(alias = "cuGetProcAddress_v2")]
pub(crate) fn get_proc_address_v2(real: sig::cuGetProcAddress_v2, symbol: *const c_char, pfn: *mut *mut c_void, ver: c_int, flags: u64, status: *mut c_uint) -> Outcome {
    if let Err(e) = crate::state::gate() {
        return Outcome::Error(e);
    }
    // SAFETY: the real function with the caller's arguments.
    let r = unsafe { real(symbol, pfn, ver, flags, status) };
    if r != 0 {
        return Outcome::Error(r);
    }
    fix(symbol, pfn, status)
}
