//! A bounds-checked cursor over a GGUF header: every read checks the bytes left first, and every count is
//! checked against them before anything is allocated for it.

use super::value::{Value, ValueType};
use super::MAX_NESTING;

pub(super) struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

type R<T> = std::result::Result<T, String>;

impl<'a> Cursor<'a> {
    pub(super) fn new(bytes: &'a [u8]) -> Self {
        Cursor { bytes, pos: 0 }
    }

    pub(super) fn pos(&self) -> usize {
        self.pos
    }

    fn left(&self) -> usize {
        self.bytes.len() - self.pos
    }

    /// Whether `count` items of at least `min` bytes each can fit in what is left.
    pub(super) fn fits(&self, count: u64, min: usize) -> R<()> {
        match count.checked_mul(min as u64) {
            Some(n) if n <= self.left() as u64 => Ok(()),
            _ => Err(format!(
                "{count} entries of at least {min} bytes claimed at offset {}, but only {} bytes are left",
                self.pos,
                self.left()
            )),
        }
    }

    pub(super) fn take(&mut self, n: usize) -> R<&'a [u8]> {
        if n > self.left() {
            return Err(format!("truncated: {n} bytes needed at offset {}, {} left", self.pos, self.left()));
        }
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> R<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    pub(super) fn u32(&mut self) -> R<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    pub(super) fn u64(&mut self) -> R<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A length-prefixed UTF-8 string.
    pub(super) fn string(&mut self) -> R<String> {
        let at = self.pos;
        let len = self.u64()?;
        if len > self.left() as u64 {
            return Err(format!(
                "string of {len} bytes claimed at offset {at}, but only {} bytes are left",
                self.left()
            ));
        }
        let raw = self.take(len as usize)?;
        String::from_utf8(raw.to_vec()).map_err(|e| format!("string at offset {at} is not UTF-8: {e}"))
    }

    /// One value of type `ty` (`depth`: how deep inside arrays it sits).
    pub(super) fn value(&mut self, ty: ValueType, depth: usize) -> R<Value> {
        Ok(match ty {
            ValueType::U8 => Value::U8(self.array::<1>()?[0]),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.array()?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array()?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array()?)),
            ValueType::U32 => Value::U32(self.u32()?),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array()?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array()?)),
            ValueType::Bool => match self.array::<1>()?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(format!("bool byte {b} at offset {} (0 or 1 allowed)", self.pos - 1)),
            },
            ValueType::String => Value::String(self.string()?),
            ValueType::U64 => Value::U64(self.u64()?),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array()?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array()?)),
            ValueType::Array => {
                if depth >= MAX_NESTING {
                    return Err(format!("arrays nested deeper than {MAX_NESTING}"));
                }
                let et = self.u32()?;
                let et = ValueType::from_id(et).ok_or_else(|| format!("array of unknown value type {et}"))?;
                let count = self.u64()?;
                self.fits(count, et.min_bytes())?;
                let mut items = Vec::with_capacity(count as usize);
                for i in 0..count {
                    items.push(self.value(et, depth + 1).map_err(|e| format!("element {i}: {e}"))?);
                }
                Value::Array(et, items)
            }
        })
    }
}
