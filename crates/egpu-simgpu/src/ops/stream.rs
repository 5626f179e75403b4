//! Streams, events and the kernel time model on the process side.
//!
//! Every stream has a `tail`: the CLOCK_MONOTONIC time its last queued work
//! ends. Work on a stream starts no earlier than its tail; on a blocking
//! stream also no earlier than the legacy default stream's tail; on the
//! legacy stream no earlier than every blocking stream's tail (the legacy
//! synchronisation rules). Copies and memsets take no simulated time.

use crate::cptr::{R, write, write_opt};
use crate::ops::{capture, context};
use crate::rt::{Event, Inner, Stream, cu, new_handle};
use crate::state::timing::{now_ns, sleep_until};
use egpu_cuda::*;

/// Which stream a `CUstream` value denotes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SRef {
    Legacy(u64),
    PerThread(u64),
    User(u64),
}

impl SRef {
    pub fn ctx(self, g: &Inner) -> u64 {
        match self {
            SRef::Legacy(c) | SRef::PerThread(c) => c,
            SRef::User(s) => g.streams[&s].ctx,
        }
    }
}

/// Resolves a stream handle; `ptsz` is true for the `_ptsz`/`_ptds` entry
/// points, where stream 0 means the per-thread default stream.
pub fn resolve(g: &Inner, s: CUstream, ptsz: bool) -> R<SRef> {
    match s as usize {
        0 if ptsz => Ok(SRef::PerThread(context::current(g)?)),
        0 | CU_STREAM_LEGACY => Ok(SRef::Legacy(context::current(g)?)),
        CU_STREAM_PER_THREAD => Ok(SRef::PerThread(context::current(g)?)),
        h => {
            if g.streams.contains_key(&(h as u64)) {
                Ok(SRef::User(h as u64))
            } else {
                Err(CUDA_ERROR_INVALID_HANDLE)
            }
        }
    }
}

/// Earliest time new work on `s` may start (not counting the device queue).
pub fn earliest(g: &Inner, s: SRef) -> u64 {
    match s {
        SRef::Legacy(c) => context::ctx_tail_blocking(g, c),
        SRef::PerThread(c) => {
            let ctx = &g.ctxs[&c];
            ctx.ptds_tail.max(ctx.legacy_tail)
        }
        SRef::User(h) => {
            let st = &g.streams[&h];
            if st.flags & CU_STREAM_NON_BLOCKING != 0 {
                st.tail
            } else {
                st.tail.max(g.ctxs.get(&st.ctx).map_or(0, |c| c.legacy_tail))
            }
        }
    }
}

pub fn set_tail(g: &mut Inner, s: SRef, t: u64) {
    match s {
        SRef::Legacy(c) => {
            if let Some(c) = g.ctxs.get_mut(&c) {
                c.legacy_tail = c.legacy_tail.max(t)
            }
        }
        SRef::PerThread(c) => {
            if let Some(c) = g.ctxs.get_mut(&c) {
                c.ptds_tail = c.ptds_tail.max(t)
            }
        }
        SRef::User(h) => {
            if let Some(s) = g.streams.get_mut(&h) {
                s.tail = s.tail.max(t)
            }
        }
    }
}

pub fn stream_create(out: *mut CUstream, flags: u32) -> R<()> {
    stream_create_with_priority(out, flags, 0)
}

pub fn stream_create_with_priority(out: *mut CUstream, flags: u32, priority: i32) -> R<()> {
    let p = cu()?;
    if out.is_null() || flags & !CU_STREAM_NON_BLOCKING != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut g = p.lock();
    let ctx = context::current(&g)?;
    let h = new_handle();
    g.streams.insert(h, Stream { ctx, flags, priority: priority.clamp(-5, 0), tail: 0, capture: None });
    write(out, h as CUstream)
}

pub fn stream_destroy(s: CUstream) -> R<()> {
    let p = cu()?;
    let mut g = p.lock();
    g.streams.remove(&(s as u64)).map(|_| ()).ok_or(CUDA_ERROR_INVALID_HANDLE)
}

/// Sleeps until `s`'s queued work is done, then runs pool release rules.
pub fn stream_synchronize(s: CUstream, ptsz: bool) -> R<()> {
    let p = cu()?;
    let (deadline, ord) = {
        let mut g = p.lock();
        capture::unsafe_call(&mut g)?;
        let r = resolve(&g, s, ptsz)?;
        (earliest(&g, r), g.ctxs[&r.ctx(&g)].ord)
    };
    sleep_until(deadline);
    crate::ops::pool::on_sync(p, ord);
    Ok(())
}

pub fn stream_query(s: CUstream, ptsz: bool) -> R<()> {
    let p = cu()?;
    let mut g = p.lock();
    capture::unsafe_call(&mut g)?;
    let r = resolve(&g, s, ptsz)?;
    if earliest(&g, r) > now_ns() { Err(CUDA_ERROR_NOT_READY) } else { Ok(()) }
}

pub fn stream_wait_event(s: CUstream, e: CUevent, _flags: u32, ptsz: bool) -> R<()> {
    let p = cu()?;
    let mut g = p.lock();
    let r = resolve(&g, s, ptsz)?;
    let t = g.events.get(&(e as u64)).ok_or(CUDA_ERROR_INVALID_HANDLE)?.time.unwrap_or(0);
    set_tail(&mut g, r, t);
    Ok(())
}

pub fn stream_get_priority(s: CUstream, out: *mut i32, ptsz: bool) -> R<()> {
    let p = cu()?;
    let g = p.lock();
    let v = match resolve(&g, s, ptsz)? {
        SRef::User(h) => g.streams[&h].priority,
        _ => 0,
    };
    write(out, v)
}

pub fn stream_get_flags(s: CUstream, out: *mut u32, ptsz: bool) -> R<()> {
    let p = cu()?;
    let g = p.lock();
    let v = match resolve(&g, s, ptsz)? {
        SRef::User(h) => g.streams[&h].flags,
        _ => 0,
    };
    write(out, v)
}

pub fn stream_get_ctx(s: CUstream, out: *mut CUcontext, ptsz: bool) -> R<()> {
    let p = cu()?;
    let g = p.lock();
    let r = resolve(&g, s, ptsz)?;
    write(out, r.ctx(&g) as CUcontext)
}

pub fn stream_get_id(s: CUstream, out: *mut u64, ptsz: bool) -> R<()> {
    let p = cu()?;
    let g = p.lock();
    let id = match resolve(&g, s, ptsz)? {
        SRef::Legacy(_) => 1,
        SRef::PerThread(_) => 2,
        SRef::User(h) => h,
    };
    write(out, id)
}

/// `cuLaunchHostFunc`: runs `f(data)` once the stream's prior work is done.
/// The simulator runs it on the calling thread, sleeping until then.
pub fn launch_host_func(s: CUstream, f: CUhostFn, data: usize, ptsz: bool) -> R<()> {
    let p = cu()?;
    let f = f.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let deadline = {
        let g = p.lock();
        let r = resolve(&g, s, ptsz)?;
        earliest(&g, r)
    };
    sleep_until(deadline);
    // SAFETY: the caller gave a host function and its argument to be called
    // exactly like this (the cuLaunchHostFunc contract).
    unsafe { f(data as *mut std::ffi::c_void) };
    Ok(())
}

// --- events ---------------------------------------------------------------------

pub fn event_create(out: *mut CUevent, flags: u32) -> R<()> {
    let p = cu()?;
    if out.is_null() || flags & !(CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS) != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut g = p.lock();
    context::current(&g)?;
    let h = new_handle();
    g.events.insert(h, Event { flags, time: None });
    write(out, h as CUevent)
}

pub fn event_destroy(e: CUevent) -> R<()> {
    let p = cu()?;
    p.lock().events.remove(&(e as u64)).map(|_| ()).ok_or(CUDA_ERROR_INVALID_HANDLE)
}

/// Records `e` on `s`: it completes when the stream's prior work does.
pub fn event_record(e: CUevent, s: CUstream, ptsz: bool) -> R<()> {
    let p = cu()?;
    let mut g = p.lock();
    let r = resolve(&g, s, ptsz)?;
    let t = earliest(&g, r).max(now_ns());
    g.events.get_mut(&(e as u64)).ok_or(CUDA_ERROR_INVALID_HANDLE)?.time = Some(t);
    Ok(())
}

pub fn event_query(e: CUevent) -> R<()> {
    let p = cu()?;
    let mut g = p.lock();
    capture::unsafe_call(&mut g)?;
    let ev = g.events.get(&(e as u64)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    match ev.time {
        Some(t) if t > now_ns() => Err(CUDA_ERROR_NOT_READY),
        _ => Ok(()),
    }
}

pub fn event_synchronize(e: CUevent) -> R<()> {
    let p = cu()?;
    let (t, ord) = {
        let mut g = p.lock();
        capture::unsafe_call(&mut g)?;
        let t = g.events.get(&(e as u64)).ok_or(CUDA_ERROR_INVALID_HANDLE)?.time.unwrap_or(0);
        let ord = context::current(&g).ok().map(|c| g.ctxs[&c].ord);
        (t, ord)
    };
    sleep_until(t);
    if let Some(ord) = ord {
        crate::ops::pool::on_sync(p, ord);
    }
    Ok(())
}

pub fn event_elapsed_time(ms: *mut f32, start: CUevent, end: CUevent) -> R<()> {
    let p = cu()?;
    let g = p.lock();
    let a = g.events.get(&(start as u64)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let b = g.events.get(&(end as u64)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    if (a.flags | b.flags) & CU_EVENT_DISABLE_TIMING != 0 {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    let (Some(ta), Some(tb)) = (a.time, b.time) else { return Err(CUDA_ERROR_INVALID_HANDLE) };
    if ta.max(tb) > now_ns() {
        return Err(CUDA_ERROR_NOT_READY);
    }
    write(ms, (tb as f64 - ta as f64) as f32 / 1e6)
}

/// Stream capture status (`CUstreamCaptureStatus`: 0 none, 1 active, 2 invalidated).
pub fn is_capturing(s: CUstream, out: *mut u32, ptsz: bool) -> R<()> {
    let p = cu()?;
    let g = p.lock();
    let v = capture::status(&g, resolve(&g, s, ptsz)?);
    write(out, v)
}

/// `cuStreamGetCaptureInfo` (all versions): status and id; graph and
/// dependencies (v2+) are reported as null / 0.
pub fn get_capture_info(
    s: CUstream,
    status: *mut u32,
    id: *mut u64,
    graph: *mut CUgraph,
    deps: *mut *const CUgraphNode,
    ndeps: *mut usize,
    ptsz: bool,
) -> R<()> {
    let p = cu()?;
    let g = p.lock();
    let r = resolve(&g, s, ptsz)?;
    let cap = capture::of(&g, r).map(|c| c.graph);
    write(status, capture::status(&g, r))?;
    write_opt(id, cap.unwrap_or(0));
    write_opt(graph, cap.unwrap_or(0) as CUgraph);
    write_opt(deps, std::ptr::null());
    write_opt(ndeps, 0);
    Ok(())
}
