//! A conversation as the harness drives it: a transcript rendered through the chat template, the audio payloads
//! its frames carry, and the last completed request (what the next probe prompt is edited from).
//!
//! Chat turns render the whole transcript (turn N+1 begins with exactly what turn N fed). Probe turns — repeat,
//! edits of what was fed, prompt + reply — do not enter the transcript: they exist to hit one boundary.

use kvproof_engines::chat::{render, Message, Role};
use kvproof_engines::rng::SplitMix64;
use kvproof_engines::tokenizer::AUDIO;

use crate::oracle::fed_ids;

/// Where a divergence is planted in the fed ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum At {
    First,
    Middle,
    /// The last fed id: the boundary an off-by-one comparison lets through.
    Last,
    /// A given position (clamped to the last fed id): chunk-grid boundaries.
    Index(usize),
}

/// The ids appended after an edited prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tail {
    Ids(Vec<u32>),
    /// Random text until the prompt is `total` ids long (at least one id).
    ToLength(usize),
}

/// How a turn's prompt is made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptSpec {
    /// A user message (after `audio_frames` audio frames with fresh payloads) appended to the transcript.
    User { text: Vec<u32>, audio_frames: usize },
    /// A user message, after replacing every earlier audio payload with a different clip (same ids).
    Reclip { text: Vec<u32> },
    /// The last completed prompt again.
    Repeat,
    /// The last completed prompt followed by its whole reply (the last reply id included).
    PromptReply,
    /// What the last completed request fed, with one id changed, then a tail.
    Diverge { at: At, tail: Tail },
    /// What the last completed request fed, cut to `keep_short_by` fewer ids.
    Shorter { by: usize },
    /// The first `len` ids of what the last completed request fed (at least one, at most all).
    Prefix { len: usize },
    /// What the last completed request fed, then a tail.
    Extend { tail: Tail },
    /// A user message as text, for the engine to render with its own template (`text_conversation`); `system`
    /// opens the conversation when this is its first turn.
    Say { text: String, system: Option<String> },
    /// A tool message as text (an agentic session's tool result), appended to a conversation held as text.
    Tool { text: String },
}

/// A prompt ready to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    pub prompt: Vec<u32>,
    pub audio: Vec<Vec<u8>>,
}

#[derive(Debug, Clone)]
struct Completed {
    prompt: Vec<u32>,
    audio: Vec<Vec<u8>>,
    reply: Vec<u32>,
}

/// What `prepare` changed, so `finish` can keep or undo it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pushed_message: bool,
    pushed_audio: usize,
    replaced_audio: Option<Vec<Vec<u8>>>,
}

#[derive(Debug, Clone)]
pub struct Conversation {
    messages: Vec<Message>,
    /// Payloads of the transcript's audio frames, in order.
    audio: Vec<Vec<u8>>,
    last: Option<Completed>,
    rng: SplitMix64,
    frame_bytes: usize,
}

/// Printable text bytes (letters, digits, spaces, punctuation) as ids.
pub fn random_text(rng: &mut SplitMix64, len: usize) -> Vec<u32> {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz abcdefghij ETAOIN 0123456789 .,?!";
    (0..len).map(|_| ALPHABET[rng.below(ALPHABET.len() as u64) as usize] as u32).collect()
}

impl Conversation {
    /// A conversation opened by a short system message; `frame_bytes` sizes audio payloads.
    pub fn new(seed: u64, frame_bytes: usize) -> Self {
        let system = Message::new(Role::System, b"be brief".iter().map(|&b| b as u32).collect());
        Conversation { messages: vec![system], audio: Vec::new(), last: None, rng: SplitMix64::new(seed), frame_bytes }
    }

    pub fn rng(&mut self) -> &mut SplitMix64 {
        &mut self.rng
    }

    fn clip(&mut self) -> Vec<u8> {
        (0..self.frame_bytes).map(|_| self.rng.next_u64() as u8).collect()
    }

    fn last(&self) -> Result<&Completed, String> {
        self.last.as_ref().ok_or_else(|| "this turn edits the previous one, but no turn has completed".to_string())
    }

    /// Audio payloads for a prompt derived from the last completed one: the frames it keeps, in order.
    fn audio_for(&self, prompt: &[u32]) -> Vec<Vec<u8>> {
        let n = prompt.iter().filter(|&&id| id == AUDIO).count();
        self.last.as_ref().map(|l| l.audio.iter().take(n).cloned().collect()).unwrap_or_default()
    }

    /// A prompt made from the ids the last turn fed (its prompt and reply), edited by `edit`, with the audio the
    /// edited prompt still refers to.
    fn edit_last_fed(&mut self, edit: impl FnOnce(&mut Self, &mut Vec<u32>)) -> Result<Prepared, String> {
        let l = self.last()?;
        let mut prompt = fed_ids(&l.prompt, &l.reply);
        edit(self, &mut prompt);
        let audio = self.audio_for(&prompt);
        Ok(Prepared { prompt, audio })
    }

    fn tail(&mut self, tail: &Tail, prefix_len: usize) -> Vec<u32> {
        match tail {
            Tail::Ids(ids) => ids.clone(),
            Tail::ToLength(total) => {
                let n = total.saturating_sub(prefix_len).max(1);
                random_text(&mut self.rng, n)
            }
        }
    }

    /// Build the prompt of the next turn. Chat turns are added to the transcript until `finish` says otherwise.
    pub fn prepare(&mut self, spec: &PromptSpec) -> Result<(Prepared, Pending), String> {
        let mut pending = Pending { pushed_message: false, pushed_audio: 0, replaced_audio: None };
        let prepared = match spec {
            PromptSpec::User { text, audio_frames } => {
                let mut content = vec![AUDIO; *audio_frames];
                content.extend_from_slice(text);
                for _ in 0..*audio_frames {
                    let clip = self.clip();
                    self.audio.push(clip);
                }
                pending.pushed_audio = *audio_frames;
                self.messages.push(Message::new(Role::User, content));
                pending.pushed_message = true;
                Prepared { prompt: render(&self.messages, true), audio: self.audio.clone() }
            }
            PromptSpec::Reclip { text } => {
                let fresh: Vec<Vec<u8>> = (0..self.audio.len()).map(|_| self.clip()).collect();
                pending.replaced_audio = Some(std::mem::replace(&mut self.audio, fresh));
                self.messages.push(Message::new(Role::User, text.clone()));
                pending.pushed_message = true;
                Prepared { prompt: render(&self.messages, true), audio: self.audio.clone() }
            }
            PromptSpec::Repeat => {
                let l = self.last()?;
                Prepared { prompt: l.prompt.clone(), audio: l.audio.clone() }
            }
            PromptSpec::PromptReply => {
                let l = self.last()?;
                let mut prompt = l.prompt.clone();
                prompt.extend_from_slice(&l.reply);
                Prepared { prompt, audio: l.audio.clone() }
            }
            PromptSpec::Diverge { at, tail } => self.edit_last_fed(|conv, prompt| {
                let i = match at {
                    At::First => 0,
                    At::Middle => prompt.len() / 2,
                    At::Last => prompt.len() - 1,
                    At::Index(i) => (*i).min(prompt.len() - 1),
                };
                // another plain byte: never a special id, so the prompt stays well-formed
                prompt[i] = if prompt[i] == b'x' as u32 { b'y' as u32 } else { b'x' as u32 };
                let t = conv.tail(tail, prompt.len());
                prompt.extend(t);
            })?,
            PromptSpec::Shorter { by } => self.edit_last_fed(|_, prompt| {
                let keep = prompt.len().saturating_sub(*by).max(1);
                prompt.truncate(keep);
            })?,
            PromptSpec::Prefix { len } => self.edit_last_fed(|_, prompt| prompt.truncate((*len).max(1)))?,
            PromptSpec::Say { .. } | PromptSpec::Tool { .. } => {
                return Err("a text turn belongs to a text conversation, not to one built from ids".into())
            }
            PromptSpec::Extend { tail } => self.edit_last_fed(|conv, prompt| {
                let t = conv.tail(tail, prompt.len());
                prompt.extend(t);
            })?,
        };
        Ok((prepared, pending))
    }

    /// Close a turn: with the reply the conversation goes on with, or `None` when the turn failed (its user
    /// message and audio are taken back, so the transcript stays what the warm engine saw complete).
    pub fn finish(&mut self, prepared: &Prepared, pending: Pending, reply: Option<&[u32]>) {
        match reply {
            Some(reply) => {
                if pending.pushed_message {
                    self.messages.push(Message::from_reply(reply));
                }
                self.last = Some(Completed {
                    prompt: prepared.prompt.clone(),
                    audio: prepared.audio.clone(),
                    reply: reply.to_vec(),
                });
            }
            None => {
                if pending.pushed_message {
                    self.messages.pop();
                }
                let keep = self.audio.len() - pending.pushed_audio;
                self.audio.truncate(keep);
                if let Some(old) = pending.replaced_audio {
                    self.audio = old;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> Vec<u32> {
        s.bytes().map(u32::from).collect()
    }

    fn turn(c: &mut Conversation, spec: PromptSpec, reply: &[u32]) -> Prepared {
        let (p, pending) = c.prepare(&spec).expect("prepare");
        c.finish(&p, pending, Some(reply));
        p
    }

    #[test]
    fn chat_turns_extend_what_was_fed() {
        let mut c = Conversation::new(1, 4);
        let p1 = turn(&mut c, PromptSpec::User { text: text("hi"), audio_frames: 0 }, &[104, 105, 257]);
        let (p2, _) = c.prepare(&PromptSpec::User { text: text("more"), audio_frames: 0 }).expect("prepare");
        let fed = fed_ids(&p1.prompt, &[104, 105, 257]);
        assert!(p2.prompt.len() > fed.len() && p2.prompt.starts_with(&fed));
    }

    #[test]
    fn probes_edit_what_was_fed() {
        let mut c = Conversation::new(1, 4);
        let p1 = turn(&mut c, PromptSpec::User { text: text("hello"), audio_frames: 0 }, &[97, 98, 99]);
        let fed = fed_ids(&p1.prompt, &[97, 98, 99]);
        let (last, _) = c.prepare(&PromptSpec::Diverge { at: At::Last, tail: Tail::Ids(vec![1, 2]) }).expect("p");
        assert_eq!(last.prompt.len(), fed.len() + 2);
        assert_eq!(&last.prompt[..fed.len() - 1], &fed[..fed.len() - 1]);
        assert_ne!(last.prompt[fed.len() - 1], fed[fed.len() - 1]);
        let (first, _) = c.prepare(&PromptSpec::Diverge { at: At::First, tail: Tail::Ids(vec![1]) }).expect("p");
        assert_ne!(first.prompt[0], fed[0]);
        assert_eq!(&first.prompt[1..fed.len()], &fed[1..]);
        let (short, _) = c.prepare(&PromptSpec::Shorter { by: 1 }).expect("p");
        assert_eq!(short.prompt, fed[..fed.len() - 1]);
        let (pr, _) = c.prepare(&PromptSpec::PromptReply).expect("p");
        assert_eq!(pr.prompt.len(), fed.len() + 1);
        let (at, _) = c.prepare(&PromptSpec::Diverge { at: At::Index(3), tail: Tail::Ids(vec![]) }).expect("p");
        assert_eq!(&at.prompt[..3], &fed[..3]);
        assert_ne!(at.prompt[3], fed[3]);
        assert_eq!(&at.prompt[4..], &fed[4..]);
        let (cut, _) = c.prepare(&PromptSpec::Prefix { len: 5 }).expect("p");
        assert_eq!(cut.prompt, fed[..5]);
        let (all, _) = c.prepare(&PromptSpec::Prefix { len: 10_000 }).expect("p");
        assert_eq!(all.prompt, fed);
        let (rep, _) = c.prepare(&PromptSpec::Repeat).expect("p");
        assert_eq!(rep.prompt, p1.prompt);
        let (long, _) = c.prepare(&PromptSpec::Extend { tail: Tail::ToLength(100) }).expect("p");
        assert_eq!(long.prompt.len(), 100);
        assert!(long.prompt.starts_with(&fed));
    }

    #[test]
    fn audio_frames_carry_payloads_and_reclip_swaps_them() {
        let mut c = Conversation::new(3, 4);
        let p = turn(&mut c, PromptSpec::User { text: text("listen"), audio_frames: 2 }, &[1, 2]);
        assert_eq!(p.prompt.iter().filter(|&&i| i == AUDIO).count(), 2);
        assert_eq!(p.audio.len(), 2);
        assert!(p.audio.iter().all(|a| a.len() == 4));
        let (q, _) = c.prepare(&PromptSpec::Reclip { text: text("again") }).expect("p");
        assert_eq!(q.audio.len(), 2);
        assert_ne!(q.audio, p.audio, "a different clip under the same ids");
        assert!(q.prompt.starts_with(&fed_ids(&p.prompt, &[1, 2])));
    }

    #[test]
    fn a_failed_turn_is_taken_back() {
        let mut c = Conversation::new(3, 4);
        turn(&mut c, PromptSpec::User { text: text("a"), audio_frames: 0 }, &[1, 2]);
        let (p, pending) = c.prepare(&PromptSpec::User { text: text("b"), audio_frames: 1 }).expect("p");
        c.finish(&p, pending, None);
        let (again, _) = c.prepare(&PromptSpec::User { text: text("b"), audio_frames: 0 }).expect("p");
        assert!(!again.prompt.contains(&AUDIO));
        assert!(again.audio.is_empty());
    }

    #[test]
    fn probes_without_a_completed_turn_are_errors() {
        let mut c = Conversation::new(0, 0);
        assert!(c.prepare(&PromptSpec::Repeat).is_err());
    }
}
