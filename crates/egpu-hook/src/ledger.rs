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
    pub pools: BTreeMap<usize, PoolAcct>,
    pub ctxs: BTreeMap<usize, Charge>,
    pub primary: BTreeMap<i32, Primary>,
    /// Graph exec → what its instantiation charged.
    pub graph_execs: BTreeMap<usize, Vec<Charge>>,
    /// Graph → memory-alloc nodes added with cuGraphAddMemAllocNode.
    pub graph_nodes: BTreeMap<usize, Vec<Charge>>,
}

impl Ledger {
    pub const fn new() -> Ledger {
        Ledger {
            ptrs: BTreeMap::new(),
            arrays: BTreeMap::new(),
            physical: BTreeMap::new(),
            mappings: BTreeMap::new(),
            pools: BTreeMap::new(),
            ctxs: BTreeMap::new(),
            primary: BTreeMap::new(),
            graph_execs: BTreeMap::new(),
            graph_nodes: BTreeMap::new(),
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
