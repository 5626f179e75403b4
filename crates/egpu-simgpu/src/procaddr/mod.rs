//! `cuGetProcAddress` with the real driver's symbol/version semantics.
//!
//! The request names a base symbol (`"cuMemAlloc"`), a CUDA version and
//! flags. The answer is the newest ABI variant introduced at or before that
//! version ([`table`], generated from `cudaTypedefs.h`): `cuMemAlloc` gives
//! `cuMemAlloc_v2` from 3020, `cuCtxCreate` gives `_v2`/`_v3`/`_v4` at
//! 3020/11040/12050, `cuGetProcAddress` gives `cuGetProcAddress_v2` for
//! at least 12000, ... With `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`, the
//! `_ptds`/`_ptsz` variant is returned where one exists for that version;
//! `DEFAULT` and `LEGACY_STREAM` return the legacy variant. The pointer is
//! `dlsym` of that ELF name in this library, so it is exactly what `dlsym`
//! on `libcuda.so.1` gives.

mod table;

use crate::cptr::{R, cstr, write, write_opt};
use egpu_cuda::*;
use std::ffi::{CString, c_char, c_void};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PerThread {
    Legacy,
    Ptds,
    Ptsz,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    Found(&'static str),
    NotFound,
    VersionNotSufficient,
}

/// Which ELF symbol answers `symbol` at `version` with `flags`.
pub fn resolve(symbol: &str, version: i32, flags: u64) -> Lookup {
    let rows: Vec<&(&str, u32, PerThread, &str)> = table::TABLE.iter().filter(|r| r.0 == symbol).collect();
    if rows.is_empty() {
        return Lookup::NotFound;
    }
    let v = version.max(0) as u32;
    let best = |pt: fn(PerThread) -> bool| rows.iter().filter(|r| pt(r.2) && r.1 <= v).max_by_key(|r| r.1).map(|r| r.3);
    if flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0
        && let Some(s) = best(|p| p != PerThread::Legacy)
    {
        return Lookup::Found(s);
    }
    match best(|p| p == PerThread::Legacy) {
        Some(s) => Lookup::Found(s),
        None => Lookup::VersionNotSufficient,
    }
}

/// Every ELF name in the table (for tests and the stub list).
pub fn all_symbols() -> impl Iterator<Item = &'static str> {
    table::TABLE.iter().map(|r| r.3)
}

/// `dlsym` in this very library.
fn self_symbol(name: &str) -> Option<*mut c_void> {
    let c = CString::new(name).ok()?;
    // SAFETY: all-zero is a valid Dl_info.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let here = self_symbol as *const () as *const c_void;
    // SAFETY: dladdr reads the address (an address in this library) and
    // fills info; no pointer is retained.
    if unsafe { libc::dladdr(here, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated path owned by the loader;
    // RTLD_NOLOAD only returns (and references) an already-loaded object.
    let h = unsafe { libc::dlopen(info.dli_fname, libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
    if h.is_null() {
        return None;
    }
    // SAFETY: h is a valid handle and c NUL-terminated.
    let p = unsafe { libc::dlsym(h, c.as_ptr()) };
    // SAFETY: drops the reference dlopen took; the library stays loaded
    // because it is the one running this code.
    unsafe { libc::dlclose(h) };
    (!p.is_null()).then_some(p)
}

pub fn get_proc_address(symbol: *const c_char, pfn: *mut *mut c_void, version: i32, flags: u64, status: *mut u32) -> R<()> {
    let name = cstr(symbol)?;
    if pfn.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (ptr, st) = match resolve(&name, version, flags) {
        Lookup::Found(s) => match self_symbol(s) {
            Some(p) => (p, CU_GET_PROC_ADDRESS_SUCCESS),
            None => (std::ptr::null_mut(), CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND),
        },
        Lookup::NotFound => (std::ptr::null_mut(), CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND),
        Lookup::VersionNotSufficient => (std::ptr::null_mut(), CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT),
    };
    write(pfn, ptr)?;
    write_opt(status, st);
    if st == CU_GET_PROC_ADDRESS_SUCCESS { Ok(()) } else { Err(CUDA_ERROR_NOT_FOUND) }
}

#[cfg(test)]
mod tests {
    use super::*;
    const PTDS: u64 = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;

    #[test]
    fn versions() {
        assert_eq!(resolve("cuMemAlloc", 12000, 0), Lookup::Found("cuMemAlloc_v2"));
        assert_eq!(resolve("cuMemAlloc", 3010, 0), Lookup::Found("cuMemAlloc"));
        assert_eq!(resolve("cuCtxCreate", 3020, 0), Lookup::Found("cuCtxCreate_v2"));
        assert_eq!(resolve("cuCtxCreate", 11040, 0), Lookup::Found("cuCtxCreate_v3"));
        assert_eq!(resolve("cuCtxCreate", 12080, 0), Lookup::Found("cuCtxCreate_v4"));
        assert_eq!(resolve("cuGetProcAddress", 11080, 0), Lookup::Found("cuGetProcAddress"));
        assert_eq!(resolve("cuGetProcAddress", 12000, 0), Lookup::Found("cuGetProcAddress_v2"));
        assert_eq!(resolve("cuDevicePrimaryCtxRelease", 11000, 0), Lookup::Found("cuDevicePrimaryCtxRelease_v2"));
        assert_eq!(resolve("cuEventElapsedTime", 12060, 0), Lookup::Found("cuEventElapsedTime"));
        assert_eq!(resolve("cuEventElapsedTime", 12080, 0), Lookup::Found("cuEventElapsedTime_v2"));
        assert_eq!(resolve("cuGraphInstantiate", 12000, 0), Lookup::Found("cuGraphInstantiateWithFlags"));
        assert_eq!(resolve("cuMemAllocAsync", 11000, 0), Lookup::VersionNotSufficient);
        assert_eq!(resolve("cuNoSuchThing", 12000, 0), Lookup::NotFound);
        assert_eq!(resolve("cuMemAlloc_v2", 12000, 0), Lookup::NotFound, "base names only");
    }

    #[test]
    fn per_thread_variants() {
        assert_eq!(resolve("cuLaunchKernel", 12000, PTDS), Lookup::Found("cuLaunchKernel_ptsz"));
        assert_eq!(resolve("cuLaunchKernel", 12000, 0), Lookup::Found("cuLaunchKernel"));
        assert_eq!(resolve("cuLaunchKernel", 12000, CU_GET_PROC_ADDRESS_LEGACY_STREAM), Lookup::Found("cuLaunchKernel"));
        assert_eq!(resolve("cuMemcpyHtoD", 12000, PTDS), Lookup::Found("cuMemcpyHtoD_v2_ptds"));
        assert_eq!(resolve("cuMemcpyHtoD", 6050, PTDS), Lookup::Found("cuMemcpyHtoD_v2"), "no ptds before 7.0");
        assert_eq!(resolve("cuStreamGetCaptureInfo", 12030, PTDS), Lookup::Found("cuStreamGetCaptureInfo_v3_ptsz"));
        // No per-thread variant: the legacy one.
        assert_eq!(resolve("cuMemAlloc", 12000, PTDS), Lookup::Found("cuMemAlloc_v2"));
    }

    #[test]
    fn table_is_consistent() {
        for (b, v, pt, s) in super::table::TABLE {
            assert!(s.starts_with(b), "{s} is a variant of {b}");
            assert!(*v >= 2000, "{b} {v}");
            match pt {
                PerThread::Legacy => assert!(!s.ends_with("_ptds") && !s.ends_with("_ptsz")),
                PerThread::Ptds => assert!(s.ends_with("_ptds")),
                PerThread::Ptsz => assert!(s.ends_with("_ptsz")),
            }
        }
    }
}
