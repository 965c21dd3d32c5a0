//! A conversation held as text, as a chat client holds it: each turn sends the whole transcript as messages and
//! the engine renders them with its own template and tokenizer; the reply goes back in as text. Whether the
//! re-rendered transcript still begins with the ids the engine fed last turn is the engine's template's business —
//! `observe` tells when it does not, a real cause of lost reuse.

use kvproof_engines::chat::TextMessage;

use crate::oracle::{common_prefix, fed_ids};

/// A completed turn as the transcript takes it: the reply's text, and (when the engine reported them) the prompt
/// ids it fed and the reply's ids.
#[derive(Debug, Clone, Copy)]
pub struct Reply<'a> {
    pub text: &'a str,
    pub ids: Option<(&'a [u32], &'a [u32])>,
}

#[derive(Debug, Clone, Default)]
pub struct TextConversation {
    messages: Vec<TextMessage>,
    /// The ids the engine fed on the last completed turn (its prompt and every reply id but the last), when it
    /// reported the prompt's ids.
    last_fed: Option<Vec<u32>>,
    last_turn: Option<String>,
}

impl TextConversation {
    pub fn new(system: Option<&str>) -> Self {
        let messages =
            system.map(|s| vec![TextMessage { role: "system".into(), content: s.to_string() }]).unwrap_or_default();
        TextConversation { messages, last_fed: None, last_turn: None }
    }

    /// The transcript with the user's next message.
    pub fn prepare(&mut self, text: &str) -> Vec<TextMessage> {
        self.prepare_as("user", text)
    }

    /// The transcript with the next message, from `role` (`user`, or `tool` for a tool's result).
    pub fn prepare_as(&mut self, role: &str, text: &str) -> Vec<TextMessage> {
        self.messages.push(TextMessage { role: role.into(), content: text.to_string() });
        self.messages.clone()
    }

    /// Close the turn `label`: the reply's text goes into the transcript, with the ids the engine fed when it
    /// reported them; `None` (the turn failed) takes the user message back.
    pub fn finish(&mut self, label: &str, reply: Option<Reply<'_>>) {
        match reply {
            Some(r) => {
                self.messages.push(TextMessage { role: "assistant".into(), content: r.text.to_string() });
                self.last_fed = r.ids.map(|(prompt, reply)| fed_ids(prompt, reply));
                self.last_turn = Some(label.to_string());
            }
            None => {
                self.messages.pop();
            }
        }
    }

    /// The client bounds the transcript to its last `keep` model turns ([`keep_turns`]). The ids fed stay what
    /// they were, so the next turn shows what the dropped turns cost.
    pub fn keep_turns(&mut self, keep: usize) {
        keep_turns(&mut self.messages, keep);
    }

    /// Whether this turn's rendered prompt begins with everything the last turn fed; when it does not, why.
    pub fn observe(&self, prompt_ids: &[u32]) -> Option<String> {
        let fed = self.last_fed.as_ref()?;
        if prompt_ids.starts_with(fed) {
            return None;
        }
        let at = common_prefix(fed, prompt_ids);
        Some(format!(
            "the re-rendered transcript parts from what {} fed at position {at} of {} (fed id {}, now {}): the \
             template or the reply's re-tokenization is not prefix-stable, so reuse stops there",
            self.last_turn.as_deref().unwrap_or("the last turn"),
            fed.len(),
            fed.get(at).map_or_else(|| "-".to_string(), u32::to_string),
            prompt_ids.get(at).map_or_else(|| "(end)".to_string(), u32::to_string)
        ))
    }
}

/// Drops the oldest model turns (a reply and the message answering it) after the first user message until at
/// most `keep` remain, the last reply (still unanswered) counting as one and never dropped.
pub fn keep_turns(messages: &mut Vec<TextMessage>, keep: usize) {
    let Some(request) = messages.iter().position(|m| m.role == "user") else { return };
    let tail = messages.len() - (request + 1);
    // the tail is reply, answer, ..., reply: ceil(tail / 2) turns
    let excess = tail.div_ceil(2).saturating_sub(keep.max(1));
    messages.drain(request + 1..request + 1 + 2 * excess);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turns_grow_the_transcript_and_a_failed_turn_is_taken_back() {
        let mut c = TextConversation::new(Some("be brief"));
        let m = c.prepare("hello");
        assert_eq!(m.len(), 2);
        c.finish("turn 1", Some(Reply { text: "hi there", ids: Some((&[1, 2, 3], &[4, 5, 6])) }));
        let m = c.prepare("and then?");
        assert_eq!(m.iter().map(|m| m.role.as_str()).collect::<Vec<_>>(), ["system", "user", "assistant", "user"]);
        c.finish("turn 2", None);
        assert_eq!(c.prepare("again").len(), 4, "the failed user message was taken back");
    }

    #[test]
    fn a_prompt_that_does_not_extend_what_was_fed_is_explained() {
        let mut c = TextConversation::new(None);
        c.prepare("q");
        c.finish("turn 1", Some(Reply { text: "a", ids: Some((&[1, 2, 3], &[4, 5, 6])) }));
        assert_eq!(c.observe(&[1, 2, 3, 4, 5, 9, 9]), None, "prompt + reply - last, then more");
        let why = c.observe(&[1, 2, 3, 7, 5]).expect("unstable");
        assert!(why.contains("turn 1 fed at position 3 of 5 (fed id 4, now 7)"), "{why}");
    }

    #[test]
    fn keeping_turns_drops_the_oldest_reply_and_answer_and_keeps_the_request() {
        let mut c = TextConversation::new(Some("sys"));
        c.prepare("task");
        let contents = |c: &TextConversation| c.messages.iter().map(|m| m.content.clone()).collect::<Vec<_>>();
        for turn in 1..=3 {
            c.finish(&format!("turn {turn}"), Some(Reply { text: &format!("a{turn}"), ids: None }));
            c.keep_turns(2);
            c.prepare_as("tool", &format!("t{turn}"));
        }
        assert_eq!(contents(&c), ["sys", "task", "a2", "t2", "a3", "t3"]);
        c.finish("turn 4", Some(Reply { text: "a4", ids: None }));
        c.keep_turns(1);
        assert_eq!(contents(&c), ["sys", "task", "a4"], "the unanswered reply is kept");
        c.keep_turns(0);
        assert_eq!(contents(&c), ["sys", "task", "a4"], "the reply the next message answers is never dropped");
    }
}
