//! The process-local ledger: what this process has charged, keyed by the
//! driver's handle, so that frees, releases and destroys uncharge exactly what
//! was charged. Behind a [`SpinLock`] that the fork child resets.

use crate::util::SpinLock;
use std::collections::BTreeMap;
use std::collections::btree_map::Entry;

/// A charge on one slice device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charge {
    pub dev: usize,
    pub bytes: u64,
}

/// A device pointer: charged directly (`pool == 0`) or through its pool.
#[derive(Debug, Clone, Copy)]
pub struct Ptr {
    pub charge: Charge,
    /// The `CUmemoryPool` an async allocation came from, 0 otherwise.
    pub pool: usize,
    /// The context current at the allocation (`cuMemAlloc_v2`, pitch,
    /// managed), whose destruction frees it; 0 for pool allocations (a pool is
    /// a device-level object, not freed with a context) or when unknown.
    pub ctx: usize,
}

/// A CUDA array or mipmapped array, freed with the context it was created in.
#[derive(Debug, Clone, Copy)]
pub struct Owned {
    pub charge: Charge,
    /// The context current at the creation (0 when unknown).
    pub ctx: usize,
}

/// A `cuMemCreate`/`cuMulticastCreate` handle: charged while `refs > 0`
/// (1 for the handle itself plus 1 per mapping and per retained reference).
#[derive(Debug, Clone, Copy)]
pub struct Physical {
    pub charge: Charge,
    pub refs: u32,
}

/// A memory pool's accounting: the slice is charged the pool's reserved size.
#[derive(Debug, Clone, Copy, Default)]
pub struct PoolAcct {
    pub dev: usize,
    /// Bytes charged for this pool.
    pub charged: u64,
    /// Part of `charged` pre-charged by allocations still in flight.
    pub inflight: u64,
    /// Bumped when an allocation from the pool starts and when it ends: a
    /// settle that read the pool's reserved size under an older epoch may
    /// have read it before an allocation grew the pool, so it must not
    /// take the charge down ([`PoolAcct::settle_to`]).
    pub epoch: u64,
}

impl PoolAcct {
    pub fn new(dev: usize) -> PoolAcct {
        PoolAcct { dev, charged: 0, inflight: 0, epoch: 0 }
    }

    /// Settles toward the pool's `reserved` size read under `seen_epoch`
    /// (plus allocations in flight): returns (bytes to charge, bytes to
    /// uncharge). Growth only when `grow` (an allocation path; the caller
    /// charges it and adds it to `charged`). A reading older than the
    /// last allocation's start or end never takes the charge down: it may
    /// predate that allocation's growth, already charged; the next settle
    /// reads again.
    pub fn settle_to(&mut self, reserved: u64, grow: bool, seen_epoch: u64) -> (u64, u64) {
        let target = reserved.saturating_add(self.inflight);
        if target > self.charged {
            return (if grow { target - self.charged } else { 0 }, 0);
        }
        if seen_epoch != self.epoch {
            return (0, 0);
        }
        let down = self.charged - target;
        self.charged = target;
        (0, down)
    }
}

/// A primary context as this process retained it.
#[derive(Debug, Clone, Copy)]
pub struct Primary {
    pub refs: u32,
    pub charge: Charge,
    /// Its `CUcontext` (0 until a retain returned it).
    pub handle: usize,
    /// Which incarnation: a retain that creates the context anew gives the
    /// entry a new generation, so a release racing it can tell that the
    /// context it released was destroyed.
    pub generation: u64,
}

/// What a context's destruction frees, taken out of the ledger.
#[derive(Debug, Default)]
pub struct CtxAllocs {
    pub ptrs: Vec<(u64, Ptr)>,
    pub arrays: Vec<(usize, Owned)>,
}

#[derive(Default)]
pub struct Ledger {
    pub ptrs: BTreeMap<u64, Ptr>,
    pub arrays: BTreeMap<usize, Owned>,
    pub physical: BTreeMap<u64, Physical>,
    /// Mapped VA start → (size, handle).
    pub mappings: BTreeMap<u64, (u64, u64)>,
    /// (sparse array, tiles) → the handle mapped there (`cuda::sparse`).
    pub sparse: BTreeMap<(usize, egpu_cuda::SparseTiles), u64>,
    pub pools: BTreeMap<usize, PoolAcct>,
    pub ctxs: BTreeMap<usize, Charge>,
    pub primary: BTreeMap<i32, Primary>,
    /// Green context → the device whose primary context the hook retained for it.
    pub greens: BTreeMap<usize, i32>,
    /// Graph exec → what its instantiation charged.
    pub graph_execs: BTreeMap<usize, Vec<Charge>>,
    /// Graph → memory-alloc nodes added with cuGraphAddMemAllocNode.
    pub graph_nodes: BTreeMap<usize, Vec<Charge>>,
    /// Slice device → graph memory accounting (the device's graph memory pool).
    pub graph_mem: BTreeMap<usize, GraphAcct>,
}

/// Graph memory on one slice device. The driver keeps what graphs
/// allocated in the device's graph memory pool after their executables are
/// destroyed, until `cuDeviceGraphMemTrim`, and a later graph reuses it; so
/// the slice is charged the larger of what live executables need and what
/// the pool may still hold.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GraphAcct {
    /// Sum of the charges of live executables (instantiated, not destroyed).
    pub live: u64,
    /// Bytes charged for graph memory on the device (never below `live`).
    pub charged: u64,
}

impl GraphAcct {
    /// An instantiation needing `need`, with `in_use` bytes of the pool
    /// associated with graphs now (the driver's
    /// `CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT`; 0 where it cannot say): the
    /// part the pool's free memory does not already cover, which the caller
    /// must charge. Memory in use beyond what the live executables are
    /// charged (`live` before this one) is not theirs: an allocation a
    /// graph did not free outlives it, and the pool memory holding it is
    /// not free for the next graph. What live executables hold themselves
    /// (a launched graph keeps its memory mapped) is not counted twice.
    /// The driver does not say whose memory is whose, so where executables
    /// never launched coexist with such an allocation it is under-counted
    /// by up to their size.
    pub fn instantiate(&mut self, need: u64, in_use: u64) -> u64 {
        let outliving = in_use.saturating_sub(self.live);
        self.live = self.live.saturating_add(need);
        let extra = self.live.saturating_add(outliving).saturating_sub(self.charged);
        self.charged += extra;
        extra
    }

    /// Undoes [`GraphAcct::instantiate`] (the charge or the real call failed).
    pub fn undo_instantiate(&mut self, need: u64, extra: u64) {
        self.live = self.live.saturating_sub(need);
        self.charged = self.charged.saturating_sub(extra).max(self.live);
    }

    /// An executable needing `need` was destroyed, or the pool was trimmed
    /// (`need` 0): settles the charge at what the pool holds, `reserved`
    /// (the driver's `CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT`; `None` where
    /// it cannot say, which keeps the charge), never below the live
    /// executables' need nor above what was charged. Returns the bytes to
    /// uncharge.
    pub fn settle(&mut self, need: u64, reserved: Option<u64>) -> u64 {
        self.live = self.live.saturating_sub(need);
        let target = reserved.map_or(self.charged, |r| r.min(self.charged)).max(self.live);
        let freed = self.charged.saturating_sub(target);
        self.charged = target;
        freed
    }
}

impl Ledger {
    pub const fn new() -> Ledger {
        Ledger {
            ptrs: BTreeMap::new(),
            arrays: BTreeMap::new(),
            physical: BTreeMap::new(),
            mappings: BTreeMap::new(),
            sparse: BTreeMap::new(),
            pools: BTreeMap::new(),
            ctxs: BTreeMap::new(),
            primary: BTreeMap::new(),
            greens: BTreeMap::new(),
            graph_execs: BTreeMap::new(),
            graph_nodes: BTreeMap::new(),
            graph_mem: BTreeMap::new(),
        }
    }

    /// Takes out every entry the driver frees when context `ctx` is destroyed:
    /// linear memory (`cuMemAlloc_v2`, pitch, managed) and arrays made while
    /// it was current. Pool allocations, `cuMemCreate` handles, mappings and
    /// graph memory are device-level and stay.
    pub fn take_ctx(&mut self, ctx: usize) -> CtxAllocs {
        let mut out = CtxAllocs::default();
        if ctx == 0 {
            return out;
        }
        self.ptrs.retain(|&k, v| {
            let owned = v.ctx == ctx && v.pool == 0;
            if owned {
                out.ptrs.push((k, *v));
            }
            !owned
        });
        self.arrays.retain(|&k, v| {
            let owned = v.ctx == ctx;
            if owned {
                out.arrays.push((k, *v));
            }
            !owned
        });
        out
    }

    /// Puts back what [`Ledger::take_ctx`] took (the context was not
    /// destroyed). A key recorded meanwhile wins: the address or handle was
    /// freed (the free found no entry) and handed out again, so the old
    /// allocation is gone; it is returned, to be uncharged.
    pub fn restore_ctx(&mut self, t: CtxAllocs) -> CtxAllocs {
        let mut gone = CtxAllocs::default();
        for (k, v) in t.ptrs {
            match self.ptrs.entry(k) {
                Entry::Occupied(_) => gone.ptrs.push((k, v)),
                Entry::Vacant(e) => {
                    e.insert(v);
                }
            }
        }
        for (k, v) in t.arrays {
            match self.arrays.entry(k) {
                Entry::Occupied(_) => gone.arrays.push((k, v)),
                Entry::Vacant(e) => {
                    e.insert(v);
                }
            }
        }
        gone
    }
}

impl CtxAllocs {
    pub fn is_empty(&self) -> bool {
        self.ptrs.is_empty() && self.arrays.is_empty()
    }

    /// Bytes per slice device, summed.
    pub fn charges(&self) -> impl Iterator<Item = Charge> + '_ {
        self.ptrs.iter().map(|(_, p)| p.charge).chain(self.arrays.iter().map(|(_, a)| a.charge))
    }
}

pub static LEDGER: SpinLock<Ledger> = SpinLock::new(Ledger::new());

/// Fork child: the parent's allocations are not the child's.
pub fn reset_after_fork() {
    LEDGER.force_unlock();
    let old = std::mem::take(&mut *LEDGER.lock());
    // The child never frees through these entries. They are leaked, not
    // dropped: another thread of the parent may have been inside a map
    // operation at the fork, and walking a half-updated tree could crash.
    std::mem::forget(old);
}

#[cfg(test)]
mod tests {
    use super::GraphAcct;

    #[test]
    fn the_graph_charge_follows_the_pool_not_the_executables() {
        let mut a = GraphAcct::default();
        assert_eq!(a.instantiate(100, 0), 100);
        // A second live graph is charged in full.
        assert_eq!(a.instantiate(50, 0), 50);
        assert_eq!((a.live, a.charged), (150, 150));
        // Destroyed, but the pool still holds 150: nothing is given back.
        assert_eq!(a.settle(100, Some(150)), 0);
        assert_eq!((a.live, a.charged), (50, 150));
        // The next graph reuses the pool: charged only past it.
        assert_eq!(a.instantiate(120, 0), 20);
        assert_eq!((a.live, a.charged), (170, 170));
        // A driver that cannot say what the pool holds keeps the charge.
        assert_eq!(a.settle(120, None), 0);
        assert_eq!(a.charged, 170);
        // A trim leaves the pool at 10 bytes, but the live graph needs 50:
        // the charge never drops below what live executables need.
        assert_eq!(a.settle(0, Some(10)), 120);
        assert_eq!((a.live, a.charged), (50, 50));
        // The pool reporting more than was charged never raises the charge.
        assert_eq!(a.settle(0, Some(1 << 40)), 0);
        assert_eq!(a.charged, 50);
    }

    #[test]
    fn a_pool_reading_older_than_an_allocation_never_takes_its_charge_down() {
        use super::PoolAcct;
        let mut a = PoolAcct::new(0);
        // A settle reads the pool's size (0) at epoch 0; meanwhile an
        // allocation starts, grows the pool to 256 and settles it.
        let seen = a.epoch;
        a.epoch += 1;
        a.inflight += 256;
        a.charged += 256;
        a.inflight -= 256;
        a.epoch += 1;
        assert_eq!(a.settle_to(256, true, a.epoch), (0, 0));
        // The stale reading would uncharge the allocation's growth: refused.
        assert_eq!(a.settle_to(0, false, seen), (0, 0));
        assert_eq!(a.charged, 256);
        // A fresh reading after a free settles down.
        assert_eq!(a.settle_to(0, false, a.epoch), (0, 256));
        assert_eq!(a.charged, 0);
        // Growth is charged only on an allocation path, whatever the epoch.
        assert_eq!(a.settle_to(100, false, 0), (0, 0));
        assert_eq!(a.settle_to(100, true, 0), (100, 0));
    }

    #[test]
    fn pool_memory_an_unfreed_allocation_holds_is_not_reused() {
        // A graph allocated 600 and did not free it; its executable is
        // gone, the pool holds 600, all of it in use.
        let mut a = GraphAcct::default();
        assert_eq!(a.instantiate(600, 0), 600);
        assert_eq!(a.settle(600, Some(600)), 0);
        assert_eq!((a.live, a.charged), (0, 600));
        // A second graph needing 600 cannot take the pool's 600: charged
        // in full, so the two allocations are both counted.
        assert_eq!(a.instantiate(600, 600), 600);
        assert_eq!((a.live, a.charged), (600, 1200));
        // With the allocation freed (the pool's memory free), a third
        // graph reuses what is charged.
        assert_eq!(a.settle(600, Some(1200)), 0);
        assert_eq!(a.instantiate(600, 0), 0);
        // A launched graph keeps its own memory mapped (in use): a second
        // executable beside it is charged its own need, not that twice.
        let mut a = GraphAcct::default();
        assert_eq!(a.instantiate(256, 0), 256);
        assert_eq!(a.instantiate(256, 256), 256);
        assert_eq!((a.live, a.charged), (512, 512));
    }

    #[test]
    fn an_undone_instantiation_leaves_the_accounting_as_it_was() {
        let mut a = GraphAcct { live: 10, charged: 100 };
        let extra = a.instantiate(200, 0);
        assert_eq!(extra, 110);
        a.undo_instantiate(200, extra);
        assert_eq!(a, GraphAcct { live: 10, charged: 100 });
        // Two at once, the first undone after the second: each keeps its part.
        let mut a = GraphAcct::default();
        let e1 = a.instantiate(64, 0);
        let e2 = a.instantiate(64, 0);
        a.undo_instantiate(64, e1);
        assert_eq!((a.live, a.charged, e2), (64, 64, 64));
    }
}
