//! The link-time table built by `build.rs` (weak references from this
//! executable to every driver symbol the probe uses).

use std::ffi::{CStr, c_char, c_uint, c_void};

#[repr(C)]
struct Entry {
    name: *const c_char,
    addr: *mut c_void,
}

#[link(name = "probedirect", kind = "static")]
unsafe extern "C" {
    static egpu_probe_direct: [Entry; 0];
    static egpu_probe_direct_len: c_uint;
}

/// (ELF name, address) of every symbol as the dynamic linker bound it.
pub fn table() -> Vec<(String, usize)> {
    // SAFETY: the C table has egpu_probe_direct_len entries of {name, addr},
    // immutable, with NUL-terminated string literals as names.
    unsafe {
        let n = egpu_probe_direct_len as usize;
        let base = std::ptr::addr_of!(egpu_probe_direct) as *const Entry;
        (0..n)
            .map(|i| {
                let e = &*base.add(i);
                (CStr::from_ptr(e.name).to_string_lossy().into_owned(), e.addr as usize)
            })
            .collect()
    }
}
