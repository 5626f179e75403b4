//! The detour machinery: a thread-local re-entry guard, the `Outcome` of a
//! safe `ops` function, the runners that every exported symbol goes through
//! (re-entry check, `catch_unwind`, passthrough), and the `macro_rules!`
//! that generate the exported symbols and their lazily resolved real pointers.

use egpu_cuda::{CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_UNKNOWN, CUDA_SUCCESS, CUresult, NVML_ERROR_FUNCTION_NOT_FOUND, NVML_ERROR_UNKNOWN, NVML_SUCCESS, nvmlReturn_t};
use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::AtomicBool;

/// What an `ops` function decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Done; return success to the caller.
    Success,
    /// Call the real function with the caller's arguments, unchanged.
    Passthrough,
    /// Done; return this status (non-zero) to the caller.
    Error(u32),
}

impl Outcome {
    /// Wraps a status a real function returned.
    pub fn from_code(code: u32) -> Outcome {
        if code == 0 { Outcome::Success } else { Outcome::Error(code) }
    }
}

thread_local! {
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
}

/// Marks this thread as inside the hook. Returns false if it already was
/// (a nested call, e.g. the driver calling one of its own exported symbols).
#[inline]
pub fn enter() -> bool {
    IN_HOOK.with(|g| !g.replace(true))
}

#[inline]
pub fn leave() {
    IN_HOOK.with(|g| g.set(false));
}

/// Whether this thread is inside the hook.
#[inline]
pub fn inside() -> bool {
    IN_HOOK.with(|g| g.get())
}

/// Fork child: the forking thread may have been inside the hook.
pub fn reset_after_fork() {
    leave();
}

static PANICKED: AtomicBool = AtomicBool::new(false);

fn report_panic(what: &str) {
    crate::util::say_once(&PANICKED, || format!("internal error (panic) in {what}; the call failed. Please report this with EGPU_HOOK_DEBUG=1 output."));
}

/// Runs a CUDA detour. `op` is the safe decision; `pass` calls the real
/// function with the caller's arguments. Panics never cross the FFI boundary.
#[inline(always)]
pub fn cuda<F: Copy>(name: &str, real: Option<F>, op: impl FnOnce(F) -> Outcome, pass: impl FnOnce(F) -> CUresult) -> CUresult {
    let Some(f) = real else {
        return CUDA_ERROR_NOT_SUPPORTED;
    };
    if !enter() {
        return pass(f);
    }
    let r = catch_unwind(AssertUnwindSafe(|| match op(f) {
        Outcome::Success => CUDA_SUCCESS,
        Outcome::Error(e) => e,
        Outcome::Passthrough => pass(f),
    }));
    leave();
    r.unwrap_or_else(|_| {
        report_panic(name);
        CUDA_ERROR_UNKNOWN
    })
}

/// Runs an NVML detour (same contract as [`cuda`]).
#[inline(always)]
pub fn nvml<F: Copy>(name: &str, real: Option<F>, op: impl FnOnce(F) -> Outcome, pass: impl FnOnce(F) -> nvmlReturn_t) -> nvmlReturn_t {
    let Some(f) = real else {
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    };
    if !enter() {
        return pass(f);
    }
    let r = catch_unwind(AssertUnwindSafe(|| match op(f) {
        Outcome::Success => NVML_SUCCESS,
        Outcome::Error(e) => e,
        Outcome::Passthrough => pass(f),
    }));
    leave();
    r.unwrap_or_else(|_| {
        report_panic(name);
        NVML_ERROR_UNKNOWN
    })
}

/// One exported hook: its name, the real function's address, ours.
pub struct Hook {
    /// NUL-terminated symbol name.
    pub name: &'static str,
    pub real: fn() -> usize,
    pub hook: fn() -> usize,
}

/// Declares real functions the hook calls but does not intercept:
/// `real_fns! { lib: Cuda; fn cuCtxGetDevice(dev: *mut CUdevice) -> CUresult; }`
/// makes `real::cuCtxGetDevice: RealFn<sig::cuCtxGetDevice>`.
macro_rules! real_fns {
    (lib: $lib:ident; $( fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) -> $ret:ty; )*) => {
        pub mod sig {
            #[allow(unused_imports)]
            use super::*;
            $( #[allow(non_camel_case_types)] pub type $name = unsafe extern "C" fn($($ty),*) -> $ret; )*
        }
        pub mod real {
            $( #[allow(non_upper_case_globals)]
               pub static $name: $crate::real::RealFn<super::sig::$name> =
                   $crate::real::RealFn::new(concat!(stringify!($name), "\0"), $crate::real::Lib::$lib); )*
        }
    };
}
pub(crate) use real_fns;

/// Declares intercepted functions. For each entry
/// `fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) => mem::alloc;`
/// it makes the exported `extern "C"` detour, `sig::cuMemAlloc_v2` (the C
/// signature), `real::cuMemAlloc_v2` (the real pointer, resolved once) and an
/// entry in `HOOKS` used by `dlsym` and `cuGetProcAddress` to map real
/// pointers to ours. The `ops` function gets the real pointer first, then the
/// caller's arguments, and returns an [`Outcome`].
macro_rules! hooks {
    (runner: $runner:ident; ret: $ret:ty; lib: $lib:ident; $( fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) => $op:path; )*) => {
        pub mod sig {
            #[allow(unused_imports)]
            use super::*;
            $( #[allow(non_camel_case_types)] pub type $name = unsafe extern "C" fn($($ty),*) -> $ret; )*
        }
        pub mod hooked {
            $( #[allow(non_upper_case_globals)]
               pub static $name: $crate::real::RealFn<super::sig::$name> =
                   $crate::real::RealFn::new(concat!(stringify!($name), "\0"), $crate::real::Lib::$lib); )*
        }
        $(
            #[doc = concat!("Interposed `", stringify!($name), "`: see the `ops` function it delegates to.\n\n# Safety\n\nCalled from C with the driver's contract for `", stringify!($name), "`.")]
            #[unsafe(no_mangle)]
            #[allow(non_snake_case, clippy::too_many_arguments)]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
                $crate::detour::$runner(
                    stringify!($name),
                    hooked::$name.get(),
                    |f| $op(f, $($arg),*),
                    // SAFETY: the real function with the caller's own arguments, unchanged.
                    |f| unsafe { f($($arg),*) },
                )
            }
        )*
        /// Every function this module intercepts.
        pub static HOOKS: &[$crate::detour::Hook] = &[
            $( $crate::detour::Hook {
                name: concat!(stringify!($name), "\0"),
                real: || hooked::$name.addr(),
                hook: || $name as *const () as usize,
            }, )*
        ];
    };
}
pub(crate) use hooks;
