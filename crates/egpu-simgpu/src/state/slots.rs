//! Process slots: claim, charge, sweep. See the protocol in [`super`].

use super::live::{SlotLocks, my_pid};
use super::{MAX_DEVS, Shared, Slot};
use std::sync::atomic::Ordering::SeqCst;

/// The state half of a slot's `owner` word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum SlotState {
    Free = 0,
    /// Claimed by CAS; the start time is being written.
    Claiming = 1,
    Live = 2,
    /// Being reclaimed by the pid in the word.
    Reclaim = 3,
}

fn pack(pid: u32, st: SlotState) -> u64 {
    (pid as u64) << 8 | st as u64
}

fn unpack(w: u64) -> (u32, SlotState) {
    let st = match w & 0xff {
        1 => SlotState::Claiming,
        2 => SlotState::Live,
        3 => SlotState::Reclaim,
        _ => SlotState::Free,
    };
    ((w >> 8) as u32, st)
}

/// One live process as NVML reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcUsage {
    pub pid: u32,
    pub bytes: u64,
    pub busy_ns: u64,
}

impl Slot {
    fn zero(&self) {
        for d in 0..MAX_DEVS {
            self.mem[d].store(0, SeqCst);
            self.busy[d].store(0, SeqCst);
        }
    }
}

impl Shared {
    /// Claims a free slot for `pid` (started at `start`) under `locks`,
    /// sweeping dead processes if none is free. The slot's lock byte is taken
    /// before the slot is marked taken, so a sweeper never sees a taken slot
    /// without its lock.
    pub fn claim_slot(&self, locks: &SlotLocks, pid: u32, start: u64) -> Option<usize> {
        for round in 0..2 {
            for (i, s) in self.slots.iter().enumerate() {
                if s.owner.load(SeqCst) != 0 || !locks.hold(i) {
                    continue;
                }
                if s.owner.compare_exchange(0, pack(pid, SlotState::Claiming), SeqCst, SeqCst).is_ok() {
                    s.zero();
                    s.start.store(start, SeqCst);
                    s.owner.store(pack(pid, SlotState::Live), SeqCst);
                    return Some(i);
                }
                locks.release(i);
            }
            if round == 0 && self.sweep(locks) == 0 {
                return None;
            }
        }
        None
    }

    /// Frees a slot held under `locks` (used by tests and clean shutdown).
    pub fn release_slot(&self, locks: &SlotLocks, i: usize) {
        let s = &self.slots[i];
        s.owner.store(pack(my_pid(), SlotState::Reclaim), SeqCst);
        s.zero();
        s.owner.store(0, SeqCst);
        locks.release(i);
    }

    /// Owner pid and state of slot `i`.
    pub fn slot_owner(&self, i: usize) -> (u32, SlotState) {
        unpack(self.slots[i].owner.load(SeqCst))
    }

    /// Reclaims the slots of dead processes; returns how many were freed. A
    /// taken slot whose lock byte `locks` can take has no live owner (nor a
    /// live sweeper: a sweeper holds the byte while it reclaims, so one that
    /// died mid-way is taken over).
    pub fn sweep(&self, locks: &SlotLocks) -> usize {
        let me = my_pid();
        let mut freed = 0;
        for (i, s) in self.slots.iter().enumerate() {
            let w = s.owner.load(SeqCst);
            if unpack(w).1 == SlotState::Free || !locks.hold(i) {
                continue;
            }
            if s.owner.compare_exchange(w, pack(me, SlotState::Reclaim), SeqCst, SeqCst).is_ok() {
                s.zero();
                s.owner.store(0, SeqCst);
                freed += 1;
            }
            locks.release(i);
        }
        freed
    }

    /// Device memory in use on physical device `dev`, all processes.
    pub fn used(&self, dev: usize) -> u64 {
        self.slots.iter().map(|s| s.mem[dev].load(SeqCst)).fold(0u64, u64::saturating_add)
    }

    /// Charges `n` bytes on `dev` to `slot` if the device has room.
    /// On a full device it sweeps dead processes and tries again.
    pub fn charge(&self, locks: &SlotLocks, slot: usize, dev: usize, n: u64) -> bool {
        if n == 0 {
            return true;
        }
        let total = self.devs[dev].total;
        let mine = &self.slots[slot].mem[dev];
        for attempt in 0..4 {
            mine.fetch_add(n, SeqCst);
            if self.used(dev) <= total {
                return true;
            }
            mine.fetch_sub(n, SeqCst);
            match attempt {
                0 => {
                    self.sweep(locks);
                }
                _ => std::thread::yield_now(),
            }
        }
        false
    }

    /// Returns `n` bytes on `dev` charged to `slot` (never below zero).
    pub fn uncharge(&self, slot: usize, dev: usize, n: u64) {
        let _ = self.slots[slot].mem[dev].fetch_update(SeqCst, SeqCst, |v| Some(v.saturating_sub(n)));
    }

    /// Live processes with memory on `dev` (sweeping the dead first).
    pub fn procs_on(&self, locks: &SlotLocks, dev: usize) -> Vec<ProcUsage> {
        self.sweep(locks);
        self.slots
            .iter()
            .filter_map(|s| {
                let (pid, st) = unpack(s.owner.load(SeqCst));
                let bytes = s.mem[dev].load(SeqCst);
                (st == SlotState::Live && bytes > 0).then(|| ProcUsage { pid, bytes, busy_ns: s.busy[dev].load(SeqCst) })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::super::live::start_time;
    use super::super::MAX_SLOTS;
    use super::super::tests::fresh_at;
    use super::*;

    /// A state and one "process": a lock description of its file.
    fn fresh_proc(n: usize, gib: u64) -> (&'static Shared, std::path::PathBuf, SlotLocks) {
        let (s, path) = fresh_at(n, gib);
        let l = SlotLocks::open(&path).unwrap();
        (s, path, l)
    }

    #[test]
    fn claim_charge_release() {
        let (s, _, l) = fresh_proc(2, 1);
        let me = my_pid();
        let a = s.claim_slot(&l, me, start_time(me).unwrap()).unwrap();
        let b = s.claim_slot(&l, me, start_time(me).unwrap()).unwrap();
        assert_ne!(a, b);
        assert_eq!(s.slot_owner(a), (me, SlotState::Live));
        assert!(s.charge(&l, a, 0, 600 << 20));
        assert!(!s.charge(&l, b, 0, 600 << 20), "1 GiB device cannot hold 1.2 GiB");
        assert!(s.charge(&l, b, 1, 600 << 20), "other device is independent");
        assert_eq!(s.used(0), 600 << 20);
        assert_eq!(s.procs_on(&l, 0), vec![ProcUsage { pid: me, bytes: 600 << 20, busy_ns: 0 }]);
        s.uncharge(a, 0, 100 << 20);
        assert!(s.charge(&l, b, 0, 524 << 20));
        assert_eq!(s.used(0), 1 << 30);
        s.uncharge(a, 0, u64::MAX);
        assert_eq!(s.used(0), 524 << 20, "uncharge saturates at zero");
        s.release_slot(&l, a);
        assert_eq!(s.slot_owner(a).1, SlotState::Free);
        assert!(!l.holds(a) && l.holds(b));
    }

    #[test]
    fn a_dead_processes_slot_is_swept_whatever_its_pid() {
        let (s, path, l) = fresh_proc(1, 1);
        // Another process (its own lock description) charges the whole
        // device, then dies: the kernel drops its locks.
        let other = SlotLocks::open(&path).unwrap();
        let d = s.claim_slot(&other, my_pid(), 1).unwrap();
        assert!(s.charge(&other, d, 0, 1 << 30));
        let me = s.claim_slot(&l, my_pid(), start_time(my_pid()).unwrap()).unwrap();
        assert!(!s.charge(&l, me, 0, 512 << 20), "the device is full while it lives");
        assert_eq!(s.slot_owner(d).1, SlotState::Live);
        // No sibling test's child may share `other`'s description now.
        let _no_spawns = crate::state::tests::SPAWNS.write().unwrap_or_else(|e| e.into_inner());
        drop(other);
        // Full device: charging sweeps the dead one first, then fits.
        assert!(s.charge(&l, me, 0, 512 << 20));
        assert_eq!(s.slot_owner(d).1, SlotState::Free);
        assert_eq!(s.used(0), 512 << 20);
    }

    #[test]
    fn a_live_process_of_another_pid_namespace_is_not_swept() {
        // A container's process records the pid its own namespace gives it
        // (often 1, or a pid no process here has, or one a host process has
        // with another start time). It holds its lock: it stays.
        let (s, path, l) = fresh_proc(1, 1);
        let container = SlotLocks::open(&path).unwrap();
        let gone = crate::state::tests::spawn_true();
        let slots: Vec<usize> = [(1, 12345), (gone, 7)].iter().map(|&(pid, st)| s.claim_slot(&container, pid, st).unwrap()).collect();
        for &i in &slots {
            assert!(s.charge(&container, i, 0, 256 << 20));
        }
        assert_eq!(s.sweep(&l), 0);
        assert_eq!(s.used(0), 512 << 20);
        assert_eq!(s.procs_on(&l, 0).iter().map(|p| p.pid).collect::<Vec<_>>(), [1, gone]);
    }

    #[test]
    fn interrupted_reclaim_is_taken_over() {
        let (s, path, l) = fresh_proc(1, 1);
        let i = {
            let dead = SlotLocks::open(&path).unwrap();
            let i = s.claim_slot(&dead, 4242, 1).unwrap();
            s.slots[i].mem[0].store(123, SeqCst);
            i
        };
        // A sweeper (also dead: it holds no lock) claimed it for reclaim and died mid-way.
        s.slots[i].owner.store(pack(4343, SlotState::Reclaim), SeqCst);
        assert_eq!(s.sweep(&l), 1);
        assert_eq!(s.used(0), 0);
        // A claim that died before it was complete is reclaimed too.
        s.slots[i].owner.store(pack(4444, SlotState::Claiming), SeqCst);
        assert_eq!(s.sweep(&l), 1);
        // And a sweep never takes its own process's slots.
        let mine = s.claim_slot(&l, my_pid(), 1).unwrap();
        assert_eq!(s.sweep(&l), 0);
        assert_eq!(s.slot_owner(mine).1, SlotState::Live);
        // A lock never conflicts with its own description, so the held set
        // decides: a second thread cannot take what the first holds.
        assert!(!l.hold(mine), "one description took its own slot twice");
        let free = (0..MAX_SLOTS).find(|&i| s.slot_owner(i).1 == SlotState::Free && !l.holds(i)).unwrap();
        assert!(l.hold(free) && !l.hold(free));
        l.release(free);
        assert!(l.hold(free));
    }

    #[test]
    fn racing_chargers_never_exceed_the_device() {
        let (s, _, l) = fresh_proc(1, 1);
        let me = my_pid();
        let st = start_time(me).unwrap();
        let slots: Vec<usize> = (0..4).map(|_| s.claim_slot(&l, me, st).unwrap()).collect();
        let l = &l;
        let ok: u64 = std::thread::scope(|sc| {
            let hs: Vec<_> = slots
                .iter()
                .map(|&sl| sc.spawn(move || (0..64).filter(|_| s.charge(l, sl, 0, 8 << 20)).count() as u64))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert!(ok * (8 << 20) <= 1 << 30);
        assert_eq!(s.used(0), ok * (8 << 20));
        assert!(ok >= 100, "admission should be near the limit, got {ok} of 128");
    }

    #[test]
    fn pack_roundtrip() {
        for st in [SlotState::Free, SlotState::Claiming, SlotState::Live, SlotState::Reclaim] {
            assert_eq!(unpack(pack(4_000_000, st)), (4_000_000, st));
        }
    }
}
