//! What this process tells the other processes of its slice about its
//! unfinished work: the usage record's `inflight_us[dev]`, which their gates
//! count against the slice's allowance (`docs/compute-arbiter.md`, "Several
//! processes in one slice").
//!
//! Peers stop counting a whole record once its gate has been silent for two
//! periods. Inside a process that is not enough: a thread can only reap its
//! own launches, so a thread that launched and then stopped calling CUDA
//! leaves its launches unreaped for ever while the other threads keep the
//! record fresh. Counted, they would hold the slice's other processes back
//! for as long (a worker whose side thread left 4 ms queued starved a 30%
//! slice's other process completely). So the record holds the work of the
//! threads that are themselves active: every launching thread has a slot
//! here with its own unfinished work and when it last launched or reaped,
//! and the published word is all of it less the slots silent for two
//! periods (recomputed at most every 16th of a period, and at once when a
//! silent thread comes back).
//!
//! The word is stored, not added to: the process's total is the gate's own
//! sum of its unfinished estimates (`ProcGate::inflight_ns`, whole µs where
//! there is a record to publish in), less the silent threads' sum. Two
//! threads storing at once may leave the older of two values for a moment,
//! and the next launch or completion of any thread stores it right; nothing
//! can drift. A thread's slot is written only by the thread itself (plain
//! stores, no read-modify-write on the launch path), and read by the scan.
//! Threads beyond [`SLOTS`] are counted in the total and never left out.

use egpu_abi::{MAX_DEVICES, ProcRecord};
use egpu_arbiter::gate::Peers;
use std::cell::Cell;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicU32, AtomicU64};

/// Launching threads tracked one by one.
pub const SLOTS: usize = 256;

struct Slot {
    /// 0: free; else the fork generation it was claimed in, plus one.
    owner: AtomicU64,
    /// CLOCK_MONOTONIC ns of the thread's last launch or completion.
    last_ns: AtomicU64,
    /// Its unfinished work per slice device, µs.
    us: [AtomicU32; MAX_DEVICES],
}

static THREADS: [Slot; SLOTS] = [const { Slot { owner: AtomicU64::new(0), last_ns: AtomicU64::new(0), us: [const { AtomicU32::new(0) }; MAX_DEVICES] } }; SLOTS];
/// The silent threads' unfinished work, µs (as of the last scan).
static SILENT: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];
/// When the silent threads were last summed.
static SCANNED: AtomicU64 = AtomicU64::new(0);
/// Bumped in a fork child: slots of another generation are the parent's.
static GEN: AtomicU64 = AtomicU64::new(0);
const NO_SLOT: usize = usize::MAX;
/// All slots taken: the thread is counted in the total only.
const FULL: usize = usize::MAX - 1;

thread_local! {
    /// This thread's slot and the generation it was claimed in (no destructor:
    /// usable from other thread-local destructors at thread exit).
    static MINE: Cell<(usize, u64)> = const { Cell::new((NO_SLOT, 0)) };
}

fn slot() -> Option<&'static Slot> {
    let gen_ = GEN.load(Relaxed);
    let (i, g) = MINE.try_with(Cell::get).unwrap_or((FULL, gen_));
    let i = if g != gen_ || i == NO_SLOT {
        let i = THREADS.iter().position(|s| s.owner.compare_exchange(0, gen_ + 1, Relaxed, Relaxed).is_ok()).unwrap_or(FULL);
        let _ = MINE.try_with(|m| m.set((i, gen_)));
        i
    } else {
        i
    };
    THREADS.get(i)
}

fn us(est_ns: u64) -> u32 {
    u32::try_from(est_ns / 1000).unwrap_or(u32::MAX)
}

/// This thread launched on `dev` with estimate `est_ns`; `total_ns` is the
/// process's unfinished estimate there now, this launch included.
#[inline]
pub fn add(p: Option<&Peers<'_>>, dev: usize, est_ns: u64, now: u64, fresh_ns: u64, total_ns: u64) {
    let Some((p, r)) = p.and_then(|p| Some((p, p.own_record()?))) else { return };
    let mut back = false;
    if let Some(s) = slot() {
        let last = s.last_ns.load(Relaxed);
        s.last_ns.store(now, Relaxed);
        // A thread that was left out is counted again at once, not at the next scan.
        back = now.saturating_sub(last) > fresh_ns && s.us.iter().any(|w| w.load(Relaxed) != 0);
        let w = &s.us[dev];
        w.store(w.load(Relaxed).saturating_add(us(est_ns)), Relaxed);
    }
    if back {
        scan(p, r, now, fresh_ns, |d| if d == dev { total_ns } else { super::GATES[d].inflight_ns() });
    } else {
        store(p, r, dev, total_ns);
    }
}

/// This thread's launches on `dev` with summed estimate `est_ns` finished
/// (or were given up, or not made); `total_ns` as for [`add`], after them.
#[inline]
pub fn sub(p: Option<&Peers<'_>>, dev: usize, est_ns: u64, now: u64, total_ns: u64) {
    let Some((p, r)) = p.and_then(|p| Some((p, p.own_record()?))) else { return };
    if let Some(s) = slot() {
        s.last_ns.store(now, Relaxed);
        let w = &s.us[dev];
        w.store(w.load(Relaxed).saturating_sub(us(est_ns)), Relaxed);
    }
    store(p, r, dev, total_ns);
}

/// Sums the silent threads' work again if the last sum is a 16th of a
/// period old (`fresh_ns` is two periods), and republishes.
#[inline]
pub fn maybe_scan(p: Option<&Peers<'_>>, now: u64, fresh_ns: u64) {
    let last = SCANNED.load(Relaxed);
    if let Some(p) = p
        && let Some(r) = p.own_record()
        && now.saturating_sub(last) >= fresh_ns / 32
        && SCANNED.compare_exchange(last, now, Relaxed, Relaxed).is_ok()
    {
        scan(p, r, now, fresh_ns, |d| super::GATES[d].inflight_ns());
    }
}

#[cold]
fn scan(p: &Peers<'_>, rec: &ProcRecord, now: u64, fresh_ns: u64, total_ns: impl Fn(usize) -> u64) {
    let gen_ = GEN.load(Relaxed) + 1;
    let mut silent = [0u64; MAX_DEVICES];
    for s in THREADS.iter().filter(|s| s.owner.load(Relaxed) == gen_) {
        if now.saturating_sub(s.last_ns.load(Relaxed)) > fresh_ns {
            for (d, w) in s.us.iter().enumerate() {
                silent[d] += u64::from(w.load(Relaxed));
            }
        }
    }
    for (d, v) in silent.into_iter().enumerate() {
        SILENT[d].store(v, Relaxed);
        store(p, rec, d, total_ns(d));
    }
}

/// The record's word for `dev`: the process's unfinished work less the
/// silent threads'. Not while no other record of the slice was ever used:
/// nobody reads it then, and the first launch or completion after a peer
/// attaches stores the whole value (it is stored, not added to).
#[inline]
fn store(p: &Peers<'_>, rec: &ProcRecord, dev: usize, total_ns: u64) {
    if p.high_water.load(Relaxed) <= 1 {
        return;
    }
    let v = (total_ns / 1000).saturating_sub(SILENT[dev].load(Relaxed));
    rec.inflight_us[dev].store(u32::try_from(v).unwrap_or(u32::MAX), Relaxed);
}

/// The calling thread is exiting (its launches were given back already).
pub fn thread_exit() {
    if let Ok((i, g)) = MINE.try_with(Cell::get)
        && let Some(s) = THREADS.get(i)
        && g == GEN.load(Relaxed)
    {
        for w in &s.us {
            w.store(0, Relaxed);
        }
        s.owner.store(0, Relaxed);
        let _ = MINE.try_with(|m| m.set((NO_SLOT, g)));
    }
}

/// Fork child: the parent's threads and their work are not this process's.
pub fn reset_after_fork() {
    GEN.fetch_add(1, Relaxed);
    for s in &THREADS {
        s.owner.store(0, Relaxed);
        s.last_ns.store(0, Relaxed);
        for w in &s.us {
            w.store(0, Relaxed);
        }
    }
    for w in &SILENT {
        w.store(0, Relaxed);
    }
    SCANNED.store(0, Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    /// The only test of this module: the statics are the process's, so the
    /// steps run in order in one test (explicit clock values, no sleeps).
    #[test]
    fn silent_threads_are_left_out_and_counted_again_when_back() {
        let recs: Vec<ProcRecord> = (0..2).map(|_| ProcRecord::default()).collect();
        let hw = AtomicU32::new(1);
        let p = Peers { records: &recs, high_water: &hw, own: Some(0), dev: 0, publish: false };
        let word = || recs[0].inflight_us[0].load(Relaxed);
        let fresh = 1_000;
        // Alone in the slice: nothing is stored.
        add(Some(&p), 0, 3_000, 50, fresh, 3_000);
        assert_eq!(word(), 0);
        sub(Some(&p), 0, 3_000, 60, 0);
        hw.store(2, Relaxed);
        // Another thread launches 10 µs at t=100 and then stays silent (it
        // ends here without giving its slot back, as a live idle thread).
        std::thread::scope(|s| s.spawn(|| add(Some(&p), 0, 10_000, 100, fresh, 10_000)).join().unwrap());
        assert_eq!(word(), 10);
        // This thread launches 5 µs at t=1900: the whole 15 µs is published.
        add(Some(&p), 0, 5_000, 1_900, fresh, 15_000);
        assert_eq!(word(), 15);
        // At t=2000 the other thread has been silent for longer than `fresh`.
        // A scan takes the total from the process's gate: 15 µs unfinished.
        let w = egpu_arbiter::gate::GateWords::default();
        let v = w.view(10_000);
        let g = &super::super::GATES[0];
        g.completed(&v, 0, 5_000, None);
        for _ in 0..3 {
            g.launched(&v);
        }
        assert_eq!(g.inflight_ns(), 15_000);
        maybe_scan(Some(&p), 2_000, fresh);
        assert_eq!(word(), 5, "the silent thread's 10 µs is left out");
        // A scan is not repeated within a 32nd of `fresh`.
        recs[0].inflight_us[0].store(99, Relaxed);
        maybe_scan(Some(&p), 2_010, fresh);
        assert_eq!(word(), 99);
        // This thread falls silent too: at t=4000 both are left out.
        maybe_scan(Some(&p), 4_000, fresh);
        assert_eq!(word(), 0);
        // It launches again at t=5000: it is counted again at once (not at
        // the next scan), the other thread still not.
        add(Some(&p), 0, 5_000, 5_000, fresh, 20_000);
        assert_eq!(word(), 10);
        // Its launches complete: the word follows the total.
        sub(Some(&p), 0, 10_000, 5_100, 10_000);
        assert_eq!(word(), 0, "only the silent thread's work is left, and it is left out");
        // A fork child starts with nothing left out.
        reset_after_fork();
        add(Some(&p), 0, 2_000, 6_000, fresh, 12_000);
        assert_eq!(word(), 12, "the parent's silent thread is no longer known");
    }
}
