//! How an engine turns text and chat messages into ids, and ids into text: one trait for the bundled engines'
//! byte tokenizer (with their own prefix-stable template, `chat::render_text`) and for a GGUF model's BPE
//! tokenizer with the model's own chat template.

use std::path::Path;

use crate::bpe::{Bpe, BpeVocab};
use crate::chat::TextMessage;
use crate::chat_template::ChatTemplate;
use crate::error::{EngineError, Result};
use crate::gguf::Gguf;
use crate::tokenizer::Tokenizer;

/// An engine's text side.
pub trait TextTokenizer: Send + Sync + std::fmt::Debug {
    /// How many ids there are.
    fn vocab(&self) -> usize;
    /// Text to ids as a prompt is tokenized (the model's own leading tokens included); with `parse_special`,
    /// special tokens spelled in the text (`<|im_start|>`) are those tokens, else they are text.
    fn encode(&self, text: &str, parse_special: bool) -> Vec<u32>;
    /// The bytes one id stands for (a special token's text for a special token; nothing for an unknown id).
    fn token_bytes(&self, id: u32) -> Vec<u8>;
    /// A conversation sent as text, rendered with the engine's chat template and tokenized, ending where the
    /// assistant's reply begins.
    fn render_chat(&self, messages: &[TextMessage]) -> std::result::Result<Vec<u32>, String>;
    /// The id that ends a turn (and generation).
    fn eos(&self) -> Option<u32>;
    /// Whether this is the bundled byte tokenizer: ids 0..=0xff are single bytes and any byte string is text.
    fn byte_level(&self) -> bool {
        false
    }
}

impl TextTokenizer for Tokenizer {
    fn vocab(&self) -> usize {
        Tokenizer::vocab(self)
    }

    fn encode(&self, text: &str, parse_special: bool) -> Vec<u32> {
        if parse_special {
            Tokenizer::encode(self, text.as_bytes())
        } else {
            text.bytes().map(u32::from).collect()
        }
    }

    fn token_bytes(&self, id: u32) -> Vec<u8> {
        Tokenizer::token_bytes(self, id)
    }

    fn render_chat(&self, messages: &[TextMessage]) -> std::result::Result<Vec<u32>, String> {
        crate::chat::render_text(messages)
    }

    fn eos(&self) -> Option<u32> {
        Some(crate::tokenizer::EOS)
    }

    fn byte_level(&self) -> bool {
        true
    }
}

/// A GGUF model's tokenizer (`tokenizer.ggml.*`) and chat template (`tokenizer.chat_template`).
#[derive(Debug)]
pub struct GgufTokenizer {
    pub bpe: Bpe,
    pub template: Option<ChatTemplate>,
}

impl GgufTokenizer {
    /// Build from a GGUF's metadata: byte-level BPE (`tokenizer.ggml.model = gpt2`) only.
    pub fn from_gguf(g: &Gguf) -> Result<Self> {
        let err = |message: String| EngineError::Config { path: g.path().to_path_buf(), message };
        let model = g.str("tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(err(format!("tokenizer.ggml.model `{model}` is not supported (supported: gpt2)")));
        }
        let opt_id = |key: &str| -> Result<Option<u32>> {
            match g.get(key) {
                None => Ok(None),
                Some(_) => {
                    let id = g.uint(key)?;
                    u32::try_from(id).map(Some).map_err(|_| err(format!("{key} {id} is too large")))
                }
            }
        };
        let opt_bool = |key: &str, default: bool| -> Result<bool> {
            if g.get(key).is_some() {
                g.bool(key)
            } else {
                Ok(default)
            }
        };
        let token_types = match g.get("tokenizer.ggml.token_type") {
            None => Vec::new(),
            Some(_) => g
                .ints("tokenizer.ggml.token_type")?
                .into_iter()
                .map(|t| i32::try_from(t).unwrap_or(crate::bpe::token_type::NORMAL))
                .collect(),
        };
        let vocab = BpeVocab {
            tokens: g.strings("tokenizer.ggml.tokens")?.into_iter().map(String::from).collect(),
            token_types,
            merges: g.strings("tokenizer.ggml.merges")?.into_iter().map(String::from).collect(),
            pre: if g.get("tokenizer.ggml.pre").is_some() {
                g.str("tokenizer.ggml.pre")?.to_string()
            } else {
                "default".into()
            },
            bos: opt_id("tokenizer.ggml.bos_token_id")?,
            eos: opt_id("tokenizer.ggml.eos_token_id")?,
            add_bos: opt_bool("tokenizer.ggml.add_bos_token", false)?,
            add_eos: opt_bool("tokenizer.ggml.add_eos_token", false)?,
        };
        let bpe = Bpe::new(&vocab).map_err(|e| err(e.to_string()))?;
        let text = |id: Option<u32>| {
            id.map(|id| String::from_utf8_lossy(bpe.token_bytes(id)).into_owned()).unwrap_or_default()
        };
        let template = match g.chat_template() {
            Some(source) => {
                Some(ChatTemplate::new(source, &text(vocab.bos), &text(vocab.eos)).map_err(|e| err(e.to_string()))?)
            }
            None => None,
        };
        Ok(GgufTokenizer { bpe, template })
    }

    /// Open a GGUF file and build its tokenizer.
    pub fn open(path: &Path) -> Result<Self> {
        Self::from_gguf(&Gguf::open(path)?)
    }

    /// The chat template's text for a conversation (ending where the reply begins).
    pub fn render_text(&self, messages: &[TextMessage]) -> std::result::Result<String, String> {
        let template = self.template.as_ref().ok_or("the model has no chat template (tokenizer.chat_template)")?;
        template.render(messages, true).map_err(|e| e.to_string())
    }
}

impl TextTokenizer for GgufTokenizer {
    fn vocab(&self) -> usize {
        self.bpe.vocab()
    }

    /// As llama-server tokenizes a prompt: `add_special` on (the model's bos, if it asks for one).
    fn encode(&self, text: &str, parse_special: bool) -> Vec<u32> {
        self.bpe.encode(text.as_bytes(), true, parse_special)
    }

    fn token_bytes(&self, id: u32) -> Vec<u8> {
        self.bpe.token_bytes(id).to_vec()
    }

    /// Rendered, then tokenized with special tokens parsed (the template's markup is special tokens).
    fn render_chat(&self, messages: &[TextMessage]) -> std::result::Result<Vec<u32>, String> {
        let text = self.render_text(messages)?;
        Ok(self.bpe.encode(text.as_bytes(), true, true))
    }

    fn eos(&self) -> Option<u32> {
        self.bpe.eos()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bundled_tokenizer_keeps_its_template() {
        let t: &dyn TextTokenizer = &Tokenizer;
        let messages = [TextMessage { role: "user".into(), content: "hi <|user|>".into() }];
        assert_eq!(t.render_chat(&messages), crate::chat::render_text(&messages));
        assert_eq!(t.encode("<|user|>", true), vec![crate::tokenizer::ROLE_USER]);
        assert_eq!(t.encode("<|user|>", false).len(), 8);
        assert_eq!(t.token_bytes(b'a' as u32), b"a");
    }
}
