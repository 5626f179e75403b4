//! The launch gate, run by the hook before every kernel or graph launch.
//!
//! A [`GateView`] borrows the slice-table words of one slice device (it can be
//! built from the mapped regions with [`GateView::from_tables`], or from any
//! atomics, as the model does). A [`ProcGate`] is this process's state on that
//! device: its unfinished launches and their estimated cost. The rule:
//!
//! - no arbiter (`arbiter_period_ns == 0`): go;
//! - the process already has `queue_launches` unfinished launches, or
//!   its estimated unfinished work plus this launch's estimate would exceed
//!   `queue_ns`: wait for one of its own to finish ([`Decision::Drain`]) —
//!   this is what bounds a program that launches far ahead. A process with
//!   nothing unfinished may always launch one, whatever its size, so a
//!   bound below one kernel still lets the slice progress; launches known
//!   to be tiny (mean measured cost under [`TINY_LAUNCH_NS`]) are held to
//!   the ns bound only;
//! - `consumed + own unfinished estimate + peers' < allowance`: go;
//! - otherwise the allowance is spent: drain own launches if there are any
//!   (their estimate may have been pessimistic), else wait until the next
//!   period ([`Decision::WaitUntil`]).
//!
//! *Peers* are the slice's other processes on the same device ([`Peers`]):
//! each publishes its unfinished estimate in its usage record, and a gate
//! counts the fresh ones against the allowance with its own. Without them a
//! slice of *n* processes had up to *n* launches' worth in flight when the
//! allowance ran out, each process checking only its own (a 10%-capped slice
//! of 16 processes with 5 ms kernels ran at 28%). The queue bounds stay per
//! process.
//!
//! *Turns.* The bound of one launch that a best-effort slice gets while a
//! high-priority slice is active holds for the slice, not per process (per
//! process, a high kernel waited behind one best-effort kernel per process).
//! A caller with nothing of its own unfinished takes its turn
//! (`Peers::turn`): it yields ([`Decision::Yield`]) while a peer holds the
//! turn with a launch unfinished, or a peer has waited longer, so the oldest
//! waiter goes next.
//! Handing the launch to whoever looks first starves: a process that
//! relaunches the moment its kernel is done always looks first. Waits and
//! holds are the records' `turn_since` words; a waiter sleeps on its
//! `turn_bell`, which the peer that finds the launch free rings.
//!
//! In a process of several threads each thread can only wait for (and reap)
//! its own launches, so [`ProcGate::before_launch_by`] takes the caller's
//! own unfinished launches: `Drain` only when it has some. A thread with
//! none, held back by other threads' unfinished launches, passes the queue
//! bound (one launch at a time, as a process with nothing unfinished) and
//! is held to the allowance less those launches' estimate (another thread
//! may keep its unreaped launches for ever: it stopped calling CUDA), so it
//! gets `Go` or `WaitUntil`, never an endless `Drain`.
//!
//! If `egpud` stops ticking (the epoch is more than [`STALE_PERIODS`] periods
//! old) the hook extends the allowance itself at the slice's compute limit,
//! so a dead agent neither freezes nor unleashes a slice: the slice-wide
//! extension `allowance + (now − due)·limit`, and a per-process bucket that
//! refills at the limit and holds at most one period at the limit beyond
//! the slice's consumption, so time spent idle while the agent is silent
//! is not banked (without it a 10% slice idle for 100 s then ran the whole
//! device for 5 s).
//!
//! Everything here is atomics on borrowed memory: no allocation, no lock, no
//! system call; safe to call from any thread.

use egpu_abi::usage::{CAP_PEER_INFLIGHT, CAP_TURNS};
use egpu_abi::{LimitsRegion, ProcRecord, UsageRegion};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

/// Periods after which the hook stops trusting a silent agent.
pub const STALE_PERIODS: u64 = 4;

/// Launches known to cost less than this (mean measured cost) are not held
/// to the launch-count bound, only to the ns bound and the allowance: four
/// of them queue less than 40 µs of work, and holding a stream of tiny
/// kernels to four unfinished launches would make every fourth launch wait
/// for a completion event (a blocking wait costs ≥ 50 µs of timer slack on
/// Linux; measured 21 µs per launch instead of 0.6 µs on the simulated GPU).
pub const TINY_LAUNCH_NS: u64 = 10_000;

/// A peer's published unfinished work counts while its gate decided within
/// this many periods: a process that stopped calling CUDA with launches
/// unreaped, or sleeps in a synchronisation longer than that, would
/// otherwise hold the rest of its slice back for as long.
pub const PEER_FRESH_PERIODS: u64 = 2;

/// A process waiting for its turn at its slice's one launch looks again
/// after at least a `TURN_MIN_DIV`th of a period (50 µs at 10 ms; a waiter
/// that found the launch free but an older waiter due)...
pub const TURN_MIN_DIV: u64 = 200;
/// ...and at most a `TURN_MAX_DIV`th (500 µs): in between, when the peer's
/// unfinished launch should be done.
pub const TURN_MAX_DIV: u64 = 20;
/// A wait for a turn counts while its process looked within a
/// `TURN_FRESH_DIV`th of a period (2.5 ms): a waiter looks at least every
/// [`TURN_MAX_DIV`]th (plus its wake-up), and gives its wait up when it
/// parks on the allowance, so only a wait that was never withdrawn (the
/// bound went back to several launches before it launched) or a stalled
/// process expires.
pub const TURN_FRESH_DIV: u64 = 4;

/// How long a peer's record (or, in the hook, a thread) may stay silent and
/// still count, at arbiter period `period_ns`: [`PEER_FRESH_PERIODS`] periods.
#[inline]
pub fn peer_fresh_ns(period_ns: u64) -> u64 {
    period_ns.saturating_mul(PEER_FRESH_PERIODS)
}

/// Whether launches of mean measured cost `mean_ns` are tiny (0: unknown, not tiny).
#[inline]
pub fn tiny(mean_ns: u64) -> bool {
    mean_ns != 0 && mean_ns < TINY_LAUNCH_NS
}

/// What the hook does with a launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Launch now, then call [`ProcGate::launched`].
    Go,
    /// Wait for the oldest unfinished launch of this process on this device
    /// (e.g. `cuEventSynchronize` on its completion event), then ask again.
    Drain,
    /// The slice's allowance is spent: sleep until this CLOCK_MONOTONIC ns
    /// (the next arbiter period), call [`ProcGate::waited`], then ask again.
    WaitUntil(u64),
    /// Another process of the slice has the slice's one launch, or waited
    /// for it longer: wake that waiter (`ring`, its record: the gate rang
    /// its [`ProcRecord::turn_bell`], the caller wakes the futex), sleep on
    /// this process's own bell while it still reads `bell` (the value the
    /// gate read before deciding) until `until` (CLOCK_MONOTONIC ns; soon),
    /// then ask again. Not a wait for the allowance: no
    /// [`ProcGate::waited`]. Only under a queue bound of one launch (turns;
    /// see the module docs).
    Yield { until: u64, ring: Option<usize>, bell: u32 },
}

/// The slice-table words the gate reads and writes, for one slice device.
#[derive(Debug, Clone, Copy)]
pub struct GateView<'a> {
    pub period_ns: &'a AtomicU64,
    pub allowance_ns: &'a AtomicU64,
    pub epoch_start_ns: &'a AtomicU64,
    pub queue_launches: &'a AtomicU64,
    pub queue_ns: &'a AtomicU64,
    /// Slice-wide measured GPU time (usage region).
    pub consumed_ns: &'a AtomicU64,
    /// Slice-wide count of launches that found the allowance spent (usage region).
    pub throttle_waits: &'a AtomicU64,
    /// The slice's compute limit on this device, basis points (from the
    /// hook's seqlocked snapshot), used only when the agent is silent.
    pub limit_bps: u32,
    /// The slice's process records (None: this process is the slice's only
    /// gate, as in the unit tests).
    pub peers: Option<Peers<'a>>,
}

/// The usage records of a slice's processes, as one process's gate sees
/// them on one device: it publishes its own unfinished work in record `own`
/// and counts the others'.
#[derive(Debug, Clone, Copy)]
pub struct Peers<'a> {
    pub records: &'a [ProcRecord],
    /// One past the highest record ever used (scans stop there).
    pub high_water: &'a AtomicU32,
    /// This process's record, if it has claimed one (else it publishes nothing).
    pub own: Option<usize>,
    pub dev: usize,
    /// Whether [`ProcGate`] stores its whole unfinished estimate in the own
    /// record itself at every change (the model, tests). The hook publishes
    /// instead, thread by thread, leaving out threads that stopped calling
    /// CUDA with launches unreaped; its estimates are still rounded to whole µs.
    pub publish: bool,
}

impl<'a> Peers<'a> {
    /// The peers in a usage region, for the process owning record `own`.
    pub fn of(usage: &'a UsageRegion, own: Option<usize>, dev: usize) -> Peers<'a> {
        Peers { records: &usage.procs, high_water: &usage.high_water, own, dev, publish: true }
    }

    /// This process's record, if it has one.
    pub fn own_record(&self) -> Option<&'a ProcRecord> {
        self.own.and_then(|i| self.records.get(i))
    }

    /// The records ever used (scans stop at the high-water mark), with their indices.
    fn in_use(&self) -> impl Iterator<Item = (usize, &'a ProcRecord)> {
        let hw = (self.high_water.load(Relaxed) as usize).min(self.records.len());
        self.records[..hw].iter().enumerate()
    }

    /// Whether record `i` is a peer that counts: another process's, in use
    /// by a hook that publishes (`CAP_PEER_INFLIGHT`), whose gate decided
    /// within `fresh_ns`.
    #[inline]
    fn counts(&self, i: usize, r: &ProcRecord, now_ns: u64, fresh_ns: u64) -> bool {
        Some(i) != self.own && r.state.load(Relaxed) == 1 && r.caps.load(Relaxed) & CAP_PEER_INFLIGHT != 0 && fresh(now_ns, r.gate_ns.load(Relaxed), fresh_ns)
    }

    /// The other processes' published unfinished work, ns ([`Peers::counts`]).
    /// One relaxed load per record that has nothing unfinished.
    #[inline]
    pub fn inflight_ns(&self, now_ns: u64, fresh_ns: u64) -> u64 {
        let mut sum = 0u64;
        for (i, r) in self.in_use() {
            let us = r.inflight_us[self.dev].load(Relaxed);
            if us != 0 && self.counts(i, r, now_ns, fresh_ns) {
                sum = sum.saturating_add(u64::from(us) * 1000);
            }
        }
        sum
    }

    /// Whether another process of the slice counts ([`Peers::counts`]),
    /// whatever its unfinished work: a waiter then wakes at a moment of its
    /// own rather than at the tick with all the others.
    pub fn others_active(&self, now_ns: u64, fresh_ns: u64) -> bool {
        self.in_use().any(|(i, r)| self.counts(i, r, now_ns, fresh_ns))
    }

    /// Marks this process's gate as active at `now_ns` (at most one store
    /// per `every_ns`, to keep the record's line quiet).
    #[inline]
    fn touch(&self, now_ns: u64, every_ns: u64) {
        if let Some(r) = self.own_record() {
            let last = r.gate_ns.load(Relaxed);
            if now_ns.saturating_sub(last) >= every_ns || last > now_ns {
                r.gate_ns.store(now_ns, Relaxed);
            }
        }
    }

    /// Whether this process must let another of the slice launch first,
    /// under a queue bound of one launch (a best-effort slice while a high
    /// slice is active): a peer holds the turn with a launch unfinished
    /// (for at most [`TURN_HOLD_FACTOR`] times its estimate), or a peer has
    /// waited for its turn longer than this process (ties: the lower
    /// record). Then it says it waits (since when, unless it already does)
    /// and gets when to look again, and which waiter's bell it rang: the
    /// oldest's, when the launch is free ([`Decision::Yield`]). It looks
    /// again after half the holders' unfinished estimate, between a
    /// [`TURN_MIN_DIV`]th and a [`TURN_MAX_DIV`]th of a period, or at once
    /// when rung. `None`: its turn (a wait it announced stays until
    /// [`Peers::turn_taken`]).
    ///
    /// Only peers that take turns ([`CAP_TURNS`]) count, as holders or as
    /// waiters: an older hook relaunches the moment its kernel is done and
    /// would never leave the launch free. A process whose own hook does not
    /// take turns never yields. Only waiters that looked within a
    /// [`TURN_FRESH_DIV`]th of a period count, so a wait never withdrawn
    /// expires.
    #[cold]
    fn turn(&self, now_ns: u64, period: u64) -> Option<Decision> {
        let me = self.own_record().filter(|r| r.caps.load(Relaxed) & CAP_TURNS != 0)?;
        let own = self.own?;
        // Read before anything else: a peer that rings after this (it saw
        // this process waiting) makes the futex wait return at once.
        let bell = me.turn_bell.load(Relaxed);
        let (live, fresh_ns, lo) = (turn_fresh_ns(period), peer_fresh_ns(period), (period / TURN_MIN_DIV).max(1));
        let mine = waiting_on(me, self.dev, now_ns, live);
        // Another thread's launch of this process on its turn (then the
        // waiter it yields to cannot go yet either: no need to ring).
        let mine_held = held_on(me, self.dev, now_ns, lo);
        // The unfinished work of those holding a turn, and the oldest waiter.
        let (mut held, mut oldest) = (0u64, None);
        for (i, r) in self.in_use() {
            if r.caps.load(Relaxed) & CAP_TURNS != 0 && self.counts(i, r, now_ns, fresh_ns) {
                held = held.saturating_add(held_on(r, self.dev, now_ns, lo));
                if let Some(o) = waiting_on(r, self.dev, now_ns, live).map(|t| (t, i))
                    && oldest.is_none_or(|x| o < x)
                {
                    oldest = Some(o);
                }
            }
        }
        // Nobody may take a held launch; a free one goes to the oldest waiter.
        let oldest = oldest.filter(|&o| held == 0 && mine.is_none_or(|m| o < (m, own)));
        if held == 0 && oldest.is_none() {
            if mine.is_some() {
                me.turn_poll_ns.store(now_ns, Relaxed);
            }
            return None;
        }
        if mine.is_none() {
            // Not waiting here: announce it, unless this process still holds
            // the turn here (another thread's launch: the turn passes when
            // that is done) or waits on another device (another thread).
            if mine_held == 0 && !waits_elsewhere(me, self.dev, now_ns, live) {
                me.turn_since.store((now_ns.max(16) & !0xF) | self.dev as u64, Relaxed);
            }
        }
        me.turn_poll_ns.store(now_ns, Relaxed);
        let ring = oldest.filter(|_| mine_held == 0).map(|(_, i)| {
            self.records[i].turn_bell.fetch_add(1, Relaxed);
            i
        });
        let busy = held.saturating_add(mine_held);
        let after = if busy == 0 { lo } else { (busy / 2).clamp(lo, (period / TURN_MAX_DIV).max(lo)) };
        Some(Decision::Yield { until: now_ns.saturating_add(after), ring, bell })
    }

    /// This process launched on its turn at `now_ns`: its wait (if it
    /// announced one here) ends, and it holds the turn while its launch is
    /// unfinished, for at most [`TURN_HOLD_FACTOR`] times its estimate: its
    /// unfinished work holds the others back ([`Peers::turn`]). A live wait
    /// of another of its threads on another device is left alone (this
    /// launch then holds nobody back, as before turns).
    #[cold]
    fn turn_taken(&self, now_ns: u64, period: u64) {
        if let Some(me) = self.own_record()
            && !waits_elsewhere(me, self.dev, now_ns, turn_fresh_ns(period))
        {
            me.turn_since.store(TURN_HOLDING | (now_ns & !0xF) | self.dev as u64, Relaxed);
        }
    }

    /// This process's wait on this device ends without a launch, and with
    /// `hold` its hold there too: it launches without turns (its launches
    /// are tiny), or its turn came but the allowance is spent. A waiter
    /// parked on the allowance until the next period must not hold up its
    /// peers' turns meanwhile: a peer's thread may still launch where it may
    /// not (the allowance less another thread's unreaped launches, see
    /// `slow_path`), and the others would look again, and ring it, every
    /// [`TURN_MIN_DIV`]th of a period for nothing.
    #[cold]
    fn turn_dropped(&self, hold: bool) {
        if let Some(me) = self.own_record() {
            let w = me.turn_since.load(Relaxed);
            if w != 0 && (w & 0xF) as usize == self.dev && (hold || w & TURN_HOLDING == 0) {
                me.turn_since.store(0, Relaxed);
            }
        }
    }

    /// Stores `total_ns`, the process's whole unfinished estimate, in its
    /// record (when the gate publishes itself, see [`Peers::publish`]).
    fn publish_total(&self, total_ns: u64) {
        if let Some(r) = self.own_record().filter(|_| self.publish) {
            r.inflight_us[self.dev].store(u32::try_from(total_ns / 1000).unwrap_or(u32::MAX), Relaxed);
        }
    }
}

/// [`ProcRecord::turn_since`] with this bit: the process launched on its
/// turn on the device in the low 4 bits, at the time in the bits between,
/// and its unfinished work there holds its peers back; without it, a wait
/// since that time.
const TURN_HOLDING: u64 = 1 << 63;

/// A turn holds the others back for at most this many times the holder's
/// unfinished estimate (at least a [`TURN_MIN_DIV`]th of a period): the
/// hook learns that a launch is done only when its process next launches
/// or synchronises through the driver's gated calls, and a process that
/// reads its result back with a copy and then works on the CPU would
/// otherwise hold its slice for the two periods its record stays fresh.
pub const TURN_HOLD_FACTOR: u64 = 2;

/// The unfinished work (ns) by which record `r` holds the turn on device
/// `dev` at `now_ns`: its published estimate there, if it took the turn
/// there at most [`TURN_HOLD_FACTOR`] times that (and at least `min_ns`) ago.
#[inline]
fn held_on(r: &ProcRecord, dev: usize, now_ns: u64, min_ns: u64) -> u64 {
    let w = r.turn_since.load(Relaxed);
    if w & TURN_HOLDING == 0 || (w & 0xF) as usize != dev {
        return 0;
    }
    let ns = u64::from(r.inflight_us[dev].load(Relaxed)) * 1000;
    if now_ns.saturating_sub(w & !(TURN_HOLDING | 0xF)) <= ns.saturating_mul(TURN_HOLD_FACTOR).max(min_ns) { ns } else { 0 }
}

/// How long a wait for a turn counts after its process last looked, at
/// arbiter period `period_ns`: a [`TURN_FRESH_DIV`]th of it.
#[inline]
fn turn_fresh_ns(period_ns: u64) -> u64 {
    (period_ns / TURN_FRESH_DIV).max(1)
}

/// Record `r`'s wait for its turn, if it waits and looked within `live_ns`:
/// since when (low 4 bits cleared), and on which device.
#[inline]
fn live_wait(r: &ProcRecord, now_ns: u64, live_ns: u64) -> Option<(u64, usize)> {
    let w = r.turn_since.load(Relaxed);
    (w != 0 && w & TURN_HOLDING == 0 && fresh(now_ns, r.turn_poll_ns.load(Relaxed), live_ns)).then_some((w & !0xF, (w & 0xF) as usize))
}

/// When record `r` began to wait for its turn on device `dev`, if it waits
/// there ([`live_wait`]).
#[inline]
fn waiting_on(r: &ProcRecord, dev: usize, now_ns: u64, live_ns: u64) -> Option<u64> {
    live_wait(r, now_ns, live_ns).and_then(|(since, d)| (d == dev).then_some(since))
}

/// Whether record `r` waits for its turn on a device other than `dev`
/// ([`live_wait`]; another thread's wait: the one word is left to it).
#[inline]
fn waits_elsewhere(r: &ProcRecord, dev: usize, now_ns: u64, live_ns: u64) -> bool {
    live_wait(r, now_ns, live_ns).is_some_and(|(_, d)| d != dev)
}

/// Whether a record whose gate last decided at `at` is fresh at `now`: at
/// most `fresh_ns` before it, and not after it by more than that (a clock
/// from another time namespace, or a corrupted word, never stays fresh).
#[inline]
fn fresh(now_ns: u64, at: u64, fresh_ns: u64) -> bool {
    now_ns.abs_diff(at) <= fresh_ns
}

impl<'a> GateView<'a> {
    /// The view of slice device `dev` in the mapped regions, for the
    /// process owning usage record `own` (if it has one).
    pub fn from_tables(limits: &'a LimitsRegion, usage: &'a UsageRegion, dev: usize, limit_bps: u32, own: Option<usize>) -> GateView<'a> {
        let d = &limits.devices[dev];
        GateView {
            period_ns: &limits.arbiter_period_ns,
            allowance_ns: &d.allowance_ns,
            epoch_start_ns: &d.epoch_start_ns,
            queue_launches: &d.queue_launches,
            queue_ns: &d.queue_ns,
            consumed_ns: &usage.consumed_ns[dev],
            throttle_waits: &usage.throttle_waits[dev],
            limit_bps,
            peers: Some(Peers::of(usage, own, dev)),
        }
    }

    /// The peers' fresh unfinished work (0 without peers).
    #[inline]
    pub fn peers_ns(&self, period: u64, now_ns: u64) -> u64 {
        self.peers.map_or(0, |p| p.inflight_ns(now_ns, peer_fresh_ns(period)))
    }

    /// The allowance, extended at the compute limit if the agent went
    /// silent, and whether it did (then [`ProcGate`]'s bucket bounds it too).
    fn allowance(&self, period: u64, now_ns: u64) -> (u64, bool) {
        let a = self.allowance_ns.load(Relaxed);
        let due = self.epoch_start_ns.load(Relaxed).saturating_add(period);
        let stale_after = due.saturating_add(period.saturating_mul(STALE_PERIODS - 1));
        if now_ns <= stale_after {
            return (a, false);
        }
        (a.saturating_add(self.at_limit(now_ns - due)), true)
    }

    /// `ns` at the slice's compute limit.
    fn at_limit(&self, ns: u64) -> u64 {
        (u128::from(ns) * u128::from(self.limit_bps) / 10_000) as u64
    }

    fn next_period(&self, period: u64, now_ns: u64) -> u64 {
        let due = self.epoch_start_ns.load(Relaxed).saturating_add(period);
        if due > now_ns { due } else { now_ns.saturating_add(period / 4).max(now_ns + 1) }
    }
}

/// One process's gate state on one device. `const`-constructible, so the
/// hook can keep one per device in a static.
#[derive(Debug, Default)]
pub struct ProcGate {
    inflight: AtomicU64,
    inflight_ns: AtomicU64,
    /// Exponentially weighted mean measured cost of a launch, ns (0: unknown).
    mean_ns: AtomicU64,
    /// The bucket while the agent is silent: the `epoch_start_ns` it was
    /// filled under, when it was last refilled (0: never), and the
    /// allowance it grants (slice-wide measured ns, like `consumed_ns`).
    stale_epoch: AtomicU64,
    stale_at: AtomicU64,
    stale_allowance: AtomicU64,
}

impl ProcGate {
    pub const fn new() -> ProcGate {
        ProcGate {
            inflight: AtomicU64::new(0),
            inflight_ns: AtomicU64::new(0),
            mean_ns: AtomicU64::new(0),
            stale_epoch: AtomicU64::new(0),
            stale_at: AtomicU64::new(0),
            stale_allowance: AtomicU64::new(0),
        }
    }

    /// Decides one launch of a caller that can drain every unfinished
    /// launch of the process (one thread, or the model).
    #[inline]
    pub fn before_launch(&self, v: &GateView<'_>, now_ns: u64) -> Decision {
        self.before_launch_by(v, now_ns, u64::MAX)
    }

    /// Decides one launch of a caller with `own` unfinished launches of its
    /// own on this device (those it can drain; `u64::MAX`: all of them).
    /// Fast path (budget left, queue short): seven relaxed loads, one more
    /// per record of the slice in use (four for a peer with unfinished
    /// work), and a few compares.
    #[inline]
    pub fn before_launch_by(&self, v: &GateView<'_>, now_ns: u64, own: u64) -> Decision {
        self.before_launch_beside(v, now_ns, own, v.peers_ns(v.period_ns.load(Relaxed), now_ns))
    }

    /// [`ProcGate::before_launch_by`] with the peers' unfinished work
    /// already summed ([`GateView::peers_ns`]), for a caller that uses the
    /// sum again (the hook, to decide whether to record an event).
    #[inline]
    pub fn before_launch_beside(&self, v: &GateView<'_>, now_ns: u64, own: u64, peers_ns: u64) -> Decision {
        let period = v.period_ns.load(Relaxed);
        if period == 0 {
            return Decision::Go;
        }
        if let Some(p) = &v.peers {
            p.touch(now_ns, period / 16);
        }
        let inflight = self.inflight.load(Relaxed);
        let inflight_ns = self.inflight_ns.load(Relaxed);
        let ql = v.queue_launches.load(Relaxed);
        let qns = v.queue_ns.load(Relaxed);
        let mean = self.mean_ns.load(Relaxed);
        let queue_full = inflight > 0 && ((ql != 0 && inflight >= ql && !tiny(mean)) || (qns != 0 && inflight_ns.saturating_add(mean) > qns));
        if queue_full && own > 0 {
            return Decision::Drain;
        }
        if ql == 1 && (inflight == 0 || own == 0 || tiny(mean)) {
            return self.one_launch(v, period, now_ns, own, peers_ns, queue_full, inflight, inflight_ns, tiny(mean));
        }
        self.decide(v, period, now_ns, own, peers_ns, queue_full, inflight, inflight_ns)
    }

    /// The allowance's part of [`ProcGate::before_launch_beside`].
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn decide(&self, v: &GateView<'_>, period: u64, now_ns: u64, own: u64, peers_ns: u64, queue_full: bool, inflight: u64, inflight_ns: u64) -> Decision {
        let consumed = v.consumed_ns.load(Relaxed);
        // Consumed plus the other processes' unfinished work: the slice's use
        // of the allowance but for this process's own.
        let busy = consumed.saturating_add(peers_ns);
        if !queue_full && busy.saturating_add(inflight_ns) < v.allowance_ns.load(Relaxed) {
            return Decision::Go;
        }
        self.slow_path(v, period, now_ns, consumed, busy, inflight, inflight_ns, own)
    }

    /// Under a queue bound of one launch, a caller with nothing of its own
    /// unfinished (a process with nothing unfinished, or a thread whose
    /// process has only other threads' launches unfinished): the bound holds
    /// for the slice, by turns ([`Peers::turn`]), then the allowance decides
    /// as for any launch. A thread takes turns too, or two threads whose
    /// launches overlap would keep the turn for good. Tiny launches are not
    /// bound to one and take no turns; what their process held or waited
    /// for ends.
    #[cold]
    #[allow(clippy::too_many_arguments)]
    fn one_launch(&self, v: &GateView<'_>, period: u64, now_ns: u64, own: u64, peers_ns: u64, queue_full: bool, inflight: u64, inflight_ns: u64, tiny: bool) -> Decision {
        let Some(p) = &v.peers else { return self.decide(v, period, now_ns, own, peers_ns, queue_full, inflight, inflight_ns) };
        if tiny {
            p.turn_dropped(true);
            return self.decide(v, period, now_ns, own, peers_ns, queue_full, inflight, inflight_ns);
        }
        if let Some(y) = p.turn(now_ns, period) {
            return y;
        }
        let d = self.decide(v, period, now_ns, own, peers_ns, queue_full, inflight, inflight_ns);
        match d {
            Decision::Go => p.turn_taken(now_ns, period),
            Decision::WaitUntil(_) => p.turn_dropped(false),
            _ => {}
        }
        d
    }

    #[cold]
    #[allow(clippy::too_many_arguments)]
    fn slow_path(&self, v: &GateView<'_>, period: u64, now_ns: u64, consumed: u64, busy: u64, inflight: u64, inflight_ns: u64, own: u64) -> Decision {
        let (mut allowance, stale) = v.allowance(period, now_ns);
        if stale {
            allowance = allowance.min(self.stale_bucket(v, period, now_ns, consumed));
        }
        if busy.saturating_add(inflight_ns) < allowance {
            Decision::Go
        } else if inflight > 0 && own > 0 {
            Decision::Drain
        } else if inflight > 0 && busy < allowance {
            // Only other threads' launches are unfinished, and they may
            // never be reaped: one launch of this thread, which it then
            // drains itself (the allowance less their estimate would stall
            // it for good while they stay unreaped). Other processes'
            // unreaped launches stop counting once they are stale
            // ([`PEER_FRESH_PERIODS`]), so they are not excepted here.
            Decision::Go
        } else {
            Decision::WaitUntil(v.next_period(period, now_ns))
        }
    }

    /// The allowance this process may use while the agent is silent: a
    /// bucket refilled at the slice's limit since its last refill, never
    /// more than one period at the limit beyond `consumed`. Full when the
    /// process first finds the agent silent (per epoch: a tick in between
    /// starts a new bucket at the next silence). Concurrent callers each
    /// add a disjoint interval (`fetch_max` on the refill time).
    #[cold]
    fn stale_bucket(&self, v: &GateView<'_>, period: u64, now_ns: u64, consumed: u64) -> u64 {
        let full = consumed.saturating_add(v.at_limit(period));
        let epoch = v.epoch_start_ns.load(Relaxed);
        if self.stale_epoch.swap(epoch, Relaxed) != epoch || self.stale_at.load(Relaxed) == 0 {
            self.stale_at.store(now_ns.max(1), Relaxed);
            self.stale_allowance.store(full, Relaxed);
            return full;
        }
        let last = self.stale_at.fetch_max(now_ns, Relaxed);
        let add = v.at_limit(now_ns.saturating_sub(last));
        let b = self.stale_allowance.fetch_add(add, Relaxed).saturating_add(add);
        if b > full {
            self.stale_allowance.fetch_min(full, Relaxed);
            full
        } else {
            b
        }
    }

    /// The launch was issued. Returns the estimate charged to it, which
    /// must be handed back to [`ProcGate::completed`]: the mean cost, rounded
    /// up to whole µs where there is a record to publish in, so that the
    /// published total (µs) is exact however the completions are batched.
    #[inline]
    pub fn launched(&self, v: &GateView<'_>) -> u64 {
        let mut est = self.mean_ns.load(Relaxed);
        if v.peers.is_some_and(|p| p.own.is_some()) {
            est = est.div_ceil(1000).saturating_mul(1000);
        }
        self.inflight.fetch_add(1, Relaxed);
        let total = self.inflight_ns.fetch_add(est, Relaxed).saturating_add(est);
        if let Some(p) = &v.peers {
            p.publish_total(total);
        }
        est
    }

    /// A launch [`ProcGate::launched`] counted was not made after all (the
    /// driver refused it): its estimate is taken back, nothing is measured.
    pub fn cancel(&self, v: &GateView<'_>, estimate: u64) {
        sub_sat(&self.inflight, 1);
        sub_sat(&self.inflight_ns, estimate);
        if let Some(p) = &v.peers {
            p.publish_total(self.inflight_ns.load(Relaxed));
        }
    }

    /// A launch finished: `estimate` is what [`ProcGate::launched`] returned,
    /// `measured_ns` its charge ([`crate::measure::StreamClock::attribute`]).
    /// Adds the charge to the slice's `consumed_ns` and to `proc_gpu_time`
    /// (this process's record, if any).
    pub fn completed(&self, v: &GateView<'_>, estimate: u64, measured_ns: u64, proc_gpu_time: Option<&AtomicU64>) {
        self.completed_n(v, 1, estimate, measured_ns, proc_gpu_time);
    }

    /// `n` launches finished together (one event covered them): `estimate`
    /// is the sum of what [`ProcGate::launched`] returned for them,
    /// `measured_ns` their total charge. The same as `n` calls of
    /// [`ProcGate::completed`] with equal shares, with one update of each
    /// shared counter instead of `n`.
    pub fn completed_n(&self, v: &GateView<'_>, n: u64, estimate: u64, measured_ns: u64, proc_gpu_time: Option<&AtomicU64>) {
        let n = n.max(1);
        sub_sat(&self.inflight, n);
        sub_sat(&self.inflight_ns, estimate);
        if let Some(p) = &v.peers {
            p.publish_total(self.inflight_ns.load(Relaxed));
        }
        let each = measured_ns / n;
        let mut m = self.mean_ns.load(Relaxed);
        // Mean over ~8 launches; the first measurement seeds it. After 64
        // equal samples the old mean weighs (7/8)^64 < 0.02%.
        for _ in 0..n.min(64) {
            m = if m == 0 { each } else { m - m / 8 + each / 8 };
        }
        self.mean_ns.store(m.max(1), Relaxed);
        v.consumed_ns.fetch_add(measured_ns, Relaxed);
        if let Some(p) = proc_gpu_time {
            p.fetch_add(measured_ns, Relaxed);
        }
    }

    /// The process waited `waited_ns` after [`Decision::WaitUntil`]: counts the
    /// wait as demand for the arbiter and adds it to `proc_throttled` (this
    /// process's record, if any).
    pub fn waited(&self, v: &GateView<'_>, waited_ns: u64, proc_throttled: Option<&AtomicU64>) {
        v.throttle_waits.fetch_add(1, Relaxed);
        if let Some(p) = proc_throttled {
            p.fetch_add(waited_ns, Relaxed);
        }
    }

    /// Forgets every unfinished launch and the mean cost (a `fork` child:
    /// its parent's launches are not its own).
    pub fn reset(&self) {
        self.inflight.store(0, Relaxed);
        self.inflight_ns.store(0, Relaxed);
        self.mean_ns.store(0, Relaxed);
        self.stale_at.store(0, Relaxed);
    }

    /// Estimated unfinished work of this process on this device, ns.
    pub fn inflight_ns(&self) -> u64 {
        self.inflight_ns.load(Relaxed)
    }

    /// Unfinished launches of this process on this device.
    pub fn inflight(&self) -> u64 {
        self.inflight.load(Relaxed)
    }

    /// Mean measured cost of a launch so far, ns.
    pub fn mean_ns(&self) -> u64 {
        self.mean_ns.load(Relaxed)
    }
}

fn sub_sat(a: &AtomicU64, n: u64) {
    let _ = a.fetch_update(Relaxed, Relaxed, |v| Some(v.saturating_sub(n)));
}

/// Words for a [`GateView`] owned outside a slice table (tests, the model).
#[derive(Debug, Default)]
pub struct GateWords {
    pub period_ns: AtomicU64,
    pub allowance_ns: AtomicU64,
    pub epoch_start_ns: AtomicU64,
    pub queue_launches: AtomicU64,
    pub queue_ns: AtomicU64,
    pub consumed_ns: AtomicU64,
    pub throttle_waits: AtomicU64,
}

impl GateWords {
    pub fn view(&self, limit_bps: u32) -> GateView<'_> {
        GateView {
            period_ns: &self.period_ns,
            allowance_ns: &self.allowance_ns,
            epoch_start_ns: &self.epoch_start_ns,
            queue_launches: &self.queue_launches,
            queue_ns: &self.queue_ns,
            consumed_ns: &self.consumed_ns,
            throttle_waits: &self.throttle_waits,
            limit_bps,
            peers: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(period: u64, allowance: u64, epoch_start: u64) -> GateWords {
        let w = GateWords::default();
        w.period_ns.store(period, Relaxed);
        w.allowance_ns.store(allowance, Relaxed);
        w.epoch_start_ns.store(epoch_start, Relaxed);
        w
    }

    #[test]
    fn no_arbiter_means_go() {
        let w = GateWords::default();
        assert_eq!(ProcGate::new().before_launch(&w.view(10_000), 5), Decision::Go);
    }

    #[test]
    fn budget_then_wait_for_next_period() {
        let w = words(1000, 300, 0);
        let v = w.view(10_000);
        let g = ProcGate::new();
        assert_eq!(g.before_launch(&v, 10), Decision::Go);
        let e = g.launched(&v);
        assert_eq!(e, 0, "no estimate before the first completion");
        g.completed(&v, e, 300, None);
        assert_eq!(w.consumed_ns.load(Relaxed), 300);
        assert_eq!(g.before_launch(&v, 20), Decision::WaitUntil(1000));
        g.waited(&v, 980, None);
        assert_eq!(w.throttle_waits.load(Relaxed), 1);
        // The arbiter raises the allowance: go again.
        w.allowance_ns.store(600, Relaxed);
        w.epoch_start_ns.store(1000, Relaxed);
        assert_eq!(g.before_launch(&v, 1000), Decision::Go);
    }

    #[test]
    fn unfinished_work_counts_against_the_allowance() {
        let w = words(1000, 1000, 0);
        let v = w.view(10_000);
        let g = ProcGate::new();
        let e = g.launched(&v);
        g.completed(&v, e, 100, None); // mean 100, consumed 100
        let mut launched = 0;
        while g.before_launch(&v, 1) == Decision::Go {
            g.launched(&v);
            launched += 1;
            assert!(launched < 100, "gate never closed");
        }
        // 100 consumed + 9 × 100 estimated = allowance.
        assert_eq!(launched, 9);
        assert_eq!(g.before_launch(&v, 1), Decision::Drain);
    }

    #[test]
    fn queue_bound_holds_far_ahead_launchers() {
        let w = words(1000, u64::MAX, 0);
        w.queue_launches.store(3, Relaxed);
        let v = w.view(10_000);
        let g = ProcGate::new();
        let mut est = vec![];
        while g.before_launch(&v, 0) == Decision::Go {
            est.push(g.launched(&v));
            assert!(est.len() < 10);
        }
        assert_eq!(est.len(), 3);
        assert_eq!(g.before_launch(&v, 0), Decision::Drain);
        g.completed(&v, est[0], 50, None);
        assert_eq!(g.before_launch(&v, 0), Decision::Go);
        // Bound in ns too: a launch goes only if it fits (mean 50 each).
        w.queue_launches.store(0, Relaxed);
        w.queue_ns.store(120, Relaxed);
        g.completed(&v, est[1], 50, None);
        g.completed(&v, est[2], 50, None);
        assert_eq!(g.inflight(), 0);
        let a = g.launched(&v);
        assert_eq!(g.before_launch(&v, 0), Decision::Go, "50 + 50 <= 120");
        let b = g.launched(&v);
        assert_eq!(a + b, 100);
        assert_eq!(g.before_launch(&v, 0), Decision::Drain, "100 + 50 > 120");
        // A bound below one launch: one at a time, never none.
        w.queue_ns.store(10, Relaxed);
        g.completed(&v, a, 50, None);
        assert_eq!(g.before_launch(&v, 0), Decision::Drain);
        g.completed(&v, b, 50, None);
        assert_eq!(g.before_launch(&v, 0), Decision::Go, "nothing unfinished: one launch may go");
    }

    #[test]
    fn tiny_launches_are_held_by_the_ns_bound_not_the_count() {
        let w = words(1000, u64::MAX, 0);
        w.queue_launches.store(2, Relaxed);
        w.queue_ns.store(100_000, Relaxed);
        let v = w.view(10_000);
        let g = ProcGate::new();
        // Unknown cost: the count bound holds.
        g.launched(&v);
        g.launched(&v);
        assert_eq!(g.before_launch(&v, 0), Decision::Drain);
        g.completed(&v, 0, 2_000, None);
        g.completed(&v, 0, 2_000, None);
        // Known to cost 2 µs: up to 100 µs of them may be unfinished.
        let mut n = 0;
        while g.before_launch(&v, 0) == Decision::Go {
            g.launched(&v);
            n += 1;
            assert!(n < 1000, "never bounded");
        }
        assert_eq!(n, 50);
        // Long launches are held to the count again.
        let g = ProcGate::new();
        g.completed(&v, 0, 20_000, None);
        g.launched(&v);
        g.launched(&v);
        assert_eq!(g.before_launch(&v, 0), Decision::Drain);
    }

    #[test]
    fn a_batch_completes_like_its_launches_one_by_one() {
        let w = words(1000, u64::MAX, 0);
        let v = w.view(10_000);
        let (one, batch) = (ProcGate::new(), ProcGate::new());
        for g in [&one, &batch] {
            g.completed(&v, 0, 800, None);
            for _ in 0..5 {
                g.launched(&v);
            }
        }
        for _ in 0..5 {
            one.completed(&v, 800, 400, None);
        }
        batch.completed_n(&v, 5, 4000, 2000, None);
        assert_eq!((one.inflight(), one.inflight_ns()), (batch.inflight(), batch.inflight_ns()));
        assert_eq!((batch.inflight(), batch.inflight_ns()), (0, 0));
        assert_eq!(one.mean_ns(), batch.mean_ns());
        assert_eq!(w.consumed_ns.load(Relaxed), 2 * (800 + 2000));
    }

    #[test]
    fn silent_agent_extends_at_the_limit() {
        let w = words(1000, 100, 0);
        w.consumed_ns.store(100, Relaxed);
        let v = w.view(5_000);
        let g = ProcGate::new();
        // Within the stale window: wait for the next period (already overdue → a quarter period).
        assert_eq!(g.before_launch(&v, 2000), Decision::WaitUntil(2250));
        // Agent silent for > 4 periods: allowance grows at 50% of elapsed time past due.
        assert_eq!(g.before_launch(&v, 5001), Decision::Go);
        w.consumed_ns.store(100 + 2001, Relaxed);
        assert_eq!(g.before_launch(&v, 5001), Decision::WaitUntil(5251));
    }

    /// Saturates a process with `kernel_ns` launches (each finishing at once)
    /// from `from` to `to`; returns the GPU time it ran.
    fn saturate(g: &ProcGate, v: &GateView<'_>, from: u64, to: u64, kernel_ns: u64) -> u64 {
        let (mut now, mut ran) = (from, 0);
        while now < to {
            match g.before_launch(v, now) {
                Decision::Go => {
                    let e = g.launched(v);
                    now += kernel_ns;
                    g.completed(v, e, kernel_ns, None);
                    ran += kernel_ns;
                }
                Decision::WaitUntil(t) | Decision::Yield { until: t, .. } => now = t.max(now + 1),
                Decision::Drain => panic!("nothing is left unfinished"),
            }
        }
        ran
    }

    #[test]
    fn a_silent_agent_does_not_bank_idle_time() {
        // egpud's last tick at 0 (10 ms period) granted 1 ms to a slice
        // capped at 10%, then egpud died. The slice idles for 100 s, then
        // saturates the device with 1 ms kernels for 5 s. The extension at
        // the limit alone had banked 10 s of idle time: it ran all 5 s.
        const MS: u64 = 1_000_000;
        let w = words(10 * MS, MS, 0);
        let v = w.view(1000);
        let g = ProcGate::new();
        let ran = saturate(&g, &v, 100_000 * MS, 105_000 * MS, MS);
        assert!((490 * MS..=502 * MS).contains(&ran), "ran {} ms of 5 s at a 10% cap", ran / MS);
        // A tick, then silence again: a new bucket of one period, not a debt or a bank from before
        // (1 ms granted, a wait for the 40 ms of grace, 96 ms at the limit, 1 ms of bucket).
        w.allowance_ns.store(w.consumed_ns.load(Relaxed) + MS, Relaxed);
        w.epoch_start_ns.store(105_000 * MS, Relaxed);
        let ran = saturate(&g, &v, 105_000 * MS, 106_000 * MS, MS);
        assert!((97 * MS..=99 * MS).contains(&ran), "ran {} ms of 1 s at a 10% cap", ran / MS);
        let ran = saturate(&g, &v, 200_000 * MS, 201_000 * MS, MS);
        assert!((100 * MS..=102 * MS).contains(&ran), "ran {} ms of 1 s after 94 s idle", ran / MS);
    }

    #[test]
    fn a_thread_never_drains_what_only_other_threads_can_reap() {
        // Another thread of the process launched four and went quiet (it
        // reaps them at its next CUDA call, maybe never). This thread has
        // nothing of its own: it used to get Drain, wait a whole period
        // for nothing, then launch past both the bound and the allowance.
        let w = words(1000, 500, 0);
        w.queue_launches.store(4, Relaxed);
        let v = w.view(10_000);
        let g = ProcGate::new();
        g.completed(&v, 0, 100, None); // mean 100, consumed 100
        let other: Vec<u64> = (0..4).map(|_| g.launched(&v)).collect();
        assert_eq!(g.before_launch(&v, 1), Decision::Drain, "the process as a whole drains");
        // This thread: the queue bound yields, the allowance less the others' estimate holds.
        assert_eq!(g.before_launch_by(&v, 1, 0), Decision::Go);
        let mine = g.launched(&v);
        assert_eq!(g.before_launch_by(&v, 1, 1), Decision::Drain, "its own launch: it drains that");
        g.completed(&v, mine, 100, None); // consumed 200
        assert_eq!(g.before_launch_by(&v, 1, 0), Decision::Go);
        let mine = g.launched(&v);
        g.completed(&v, mine, 300, None); // consumed 500: the allowance is spent
        assert_eq!(g.before_launch_by(&v, 1, 0), Decision::WaitUntil(1000), "never past the allowance");
        // A new period: it goes again, the others' launches still unreaped.
        w.allowance_ns.store(1000, Relaxed);
        w.epoch_start_ns.store(1000, Relaxed);
        assert_eq!(g.before_launch_by(&v, 1001, 0), Decision::Go);
        for e in other {
            g.completed(&v, e, 100, None);
        }
        assert_eq!(g.inflight(), 0);
    }

    #[test]
    fn reset_forgets_unfinished_launches() {
        let w = words(1000, u64::MAX, 0);
        w.queue_launches.store(1, Relaxed);
        let v = w.view(10_000);
        let g = ProcGate::new();
        let e = g.launched(&v);
        g.completed(&v, e, 30_000, None);
        g.launched(&v);
        assert_eq!((g.inflight(), g.inflight_ns()), (1, 30_000));
        assert_eq!(g.before_launch(&v, 0), Decision::Drain);
        g.reset();
        assert_eq!((g.inflight(), g.inflight_ns(), g.mean_ns()), (0, 0, 0));
        assert_eq!(g.before_launch(&v, 0), Decision::Go);
    }

    #[test]
    fn process_records_get_their_attribution() {
        let w = words(1000, 1000, 0);
        let v = w.view(10_000);
        let g = ProcGate::new();
        let (gpu, thr) = (AtomicU64::new(0), AtomicU64::new(0));
        let e = g.launched(&v);
        g.completed(&v, e, 40, Some(&gpu));
        g.waited(&v, 7, Some(&thr));
        assert_eq!((gpu.load(Relaxed), thr.load(Relaxed)), (40, 7));
    }

    /// `n` records of one slice, attached by hooks that publish, all fresh at 0.
    fn records(n: usize) -> (Vec<ProcRecord>, AtomicU32) {
        let r: Vec<ProcRecord> = (0..n).map(|_| ProcRecord::default()).collect();
        for x in &r {
            x.state.store(1, Relaxed);
            x.caps.store(CAP_PEER_INFLIGHT, Relaxed);
        }
        (r, AtomicU32::new(n as u32))
    }

    #[test]
    fn peers_unfinished_work_counts_against_the_allowance() {
        // Period 1 ms, allowance 100 µs; two processes, 10 µs launches.
        let w = words(1_000_000, 100_000, 0);
        let (recs, hw) = records(2);
        let peers = |own| Some(Peers { records: &recs, high_water: &hw, own: Some(own), dev: 0, publish: true });
        let (va, vb) = (GateView { peers: peers(0), ..w.view(10_000) }, GateView { peers: peers(1), ..w.view(10_000) });
        let (a, b) = (ProcGate::new(), ProcGate::new());
        for (g, v) in [(&a, &va), (&b, &vb)] {
            let e = g.launched(v);
            g.completed(v, e, 10_000, None); // mean 10 µs each; consumed 20 µs
        }
        // a launches until consumed + its own estimate reach the allowance.
        let mut n = 0;
        while a.before_launch(&va, 1) == Decision::Go {
            a.launched(&va);
            n += 1;
        }
        assert_eq!(n, 8, "20 µs consumed + 8 × 10 µs = the allowance");
        assert_eq!(recs[0].inflight_us[0].load(Relaxed), 80, "a published its unfinished work");
        // b has nothing of its own unfinished: a's work leaves it nothing.
        assert_eq!(b.before_launch(&vb, 1), Decision::WaitUntil(1_000_000));
        // Blind to its peers (the old rule) b would have launched.
        assert_eq!(b.before_launch(&w.view(10_000), 1), Decision::Go);
        // a's launches finish, one event for all 8: its word goes back to 0 exactly.
        a.completed_n(&va, 8, 80_000, 80_000, None);
        assert_eq!(recs[0].inflight_us[0].load(Relaxed), 0);
        assert_eq!(b.before_launch(&vb, 1), Decision::WaitUntil(1_000_000), "the allowance is consumed now");
        w.allowance_ns.store(200_000, Relaxed);
        assert_eq!(b.before_launch(&vb, 1), Decision::Go);
    }

    #[test]
    fn published_estimates_are_whole_microseconds_and_come_back_exactly() {
        let w = words(1_000_000, u64::MAX / 2, 0);
        let (recs, hw) = records(1);
        let v = GateView { peers: Some(Peers { records: &recs, high_water: &hw, own: Some(0), dev: 0, publish: true }), ..w.view(10_000) };
        let g = ProcGate::new();
        let e = g.launched(&v);
        g.completed(&v, e, 2_345, None);
        let est: Vec<u64> = (0..5).map(|_| g.launched(&v)).collect();
        assert!(est.iter().all(|&e| e == 3_000), "2.345 µs rounds up to 3 µs: {est:?}");
        assert_eq!(recs[0].inflight_us[0].load(Relaxed), 15);
        assert_eq!(g.inflight_ns(), 15_000, "the gate's own sum is the published one");
        g.completed_n(&v, 2, 6_000, 5_000, None);
        g.completed_n(&v, 3, 9_000, 7_000, None);
        assert_eq!((recs[0].inflight_us[0].load(Relaxed), g.inflight_ns()), (0, 0));
        // Without a record of its own, nothing is published or rounded.
        let v = GateView { peers: Some(Peers { records: &recs, high_water: &hw, own: None, dev: 0, publish: true }), ..w.view(10_000) };
        let g = ProcGate::new();
        let e = g.launched(&v);
        g.completed(&v, e, 2_345, None);
        assert_eq!(g.launched(&v), 2_345);
        assert_eq!(recs[0].inflight_us[0].load(Relaxed), 0);
    }

    #[test]
    fn stale_old_or_departed_peers_are_not_counted() {
        let p = 1_000_000;
        let w = words(p, 100_000, 5 * p);
        let (recs, hw) = records(4);
        let v = GateView { peers: Some(Peers { records: &recs, high_water: &hw, own: Some(0), dev: 0, publish: true }), ..w.view(10_000) };
        let g = ProcGate::new();
        for r in &recs[1..] {
            r.inflight_us[0].store(100, Relaxed); // each would fill the allowance
        }
        recs[1].gate_ns.store(5 * p, Relaxed);
        recs[2].gate_ns.store(5 * p, Relaxed);
        recs[2].caps.store(0, Relaxed); // an older hook: its words are not its own
        recs[3].gate_ns.store(5 * p, Relaxed);
        recs[3].state.store(0, Relaxed); // detached
        assert_eq!(v.peers_ns(p, 5 * p), 100_000, "only the fresh, current, attached peer");
        assert_eq!(g.before_launch(&v, 5 * p), Decision::WaitUntil(6 * p));
        // Two periods without a gate decision: record 1 stopped calling CUDA
        // with launches unreaped. It no longer holds the others back.
        assert_eq!(v.peers_ns(p, 7 * p), 100_000);
        assert_eq!(v.peers_ns(p, 7 * p + 1), 0);
        assert_eq!(g.before_launch(&v, 7 * p + 1), Decision::Go);
        assert!(recs[0].gate_ns.load(Relaxed) == 7 * p + 1, "the gate marks its own record active");
        // Records past the high-water mark are not read.
        hw.store(1, Relaxed);
        recs[1].gate_ns.store(7 * p + 1, Relaxed);
        assert_eq!(v.peers_ns(p, 7 * p + 1), 0);
    }

    /// Two processes of one slice that take turns, with a bound of one
    /// launch (a best-effort slice beside an active high one), 10 ms period.
    struct TurnPair {
        w: GateWords,
        recs: Vec<ProcRecord>,
        hw: AtomicU32,
    }

    impl TurnPair {
        fn new() -> TurnPair {
            let w = words(10_000_000, u64::MAX / 2, 0);
            w.queue_launches.store(1, Relaxed);
            let (recs, hw) = records(2);
            for r in &recs {
                r.caps.store(CAP_PEER_INFLIGHT | CAP_TURNS, Relaxed);
            }
            TurnPair { w, recs, hw }
        }

        /// Both processes' views and gates, each gate's mean cost 200 µs (not tiny).
        fn gates(&self) -> [(GateView<'_>, ProcGate); 2] {
            [0, 1].map(|own| {
                let v = GateView { peers: Some(Peers { records: &self.recs, high_water: &self.hw, own: Some(own), dev: 0, publish: true }), ..self.w.view(10_000) };
                let g = ProcGate::new();
                let e = g.launched(&v);
                g.completed(&v, e, 200_000, None);
                (v, g)
            })
        }
    }

    #[test]
    fn under_a_bound_of_one_launch_the_slice_takes_turns() {
        // One launch in flight for the whole slice, and a process that
        // relaunches the moment its kernel is done yields to a peer that waited.
        let pair = TurnPair::new();
        let (p, w, recs) = (10_000_000, &pair.w, &pair.recs);
        let [(va, a), (vb, b)] = pair.gates();
        assert_eq!(a.before_launch(&va, 1_000), Decision::Go);
        let e = a.launched(&va);
        assert_eq!(recs[0].turn_since.load(Relaxed), TURN_HOLDING | 992, "a holds the turn on device 0 since ~1 µs");
        // a's launch is the slice's one: b looks again after half its estimate.
        assert_eq!(b.before_launch(&vb, 2_000), Decision::Yield { until: 2_000 + 100_000, ring: None, bell: 0 });
        assert_eq!(recs[1].turn_since.load(Relaxed), 2_000 & !0xF, "b says it waits, on device 0");
        assert_eq!(a.before_launch(&va, 3_000), Decision::Drain, "a's own bound holds as before");
        a.completed(&va, e, 200_000, None);
        // a would relaunch at once, but b waited: a yields, briefly, and rings b.
        assert_eq!(a.before_launch(&va, 201_000), Decision::Yield { until: 201_000 + p / TURN_MIN_DIV, ring: Some(1), bell: 0 });
        assert_eq!(recs[1].turn_bell.load(Relaxed), 1);
        assert_eq!(b.before_launch(&vb, 202_000), Decision::Go, "b's turn");
        let eb = b.launched(&vb);
        assert_eq!(recs[1].turn_since.load(Relaxed), TURN_HOLDING | (202_000 & !0xF), "b's wait ended: it holds the turn");
        assert_eq!(a.before_launch(&va, 203_000), Decision::Yield { until: 203_000 + 100_000, ring: None, bell: 0 }, "b has the launch: nobody to ring");
        b.completed(&vb, eb, 200_000, None);
        assert_eq!(a.before_launch(&va, 402_000), Decision::Go, "a waited since 201 µs");
        let ea = a.launched(&va);
        // A hold counts for twice the holder's estimate at most: b may launch
        // 400 µs after a took the turn, though a never reaped its launch
        // (it read its result back with a copy the hook does not see).
        assert!(matches!(b.before_launch(&vb, 402_000 + 400_000), Decision::Yield { .. }));
        assert_eq!(b.before_launch(&vb, 402_000 + 400_016), Decision::Go);
        let eb = b.launched(&vb);
        a.completed(&va, ea, 200_000, None);
        b.completed(&vb, eb, 200_000, None);
        recs[0].turn_since.store(0, Relaxed);
        recs[1].turn_since.store(0, Relaxed);
        // A wait nobody looked after for a quarter period no longer counts.
        recs[1].turn_since.store(1_000_000, Relaxed);
        recs[1].turn_poll_ns.store(1_000_000, Relaxed);
        assert!(matches!(a.before_launch(&va, 1_000_000 + p / TURN_FRESH_DIV), Decision::Yield { ring: Some(1), .. }));
        recs[0].turn_since.store(0, Relaxed);
        assert_eq!(a.before_launch(&va, 1_000_001 + p / TURN_FRESH_DIV), Decision::Go);
        // A wait on another device is not a wait here.
        recs[1].turn_since.store(4_000_000 | 1, Relaxed);
        recs[1].turn_poll_ns.store(4_000_000, Relaxed);
        assert_eq!(a.before_launch(&va, 4_000_000), Decision::Go);
        // With the usual bound of four, peers do not hold each other to one.
        w.queue_launches.store(4, Relaxed);
        recs[1].turn_since.store(4_000_000, Relaxed);
        assert_eq!(a.before_launch(&va, 4_000_000), Decision::Go);
        // Nor does a process whose hook does not take turns.
        w.queue_launches.store(1, Relaxed);
        recs[0].caps.store(CAP_PEER_INFLIGHT, Relaxed);
        assert_eq!(a.before_launch(&va, 4_000_000), Decision::Go);
    }

    #[test]
    fn launches_not_made_on_a_turn_hold_nobody_back() {
        let pair = TurnPair::new();
        let recs = &pair.recs;
        let [(va, a), (vb, b)] = pair.gates();
        let eb = b.launched(&vb);
        // An older hook's launch (no CAP_TURNS): it relaunches at once and
        // would never leave the launch free.
        recs[1].turn_since.store(TURN_HOLDING | 1_000, Relaxed);
        recs[1].caps.store(CAP_PEER_INFLIGHT, Relaxed);
        assert_eq!(a.before_launch(&va, 1_000), Decision::Go, "an older hook's launch");
        recs[1].caps.store(CAP_PEER_INFLIGHT | CAP_TURNS, Relaxed);
        // One made while the bound was larger (no hold).
        recs[1].turn_since.store(0, Relaxed);
        assert_eq!(a.before_launch(&va, 1_000), Decision::Go, "a launch not made on a turn");
        // b's launches become tiny while it holds a turn: the hold ends at
        // its next launch, though its tiny launches may never all be done.
        recs[1].turn_since.store(TURN_HOLDING | 1_008, Relaxed);
        assert!(matches!(a.before_launch(&va, 1_100), Decision::Yield { .. }), "b holds the turn");
        b.completed(&vb, eb, 200_000, None);
        for _ in 0..64 {
            let e = b.launched(&vb);
            b.completed(&vb, e, 1_000, None);
        }
        assert!(tiny(b.mean_ns()));
        b.launched(&vb);
        assert_eq!(b.before_launch(&vb, 1_200), Decision::Go, "tiny launches are not bound to one");
        assert_eq!(recs[1].turn_since.load(Relaxed), 0, "and hold no turn");
        assert_eq!(a.before_launch(&va, 1_300), Decision::Go);
    }

    #[test]
    fn a_thread_takes_turns_beside_its_processs_other_threads_launches() {
        // Two threads of a whose launches overlap: a never has nothing
        // unfinished. Its threads must still yield to b's older wait, or a
        // would keep the turn as long as it runs (a review: b got 0 of
        // 1,000 looks in 200 ms).
        let pair = TurnPair::new();
        let [(va, a), (vb, b)] = pair.gates();
        assert_eq!(a.before_launch_by(&va, 1_000, 0), Decision::Go, "thread 1");
        let e1 = a.launched(&va);
        assert!(matches!(b.before_launch(&vb, 2_000), Decision::Yield { .. }), "b waits since 2 µs");
        // Thread 2 of a, with nothing of its own, yields to b's older wait
        // (a's launch is a's own, so nothing holds it back but b).
        assert!(matches!(a.before_launch_by(&va, 3_000, 0), Decision::Yield { ring: None, .. }), "thread 2 yields to b (who cannot go yet)");
        // a still holds the turn with thread 1's launch: b may not go yet.
        assert!(matches!(b.before_launch(&vb, 4_000), Decision::Yield { .. }));
        a.completed(&va, e1, 200_000, None);
        assert!(matches!(a.before_launch_by(&va, 201_000, 0), Decision::Yield { ring: Some(1), .. }), "thread 1 yields too");
        assert_eq!(b.before_launch(&vb, 202_000), Decision::Go, "b's turn");
    }

    #[test]
    fn a_waiter_parked_on_the_allowance_holds_up_no_turn() {
        // a's side thread left 4 ms unreaped (published, as the hook does,
        // until a scan leaves the silent thread out); the allowance is
        // consumed + 3 ms. b, the oldest waiter, is refused by the allowance
        // (it counts a's 4 ms). a's main thread, with nothing of its own,
        // may still launch beside its own unreaped work (the allowance less
        // it); had b's wait stayed, a yielded to b and b to the allowance,
        // for as long as a's word stayed high (a review: 0 launches in 50
        // periods, the hook not rescanning while a yields).
        let pair = TurnPair::new();
        let [(va, a), (vb, b)] = pair.gates();
        pair.w.allowance_ns.store(3_000_000, Relaxed);
        pair.w.consumed_ns.store(0, Relaxed);
        pair.w.epoch_start_ns.store(1_000, Relaxed);
        assert_eq!(b.before_launch(&vb, 1_000), Decision::Go);
        let eb = b.launched(&vb);
        // a waits for b's launch; then a's side thread's 4 ms (one launch a never reaps).
        assert!(matches!(a.before_launch_by(&va, 2_000, 0), Decision::Yield { .. }));
        b.completed(&vb, eb, 0, None);
        pair.recs[0].turn_since.store(0, Relaxed); // a's thread took its turn and launched:
        a.inflight.store(1, Relaxed);
        a.inflight_ns.store(4_000_000, Relaxed);
        pair.recs[0].inflight_us[0].store(4_000, Relaxed);
        pair.recs[0].turn_since.store(TURN_HOLDING | 2_000, Relaxed);
        // b waits for a's hold (8 ms at most), and is then the oldest waiter.
        assert!(matches!(b.before_launch(&vb, 3_000), Decision::Yield { .. }));
        let t = 2_000 + 8_000_016;
        assert_eq!(b.before_launch(&vb, t), Decision::WaitUntil(1_000 + 10_000_000), "b's turn, but a's 4 ms fill the allowance");
        assert_eq!(pair.recs[1].turn_since.load(Relaxed), 0, "b parks on the allowance: its wait ends");
        assert_eq!(a.before_launch_by(&va, t + 1, 0), Decision::Go, "a's main thread launches beside its side thread's work");
    }
}
