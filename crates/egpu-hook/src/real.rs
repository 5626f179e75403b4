//! Finding the real driver: the real `dlsym`, the real `libcuda.so.1` and
//! `libnvidia-ml.so.1`, and one lazily resolved pointer per real function.
//!
//! Our exported `dlsym` shadows glibc's for the whole process, so the real one
//! is found with `dlvsym(RTLD_NEXT, "dlsym", version)`, which allocates
//! nothing and takes no lock of ours. Every cache here is an atomic or a
//! `once_cell::race` cell, never a `OnceLock`: concurrent or nested first
//! calls just resolve twice, and a child forked while another thread of its
//! parent was resolving does not wait forever for a thread it does not have.

use std::ffi::{CStr, c_char, c_int, c_void};
use once_cell::race::OnceBox;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

/// `dlsym`'s C signature.
pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

static REAL_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// glibc's `name` at the first of `versions` it has (null: none), looked up
/// past `libegpu.so` with `dlvsym(RTLD_NEXT, ...)`: never one of ours.
pub(crate) fn glibc_versioned(name: &CStr, versions: &[&CStr]) -> *mut c_void {
    versions
        .iter()
        // SAFETY: dlvsym with valid NUL-terminated strings; RTLD_NEXT
        // searches the objects loaded after libegpu.so, where libc lives.
        .map(|ver| unsafe { libc::dlvsym(libc::RTLD_NEXT, name.as_ptr(), ver.as_ptr()) })
        .find(|p| !p.is_null())
        .unwrap_or(std::ptr::null_mut())
}

/// The real `dlsym` of glibc (never ours).
pub fn real_dlsym() -> Option<DlsymFn> {
    let mut p = REAL_DLSYM.load(Ordering::Acquire);
    if p.is_null() {
        p = glibc_versioned(c"dlsym", &[c"GLIBC_2.34", c"GLIBC_2.2.5", c"GLIBC_2.17"]);
        if p.is_null() {
            return None;
        }
        REAL_DLSYM.store(p, Ordering::Release);
    }
    // SAFETY: p is glibc's dlsym, whose C signature is DlsymFn.
    Some(unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(p) })
}

/// Calls the real `dlsym(handle, name)`.
pub(crate) fn dlsym_real(handle: *mut c_void, name: &CStr) -> *mut c_void {
    match real_dlsym() {
        // SAFETY: the real dlsym with a handle from dlopen (or a pseudo-handle) and a C string.
        Some(f) => unsafe { f(handle, name.as_ptr()) },
        None => std::ptr::null_mut(),
    }
}

/// Which real library a function lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lib {
    Cuda,
    Nvml,
}

struct Handle(*mut c_void);
// SAFETY: a dlopen handle is a process-wide token; glibc's dl* functions are thread-safe.
unsafe impl Send for Handle {}
// SAFETY: as above.
unsafe impl Sync for Handle {}

static CUDA: OnceBox<Handle> = OnceBox::new();
static NVML: OnceBox<Handle> = OnceBox::new();

fn open(name: &CStr) -> Handle {
    // SAFETY: dlopen with a NUL-terminated soname. This reaches glibc's dlopen
    // through the hook's own export (`crate::dlopen`), which passes these
    // flags through unchanged.
    Handle(unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) })
}

/// The real library's handle, opened on first use (null if it cannot be loaded).
pub fn handle(lib: Lib) -> *mut c_void {
    match lib {
        Lib::Cuda => CUDA.get_or_init(|| Box::new(open(c"libcuda.so.1"))).0,
        Lib::Nvml => NVML.get_or_init(|| Box::new(open(c"libnvidia-ml.so.1"))).0,
    }
}

/// Why the real library could not be loaded, for the fail-closed message.
pub fn load_error(lib: Lib) -> Option<String> {
    if !handle(lib).is_null() {
        return None;
    }
    let name = match lib {
        Lib::Cuda => "libcuda.so.1",
        Lib::Nvml => "libnvidia-ml.so.1",
    };
    Some(format!("cannot load the real driver {name}; is the NVIDIA driver (or the simulated GPU's library directory on LD_LIBRARY_PATH) installed?"))
}

/// Address of `name` in the real library (0 when absent).
pub fn addr(lib: Lib, name: &CStr) -> usize {
    let h = handle(lib);
    if h.is_null() {
        return 0;
    }
    dlsym_real(h, name) as usize
}

/// One real function, resolved on first use from the real library.
pub struct RealFn<F> {
    name: &'static str,
    lib: Lib,
    /// [`UNRESOLVED`], [`ABSENT`], or the address.
    cell: AtomicUsize,
    _f: std::marker::PhantomData<F>,
}

const UNRESOLVED: usize = 0;
/// Resolved, and the real library lacks it (no function lives at address 1).
const ABSENT: usize = 1;

impl<F: Copy> RealFn<F> {
    /// `name` must end with a NUL byte.
    pub const fn new(name: &'static str, lib: Lib) -> Self {
        RealFn { name, lib, cell: AtomicUsize::new(UNRESOLVED), _f: std::marker::PhantomData }
    }

    /// The symbol name without its NUL.
    pub fn name(&self) -> &'static str {
        &self.name[..self.name.len() - 1]
    }

    /// The real function's address, 0 when the real library lacks it.
    pub fn addr(&self) -> usize {
        match self.cell.load(Ordering::Acquire) {
            UNRESOLVED => {
                let a = match CStr::from_bytes_with_nul(self.name.as_bytes()) {
                    Ok(n) => addr(self.lib, n),
                    Err(_) => 0,
                };
                self.cell.store(if a == 0 { ABSENT } else { a }, Ordering::Release);
                a
            }
            ABSENT => 0,
            a => a,
        }
    }

    /// The real function, `None` when the real library lacks it.
    #[inline]
    pub fn get(&self) -> Option<F> {
        const { assert!(size_of::<F>() == size_of::<usize>()) };
        let a = self.addr();
        if a == 0 {
            return None;
        }
        // SAFETY: F is the `unsafe extern "C" fn` type the macros declared for
        // this symbol (same size as a pointer, checked above), and `a` is the
        // address of that very symbol in the real library.
        Some(unsafe { std::mem::transmute_copy::<usize, F>(&a) })
    }
}

/// `dladdr` name of the object containing `p`, for diagnostics.
pub fn object_of(p: usize) -> String {
    // SAFETY: all-zero is a valid Dl_info.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only inspects the address and fills the struct.
    let ok: c_int = unsafe { libc::dladdr(p as *const c_void, &mut info) };
    if ok == 0 || info.dli_fname.is_null() {
        return "?".into();
    }
    // SAFETY: dli_fname is a NUL-terminated string owned by the loader.
    unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned()
}
