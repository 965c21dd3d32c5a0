//! The engine's text side as both servers use it: taken once from `Engine::text()` when a server starts, it
//! turns text and conversations into ids and ids back into text, with the engine's own tokenizer and template
//! (a GGUF model's BPE vocabulary and chat template; the bundled byte tokenizer and its template otherwise).

use std::sync::Arc;

use crate::chat::TextMessage;
use crate::engine::Engine;
use crate::text_tokenizer::TextTokenizer;
use crate::tokenizer::Tokenizer;

/// One engine's tokenizer, with what the serve layer needs to know about it.
#[derive(Clone)]
pub struct ServeText {
    tokenizer: Arc<dyn TextTokenizer>,
    /// The tokenizer is the bundled byte tokenizer (it says so): text that is not UTF-8 is taken byte by byte and
    /// ids 0..=0xff are spelled as bytes.
    byte_level: bool,
}

impl std::fmt::Debug for ServeText {
    // a BPE vocabulary is too long to print
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeText")
            .field("vocab", &self.tokenizer.vocab())
            .field("eos", &self.tokenizer.eos())
            .field("byte_level", &self.byte_level)
            .finish()
    }
}

impl ServeText {
    pub fn new(tokenizer: Arc<dyn TextTokenizer>) -> Self {
        let byte_level = tokenizer.byte_level();
        ServeText { tokenizer, byte_level }
    }

    /// The text side of `engine`.
    pub fn of(engine: &dyn Engine) -> Self {
        Self::new(engine.text())
    }

    /// The bundled byte tokenizer.
    pub fn bytes() -> Self {
        Self::new(Arc::new(Tokenizer))
    }

    pub fn tokenizer(&self) -> &Arc<dyn TextTokenizer> {
        &self.tokenizer
    }

    /// Text to ids as a prompt is tokenized; special tokens spelled in the text are those tokens.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        self.tokenizer.encode(text, true)
    }

    /// A text payload's ids (`encode`). Bytes that are not UTF-8 are taken byte by byte by the byte tokenizer
    /// and refused by any other.
    pub fn encode_bytes(&self, payload: &[u8]) -> Result<Vec<u32>, String> {
        match std::str::from_utf8(payload) {
            Ok(text) => Ok(self.encode(text)),
            Err(_) if self.byte_level => Ok(Tokenizer.encode(payload)),
            Err(e) => Err(format!("the text is not UTF-8 ({e}); send ids (ids=1) for raw bytes")),
        }
    }

    /// A conversation rendered with the engine's chat template, ending where the reply begins.
    pub fn render_chat(&self, messages: &[TextMessage]) -> Result<Vec<u32>, String> {
        self.tokenizer.render_chat(messages)
    }

    /// The bytes one id stands for (a special token's text for a special token, eos included).
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        self.tokenizer.token_bytes(id)
    }

    /// The bytes a generated token adds to a reply's text: the eos adds none.
    pub fn text_bytes(&self, id: u32) -> Vec<u8> {
        if self.tokenizer.eos() == Some(id) {
            Vec::new()
        } else {
            self.token_bytes(id)
        }
    }

    /// How a token is spelled in log probabilities: the byte tokenizer spells an ASCII byte as itself, a byte
    /// that is no text alone as `<0xNN>` and a special id by its name (`<|eos|>`); any other vocabulary spells a
    /// token by its text (lossy UTF-8).
    pub fn token_string(&self, id: u32) -> String {
        match id {
            0..=0x7f if self.byte_level => char::from(id as u8).to_string(),
            0x80..=0xff if self.byte_level => format!("<0x{id:02X}>"),
            _ => String::from_utf8_lossy(&self.token_bytes(id)).into_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::{BOS, EOS, ROLE_USER};

    /// A vocabulary that is not the byte tokenizer's: "a", "b", "<0x80>" byte, "</s>".
    #[derive(Debug)]
    struct Tiny;

    impl TextTokenizer for Tiny {
        fn vocab(&self) -> usize {
            4
        }
        fn encode(&self, text: &str, _: bool) -> Vec<u32> {
            text.bytes().map(|b| u32::from(b == b'b')).collect()
        }
        fn token_bytes(&self, id: u32) -> Vec<u8> {
            match id {
                0 => b"a".to_vec(),
                1 => b"b".to_vec(),
                2 => vec![0x80],
                3 => b"</s>".to_vec(),
                _ => Vec::new(),
            }
        }
        fn render_chat(&self, messages: &[TextMessage]) -> Result<Vec<u32>, String> {
            Ok(messages.iter().map(|_| 3).collect())
        }
        fn eos(&self) -> Option<u32> {
            Some(3)
        }
    }

    #[test]
    fn the_byte_tokenizer_is_recognised_and_keeps_its_spelling() {
        let t = ServeText::bytes();
        assert!(t.byte_level);
        assert_eq!(t.encode_bytes(b"<|bos|><|user|>hi"), Ok(vec![BOS, ROLE_USER, 104, 105]));
        assert_eq!(t.encode_bytes(b"\xff<|user|>"), Ok(vec![0xff, ROLE_USER]));
        assert_eq!(
            (t.token_string(104), t.token_string(0x8d), t.token_string(EOS)),
            ("h".into(), "<0x8D>".into(), "<|eos|>".into())
        );
        assert_eq!((t.text_bytes(EOS), t.token_bytes(EOS)), (Vec::new(), b"<|eos|>".to_vec()));
    }

    #[test]
    fn another_vocabulary_spells_tokens_by_their_text() {
        let t = ServeText::new(Arc::new(Tiny));
        assert!(!t.byte_level);
        assert_eq!(t.encode_bytes(b"ab"), Ok(vec![0, 1]));
        assert!(t.encode_bytes(b"a\xff").is_err());
        assert_eq!(
            (t.token_string(0), t.token_string(2), t.token_string(3)),
            ("a".into(), "\u{FFFD}".into(), "</s>".into())
        );
        assert_eq!((t.text_bytes(3), t.text_bytes(1)), (Vec::new(), b"b".to_vec()));
    }
}
