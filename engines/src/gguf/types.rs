//! GGML tensor types as a GGUF file names them: the id, the block of elements one unit of storage holds, and
//! that block's bytes. A type this table does not list is an error when a file is read (its size is unknown, so
//! nothing after it could be checked).

/// A tensor's storage type (`ggml_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    Iq2Xxs,
    Iq2Xs,
    Iq3Xxs,
    Iq1S,
    Iq4Nl,
    Iq3S,
    Iq2S,
    Iq4Xs,
    I8,
    I16,
    I32,
    I64,
    F64,
    Iq1M,
    Bf16,
    Tq1_0,
    Tq2_0,
}

/// (type, id, elements per block, bytes per block).
const TABLE: &[(GgmlType, u32, usize, usize)] = &[
    (GgmlType::F32, 0, 1, 4),
    (GgmlType::F16, 1, 1, 2),
    (GgmlType::Q4_0, 2, 32, 18),
    (GgmlType::Q4_1, 3, 32, 20),
    (GgmlType::Q5_0, 6, 32, 22),
    (GgmlType::Q5_1, 7, 32, 24),
    (GgmlType::Q8_0, 8, 32, 34),
    (GgmlType::Q8_1, 9, 32, 36),
    (GgmlType::Q2K, 10, 256, 84),
    (GgmlType::Q3K, 11, 256, 110),
    (GgmlType::Q4K, 12, 256, 144),
    (GgmlType::Q5K, 13, 256, 176),
    (GgmlType::Q6K, 14, 256, 210),
    (GgmlType::Q8K, 15, 256, 292),
    (GgmlType::Iq2Xxs, 16, 256, 66),
    (GgmlType::Iq2Xs, 17, 256, 74),
    (GgmlType::Iq3Xxs, 18, 256, 98),
    (GgmlType::Iq1S, 19, 256, 50),
    (GgmlType::Iq4Nl, 20, 32, 18),
    (GgmlType::Iq3S, 21, 256, 110),
    (GgmlType::Iq2S, 22, 256, 82),
    (GgmlType::Iq4Xs, 23, 256, 136),
    (GgmlType::I8, 24, 1, 1),
    (GgmlType::I16, 25, 1, 2),
    (GgmlType::I32, 26, 1, 4),
    (GgmlType::I64, 27, 1, 8),
    (GgmlType::F64, 28, 1, 8),
    (GgmlType::Iq1M, 29, 256, 56),
    (GgmlType::Bf16, 30, 1, 2),
    (GgmlType::Tq1_0, 34, 256, 54),
    (GgmlType::Tq2_0, 35, 256, 66),
];

impl GgmlType {
    /// The type of id `id`, if this table knows it.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        TABLE.iter().find(|e| e.1 == id).map(|e| e.0)
    }

    fn entry(self) -> &'static (GgmlType, u32, usize, usize) {
        // every variant has exactly one row (a test checks it)
        TABLE.iter().find(|e| e.0 == self).unwrap_or(&TABLE[0])
    }

    pub fn id(self) -> u32 {
        self.entry().1
    }

    /// Elements in one block.
    pub fn block_elems(self) -> usize {
        self.entry().2
    }

    /// Bytes of one block.
    pub fn block_bytes(self) -> usize {
        self.entry().3
    }

    /// Bytes of `elems` elements, or `None` when `elems` is not a whole number of blocks (or overflows).
    pub fn bytes_for(self, elems: u64) -> Option<u64> {
        let (be, bb) = (self.block_elems() as u64, self.block_bytes() as u64);
        if !elems.is_multiple_of(be) {
            return None;
        }
        (elems / be).checked_mul(bb)
    }

    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q5_0 => "Q5_0",
            GgmlType::Q5_1 => "Q5_1",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q8_1 => "Q8_1",
            GgmlType::Q2K => "Q2_K",
            GgmlType::Q3K => "Q3_K",
            GgmlType::Q4K => "Q4_K",
            GgmlType::Q5K => "Q5_K",
            GgmlType::Q6K => "Q6_K",
            GgmlType::Q8K => "Q8_K",
            GgmlType::Iq2Xxs => "IQ2_XXS",
            GgmlType::Iq2Xs => "IQ2_XS",
            GgmlType::Iq3Xxs => "IQ3_XXS",
            GgmlType::Iq1S => "IQ1_S",
            GgmlType::Iq4Nl => "IQ4_NL",
            GgmlType::Iq3S => "IQ3_S",
            GgmlType::Iq2S => "IQ2_S",
            GgmlType::Iq4Xs => "IQ4_XS",
            GgmlType::I8 => "I8",
            GgmlType::I16 => "I16",
            GgmlType::I32 => "I32",
            GgmlType::I64 => "I64",
            GgmlType::F64 => "F64",
            GgmlType::Iq1M => "IQ1_M",
            GgmlType::Bf16 => "BF16",
            GgmlType::Tq1_0 => "TQ1_0",
            GgmlType::Tq2_0 => "TQ2_0",
        }
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_round_trip() {
        for (t, id, ..) in TABLE {
            assert_eq!(GgmlType::from_id(*id), Some(*t));
            assert_eq!(t.id(), *id);
        }
        assert_eq!(GgmlType::from_id(4), None);
        assert_eq!(GgmlType::Q4_1.bytes_for(64), Some(40));
        assert_eq!(GgmlType::Q8_0.bytes_for(33), None);
    }
}
