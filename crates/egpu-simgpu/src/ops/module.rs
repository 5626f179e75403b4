//! Modules, libraries, functions and kernels: any image is accepted, a
//! function is just a name. Module globals are 256-byte zeroed, uncharged
//! device allocations, one per name.

use crate::cptr::{R, cstr, read, write, write_opt};
use crate::ops::memory;
use crate::rt::{Func, Inner, Kind, Module, cu, new_handle};
use egpu_cuda::*;
use std::collections::HashMap;
use std::ffi::{CString, c_char, c_void};

pub const GLOBAL_BYTES: u64 = 256;

fn load(out: *mut CUmodule, image: *const c_void) -> R<()> {
    let p = cu()?;
    if out.is_null() || image.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut g = p.lock();
    crate::ops::context::current(&g)?;
    let h = new_handle();
    g.modules.insert(h, Module::default());
    write(out, h as CUmodule)
}

pub fn load_data(out: *mut CUmodule, image: *const c_void) -> R<()> {
    load(out, image)
}

pub fn load_file(out: *mut CUmodule, fname: *const c_char) -> R<()> {
    let path = cstr(fname)?;
    if !std::path::Path::new(&path).is_file() {
        return Err(CUDA_ERROR_FILE_NOT_FOUND);
    }
    load(out, fname as *const c_void)
}

pub fn unload(m: CUmodule) -> R<()> {
    let p = cu()?;
    let mut g = p.lock();
    let m = g.modules.remove(&(m as u64)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    for f in m.funcs.values() {
        g.funcs.remove(f);
    }
    for &(d, _) in m.globals.values() {
        let _ = memory::free_locked(p, &mut g, d);
    }
    Ok(())
}

fn new_func(g: &mut Inner, name: &str) -> u64 {
    let h = new_handle();
    g.funcs.insert(h, Func { name: CString::new(name).unwrap_or_default(), attrs: HashMap::new() });
    h
}

pub fn get_function(out: *mut CUfunction, m: CUmodule, name: *const c_char) -> R<()> {
    let p = cu()?;
    let name = cstr(name)?;
    let mut g = p.lock();
    if !g.modules.contains_key(&(m as u64)) {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    let existing = g.modules[&(m as u64)].funcs.get(&name).copied();
    let f = match existing {
        Some(f) => f,
        None => {
            let f = new_func(&mut g, &name);
            g.modules.get_mut(&(m as u64)).ok_or(CUDA_ERROR_INVALID_HANDLE)?.funcs.insert(name, f);
            f
        }
    };
    write(out, f as CUfunction)
}

pub fn get_global(dptr: *mut CUdeviceptr, bytes: *mut usize, m: CUmodule, name: *const c_char) -> R<()> {
    let p = cu()?;
    let name = cstr(name)?;
    let mut g = p.lock();
    if !g.modules.contains_key(&(m as u64)) {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    let existing = g.modules[&(m as u64)].globals.get(&name).copied();
    let (d, n) = match existing {
        Some(x) => x,
        None => {
            let d = memory::alloc_arena(p, &mut g, GLOBAL_BYTES, Kind::ModuleGlobal, 0)?;
            g.modules.get_mut(&(m as u64)).ok_or(CUDA_ERROR_INVALID_HANDLE)?.globals.insert(name, (d, GLOBAL_BYTES));
            (d, GLOBAL_BYTES)
        }
    };
    write_opt(dptr, d);
    write_opt(bytes, n as usize);
    Ok(())
}

pub fn library_load(out: *mut CUlibrary, code: *const c_void) -> R<()> {
    let p = cu()?;
    if out.is_null() || code.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let h = new_handle();
    p.lock().libraries.insert(h, HashMap::new());
    write(out, h as CUlibrary)
}

pub fn library_unload(l: CUlibrary) -> R<()> {
    let p = cu()?;
    p.lock().libraries.remove(&(l as u64)).map(|_| ()).ok_or(CUDA_ERROR_INVALID_HANDLE)
}

pub fn library_get_kernel(out: *mut CUkernel, l: CUlibrary, name: *const c_char) -> R<()> {
    let p = cu()?;
    let name = cstr(name)?;
    let mut g = p.lock();
    let existing = g.libraries.get(&(l as u64)).ok_or(CUDA_ERROR_INVALID_HANDLE)?.get(&name).copied();
    let k = match existing {
        Some(k) => k,
        None => {
            let f = new_func(&mut g, &name);
            let k = new_handle();
            g.kernels.insert(k, f);
            g.libraries.get_mut(&(l as u64)).ok_or(CUDA_ERROR_INVALID_HANDLE)?.insert(name, k);
            k
        }
    };
    write(out, k as CUkernel)
}

pub fn kernel_get_function(out: *mut CUfunction, k: CUkernel) -> R<()> {
    let p = cu()?;
    let f = *p.lock().kernels.get(&(k as u64)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    write(out, f as CUfunction)
}

fn func_attr_default(attr: u32) -> Option<i32> {
    Some(match attr {
        CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK => 1024,
        CU_FUNC_ATTRIBUTE_NUM_REGS => 32,
        CU_FUNC_ATTRIBUTE_PTX_VERSION | CU_FUNC_ATTRIBUTE_BINARY_VERSION => 90,
        CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES => 48 << 10,
        CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT => -1,
        _ if attr <= 15 => 0,
        _ => return None,
    })
}

/// Resolves a function or (for the kernel APIs) a kernel handle.
fn func_of(g: &Inner, f: u64) -> R<u64> {
    if g.funcs.contains_key(&f) {
        Ok(f)
    } else {
        g.kernels.get(&f).copied().ok_or(CUDA_ERROR_INVALID_HANDLE)
    }
}

pub fn func_get_attribute(out: *mut i32, attr: u32, f: CUfunction) -> R<()> {
    let p = cu()?;
    let g = p.lock();
    let f = func_of(&g, f as u64)?;
    let v = g.funcs[&f].attrs.get(&attr).copied().or_else(|| func_attr_default(attr)).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    write(out, v)
}

pub fn func_set_attribute(f: CUfunction, attr: u32, value: i32) -> R<()> {
    let p = cu()?;
    func_attr_default(attr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let mut g = p.lock();
    let f = func_of(&g, f as u64)?;
    g.funcs.get_mut(&f).ok_or(CUDA_ERROR_INVALID_HANDLE)?.attrs.insert(attr, value);
    Ok(())
}

pub fn func_check(f: CUfunction) -> R<()> {
    let p = cu()?;
    func_of(&p.lock(), f as u64).map(|_| ())
}

pub fn func_get_name(out: *mut *const c_char, f: CUfunction) -> R<()> {
    let p = cu()?;
    let g = p.lock();
    let f = func_of(&g, f as u64)?;
    // The CString lives as long as the function: like the driver's pointer.
    write(out, g.funcs[&f].name.as_ptr())
}

pub fn occupancy_max_active_blocks(out: *mut i32, f: CUfunction, block: i32, _smem: usize) -> R<()> {
    func_check(f)?;
    if block <= 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    write(out, (2048 / block).clamp(1, 32))
}

pub fn occupancy_max_potential_block_size(min_grid: *mut i32, block: *mut i32, f: CUfunction, limit: i32) -> R<()> {
    let p = cu()?;
    func_check(f)?;
    let b = if limit > 0 { limit.min(1024) } else { 1024 };
    let sms = p.cfg.spec.devices.first().map_or(1, |d| d.sm_count as i32);
    write(block, b)?;
    write(min_grid, sms * (2048 / b).max(1))
}

pub fn read_fn(p: *const CUfunction) -> R<CUfunction> {
    read(p)
}
