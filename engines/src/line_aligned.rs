//! The allocator the programs install (`#[global_allocator]` in `kvproof-engine` and `kvproof`): the system's,
//! with every block of at least `MIN_SIZE` bytes aligned to a cache line.
//!
//! The kernels load rows 16 floats (64 bytes) at a time from the row's first element (the lane split is part of
//! every kernel's fixed reduction order, so it cannot start elsewhere). The system allocator aligns large blocks
//! to 16 bytes, so every such load of a weight, activation or cache row straddled two cache lines; aligned, the
//! f32 kernels run about 40% faster (`kvproof-engine --bench`). Rows of a multiple of 16 floats inside an aligned
//! block stay aligned. Small blocks (strings, maps) keep the system's alignment and speed.

use std::alloc::{GlobalAlloc, Layout, System};

/// A cache line.
const LINE: usize = 64;
/// Blocks this large or larger are line-aligned: arrays of rows, not bookkeeping.
const MIN_SIZE: usize = 1024;

/// The system allocator, line-aligning blocks of at least `MIN_SIZE` bytes.
pub struct LineAligned;

/// The layout actually asked of the system for `layout`.
fn widened(layout: Layout) -> Layout {
    if layout.size() >= MIN_SIZE && layout.align() < LINE {
        // fails only for a size within a line of isize::MAX: that one keeps the caller's alignment
        Layout::from_size_align(layout.size(), LINE).unwrap_or(layout)
    } else {
        layout
    }
}

// SAFETY: every block is allocated and freed by `System` with the same (widened) layout, which the system
// honours; `realloc` keeps that pairing by moving the block when the widened alignment changes.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for LineAligned {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's layout has a nonzero size; widening keeps it nonzero
        unsafe { System.alloc(widened(layout)) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`
        unsafe { System.alloc_zeroed(widened(layout)) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc`/`realloc` with this layout, which were given `widened(layout)`
        unsafe { System.dealloc(ptr, widened(layout)) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller guarantees `new_size` forms a valid layout with `layout.align()`
        let new = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        let (from, to) = (widened(layout), widened(new));
        if from.align() == to.align() {
            // SAFETY: `ptr` was allocated by the system with `from`; the alignment is unchanged
            return unsafe { System.realloc(ptr, from, new_size) };
        }
        // the block crosses MIN_SIZE: a new block with the new alignment, the contents moved over
        // SAFETY: `to` has a nonzero size (`new_size` is nonzero for a realloc)
        let moved = unsafe { System.alloc(to) };
        if !moved.is_null() {
            // SAFETY: both blocks hold at least the smaller size and do not overlap; `ptr` is then freed with the
            // layout it was allocated with
            unsafe {
                std::ptr::copy_nonoverlapping(ptr, moved, layout.size().min(new_size));
                System.dealloc(ptr, from);
            }
        }
        moved
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_blocks_are_line_aligned_small_ones_keep_their_own() {
        let big: Vec<f32> = vec![1.0; 4096];
        assert_eq!(big.as_ptr() as usize % LINE, 0);
        let mut grown: Vec<f32> = Vec::with_capacity(8);
        grown.extend((0..10_000).map(|i| i as f32));
        assert_eq!(grown.as_ptr() as usize % LINE, 0, "a vector grown past MIN_SIZE by realloc");
        assert!(grown.iter().enumerate().all(|(i, v)| *v == i as f32), "realloc kept the contents");
        grown.truncate(3);
        grown.shrink_to_fit();
        assert_eq!(grown, [0.0, 1.0, 2.0], "shrunk back under MIN_SIZE");
        let layout = |size, align| Layout::from_size_align(size, align).expect("a valid layout");
        assert_eq!(widened(layout(16, 4)).align(), 4);
        assert_eq!(widened(layout(MIN_SIZE, 4)).align(), LINE);
        assert_eq!(widened(layout(MIN_SIZE, 128)).align(), 128);
    }
}
