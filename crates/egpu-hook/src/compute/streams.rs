//! Per-thread rings of completion events, one per stream this thread
//! launches on.
//!
//! Each [`Entry`] keeps, for one (stream, slice device): a pool of timing
//! events created in the launching context, the events recorded after gated
//! launches and not yet found complete (oldest first, at most [`RING`]), the
//! launches not yet covered by an event (when events are recorded every N
//! launches), an *anchor* event whose CLOCK_MONOTONIC time is known, and the
//! stream's [`StreamClock`].
//!
//! Event *k*'s end time is `anchor_ns + cuEventElapsedTime(anchor, k)`; a
//! completed event becomes the new anchor once the elapsed time passes
//! `REANCHOR_NS`, so the `f32` milliseconds never lose precision.
//!
//! The table is thread-local, so the fast path takes no lock. A thread that
//! exits with unfinished launches charges them at their estimate (no driver
//! call from a thread destructor). A `fork` child forgets the parent's table
//! (its events belong to the parent's contexts).

use super::drv;
use egpu_arbiter::measure::StreamClock;
use egpu_cuda::{CUDA_ERROR_NOT_READY, CUresult};
use std::collections::VecDeque;

/// Events recorded and not yet reaped per entry; a full ring drains.
pub const RING: usize = 16;
/// Entries per thread; the least useful is evicted (after draining it).
const ENTRIES: usize = 16;
/// Re-anchor once an event is this far from the anchor (f32 ms keep ~1 µs).
const REANCHOR_NS: u64 = 2_000_000_000;
/// A pending event is queried at most this often on the launch path.
const MIN_CHECK_NS: u64 = 20_000;

/// One recorded event and the launches it covers.
#[derive(Debug, Clone, Copy)]
struct Pending {
    ev: usize,
    /// Submission time of the first launch it covers.
    submit: u64,
    /// Sum of the covered launches' estimates.
    est: u64,
    n: u32,
}

/// One stream (normalised handle) on one slice device, in this thread.
#[derive(Debug)]
pub struct Entry {
    pub key: usize,
    pub dev: usize,
    anchor: usize,
    anchor_ns: u64,
    clock: StreamClock,
    pending: VecDeque<Pending>,
    pool: Vec<usize>,
    /// Launches since the last recorded event.
    unrec: u32,
    unrec_submit: u64,
    unrec_est: u64,
    /// When the oldest pending event is worth querying again.
    next_check: u64,
    /// Submission time of the last launch an event was recorded after.
    last_record: u64,
    /// The stream refused our events (another context now): rebuild.
    broken: bool,
}

/// What a reaped event says: `n` launches on `dev` with summed estimate
/// `est` cost `measured` ns.
#[derive(Debug, Clone, Copy)]
pub struct Done {
    pub dev: usize,
    pub est: u64,
    pub measured: u64,
    pub n: u32,
}

impl Entry {
    /// A new entry with its anchor (blocks only if the stream is busy).
    fn new(key: usize, dev: usize, now: impl Fn() -> u64) -> Result<Entry, CUresult> {
        let anchor = drv::create()?;
        let before = now();
        let r = drv::record(anchor, key);
        if r != 0 {
            drv::destroy(anchor);
            return Err(r);
        }
        let anchor_ns = match super::query(anchor) {
            0 => before,
            CUDA_ERROR_NOT_READY => {
                let _ = super::synchronize(anchor);
                now()
            }
            e => {
                drv::destroy(anchor);
                return Err(e);
            }
        };
        Ok(Entry {
            key,
            dev,
            anchor,
            anchor_ns,
            clock: StreamClock::default(),
            pending: VecDeque::with_capacity(RING),
            pool: Vec::with_capacity(RING + 1),
            unrec: 0,
            unrec_submit: 0,
            unrec_est: 0,
            next_check: 0,
            last_record: 0,
            broken: false,
        })
    }

    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    pub fn unrecorded(&self) -> u32 {
        self.unrec
    }

    /// When the last event was recorded (CLOCK_MONOTONIC ns; 0: never).
    pub fn last_record(&self) -> u64 {
        self.last_record
    }

    /// Counts one launch; it is covered by the next recorded event.
    pub fn add(&mut self, submit: u64, est: u64) {
        if self.unrec == 0 {
            self.unrec_submit = submit;
        }
        self.unrec += 1;
        self.unrec_est += est;
    }

    /// Records an event covering the unrecorded launches. On failure the
    /// launches are returned as done at their estimate and the entry is
    /// marked broken (rebuilt at the next launch).
    pub fn record(&mut self, now: u64, out: &mut impl FnMut(Done)) {
        if self.unrec == 0 {
            return;
        }
        let p = Pending { ev: 0, submit: self.unrec_submit, est: self.unrec_est, n: self.unrec };
        self.last_record = now;
        self.unrec = 0;
        self.unrec_est = 0;
        let ev = match self.pool.pop() {
            Some(e) => Ok(e),
            None => drv::create(),
        };
        let ok = match ev {
            Ok(ev) => {
                if drv::record(ev, self.key) == 0 {
                    if self.pending.is_empty() {
                        self.next_check = now.saturating_add(p.est.max(MIN_CHECK_NS));
                    }
                    self.pending.push_back(Pending { ev, ..p });
                    true
                } else {
                    drv::destroy(ev);
                    false
                }
            }
            Err(_) => false,
        };
        if !ok {
            self.broken = true;
            out(Done { dev: self.dev, est: p.est, measured: p.est, n: p.n });
        }
    }

    /// Pops completed events, oldest first. `block`: wait for the oldest.
    pub fn reap(&mut self, now: u64, block: bool, out: &mut impl FnMut(Done)) {
        if self.pending.is_empty() || (!block && now < self.next_check) {
            return;
        }
        let mut first = true;
        while let Some(&p) = self.pending.front() {
            let r = if block && first { super::synchronize(p.ev) } else { super::query(p.ev) };
            first = false;
            if r == CUDA_ERROR_NOT_READY {
                self.next_check = now.saturating_add((p.est / p.n.max(1) as u64 / 2).max(MIN_CHECK_NS));
                return;
            }
            self.pending.pop_front();
            let end = if r == 0 { drv::elapsed_ns(self.anchor, p.ev).map(|e| self.anchor_ns.saturating_add(e)) } else { None };
            let measured = match end {
                Some(end) => {
                    let m = self.clock.attribute(p.submit, end);
                    if end.saturating_sub(self.anchor_ns) > REANCHOR_NS {
                        let old = std::mem::replace(&mut self.anchor, p.ev);
                        self.anchor_ns = end;
                        self.pool.push(old);
                    } else {
                        self.pool.push(p.ev);
                    }
                    m
                }
                None => {
                    // A stale or failed event: charge the estimate, drop the event.
                    drv::destroy(p.ev);
                    self.broken |= r != 0;
                    p.est
                }
            };
            out(Done { dev: self.dev, est: p.est, measured, n: p.n });
        }
    }

    /// Non-blocking reap now, whatever the next check time.
    pub fn reap_now(&mut self, now: u64, out: &mut impl FnMut(Done)) {
        self.next_check = 0;
        self.reap(now, false, out);
    }

    /// Everything this entry still owes, at its estimate (thread exit, eviction of a broken entry).
    fn forfeit(&mut self, out: &mut impl FnMut(Done)) {
        for p in self.pending.drain(..) {
            out(Done { dev: self.dev, est: p.est, measured: p.est, n: p.n });
        }
        if self.unrec > 0 {
            out(Done { dev: self.dev, est: self.unrec_est, measured: self.unrec_est, n: self.unrec });
            self.unrec = 0;
            self.unrec_est = 0;
        }
    }

    fn destroy_events(&mut self) {
        for e in self.pool.drain(..).chain(self.pending.drain(..).map(|p| p.ev)).chain(std::iter::once(self.anchor)) {
            drv::destroy(e);
        }
    }
}

/// This thread's entries.
#[derive(Debug, Default)]
pub struct Table {
    /// The fork generation the entries belong to.
    pub gen_: u64,
    pub entries: Vec<Entry>,
}

impl Table {
    pub const fn new() -> Table {
        Table { gen_: 0, entries: Vec::new() }
    }

    /// Forgets a fork parent's entries (no driver call: they are not ours).
    pub fn check_fork(&mut self, gen_: u64) {
        if self.gen_ != gen_ {
            std::mem::forget(std::mem::take(&mut self.entries));
            self.gen_ = gen_;
        }
    }

    /// The entry of (key, dev), created if needed. Broken entries are
    /// rebuilt; a full table evicts an idle entry, or drains one.
    pub fn entry(&mut self, key: usize, dev: usize, now: &impl Fn() -> u64, out: &mut impl FnMut(Done)) -> Result<usize, CUresult> {
        if let Some(i) = self.entries.iter().position(|e| e.key == key && e.dev == dev) {
            if !self.entries[i].broken {
                return Ok(i);
            }
            let mut e = self.entries.swap_remove(i);
            e.forfeit(out);
            e.destroy_events();
        }
        if self.entries.len() >= ENTRIES {
            let i = self.entries.iter().position(|e| e.pending.is_empty() && e.unrec == 0).unwrap_or(0);
            let mut e = self.entries.swap_remove(i);
            e.record(now(), out);
            while !e.pending.is_empty() {
                e.reap(now(), true, out);
            }
            e.forfeit(out);
            e.destroy_events();
        }
        let e = Entry::new(key, dev, now)?;
        self.entries.push(e);
        Ok(self.entries.len() - 1)
    }

    /// Non-blocking reap of this thread's entries on `dev`, whatever their
    /// next check time.
    pub fn reap_dev(&mut self, dev: usize, now: u64, out: &mut impl FnMut(Done)) {
        for e in self.entries.iter_mut().filter(|e| e.dev == dev) {
            e.reap_now(now, out);
        }
    }

    /// Non-blocking reap of every entry (after a synchronisation).
    pub fn reap_all(&mut self, now: u64, out: &mut impl FnMut(Done)) {
        for e in &mut self.entries {
            e.reap_now(now, out);
        }
    }

    /// Waits for this thread's oldest launch on `dev` (recording an event
    /// for uncovered launches first). False when this thread has none.
    pub fn drain(&mut self, dev: usize, now: u64, out: &mut impl FnMut(Done)) -> bool {
        let oldest = |t: &Table| {
            t.entries.iter().enumerate().filter(|(_, e)| e.dev == dev && !e.pending.is_empty()).min_by_key(|(_, e)| e.pending[0].submit).map(|(i, _)| i)
        };
        if oldest(self).is_none() {
            for e in self.entries.iter_mut().filter(|e| e.dev == dev) {
                e.record(now, out);
            }
        }
        match oldest(self) {
            Some(i) => {
                self.entries[i].reap(now, true, out);
                true
            }
            None => false,
        }
    }

    /// Thread exit: everything unfinished is charged at its estimate.
    pub fn forfeit_all(&mut self, out: &mut impl FnMut(Done)) {
        for e in &mut self.entries {
            e.forfeit(out);
        }
    }
}
