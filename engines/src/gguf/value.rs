//! Metadata values: every GGUF value type, arrays of any of them (nested arrays included).

/// A metadata value's type as the file stores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl ValueType {
    pub fn from_id(id: u32) -> Option<ValueType> {
        Some(match id {
            0 => ValueType::U8,
            1 => ValueType::I8,
            2 => ValueType::U16,
            3 => ValueType::I16,
            4 => ValueType::U32,
            5 => ValueType::I32,
            6 => ValueType::F32,
            7 => ValueType::Bool,
            8 => ValueType::String,
            9 => ValueType::Array,
            10 => ValueType::U64,
            11 => ValueType::I64,
            12 => ValueType::F64,
            _ => return None,
        })
    }

    pub fn id(self) -> u32 {
        match self {
            ValueType::U8 => 0,
            ValueType::I8 => 1,
            ValueType::U16 => 2,
            ValueType::I16 => 3,
            ValueType::U32 => 4,
            ValueType::I32 => 5,
            ValueType::F32 => 6,
            ValueType::Bool => 7,
            ValueType::String => 8,
            ValueType::Array => 9,
            ValueType::U64 => 10,
            ValueType::I64 => 11,
            ValueType::F64 => 12,
        }
    }

    /// The fewest bytes one value of this type takes in a file (a string: its length; an array: its element
    /// type and count). A count is checked against this before anything is allocated for it.
    pub fn min_bytes(self) -> usize {
        match self {
            ValueType::U8 | ValueType::I8 | ValueType::Bool => 1,
            ValueType::U16 | ValueType::I16 => 2,
            ValueType::U32 | ValueType::I32 | ValueType::F32 => 4,
            ValueType::U64 | ValueType::I64 | ValueType::F64 | ValueType::String => 8,
            ValueType::Array => 12,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ValueType::U8 => "u8",
            ValueType::I8 => "i8",
            ValueType::U16 => "u16",
            ValueType::I16 => "i16",
            ValueType::U32 => "u32",
            ValueType::I32 => "i32",
            ValueType::F32 => "f32",
            ValueType::Bool => "bool",
            ValueType::String => "string",
            ValueType::Array => "array",
            ValueType::U64 => "u64",
            ValueType::I64 => "i64",
            ValueType::F64 => "f64",
        }
    }
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    /// The element type and the elements (all of that type).
    Array(ValueType, Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(..) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// An integer of any width, as i128 (so every stored integer fits).
    pub fn as_int(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// A float, or an integer read as one.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => self.as_int().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<(ValueType, &[Value])> {
        match self {
            Value::Array(t, items) => Some((*t, items)),
            _ => None,
        }
    }

    /// A short description for error messages: the type, and for an array its element type and length.
    pub fn describe(&self) -> String {
        match self {
            Value::Array(t, items) => format!("array of {} {}", items.len(), t.name()),
            v => v.value_type().name().to_string(),
        }
    }
}
