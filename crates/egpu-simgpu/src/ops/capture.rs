//! Stream capture: `cuStreamBeginCapture*`, `cuStreamBeginCaptureToGraph`,
//! `cuStreamBeginRecaptureToGraph`, `cuStreamEndCapture`, `cuThreadExchangeStreamCaptureMode`, and the rule
//! that makes capture fragile in real programs: while a capture is in
//! progress, some calls are *potentially unsafe* and, when the modes
//! forbid them, fail with `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and
//! invalidate the capture (its end then fails with
//! `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`).
//!
//! The rule, as the driver API documents it for a thread's capture mode:
//! - `GLOBAL` (every thread's default): the thread may not make such calls
//!   while it has a capture of its own not begun `RELAXED`, nor while any
//!   other thread has a capture begun `GLOBAL`;
//! - `THREAD_LOCAL`: only its own non-relaxed captures forbid them;
//! - `RELAXED`: nothing does.
//!
//! Here the potentially unsafe calls are the synchronous waits and queries
//! (`cuEventQuery`, `cuEventSynchronize`, `cuStreamQuery`,
//! `cuStreamSynchronize`, `cuCtxSynchronize`). Which calls the real driver
//! counts is not published in full; an event query from another thread
//! invalidating a global capture is the case seen in practice.

use crate::cptr::{R, read, write};
use crate::ops::stream::{self, SRef};
use crate::rt::{Capture, Graph, Inner, Node, cu, new_handle};
use egpu_cuda::*;
use std::cell::Cell;
use std::thread::ThreadId;

thread_local! {
    /// This thread's capture interaction mode.
    static THREAD_MODE: Cell<u32> = const { Cell::new(CU_STREAM_CAPTURE_MODE_GLOBAL) };
}

fn me() -> ThreadId {
    std::thread::current().id()
}

/// `cuThreadExchangeStreamCaptureMode`: swaps the thread's mode with `*mode`.
pub fn exchange_mode(mode: *mut u32) -> R<()> {
    let new = read(mode)?;
    if new > CU_STREAM_CAPTURE_MODE_RELAXED {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let old = THREAD_MODE.with(|m| m.replace(new));
    write(mode, old)
}

/// Whether a capture forbids this thread's potentially unsafe calls.
fn forbids(c: &Capture, mode: u32, me: ThreadId) -> bool {
    match mode {
        CU_STREAM_CAPTURE_MODE_RELAXED => false,
        _ if c.thread == me => c.mode != CU_STREAM_CAPTURE_MODE_RELAXED,
        CU_STREAM_CAPTURE_MODE_GLOBAL => c.mode == CU_STREAM_CAPTURE_MODE_GLOBAL,
        _ => false,
    }
}

/// The capture of a resolved stream: a user stream's own, or the calling
/// thread's per-thread default stream's (one per context and thread). The
/// legacy stream cannot be captured.
pub fn of(g: &Inner, r: SRef) -> Option<&Capture> {
    match r {
        SRef::User(h) => g.streams.get(&h)?.capture.as_ref(),
        SRef::PerThread(c) => g.ptds_captures.get(&(c, me())),
        SRef::Legacy(_) => None,
    }
}

fn slot(g: &mut Inner, r: SRef) -> R<&mut Option<Capture>> {
    match r {
        SRef::User(h) => Ok(&mut g.streams.get_mut(&h).ok_or(CUDA_ERROR_INVALID_HANDLE)?.capture),
        SRef::PerThread(_) | SRef::Legacy(_) => Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED),
    }
}

/// Before a potentially unsafe call: fails it, and invalidates the captures
/// that forbid it, when the thread's mode and the captures in progress say so.
pub fn unsafe_call(g: &mut Inner) -> R<()> {
    let mode = THREAD_MODE.with(Cell::get);
    let me = me();
    let mut refused = false;
    for c in g.streams.values_mut().filter_map(|s| s.capture.as_mut()).chain(g.ptds_captures.values_mut()) {
        if forbids(c, mode, me) {
            c.invalid = true;
            refused = true;
        }
    }
    if refused { Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) } else { Ok(()) }
}

fn begin(g: &mut Inner, s: CUstream, graph: u64, owned: bool, mode: u32, ptsz: bool) -> R<()> {
    if mode > CU_STREAM_CAPTURE_MODE_RELAXED {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let r = stream::resolve(g, s, ptsz)?;
    if of(g, r).is_some() {
        return Err(CUDA_ERROR_ILLEGAL_STATE);
    }
    let c = Capture { graph, owned, mode, thread: me(), invalid: false, recapture: None };
    match r {
        SRef::PerThread(ctx) => {
            g.ptds_captures.insert((ctx, me()), c);
        }
        _ => *slot(g, r)? = Some(c),
    }
    if owned {
        g.graphs.insert(graph, Graph::default());
    }
    Ok(())
}

/// `cuStreamBeginCapture(_v2)(_ptsz)`: capture into a new graph.
pub fn begin_capture(s: CUstream, mode: u32, ptsz: bool) -> R<()> {
    let p = cu()?;
    let mut g = p.lock();
    begin(&mut g, s, new_handle(), true, mode, ptsz)
}

/// `cuStreamBeginCaptureToGraph(_ptsz)`: capture into the caller's graph
/// (the first node's dependencies are not modelled: nodes have no edges here).
pub fn begin_capture_to_graph(s: CUstream, graph: CUgraph, mode: u32, ptsz: bool) -> R<()> {
    let p = cu()?;
    let mut g = p.lock();
    if !g.graphs.contains_key(&(graph as u64)) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    begin(&mut g, s, graph as u64, false, mode, ptsz)
}

/// `cuStreamBeginRecaptureToGraph(_ptsz)` (CUDA 13.3): capture into the
/// caller's graph again. Its nodes are taken out and the capture must add
/// the same sequence back (kinds in order, allocation nodes of the same
/// size), else its end fails with `CUDA_ERROR_GRAPH_RECAPTURE_FAILURE` and
/// the graph holds what was recaptured (the driver leaves it undefined).
/// Other parameters (kernel arguments, grids) are not modelled, so the
/// mismatch callback is never called. The real driver fails at the first
/// diverging node; here it is found at the end.
pub fn begin_recapture_to_graph(s: CUstream, mode: u32, graph: CUgraph, ptsz: bool) -> R<()> {
    let p = cu()?;
    let mut g = p.lock();
    let key = graph as u64;
    if !g.graphs.contains_key(&key) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    begin(&mut g, s, key, false, mode, ptsz)?;
    let old: Vec<Node> = g.graphs.get(&key).map(|gr| gr.nodes.iter().map(|(_, n)| n.clone()).collect()).unwrap_or_default();
    let r = stream::resolve(&g, s, ptsz)?;
    let c = match r {
        SRef::PerThread(ctx) => g.ptds_captures.get_mut(&(ctx, me())),
        _ => slot(&mut g, r)?.as_mut(),
    }
    .ok_or(CUDA_ERROR_ILLEGAL_STATE)?;
    c.recapture = Some(old);
    if let Some(gr) = g.graphs.get_mut(&key) {
        gr.nodes.clear();
    }
    Ok(())
}

/// Whether recaptured node `b` repeats original node `a`.
fn same_node(a: &Node, b: &Node) -> bool {
    match (a, b) {
        (Node::Kernel { .. }, Node::Kernel { .. }) | (Node::MemFree { .. }, Node::MemFree { .. }) | (Node::Empty, Node::Empty) => true,
        (Node::MemAlloc { size: x, .. }, Node::MemAlloc { size: y, .. }) => x == y,
        _ => false,
    }
}

/// `cuStreamEndCapture(_ptsz)`. An invalidated capture ends with
/// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` and a null graph; a capture
/// begun not `RELAXED` must be ended by the thread that began it.
pub fn end_capture(s: CUstream, out: *mut CUgraph, ptsz: bool) -> R<()> {
    let p = cu()?;
    let mut g = p.lock();
    let r = stream::resolve(&g, s, ptsz)?;
    let c = of(&g, r).ok_or(CUDA_ERROR_ILLEGAL_STATE)?;
    if c.mode != CU_STREAM_CAPTURE_MODE_RELAXED && c.thread != me() {
        return Err(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
    }
    let c = match r {
        SRef::PerThread(ctx) => g.ptds_captures.remove(&(ctx, me())),
        _ => slot(&mut g, r)?.take(),
    }
    .ok_or(CUDA_ERROR_ILLEGAL_STATE)?;
    if c.invalid {
        if c.owned {
            g.graphs.remove(&c.graph);
        }
        let _ = write(out, std::ptr::null_mut());
        return Err(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    }
    if let Some(old) = &c.recapture {
        let new = g.graphs.get(&c.graph).map_or(&[][..], |gr| &gr.nodes[..]);
        if old.len() != new.len() || !old.iter().zip(new).all(|(a, (_, b))| same_node(a, b)) {
            let _ = write(out, std::ptr::null_mut());
            return Err(CUDA_ERROR_GRAPH_RECAPTURE_FAILURE);
        }
    }
    write(out, c.graph as CUgraph)
}

/// `CUstreamCaptureStatus` of a resolved stream: 0 none, 1 active, 2 invalidated.
pub fn status(g: &Inner, r: SRef) -> u32 {
    match of(g, r) {
        None => CU_STREAM_CAPTURE_STATUS_NONE,
        Some(c) if c.invalid => CU_STREAM_CAPTURE_STATUS_INVALIDATED,
        Some(_) => CU_STREAM_CAPTURE_STATUS_ACTIVE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cap(mode: u32, thread: ThreadId) -> Capture {
        Capture { graph: 1, owned: true, mode, thread, invalid: false, recapture: None }
    }

    #[test]
    fn the_documented_mode_rules() {
        let me = me();
        let other = std::thread::spawn(|| std::thread::current().id()).join().unwrap();
        // Own captures: forbidden unless the capture or the thread is relaxed.
        assert!(forbids(&cap(CU_STREAM_CAPTURE_MODE_GLOBAL, me), CU_STREAM_CAPTURE_MODE_GLOBAL, me));
        assert!(forbids(&cap(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, me), CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, me));
        assert!(!forbids(&cap(CU_STREAM_CAPTURE_MODE_RELAXED, me), CU_STREAM_CAPTURE_MODE_GLOBAL, me));
        assert!(!forbids(&cap(CU_STREAM_CAPTURE_MODE_GLOBAL, me), CU_STREAM_CAPTURE_MODE_RELAXED, me));
        // Another thread's: only a global capture, and only in global mode.
        assert!(forbids(&cap(CU_STREAM_CAPTURE_MODE_GLOBAL, other), CU_STREAM_CAPTURE_MODE_GLOBAL, me));
        assert!(!forbids(&cap(CU_STREAM_CAPTURE_MODE_GLOBAL, other), CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, me));
        assert!(!forbids(&cap(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, other), CU_STREAM_CAPTURE_MODE_GLOBAL, me));
        assert!(!forbids(&cap(CU_STREAM_CAPTURE_MODE_GLOBAL, other), CU_STREAM_CAPTURE_MODE_RELAXED, me));
    }
}
