//! How scenario files are deserialized: serde_json under a wrapper that
//!
//! - reads a struct only from a JSON object: serde's derived structs also accept an array of their fields in
//!   order, which would let `"params": []` run with default parameters and `"engine": ["inkling"]` pass;
//! - reads an enum only from a string (every enum of the format is a name), and says which names it expects
//!   where serde_json would say only "expected value";
//! - remembers the path of the value where the first error arose (`params.tasks[0].tools`), so every message can
//!   name the field and the loader can point at the value.
//!
//! A wrapper around the deserializer rather than attributes or hand-written impls per type: it covers every
//! struct and enum the format has or gains, with nothing to forget on a new field.

use std::cell::RefCell;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, EnumAccess, MapAccess, SeqAccess, VariantAccess, Visitor};

/// One step of a path into the document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    Key(String),
    Index(usize),
}

/// Where the first error arose.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ErrorAt {
    /// The path of the value being read (the object's own path when the error is in one of its keys).
    pub path: Vec<Segment>,
    /// The error is about a key of the object at `path` (an unknown or duplicate field), not about its value.
    pub in_key: bool,
}

/// Deserialize `T` from `de` under the wrapper; on error, also where it arose.
pub fn deserialize<'de, T, D>(de: D) -> Result<T, (D::Error, ErrorAt)>
where
    T: de::Deserialize<'de>,
    D: Deserializer<'de>,
{
    let track = Track::default();
    let result = T::deserialize(Strict { de, path: &Path::Root, track: &track });
    result.map_err(|e| (e, track.first.into_inner().unwrap_or_default()))
}

/// Read `T` from all of `text` (trailing characters other than whitespace are an error) under the wrapper.
pub fn from_str<'de, T: de::Deserialize<'de>>(text: &'de str) -> Result<T, (serde_json::Error, ErrorAt)> {
    let mut de = serde_json::Deserializer::from_str(text);
    let value = deserialize(&mut de)?;
    de.end().map_err(|e| (e, ErrorAt::default()))?;
    Ok(value)
}

/// A path as a chain of borrowed parents: nothing is built per value, only for the first error.
enum Path<'a> {
    Root,
    Key(&'a Path<'a>, &'a str),
    Index(&'a Path<'a>, usize),
}

impl Path<'_> {
    fn segments(&self) -> Vec<Segment> {
        let mut out = Vec::new();
        let mut at = self;
        loop {
            match at {
                Path::Root => break,
                Path::Key(parent, key) => {
                    out.push(Segment::Key((*key).to_string()));
                    at = parent;
                }
                Path::Index(parent, i) => {
                    out.push(Segment::Index(*i));
                    at = parent;
                }
            }
        }
        out.reverse();
        out
    }
}

#[derive(Default)]
struct Track {
    first: RefCell<Option<ErrorAt>>,
}

impl Track {
    /// Record `path` unless a deeper error was recorded already (errors travel outwards).
    fn trip(&self, path: &Path<'_>, in_key: bool) {
        let mut first = self.first.borrow_mut();
        if first.is_none() {
            *first = Some(ErrorAt { path: path.segments(), in_key });
        }
    }
}

/// The wrapped deserializer of one value.
struct Strict<'a, D> {
    de: D,
    path: &'a Path<'a>,
    track: &'a Track,
}

impl<'a, D> Strict<'a, D> {
    fn wrap<V>(&self, visitor: V) -> Wrap<'a, V> {
        Wrap { visitor, path: self.path, track: self.track }
    }
}

macro_rules! forward {
    ($($method:ident($($arg:ident: $ty:ty),*)),* $(,)?) => {$(
        fn $method<V: Visitor<'de>>(self, $($arg: $ty,)* visitor: V) -> Result<V::Value, Self::Error> {
            let (path, track) = (self.path, self.track);
            let wrapped = self.wrap(visitor);
            self.de.$method($($arg,)* wrapped).inspect_err(|_| {
                track.trip(path, false);
            })
        }
    )*};
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Strict<'_, D> {
    type Error = D::Error;

    forward! {
        deserialize_any(), deserialize_bool(), deserialize_i8(), deserialize_i16(), deserialize_i32(),
        deserialize_i64(), deserialize_i128(), deserialize_u8(), deserialize_u16(), deserialize_u32(),
        deserialize_u64(), deserialize_u128(), deserialize_f32(), deserialize_f64(), deserialize_char(),
        deserialize_str(), deserialize_string(), deserialize_bytes(), deserialize_byte_buf(), deserialize_option(),
        deserialize_unit(), deserialize_unit_struct(name: &'static str),
        deserialize_newtype_struct(name: &'static str), deserialize_seq(), deserialize_tuple(len: usize),
        deserialize_tuple_struct(name: &'static str, len: usize), deserialize_map(), deserialize_identifier(),
        deserialize_ignored_any(),
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        let (path, track) = (self.path, self.track);
        let only_objects = ObjectOnly(self.wrap(visitor));
        self.de.deserialize_struct(name, fields, only_objects).inspect_err(|_| {
            track.trip(path, false);
        })
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        let (path, track) = (self.path, self.track);
        let by_name = NameOnly { visitor, variants };
        self.de.deserialize_any(by_name).inspect_err(|_| {
            track.trip(path, false);
        })
    }

    fn is_human_readable(&self) -> bool {
        self.de.is_human_readable()
    }
}

/// A struct's visitor that takes objects only; anything else is "invalid type: ..., expected an object".
struct ObjectOnly<'a, V>(Wrap<'a, V>);

impl<'de, V: Visitor<'de>> Visitor<'de> for ObjectOnly<'_, V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.0.visit_map(map)
    }
}

/// An enum's visitor that takes its name as a string only.
struct NameOnly<V> {
    visitor: V,
    variants: &'static [&'static str],
}

impl<'de, V: Visitor<'de>> Visitor<'de> for NameOnly<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string, one of ")?;
        for (i, v) in self.variants.iter().enumerate() {
            write!(f, "{}`{v}`", if i == 0 { "" } else { ", " })?;
        }
        Ok(())
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<V::Value, E> {
        self.visitor.visit_enum(de::value::StrDeserializer::new(v))
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<V::Value, E> {
        self.visitor.visit_enum(de::value::BorrowedStrDeserializer::new(v))
    }
}

/// Any visitor, with what it is handed wrapped in turn.
struct Wrap<'a, V> {
    visitor: V,
    path: &'a Path<'a>,
    track: &'a Track,
}

macro_rules! pass {
    ($($method:ident($ty:ty)),* $(,)?) => {$(
        fn $method<E: de::Error>(self, v: $ty) -> Result<V::Value, E> {
            self.visitor.$method(v)
        }
    )*};
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Wrap<'_, V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        self.visitor.expecting(f)
    }

    pass! {
        visit_bool(bool), visit_i8(i8), visit_i16(i16), visit_i32(i32), visit_i64(i64), visit_i128(i128),
        visit_u8(u8), visit_u16(u16), visit_u32(u32), visit_u64(u64), visit_u128(u128), visit_f32(f32),
        visit_f64(f64), visit_char(char), visit_str(&str), visit_borrowed_str(&'de str), visit_string(String),
        visit_bytes(&[u8]), visit_borrowed_bytes(&'de [u8]), visit_byte_buf(Vec<u8>),
    }

    fn visit_none<E: de::Error>(self) -> Result<V::Value, E> {
        self.visitor.visit_none()
    }

    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        self.visitor.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, de: D) -> Result<V::Value, D::Error> {
        self.visitor.visit_some(Strict { de, path: self.path, track: self.track })
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, de: D) -> Result<V::Value, D::Error> {
        self.visitor.visit_newtype_struct(Strict { de, path: self.path, track: self.track })
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        self.visitor.visit_seq(Elements { seq, path: self.path, track: self.track, index: 0 })
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.visitor.visit_map(Members { map, path: self.path, track: self.track, key: None })
    }

    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<V::Value, A::Error> {
        self.visitor.visit_enum(Variant { data, path: self.path, track: self.track })
    }
}

/// An array's elements, each at its index.
struct Elements<'a, A> {
    seq: A,
    path: &'a Path<'a>,
    track: &'a Track,
    index: usize,
}

impl<'de, A: SeqAccess<'de>> SeqAccess<'de> for Elements<'_, A> {
    type Error = A::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, A::Error> {
        let path = Path::Index(self.path, self.index);
        self.index += 1;
        self.seq.next_element_seed(Seed { seed, path: &path, track: self.track })
    }

    fn size_hint(&self) -> Option<usize> {
        self.seq.size_hint()
    }
}

/// An object's members, each value at its key.
struct Members<'a, A> {
    map: A,
    path: &'a Path<'a>,
    track: &'a Track,
    /// The key just read, for the path of its value.
    key: Option<String>,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for Members<'_, A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, A::Error> {
        self.key = None;
        let key = &mut self.key;
        self.map.next_key_seed(KeySeed { seed, key }).inspect_err(|_| {
            self.track.trip(self.path, true);
        })
    }

    fn next_value_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<T::Value, A::Error> {
        let key = self.key.take().unwrap_or_default();
        let path = Path::Key(self.path, &key);
        self.map.next_value_seed(Seed { seed, path: &path, track: self.track })
    }

    fn size_hint(&self) -> Option<usize> {
        self.map.size_hint()
    }
}

/// An enum's variant (only reached through serde_json's own enum reading of an object, which `NameOnly` never
/// asks for; kept so every path stays wrapped).
struct Variant<'a, A> {
    data: A,
    path: &'a Path<'a>,
    track: &'a Track,
}

impl<'a, 'de, A: EnumAccess<'de>> EnumAccess<'de> for Variant<'a, A> {
    type Error = A::Error;
    type Variant = Variant<'a, A::Variant>;

    fn variant_seed<S: DeserializeSeed<'de>>(self, seed: S) -> Result<(S::Value, Self::Variant), A::Error> {
        let (path, track) = (self.path, self.track);
        let (value, data) = self.data.variant_seed(seed)?;
        Ok((value, Variant { data, path, track }))
    }
}

impl<'de, A: VariantAccess<'de>> VariantAccess<'de> for Variant<'_, A> {
    type Error = A::Error;

    fn unit_variant(self) -> Result<(), A::Error> {
        self.data.unit_variant()
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, A::Error> {
        self.data.newtype_variant_seed(Seed { seed, path: self.path, track: self.track })
    }

    fn tuple_variant<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, A::Error> {
        self.data.tuple_variant(len, Wrap { visitor, path: self.path, track: self.track })
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        self.data.struct_variant(fields, ObjectOnly(Wrap { visitor, path: self.path, track: self.track }))
    }
}

/// A value's seed, handed the wrapped deserializer.
struct Seed<'a, S> {
    seed: S,
    path: &'a Path<'a>,
    track: &'a Track,
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Seed<'_, S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<S::Value, D::Error> {
        self.seed.deserialize(Strict { de, path: self.path, track: self.track })
    }
}

/// A key's seed that keeps a copy of the key (JSON keys are strings) for the path of its value.
struct KeySeed<'k, S> {
    seed: S,
    key: &'k mut Option<String>,
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for KeySeed<'_, S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<S::Value, D::Error> {
        let text: KeyText<'de> = de::Deserialize::deserialize(de)?;
        *self.key = Some(text.as_str().to_string());
        self.seed.deserialize(text.into_deserializer())
    }
}

/// A key as read, borrowed when serde_json can lend it.
enum KeyText<'de> {
    Borrowed(&'de str),
    Owned(String),
}

impl<'de> KeyText<'de> {
    fn as_str(&self) -> &str {
        match self {
            KeyText::Borrowed(s) => s,
            KeyText::Owned(s) => s,
        }
    }

    fn into_deserializer<E: de::Error>(self) -> KeyDeserializer<'de, E> {
        KeyDeserializer { key: self, marker: std::marker::PhantomData }
    }
}

impl<'de> de::Deserialize<'de> for KeyText<'de> {
    fn deserialize<D: Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = KeyText<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<KeyText<'de>, E> {
                Ok(KeyText::Borrowed(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<KeyText<'de>, E> {
                Ok(KeyText::Owned(v.to_string()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<KeyText<'de>, E> {
                Ok(KeyText::Owned(v))
            }
        }
        de.deserialize_str(KeyVisitor)
    }
}

/// A key handed on to the real key seed, as serde_json would hand it (a string).
struct KeyDeserializer<'de, E> {
    key: KeyText<'de>,
    marker: std::marker::PhantomData<E>,
}

impl<'de, E: de::Error> Deserializer<'de> for KeyDeserializer<'de, E> {
    type Error = E;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, E> {
        match self.key {
            KeyText::Borrowed(s) => visitor.visit_borrowed_str(s),
            KeyText::Owned(s) => visitor.visit_string(s),
        }
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
        unit_struct newtype_struct seq tuple tuple_struct map struct enum identifier ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[derive(Debug, serde::Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Inner {
        a: u32,
        #[serde(default)]
        b: Option<Vec<Inner>>,
    }

    #[derive(Debug, serde::Deserialize, PartialEq)]
    #[serde(rename_all = "kebab-case")]
    enum Colour {
        DarkRed,
        Blue,
    }

    fn read<T: for<'de> de::Deserialize<'de>>(text: &str) -> Result<T, (String, ErrorAt)> {
        let mut de = serde_json::Deserializer::from_str(text);
        deserialize(&mut de).map_err(|(e, at)| (e.to_string(), at))
    }

    fn key(k: &str) -> Segment {
        Segment::Key(k.into())
    }

    #[test]
    fn objects_read_as_before_and_arrays_are_refused_for_structs() {
        let ok: Inner = read(r#"{"a": 1, "b": [{"a": 2}]}"#).expect("object");
        assert_eq!(ok, Inner { a: 1, b: Some(vec![Inner { a: 2, b: None }]) });
        let (msg, at) = read::<Inner>(r#"{"a": 1, "b": [{"a": 2}, [3]]}"#).expect_err("array");
        assert!(msg.contains("invalid type: sequence, expected an object"), "{msg}");
        assert_eq!(at.path, [key("b"), Segment::Index(1)]);
        // maps and arrays of values are untouched
        let m: BTreeMap<String, Vec<u8>> = read(r#"{"x": [1, 2]}"#).expect("map");
        assert_eq!(m["x"], [1, 2]);
    }

    #[test]
    fn enums_are_names_and_a_wrong_type_lists_them() {
        let c: Vec<Colour> = read(r#"["dark-red", "blue"]"#).expect("names");
        assert_eq!(c, [Colour::DarkRed, Colour::Blue]);
        let (msg, at) = read::<Vec<Colour>>(r#"["blue", 5]"#).expect_err("number");
        assert!(msg.contains("expected a string, one of `dark-red`, `blue`"), "{msg}");
        assert_eq!(at.path, [Segment::Index(1)]);
        let (msg, _) = read::<Colour>(r#"{"blue": null}"#).expect_err("object");
        assert!(msg.contains("expected a string"), "{msg}");
        let (msg, _) = read::<Colour>(r#""green""#).expect_err("unknown");
        assert!(msg.contains("unknown variant `green`"), "{msg}");
    }

    #[test]
    fn key_errors_are_marked_as_such() {
        let (msg, at) = read::<Inner>(r#"{"b": [{"a": 1, "c": 2}]}"#).expect_err("unknown");
        assert!(msg.contains("unknown field `c`"), "{msg}");
        assert_eq!(at, ErrorAt { path: vec![key("b"), Segment::Index(0)], in_key: true });
    }
}
