//! Sparse arrays: `cuMemMapArrayAsync` maps tiles of a sparse array or
//! mipmapped array to a `cuMemCreate` handle (or unmaps them).
//!
//! A sparse array is charged nothing at creation (its backing comes from
//! handles, charged at `cuMemCreate`). A mapping keeps the handle's physical
//! memory alive as a `cuMemMap` does, so each mapped tile range takes one
//! reference on the handle's charge (`vmm`): a handle released while an
//! array still maps it stays charged until the last range is unmapped or
//! its array destroyed.
//!
//! - The ledger keys each mapped range by (array, [`SparseTiles`]); the
//!   recorded ranges of an array never overlap. An unmap (or a map, which
//!   replaces what it covers) takes its tiles out of every recorded range:
//!   a range inside it is dropped with its reference, and a range it cuts
//!   through is split into the pieces left ([`SparseTiles::minus`]), each
//!   holding a reference on the same handle. So a range unmapped piece by
//!   piece lets its handle go once the last piece goes.
//! - Destroying an array (`cuArrayDestroy`, `cuMipmappedArrayDestroy`, or the
//!   context it was made in) drops its ranges. (The levels of a mipmapped
//!   array are not resources of their own: the driver refuses them.)
//! - Arrays made with `CUDA_ARRAY3D_DEFERRED_MAPPING` are mapped whole (the
//!   driver ignores the subresource): they are charged their full size at
//!   creation (`array`), which covers what is mapped into them, and their
//!   entries are followed like any other, which can only add charge.
//! - Handles the hook does not charge (imported ones) are not recorded, so a
//!   later `cuMemCreate` that reuses such a value cannot be confused with
//!   them; mapping one still replaces recorded ranges.
//! - The ledger follows the call once it succeeded (the operations are queued
//!   on the stream, and the driver validates them at the call). A failed call
//!   changes nothing.

use super::sig;
use super::vmm::{Taken, take_ref};
use crate::detour::Outcome;
use crate::ledger::{LEDGER, Ledger};
use egpu_cuda::{CU_MEM_HANDLE_TYPE_GENERIC, CU_MEM_OPERATION_TYPE_MAP, CU_MEM_OPERATION_TYPE_UNMAP, CUarrayMapInfo, CUstream, SparseTiles};
use std::ffi::c_uint;

/// One entry of the caller's list, as the ledger follows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct MapOp {
    resource: usize,
    tiles: SparseTiles,
    /// `Some(handle)` maps, `None` unmaps.
    handle: Option<u64>,
}

/// The entries of `list` the ledger follows: maps of generic handles and
/// unmaps, with a known subresource type. Others (which the driver refuses)
/// are left out.
fn ops(list: &[CUarrayMapInfo]) -> Vec<MapOp> {
    list.iter()
        .filter_map(|e| {
            let tiles = e.subresource.tiles(e.subresourceType)?;
            let handle = match e.memOperationType {
                CU_MEM_OPERATION_TYPE_MAP if e.memHandleType == CU_MEM_HANDLE_TYPE_GENERIC => Some(e.memHandle),
                CU_MEM_OPERATION_TYPE_UNMAP => None,
                _ => return None,
            };
            Some(MapOp { resource: e.resource as usize, tiles, handle })
        })
        .collect()
}

/// Takes the tiles of `cut` (all of them: `None`, the array is gone) out of
/// the ranges of `resource`: a range inside it goes, a range it cuts
/// through is split into what is left, each piece with a reference of its
/// own on the range's handle. Returns the references of the ranges that
/// went, for the caller to commit.
fn cut_ranges(l: &mut Ledger, resource: usize, cut: Option<&SparseTiles>) -> Vec<Taken> {
    let hit: Vec<((usize, SparseTiles), Option<egpu_cuda::TilePieces>)> = l
        .sparse
        .range((resource, SparseTiles::MIN)..)
        .take_while(|(k, _)| k.0 == resource)
        .filter_map(|(k, _)| match cut {
            None => Some((*k, None)),
            Some(c) => k.1.minus(c).map(|rest| (*k, Some(rest))),
        })
        .collect();
    let mut gone = Vec::new();
    for (key, rest) in hit {
        let Some(h) = l.sparse.remove(&key) else { continue };
        let rest = rest.as_ref().map_or(&[][..], egpu_cuda::TilePieces::as_slice);
        if rest.is_empty() {
            gone.extend(take_ref(l, h));
            continue;
        }
        if let Some(p) = l.physical.get_mut(&h) {
            p.refs += rest.len() as u32 - 1;
        }
        for piece in rest {
            l.sparse.insert((resource, *piece), h);
        }
    }
    gone
}

/// Applies `ops`, in order, to the ledger's sparse mappings: returns the
/// references they dropped, for the caller to commit (uncharging the last
/// reference of a released handle).
fn apply(l: &mut Ledger, ops: &[MapOp]) -> Vec<Taken> {
    let mut dropped = Vec::new();
    for op in ops {
        dropped.extend(cut_ranges(l, op.resource, Some(&op.tiles)));
        if let Some(h) = op.handle
            && let Some(p) = l.physical.get_mut(&h)
        {
            p.refs += 1;
            l.sparse.insert((op.resource, op.tiles), h);
        }
    }
    dropped
}

/// Drops every range mapped in the destroyed arrays `resources`: returns
/// the references, for the caller to commit.
fn forget(l: &mut Ledger, resources: impl IntoIterator<Item = usize>) -> Vec<Taken> {
    resources.into_iter().flat_map(|r| cut_ranges(l, r, None)).collect()
}

/// The arrays `resources` were destroyed: their mappings are gone.
pub(super) fn destroyed(resources: impl IntoIterator<Item = usize>) {
    let dropped = forget(&mut LEDGER.lock(), resources);
    for t in dropped {
        t.commit();
    }
}

/// `cuMemMapArrayAsync` / `_ptsz`.
#[doc(alias = "cuMemMapArrayAsync")]
pub(crate) fn map_array_async(real: sig::cuMemMapArrayAsync, list: *mut CUarrayMapInfo, count: c_uint, stream: CUstream) -> Outcome {
    // SAFETY: the real function with the caller's arguments.
    let r = unsafe { real(list, count, stream) };
    if r != 0 || list.is_null() || count == 0 {
        return Outcome::from_code(r);
    }
    // SAFETY: the driver accepted `count` entries at `list`; they are read
    // once, after the call (which does not write them).
    let entries = unsafe { std::slice::from_raw_parts(list, count as usize) };
    let ops = ops(entries);
    let dropped = apply(&mut LEDGER.lock(), &ops);
    for t in dropped {
        t.commit();
    }
    Outcome::Success
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{Charge, Physical};

    fn level(x: u32, w: u32) -> SparseTiles {
        SparseTiles::Level { level: 0, layer: 0, offset: [x, 0, 0], extent: [w, 64, 1] }
    }

    fn ledger_with(handles: &[u64]) -> Ledger {
        let mut l = Ledger::new();
        for &h in handles {
            l.physical.insert(h, Physical { charge: Charge { dev: 0, bytes: 2 << 20 }, refs: 1 });
        }
        l
    }

    fn last(t: &[Taken]) -> Vec<u64> {
        t.iter().filter_map(|t| t.last_handle()).collect()
    }

    #[test]
    fn a_mapping_keeps_a_released_handle_charged_until_unmapped() {
        let mut l = ledger_with(&[7]);
        assert!(apply(&mut l, &[MapOp { resource: 1, tiles: level(0, 64), handle: Some(7) }]).is_empty());
        assert_eq!(l.physical[&7].refs, 2);
        // The handle's own reference goes (cuMemRelease): still charged.
        assert!(matches!(take_ref(&mut l, 7), Some(t) if t.last_handle().is_none()));
        // Unmapping a box around it drops the last reference.
        let t = apply(&mut l, &[MapOp { resource: 1, tiles: level(0, 128), handle: None }]);
        assert_eq!(last(&t), vec![7]);
        assert!(l.physical.is_empty() && l.sparse.is_empty());
    }

    #[test]
    fn a_range_unmapped_piece_by_piece_lets_its_handle_go_and_another_array_is_untouched() {
        let mut l = ledger_with(&[7]);
        apply(&mut l, &[MapOp { resource: 1, tiles: level(0, 192), handle: Some(7) }, MapOp { resource: 2, tiles: level(0, 128), handle: Some(7) }]);
        assert_eq!(l.physical[&7].refs, 3);
        // Cut out of the middle: two pieces are left, a reference each.
        assert!(apply(&mut l, &[MapOp { resource: 1, tiles: level(64, 64), handle: None }]).is_empty());
        assert_eq!(l.physical[&7].refs, 4, "the first and the last third are still mapped");
        assert!(l.sparse.contains_key(&(1, level(0, 64))) && l.sparse.contains_key(&(1, level(128, 64))));
        assert!(apply(&mut l, &[MapOp { resource: 3, tiles: level(0, 1 << 20), handle: None }]).is_empty());
        assert_eq!(l.sparse.len(), 3);
        // The handle's own reference and the other array's go; then the two pieces.
        assert!(take_ref(&mut l, 7).is_some_and(|t| t.last_handle().is_none()));
        assert!(forget(&mut l, [2]).iter().all(|t| t.last_handle().is_none()));
        assert!(apply(&mut l, &[MapOp { resource: 1, tiles: level(0, 64), handle: None }]).iter().all(|t| t.last_handle().is_none()));
        assert_eq!(last(&apply(&mut l, &[MapOp { resource: 1, tiles: level(100, 200), handle: None }])), vec![7]);
        assert!(l.physical.is_empty() && l.sparse.is_empty());
    }

    #[test]
    fn a_map_over_part_of_a_range_keeps_the_rest_on_the_old_handle() {
        let mut l = ledger_with(&[7, 8]);
        apply(&mut l, &[MapOp { resource: 1, tiles: level(0, 128), handle: Some(7) }]);
        assert!(take_ref(&mut l, 7).is_some_and(|t| t.last_handle().is_none()));
        assert!(apply(&mut l, &[MapOp { resource: 1, tiles: level(64, 128), handle: Some(8) }]).is_empty());
        assert_eq!((l.physical[&7].refs, l.physical[&8].refs), (1, 2));
        assert_eq!(l.sparse.get(&(1, level(0, 64))), Some(&7));
        assert_eq!(last(&apply(&mut l, &[MapOp { resource: 1, tiles: level(0, 64), handle: Some(8) }])), vec![7]);
    }

    #[test]
    fn a_map_over_a_range_replaces_it_and_destroy_forgets_the_rest() {
        let mut l = ledger_with(&[7, 8]);
        apply(&mut l, &[MapOp { resource: 1, tiles: level(0, 64), handle: Some(7) }, MapOp { resource: 1, tiles: level(64, 64), handle: Some(7) }]);
        // cuMemRelease of 7: two mappings left.
        assert!(take_ref(&mut l, 7).is_some_and(|t| t.last_handle().is_none()));
        // Handle 8 now backs the first range: 7 keeps one reference.
        let t = apply(&mut l, &[MapOp { resource: 1, tiles: level(0, 64), handle: Some(8) }]);
        assert!(last(&t).is_empty());
        assert_eq!((l.physical[&7].refs, l.physical[&8].refs), (1, 2));
        let t = forget(&mut l, [1]);
        assert_eq!(last(&t), vec![7]);
        assert_eq!(l.physical[&8].refs, 1);
        assert!(l.sparse.is_empty());
    }

    #[test]
    fn unknown_handles_are_not_recorded_and_odd_entries_are_skipped() {
        let mut l = ledger_with(&[]);
        assert!(apply(&mut l, &[MapOp { resource: 1, tiles: level(0, 64), handle: Some(99) }]).is_empty());
        assert!(l.sparse.is_empty());
        let mut e = CUarrayMapInfo {
            resourceType: egpu_cuda::CU_RESOURCE_TYPE_ARRAY,
            resource: 5 as *mut std::ffi::c_void,
            subresourceType: egpu_cuda::CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_MIPTAIL,
            subresource: egpu_cuda::CUarraySubresource::miptail(0, 0, 1 << 16),
            memOperationType: CU_MEM_OPERATION_TYPE_MAP,
            memHandleType: CU_MEM_HANDLE_TYPE_GENERIC,
            memHandle: 7,
            offset: 0,
            deviceBitMask: 0,
            flags: 0,
            reserved: [0; 2],
        };
        let mut bad = e;
        bad.subresourceType = 9;
        let mut unmap = e;
        unmap.memOperationType = CU_MEM_OPERATION_TYPE_UNMAP;
        let mut other = e;
        other.memOperationType = 0;
        let got = ops(&[e, bad, unmap, other]);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0], MapOp { resource: 5, tiles: SparseTiles::MipTail { layer: 0, offset: 0, size: 1 << 16 }, handle: Some(7) });
        assert_eq!(got[1].handle, None);
        e.memHandleType = 1;
        assert!(ops(&[e]).is_empty());
    }
}
