//! The f32s under a block of rows: zero when made, and grown in place where the system allows.
//!
//! Why: a slot's caches grow (at least doubling) when a request needs more positions than they hold. Grown by
//! allocating a larger block and copying, every kept row is written again into memory the process has not touched
//! yet, and memory's first touch is where a virtual machine can be slow: on one whose freed memory goes back to the
//! host, 2 MiB pages took 0.10-0.14 GB/s on their first touch against 11 GB/s once touched. The bench preset's turn 2
//! (a state grown from 4131 to 8262 rows, 108 MiB kept) spent most of its warm prefill there. So a large block is
//! an anonymous mapping of its own, grown with `mremap`: the kernel moves its page tables (no row is copied or
//! touched), and the new rows are zero pages until written. A small block stays on the heap, where a mapping a
//! block would cost a page and a system call each.

use std::ops::{Deref, DerefMut};

/// Blocks of at least this many bytes are mappings of their own (on Linux); smaller ones live on the heap.
const MAPPED_MIN_BYTES: usize = 1 << 20;

/// The largest base page Linux runs with (64 KiB on some arm64 kernels; 4 KiB on x86-64).
const LARGEST_PAGE_BYTES: usize = 64 << 10;

/// A block of f32s, zero when made.
pub struct Floats(Store);

enum Store {
    Heap(Vec<f32>),
    /// An anonymous private mapping of `len · 4` bytes (never empty).
    #[cfg(target_os = "linux")]
    Mapped(memmap2::MmapMut),
}

impl Floats {
    /// `len` zeros. A large block is a mapping the kernel fills with zero pages as they are first touched.
    pub fn zeroed(len: usize) -> Self {
        #[cfg(target_os = "linux")]
        if len.saturating_mul(4) >= MAPPED_MIN_BYTES {
            if let Some(map) = map_zeroed(len) {
                return Floats(Store::Mapped(map));
            }
        }
        Floats(Store::Heap(vec![0.0; len]))
    }

    /// Change the length to `len`: the first `min(len, self.len())` values stay, every new one is 0.0. A mapped
    /// block moves its pages without copying them; a heap block grown past `MAPPED_MIN_BYTES` is copied once into a
    /// mapping.
    pub fn resize(&mut self, len: usize) {
        let old = self.len();
        match &mut self.0 {
            Store::Heap(v) if len <= old || len.saturating_mul(4) < MAPPED_MIN_BYTES => v.resize(len, 0.0),
            #[cfg(target_os = "linux")]
            Store::Mapped(_) if len > 0 => {
                if len < old {
                    // a shrink keeps the page the new end falls in as it is: zero what lies past the end there
                    // (up to the largest page Linux uses), so a later grow finds zeros
                    let page_end = (len * 4).next_multiple_of(LARGEST_PAGE_BYTES) / 4;
                    self[len..old.min(page_end)].fill(0.0);
                }
                if !self.remap(len) {
                    self.copy_into_new(len);
                }
            }
            _ => self.copy_into_new(len),
        }
    }

    /// Resize a mapped block with `mremap` (moving it if it cannot grow where it is); false where the system
    /// refuses, or the block is on the heap.
    fn remap(&mut self, len: usize) -> bool {
        match &mut self.0 {
            // SAFETY: an anonymous private mapping: every byte of the new length is the kernel's memory, the kept
            // part as it was and the rest zero pages; no slice of the old mapping outlives `&mut self`
            #[cfg(target_os = "linux")]
            #[allow(unsafe_code)]
            Store::Mapped(map) => unsafe { map.remap(len * 4, memmap2::RemapOptions::new().may_move(true)).is_ok() },
            _ => false,
        }
    }

    /// `resize` by a new block and a copy.
    fn copy_into_new(&mut self, len: usize) {
        let mut next = Floats::zeroed(len);
        let keep = len.min(self.len());
        next[..keep].copy_from_slice(&self[..keep]);
        *self = next;
    }

    /// The values as a vector (a heap block moves; a mapped one is copied).
    pub fn into_vec(self) -> Vec<f32> {
        match self.0 {
            Store::Heap(v) => v,
            #[cfg(target_os = "linux")]
            Store::Mapped(_) => self.to_vec(),
        }
    }

    /// Whether the block is a mapping of its own (what `resize` grows in place).
    pub fn is_mapped(&self) -> bool {
        !matches!(self.0, Store::Heap(_))
    }
}

/// An anonymous mapping of `len` zero f32s, with huge pages where the process asked them for its heap; `None`
/// where the system refuses (the caller falls back to the heap).
#[cfg(target_os = "linux")]
fn map_zeroed(len: usize) -> Option<memmap2::MmapMut> {
    let map = memmap2::MmapOptions::new().len(len.checked_mul(4)?).map_anon().ok()?;
    if crate::huge_pages::in_use() {
        // advice only: without it the block works the same in 4 KiB pages
        let _ = map.advise(memmap2::Advice::HugePage);
    }
    Some(map)
}

impl Deref for Floats {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        match &self.0 {
            Store::Heap(v) => v,
            // SAFETY: the mapping is page-aligned (so f32-aligned), `len · 4` bytes long and lives as long as self
            #[cfg(target_os = "linux")]
            #[allow(unsafe_code)]
            Store::Mapped(map) => unsafe { std::slice::from_raw_parts(map.as_ptr().cast::<f32>(), map.len() / 4) },
        }
    }
}

impl DerefMut for Floats {
    fn deref_mut(&mut self) -> &mut [f32] {
        match &mut self.0 {
            Store::Heap(v) => v,
            // SAFETY: as in `deref`, and `&mut self` makes this the only view
            #[cfg(target_os = "linux")]
            #[allow(unsafe_code)]
            Store::Mapped(map) => unsafe {
                std::slice::from_raw_parts_mut(map.as_mut_ptr().cast::<f32>(), map.len() / 4)
            },
        }
    }
}

impl From<Vec<f32>> for Floats {
    fn from(v: Vec<f32>) -> Self {
        Floats(Store::Heap(v))
    }
}

impl Clone for Floats {
    fn clone(&self) -> Self {
        let mut copy = Floats::zeroed(self.len());
        copy.copy_from_slice(self);
        copy
    }
}

impl std::fmt::Debug for Floats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let store = if self.is_mapped() { "mapped" } else { "heap" };
        write!(f, "Floats({} values, {store})", self.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Floats of a mapped block (`MAPPED_MIN_BYTES` and up) and of heap ones.
    const BIG: usize = MAPPED_MIN_BYTES / 4;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Through any sequence of resizes across the heap and mapped sizes, the block holds what a vector given
        /// the same writes and `resize(len, 0.0)` calls holds.
        #[test]
        fn resizes_keep_the_front_and_zero_the_rest(
            steps in proptest::collection::vec((0usize..3 * BIG, any::<u32>()), 1..8),
        ) {
            let mut floats = Floats::zeroed(0);
            let mut model: Vec<f32> = Vec::new();
            for (len, seed) in steps {
                floats.resize(len);
                model.resize(len, 0.0);
                prop_assert_eq!(floats.len(), len);
                prop_assert!(floats[..] == model[..], "differs after a resize to {len}");
                // dirty values all through the block, the last one included, so a shrink then a grow must zero
                // what lay past the shrunk end
                for i in (0..len).step_by(61).chain(len.checked_sub(1)) {
                    let v = (seed as f32) + i as f32;
                    floats[i] = v;
                    model[i] = v;
                }
                prop_assert!(floats[..] == model[..], "differs after writes at {len}");
            }
            let cloned = floats.clone();
            prop_assert!(cloned[..] == model[..]);
            prop_assert_eq!(floats.into_vec(), model);
        }
    }

    #[test]
    fn large_blocks_are_mapped_and_small_ones_are_not() {
        let mut f = Floats::zeroed(16);
        assert!(!f.is_mapped());
        f.resize(BIG);
        assert_eq!(f.is_mapped(), cfg!(target_os = "linux"));
        assert!(f.iter().all(|&x| x == 0.0));
        f.resize(BIG - 1);
        assert_eq!(f.len(), BIG - 1);
    }
}
