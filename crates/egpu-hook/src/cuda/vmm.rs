//! Virtual memory management (`cuMemCreate` and friends) and multicast.
//!
//! - `cuMemCreate` with a device location is charged its size on that
//!   device; host-located (`HOST`, `HOST_NUMA*`) handles are never charged.
//! - The physical memory lives until the handle is released *and* unmapped
//!   everywhere, so the charge is refcounted: 1 for the handle, +1 per
//!   `cuMemMap`, +1 per `cuMemRetainAllocationHandle`; `cuMemRelease` and
//!   `cuMemUnmap` drop references and the last one uncharges.
//! - Imported handles (`cuMemImportFromShareableHandle`) and handles retained
//!   from memory this process did not create are never charged to it.
//! - `cuMulticastCreate` is charged its size on the current context's device
//!   and uncharged when its handle is released (a conservative choice: the
//!   physical memory bound to it is charged where it was created as well).

use super::sig;
use crate::detour::Outcome;
use crate::devmap;
use crate::ledger::{Charge, LEDGER, Physical};
use crate::state::{charge, uncharge};
use egpu_cuda::{CUDA_ERROR_INVALID_VALUE, CUdeviceptr, CUmemAllocationProp, CUmemGenericAllocationHandle, CUmulticastObjectProp};
use std::ffi::c_void;

fn created(handle: *mut CUmemGenericAllocationHandle, c: Charge, create: impl FnOnce() -> u32) -> Outcome {
    if let Err(e) = charge(c.dev, c.bytes) {
        return Outcome::Error(e);
    }
    let r = create();
    if r != 0 {
        uncharge(c.dev, c.bytes);
        return Outcome::Error(r);
    }
    // SAFETY: on success the driver wrote the handle.
    let h = unsafe { *handle };
    let mut l = LEDGER.lock();
    // A released handle whose memory is still mapped keeps its entry (and its
    // charge) under the old handle value, which the driver may now hand out
    // again. That entry moves to a key of its own, with its mappings, so that
    // neither charge overwrites the other.
    if let Some(old) = l.physical.remove(&h) {
        let key = released_key(&l.physical);
        l.physical.insert(key, old);
        for m in l.mappings.values_mut().filter(|m| m.1 == h) {
            m.1 = key;
        }
        for m in l.sparse.values_mut().filter(|m| **m == h) {
            *m = key;
        }
    }
    l.physical.insert(h, Physical { charge: c, refs: 1 });
    Outcome::Success
}

/// A ledger key for a released-but-mapped handle that no driver handle uses:
/// counting down from `u64::MAX`.
fn released_key(physical: &std::collections::BTreeMap<u64, Physical>) -> u64 {
    (0..).map(|i| u64::MAX - i).find(|k| !physical.contains_key(k)).unwrap_or(u64::MAX)
}

/// `cuMemCreate`.
#[doc(alias = "cuMemCreate")]
pub(crate) fn create(real: sig::cuMemCreate, handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationProp, flags: u64) -> Outcome {
    if prop.is_null() || handle.is_null() {
        return Outcome::Error(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller's property struct (null checked), read once.
    let loc = unsafe { (*prop).location };
    let dev = match devmap::placed(loc) {
        Ok(devmap::Placed::Host) => return Outcome::Passthrough, // host memory: never charged
        Ok(devmap::Placed::Device(d)) => d,
        // No location: the driver refuses it; should one accept it, the memory is the current device's.
        Ok(devmap::Placed::Unspecified) => match devmap::current() {
            Ok((_, d)) => d,
            Err(_) => return Outcome::Passthrough,
        },
        Err(e) => return Outcome::Error(e),
    };
    // SAFETY: the real function with the caller's arguments.
    created(handle, Charge { dev, bytes: size as u64 }, || unsafe { real(handle, size, prop, flags) })
}

/// `cuMulticastCreate`.
#[doc(alias = "cuMulticastCreate")]
pub(crate) fn multicast_create(real: sig::cuMulticastCreate, handle: *mut CUmemGenericAllocationHandle, prop: *const CUmulticastObjectProp) -> Outcome {
    if prop.is_null() || handle.is_null() {
        return Outcome::Error(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller's property struct (null checked), read once.
    let size = unsafe { (*prop).size } as u64;
    let dev = match devmap::current() {
        Ok((_, d)) => d,
        Err(e) => return Outcome::Error(e),
    };
    // SAFETY: the real function with the caller's arguments.
    created(handle, Charge { dev, bytes: size }, || unsafe { real(handle, prop) })
}

/// Takes one reference to `h` out of the ledger: the entry itself when it is
/// the last one (the caller uncharges it once the real call succeeded).
pub(super) fn take_ref(l: &mut crate::ledger::Ledger, h: u64) -> Option<Taken> {
    match l.physical.get_mut(&h) {
        Some(p) if p.refs > 1 => {
            p.refs -= 1;
            Some(Taken::Ref(h))
        }
        Some(_) => l.physical.remove(&h).map(|p| Taken::Last(h, p)),
        None => None,
    }
}

/// A reference taken before a real release/unmap, to be given back if it fails.
pub(super) enum Taken {
    Ref(u64),
    Last(u64, Physical),
}

impl Taken {
    /// The handle whose last reference this is (its charge goes at commit).
    #[cfg(test)]
    pub(super) fn last_handle(&self) -> Option<u64> {
        match self {
            Taken::Last(h, _) => Some(*h),
            Taken::Ref(_) => None,
        }
    }

    /// The real call succeeded: the last reference uncharges.
    pub(super) fn commit(self) {
        if let Taken::Last(_, p) = self {
            crate::state::uncharge_freed(p.charge.dev, p.charge.bytes);
        }
    }

    /// The real call failed: the reference goes back.
    fn restore(self, l: &mut crate::ledger::Ledger) {
        match self {
            Taken::Ref(h) => {
                if let Some(p) = l.physical.get_mut(&h) {
                    p.refs += 1;
                }
            }
            Taken::Last(h, p) => {
                l.physical.entry(h).or_insert(Physical { refs: 0, ..p }).refs += 1;
            }
        }
    }
}

/// `cuMemRelease`. The reference leaves the ledger before the real call: once
/// the driver has released the handle, another thread may be handed the same
/// value by `cuMemCreate`, and a removal after the call would take its entry.
#[doc(alias = "cuMemRelease")]
pub(crate) fn release(real: sig::cuMemRelease, handle: CUmemGenericAllocationHandle) -> Outcome {
    let taken = take_ref(&mut LEDGER.lock(), handle);
    // SAFETY: the real function with the caller's argument.
    let r = unsafe { real(handle) };
    if let Some(t) = taken {
        if r == 0 {
            t.commit();
        } else {
            t.restore(&mut LEDGER.lock());
        }
    }
    Outcome::from_code(r)
}

/// `cuMemMap`: a mapping keeps the physical memory alive.
#[doc(alias = "cuMemMap")]
pub(crate) fn map(real: sig::cuMemMap, ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: u64) -> Outcome {
    // SAFETY: the real function with the caller's arguments.
    let r = unsafe { real(ptr, size, offset, handle, flags) };
    if r == 0 {
        let mut l = LEDGER.lock();
        if let Some(p) = l.physical.get_mut(&handle) {
            p.refs += 1;
            l.mappings.insert(ptr, (size as u64, handle));
        }
    }
    Outcome::from_code(r)
}

/// `cuMemUnmap`: drops the references of every mapping in the range. Taken
/// out of the ledger before the real call (the range may be mapped again by
/// another thread as soon as it is unmapped), put back if the call fails.
#[doc(alias = "cuMemUnmap")]
pub(crate) fn unmap(real: sig::cuMemUnmap, ptr: CUdeviceptr, size: usize) -> Outcome {
    let end = ptr.saturating_add(size as u64);
    let taken: Vec<(u64, (u64, u64), Option<Taken>)> = {
        let mut l = LEDGER.lock();
        let keys: Vec<u64> = l.mappings.range(ptr..end).map(|(k, _)| *k).collect();
        keys.into_iter()
            .filter_map(|k| {
                let m = l.mappings.remove(&k)?;
                let t = take_ref(&mut l, m.1);
                Some((k, m, t))
            })
            .collect()
    };
    // SAFETY: the real function with the caller's arguments.
    let r = unsafe { real(ptr, size) };
    if r == 0 {
        for t in taken.into_iter().filter_map(|(_, _, t)| t) {
            t.commit();
        }
    } else if !taken.is_empty() {
        let mut l = LEDGER.lock();
        for (k, m, t) in taken {
            l.mappings.insert(k, m);
            if let Some(t) = t {
                t.restore(&mut l);
            }
        }
    }
    Outcome::from_code(r)
}

/// `cuMemRetainAllocationHandle`: never a new charge; a reference to a
/// handle this process created keeps it alive until released.
#[doc(alias = "cuMemRetainAllocationHandle")]
pub(crate) fn retain(real: sig::cuMemRetainAllocationHandle, handle: *mut CUmemGenericAllocationHandle, addr: *mut c_void) -> Outcome {
    // SAFETY: the real function with the caller's arguments.
    let r = unsafe { real(handle, addr) };
    if r == 0 && !handle.is_null() {
        // SAFETY: on success the driver wrote the handle.
        let h = unsafe { *handle };
        if let Some(p) = LEDGER.lock().physical.get_mut(&h) {
            p.refs += 1;
        }
    }
    Outcome::from_code(r)
}
