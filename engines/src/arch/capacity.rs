//! How a slot grows when a request needs more positions than it holds.
//!
//! One policy for every arch: growth at least doubles the capacity, so a long conversation pays for a
//! logarithmic number of grows (each copies the state), and never goes past `max_ctx`, which no request
//! can use. How a state grows (which buffers it copies, what a fault breaks) stays in each arch.

/// When `needed` positions do not fit in `capacity`, call `grow` with the new capacity: `needed` or twice
/// `capacity`, whichever is larger, bounded by `max_ctx`.
pub fn grow_to_fit(capacity: usize, needed: usize, max_ctx: usize, grow: impl FnOnce(usize)) {
    if needed > capacity {
        grow(needed.max(capacity * 2).min(max_ctx));
    }
}
