//! Byte-level BPE as GGUF models carry it (`tokenizer.ggml.model = gpt2`): the vocabulary's token texts in GPT-2's
//! byte-to-character spelling, the ranked merges, the token types, and a named pre-tokenizer (`smollm` so far).
//!
//! Encoding follows llama.cpp's `llama_tokenize`: special tokens are cut out of the text first (control tokens only
//! when parsing specials, user-defined tokens always, longest first), the text between them is split into words by
//! the pre-tokenizer, each word's bytes are merged lowest rank first (leftmost on ties). A byte the vocabulary has
//! no token for is dropped, as llama.cpp drops it (SmolLM2 has none for 21 bytes: six control characters and the
//! bytes UTF-8 never uses).

mod pretokenize;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

/// The merge table's hasher: its keys are two token ids packed in a u64, hashed by one multiplication (the
/// default SipHash costs more than the merging itself).
#[derive(Debug, Default, Clone, Copy)]
pub struct PairHasher(u64);

impl Hasher for PairHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (v ^ (v >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 ^= self.0 >> 32;
    }
}

fn pair_key(l: u32, r: u32) -> u64 {
    (l as u64) << 32 | r as u64
}

pub use pretokenize::{decode_lenient, encode_utf8, split};

/// GGUF `tokenizer.ggml.token_type` values.
pub mod token_type {
    pub const NORMAL: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    pub const CONTROL: i32 = 3;
    pub const USER_DEFINED: i32 = 4;
    pub const UNUSED: i32 = 5;
    pub const BYTE: i32 = 6;
}

/// What a byte-level BPE tokenizer is built from (a GGUF's `tokenizer.ggml.*` keys).
#[derive(Debug, Clone, Default)]
pub struct BpeVocab {
    /// `tokenizer.ggml.tokens`
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type` (empty: every token normal)
    pub token_types: Vec<i32>,
    /// `tokenizer.ggml.merges`: "left right", best first
    pub merges: Vec<String>,
    /// `tokenizer.ggml.pre`
    pub pre: String,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`: whether encoding with `add_special` starts with bos
    pub add_bos: bool,
    /// `tokenizer.ggml.add_eos_token`
    pub add_eos: bool,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BpeError {
    #[error("pre-tokenizer `{0}` is not supported (supported: smollm)")]
    Pre(String),
    #[error("tokenizer.ggml.token_type has {types} entries for {tokens} tokens")]
    TypeCount { types: usize, tokens: usize },
    #[error("merge {index} `{text}` is not two tokens separated by a space")]
    Merge { index: usize, text: String },
    #[error("{name} id {id} is outside the vocabulary of {n} tokens")]
    SpecialId { name: &'static str, id: u32, n: usize },
}

/// A byte-level BPE tokenizer.
#[derive(Debug, Clone)]
pub struct Bpe {
    /// Each token's bytes (normal tokens decoded from GPT-2's spelling; control and user-defined as written).
    pieces: Vec<Vec<u8>>,
    types: Vec<i32>,
    /// The token of each byte (`NONE` where the vocabulary has none).
    byte_token: [u32; 256],
    /// (left, right) -> (rank, merged token)
    merges: HashMap<u64, (u32, u32), BuildHasherDefault<PairHasher>>,
    /// Tokens recognised in text before pre-tokenizing, longest first: (text, id, control-like).
    specials: Vec<(Vec<u8>, u32, bool)>,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    /// Merges that could not be used: a side or the result is not a token (llama.cpp would merge them and then
    /// fall back to bytes; reported, never seen in a released vocabulary).
    pub unusable_merges: usize,
}

const NONE: u32 = u32::MAX;

/// GPT-2's reversible spelling of bytes as printable characters.
pub fn byte_to_char(b: u8) -> char {
    let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable {
        return char::from(b);
    }
    // the others, in byte order, take the code points from U+0100 on
    let rank = (0..b).filter(|&x| !matches!(x, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)).count() as u32;
    char::from_u32(0x100 + rank).unwrap_or('\u{FFFD}')
}

fn char_to_byte_table() -> HashMap<char, u8> {
    (0..=255u8).map(|b| (byte_to_char(b), b)).collect()
}

impl Bpe {
    pub fn new(vocab: &BpeVocab) -> Result<Self, BpeError> {
        if vocab.pre != "smollm" {
            return Err(BpeError::Pre(vocab.pre.clone()));
        }
        let n = vocab.tokens.len();
        if !vocab.token_types.is_empty() && vocab.token_types.len() != n {
            return Err(BpeError::TypeCount { types: vocab.token_types.len(), tokens: n });
        }
        let types: Vec<i32> =
            if vocab.token_types.is_empty() { vec![token_type::NORMAL; n] } else { vocab.token_types.clone() };
        for (name, id) in [("bos", vocab.bos), ("eos", vocab.eos)] {
            if let Some(id) = id.filter(|&id| id as usize >= n) {
                return Err(BpeError::SpecialId { name, id, n });
            }
        }
        let to_byte = char_to_byte_table();
        let mut ids: HashMap<&str, u32> = HashMap::with_capacity(n);
        let mut pieces = Vec::with_capacity(n);
        for (id, text) in vocab.tokens.iter().enumerate() {
            ids.entry(text.as_str()).or_insert(id as u32);
            let raw = matches!(types[id], token_type::CONTROL | token_type::USER_DEFINED | token_type::UNKNOWN);
            let decoded: Option<Vec<u8>> =
                if raw { None } else { text.chars().map(|c| to_byte.get(&c).copied()).collect() };
            pieces.push(decoded.unwrap_or_else(|| text.as_bytes().to_vec()));
        }
        let mut byte_token = [NONE; 256];
        for b in 0..=255u8 {
            let mut s = [0u8; 4];
            let spelled = byte_to_char(b).encode_utf8(&mut s);
            if let Some(&id) = ids.get(&*spelled) {
                byte_token[b as usize] = id;
            }
        }
        let mut merges = HashMap::with_capacity_and_hasher(vocab.merges.len(), BuildHasherDefault::default());
        let mut unusable_merges = 0;
        for (rank, m) in vocab.merges.iter().enumerate() {
            let (l, r) = m.split_once(' ').ok_or_else(|| BpeError::Merge { index: rank, text: m.clone() })?;
            let merged = format!("{l}{r}");
            match (ids.get(l), ids.get(r), ids.get(merged.as_str())) {
                (Some(&a), Some(&b), Some(&c)) => {
                    merges.entry(pair_key(a, b)).or_insert((rank as u32, c));
                }
                _ => unusable_merges += 1,
            }
        }
        let mut specials: Vec<(Vec<u8>, u32, bool)> = types
            .iter()
            .enumerate()
            .filter(|(_, t)| matches!(**t, token_type::CONTROL | token_type::USER_DEFINED | token_type::UNKNOWN))
            .filter(|(id, _)| !vocab.tokens[*id].is_empty())
            .map(|(id, &t)| (vocab.tokens[id].as_bytes().to_vec(), id as u32, t != token_type::USER_DEFINED))
            .collect();
        specials.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        Ok(Bpe {
            pieces,
            types,
            byte_token,
            merges,
            specials,
            bos: vocab.bos,
            eos: vocab.eos,
            add_bos: vocab.add_bos,
            add_eos: vocab.add_eos,
            unusable_merges,
        })
    }

    pub fn vocab(&self) -> usize {
        self.pieces.len()
    }

    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// A token's GGUF type (`token_type::*`).
    pub fn token_type(&self, id: u32) -> Option<i32> {
        self.types.get(id as usize).copied()
    }

    /// The bytes of one token: a normal token's bytes, a control or user-defined token's text; unknown ids give
    /// nothing.
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        self.pieces.get(id as usize).map(Vec::as_slice).unwrap_or(&[])
    }

    /// Ids to bytes (special tokens as their text).
    pub fn decode(&self, ids: &[u32]) -> Vec<u8> {
        ids.iter().flat_map(|&id| self.token_bytes(id).iter().copied()).collect()
    }

    /// Text to ids, as `llama_tokenize(text, add_special, parse_special)`: with `add_special`, bos first (and eos
    /// last) when the vocabulary asks for them; with `parse_special`, control tokens spelled in the text are
    /// recognised (user-defined tokens always are). Any bytes are accepted.
    pub fn encode(&self, text: &[u8], add_special: bool, parse_special: bool) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            out.extend(self.bos);
        }
        for fragment in self.partition(text, parse_special) {
            match fragment {
                Fragment::Token(id) => out.push(id),
                Fragment::Text(t) => self.encode_text(t, &mut out),
            }
        }
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        out
    }

    /// Cut special tokens out of the text: each special (longest first) is searched for in the fragments of text
    /// left by the ones before it.
    fn partition<'a>(&self, text: &'a [u8], parse_special: bool) -> Vec<Fragment<'a>> {
        let mut frags = vec![Fragment::Text(text)];
        if text.is_empty() {
            return vec![];
        }
        for (spelling, id, control) in &self.specials {
            if *control && !parse_special {
                continue;
            }
            if !frags.iter().any(|f| matches!(f, Fragment::Text(t) if t.len() >= spelling.len())) {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len());
            for f in frags {
                let Fragment::Text(mut t) = f else {
                    next.push(f);
                    continue;
                };
                while let Some(at) = find(t, spelling) {
                    if at > 0 {
                        next.push(Fragment::Text(&t[..at]));
                    }
                    next.push(Fragment::Token(*id));
                    t = &t[at + spelling.len()..];
                }
                if !t.is_empty() {
                    next.push(Fragment::Text(t));
                }
            }
            frags = next;
        }
        frags
    }

    fn encode_text(&self, text: &[u8], out: &mut Vec<u32>) {
        let cps = decode_lenient(text);
        let mut word = Vec::new();
        for range in split(&cps) {
            word.clear();
            encode_utf8(&cps[range], &mut word);
            self.merge_word(&word, out);
        }
    }

    /// Merge one word's byte tokens, lowest rank first and leftmost among equal ranks.
    fn merge_word(&self, word: &[u8], out: &mut Vec<u32>) {
        if word.len() == 1 {
            out.extend(Some(self.byte_token[word[0] as usize]).filter(|&id| id != NONE));
            return;
        }
        // symbols in a linked list; a merge keeps the left one
        let mut ids: Vec<u32> = word.iter().map(|&b| self.byte_token[b as usize]).collect();
        let n = ids.len();
        let mut next: Vec<usize> = (1..=n).collect();
        let mut prev: Vec<usize> = (0..n).map(|i| i.wrapping_sub(1)).collect();
        let mut alive = vec![true; n];
        let mut heap = BinaryHeap::new();
        // a missing byte (NONE) is in no merge
        let pair = |ids: &[u32], l: usize, r: usize| self.merges.get(&pair_key(ids[l], ids[r])).copied();
        for i in 0..n - 1 {
            if let Some((rank, merged)) = pair(&ids, i, i + 1) {
                heap.push(Reverse((rank, i, i + 1, ids[i], ids[i + 1], merged)));
            }
        }
        while let Some(Reverse((_, l, r, lid, rid, merged))) = heap.pop() {
            // stale: a side was merged away or changed since this pair was queued
            if !alive[l] || !alive[r] || next[l] != r || ids[l] != lid || ids[r] != rid {
                continue;
            }
            ids[l] = merged;
            alive[r] = false;
            next[l] = next[r];
            if next[r] < n {
                prev[next[r]] = l;
            }
            let p = prev[l];
            if p < n {
                if let Some((rank, m)) = pair(&ids, p, l) {
                    heap.push(Reverse((rank, p, l, ids[p], ids[l], m)));
                }
            }
            let q = next[l];
            if q < n {
                if let Some((rank, m)) = pair(&ids, l, q) {
                    heap.push(Reverse((rank, l, q, ids[l], ids[q], m)));
                }
            }
        }
        out.extend((0..n).filter(|&i| alive[i] && ids[i] != NONE).map(|i| ids[i]));
    }
}

enum Fragment<'a> {
    Text(&'a [u8]),
    Token(u32),
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || hay.len() < needle.len() {
        return None;
    }
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A toy vocabulary: the 256 byte tokens, then merges "h e", "he l", "l o", "hel lo"... and two specials.
    fn toy() -> Bpe {
        let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_to_char(b).to_string()).collect();
        let mut types = vec![token_type::NORMAL; 256];
        let merges = ["h e", "l l", "he ll", "hell o", "Ġ w", "o r"];
        for m in merges {
            tokens.push(m.replace(' ', ""));
            types.push(token_type::NORMAL);
        }
        tokens.push("<|im_start|>".into());
        types.push(token_type::CONTROL);
        tokens.push("<tag>".into());
        types.push(token_type::USER_DEFINED);
        Bpe::new(&BpeVocab {
            tokens,
            token_types: types,
            merges: merges.iter().map(|s| s.to_string()).collect(),
            pre: "smollm".into(),
            bos: Some(262),
            eos: Some(262),
            add_bos: false,
            add_eos: false,
        })
        .expect("toy vocabulary")
    }

    #[test]
    fn byte_spelling_is_gpt2s() {
        assert_eq!(byte_to_char(b'A'), 'A');
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(byte_to_char(0), 'Ā');
        assert_eq!(byte_to_char(0xAD), 'Ń');
        let all: std::collections::HashSet<char> = (0..=255u8).map(byte_to_char).collect();
        assert_eq!(all.len(), 256);
    }

    #[test]
    fn merges_lowest_rank_first() {
        let t = toy();
        // hello -> h e l l o -> he l l o -> he ll o -> hell o -> hello
        assert_eq!(t.encode(b"hello", false, false), vec![259]);
        assert_eq!(t.decode(&t.encode(b"hello world", false, false)), b"hello world");
        assert_eq!(t.encode(b" wor", false, false), vec![260, 261]);
    }

    #[test]
    fn specials_follow_parse_special() {
        let t = toy();
        assert_eq!(t.encode(b"<|im_start|>hello", false, true), vec![262, 259]);
        let plain = t.encode(b"<|im_start|>", false, false);
        assert_eq!(plain.len(), 12, "bytes when specials are not parsed: {plain:?}");
        // user-defined tokens are recognised either way
        assert_eq!(t.encode(b"<tag>", false, false), vec![263]);
        assert_eq!(t.token_bytes(262), b"<|im_start|>");
    }

    #[test]
    fn any_bytes_encode_and_decode_back() {
        let t = toy();
        let text = b"\xff\xfe caf\xc3\xa9 \xe2\x80";
        // invalid bytes become U+FFFD, as in llama.cpp
        let ids = t.encode(text, false, false);
        assert_eq!(t.decode(&ids), "\u{FFFD}\u{FFFD} café \u{FFFD}\u{FFFD}".as_bytes());
        assert!(t.encode(b"", true, true).is_empty());
    }
}
