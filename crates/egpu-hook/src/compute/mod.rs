//! Compute isolation in the hook: every launch entry point asks the
//! slice's arbiter gate before calling the driver, and every gated launch is
//! measured with events on its own stream. Design: `docs/compute-arbiter.md`.
//!
//! Contract:
//!
//! - **Gate.** [`admit`] runs `egpu_arbiter::ProcGate::before_launch` for the
//!   launch's slice device against the limits region's allowance and queue
//!   bounds: `Go` launches; `Drain` waits for this thread's oldest launch
//!   on that device (its completion event); `WaitUntil` sleeps to the next
//!   period and counts the wait (`throttle_waits`, `throttled_ns`). A thread
//!   can only reap its own launches (its event rings), so the gate is told
//!   how many of the process's unfinished launches are the thread's own
//!   (`ProcGate::before_launch_by`, counted in [`OWN`]) and never asks it to
//!   drain another thread's: one that stopped calling CUDA keeps its
//!   launches unreaped, and the thread waiting on them used to launch one
//!   kernel per period.
//! - **Peers.** The gate also counts the unfinished work the slice's other
//!   processes publish in their usage records, and this process publishes
//!   its own ([`publish`]: thread by thread, leaving out threads silent for
//!   two periods). A launch is counted, and published, when it is admitted,
//!   before the driver call (taken back if the driver refuses it), and a
//!   wait for the allowance beside other active processes ends at a random
//!   moment within a 40th of a period, so that they do not all wake at the
//!   tick and each see the others with nothing unfinished.
//! - **No arbiter** (`arbiter_period_ns == 0`): nothing is gated or
//!   measured; the launch costs one extra atomic load.
//! - **Stream capture.** A launch on a stream that is being captured into a
//!   graph is recorded, not run, so it is not gated (nor is an event
//!   recorded on that stream, which would become part of the graph). While
//!   any capture of the process is in progress, every other launch is still
//!   gated, and the gate's own event calls run in the thread's *relaxed*
//!   capture mode (`cuThreadExchangeStreamCaptureMode`, restored after), so
//!   an event query cannot invalidate a capture begun in the global or
//!   thread-local mode. A driver without that call gets the old rule: no
//!   gating while a capture is in progress.
//! - **Measurement.** [`after`] records a pooled timing event on the
//!   launching stream (by default when the stream's last event is ≥ 50 µs
//!   old or 64 launches back, so every launch of a kernel longer than 50 µs;
//!   every N with `EGPU_HOOK_EVENT_EVERY=N`; and always when the gate is
//!   close to a queue bound or to the allowance), and completed events are reaped, without
//!   blocking, at later launches and after `cuStreamSynchronize`,
//!   `cuCtxSynchronize` and `cuEventSynchronize`. A completed event charges
//!   `end_k − max(end_{k−1}, submit_k)` to the slice's `consumed_ns` and the
//!   process's `gpu_time_ns` (see [`streams`]).
//! - **Cost.** The fast path (budget left, queue short) is a clock read
//!   (vDSO), thread-local lookups, the gate's relaxed loads (one more per
//!   record of the slice in use), two atomic adds, a few plain stores and
//!   the event record: no system call, no lock, no allocation.
//! - **Robustness.** State is per process (`GATES`, atomics) and per thread
//!   (event rings); a fork child resets both; no thread is started; the
//!   detour runner catches panics.

pub mod drv;
pub mod publish;
pub mod streams;

use crate::state::Slice;
use egpu_abi::{MAX_DEVICES, ProcRecord};
use egpu_arbiter::{Decision, GateView, ProcGate};
use egpu_cuda::{CU_STREAM_LEGACY, CU_STREAM_PER_THREAD, CUresult, CUstream};
use std::cell::{Cell, RefCell};
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64};
use streams::{Done, Table};

/// This process's gate per slice device.
static GATES: [ProcGate; MAX_DEVICES] = [const { ProcGate::new() }; MAX_DEVICES];
/// Stream captures in progress in this process, counted from just before
/// the driver is asked to begin one.
static CAPTURES: AtomicI64 = AtomicI64::new(0);
/// The gate's event queries under way that began in their thread's own
/// capture mode, because no capture was counted then ([`query`]). A
/// capture's begin waits for them ([`capture_starting`]).
static UNGUARDED: AtomicI64 = AtomicI64::new(0);
/// The longest a capture's begin waits for [`UNGUARDED`] queries to end.
/// One query does not block (microseconds); the bound only keeps a stuck
/// driver call from holding the begin up for ever.
const UNGUARDED_WAIT_NS: u64 = 10_000_000;
/// Bumped in a fork child: thread tables of another generation are forgotten.
static FORK_GEN: AtomicU64 = AtomicU64::new(0);
/// Record an event every this many launches (`EGPU_HOOK_EVENT_EVERY`), or
/// [`ADAPTIVE`] (the default); 0: not read yet.
static EVERY: AtomicU32 = AtomicU32::new(0);
/// Default sampling: an event when the stream's last one was recorded at
/// least [`EVENT_GAP_NS`] ago, after [`MAX_BATCH`] launches, and always near a
/// bound. Kernels longer than the gap get an event each (nothing changes for
/// them); a tight loop of short launches pays one event (≈ 0.5 µs on the
/// simulated driver) per 50 µs, i.e. ≤ 1% of its time, and an event covers
/// launches submitted within 50 µs of each other, so a gap inside a batch
/// charged as busy is at most 50 µs (reconciliation corrects the rest).
const ADAPTIVE: u32 = u32::MAX;
const EVENT_GAP_NS: u64 = 50_000;
const MAX_BATCH: u32 = 64;

struct Local(RefCell<Table>);

impl Drop for Local {
    fn drop(&mut self) {
        let t = self.0.get_mut();
        if t.gen_ == FORK_GEN.load(Relaxed) {
            t.forfeit_all(&mut complete);
        }
        publish::thread_exit();
    }
}

thread_local! {
    static TABLE: Local = const { Local(RefCell::new(Table::new())) };
    /// This thread's unfinished gated launches per slice device: those it
    /// can drain. Counted at [`after`], discounted by [`complete`] (which
    /// only the owning thread's table calls).
    static OWN: [Cell<u64>; MAX_DEVICES] = const { [const { Cell::new(0) }; MAX_DEVICES] };
    /// Whether a [`CaptureSafe`] has this thread in the relaxed capture mode now.
    static RELAXED_NOW: Cell<bool> = const { Cell::new(false) };
}

/// CLOCK_MONOTONIC, ns (vDSO: no system call).
#[inline]
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid out-pointer; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn sleep_until(t: u64) {
    let ts = libc::timespec { tv_sec: (t / 1_000_000_000) as libc::time_t, tv_nsec: (t % 1_000_000_000) as libc::c_long };
    // SAFETY: ts is valid; a null remainder is allowed with TIMER_ABSTIME.
    while unsafe { libc::clock_nanosleep(libc::CLOCK_MONOTONIC, libc::TIMER_ABSTIME, &ts, std::ptr::null_mut()) } == libc::EINTR {}
}

/// Sleeps until `t` (CLOCK_MONOTONIC ns), or until another process rings
/// `bell` ([`futex_wake`]) after it held `seen`. The bell lives in the
/// slice's usage file, mapped shared by every process of the slice, so the
/// futex is a shared one (no `FUTEX_PRIVATE_FLAG`). `seen` is what the gate
/// read before it decided, so a ring after that (by a peer that saw this
/// process waiting) returns at once (`EAGAIN`); a signal or a spurious
/// wake-up returns early: the caller asks the gate again either way.
fn futex_wait_until(bell: &AtomicU32, seen: u32, t: u64) {
    let left = t.saturating_sub(monotonic_ns());
    if left == 0 {
        return;
    }
    let ts = libc::timespec { tv_sec: (left / 1_000_000_000) as libc::time_t, tv_nsec: (left % 1_000_000_000) as libc::c_long };
    // SAFETY: the bell is an aligned u32 that outlives the call (the mapped
    // usage file); FUTEX_WAIT only reads it, and ts is valid for the call.
    unsafe { libc::syscall(libc::SYS_futex, bell.as_ptr(), libc::FUTEX_WAIT, seen, &ts as *const libc::timespec, std::ptr::null::<u32>(), 0) };
}

/// Wakes the threads asleep on `bell` in [`futex_wait_until`] (the gate
/// has already changed the bell's value): all of them, as threads of one
/// process share the bell and one may wait on another device.
fn futex_wake(bell: &AtomicU32) {
    // SAFETY: as in futex_wait_until; FUTEX_WAKE reads nothing through the pointer but its address.
    unsafe { libc::syscall(libc::SYS_futex, bell.as_ptr(), libc::FUTEX_WAKE, i32::MAX, std::ptr::null::<libc::timespec>(), std::ptr::null::<u32>(), 0) };
}

fn every() -> u32 {
    match EVERY.load(Relaxed) {
        0 => {
            let n = std::env::var("EGPU_HOOK_EVENT_EVERY").ok().and_then(|v| v.trim().parse::<u32>().ok()).map_or(ADAPTIVE, |n| n.clamp(1, streams::RING as u32));
            EVERY.store(n, Relaxed);
            n
        }
        n => n,
    }
}

/// The gate's words for slice device `dev`, with the slice's process
/// records (this process publishes its unfinished work in its own, once it
/// has claimed one).
pub fn view(s: &'static Slice, dev: usize) -> GateView<'static> {
    let l = s.limits.region();
    let own = s.slot().ok().map(|sl| sl.index);
    let mut v = GateView::from_tables(l, s.usage.region(), dev, l.devices[dev].compute_limit_bps.load(Relaxed), own);
    if let Some(p) = &mut v.peers {
        // Published thread by thread ([`publish`]), not by the gate.
        p.publish = false;
    }
    v
}

/// This process's usage record, as [`view`] found it.
fn own_record(v: &GateView<'static>) -> Option<&'static ProcRecord> {
    v.peers.and_then(|p| p.own_record())
}

/// Accounts a reaped event (or launches given up at their estimate).
fn complete(d: Done) {
    let Ok(s) = crate::state::slice() else { return };
    if d.dev >= s.uuids.len() {
        return;
    }
    // A thread-local destructor (thread exit) may run after OWN's.
    let _ = OWN.try_with(|o| o[d.dev].set(o[d.dev].get().saturating_sub(u64::from(d.n.max(1)))));
    let v = view(s, d.dev);
    let rec = own_record(&v);
    GATES[d.dev].completed_n(&v, u64::from(d.n.max(1)), d.est, d.measured, rec.map(|r| &r.gpu_time_ns[d.dev]));
    publish::sub(v.peers.as_ref(), d.dev, d.est, monotonic_ns(), GATES[d.dev].inflight_ns());
}

/// The stream a launch really went to: stream 0 is the per-thread default
/// stream for `_ptsz` entry points and the legacy stream otherwise.
#[inline]
fn normalise(stream: CUstream, ptsz: bool) -> usize {
    match stream as usize {
        0 if ptsz => CU_STREAM_PER_THREAD,
        0 => CU_STREAM_LEGACY,
        s => s,
    }
}

/// A launch the gate let through, counted as unfinished (and published to
/// the slice's other processes) from before the driver call: a peer that
/// decides in between sees it.
#[derive(Debug, Clone, Copy)]
pub struct Ticket {
    dev: usize,
    key: usize,
    submit: u64,
    /// What [`ProcGate::launched`] returned.
    est: u64,
    /// The slice's other processes' unfinished work the gate saw, ns.
    peers: u64,
}

fn with_table<R>(f: impl FnOnce(&mut Table) -> R) -> R {
    TABLE.with(|l| {
        let mut t = l.0.borrow_mut();
        t.check_fork(FORK_GEN.load(Relaxed));
        f(&mut t)
    })
}

/// While a stream capture of the process is in progress: the calling
/// thread in the relaxed capture mode, its own mode restored on drop.
struct CaptureSafe(Option<u32>);

impl CaptureSafe {
    /// Relaxed mode if a capture is in progress. `None`: one is, and the
    /// driver cannot change the mode (the gate must not make its calls).
    fn enter() -> Option<CaptureSafe> {
        if CAPTURES.load(Relaxed) <= 0 {
            return Some(CaptureSafe(None));
        }
        Self::switch()
    }

    /// Relaxed mode now, whether or not a capture is counted. `None`: the
    /// driver cannot change the mode. Not nested: callers inside a
    /// section check [`RELAXED_NOW`] first.
    fn switch() -> Option<CaptureSafe> {
        let old = drv::exchange_capture_mode(egpu_cuda::CU_STREAM_CAPTURE_MODE_RELAXED)?;
        RELAXED_NOW.with(|r| r.set(true));
        Some(CaptureSafe(Some(old)))
    }
}

impl Drop for CaptureSafe {
    fn drop(&mut self) {
        if let Some(old) = self.0 {
            RELAXED_NOW.with(|r| r.set(false));
            let _ = drv::exchange_capture_mode(old);
        }
    }
}

/// `cuEventQuery` on one of the gate's events. A query is one of the calls
/// a global-mode capture forbids to every thread of the process, and a
/// section of the gate may have started (and read "no capture") before
/// another thread began one. So a query that finds no capture counted is
/// counted as [`UNGUARDED`] while it runs, and a capture's begin waits for
/// those ([`capture_starting`]); one that finds a capture counted runs in
/// the relaxed mode. The two sides' sequentially consistent counter and
/// check make sure that at least one of them sees the other.
pub(crate) fn query(e: usize) -> egpu_cuda::CUresult {
    if RELAXED_NOW.with(Cell::get) {
        return drv::query(e);
    }
    UNGUARDED.fetch_add(1, SeqCst);
    if CAPTURES.load(SeqCst) <= 0 {
        let r = drv::query(e);
        UNGUARDED.fetch_sub(1, SeqCst);
        return r;
    }
    UNGUARDED.fetch_sub(1, SeqCst);
    // A driver that cannot change the mode: the call in the thread's own, as before.
    let _safe = CaptureSafe::switch();
    drv::query(e)
}

/// `cuEventSynchronize` on one of the gate's events: always in the relaxed
/// mode (a wait for the GPU, so two mode changes cost nothing next to it,
/// and a capture's begin need not wait for it; see [`query`]).
pub(crate) fn synchronize(e: usize) -> egpu_cuda::CUresult {
    let _safe = if RELAXED_NOW.with(Cell::get) { None } else { CaptureSafe::switch() };
    drv::synchronize(e)
}

/// Whether a launch on the stream keyed `key` is captured rather than run:
/// its stream is capturing (or its capture was invalidated, so the launch
/// fails), or the driver cannot say (the legacy stream while a blocking
/// stream is captured answers `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`: the
/// launch would be refused too).
fn captured(key: usize) -> bool {
    drv::capture_status(key) != Some(egpu_cuda::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// Gates one launch on `stream` (in the current context). `Ok(None)`: not
/// gated (no arbiter, or a launch into a stream capture); call the driver
/// directly. Blocks while the slice is out of budget or the process's
/// queue is full.
#[inline]
pub fn admit(stream: CUstream, ptsz: bool) -> Result<Option<Ticket>, CUresult> {
    let s = crate::state::slice()?;
    if s.limits.region().arbiter_period_ns.load(Relaxed) == 0 {
        return Ok(None);
    }
    let key = normalise(stream, ptsz);
    if CAPTURES.load(Relaxed) > 0 && captured(key) {
        return Ok(None);
    }
    let Some(_safe) = CaptureSafe::enter() else { return Ok(None) };
    let dev = if s.uuids.len() == 1 { 0 } else { crate::devmap::current()?.1 };
    let v = view(s, dev);
    let g = &GATES[dev];
    let mut now = monotonic_ns();
    let fresh = egpu_arbiter::gate::peer_fresh_ns(v.period_ns.load(Relaxed));
    publish::maybe_scan(v.peers.as_ref(), now, fresh);
    with_table(|t| {
        let i = t.entry(key, dev, &monotonic_ns, &mut complete)?;
        t.entries[i].reap(now, false, &mut complete);
        let mut polled = false;
        // Set if the count of own launches disagrees with the table (there is nothing to drain).
        let mut none_own = false;
        let mut peers;
        loop {
            let own = if none_own { 0 } else { OWN.with(|o| o[dev].get()) };
            peers = v.peers_ns(v.period_ns.load(Relaxed), now);
            match g.before_launch_beside(&v, now, own, peers) {
                Decision::Go => break,
                Decision::Drain if !polled => {
                    // First look without blocking: short kernels are often
                    // done already, and a blocking wait on an event that
                    // completes a few µs from now sleeps for the kernel's
                    // timer slack (≥ 50 µs) on Linux.
                    polled = true;
                    t.reap_dev(dev, now, &mut complete);
                }
                Decision::Drain => {
                    polled = false;
                    // The gate drains only a thread with launches of its own,
                    // so this finds one; if not, the count is off and the
                    // thread is gated as one with nothing to drain.
                    none_own |= !t.drain(dev, now, &mut complete);
                }
                Decision::Yield { until, ring, bell } => {
                    // Another process of the slice has its one launch, or
                    // waited for it longer. Wake the waiter whose turn it
                    // is (the gate rang its bell), then sleep on this
                    // process's own bell: a peer that finds the launch free
                    // rings it, else look again soon (the gate says when).
                    // Not a wait for the allowance: the slice's
                    // throttle_waits (the arbiter's demand signal) are not
                    // counted, the process's throttled time is.
                    if let (Some(i), Some(p)) = (ring, v.peers.as_ref()) {
                        futex_wake(&p.records[i].turn_bell);
                    }
                    // As while waiting for the allowance: a word left too
                    // high (a silent thread's launches, racing stores) is
                    // stored right again while the process only yields.
                    publish::maybe_scan(v.peers.as_ref(), now, fresh);
                    let until = until.min(look_by(&v, now));
                    match own_record(&v) {
                        Some(r) => {
                            futex_wait_until(&r.turn_bell, bell, until);
                            r.throttled_ns[dev].fetch_add(monotonic_ns().saturating_sub(now), Relaxed);
                        }
                        // The gate yields only with a record; never spin without one.
                        None => sleep_until(until),
                    }
                }
                Decision::WaitUntil(at) => {
                    // Wake by `look_by`: a tick that comes late (the gate
                    // then says "a quarter period from now") or a resize is
                    // seen within half a millisecond. Beside other
                    // active processes of the slice, a little later, by a
                    // random part of a 40th of a period: they would all
                    // wake at the tick together, and each see the others
                    // with nothing unfinished yet.
                    // A word left too high by two threads' racing stores
                    // is stored right again while the process only waits.
                    publish::maybe_scan(v.peers.as_ref(), now, fresh);
                    let period = v.period_ns.load(Relaxed);
                    let jitter = if v.peers.is_some_and(|p| p.others_active(now, fresh)) { spread(now) % (period / 40).max(1) } else { 0 };
                    sleep_until(at.min(look_by(&v, now)).saturating_add(jitter));
                    let waited = monotonic_ns().saturating_sub(now);
                    g.waited(&v, waited, own_record(&v).map(|r| &r.throttled_ns[dev]));
                }
            }
            now = monotonic_ns();
        }
        let est = g.launched(&v);
        publish::add(v.peers.as_ref(), dev, est, now, fresh, g.inflight_ns());
        Ok(Some(Ticket { dev, key, submit: now, est, peers }))
    })
}

/// The latest moment a launch held back at `now` looks at the gate again:
/// a 20th of a period later (at least 100 µs).
fn look_by(v: &GateView<'_>, now: u64) -> u64 {
    now.saturating_add((v.period_ns.load(Relaxed) / 20).max(100_000))
}

/// A well-mixed number from `x` (SplitMix64's finaliser), for the wake-up spread.
fn spread(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// After the driver call of an admitted launch: on success, counts it and
/// records its completion event (see `ADAPTIVE`; every N launches with
/// `EGPU_HOOK_EVENT_EVERY=N`; always when near the gate's bounds).
#[inline]
pub fn after(t: Ticket, ok: bool) {
    let Ok(s) = crate::state::slice() else { return };
    let g = &GATES[t.dev];
    let v = view(s, t.dev);
    let est = t.est;
    if !ok {
        g.cancel(&v, est);
        publish::sub(v.peers.as_ref(), t.dev, est, t.submit, g.inflight_ns());
        return;
    }
    OWN.with(|o| o[t.dev].set(o[t.dev].get() + 1));
    if let Some(r) = own_record(&v) {
        r.launches[t.dev].fetch_add(1, Relaxed);
    }
    let n = every();
    let Some(_safe) = CaptureSafe::enter() else {
        complete(Done { dev: t.dev, est, measured: est, n: 1 });
        return;
    };
    with_table(|tab| {
        let Some(e) = tab.entries.iter_mut().find(|e| e.key == t.key && e.dev == t.dev) else {
            // The entry was evicted between admit and here: give it back at its estimate.
            complete(Done { dev: t.dev, est, measured: est, n: 1 });
            return;
        };
        e.add(t.submit, est);
        let (due, ahead) = if n == ADAPTIVE {
            (e.unrecorded() >= MAX_BATCH || t.submit.saturating_sub(e.last_record()) >= EVENT_GAP_NS, MAX_BATCH)
        } else {
            (e.unrecorded() >= n, n)
        };
        if !due && !near(&v, g, ahead, t.peers) {
            return;
        }
        let now = t.submit;
        if e.pending() >= streams::RING {
            e.reap_now(now, &mut complete);
            if e.pending() >= streams::RING {
                e.reap(now, true, &mut complete);
            }
        }
        e.record(now, &mut complete);
    });
}

/// Whether the gate may say no within the next `n` launches, so their
/// completion must be observable now (`peers`: the slice's other processes'
/// unfinished work the gate saw at the launch's admission).
fn near(v: &GateView<'_>, g: &ProcGate, n: u32, peers: u64) -> bool {
    let inflight = g.inflight();
    let ql = v.queue_launches.load(Relaxed);
    let qns = v.queue_ns.load(Relaxed);
    let ahead = g.mean_ns().saturating_mul(u64::from(n));
    (ql != 0 && inflight + 1 >= ql && !egpu_arbiter::gate::tiny(g.mean_ns()))
        || (qns != 0 && g.inflight_ns().saturating_add(ahead) >= qns)
        || v.consumed_ns.load(Relaxed).saturating_add(peers).saturating_add(g.inflight_ns()).saturating_add(ahead) >= v.allowance_ns.load(Relaxed)
}

/// After a synchronisation the caller waited for: reap what completed.
pub fn after_sync() {
    let Some(_safe) = CaptureSafe::enter() else { return };
    let now = monotonic_ns();
    with_table(|t| t.reap_all(now, &mut complete));
}

/// A stream capture is about to begin (undone by `capture_ended(true)` if
/// the driver refuses it). Counted first, then the gate's queries that
/// began without seeing it are waited for (at most [`UNGUARDED_WAIT_NS`]):
/// one of them made after the begin, in its thread's global mode, would
/// invalidate a global-mode capture. Every later query sees the count.
pub fn capture_starting() {
    CAPTURES.fetch_add(1, SeqCst);
    if UNGUARDED.load(SeqCst) <= 0 {
        return;
    }
    let deadline = monotonic_ns().saturating_add(UNGUARDED_WAIT_NS);
    while UNGUARDED.load(SeqCst) > 0 && monotonic_ns() < deadline {
        std::thread::yield_now();
    }
}

/// A `cuStreamEndCapture` returned (or a begin failed); `ended`: the
/// stream's capture is over.
pub fn capture_ended(ended: bool) {
    if ended {
        let _ = CAPTURES.fetch_update(Relaxed, Relaxed, |c| Some((c - 1).max(0)));
    }
}

/// Fork child: the parent's launches and captures are not ours.
pub fn reset_after_fork() {
    FORK_GEN.fetch_add(1, Relaxed);
    CAPTURES.store(0, Relaxed);
    UNGUARDED.store(0, Relaxed);
    let _ = OWN.try_with(|o| o.iter().for_each(|c| c.set(0)));
    for g in &GATES {
        g.reset();
    }
    publish::reset_after_fork();
}

/// This process's unfinished gated launches on slice device `dev` (tests, diagnostics).
pub fn inflight(dev: usize) -> u64 {
    GATES.get(dev).map_or(0, ProcGate::inflight)
}
