//! Legacy CUDA IPC of `cuMemAlloc` memory.
//!
//! The 64-byte handle names the exporter's arena memfd and the range in it:
//! `"EGPUIPC1"`, exporter pid, start time, fd number, physical device,
//! offset, size, buffer id. The importer opens `/proc/<pid>/fd/<fd>` (same
//! user), checks that it is a simulated-GPU arena of that size, and maps the
//! range: both processes then share the pages. Importing charges nothing;
//! the exporter's allocation stays the only charge.

use crate::cptr::{R, read, write};
use crate::ops::arena;
use crate::rt::{Alloc, Kind, cu};
use crate::state::live;
use crate::sys;
use egpu_cuda::*;
use std::ffi::c_char;

const MAGIC: &[u8; 8] = b"EGPUIPC1";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handle {
    pub pid: u32,
    pub start: u64,
    pub fd: i32,
    pub phys: u32,
    pub offset: u64,
    pub size: u64,
    pub id: u64,
}

impl Handle {
    pub fn encode(&self) -> CUipcMemHandle {
        let mut b = [0u8; 64];
        b[..8].copy_from_slice(MAGIC);
        b[8..12].copy_from_slice(&self.pid.to_le_bytes());
        b[12..16].copy_from_slice(&self.fd.to_le_bytes());
        b[16..24].copy_from_slice(&self.start.to_le_bytes());
        b[24..28].copy_from_slice(&self.phys.to_le_bytes());
        b[32..40].copy_from_slice(&self.offset.to_le_bytes());
        b[40..48].copy_from_slice(&self.size.to_le_bytes());
        b[48..56].copy_from_slice(&self.id.to_le_bytes());
        CUipcMemHandle { reserved: b.map(|x| x as c_char) }
    }

    pub fn decode(h: &CUipcMemHandle) -> Option<Handle> {
        let b = h.reserved.map(|x| x as u8);
        if &b[..8] != MAGIC {
            return None;
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap_or_default());
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or_default());
        Some(Handle {
            pid: u32_at(8),
            fd: u32_at(12) as i32,
            start: u64_at(16),
            phys: u32_at(24),
            offset: u64_at(32),
            size: u64_at(40),
            id: u64_at(48),
        })
    }
}

pub fn get_mem_handle(out: *mut CUipcMemHandle, d: CUdeviceptr) -> R<()> {
    let p = cu()?;
    let g = p.lock();
    let a = g.find(d).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if a.kind != Kind::Device {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (fd, offset) = arena::locate(&g, a.phys, a.base).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let h = Handle {
        pid: p.pid,
        start: live::start_time(p.pid).unwrap_or(0),
        fd,
        phys: a.phys as u32,
        offset,
        size: a.size,
        id: a.id,
    };
    write(out, h.encode())
}

pub fn open_mem_handle(out: *mut CUdeviceptr, handle: CUipcMemHandle, _flags: u32) -> R<()> {
    let p = cu()?;
    let h = Handle::decode(&handle).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if out.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if h.pid == p.pid {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    let mut g = p.lock();
    let (ctx, _, _) = crate::ops::memory::cur(&g)?;
    if let Some((base, refs)) = g.ipc_imports.get_mut(&(h.pid, h.id)) {
        *refs += 1;
        let b = *base;
        return write(out, b);
    }
    if !live::is_alive(h.pid, h.start) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let fd = sys::open_proc_fd(h.pid, h.fd)?;
    let ok = sys::fd_name(fd).contains(&format!("egpu-arena-d{}", h.phys))
        && sys::fd_size(fd).is_some_and(|s| h.offset + h.size <= s);
    if !ok {
        sys::close(fd);
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let span = sys::round_up(h.size, sys::PAGE);
    let base = sys::map_fd(fd, span, h.offset, None);
    sys::close(fd);
    let base = base?;
    let phys = h.phys as usize;
    let ord = p.visible.iter().position(|&d| d == phys).unwrap_or(0);
    let id = g.next_buffer_id;
    g.next_buffer_id += 1;
    g.allocs.insert(
        base,
        Alloc {
            base,
            size: h.size,
            span,
            kind: Kind::IpcImport,
            ord,
            phys,
            ctx,
            charged: 0,
            id,
            access: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            host_flags: 0,
        },
    );
    g.ipc_imports.insert((h.pid, h.id), (base, 1));
    write(out, base)
}

pub fn close_mem_handle(d: CUdeviceptr) -> R<()> {
    let p = cu()?;
    let mut g = p.lock();
    let key = *g.ipc_imports.iter().find(|(_, (b, _))| *b == d).ok_or(CUDA_ERROR_INVALID_VALUE)?.0;
    let e = g.ipc_imports.get_mut(&key).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    e.1 -= 1;
    if e.1 == 0 {
        g.ipc_imports.remove(&key);
        if let Some(a) = g.allocs.remove(&d) {
            sys::unmap(a.base, a.span);
        }
    }
    Ok(())
}

pub fn read_handle(p: *const CUipcMemHandle) -> R<CUipcMemHandle> {
    read(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handle_roundtrip() {
        let h = Handle { pid: 4242, start: 99, fd: 17, phys: 3, offset: 1 << 33, size: 12345, id: 7 };
        assert_eq!(Handle::decode(&h.encode()), Some(h));
        let junk = CUipcMemHandle { reserved: [0; 64] };
        assert_eq!(Handle::decode(&junk), None);
    }
}
