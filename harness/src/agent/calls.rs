//! Tool calls parsed out of a model's reply.
//!
//! The system prompt teaches one format, `<tool_call>{"name": "...", "arguments": {...}}</tool_call>`, and this
//! module accepts exactly that: a reply that strays from it gets an error saying why, which goes back to the model
//! as the tool message (as a real agent framework would answer it), so the session goes on.

use serde_json::Value;

/// The most calls one reply may make; blocks past it are ignored (a random engine can emit thousands).
pub const MAX_CALLS: usize = 8;

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// One call as the reply wrote it: the tool's name (not yet checked against the offered tools) and its arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedCall {
    pub name: String,
    pub arguments: Value,
}

/// The calls of a reply, in order (at most [`MAX_CALLS`]), or why the reply has none that parse: no block, an
/// unclosed block, JSON that does not parse (with serde_json's line and column within the block), or JSON that
/// is not an object with a string `name` and an object `arguments`.
pub fn parse(reply: &str) -> Result<Vec<ParsedCall>, String> {
    let mut calls = Vec::new();
    let mut rest = reply;
    while calls.len() < MAX_CALLS {
        let Some(start) = rest.find(OPEN) else { break };
        let body_and_after = &rest[start + OPEN.len()..];
        let Some(end) = body_and_after.find(CLOSE) else {
            return Err(format!("call {}: unclosed {OPEN} block (no {CLOSE} after it)", calls.len() + 1));
        };
        calls.push(parse_block(&body_and_after[..end], calls.len() + 1)?);
        rest = &body_and_after[end + CLOSE.len()..];
    }
    if calls.is_empty() {
        return Err(format!("no tool call: the reply has no {OPEN}...{CLOSE} block"));
    }
    Ok(calls)
}

/// One block's JSON (`n` numbers it from 1 in the error).
fn parse_block(body: &str, n: usize) -> Result<ParsedCall, String> {
    // serde_json's message ends with the line and column within the block; its recursion limit turns deeply
    // nested input into an error rather than a stack overflow.
    let value: Value = serde_json::from_str(body).map_err(|e| format!("call {n}: invalid JSON: {e}"))?;
    let Value::Object(mut map) = value else {
        return Err(format!("call {n}: expected a JSON object with `name` and `arguments`"));
    };
    let name = match map.remove("name") {
        Some(Value::String(s)) => s,
        Some(_) => return Err(format!("call {n}: `name` must be a string")),
        None => return Err(format!("call {n}: missing `name`")),
    };
    let arguments = match map.remove("arguments") {
        Some(v @ Value::Object(_)) => v,
        Some(_) => return Err(format!("call {n}: `arguments` must be an object")),
        None => return Err(format!("call {n}: missing `arguments`")),
    };
    Ok(ParsedCall { name, arguments })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn one_call_and_several_calls_parse_in_order() {
        let calls = parse(r#"Let me look. <tool_call>{"name": "read_file", "arguments": {"path": "a"}}</tool_call>"#)
            .expect("one call");
        assert_eq!(calls, vec![ParsedCall { name: "read_file".into(), arguments: json!({"path": "a"}) }]);
        let two = r#"<tool_call>{"name":"a","arguments":{}}</tool_call> then
<tool_call>
{"name":"b","arguments":{"x":1}}
</tool_call>"#;
        let calls = parse(two).expect("two calls");
        assert_eq!(calls.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["a", "b"]);
    }

    #[test]
    fn calls_are_capped() {
        let reply = r#"<tool_call>{"name":"run_tests","arguments":{}}</tool_call>"#.repeat(100);
        assert_eq!(parse(&reply).expect("calls").len(), MAX_CALLS);
    }

    #[test]
    fn malformed_replies_say_why() {
        let e = parse("I think the answer is 4.").expect_err("none");
        assert!(e.starts_with("no tool call"), "{e}");
        let e = parse(r#"<tool_call>{"name":"a","arguments":{}}"#).expect_err("unclosed");
        assert!(e.contains("unclosed"), "{e}");
        let e = parse("<tool_call>{\"name\": \"a\",\n \"arguments\": {]}</tool_call>").expect_err("json");
        assert!(e.contains("line 2 column"), "{e}");
        let e = parse(r#"<tool_call>{"name": 3, "arguments": {}}</tool_call>"#).expect_err("name");
        assert!(e.contains("`name`"), "{e}");
        let e = parse(r#"<tool_call>{"name": "a", "arguments": "x"}</tool_call>"#).expect_err("arguments");
        assert!(e.contains("`arguments`"), "{e}");
        let e = parse(r#"<tool_call>{"name": "a"}</tool_call>"#).expect_err("no arguments");
        assert!(e.contains("`arguments`"), "{e}");
        let e = parse("<tool_call>[1]</tool_call>").expect_err("not an object");
        assert!(e.contains("object"), "{e}");
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_crash() {
        let reply = format!("<tool_call>{}{}</tool_call>", "[".repeat(10_000), "]".repeat(10_000));
        assert!(parse(&reply).is_err());
        let reply = format!("<tool_call>{{\"name\":\"a\",\"arguments\":{}</tool_call>", "{\"a\":".repeat(10_000));
        assert!(parse(&reply).is_err());
    }
}
