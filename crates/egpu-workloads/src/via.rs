//! The three ways a program reaches the driver.

use crate::api::{Api, PTSZ, Sym};
use egpu_cuda::CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
use std::ffi::{CString, c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicU32, Ordering};

/// How the probe finds driver functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// Link-time binding (the executable's own references to `cu*`/`nvml*`).
    Direct,
    /// `dlopen("libcuda.so.1")` / `dlopen("libnvidia-ml.so.1")` + `dlsym` on the handle.
    Dlopen,
    /// `cuGetProcAddress_v2` (obtained through itself), like the CUDA runtime.
    Procaddr,
}

impl std::str::FromStr for Via {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "direct" => Ok(Via::Direct),
            "dlopen" => Ok(Via::Dlopen),
            "procaddr" => Ok(Via::Procaddr),
            _ => Err(format!("unknown way '{s}': use direct, dlopen or procaddr")),
        }
    }
}

fn elf_name(s: &Sym, ptds: bool) -> String {
    if ptds && PTSZ.contains(&s.elf) { format!("{}_ptsz", s.elf) } else { s.elf.to_string() }
}

fn open(name: &str) -> *mut c_void {
    let c = CString::new(name).expect("no NUL");
    // SAFETY: dlopen with a NUL-terminated soname.
    unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) }
}

fn sym(h: *mut c_void, name: &str) -> *mut c_void {
    if h.is_null() {
        return std::ptr::null_mut();
    }
    let c = CString::new(name).expect("no NUL");
    // SAFETY: a dlopen handle and a C string. This `dlsym` is whatever the
    // process binds it to: under libegpu.so, the interposer's.
    unsafe { libc::dlsym(h, c.as_ptr()) }
}

static MISSING: AtomicU32 = AtomicU32::new(801);

/// The status reported for a function the chosen way did not provide:
/// `CUDA_ERROR_NOT_SUPPORTED` (801), or the error `cuGetProcAddress` itself
/// returned (e.g. when the interposer refuses the driver).
pub fn missing_code() -> u32 {
    MISSING.load(Ordering::Relaxed)
}

type GetProc = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_uint) -> u32;

fn procaddr(get: GetProc, base: &str, version: i32, flags: u64) -> *mut c_void {
    let c = CString::new(base).expect("no NUL");
    let mut p: *mut c_void = std::ptr::null_mut();
    let mut status: c_uint = 0;
    // SAFETY: cuGetProcAddress_v2's contract: a C string and two out-parameters.
    let r = unsafe { get(c.as_ptr(), &mut p, version, flags, &mut status) };
    if r == 0 {
        p
    } else {
        if r != egpu_cuda::CUDA_ERROR_NOT_FOUND {
            MISSING.store(r, Ordering::Relaxed);
        }
        std::ptr::null_mut()
    }
}

/// Builds the table the chosen way. `direct` is the executable's link-time
/// table (name, address), supplied by the binary that links the driver.
pub fn load(via: Via, ptds: bool, direct: &[(String, usize)]) -> Api {
    match via {
        Via::Direct => Api::load(|s| {
            let n = elf_name(s, ptds);
            direct.iter().find(|(k, _)| *k == n).map_or(std::ptr::null_mut(), |(_, a)| *a as *mut c_void)
        }),
        Via::Dlopen => {
            let (cu, nv) = (open("libcuda.so.1"), open("libnvidia-ml.so.1"));
            Api::load(|s| sym(if s.elf.starts_with("nvml") { nv } else { cu }, &elf_name(s, ptds)))
        }
        Via::Procaddr => {
            let (cu, nv) = (open("libcuda.so.1"), open("libnvidia-ml.so.1"));
            let boot = sym(cu, "cuGetProcAddress_v2");
            if boot.is_null() {
                return Api::load(|s| if s.elf.starts_with("nvml") { sym(nv, s.elf) } else { std::ptr::null_mut() });
            }
            // SAFETY: cuGetProcAddress_v2 has the GetProc signature.
            let boot: GetProc = unsafe { std::mem::transmute::<*mut c_void, GetProc>(boot) };
            // Ask the driver for cuGetProcAddress itself and use what it returns.
            let own = procaddr(boot, "cuGetProcAddress", 12000, 0);
            // SAFETY: at version 12000 the driver returns cuGetProcAddress_v2 (GetProc).
            let get: GetProc = if own.is_null() { boot } else { unsafe { std::mem::transmute::<*mut c_void, GetProc>(own) } };
            let flags = if ptds { CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM } else { 0 };
            Api::load(|s| if s.elf.starts_with("nvml") { sym(nv, s.elf) } else { procaddr(get, s.base, s.version, flags) })
        }
    }
}
