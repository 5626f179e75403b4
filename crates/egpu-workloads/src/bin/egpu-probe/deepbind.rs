//! `egpu-probe deepbind --plugin LIB`: a plugin host that opens LIB with
//! `RTLD_DEEPBIND` (as some plugin hosts, and Python with
//! `sys.setdlopenflags`, do) and calls its
//! `int egpu_plugin_alloc(int ordinal, size_t size, int max, int *last)`,
//! which opens `libcuda.so.1` itself, looks the driver up with its own
//! `dlsym` and allocates up to `max` times. Deep binding resolves the
//! plugin's `dlsym` to glibc's ahead of the hook's.

use crate::Global;
use egpu_workloads::out::emit;
use egpu_workloads::{exit, parse_bytes};
use serde_json::json;
use std::ffi::{CStr, CString, c_int};
use std::os::unix::ffi::OsStrExt;

#[derive(clap::Args)]
pub struct DeepbindArgs {
    /// The plugin (a shared library exporting egpu_plugin_alloc).
    #[arg(long)]
    plugin: std::path::PathBuf,
    /// Bytes per allocation.
    #[arg(long, default_value = "64MiB", value_parser = parse_bytes)]
    size: u64,
    /// At most this many allocations.
    #[arg(long, default_value_t = 64)]
    max: c_int,
}

type PluginAlloc = unsafe extern "C" fn(c_int, usize, c_int, *mut c_int) -> c_int;

fn dl_error() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated message.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        return "unknown".into();
    }
    // SAFETY: non-null: dlerror's NUL-terminated message.
    unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
}

pub fn run(g: &Global, a: DeepbindArgs) -> i32 {
    let Ok(path) = CString::new(a.plugin.as_os_str().as_bytes()) else {
        eprintln!("--plugin: a path without NUL bytes");
        return exit::USAGE;
    };
    // SAFETY: dlopen with a NUL-terminated path.
    let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_DEEPBIND) };
    if h.is_null() {
        emit(json!({"event": "error", "call": "dlopen", "message": dl_error()}));
        return exit::FAILED;
    }
    // SAFETY: dlsym on a live handle with a NUL-terminated name.
    let f = unsafe { libc::dlsym(h, c"egpu_plugin_alloc".as_ptr()) };
    if f.is_null() {
        emit(json!({"event": "error", "call": "dlsym", "message": dl_error()}));
        return exit::FAILED;
    }
    // SAFETY: the plugin's egpu_plugin_alloc has this C signature.
    let f = unsafe { std::mem::transmute::<*mut std::ffi::c_void, PluginAlloc>(f) };
    let mut last: c_int = 0;
    // SAFETY: the plugin's contract: `last` is a valid out-pointer.
    let n = unsafe { f(g.device, a.size as usize, a.max, &mut last) };
    emit(json!({"event": "deepbind", "allocated": n, "bytes": n as u64 * a.size, "last": last}));
    exit::OK
}
