//! The chat template. Prefix-stable by construction: rendering turn N+1 begins with exactly the ids turn N fed,
//! reply included, because every message renders to `role, content..., eos` and a reply's own ids end in `eos`
//! (or, when length-limited, are followed by it).

use crate::tokenizer::{BOS, EOS, ROLE_ASSISTANT, ROLE_SYSTEM, ROLE_TOOL, ROLE_USER};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

impl Role {
    pub fn marker(self) -> u32 {
        match self {
            Role::System => ROLE_SYSTEM,
            Role::User => ROLE_USER,
            Role::Assistant => ROLE_ASSISTANT,
            Role::Tool => ROLE_TOOL,
        }
    }
}

/// One message of a transcript, as token ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub role: Role,
    pub content: Vec<u32>,
}

impl Message {
    pub fn new(role: Role, content: Vec<u32>) -> Self {
        Message { role, content }
    }

    /// The assistant message for a generated reply: its ids without the trailing eos, if any.
    pub fn from_reply(reply: &[u32]) -> Self {
        let content = match reply.last() {
            Some(&EOS) => reply[..reply.len() - 1].to_vec(),
            _ => reply.to_vec(),
        };
        Message { role: Role::Assistant, content }
    }
}

impl std::str::FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "system" => Ok(Role::System),
            "user" => Ok(Role::User),
            "assistant" => Ok(Role::Assistant),
            "tool" => Ok(Role::Tool),
            other => Err(format!("unknown role `{other}` (system, user, assistant, tool)")),
        }
    }
}

/// One message of a conversation as text (what a chat client sends).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TextMessage {
    pub role: String,
    pub content: String,
}

/// Render a conversation given as text with this template: each message's content byte by byte (a `<|name|>`
/// in the text is text, not a special id), then the assistant marker the reply follows.
pub fn render_text(messages: &[TextMessage]) -> Result<Vec<u32>, String> {
    let messages = messages
        .iter()
        .map(|m| Ok(Message::new(m.role.parse()?, m.content.bytes().map(u32::from).collect())))
        .collect::<Result<Vec<_>, String>>()?;
    Ok(render(&messages, true))
}

/// Render a transcript; with `generation_prompt`, end with the assistant marker the reply follows.
pub fn render(messages: &[Message], generation_prompt: bool) -> Vec<u32> {
    let mut ids = vec![BOS];
    for m in messages {
        ids.push(m.role.marker());
        ids.extend_from_slice(&m.content);
        ids.push(EOS);
    }
    if generation_prompt {
        ids.push(ROLE_ASSISTANT);
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::VOCAB;
    use proptest::prelude::*;

    fn reply_strategy() -> impl Strategy<Value = Vec<u32>> {
        // a generated reply: any ids, possibly ending in eos (then nothing after it)
        (proptest::collection::vec(0u32..VOCAB as u32, 1..12), any::<bool>()).prop_map(|(mut r, eos)| {
            r.retain(|&t| t != EOS);
            if eos || r.is_empty() {
                r.push(EOS);
            }
            r
        })
    }

    proptest! {
        #[test]
        fn next_turn_begins_with_what_this_turn_fed(
            turns in proptest::collection::vec(
                (proptest::collection::vec(0u32..256, 0..10), reply_strategy()), 1..5),
        ) {
            let mut transcript = vec![Message::new(Role::System, b"be brief".iter().map(|&b| b as u32).collect())];
            for (user, reply) in &turns {
                transcript.push(Message::new(Role::User, user.clone()));
                let prompt = render(&transcript, true);
                // what this turn fed: the prompt and every reply id but the last
                let mut fed = prompt.clone();
                fed.extend_from_slice(&reply[..reply.len() - 1]);
                transcript.push(Message::from_reply(reply));
                transcript.push(Message::new(Role::User, vec![b'?' as u32]));
                let next = render(&transcript, true);
                transcript.pop();
                prop_assert!(next.len() > fed.len());
                prop_assert_eq!(&next[..fed.len()], &fed[..]);
                // and the whole reply, last id included
                prop_assert_eq!(&next[prompt.len()..prompt.len() + reply.len()], &reply[..]);
            }
        }
    }
}
