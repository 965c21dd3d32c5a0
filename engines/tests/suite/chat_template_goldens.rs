//! SmolLM2's chat template (`ci/goldens/chat_template.jinja`, its GGUF's tokenizer.chat_template) rendered by
//! minijinja equals llama.cpp's rendering (`ci/goldens/chat.jsonl`, from llama-server's /apply-template), and the
//! rendered text is prefix-stable: turn N+1's transcript begins with turn N's prompt and its reply. The same
//! property in token ids, which needs the model's vocabulary, is in `bpe_goldens.rs`.

use kvproof_engines::chat::TextMessage;
use kvproof_engines::chat_template::ChatTemplate;

const TEMPLATE: &str = include_str!("../../../ci/goldens/chat_template.jinja");

fn smollm2() -> ChatTemplate {
    ChatTemplate::new(TEMPLATE, "<|im_start|>", "<|im_end|>").expect("template parses")
}

fn msg(role: &str, content: &str) -> TextMessage {
    TextMessage { role: role.into(), content: content.into() }
}

#[derive(serde::Deserialize)]
struct Golden {
    messages: Vec<TextMessage>,
    add_generation_prompt: bool,
    prompt: String,
}

#[test]
fn renders_as_llama_cpp_does() {
    let t = smollm2();
    let mut n = 0;
    for line in include_str!("../../../ci/goldens/chat.jsonl").lines() {
        let g: Golden = serde_json::from_str(line).expect("golden line");
        let got = t.render(&g.messages, g.add_generation_prompt).expect("renders");
        assert_eq!(got, g.prompt, "messages {:?}", g.messages);
        n += 1;
    }
    println!("chat template renders as llama.cpp on {n} of {n} conversations");
    assert!(n >= 10);
}

#[test]
fn next_turn_text_begins_with_this_turn_and_its_reply() {
    let t = smollm2();
    let replies = ["Hello!", " leading space", "\n\nleading newlines", "", "ends with newline\n", "日本 🏳️‍🌈"];
    for first in [None, Some("Be brief.")] {
        let mut transcript: Vec<TextMessage> = first.map(|s| msg("system", s)).into_iter().collect();
        for (i, reply) in replies.iter().enumerate() {
            transcript.push(msg("user", &format!("question {i}")));
            let prompt = t.render(&transcript, true).expect("renders");
            transcript.push(msg("assistant", reply));
            let next = t.render(&transcript, false).expect("renders");
            assert!(next.starts_with(&format!("{prompt}{reply}<|im_end|>")), "turn {i}: {next:?}");
        }
    }
}
