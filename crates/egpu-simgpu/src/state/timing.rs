//! The kernel time model on the shared state.
//!
//! A device runs the kernels of every process one after another. A launch
//! that may start at `earliest` (its stream's tail, or now) starts at
//! `max(earliest, busy_until)` and ends `duration` later; `busy_until` moves
//! forward by CAS, so launches from all processes form one queue, in the
//! order their CASes succeed. Times are CLOCK_MONOTONIC nanoseconds, which
//! are the same for every process on the machine.
//!
//! Executed time: [`Slot::busy`](super::Slot) counts a kernel when it is
//! queued, but device accounting (NVML's per-process utilisation, which
//! `egpud` reconciles against) counts what has run. Each device keeps a log
//! of its last [`NSPANS`] kernels (end, duration, owner);
//! [`Shared::executed`] is a process's queued time minus the part of its
//! logged kernels that lies after `now`. A kernel is logged before it is
//! added to `busy`, and readers read `busy` first, so a reader that sees a
//! kernel in `busy` sees its span (a kernel logged in between is subtracted
//! without being in `busy`: executed time dips, never runs ahead). The log
//! is per device, shared by all processes: when more than [`NSPANS`]
//! kernels of all processes together are queued on a device, the oldest
//! pending ones (of whichever process) are counted as run early.
//!
//! Utilisation: each device has a ring of [`NBUCKETS`] 100 ms buckets, each
//! an atomic `(epoch << 28) | busy_ns`. A kernel adds its overlap with each
//! bucket it spans (kernels queued more than ~2 s ahead are not counted).
//! [`Shared::utilization`] is the busy fraction of the last ten whole
//! buckets, i.e. the last second, lagging by up to 100 ms.

use super::{NBUCKETS, NSPANS, Shared};
use std::sync::atomic::Ordering::SeqCst;

pub const BUCKET_NS: u64 = 100_000_000;
/// The `owner` word of a logged kernel: its process's slot and pid (a slot
/// reused by another process does not inherit the spans).
pub fn span_owner(slot: usize, pid: u32) -> u64 {
    (slot as u64) << 32 | u64::from(pid)
}

/// Ended log entries in a row after which [`Shared::pending_spans`] stops.
const SETTLED_RUN: u32 = 64;
const BUSY_BITS: u32 = 28;
const BUSY_MASK: u64 = (1 << BUSY_BITS) - 1;
/// Whole buckets in the utilisation window (1 s).
const WINDOW: u64 = 10;

/// CLOCK_MONOTONIC now, ns.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid out-pointer; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Sleeps (no spinning) until CLOCK_MONOTONIC reaches `deadline` ns.
pub fn sleep_until(deadline: u64) {
    let ts = libc::timespec { tv_sec: (deadline / 1_000_000_000) as libc::time_t, tv_nsec: (deadline % 1_000_000_000) as libc::c_long };
    loop {
        // SAFETY: ts is a valid timespec; a null remainder is allowed with
        // TIMER_ABSTIME.
        let r = unsafe { libc::clock_nanosleep(libc::CLOCK_MONOTONIC, libc::TIMER_ABSTIME, &ts, std::ptr::null_mut()) };
        if r != libc::EINTR {
            return;
        }
    }
}

impl Shared {
    /// Queues a kernel of `dur` ns on `dev` that may start no earlier than
    /// `earliest`, charged to `slot`. Returns `(start, end)`.
    pub fn schedule(&self, slot: usize, dev: usize, earliest: u64, dur: u64, now: u64) -> (u64, u64) {
        let d = &self.devs[dev];
        let mut cur = d.busy_until.load(SeqCst);
        let (start, end) = loop {
            let start = earliest.max(cur);
            let end = start.saturating_add(dur);
            match d.busy_until.compare_exchange_weak(cur, end, SeqCst, SeqCst) {
                Ok(_) => break (start, end),
                Err(actual) => cur = actual,
            }
        };
        self.log_span(slot, dev, end, dur);
        d.busy_total.fetch_add(dur, SeqCst);
        self.slots[slot].busy[dev].fetch_add(dur, SeqCst);
        self.record_busy(dev, start, end, now);
        (start, end)
    }

    fn log_span(&self, slot: usize, dev: usize, end: u64, dur: u64) {
        let d = &self.devs[dev];
        let n = d.span_cursor.fetch_add(1, SeqCst);
        let e = &d.spans[(n % NSPANS as u64) as usize];
        let who = span_owner(slot, self.slot_owner(slot).0);
        e.seq.store(2 * n + 1, SeqCst);
        e.end.store(end, SeqCst);
        e.dur.store(dur, SeqCst);
        e.owner.store(who, SeqCst);
        e.seq.store(2 * n + 2, SeqCst);
    }

    /// Kernel time of `slot` on `dev` that has run by `now` (CLOCK_MONOTONIC
    /// ns): its queued time less what of its logged kernels lies after `now`.
    /// Monotonic in `now` for one process except while a kernel is being
    /// logged (its span may be subtracted before it is in `busy`: a brief
    /// dip).
    pub fn executed(&self, slot: usize, dev: usize, now: u64) -> u64 {
        let queued = self.slots[slot].busy[dev].load(SeqCst);
        let owner = span_owner(slot, self.slot_owner(slot).0);
        let mut pending = 0;
        self.pending_spans(dev, now, |who, ns| {
            if who == owner {
                pending += ns;
            }
        });
        queued.saturating_sub(pending)
    }

    /// Calls `f(owner, ns)` for every logged kernel of `dev` with `ns` of it
    /// still to run after `now`, newest first. The log is in queue order but
    /// for launches racing between their CAS and their log entry, so the
    /// walk stops after [`SETTLED_RUN`] entries in a row that have ended.
    pub fn pending_spans(&self, dev: usize, now: u64, mut f: impl FnMut(u64, u64)) {
        let d = &self.devs[dev];
        let cursor = d.span_cursor.load(SeqCst);
        let mut settled = 0;
        for n in (cursor.saturating_sub(NSPANS as u64)..cursor).rev() {
            let e = &d.spans[(n % NSPANS as u64) as usize];
            let seq = e.seq.load(SeqCst);
            let (end, dur, who) = (e.end.load(SeqCst), e.dur.load(SeqCst), e.owner.load(SeqCst));
            if seq != 2 * n + 2 || e.seq.load(SeqCst) != seq {
                continue; // being written, or already overwritten
            }
            if end > now {
                settled = 0;
                f(who, dur.min(end - now));
            } else {
                settled += 1;
                if settled >= SETTLED_RUN {
                    break;
                }
            }
        }
    }

    fn record_busy(&self, dev: usize, start: u64, end: u64, now: u64) {
        if end <= start {
            return;
        }
        let last_allowed = now / BUCKET_NS + (NBUCKETS as u64 - WINDOW - 1);
        let mut e = start / BUCKET_NS;
        while e * BUCKET_NS < end && e <= last_allowed {
            let lo = start.max(e * BUCKET_NS);
            let hi = end.min((e + 1) * BUCKET_NS);
            let add = hi - lo;
            let b = &self.devs[dev].buckets[(e % NBUCKETS as u64) as usize];
            let _ = b.fetch_update(SeqCst, SeqCst, |w| {
                let (be, busy) = (w >> BUSY_BITS, w & BUSY_MASK);
                if be == e {
                    Some(e << BUSY_BITS | (busy + add).min(BUSY_MASK))
                } else if be < e {
                    Some(e << BUSY_BITS | add.min(BUSY_MASK))
                } else {
                    None // the slot already holds a later bucket
                }
            });
            e += 1;
        }
    }

    /// Busy percentage of `dev` over the last second before `now`.
    pub fn utilization(&self, dev: usize, now: u64) -> u32 {
        let cur = now / BUCKET_NS;
        let mut busy = 0;
        for e in cur.saturating_sub(WINDOW)..cur {
            let w = self.devs[dev].buckets[(e % NBUCKETS as u64) as usize].load(SeqCst);
            if w >> BUSY_BITS == e {
                busy += w & BUSY_MASK;
            }
        }
        (busy * 100 / (WINDOW * BUCKET_NS)).min(100) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::fresh;
    use super::*;

    #[test]
    fn launches_queue_one_after_another() {
        let s = fresh(2, 1);
        let (a, b) = (0, 1);
        let t0 = 1_000 * BUCKET_NS;
        assert_eq!(s.schedule(a, 0, t0, 500, t0), (t0, t0 + 500));
        // Another process's kernel that could start at once waits for the first.
        assert_eq!(s.schedule(b, 0, t0 + 10, 300, t0), (t0 + 500, t0 + 800));
        // A stream whose tail is later starts at its tail.
        assert_eq!(s.schedule(a, 0, t0 + 2_000, 100, t0), (t0 + 2_000, t0 + 2_100));
        // Other devices are independent.
        assert_eq!(s.schedule(b, 1, t0, 50, t0), (t0, t0 + 50));
        assert_eq!(s.devs[0].busy_total.load(SeqCst), 900);
        assert_eq!(s.slots[a].busy[0].load(SeqCst), 600);
        assert_eq!(s.slots[b].busy[0].load(SeqCst), 300);
    }

    #[test]
    fn executed_time_follows_the_queue_not_the_launch() {
        let s = fresh(2, 1);
        s.slots[0].owner.store(7 << 8 | 2, SeqCst);
        s.slots[1].owner.store(8 << 8 | 2, SeqCst);
        let t0 = 1_000 * BUCKET_NS;
        s.schedule(0, 0, t0, 500, t0); // a: t0..t0+500
        s.schedule(1, 0, t0, 300, t0); // b: t0+500..t0+800
        s.schedule(0, 0, t0, 200, t0); // a: t0+800..t0+1000
        // Before anything ran, nothing has been executed although 1000 ns are queued.
        assert_eq!((s.executed(0, 0, t0), s.executed(1, 0, t0)), (0, 0));
        // Half-way through a's first kernel.
        assert_eq!((s.executed(0, 0, t0 + 250), s.executed(1, 0, t0 + 250)), (250, 0));
        // During b's kernel a has run 500 and waits behind it.
        assert_eq!((s.executed(0, 0, t0 + 600), s.executed(1, 0, t0 + 600)), (500, 100));
        assert_eq!((s.executed(0, 0, t0 + 900), s.executed(1, 0, t0 + 900)), (600, 300));
        // Afterwards executed equals queued.
        assert_eq!((s.executed(0, 0, t0 + 5_000), s.executed(1, 0, t0 + 5_000)), (700, 300));
        // Another device's log is separate.
        assert_eq!(s.executed(0, 1, t0 + 5_000), 0);
    }

    #[test]
    fn a_reused_slot_is_not_charged_its_previous_owners_pending_kernels() {
        let s = fresh(1, 1);
        s.slots[0].owner.store(7 << 8 | 2, SeqCst);
        let t0 = 2_000 * BUCKET_NS;
        s.schedule(0, 0, t0, 1_000, t0);
        // The owner dies, the slot is reclaimed and claimed by pid 9.
        s.slots[0].busy[0].store(0, SeqCst);
        s.slots[0].owner.store(9 << 8 | 2, SeqCst);
        s.schedule(0, 0, t0, 100, t0); // queued behind the dead process's kernel
        assert_eq!(s.executed(0, 0, t0 + 500), 0);
        assert_eq!(s.executed(0, 0, t0 + 1_050), 50);
    }

    #[test]
    fn concurrent_launches_never_overlap() {
        let s = fresh(1, 1);
        let t0 = 5_000 * BUCKET_NS;
        let mut spans: Vec<(u64, u64)> = std::thread::scope(|sc| {
            let hs: Vec<_> =
                (0..4).map(|t| sc.spawn(move || (0..200).map(|_| s.schedule(t, 0, t0, 7, t0)).collect::<Vec<_>>())).collect();
            hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
        });
        spans.sort();
        for w in spans.windows(2) {
            assert!(w[0].1 <= w[1].0, "{:?} overlaps {:?}", w[0], w[1]);
        }
        assert_eq!(spans.last().unwrap().1, t0 + 800 * 7, "no gaps either");
    }

    #[test]
    fn utilization_counts_the_last_second() {
        let s = fresh(1, 1);
        let t0 = 10_000 * BUCKET_NS;
        // Busy 250 ms spread over three buckets, inside the window at t0+1s.
        s.schedule(0, 0, t0 + 50_000_000, 250_000_000, t0);
        assert_eq!(s.utilization(0, t0 + 1_000_000_000), 25);
        // 2 s later the window has moved past it.
        assert_eq!(s.utilization(0, t0 + 3_000_000_000), 0);
        // A saturated second reads 100%.
        let s = fresh(1, 1);
        s.schedule(0, 0, t0, 1_000_000_000, t0);
        assert_eq!(s.utilization(0, t0 + 1_000_000_000), 100);
        // Work queued far in the future is not recorded in the ring.
        let s = fresh(1, 1);
        s.schedule(0, 0, t0 + 60_000_000_000, 1_000, t0);
        assert_eq!(s.utilization(0, t0 + 60_500_000_000), 0);
    }
}
