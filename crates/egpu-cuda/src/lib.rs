//! The C ABI of the CUDA driver API (`cuda.h`) and NVML (`nvml.h`): scalar and
//! handle types, `#[repr(C)]` structs, enum values and status codes.
//!
//! Contract:
//! - This is the ABI of NVIDIA's public headers, written in Rust from the
//!   published API (checked against the CUDA 12.6 `cuda.h`, `cudaTypedefs.h`
//!   and `nvml.h`). It declares no functions that touch the world and contains
//!   no `unsafe`; it has no dependencies and is `no_std`.
//! - Every struct whose size is known carries a compile-time size assertion,
//!   so a layout mistake fails the build.
//! - C enums are `int`-sized with non-negative values; they are `u32` here
//!   (`CUresult`, `nvmlReturn_t`, and the `c_uint` enum constants), which is
//!   passed and returned exactly like the C enum on every supported ABI.
//! - Opaque handles (`CUcontext`, `CUstream`, ... `nvmlDevice_t`) are
//!   `*mut c_void` aliases. `CUmemGenericAllocationHandle` is a `u64` token.
//! - C unions are represented as aligned raw bytes with small `const fn`
//!   accessors, so reading them needs no `unsafe`.
//!
//! Used by `egpu-simgpu` (the simulated `libcuda.so.1` / `libnvidia-ml.so.1`)
//! and `egpu-hook` (`libegpu.so`).
#![no_std]
#![forbid(unsafe_code)]
#![allow(non_camel_case_types, non_snake_case, non_upper_case_globals)]

pub mod attr;
pub mod consts;
pub mod nvml;
pub mod result;
pub mod types;

pub use attr::*;
pub use consts::*;
pub use nvml::*;
pub use result::*;
pub use types::*;

/// `CUDA_VERSION` of the header this crate was checked against.
pub const CUDA_HEADER_VERSION: i32 = 12060;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn well_known_codes() {
        assert_eq!(CUDA_ERROR_INVALID_VALUE, 1);
        assert_eq!(CUDA_ERROR_OUT_OF_MEMORY, 2);
        assert_eq!(CUDA_ERROR_NO_DEVICE, 100);
        assert_eq!(CUDA_ERROR_INVALID_HANDLE, 400);
        assert_eq!(CUDA_ERROR_NOT_FOUND, 500);
        assert_eq!(CUDA_ERROR_NOT_READY, 600);
        assert_eq!(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, 704);
        assert_eq!(CUDA_ERROR_NOT_SUPPORTED, 801);
        assert_eq!(CUDA_ERROR_UNKNOWN, 999);
        assert_eq!(NVML_ERROR_GPU_IS_LOST, 15);
        assert_eq!(NVML_ERROR_UNKNOWN, 999);
        assert_eq!(nvmlMemory_v2, 40 | (2 << 24));
        assert_eq!(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, 5);
        assert_eq!(CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 115);
    }

    #[test]
    fn name_tables_are_sorted_and_unique() {
        for w in CU_RESULT_NAMES.windows(2) {
            assert!(w[0].0 < w[1].0, "{:?}", w);
        }
        for w in NVML_RETURN_NAMES.windows(2) {
            assert!(w[0].0 < w[1].0, "{:?}", w);
        }
    }

    #[test]
    fn array_formats() {
        assert_eq!(array_format_bytes(CU_AD_FORMAT_FLOAT), Some(4));
        assert_eq!(array_format_bytes(CU_AD_FORMAT_HALF), Some(2));
        assert_eq!(array_format_bytes(CU_AD_FORMAT_UNSIGNED_INT8), Some(1));
        assert_eq!(array_format_bytes(0x7777), None);
    }

    #[test]
    fn union_accessors() {
        let mut v = CUlaunchAttributeValue { bytes: [0; 64] };
        v.bytes[..4].copy_from_slice(&7i32.to_ne_bytes());
        assert_eq!(v.int_at0(), 7);
        assert_eq!(nvmlValue_t::from_uint(42).uint(), 42);
        assert_eq!(nvmlValue_t::from_ulonglong(1 << 40).ulonglong(), 1 << 40);
    }

    #[test]
    fn sparse_subresources_read_back_and_nest() {
        let lvl = CUarraySubresource::sparse_level(2, 1, [64, 0, 0], [64, 32, 0]);
        let t = lvl.tiles(CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_SPARSE_LEVEL).unwrap();
        assert_eq!(t, SparseTiles::Level { level: 2, layer: 1, offset: [64, 0, 0], extent: [64, 32, 0] });
        let tail = CUarraySubresource::miptail(3, 1 << 33, (1 << 32) + 5);
        assert_eq!(tail.tiles(CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_MIPTAIL), Some(SparseTiles::MipTail { layer: 3, offset: 1 << 33, size: (1 << 32) + 5 }));
        assert_eq!(tail.tiles(7), None);
        // Inside: nothing is left once the outer one is taken out.
        let inside = |a: &SparseTiles, b: &SparseTiles| a.minus(b).is_some_and(|r| r.as_slice().is_empty());
        let whole = SparseTiles::Level { level: 2, layer: 1, offset: [0, 0, 0], extent: [256, 32, 1] };
        assert!(inside(&t, &whole) && inside(&t, &t));
        assert!(!inside(&whole, &t));
        // Another level or layer, or a box sticking out, is not inside.
        assert!(!inside(&t, &SparseTiles::Level { level: 1, layer: 1, offset: [0, 0, 0], extent: [256, 32, 1] }));
        assert!(!inside(&t, &SparseTiles::Level { level: 2, layer: 0, offset: [0, 0, 0], extent: [256, 32, 1] }));
        assert!(!inside(&t, &SparseTiles::Level { level: 2, layer: 1, offset: [0, 0, 0], extent: [100, 32, 1] }));
        let tail_t = SparseTiles::MipTail { layer: 3, offset: 0, size: 1 << 40 };
        assert!(inside(&tail.tiles(CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_MIPTAIL).unwrap(), &tail_t));
        assert!(!inside(&t, &tail_t) && !inside(&tail_t, &whole));
    }

    /// Every pair of boxes of a small grid: the pieces of `a.minus(b)` are
    /// disjoint, inside `a`, clear of `b`, and cover every tile of `a` that
    /// `b` does not; `None` exactly when the two share no tile.
    #[test]
    fn a_box_minus_a_box_leaves_exactly_the_other_tiles() {
        const DIMS: [u32; 3] = [4, 3, 2];
        let spans = |d: u32| (0..d).flat_map(move |o| (1..=d - o).map(move |n| (o, n)));
        let mut boxes = [SparseTiles::MIN; 180];
        let mut count = 0;
        for (x, w) in spans(DIMS[0]) {
            for (y, h) in spans(DIMS[1]) {
                for (z, d) in spans(DIMS[2]) {
                    boxes[count] = SparseTiles::Level { level: 1, layer: 0, offset: [x, y, z], extent: [w, h, d] };
                    count += 1;
                }
            }
        }
        assert_eq!(count, boxes.len());
        // The oracle: tile `p` of level 1, layer 0 lies in box `t`.
        let has = |t: &SparseTiles, p: [u32; 3]| match t {
            SparseTiles::Level { level: 1, layer: 0, offset, extent } => (0..3).all(|i| offset[i] <= p[i] && p[i] < offset[i] + extent[i].max(1)),
            _ => false,
        };
        let tiles = || (0..DIMS[0]).flat_map(|x| (0..DIMS[1]).flat_map(move |y| (0..DIMS[2]).map(move |z| [x, y, z])));
        for a in &boxes {
            for b in &boxes {
                let shared = tiles().any(|p| has(a, p) && has(b, p));
                let Some(rest) = a.minus(b) else {
                    assert!(!shared, "{a:?} - {b:?}: overlapping, but None");
                    continue;
                };
                assert!(shared, "{a:?} - {b:?}: disjoint, but cut");
                for p in tiles() {
                    let n = rest.as_slice().iter().filter(|r| has(r, p)).count();
                    let want = usize::from(has(a, p) && !has(b, p));
                    assert_eq!(n, want, "{a:?} - {b:?} at {p:?}: {rest:?}");
                }
            }
        }
        // Another level or layer is untouched; a mip tail loses its middle.
        let a = boxes[0];
        assert_eq!(a.minus(&SparseTiles::Level { level: 2, layer: 0, offset: [0; 3], extent: DIMS }), None);
        let tail = SparseTiles::MipTail { layer: 1, offset: 0, size: 1 << 20 };
        let rest = tail.minus(&SparseTiles::MipTail { layer: 1, offset: 1 << 16, size: 1 << 16 }).unwrap();
        assert_eq!(rest.as_slice(), [SparseTiles::MipTail { layer: 1, offset: 0, size: 1 << 16 }, SparseTiles::MipTail { layer: 1, offset: 2 << 16, size: (1 << 20) - (2 << 16) }]);
        assert_eq!(tail.minus(&SparseTiles::MipTail { layer: 2, offset: 0, size: 1 << 20 }), None);
        assert_eq!(tail.minus(&tail).map(|r| r.as_slice().len()), Some(0));
        assert_eq!(tail.minus(&a), None);
    }
}
