//! `params` of kind `agentic`: the task set (each with its system prompt, request, tools and virtual file tree),
//! how many sessions to run, and each session's turn and token budget.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{check_in, check_max_tokens, MAX_TOKENS, MAX_TURNS};

/// A tool the sandbox offers. Each has a fixed JSON schema and fixed semantics (`agent::tools`), so a task names
/// the tools it offers rather than redefining them: a schema that disagreed with what the sandbox does would make
/// every assertion about calls meaningless.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[derive(strum::EnumIter, strum::IntoStaticStr, strum::Display, strum::EnumString)]
#[strum(serialize_all = "snake_case")]
pub enum ToolName {
    /// The entries of a directory of the virtual tree.
    ListDir,
    /// A file's text.
    ReadFile,
    /// Replace (or create) a file's text.
    WriteFile,
    /// Lines containing a string, over every file.
    Search,
    /// The task's checks over the virtual tree.
    RunTests,
    /// An arithmetic expression's value.
    Calculator,
    /// End the session with an answer.
    Finish,
}

impl ToolName {
    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// A deterministic check `run_tests` makes over the virtual tree: file `file` contains `contains` (and, when
/// `absent` is set, does not contain it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TreeCheck {
    /// The check's name as `run_tests` reports it.
    pub name: String,
    pub file: String,
    pub contains: String,
    /// Pass when the file does *not* contain `contains`.
    #[serde(default)]
    pub absent: bool,
}

/// One tool-use task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentTask {
    /// The task's name (sessions are named after it).
    pub name: String,
    /// The system prompt; kvproof appends the offered tools' schemas and the call format.
    pub system: String,
    /// The user's request.
    pub request: String,
    /// The tools offered, in the order the system prompt lists them.
    #[schemars(length(min = 1))]
    pub tools: Vec<ToolName>,
    /// The virtual file tree: path (`/`-separated, relative) to text.
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    /// What `run_tests` checks.
    #[serde(default)]
    pub tests: Vec<TreeCheck>,
    /// The answer `finish` must carry for the task to count as solved (compared after trimming, case-insensitive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<String>,
    /// Variants of the task, each a map from placeholder name to text: `{name}` in the system prompt, request,
    /// file paths and texts, checks and answer becomes that text. Greedy decoding repeats a session exactly, so
    /// sessions of one task differ only through these.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub variants: Vec<BTreeMap<String, String>>,
}

impl AgentTask {
    /// The task with variant `k` (mod the number of variants) filled in; the task itself when it has none.
    pub fn variant(&self, k: usize) -> AgentTask {
        let Some(vars) = (!self.variants.is_empty()).then(|| &self.variants[k % self.variants.len()]) else {
            return self.clone();
        };
        let fill = |text: &str| {
            vars.iter().fold(text.to_string(), |t, (name, value)| t.replace(&format!("{{{name}}}"), value))
        };
        AgentTask {
            name: self.name.clone(),
            system: fill(&self.system),
            request: fill(&self.request),
            tools: self.tools.clone(),
            files: self.files.iter().map(|(p, t)| (fill(p), fill(t))).collect(),
            tests: self
                .tests
                .iter()
                .map(|c| TreeCheck {
                    name: c.name.clone(),
                    file: fill(&c.file),
                    contains: fill(&c.contains),
                    absent: c.absent,
                })
                .collect(),
            answer: self.answer.as_deref().map(fill),
            variants: Vec::new(),
        }
    }
}

/// `kind: agentic`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgenticParams {
    /// Sessions to run; session i runs task i mod (number of tasks).
    #[serde(default = "default_sessions")]
    #[schemars(range(min = 1, max = MAX_SESSIONS))]
    pub sessions: usize,
    /// Model turns per session at most.
    #[serde(default = "default_max_turns")]
    #[schemars(range(min = 1, max = MAX_TURNS))]
    pub max_turns: usize,
    /// Reply tokens per turn at most.
    #[serde(default = "default_max_tokens")]
    #[schemars(range(min = 1, max = MAX_TOKENS))]
    pub max_tokens: usize,
    /// The session ends before a turn whose prompt would pass this many tokens (absent: the engine's context).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_context: Option<usize>,
    /// The slot sessions run on.
    #[serde(default)]
    pub slot: usize,
    /// The client resends the system prompt, the request and only its last `keep_turns` model turns (a reply and
    /// the tool message answering it), dropping the oldest first, as agent frameworks that bound their context
    /// do (absent: the whole transcript). A dropped turn leaves the engine nothing to reuse past the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub keep_turns: Option<usize>,
    /// The task set.
    #[schemars(length(min = 1))]
    pub tasks: Vec<AgentTask>,
}

pub const MAX_SESSIONS: usize = 10_000;

fn default_sessions() -> usize {
    4
}
fn default_max_turns() -> usize {
    8
}
fn default_max_tokens() -> usize {
    64
}

impl AgenticParams {
    /// Range checks serde cannot express.
    pub fn validate(&self) -> Result<(), String> {
        let p = self;
        check_in("sessions", p.sessions, 1..=MAX_SESSIONS)?;
        check_in("max_turns", p.max_turns, 1..=MAX_TURNS)?;
        check_max_tokens(p.max_tokens)?;
        if let Some(c) = p.max_context {
            if c <= p.max_tokens {
                return Err(format!(
                    "params.max_context: {c} leaves no room for a prompt and {} reply tokens",
                    p.max_tokens
                ));
            }
        }
        if p.keep_turns == Some(0) {
            return Err("params.keep_turns: must be at least 1 (the reply the next tool message answers)".into());
        }
        if p.tasks.is_empty() {
            return Err("params.tasks: must list at least one task".into());
        }
        let mut names = std::collections::BTreeSet::new();
        for (i, t) in p.tasks.iter().enumerate() {
            let at = format!("params.tasks[{i}]");
            crate::scenario::types::check_name_len(&format!("{at}.name"), &t.name)?;
            if t.name.is_empty() || !names.insert(t.name.as_str()) {
                return Err(format!("{at}.name: `{}` is empty or not unique", t.name));
            }
            for (k, check) in t.tests.iter().enumerate() {
                crate::scenario::types::check_name_len(&format!("{at}.tests[{k}].name"), &check.name)?;
            }
            if t.tools.is_empty() {
                return Err(format!("{at}.tools: must offer at least one tool"));
            }
            for path in t.files.keys() {
                if path.is_empty() || path.starts_with('/') || path.split('/').any(|c| c.is_empty() || c == "..") {
                    return Err(format!("{at}.files: `{path}` is not a relative path of non-empty components"));
                }
            }
            for (k, v) in t.variants.iter().enumerate() {
                if v.keys().any(|name| name.is_empty() || name.contains(['{', '}'])) {
                    return Err(format!("{at}.variants[{k}]: placeholder names must be non-empty, without braces"));
                }
                for name in v.keys() {
                    crate::scenario::types::check_name_len(&format!("{at}.variants[{k}]"), name)?;
                }
            }
            if !t.tests.is_empty() && !t.tools.contains(&ToolName::RunTests) {
                return Err(format!("{at}.tests: the task has checks but does not offer run_tests"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(name: &str) -> AgentTask {
        AgentTask {
            name: name.into(),
            system: "s".into(),
            request: "r".into(),
            tools: vec![ToolName::Calculator],
            files: BTreeMap::new(),
            tests: Vec::new(),
            answer: None,
            variants: Vec::new(),
        }
    }

    fn params(tasks: Vec<AgentTask>) -> AgenticParams {
        AgenticParams { sessions: 1, max_turns: 4, max_tokens: 8, max_context: None, slot: 0, keep_turns: None, tasks }
    }

    #[test]
    fn validation_names_the_field() {
        assert!(params(vec![task("a")]).validate().is_ok());
        let e = AgenticParams { max_context: Some(8), ..params(vec![task("a")]) }.validate().expect_err("ctx");
        assert!(e.contains("params.max_context"), "{e}");
        let e = AgenticParams { keep_turns: Some(0), ..params(vec![task("a")]) }.validate().expect_err("keep 0");
        assert!(e.contains("params.keep_turns"), "{e}");
        assert!(AgenticParams { keep_turns: Some(1), ..params(vec![task("a")]) }.validate().is_ok());
        let e = params(vec![]).validate().expect_err("no tasks");
        assert!(e.contains("params.tasks"), "{e}");
        let e = params(vec![task("a"), task("a")]).validate().expect_err("dup");
        assert!(e.contains("params.tasks[1].name"), "{e}");
        let mut t = task("a");
        t.files.insert("../etc/passwd".into(), String::new());
        let e = params(vec![t]).validate().expect_err("escape");
        assert!(e.contains("params.tasks[0].files"), "{e}");
        let mut t = task("a");
        t.tests.push(TreeCheck { name: "c".into(), file: "f".into(), contains: "x".into(), absent: false });
        let e = params(vec![t]).validate().expect_err("tests without run_tests");
        assert!(e.contains("run_tests"), "{e}");
    }

    #[test]
    fn a_variant_fills_every_placeholder_of_the_task() {
        let mut t = task("sum");
        t.request = "add {a} and {b}".into();
        t.files.insert("data/{a}.txt".into(), "b={b} {literal}".into());
        t.answer = Some("{a}{b}".into());
        t.variants = vec![BTreeMap::from([("a".into(), "1".into()), ("b".into(), "2".into())])];
        let v = t.variant(3);
        assert_eq!(v.request, "add 1 and 2");
        assert_eq!(v.files.get("data/1.txt").map(String::as_str), Some("b=2 {literal}"));
        assert_eq!(v.answer.as_deref(), Some("12"));
        assert!(v.variants.is_empty());
        assert_eq!(task("plain").variant(5), task("plain"));
    }

    #[test]
    fn tool_names_are_snake_case() {
        assert_eq!(serde_json::to_string(&ToolName::ReadFile).expect("json"), "\"read_file\"");
        assert_eq!(ToolName::RunTests.name(), "run_tests");
    }
}
