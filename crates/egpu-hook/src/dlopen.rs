//! The exported `dlopen`, which drops `RTLD_DEEPBIND`.
//!
//! A library opened with `RTLD_DEEPBIND` looks its symbols up in itself and
//! its own dependencies before the global scope, where `libegpu.so` sits
//! (first, through `LD_PRELOAD`). Its `dlsym` then binds to glibc's and its
//! `cu*` references to the driver's, past the hook: a deep-bound plugin
//! that opens `libcuda.so.1` itself made 2 GiB of allocations in a 512 MiB
//! slice on the simulated GPU. So the flag is cleared, and the process is
//! told once on stderr. `EGPU_KEEP_DEEPBIND=1` keeps it: the program's
//! choice of symbol resolution, at the price of the slice's limits in such
//! libraries.
//!
//! - It is exported for every glibc symbol version programs bind to, as
//!   [`crate::dlsym`] is: `dlopen@@GLIBC_2.34` (default) and
//!   `dlopen@GLIBC_2.2.5` (x86_64) or `dlopen@GLIBC_2.17` (aarch64).
//! - The entry is a few instructions of assembly that call [`route`] for
//!   the flags and glibc's `dlopen` of the same version, then *tail-jump*
//!   to it with the caller's file and the new flags. The jump keeps the
//!   caller's return address, which glibc uses to find the caller's
//!   `$ORIGIN`, RUNPATH and namespace.

use crate::real::real_dlsym;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, Ordering};

/// What the assembly entry does next: jump to `forward` (glibc's `dlopen`)
/// with the caller's file and `flags`; a null `forward` (glibc's could not
/// be found) returns null.
#[repr(C)]
pub struct Route {
    flags: u64,
    forward: *mut c_void,
}

/// `EGPU_KEEP_DEEPBIND` set (non-empty, not 0): leave the flag alone.
fn keep() -> bool {
    static STATE: AtomicU8 = AtomicU8::new(0);
    crate::util::env_flag(&STATE, "EGPU_KEEP_DEEPBIND")
}

/// The flags `dlopen(file, flags)` goes on with.
pub fn flags_for(flags: c_int, keep: bool) -> c_int {
    if keep { flags } else { flags & !libc::RTLD_DEEPBIND }
}

static REAL_DEFAULT: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static REAL_COMPAT: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

#[cfg(target_arch = "x86_64")]
const COMPAT: &CStr = c"GLIBC_2.2.5";
#[cfg(target_arch = "aarch64")]
const COMPAT: &CStr = c"GLIBC_2.17";

/// glibc's `dlopen` of the entry's version (`default`: `GLIBC_2.34`), else
/// of the other one, else whatever `dlsym(RTLD_NEXT, "dlopen")` finds
/// (glibc before 2.34 has it in libdl only at the compat version).
fn real_dlopen(default: bool) -> *mut c_void {
    let cache = if default { &REAL_DEFAULT } else { &REAL_COMPAT };
    let mut p = cache.load(Ordering::Acquire);
    if p.is_null() {
        let order = if default { [c"GLIBC_2.34", COMPAT] } else { [COMPAT, c"GLIBC_2.34"] };
        p = crate::real::glibc_versioned(c"dlopen", &order);
        if p.is_null() {
            // SAFETY: glibc's dlsym with a pseudo-handle and a C string.
            p = real_dlsym().map_or(std::ptr::null_mut(), |f| unsafe { f(libc::RTLD_NEXT, c"dlopen".as_ptr()) });
        }
        cache.store(p, Ordering::Release);
    }
    p
}

fn route(file: *const c_char, flags: c_int, default: bool) -> Route {
    let forward = real_dlopen(default);
    let out = std::panic::catch_unwind(|| {
        let keep = flags & libc::RTLD_DEEPBIND == 0 || keep();
        if !keep {
            static TOLD: AtomicBool = AtomicBool::new(false);
            crate::util::say_once(&TOLD, || {
                let name = if file.is_null() {
                    "the program".into()
                } else {
                    // SAFETY: dlopen's contract: a NUL-terminated string (null checked).
                    unsafe { CStr::from_ptr(file) }.to_string_lossy().into_owned()
                };
                format!("dlopen({name}) asked for RTLD_DEEPBIND, which would take the libraries it opens out of the slice's limits: opened without it (EGPU_KEEP_DEEPBIND=1 keeps it); said once")
            });
        }
        flags_for(flags, keep)
    })
    .unwrap_or(flags);
    Route { flags: out as u32 as u64, forward }
}

/// [`route`] for the default-version entry.
pub extern "C" fn route_default(file: *const c_char, flags: c_int) -> Route {
    route(file, flags, true)
}

/// [`route`] for the compat-version entry.
pub extern "C" fn route_compat(file: *const c_char, flags: c_int) -> Route {
    route(file, flags, false)
}

#[cfg(target_arch = "x86_64")]
macro_rules! entry {
    ($name:ident, $route:ident) => {
        /// `dlopen` entry (assembly): calls its route, then tail-jumps to glibc's
        /// `dlopen` with the new flags.
        ///
        /// # Safety
        /// Called from C with `dlopen`'s contract.
        #[unsafe(naked)]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(_file: *const c_char, _flags: c_int) -> *mut c_void {
            core::arch::naked_asm!(
                "push rdi",
                "push rsi",
                "sub rsp, 8",
                "call {route}",
                "add rsp, 8",
                "pop rsi",
                "pop rdi",
                "mov esi, eax",
                "test rdx, rdx",
                "jz 2f",
                "jmp rdx",
                "2:",
                "xor eax, eax",
                "ret",
                route = sym $route,
            )
        }
    };
}

#[cfg(target_arch = "aarch64")]
macro_rules! entry {
    ($name:ident, $route:ident) => {
        /// `dlopen` entry (assembly): calls its route, then tail-jumps to glibc's
        /// `dlopen` with the new flags.
        ///
        /// # Safety
        /// Called from C with `dlopen`'s contract.
        #[unsafe(naked)]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(_file: *const c_char, _flags: c_int) -> *mut c_void {
            core::arch::naked_asm!(
                "stp x29, x30, [sp, #-32]!",
                "mov x29, sp",
                "stp x0, x1, [sp, #16]",
                "bl {route}",
                "mov x16, x1",
                "mov w17, w0",
                "ldp x0, x1, [sp, #16]",
                "mov w1, w17",
                "ldp x29, x30, [sp], #32",
                "cbz x16, 2f",
                "br x16",
                "2:",
                "mov x0, #0",
                "ret",
                route = sym $route,
            )
        }
    };
}

entry!(egpu_dlopen_default, route_default);
entry!(egpu_dlopen_compat, route_compat);

// Bind the entries to the glibc versions (not in unit-test builds: see dlsym.rs).
#[cfg(all(not(test), target_arch = "x86_64"))]
core::arch::global_asm!(".symver egpu_dlopen_default, dlopen@@GLIBC_2.34", ".symver egpu_dlopen_compat, dlopen@GLIBC_2.2.5");
#[cfg(all(not(test), target_arch = "aarch64"))]
core::arch::global_asm!(".symver egpu_dlopen_default, dlopen@@GLIBC_2.34", ".symver egpu_dlopen_compat, dlopen@GLIBC_2.17");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deepbind_is_dropped_unless_kept() {
        let f = libc::RTLD_NOW | libc::RTLD_DEEPBIND | libc::RTLD_LOCAL;
        assert_eq!(flags_for(f, false), libc::RTLD_NOW | libc::RTLD_LOCAL);
        assert_eq!(flags_for(f, true), f);
        assert_eq!(flags_for(libc::RTLD_LAZY, false), libc::RTLD_LAZY);
    }
}
