//! The virtual memory management API and multicast objects.
//!
//! `cuMemCreate` makes a physical allocation: its own sparse memfd, charged
//! to the device when the location is a device (host and NUMA locations are
//! not charged). It lives while it has handle references (create, retain,
//! import) or mappings; the charge is returned when both reach zero.
//! Exporting gives a real, dup'ed memfd that another process can receive
//! over a unix socket or open through `/proc/<pid>/fd/<n>`; importing it is
//! never charged, but when the last reference of a handle goes while the
//! same process still holds the memory through an imported handle of it,
//! the charge moves to that handle (the driver keeps the memory counted to
//! the process). A multicast object is charged its size, to the current
//! context's device, from `cuMulticastCreate` to its last `cuMemRelease`.

use crate::cptr::{R, read, read_at, write};
use crate::ops::memory::cur;
use crate::rt::{Alloc, Inner, Kind, Phys, Proc, cu, new_handle};
use crate::sys;
use egpu_cuda::*;
use std::ffi::c_void;

/// Allocation and multicast granularity (minimum and recommended).
pub const GRANULARITY: u64 = 2 << 20;
pub const MC_RECOMMENDED: u64 = 512 << 20;

pub(crate) fn drop_if_unused(p: &Proc, g: &mut Inner, h: u64) {
    if let Some(ph) = g.phys.get(&h)
        && ph.handle_refs == 0
        && ph.map_refs == 0
    {
        let ph = g.phys.remove(&h).expect("present");
        if let Some(d) = ph.charged_phys {
            // The process still holds the physical memory through another
            // handle of it (its own export imported back): the charge moves
            // there, as a driver keeps the memory counted to the process
            // while any of its handles refers to it.
            let same = sys::fd_inode(ph.fd);
            match g.phys.values_mut().find(|o| o.charged_phys.is_none() && same.is_some() && sys::fd_inode(o.fd) == same) {
                Some(o) => {
                    o.charged_phys = Some(d);
                    o.charged = ph.charged;
                }
                None => p.shm.uncharge(p.slot, d, ph.charged),
            }
        }
        sys::close(ph.fd);
    }
}

fn location_charge(p: &Proc, loc: CUmemLocation) -> R<Option<usize>> {
    match loc.type_ {
        CU_MEM_LOCATION_TYPE_DEVICE => p.phys(loc.id).map(Some),
        CU_MEM_LOCATION_TYPE_HOST | CU_MEM_LOCATION_TYPE_HOST_NUMA | CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT => Ok(None),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

pub fn get_granularity(out: *mut usize, prop: *const CUmemAllocationProp, _option: u32) -> R<()> {
    let p = cu()?;
    let pr = read(prop)?;
    location_charge(p, super::whole_device(pr.location)?)?;
    write(out, GRANULARITY as usize)
}

pub fn create(out: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationProp, flags: u64) -> R<()> {
    let p = cu()?;
    let mut pr = read(prop)?;
    pr.location = super::whole_device(pr.location)?;
    let size = size as u64;
    if out.is_null() || flags != 0 || size == 0 || !size.is_multiple_of(GRANULARITY) || pr.type_ != CU_MEM_ALLOCATION_TYPE_PINNED {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let charged_phys = location_charge(p, pr.location)?;
    if let Some(d) = charged_phys
        && !p.shm.charge(&p.locks, p.slot, d, size)
    {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    let name = format!("egpu-vmm-t{}-l{}", pr.location.type_, pr.location.id);
    let fd = match sys::memfd(&name, size) {
        Ok(fd) => fd,
        Err(e) => {
            if let Some(d) = charged_phys {
                p.shm.uncharge(p.slot, d, size);
            }
            return Err(e);
        }
    };
    let h = new_handle();
    p.lock().phys.insert(
        h,
        Phys {
            fd,
            size,
            prop_type: pr.type_,
            loc_type: pr.location.type_,
            loc_id: pr.location.id,
            handle_types: pr.requestedHandleTypes,
            charged_phys,
            charged: if charged_phys.is_some() { size } else { 0 },
            handle_refs: 1,
            map_refs: 0,
            multicast: false,
        },
    );
    write(out, h)
}

pub fn release(h: CUmemGenericAllocationHandle) -> R<()> {
    let p = cu()?;
    let mut g = p.lock();
    let ph = g.phys.get_mut(&h).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if ph.handle_refs == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    ph.handle_refs -= 1;
    drop_if_unused(p, &mut g, h);
    Ok(())
}

pub fn address_reserve(out: *mut CUdeviceptr, size: usize, align: usize, addr: CUdeviceptr, _flags: u64) -> R<()> {
    let p = cu()?;
    let size = size as u64;
    if out.is_null() || size == 0 || !size.is_multiple_of(GRANULARITY) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let _ = addr; // a hint only
    let base = sys::reserve(size, (align as u64).max(GRANULARITY), None)?;
    p.lock().reservations.insert(base, size);
    write(out, base)
}

pub fn address_free(ptr: CUdeviceptr, size: usize) -> R<()> {
    let p = cu()?;
    let mut g = p.lock();
    match g.reservations.get(&ptr) {
        Some(&s) if s == size as u64 => {}
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    }
    let inside: Vec<u64> = g.allocs.range(ptr..ptr + size as u64).map(|(&b, _)| b).collect();
    for b in inside {
        unmap_one(p, &mut g, b);
    }
    g.reservations.remove(&ptr);
    sys::unmap(ptr, size as u64);
    Ok(())
}

fn in_reservation(g: &Inner, ptr: u64, size: u64) -> bool {
    g.reservations.range(..=ptr).next_back().is_some_and(|(&b, &s)| ptr + size <= b + s)
}

pub fn map(ptr: CUdeviceptr, size: usize, offset: usize, h: CUmemGenericAllocationHandle, flags: u64) -> R<()> {
    let p = cu()?;
    let (size, offset) = (size as u64, offset as u64);
    let mut g = p.lock();
    if flags != 0 || size == 0 || !in_reservation(&g, ptr, size) || g.allocs.range(ptr..ptr + size).next().is_some() || g.find(ptr).is_some()
    {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let ph = g.phys.get(&h).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    if ph.multicast || offset + size > ph.size || !offset.is_multiple_of(GRANULARITY) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (fd, loc_id, loc_type) = (ph.fd, ph.loc_id, ph.loc_type);
    sys::map_fd(fd, size, offset, Some(ptr))?;
    let (ord, phys) = if loc_type == CU_MEM_LOCATION_TYPE_DEVICE {
        (loc_id as usize, p.phys(loc_id).unwrap_or(0))
    } else {
        cur(&g).map(|(_, o, d)| (o, d)).unwrap_or((0, 0))
    };
    let ctx = cur(&g).map(|c| c.0).unwrap_or(0);
    g.phys.get_mut(&h).ok_or(CUDA_ERROR_INVALID_HANDLE)?.map_refs += 1;
    let id = g.next_buffer_id;
    g.next_buffer_id += 1;
    g.allocs.insert(
        ptr,
        Alloc {
            base: ptr,
            size,
            span: size,
            kind: Kind::Vmm { handle: h, offset },
            ord,
            phys,
            ctx,
            charged: 0,
            id,
            access: CU_MEM_ACCESS_FLAGS_PROT_NONE,
            host_flags: 0,
        },
    );
    Ok(())
}

fn unmap_one(p: &Proc, g: &mut Inner, base: u64) {
    let Some(a) = g.allocs.remove(&base) else { return };
    let Kind::Vmm { handle, .. } = a.kind else {
        g.allocs.insert(base, a);
        return;
    };
    let _ = sys::reserve(a.span, sys::PAGE, Some(a.base));
    if let Some(ph) = g.phys.get_mut(&handle) {
        ph.map_refs = ph.map_refs.saturating_sub(1);
    }
    drop_if_unused(p, g, handle);
}

pub fn unmap(ptr: CUdeviceptr, size: usize) -> R<()> {
    let p = cu()?;
    let mut g = p.lock();
    let bases: Vec<u64> =
        g.allocs.range(ptr..ptr + size as u64).filter(|(_, a)| matches!(a.kind, Kind::Vmm { .. })).map(|(&b, _)| b).collect();
    if bases.is_empty() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    for b in bases {
        unmap_one(p, &mut g, b);
    }
    Ok(())
}

pub fn set_access(ptr: CUdeviceptr, size: usize, desc: *const CUmemAccessDesc, count: usize) -> R<()> {
    let p = cu()?;
    let mut flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
    for i in 0..count {
        let d = read_at(desc, i)?;
        if d.location.type_ == CU_MEM_LOCATION_TYPE_DEVICE {
            p.phys(d.location.id)?;
        }
        flags |= d.flags;
    }
    let mut g = p.lock();
    let mut any = false;
    for (_, a) in g.allocs.range_mut(ptr..ptr + size as u64) {
        if matches!(a.kind, Kind::Vmm { .. }) {
            a.access = flags;
            any = true;
        }
    }
    if any { Ok(()) } else { Err(CUDA_ERROR_INVALID_VALUE) }
}

pub fn get_access(out: *mut u64, _loc: *const CUmemLocation, ptr: CUdeviceptr) -> R<()> {
    let p = cu()?;
    let g = p.lock();
    let a = g.find(ptr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    write(out, a.access as u64)
}

pub fn export(out: *mut c_void, h: CUmemGenericAllocationHandle, ty: u32, _flags: u64) -> R<()> {
    let p = cu()?;
    if ty != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR {
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    let g = p.lock();
    let ph = g.phys.get(&h).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if ph.handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let fd = sys::dup(ph.fd)?;
    write(out as *mut i32, fd)
}

/// Parses `egpu-vmm-t<type>-l<id>` out of a memfd's link name.
fn parse_vmm_name(name: &str) -> Option<(u32, i32)> {
    let rest = &name[name.find("egpu-vmm-t")? + "egpu-vmm-t".len()..];
    let (t, rest) = rest.split_once("-l")?;
    let id: String = rest.chars().take_while(|c| *c == '-' || c.is_ascii_digit()).collect();
    Some((t.parse().ok()?, id.parse().ok()?))
}

pub fn import(out: *mut CUmemGenericAllocationHandle, os_handle: *mut c_void, ty: u32) -> R<()> {
    let p = cu()?;
    if ty != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || out.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let src = os_handle as usize as i32;
    let (loc_type, loc_id) = parse_vmm_name(&sys::fd_name(src)).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let size = sys::fd_size(src).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let fd = sys::dup(src)?;
    let h = new_handle();
    p.lock().phys.insert(
        h,
        Phys {
            fd,
            size,
            prop_type: CU_MEM_ALLOCATION_TYPE_PINNED,
            loc_type,
            loc_id,
            handle_types: CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            charged_phys: None,
            charged: 0,
            handle_refs: 1,
            map_refs: 0,
            multicast: false,
        },
    );
    write(out, h)
}

pub fn retain_allocation_handle(out: *mut CUmemGenericAllocationHandle, addr: *mut c_void) -> R<()> {
    let p = cu()?;
    let mut g = p.lock();
    let Some(Kind::Vmm { handle, .. }) = g.find(addr as u64).map(|a| a.kind) else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    g.phys.get_mut(&handle).ok_or(CUDA_ERROR_INVALID_VALUE)?.handle_refs += 1;
    write(out, handle)
}

pub fn get_properties(out: *mut CUmemAllocationProp, h: CUmemGenericAllocationHandle) -> R<()> {
    let p = cu()?;
    let g = p.lock();
    let ph = g.phys.get(&h).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    write(
        out,
        CUmemAllocationProp {
            type_: ph.prop_type,
            requestedHandleTypes: ph.handle_types,
            location: CUmemLocation { type_: ph.loc_type, id: ph.loc_id },
            win32HandleMetaData: std::ptr::null_mut(),
            allocFlags: Default::default(),
        },
    )
}

// --- multicast ------------------------------------------------------------

pub fn multicast_granularity(out: *mut usize, prop: *const CUmulticastObjectProp, option: u32) -> R<()> {
    cu()?;
    read(prop)?;
    write(out, if option == CU_MULTICAST_GRANULARITY_RECOMMENDED { MC_RECOMMENDED } else { GRANULARITY } as usize)
}

pub fn multicast_create(out: *mut CUmemGenericAllocationHandle, prop: *const CUmulticastObjectProp) -> R<()> {
    let p = cu()?;
    let pr = read(prop)?;
    let size = pr.size as u64;
    if out.is_null() || size == 0 || !size.is_multiple_of(GRANULARITY) || pr.numDevices == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut g = p.lock();
    let phys = match cur(&g) {
        Ok((_, _, d)) => d,
        Err(_) => p.phys(0)?,
    };
    if !p.shm.charge(&p.locks, p.slot, phys, size) {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    let h = new_handle();
    g.phys.insert(
        h,
        Phys {
            fd: -1,
            size,
            prop_type: CU_MEM_ALLOCATION_TYPE_PINNED,
            loc_type: CU_MEM_LOCATION_TYPE_DEVICE,
            loc_id: 0,
            handle_types: pr.handleTypes as u32,
            charged_phys: Some(phys),
            charged: size,
            handle_refs: 1,
            map_refs: 0,
            multicast: true,
        },
    );
    write(out, h)
}

fn is_multicast(h: u64) -> R<()> {
    let p = cu()?;
    match p.lock().phys.get(&h) {
        Some(ph) if ph.multicast => Ok(()),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

pub fn multicast_add_device(mc: CUmemGenericAllocationHandle, dev: CUdevice) -> R<()> {
    cu()?.phys(dev)?;
    is_multicast(mc)
}

pub fn multicast_bind_mem(mc: CUmemGenericAllocationHandle, mem: CUmemGenericAllocationHandle) -> R<()> {
    is_multicast(mc)?;
    let p = cu()?;
    if p.lock().phys.contains_key(&mem) { Ok(()) } else { Err(CUDA_ERROR_INVALID_VALUE) }
}

pub fn multicast_plain(mc: CUmemGenericAllocationHandle) -> R<()> {
    is_multicast(mc)
}

#[cfg(test)]
mod tests {
    #[test]
    fn vmm_names() {
        assert_eq!(super::parse_vmm_name("/memfd:egpu-vmm-t1-l3 (deleted)"), Some((1, 3)));
        assert_eq!(super::parse_vmm_name("/memfd:egpu-vmm-t2-l-1 (deleted)"), Some((2, -1)));
        assert_eq!(super::parse_vmm_name("/tmp/x"), None);
    }
}
