//! Byte-level tokenizer: ids 0..256 are bytes, then named special ids.
//!
//! Text may spell a special id as `<|name|>` (e.g. `<|user|>`); everything else is taken byte by byte.

use serde::{Deserialize, Serialize};

/// The special ids, in order after the 256 byte ids.
pub const SPECIALS: [&str; 8] = ["bos", "eos", "system", "user", "assistant", "tool", "audio", "pad"];

pub const BOS: u32 = 256;
/// End of a turn and end of generation.
pub const EOS: u32 = 257;
pub const ROLE_SYSTEM: u32 = 258;
pub const ROLE_USER: u32 = 259;
pub const ROLE_ASSISTANT: u32 = 260;
pub const ROLE_TOOL: u32 = 261;
/// Every audio frame carries this id; its payload travels as extension bytes.
pub const AUDIO: u32 = 262;
pub const PAD: u32 = 263;

/// Vocabulary size of every bundled engine.
pub const VOCAB: usize = 256 + SPECIALS.len();

/// The tokenizer (stateless; its description is written to tokenizer.json next to a fixture).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tokenizer;

/// tokenizer.json as written beside a fixture.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct TokenizerFile {
    pub kind: String,
    pub byte_ids: u32,
    pub specials: Vec<(String, u32)>,
}

impl Tokenizer {
    pub fn vocab(&self) -> usize {
        VOCAB
    }

    pub fn file(&self) -> TokenizerFile {
        TokenizerFile {
            kind: "byte-level".into(),
            byte_ids: 256,
            specials: SPECIALS.iter().enumerate().map(|(i, n)| (n.to_string(), 256 + i as u32)).collect(),
        }
    }

    pub fn special_id(name: &str) -> Option<u32> {
        SPECIALS.iter().position(|s| *s == name).map(|i| 256 + i as u32)
    }

    /// Bytes to ids; `<|name|>` spells a special id.
    pub fn encode(&self, text: &[u8]) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len());
        let mut i = 0;
        while i < text.len() {
            if text[i..].starts_with(b"<|") {
                if let Some(end) = text[i + 2..].windows(2).position(|w| w == b"|>") {
                    let name = &text[i + 2..i + 2 + end];
                    if let Some(id) = std::str::from_utf8(name).ok().and_then(Self::special_id) {
                        out.push(id);
                        i += end + 4;
                        continue;
                    }
                }
            }
            out.push(text[i] as u32);
            i += 1;
        }
        out
    }

    /// The bytes of one id: the byte itself, or `<|name|>` for a special id.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        if id < 256 {
            vec![id as u8]
        } else {
            match SPECIALS.get((id - 256) as usize) {
                Some(name) => format!("<|{name}|>").into_bytes(),
                None => format!("<|{id}|>").into_bytes(),
            }
        }
    }

    pub fn decode(&self, ids: &[u32]) -> Vec<u8> {
        ids.iter().flat_map(|&id| self.token_bytes(id)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn specials_are_parsed() {
        let t = Tokenizer;
        assert_eq!(t.encode(b"<|user|>hi"), vec![ROLE_USER, b'h' as u32, b'i' as u32]);
        assert_eq!(t.encode(b"<|nope|>").len(), 8, "unknown names stay bytes");
        assert_eq!(t.encode(b"<|"), vec![b'<' as u32, b'|' as u32]);
    }

    proptest! {
        #[test]
        fn decode_encode_round_trips(ids in proptest::collection::vec(0u32..VOCAB as u32, 0..64)) {
            let t = Tokenizer;
            // a byte sequence that happens to spell a special name re-encodes as that special: exclude '<'
            let ids: Vec<u32> = ids.into_iter().filter(|&i| i != b'<' as u32).collect();
            prop_assert_eq!(t.encode(&t.decode(&ids)), ids);
        }
    }
}
