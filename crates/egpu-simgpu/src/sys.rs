//! Thin wrappers over the system calls that back simulated device memory.

use egpu_cuda::{CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_UNKNOWN, CUresult};
use std::ffi::CString;

pub const PAGE: u64 = 4096;

pub fn round_up(v: u64, to: u64) -> u64 {
    v.div_ceil(to) * to
}

/// A sparse memfd of `size` bytes named `name` (close-on-exec).
pub fn memfd(name: &str, size: u64) -> Result<i32, CUresult> {
    let c = CString::new(name).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    // SAFETY: c is NUL-terminated; memfd_create has no other preconditions.
    let fd = unsafe { libc::memfd_create(c.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    // SAFETY: fd is the memfd we just created.
    if unsafe { libc::ftruncate(fd, size as libc::off_t) } != 0 {
        close(fd);
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    Ok(fd)
}

pub fn close(fd: i32) {
    if fd >= 0 {
        // SAFETY: the caller owns fd and does not use it afterwards.
        unsafe { libc::close(fd) };
    }
}

/// `dup` with close-on-exec.
pub fn dup(fd: i32) -> Result<i32, CUresult> {
    // SAFETY: F_DUPFD_CLOEXEC on an fd has no memory-safety preconditions.
    let r = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
    if r < 0 { Err(CUDA_ERROR_INVALID_VALUE) } else { Ok(r) }
}

/// Size of the file behind `fd`.
pub fn fd_size(fd: i32) -> Option<u64> {
    // SAFETY: all-zero is a valid stat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: st is a valid out-pointer; a bad fd just fails.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some(st.st_size as u64)
}

/// The (device, inode) of the file behind `fd`: one memfd whatever
/// descriptor of it a process holds.
pub fn fd_inode(fd: i32) -> Option<(u64, u64)> {
    // SAFETY: all-zero is a valid stat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: st is a valid out-pointer; a bad fd just fails.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some((st.st_dev as u64, st.st_ino as u64))
}

/// Maps `len` bytes of `fd` at `offset` shared read-write, at `fixed` if
/// given (which must lie in a range this process reserved).
pub fn map_fd(fd: i32, len: u64, offset: u64, fixed: Option<u64>) -> Result<u64, CUresult> {
    let (addr, extra) = match fixed {
        Some(a) => (a as *mut libc::c_void, libc::MAP_FIXED),
        None => (std::ptr::null_mut(), 0),
    };
    // SAFETY: either a fresh mapping, or MAP_FIXED over a PROT_NONE range
    // that the caller reserved and that no Rust reference points into.
    let p = unsafe {
        libc::mmap(
            addr,
            len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_NORESERVE | extra,
            fd,
            offset as libc::off_t,
        )
    };
    if p == libc::MAP_FAILED { Err(CUDA_ERROR_OUT_OF_MEMORY) } else { Ok(p as u64) }
}

/// Reserves `len` bytes of address space (PROT_NONE), aligned to `align`, at
/// `fixed` if given.
pub fn reserve(len: u64, align: u64, fixed: Option<u64>) -> Result<u64, CUresult> {
    let align = align.max(PAGE);
    let want = len + if align > PAGE { align } else { 0 };
    let (addr, extra) = match fixed {
        Some(a) => (a as *mut libc::c_void, libc::MAP_FIXED),
        None => (std::ptr::null_mut(), 0),
    };
    // SAFETY: a fresh anonymous PROT_NONE mapping, or MAP_FIXED over a range
    // this process owns (a reservation being restored after an unmap).
    let p = unsafe {
        libc::mmap(
            addr,
            if fixed.is_some() { len as usize } else { want as usize },
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | extra,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    let p = p as u64;
    if fixed.is_some() || align <= PAGE {
        return Ok(p);
    }
    let start = round_up(p, align);
    if start > p {
        unmap(p, start - p);
    }
    let end = p + want;
    if end > start + len {
        unmap(start + len, end - (start + len));
    }
    Ok(start)
}

/// Anonymous private read-write memory (pinned host memory).
pub fn anon(len: u64) -> Result<u64, CUresult> {
    // SAFETY: a fresh anonymous mapping.
    let p = unsafe {
        libc::mmap(std::ptr::null_mut(), len as usize, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
    };
    if p == libc::MAP_FAILED { Err(CUDA_ERROR_OUT_OF_MEMORY) } else { Ok(p as u64) }
}

pub fn unmap(addr: u64, len: u64) {
    if len > 0 {
        // SAFETY: the caller unmaps a range it mapped and no longer uses.
        unsafe { libc::munmap(addr as *mut libc::c_void, len as usize) };
    }
}

/// Releases the pages of `[offset, offset+len)` of `fd` (contents become 0).
pub fn punch(fd: i32, offset: u64, len: u64) {
    // SAFETY: fallocate on our own memfd; failure only means pages stay.
    unsafe {
        libc::fallocate(fd, libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, offset as libc::off_t, len as libc::off_t)
    };
}

/// Opens another process's fd through /proc (same user).
pub fn open_proc_fd(pid: u32, fd: i32) -> Result<i32, CUresult> {
    let c = CString::new(format!("/proc/{pid}/fd/{fd}")).map_err(|_| CUDA_ERROR_UNKNOWN)?;
    // SAFETY: c is NUL-terminated.
    let r = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if r < 0 { Err(CUDA_ERROR_INVALID_VALUE) } else { Ok(r) }
}

/// The name behind one of our fds (`/memfd:NAME (deleted)` for memfds).
pub fn fd_name(fd: i32) -> String {
    std::fs::read_link(format!("/proc/self/fd/{fd}")).map(|p| p.to_string_lossy().into_owned()).unwrap_or_default()
}
