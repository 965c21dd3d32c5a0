//! The `smollm` pre-tokenizer: how llama.cpp cuts text into words before byte-level BPE merges them.
//!
//! Two passes over the text's code points, the second inside each piece of the first:
//! 1. `\p{N}`: every number code point is a piece of its own (the text between numbers is a piece too);
//! 2. the GPT-2 pattern `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
//!
//! Text is decoded leniently, as llama.cpp decodes it: a byte that does not start a sequence of the right length
//! with continuation bytes becomes U+FFFD (one per byte); other sequences (overlong ones, surrogates) keep their
//! value, and the words are re-encoded from the code points (a value past U+10FFFF as U+FFFD).

use unicode_general_category::{get_general_category, GeneralCategory as G};

/// What the pattern needs to know of one code point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Letter,
    Number,
    Space,
    Other,
}

fn class(cp: u32) -> Class {
    // surrogates and values past U+10FFFF are neither letters, numbers nor spaces
    let Some(c) = char::from_u32(cp) else { return Class::Other };
    // White_Space (Rust's is_whitespace is exactly that property) wins over the general category.
    if c.is_whitespace() {
        return Class::Space;
    }
    match get_general_category(c) {
        G::UppercaseLetter | G::LowercaseLetter | G::TitlecaseLetter | G::ModifierLetter | G::OtherLetter => {
            Class::Letter
        }
        G::DecimalNumber | G::LetterNumber | G::OtherNumber => Class::Number,
        _ => Class::Other,
    }
}

/// Decode bytes into code points: a lead byte and its continuation bytes give their value (no check for overlong
/// forms or surrogates), anything else one U+FFFD per byte.
pub fn decode_lenient(text: &[u8]) -> Vec<u32> {
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    let cont = |b: Option<&u8>| b.is_some_and(|b| b & 0xC0 == 0x80);
    while i < text.len() {
        let b = text[i];
        let (len, init) = if b & 0x80 == 0 {
            (1, b as u32)
        } else if b & 0x40 == 0 {
            (0, 0)
        } else if b & 0x20 == 0 {
            (2, (b & 0x1F) as u32)
        } else if b & 0x10 == 0 {
            (3, (b & 0x0F) as u32)
        } else if b & 0x08 == 0 {
            (4, (b & 0x07) as u32)
        } else {
            (0, 0)
        };
        if len == 0 || i + len > text.len() || !(1..len).all(|k| cont(text.get(i + k))) {
            out.push(0xFFFD);
            i += 1;
            continue;
        }
        let cp = (1..len).fold(init, |acc, k| (acc << 6) | (text[i + k] & 0x3F) as u32);
        out.push(cp);
        i += len;
    }
    out
}

/// Append the UTF-8 bytes of code points (values past U+10FFFF as U+FFFD).
pub fn encode_utf8(cps: &[u32], out: &mut Vec<u8>) {
    for &cp in cps {
        let cp = if cp > 0x10FFFF { 0xFFFD } else { cp };
        match cp {
            0..=0x7F => out.push(cp as u8),
            0x80..=0x7FF => out.extend_from_slice(&[0xC0 | (cp >> 6) as u8, 0x80 | (cp & 0x3F) as u8]),
            0x800..=0xFFFF => out.extend_from_slice(&[
                0xE0 | (cp >> 12) as u8,
                0x80 | ((cp >> 6) & 0x3F) as u8,
                0x80 | (cp & 0x3F) as u8,
            ]),
            _ => out.extend_from_slice(&[
                0xF0 | (cp >> 18) as u8,
                0x80 | ((cp >> 12) & 0x3F) as u8,
                0x80 | ((cp >> 6) & 0x3F) as u8,
                0x80 | (cp & 0x3F) as u8,
            ]),
        }
    }
}

/// Cut text into the words BPE merges within, as ranges of code points.
pub fn split(cps: &[u32]) -> Vec<std::ops::Range<usize>> {
    let classes: Vec<Class> = cps.iter().map(|&c| class(c)).collect();
    let mut words = Vec::new();
    // pass 1: numbers alone
    let mut start = 0;
    for (i, &k) in classes.iter().enumerate() {
        if k == Class::Number {
            if start < i {
                gpt2(cps, &classes, start, i, &mut words);
            }
            gpt2(cps, &classes, i, i + 1, &mut words);
            start = i + 1;
        }
    }
    if start < cps.len() {
        gpt2(cps, &classes, start, cps.len(), &mut words);
    }
    words
}

/// The GPT-2 pattern over cps[lo..hi]; what lies outside the range is not seen (no lookahead across it).
fn gpt2(cps: &[u32], classes: &[Class], lo: usize, hi: usize, out: &mut Vec<std::ops::Range<usize>>) {
    let at = |p: usize| if p < hi { char::from_u32(cps[p]) } else { None };
    let class_at = |p: usize| if p < hi { Some(classes[p]) } else { None };
    let mut pos = lo;
    while pos < hi {
        let c = char::from_u32(cps[pos]).unwrap_or('\u{FFFD}');
        // 's 't 're 've 'm 'll 'd (lower case only)
        if c == '\'' {
            match (at(pos + 1), at(pos + 2)) {
                (Some('s' | 't' | 'm' | 'd'), _) => {
                    out.push(pos..pos + 2);
                    pos += 2;
                    continue;
                }
                (Some('r' | 'v'), Some('e')) | (Some('l'), Some('l')) => {
                    out.push(pos..pos + 3);
                    pos += 3;
                    continue;
                }
                _ => {}
            }
        }
        // an optional space, then a run of one class
        let first = if c == ' ' { pos + 1 } else { pos };
        let run_class = class_at(first);
        if let Some(k @ (Class::Letter | Class::Number | Class::Other)) = run_class {
            let mut end = first + 1;
            while class_at(end) == Some(k) {
                end += 1;
            }
            out.push(pos..end);
            pos = end;
            continue;
        }
        // whitespace: \s+(?!\S) leaves the last space to the next word when something follows, else \s+
        let mut end = pos;
        while class_at(end) == Some(Class::Space) {
            end += 1;
        }
        let n = end - pos;
        if n > 1 && end < hi {
            out.push(pos..end - 1);
            pos = end - 1;
        } else if n > 0 {
            out.push(pos..end);
            pos = end;
        } else {
            out.push(pos..pos + 1);
            pos += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        let cps: Vec<u32> = s.chars().map(u32::from).collect();
        split(&cps)
            .into_iter()
            .map(|r| {
                let mut b = Vec::new();
                encode_utf8(&cps[r], &mut b);
                String::from_utf8(b).unwrap_or_default()
            })
            .collect()
    }

    #[test]
    fn gpt2_pattern_with_single_digits() {
        assert_eq!(words("Hello world"), ["Hello", " world"]);
        assert_eq!(words("it's 2024!"), ["it", "'s", " ", "2", "0", "2", "4", "!"]);
        assert_eq!(words("a  b"), ["a", " ", " b"]);
        assert_eq!(words("x \n\n"), ["x", " \n\n"]);
        assert_eq!(words("  ...?"), [" ", " ...?"]);
        assert_eq!(words("I'LL"), ["I", "'", "LL"]);
        assert_eq!(words("日本語 ok"), ["日本語", " ok"]);
        assert_eq!(words(""), Vec::<String>::new());
    }

    #[test]
    fn lenient_decoding_replaces_each_bad_byte() {
        assert_eq!(decode_lenient(b"a\xffb"), [0x61, 0xFFFD, 0x62]);
        assert_eq!(decode_lenient(b"\xe6\x97"), [0xFFFD, 0xFFFD]);
        assert_eq!(decode_lenient("é".as_bytes()), [0xE9]);
        assert_eq!(decode_lenient(b"\xed\xa0\x80"), [0xD800]);
        let mut b = Vec::new();
        encode_utf8(&[0xD800, 0x110000], &mut b);
        assert_eq!(b, b"\xed\xa0\x80\xef\xbf\xbd");
    }
}
