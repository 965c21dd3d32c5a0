//! A model's own chat template (`tokenizer.chat_template`, Jinja) rendered with minijinja, the way chat servers
//! render it: `trim_blocks` and `lstrip_blocks` on, the template's last newline dropped, and the names templates
//! use: `messages` (each a map with `role` and `content`), `add_generation_prompt`, `bos_token`, `eos_token`,
//! `raise_exception(message)`, plus the Python string methods templates call most (`strip`, `lstrip`, `rstrip`,
//! `startswith`, `endswith`, `split`, `upper`, `lower`, `title`, `replace`) and `items`/`get` on maps.

use std::collections::BTreeMap;

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{from_args, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind, State};

use crate::chat::TextMessage;

#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("chat template does not parse: {0}")]
    Parse(String),
    #[error("chat template failed to render: {0}")]
    Render(String),
}

/// A parsed chat template with its special tokens' texts.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

const NAME: &str = "chat_template";

impl ChatTemplate {
    /// Parse a template; `bos_token` and `eos_token` are the texts of the model's bos and eos tokens.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, TemplateError> {
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| TemplateError::Parse(e.to_string()))?;
        env.set_syntax(syntax);
        env.add_function("raise_exception", |message: String| -> Result<Value, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, message))
        });
        env.set_unknown_method_callback(python_method);
        env.add_template_owned(NAME, source.to_string()).map_err(|e| TemplateError::Parse(detail(&e)))?;
        Ok(ChatTemplate { env, bos_token: bos_token.into(), eos_token: eos_token.into() })
    }

    /// Render a conversation; with `add_generation_prompt`, end with what the assistant's reply follows.
    pub fn render(&self, messages: &[TextMessage], add_generation_prompt: bool) -> Result<String, TemplateError> {
        let messages: Vec<Value> = messages
            .iter()
            .map(|m| {
                Value::from(BTreeMap::from([
                    ("role".to_string(), Value::from(m.role.as_str())),
                    ("content".to_string(), Value::from(m.content.as_str())),
                ]))
            })
            .collect();
        let ctx = Value::from(BTreeMap::from([
            ("messages".to_string(), Value::from(messages)),
            ("add_generation_prompt".to_string(), Value::from(add_generation_prompt)),
            ("bos_token".to_string(), Value::from(self.bos_token.as_str())),
            ("eos_token".to_string(), Value::from(self.eos_token.as_str())),
        ]));
        let template = self.env.get_template(NAME).map_err(|e| TemplateError::Render(detail(&e)))?;
        template.render(ctx).map_err(|e| TemplateError::Render(detail(&e)))
    }
}

fn detail(e: &Error) -> String {
    match e.line() {
        Some(line) => format!("{e} (template line {line})"),
        None => e.to_string(),
    }
}

/// Python's string and dict methods that chat templates call.
fn python_method(_: &mut State, value: &Value, method: &str, args: &[Value]) -> Result<Value, Error> {
    if let Some(s) = value.as_str() {
        let chars = |args: &[Value]| -> Result<Option<String>, Error> {
            let (c,): (Option<String>,) = from_args(args)?;
            Ok(c)
        };
        let trim_set = |c: &Option<String>, ch: char| c.as_ref().map_or(ch.is_whitespace(), |set| set.contains(ch));
        return match method {
            "strip" => {
                let c = chars(args)?;
                Ok(Value::from(s.trim_matches(|ch| trim_set(&c, ch))))
            }
            "lstrip" => {
                let c = chars(args)?;
                Ok(Value::from(s.trim_start_matches(|ch| trim_set(&c, ch))))
            }
            "rstrip" => {
                let c = chars(args)?;
                Ok(Value::from(s.trim_end_matches(|ch| trim_set(&c, ch))))
            }
            "startswith" => {
                let (p,): (String,) = from_args(args)?;
                Ok(Value::from(s.starts_with(p.as_str())))
            }
            "endswith" => {
                let (p,): (String,) = from_args(args)?;
                Ok(Value::from(s.ends_with(p.as_str())))
            }
            "upper" => Ok(Value::from(s.to_uppercase())),
            "lower" => Ok(Value::from(s.to_lowercase())),
            "title" => {
                let mut out = String::with_capacity(s.len());
                let mut prev_letter = false;
                for ch in s.chars() {
                    if prev_letter {
                        out.extend(ch.to_lowercase());
                    } else {
                        out.extend(ch.to_uppercase());
                    }
                    prev_letter = ch.is_alphabetic();
                }
                Ok(Value::from(out))
            }
            "replace" => {
                let (from, to): (String, String) = from_args(args)?;
                Ok(Value::from(s.replace(from.as_str(), to.as_str())))
            }
            "split" => {
                let (sep,): (Option<String>,) = from_args(args)?;
                let parts: Vec<Value> = match sep {
                    Some(sep) if !sep.is_empty() => s.split(sep.as_str()).map(Value::from).collect(),
                    _ => s.split_whitespace().map(Value::from).collect(),
                };
                Ok(Value::from(parts))
            }
            _ => Err(Error::from(ErrorKind::UnknownMethod)),
        };
    }
    if value.kind() == ValueKind::Map {
        return match method {
            "items" => {
                let _: () = from_args(args)?;
                let mut pairs = Vec::new();
                for key in value.try_iter()? {
                    let v = value.get_item(&key)?;
                    pairs.push(Value::from(vec![key, v]));
                }
                Ok(Value::from(pairs))
            }
            "get" => {
                let (key, default): (Value, Option<Value>) = from_args(args)?;
                let v = value.get_item(&key)?;
                Ok(if v.is_undefined() { default.unwrap_or(Value::from(())) } else { v })
            }
            _ => Err(Error::from(ErrorKind::UnknownMethod)),
        };
    }
    Err(Error::from(ErrorKind::UnknownMethod))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(role: &str, content: &str) -> TextMessage {
        TextMessage { role: role.into(), content: content.into() }
    }

    #[test]
    fn renders_the_names_templates_use() {
        let t = ChatTemplate::new(
            "{{ bos_token }}{% for m in messages %}\n  [{{ m['role'] | upper }}] {{ m.content.strip() }}{{ eos_token }}\n{% endfor %}{% if add_generation_prompt %}[A]{% endif %}\n",
            "<s>",
            "</s>",
        )
        .expect("parses");
        let out = t.render(&[msg("user", "  hi  "), msg("assistant", "yo")], true).expect("renders");
        // trim_blocks drops the newline after a block tag; the template's last newline is dropped
        assert_eq!(out, "<s>  [USER] hi</s>\n  [ASSISTANT] yo</s>\n[A]");
    }

    #[test]
    fn raise_exception_is_an_error_and_bad_syntax_is_reported() {
        let t = ChatTemplate::new("{% if messages|length == 0 %}{{ raise_exception('empty!') }}{% endif %}", "", "")
            .expect("parses");
        let err = t.render(&[], false).expect_err("raises");
        assert!(err.to_string().contains("empty!"), "{err}");
        assert!(matches!(ChatTemplate::new("{% for %}", "", ""), Err(TemplateError::Parse(_))));
    }

    #[test]
    fn python_methods() {
        let t = ChatTemplate::new(
            "{{ 'a,b'.split(',') | join('|') }} {{ 'xxhixx'.strip('x') }} {{ 'hello'.startswith('he') }} \
             {{ {'k': 1}.get('k') }}{{ {'k': 1}.get('z', 2) }} {{ 'ab cd'.title() }}",
            "",
            "",
        )
        .expect("parses");
        assert_eq!(t.render(&[], false).expect("renders"), "a|b hi True 12 Ab Cd");
    }
}
