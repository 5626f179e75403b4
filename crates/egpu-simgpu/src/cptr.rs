//! Reading and writing through pointers that C callers pass in.
//!
//! Invariant for the whole module: these helpers are only called by the
//! exported entry points with pointers received from the C caller, which the
//! CUDA/NVML API contract requires to be either null or valid for the access
//! (writes of one `T`, or reads of a NUL-terminated string, etc.). Null is
//! checked here and turned into an error; validity beyond that is the
//! caller's side of the contract, exactly as with the real driver.

use egpu_cuda::{CUDA_ERROR_INVALID_VALUE, CUresult};
use std::ffi::{CStr, c_char};

pub type R<T> = Result<T, CUresult>;

/// `*p = v`, or `CUDA_ERROR_INVALID_VALUE` if `p` is null.
pub fn write<T>(p: *mut T, v: T) -> R<()> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null, and valid for a write of T by the module invariant;
    // write_unaligned tolerates callers' unaligned buffers.
    unsafe { p.write_unaligned(v) };
    Ok(())
}

/// `*p = v` if `p` is non-null (optional out-parameters).
pub fn write_opt<T>(p: *mut T, v: T) {
    let _ = write(p, v);
}

/// `*p`, or `CUDA_ERROR_INVALID_VALUE` if `p` is null.
pub fn read<T: Copy>(p: *const T) -> R<T> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null and valid for a read of T by the module invariant.
    Ok(unsafe { p.read_unaligned() })
}

/// The `i`-th element of a caller's array of `T`.
pub fn read_at<T: Copy>(p: *const T, i: usize) -> R<T> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller passed an array of at least i+1 elements (module
    // invariant; every call site bounds i by the count the caller gave).
    Ok(unsafe { p.add(i).read_unaligned() })
}

/// Writes `v` to the `i`-th element of a caller's array.
pub fn write_at<T>(p: *mut T, i: usize, v: T) -> R<()> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: as in read_at, for writes.
    unsafe { p.add(i).write_unaligned(v) };
    Ok(())
}

/// A caller's NUL-terminated string (lossily decoded).
pub fn cstr(p: *const c_char) -> R<String> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null and NUL-terminated by the module invariant.
    Ok(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// Copies `s` NUL-terminated into a caller's buffer of `len` bytes,
/// truncating if needed. Err if null or `len` < 1.
pub fn write_str(buf: *mut c_char, len: usize, s: &str) -> R<()> {
    if buf.is_null() || len == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let n = s.len().min(len - 1);
    // SAFETY: buf is valid for len bytes (module invariant) and n < len.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr() as *const c_char, buf, n);
        *buf.add(n) = 0;
    }
    Ok(())
}

/// Copies `n` bytes from `src` to `dst`; the ranges may overlap. Both must
/// have been validated (device ranges by the allocation registry, host
/// ranges by the caller's contract).
pub fn copy_bytes(dst: u64, src: u64, n: usize) -> R<()> {
    if n == 0 {
        return Ok(());
    }
    if dst == 0 || src == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: both ranges are mapped for n bytes (see above); copy is memmove.
    unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, n) };
    Ok(())
}

/// Fills `count` elements of `elem` bytes at `dst` with `value`'s low bytes.
pub fn fill(dst: u64, value: u32, elem: usize, count: usize) -> R<()> {
    if count == 0 {
        return Ok(());
    }
    if dst == 0 || !dst.is_multiple_of(elem as u64) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: dst is a validated device range of count*elem bytes, aligned
    // for elem (checked above).
    unsafe {
        match elem {
            1 => std::ptr::write_bytes(dst as *mut u8, value as u8, count),
            2 => std::slice::from_raw_parts_mut(dst as *mut u16, count).fill(value as u16),
            _ => std::slice::from_raw_parts_mut(dst as *mut u32, count).fill(value),
        }
    }
    Ok(())
}
