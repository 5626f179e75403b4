//! Kernel launches. A kernel lasts `threads x EGPU_SIM_NS_PER_THREAD` ns and
//! is queued on its device behind every kernel already queued there by any
//! process (see [`crate::state::timing`]).

use crate::cptr::{R, read, read_at};
use crate::ops::stream::{self, SRef};
use crate::rt::{Inner, Node, Proc, cu};
use crate::state::timing::now_ns;
use egpu_cuda::*;
use std::ffi::c_void;

/// Threads of a launch, validating the dimensions.
pub fn threads(grid: [u32; 3], block: [u32; 3]) -> R<u64> {
    if grid.contains(&0) || block.contains(&0) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let per_block = block.iter().map(|&b| b as u64).product::<u64>();
    if per_block > 1024 || block[2] > 64 || grid[1] > 65535 || grid[2] > 65535 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(per_block * grid.iter().map(|&g| g as u64).product::<u64>())
}

/// Duration in ns of a kernel with `threads` threads.
pub fn duration(p: &Proc, threads: u64) -> u64 {
    (threads as f64 * p.cfg.ns_per_thread).round() as u64
}

/// Queues `dur` ns of kernel work on stream `s`; returns (start, end).
pub fn enqueue(p: &Proc, g: &mut Inner, s: SRef, dur: u64) -> (u64, u64) {
    let ctx = s.ctx(g);
    let phys = g.ctxs[&ctx].phys;
    let now = now_ns();
    let earliest = stream::earliest(g, s).max(now);
    let (start, end) = p.shm.schedule(p.slot, phys, earliest, dur, now);
    stream::set_tail(g, s, end);
    (start, end)
}

fn launch(f: CUfunction, grid: [u32; 3], block: [u32; 3], s: CUstream, ptsz: bool) -> R<()> {
    let p = cu()?;
    let n = threads(grid, block)?;
    let mut g = p.lock();
    if !g.funcs.contains_key(&(f as u64)) {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    let r = stream::resolve(&g, s, ptsz)?;
    if let Some(graph) = crate::ops::graph::capture_graph(&g, r) {
        g.graphs.entry(graph?).or_default().nodes.push((crate::rt::new_handle(), Node::Kernel { threads: n }));
        return Ok(());
    }
    let dur = duration(p, n);
    enqueue(p, &mut g, r, dur);
    Ok(())
}

#[allow(clippy::too_many_arguments)]
pub fn launch_kernel(
    f: CUfunction,
    gx: u32,
    gy: u32,
    gz: u32,
    bx: u32,
    by: u32,
    bz: u32,
    _shmem: u32,
    s: CUstream,
    _params: *mut *mut c_void,
    _extra: *mut *mut c_void,
    ptsz: bool,
) -> R<()> {
    launch(f, [gx, gy, gz], [bx, by, bz], s, ptsz)
}

pub fn launch_kernel_ex(cfg: *const CUlaunchConfig, f: CUfunction, _params: *mut *mut c_void, _extra: *mut *mut c_void, ptsz: bool) -> R<()> {
    let c = read(cfg)?;
    for i in 0..c.numAttrs as usize {
        // Attributes are accepted and ignored; reading them validates the array.
        read_at(c.attrs as *const CUlaunchAttribute, i)?;
    }
    launch(f, [c.gridDimX, c.gridDimY, c.gridDimZ], [c.blockDimX, c.blockDimY, c.blockDimZ], c.hStream, ptsz)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_counts() {
        assert_eq!(threads([2, 3, 4], [32, 4, 1]).unwrap(), 24 * 128);
        assert!(threads([0, 1, 1], [1, 1, 1]).is_err());
        assert!(threads([1, 1, 1], [1024, 2, 1]).is_err());
        assert!(threads([1, 70000, 1], [1, 1, 1]).is_err());
        assert_eq!(threads([u32::MAX, 1, 1], [1024, 1, 1]).unwrap(), u32::MAX as u64 * 1024);
    }
}
