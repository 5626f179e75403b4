//! The exported `dlsym`, for programs that `dlopen("libcuda.so.1")` and look
//! functions up on the handle (the CUDA runtime does).
//!
//! - It is exported for every glibc symbol version programs bind to on the
//!   supported targets: `dlsym@@GLIBC_2.34` (default) and `dlsym@GLIBC_2.2.5`
//!   (x86_64), or `dlsym@GLIBC_2.17` (aarch64). `build.rs` declares the
//!   version nodes.
//! - The entry is a few instructions of assembly that call [`route`] and then
//!   either return its value or *tail-jump* to glibc's `dlsym`. The jump keeps
//!   the caller's return address, so `dlsym(RTLD_NEXT, ...)` still resolves
//!   relative to the real caller, and names that are not `cu*`/`nvml*` (Rust's
//!   std resolves a few libc symbols this way at run time) never touch any
//!   hook state.
//! - For `cu*`/`nvml*` names, [`route`] calls the real `dlsym` and maps the
//!   pointer it returned to our detour *by address*: if it is the real
//!   library's address of a function we intercept, the caller gets our
//!   detour of exactly that versioned symbol. Nothing is guessed from names.

use crate::real;
use std::ffi::{CStr, c_char, c_void};

/// What the assembly entry does next: return `value`, or jump to `forward`
/// (the real dlsym) with the caller's original arguments.
#[repr(C)]
pub struct Route {
    value: *mut c_void,
    forward: *mut c_void,
}

fn forward() -> Route {
    Route { value: std::ptr::null_mut(), forward: real::real_dlsym().map_or(std::ptr::null_mut(), |f| f as *mut c_void) }
}

/// Decides what `dlsym(handle, name)` returns. Never unwinds.
pub extern "C" fn route(handle: *mut c_void, name: *const c_char) -> Route {
    std::panic::catch_unwind(|| route_inner(handle, name)).unwrap_or_else(|_| forward())
}

fn route_inner(handle: *mut c_void, name: *const c_char) -> Route {
    if name.is_null() || handle == libc::RTLD_NEXT || crate::detour::inside() {
        return forward();
    }
    // SAFETY: dlsym's contract: `name` is a NUL-terminated string.
    let n = unsafe { CStr::from_ptr(name) };
    let b = n.to_bytes();
    let lib = if b.starts_with(b"cu") {
        real::Lib::Cuda
    } else if b.starts_with(b"nvml") {
        real::Lib::Nvml
    } else {
        return forward();
    };
    if !crate::detour::enter() {
        return forward();
    }
    let p = real::dlsym_real(handle, n);
    let value = if p.is_null() { p } else { crate::procaddr::map_pointer(lib, p as usize) as *mut c_void };
    crate::detour::leave();
    crate::util::debug!("dlsym({:?}) -> {:#x} (real {:#x})", n, value as usize, p as usize);
    Route { value, forward: std::ptr::null_mut() }
}

#[cfg(target_arch = "x86_64")]
macro_rules! entry {
    ($name:ident) => {
        /// `dlsym` entry (assembly): calls [`route`], then returns or tail-jumps.
        ///
        /// # Safety
        /// Called from C with `dlsym`'s contract.
        #[unsafe(naked)]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(_handle: *mut c_void, _name: *const c_char) -> *mut c_void {
            core::arch::naked_asm!(
                "push rdi",
                "push rsi",
                "sub rsp, 8",
                "call {route}",
                "add rsp, 8",
                "pop rsi",
                "pop rdi",
                "test rdx, rdx",
                "jnz 2f",
                "ret",
                "2:",
                "jmp rdx",
                route = sym route,
            )
        }
    };
}

#[cfg(target_arch = "aarch64")]
macro_rules! entry {
    ($name:ident) => {
        /// `dlsym` entry (assembly): calls [`route`], then returns or tail-jumps.
        ///
        /// # Safety
        /// Called from C with `dlsym`'s contract.
        #[unsafe(naked)]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(_handle: *mut c_void, _name: *const c_char) -> *mut c_void {
            core::arch::naked_asm!(
                "stp x29, x30, [sp, #-32]!",
                "mov x29, sp",
                "stp x0, x1, [sp, #16]",
                "bl {route}",
                "cbnz x1, 2f",
                "ldp x29, x30, [sp], #32",
                "ret",
                "2:",
                "mov x16, x1",
                "ldp x0, x1, [sp, #16]",
                "ldp x29, x30, [sp], #32",
                "br x16",
                route = sym route,
            )
        }
    };
}

entry!(egpu_dlsym_default);
entry!(egpu_dlsym_compat);

// Bind the entries to the glibc versions. Not in unit-test builds: a test
// executable has no version script defining these nodes.
#[cfg(all(not(test), target_arch = "x86_64"))]
core::arch::global_asm!(".symver egpu_dlsym_default, dlsym@@GLIBC_2.34", ".symver egpu_dlsym_compat, dlsym@GLIBC_2.2.5");
#[cfg(all(not(test), target_arch = "aarch64"))]
core::arch::global_asm!(".symver egpu_dlsym_default, dlsym@@GLIBC_2.34", ".symver egpu_dlsym_compat, dlsym@GLIBC_2.17");
