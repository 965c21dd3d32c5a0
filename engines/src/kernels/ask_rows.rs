//! Asking for rows ahead of a pass that reads them: software prefetches into L2, for reads the hardware
//! prefetchers do not follow (short rows at a stride, as one kv head's slice of each cached row).

/// Asks for every 64-byte line of every row into L2. A hint: nothing the program observes changes.
pub fn ask_rows<'a>(rows: impl Iterator<Item = &'a [f32]>) {
    #[cfg(target_arch = "x86_64")]
    for row in rows {
        for line in row.chunks(16) {
            // SAFETY: a prefetch reads nothing the program observes and never faults
            #[allow(unsafe_code)]
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(line.as_ptr().cast())
            };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = rows;
}
