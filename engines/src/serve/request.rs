//! SUBMIT frame <-> engine `Request`: the payload as ids, text or a conversation, the ext block as audio frames,
//! and the checks that need the engine's limits (slots, vocabulary, audio).

use crate::chat::TextMessage;
use crate::engine::{EngineInfo, Request, Sampling};
use crate::serve::frame::{parse_count, quote, ErrorCode, Rejection, SubmitFrame};
use crate::serve::text::ServeText;
use crate::tokenizer::AUDIO;

/// Turn a parsed SUBMIT into a request the engine can run; text and conversations are tokenized with `text`,
/// the engine's own tokenizer and template.
pub fn build(frame: SubmitFrame, info: &EngineInfo, text: &ServeText) -> Result<Request, Rejection> {
    let id = frame.id;
    if frame.slot >= info.slots {
        return Err(Rejection::bad_request(format!(
            "SUBMIT {id}: slot {} out of range (engine has {} slots)",
            frame.slot, info.slots
        )));
    }
    if frame.logprobs > info.vocab {
        return Err(Rejection::bad_request(format!(
            "SUBMIT {id}: logprobs={} exceeds the vocabulary ({})",
            frame.logprobs, info.vocab
        )));
    }
    let prompt = if frame.ids {
        parse_ids(id, &frame.payload, info.vocab)?
    } else if frame.chat {
        parse_chat(id, &frame.payload, text)?
    } else {
        text.encode_bytes(&frame.payload).map_err(|e| Rejection::bad_request(format!("SUBMIT {id}: {e}")))?
    };
    if prompt.is_empty() {
        return Err(Rejection::new(ErrorCode::EmptyPrompt, format!("SUBMIT {id}: the prompt has no tokens")));
    }
    if let Some(bad) = prompt.iter().find(|&&t| t as usize >= info.vocab) {
        return Err(Rejection::bad_request(format!("SUBMIT {id}: id {bad} outside the vocabulary ({})", info.vocab)));
    }
    let audio = split_audio(id, &prompt, frame.ext, info)?;
    Ok(Request {
        id,
        slot: frame.slot,
        prompt,
        audio,
        max_tokens: frame.max_tokens,
        sampling: Sampling { temperature: frame.temperature, top_p: frame.top_p, top_k: frame.top_k, seed: frame.seed },
        logprobs: frame.logprobs,
        ignore_eos: frame.ignore_eos,
    })
}

/// The SUBMIT frame a client sends for `req` (payload as ids, `ids=1`).
pub fn to_frame(req: &Request) -> Result<SubmitFrame, String> {
    if let Some(first) = req.audio.first() {
        if req.audio.iter().any(|a| a.len() != first.len()) {
            return Err(format!(
                "request {}: audio frames of unequal length cannot be framed (the ext block is split evenly)",
                req.id
            ));
        }
        if first.is_empty() {
            return Err(format!("request {}: empty audio frames cannot be framed", req.id));
        }
    }
    let ids: Vec<String> = req.prompt.iter().map(|t| t.to_string()).collect();
    Ok(SubmitFrame {
        id: req.id,
        slot: req.slot,
        max_tokens: req.max_tokens,
        temperature: req.sampling.temperature,
        top_p: req.sampling.top_p,
        ids: true,
        logprobs: req.logprobs,
        top_k: req.sampling.top_k,
        seed: req.sampling.seed,
        ignore_eos: req.ignore_eos,
        payload: ids.join(" ").into_bytes(),
        ext: req.audio.concat(),
        ..SubmitFrame::default()
    })
}

/// The SUBMIT frame a client sends for a conversation given as text (`chat=1`): greedy, no audio.
pub fn chat_frame(id: u64, slot: usize, messages: &[TextMessage], max_tokens: usize, ignore_eos: bool) -> SubmitFrame {
    // Serializing strings and a derived struct cannot fail.
    let payload = serde_json::to_vec(messages).unwrap_or_default();
    SubmitFrame { id, slot, max_tokens, top_p: 1.0, ignore_eos, chat: true, payload, ..SubmitFrame::default() }
}

/// A `chat=1` payload: a JSON array of `{"role", "content"}` messages, rendered with the engine's chat template
/// and tokenized, ending where the assistant's reply begins.
fn parse_chat(id: u64, payload: &[u8], text: &ServeText) -> Result<Vec<u32>, Rejection> {
    let messages: Vec<TextMessage> = serde_json::from_slice(payload).map_err(|e| {
        Rejection::bad_request(format!("SUBMIT {id}: chat payload is not a JSON array of {{role, content}}: {e}"))
    })?;
    if messages.is_empty() {
        return Err(Rejection::new(ErrorCode::EmptyPrompt, format!("SUBMIT {id}: the conversation has no messages")));
    }
    text.render_chat(&messages).map_err(|e| Rejection::bad_request(format!("SUBMIT {id}: {e}")))
}

/// Space-separated decimal ids (any ASCII whitespace separates).
fn parse_ids(id: u64, payload: &[u8], vocab: usize) -> Result<Vec<u32>, Rejection> {
    payload
        .split(|b| b.is_ascii_whitespace())
        .filter(|t| !t.is_empty())
        .map(|t| {
            let tid = std::str::from_utf8(t).ok().and_then(parse_count::<u32>);
            match tid {
                Some(tid) if (tid as usize) < vocab => Ok(tid),
                Some(tid) => {
                    Err(Rejection::bad_request(format!("SUBMIT {id}: id {tid} outside the vocabulary ({vocab})")))
                }
                None => Err(Rejection::bad_request(format!("SUBMIT {id}: {} is not a token id", quote(t)))),
            }
        })
        .collect()
}

/// The ext block is the audio frames back to back, one per AUDIO id in the prompt, all the same length (the
/// engine's `audio_frame` bytes when it declares one).
fn split_audio(id: u64, prompt: &[u32], ext: Vec<u8>, info: &EngineInfo) -> Result<Vec<Vec<u8>>, Rejection> {
    let engine_audio = info.audio;
    let frames = prompt.iter().filter(|&&t| t == AUDIO).count();
    if ext.is_empty() {
        if engine_audio && frames > 0 {
            return Err(Rejection::bad_request(format!(
                "SUBMIT {id}: the prompt has {frames} audio ids but no ext bytes carry their frames"
            )));
        }
        return Ok(Vec::new());
    }
    if !engine_audio {
        return Err(Rejection::bad_request(format!("SUBMIT {id}: this engine takes no audio (ext_bytes must be 0)")));
    }
    if frames == 0 {
        return Err(Rejection::bad_request(format!(
            "SUBMIT {id}: {} ext bytes but the prompt has no audio id to carry them",
            ext.len()
        )));
    }
    if !ext.len().is_multiple_of(frames) {
        return Err(Rejection::bad_request(format!(
            "SUBMIT {id}: {} ext bytes do not split into {frames} equal audio frames",
            ext.len()
        )));
    }
    let frame_bytes = ext.len() / frames;
    if info.audio_frame_bytes > 0 && frame_bytes != info.audio_frame_bytes {
        return Err(Rejection::bad_request(format!(
            "SUBMIT {id}: {} ext bytes for {frames} audio ids: frames of {frame_bytes} bytes, the engine takes {}",
            ext.len(),
            info.audio_frame_bytes
        )));
    }
    Ok(ext.chunks(frame_bytes).map(<[u8]>::to_vec).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::render_text;
    use crate::tokenizer::{BOS, ROLE_USER, VOCAB};

    fn build(frame: SubmitFrame, info: &EngineInfo) -> Result<Request, Rejection> {
        super::build(frame, info, &ServeText::bytes())
    }

    fn info(audio: bool) -> EngineInfo {
        EngineInfo::test_fixture(audio)
    }

    fn frame(payload: &[u8], ids: bool) -> SubmitFrame {
        SubmitFrame { id: 1, max_tokens: 4, top_p: 1.0, ids, payload: payload.to_vec(), ..SubmitFrame::default() }
    }

    fn code(r: Result<Request, Rejection>) -> ErrorCode {
        match r {
            Err(rej) => rej.code,
            Ok(req) => panic!("accepted {req:?}"),
        }
    }

    #[test]
    fn text_and_ids_give_the_same_prompt() {
        let text = build(frame(b"<|bos|><|user|>hi", false), &info(false)).expect("text");
        let ids = build(frame(b"256 259\t104\n105", true), &info(false)).expect("ids");
        assert_eq!(text.prompt, vec![BOS, ROLE_USER, 104, 105]);
        assert_eq!(ids.prompt, text.prompt);
    }

    #[test]
    fn a_conversation_is_rendered_with_the_template() {
        let messages = vec![
            TextMessage { role: "system".into(), content: "be brief".into() },
            TextMessage { role: "user".into(), content: "hi <|eos|>".into() },
        ];
        let f = chat_frame(3, 0, &messages, 4, false);
        let req = build(f, &info(false)).expect("chat");
        assert_eq!(req.prompt, render_text(&messages).expect("render"));
        let mut f = frame(br#"[{"role":"user","content":"x"}]"#, false);
        f.chat = true;
        assert_eq!(build(f, &info(false)).expect("one message").prompt.len(), 5);
        for (payload, want) in [
            (&b"[]"[..], ErrorCode::EmptyPrompt),
            (b"not json", ErrorCode::BadRequest),
            (br#"[{"role":"robot","content":"x"}]"#, ErrorCode::BadRequest),
            (br#"[{"role":"user"}]"#, ErrorCode::BadRequest),
            (br#"{"role":"user","content":"x"}"#, ErrorCode::BadRequest),
        ] {
            let mut f = frame(payload, false);
            f.chat = true;
            assert_eq!(code(build(f, &info(false))), want, "{}", String::from_utf8_lossy(payload));
        }
    }

    #[test]
    fn rejects_bad_values() {
        assert_eq!(code(build(frame(b"", false), &info(false))), ErrorCode::EmptyPrompt);
        assert_eq!(code(build(frame(b"  \n", true), &info(false))), ErrorCode::EmptyPrompt);
        assert_eq!(code(build(frame(b"1 99999", true), &info(false))), ErrorCode::BadRequest);
        assert_eq!(code(build(frame(b"1 x", true), &info(false))), ErrorCode::BadRequest);
        assert_eq!(code(build(frame(b"1 -2", true), &info(false))), ErrorCode::BadRequest);
        let mut f = frame(b"hi", false);
        f.slot = 2;
        assert_eq!(code(build(f, &info(false))), ErrorCode::BadRequest);
        let mut f = frame(b"hi", false);
        f.logprobs = VOCAB + 1;
        assert_eq!(code(build(f, &info(false))), ErrorCode::BadRequest);
    }

    #[test]
    fn audio_frames_split_evenly() {
        let mut f = frame(b"<|audio|>x<|audio|>", false);
        f.ext = vec![1, 2, 3, 4, 5, 6];
        let req = build(f.clone(), &info(true)).expect("audio");
        assert_eq!(req.audio, vec![vec![1, 2, 3], vec![4, 5, 6]]);
        assert_eq!(code(build(f.clone(), &info(false))), ErrorCode::BadRequest, "engine without audio");
        f.ext.pop();
        assert_eq!(code(build(f, &info(true))), ErrorCode::BadRequest, "uneven split");
        let mut f = frame(b"no audio ids", false);
        f.ext = vec![1];
        assert_eq!(code(build(f, &info(true))), ErrorCode::BadRequest, "ext without audio ids");
        assert_eq!(code(build(frame(b"<|audio|>", false), &info(true))), ErrorCode::BadRequest, "audio id, no ext");
        // an engine without audio treats the id as an ordinary token
        assert!(build(frame(b"<|audio|>", false), &info(false)).is_ok());
        // a declared frame size is enforced
        let mut f = frame(b"<|audio|>", false);
        f.ext = vec![1, 2, 3];
        let fixed = EngineInfo { audio_frame_bytes: 4, ..info(true) };
        assert_eq!(code(build(f.clone(), &fixed)), ErrorCode::BadRequest);
        f.ext.push(4);
        assert_eq!(build(f, &fixed).expect("one frame").audio, vec![vec![1, 2, 3, 4]]);
    }

    #[test]
    fn to_frame_round_trips() {
        let req = Request {
            id: 9,
            slot: 1,
            prompt: vec![BOS, AUDIO, 7, AUDIO],
            audio: vec![vec![1, 2], vec![3, 4]],
            max_tokens: 5,
            sampling: Sampling { temperature: 0.5, top_p: 0.25, top_k: 3, seed: 42 },
            logprobs: 2,
            ignore_eos: true,
        };
        let back = build(to_frame(&req).expect("framable"), &info(true)).expect("valid");
        assert_eq!(
            (back.id, back.slot, back.prompt.clone(), back.audio.clone()),
            (9, 1, req.prompt.clone(), req.audio)
        );
        assert_eq!((back.max_tokens, back.sampling, back.logprobs, back.ignore_eos), (5, req.sampling, 2, true));
        let uneven = Request { audio: vec![vec![1], vec![2, 3]], ..back };
        assert!(to_frame(&uneven).is_err());
    }
}
