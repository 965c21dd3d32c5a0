//! A running count of the work the kernels did, so a benchmark can state a model's FLOPs and bytes per token
//! from what actually ran (every arch, dense or routed experts) rather than from a formula per arch.

use std::sync::atomic::{AtomicU64, Ordering};

static FLOPS: AtomicU64 = AtomicU64::new(0);
static WEIGHT_BYTES: AtomicU64 = AtomicU64::new(0);
static CACHE_BYTES: AtomicU64 = AtomicU64::new(0);

/// Work done since the process started.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Work {
    /// Floating-point operations (a multiply-add counts 2) of matmuls and attention.
    pub flops: u64,
    /// Bytes of matmul weight matrices passed over (each matmul reads its weights once).
    pub weight_bytes: u64,
    /// Bytes of cached key and value rows attention read (each row once per call, however many queries of the
    /// call share it): what a decode step reads besides the weights, growing with the context.
    pub cache_bytes: u64,
}

impl Work {
    /// The work done between `earlier` and `self`.
    pub fn since(self, earlier: Work) -> Work {
        Work {
            flops: self.flops.saturating_sub(earlier.flops),
            weight_bytes: self.weight_bytes.saturating_sub(earlier.weight_bytes),
            cache_bytes: self.cache_bytes.saturating_sub(earlier.cache_bytes),
        }
    }
}

/// The count so far.
pub fn work() -> Work {
    Work {
        flops: FLOPS.load(Ordering::Relaxed),
        weight_bytes: WEIGHT_BYTES.load(Ordering::Relaxed),
        cache_bytes: CACHE_BYTES.load(Ordering::Relaxed),
    }
}

/// Adds one kernel call's work (once per call, so the count costs nothing next to the call).
pub(super) fn count(flops: usize, weight_bytes: usize) {
    FLOPS.fetch_add(flops as u64, Ordering::Relaxed);
    WEIGHT_BYTES.fetch_add(weight_bytes as u64, Ordering::Relaxed);
}

/// Adds the bytes of the key or value rows one attention call read.
pub(super) fn count_cache(rows: usize, width: usize) {
    CACHE_BYTES.fetch_add((rows * width * std::mem::size_of::<f32>()) as u64, Ordering::Relaxed);
}
