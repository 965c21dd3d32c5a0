//! One turn of an agentic trajectory as the sandbox judged it: the reply, the tool calls parsed from it and what
//! the sandbox answered, and the per-turn assertions. Records carry these (`record::AgentTurn`); they live here,
//! where they are made, so the sandbox depends on nothing downstream of it.

use serde::{Deserialize, Serialize};

/// The per-turn assertions of an agentic session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[derive(strum::EnumIter, strum::IntoStaticStr, strum::Display)]
#[strum(serialize_all = "kebab-case")]
pub enum Assertion {
    /// The reply makes a tool call that parses, names an offered tool and whose arguments fit its schema.
    SchemaValidCall,
    /// A `write_file` to a file that exists comes after a `read_file` of it in the session.
    ReadBeforeWrite,
    /// No call repeats the session's previous call exactly (same tool, same arguments).
    NoIdenticalRepeat,
    /// After a tool error the next reply acknowledges it (mentions the error) or calls the tool again.
    NoSwallowedError,
    /// The reply does not claim the tests pass unless the last `run_tests` passed.
    NoFalseTestsPass,
}

impl Assertion {
    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// One assertion that applied to a turn, and whether it held.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssertionResult {
    pub assertion: Assertion,
    pub held: bool,
    /// What broke it (empty when it held).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

/// A tool call parsed from a reply and what the sandbox answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    pub name: String,
    /// The arguments as the reply gave them (compact JSON).
    pub arguments: String,
    /// Whether the tool ran without error.
    pub ok: bool,
    /// The tool's result (or error) text, as it went back to the model.
    pub result: String,
}

/// One turn of one trajectory: the reply, what it called, what went back, and the assertions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentStep {
    /// The reply's text (what the transcript takes back).
    pub reply: String,
    /// The calls the reply made, in order, with their results.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub calls: Vec<ToolCall>,
    /// Why the reply made no valid call, when it made none (this went back as the tool message).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_error: Option<String>,
    /// The tool message the next turn begins with (None: the session ended here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_message: Option<String>,
    /// The answer `finish` carried, when the reply ended the session with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<String>,
    /// Whether that answer is the task's (None: the task names no answer, or the session did not finish).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub solved: Option<bool>,
    pub assertions: Vec<AssertionResult>,
}

impl AgentStep {
    /// A turn that produced no reply (the request failed): nothing was called and nothing is asserted.
    pub fn failed(why: &str) -> Self {
        AgentStep {
            reply: String::new(),
            calls: Vec::new(),
            call_error: Some(why.to_string()),
            tool_message: None,
            answer: None,
            solved: None,
            assertions: Vec::new(),
        }
    }
}
