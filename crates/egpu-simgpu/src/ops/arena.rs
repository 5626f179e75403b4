//! Per-device arenas: one sparse memfd per device per process, mapped once;
//! `cuMemAlloc`-family allocations are page-aligned ranges of it. Freed
//! ranges have their pages punched out, so the process only holds the pages
//! it has touched in live allocations.

use crate::cptr::R;
use crate::rt::{Arena, Inner, Proc};
use crate::sys::{self, PAGE, round_up};
use egpu_cuda::CUDA_ERROR_OUT_OF_MEMORY;
use std::collections::BTreeMap;

/// Address space per arena: four times the device, at least 4 GiB.
fn arena_size(total: u64) -> u64 {
    round_up((total * 4).max(4 << 30), 2 << 20)
}

impl Arena {
    fn take(&mut self, len: u64) -> Option<u64> {
        let (&off, &flen) = self.free.iter().find(|&(_, &l)| l >= len)?;
        self.free.remove(&off);
        if flen > len {
            self.free.insert(off + len, flen - len);
        }
        Some(off)
    }

    fn give(&mut self, off: u64, len: u64) {
        sys::punch(self.fd, off, len);
        let (mut off, mut len) = (off, len);
        if let Some((&po, &pl)) = self.free.range(..off).next_back()
            && po + pl == off
        {
            self.free.remove(&po);
            off = po;
            len += pl;
        }
        if let Some(&nl) = self.free.get(&(off + len)) {
            self.free.remove(&(off + len));
            len += nl;
        }
        self.free.insert(off, len);
    }
}

/// Allocates `len` bytes of address space on physical device `phys`;
/// returns (device pointer, span).
pub fn alloc(p: &Proc, g: &mut Inner, phys: usize, len: u64) -> R<(u64, u64)> {
    let span = round_up(len.max(1), PAGE);
    if let std::collections::hash_map::Entry::Vacant(slot) = g.arenas.entry(phys) {
        let size = arena_size(p.shm.devs[phys].total);
        let fd = sys::memfd(&format!("egpu-arena-d{phys}"), size)?;
        let base = match sys::map_fd(fd, size, 0, None) {
            Ok(b) => b,
            Err(e) => {
                sys::close(fd);
                return Err(e);
            }
        };
        slot.insert(Arena { fd, base, size, free: BTreeMap::from([(0, size)]) });
    }
    let a = g.arenas.get_mut(&phys).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
    let off = a.take(span).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
    Ok((a.base + off, span))
}

/// Returns a range obtained from [`alloc`].
pub fn free(g: &mut Inner, phys: usize, ptr: u64, span: u64) {
    if let Some(a) = g.arenas.get_mut(&phys)
        && ptr >= a.base
        && ptr + span <= a.base + a.size
    {
        let off = ptr - a.base;
        a.give(off, span);
    }
}

/// (fd, offset) of an arena address, for IPC export.
pub fn locate(g: &Inner, phys: usize, ptr: u64) -> Option<(i32, u64)> {
    let a = g.arenas.get(&phys)?;
    (ptr >= a.base && ptr < a.base + a.size).then(|| (a.fd, ptr - a.base))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_fit_and_coalescing() {
        let fd = sys::memfd("t", 1 << 20).unwrap();
        let mut a = Arena { fd, base: 0, size: 1 << 20, free: BTreeMap::from([(0, 1 << 20)]) };
        let x = a.take(4096).unwrap();
        let y = a.take(8192).unwrap();
        let z = a.take(4096).unwrap();
        assert_eq!((x, y, z), (0, 4096, 12288));
        a.give(y, 8192);
        assert_eq!(a.take(4096), Some(4096), "reuses the hole");
        a.give(4096, 4096);
        a.give(x, 4096);
        a.give(z, 4096);
        assert_eq!(a.free, BTreeMap::from([(0, 1 << 20)]), "all coalesced back");
        assert_eq!(a.take(2 << 20), None);
        sys::close(fd);
    }
}
