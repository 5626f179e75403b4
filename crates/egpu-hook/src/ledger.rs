//! The process-local ledger: what this process has charged, keyed by the
//! driver's handle, so that frees, releases and destroys uncharge exactly what
//! was charged. Behind a [`SpinLock`] that the fork child resets.

use crate::util::SpinLock;
use std::collections::BTreeMap;

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
}

#[derive(Default)]
pub struct Ledger {
    pub ptrs: BTreeMap<u64, Ptr>,
    pub arrays: BTreeMap<usize, Charge>,
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
