//! The sandbox the tools run in: a virtual file tree (the task's files, as the session changes them) and the
//! task's checks. Nothing here touches the host, every result is bounded, and every failure is a text result
//! beginning with `error: ` that goes back to the model.

use std::collections::{BTreeMap, BTreeSet};
use std::str::FromStr;

use serde_json::Value;

use super::calculator;
use super::calls::ParsedCall;
use super::tools::check_arguments;
use crate::scenario::params::{AgentTask, ToolName, TreeCheck};

/// The largest file `write_file` accepts, in bytes.
pub const MAX_WRITE: usize = 64 * 1024;
/// The longest tool result, in bytes (marker included); longer results are cut with a marker saying so.
pub const MAX_RESULT: usize = 2000;
/// The most lines `search` lists before summing up the rest.
pub const MAX_SEARCH_LINES: usize = 20;

/// What a tool call produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolOutcome {
    /// Whether the tool ran without error (`run_tests` runs fine when checks fail).
    pub ok: bool,
    /// The result as it goes back to the model (starts with `error: ` when `ok` is false).
    pub text: String,
    /// For `run_tests`: whether every check passed.
    pub tests_passed: Option<bool>,
}

impl ToolOutcome {
    fn ok(text: String) -> Self {
        ToolOutcome { ok: true, text, tests_passed: None }
    }
    fn error(why: impl std::fmt::Display) -> Self {
        ToolOutcome { ok: false, text: format!("error: {why}"), tests_passed: None }
    }
}

/// One session's virtual tree, the tools the task offers and the task's checks.
#[derive(Debug, Clone)]
pub struct Sandbox {
    files: BTreeMap<String, String>,
    tests: Vec<TreeCheck>,
    tools: Vec<ToolName>,
}

impl Sandbox {
    pub fn new(task: &AgentTask) -> Self {
        Sandbox { files: task.files.clone(), tests: task.tests.clone(), tools: task.tools.clone() }
    }

    /// Whether a file exists at `path` now.
    pub fn exists(&self, path: &str) -> bool {
        self.files.contains_key(path)
    }

    /// The tool a call names, if it is one the task offers and the arguments fit its schema; else why not (the
    /// text of the error, without the `error: ` prefix).
    pub fn check(&self, call: &ParsedCall) -> Result<ToolName, String> {
        let shown = clip(&call.name, 64);
        let tool = ToolName::from_str(&call.name).map_err(|_| format!("unknown tool `{shown}`"))?;
        if !self.tools.contains(&tool) {
            return Err(format!("tool `{shown}` is not offered in this task"));
        }
        check_arguments(tool, &call.arguments)?;
        Ok(tool)
    }

    /// Runs one call over the tree. Never panics; the result is at most [`MAX_RESULT`] bytes.
    pub fn run(&mut self, call: &ParsedCall) -> ToolOutcome {
        let mut out = match self.check(call) {
            Ok(tool) => self.dispatch(tool, &call.arguments),
            Err(why) => ToolOutcome::error(why),
        };
        out.text = truncate(out.text);
        out
    }

    fn dispatch(&mut self, tool: ToolName, args: &Value) -> ToolOutcome {
        // `check` has validated the arguments: the keys a tool reads are present and strings.
        let arg = |key: &str| args.get(key).and_then(Value::as_str).unwrap_or_default();
        match tool {
            ToolName::ListDir => self.list_dir(arg("path")),
            ToolName::ReadFile => match self.files.get(arg("path")) {
                Some(text) => ToolOutcome::ok(text.clone()),
                None => ToolOutcome::error(format!("no such file: {}", arg("path"))),
            },
            ToolName::WriteFile => self.write_file(arg("path"), arg("content")),
            ToolName::Search => self.search(arg("pattern")),
            ToolName::RunTests => self.run_tests(),
            ToolName::Calculator => match calculator::evaluate(arg("expression")) {
                Ok(x) => ToolOutcome::ok(calculator::format(x)),
                Err(e) => ToolOutcome::error(e),
            },
            ToolName::Finish => ToolOutcome::ok(arg("answer").to_string()),
        }
    }

    /// The entries right under `path` ("" or "." is the root; a trailing `/` is allowed), directories marked `/`.
    fn list_dir(&self, path: &str) -> ToolOutcome {
        let dir = path.trim_end_matches('/');
        let prefix = if dir.is_empty() || dir == "." { String::new() } else { format!("{dir}/") };
        let entries: BTreeSet<String> = self
            .files
            .keys()
            .filter_map(|f| f.strip_prefix(prefix.as_str()))
            .map(|rest| match rest.split_once('/') {
                Some((d, _)) => format!("{d}/"),
                None => rest.to_string(),
            })
            .collect();
        if entries.is_empty() && !prefix.is_empty() {
            return if self.files.contains_key(dir) {
                ToolOutcome::error(format!("not a directory: {path}"))
            } else {
                ToolOutcome::error(format!("no such directory: {path}"))
            };
        }
        if entries.is_empty() {
            return ToolOutcome::ok("(empty)".into());
        }
        ToolOutcome::ok(entries.into_iter().collect::<Vec<_>>().join("\n"))
    }

    /// Replaces or creates a file. The path must be relative with non-empty components and no `.` or `..`, and
    /// must not run into a file as a directory (or be a directory itself).
    fn write_file(&mut self, path: &str, content: &str) -> ToolOutcome {
        if path.is_empty() || path.starts_with('/') || path.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
            return ToolOutcome::error(format!(
                "invalid path `{path}`: use a relative path of non-empty components without `.` or `..`"
            ));
        }
        if content.len() > MAX_WRITE {
            return ToolOutcome::error(format!("content is {} bytes (at most {MAX_WRITE})", content.len()));
        }
        let mut parent = String::new();
        for component in path.split('/').take(path.split('/').count() - 1) {
            if !parent.is_empty() {
                parent.push('/');
            }
            parent.push_str(component);
            if self.files.contains_key(&parent) {
                return ToolOutcome::error(format!("cannot write {path}: {parent} is a file"));
            }
        }
        let as_dir = format!("{path}/");
        if self.files.keys().any(|f| f.starts_with(&as_dir)) {
            return ToolOutcome::error(format!("cannot write {path}: it is a directory"));
        }
        self.files.insert(path.to_string(), content.to_string());
        ToolOutcome::ok(format!("wrote {} bytes to {path}", content.len()))
    }

    /// Every line containing `pattern`, as `path:line: text`, in path order; at most [`MAX_SEARCH_LINES`].
    fn search(&self, pattern: &str) -> ToolOutcome {
        if pattern.is_empty() {
            return ToolOutcome::error("search: the pattern is empty");
        }
        let mut lines = Vec::new();
        let mut more = 0usize;
        for (path, text) in &self.files {
            for (i, line) in text.lines().enumerate().filter(|(_, l)| l.contains(pattern)) {
                if lines.len() < MAX_SEARCH_LINES {
                    lines.push(format!("{path}:{}: {line}", i + 1));
                } else {
                    more += 1;
                }
            }
        }
        if lines.is_empty() {
            return ToolOutcome::ok("no matches".into());
        }
        if more > 0 {
            lines.push(format!("… ({more} more)"));
        }
        ToolOutcome::ok(lines.join("\n"))
    }

    /// The task's checks over the tree as it is now. A check on a missing file fails.
    fn run_tests(&self) -> ToolOutcome {
        if self.tests.is_empty() {
            return ToolOutcome { ok: true, text: "no tests".into(), tests_passed: Some(true) };
        }
        let mut failures = Vec::new();
        for c in &self.tests {
            let failure = match self.files.get(&c.file) {
                None => Some(format!("FAIL {}: {} is missing", c.name, c.file)),
                Some(text) if c.absent && text.contains(&c.contains) => {
                    Some(format!("FAIL {}: {} contains \"{}\"", c.name, c.file, c.contains))
                }
                Some(text) if !c.absent && !text.contains(&c.contains) => {
                    Some(format!("FAIL {}: {} does not contain \"{}\"", c.name, c.file, c.contains))
                }
                Some(_) => None,
            };
            failures.extend(failure);
        }
        let passed = self.tests.len() - failures.len();
        let mut text = format!("{passed} passed, {} failed", failures.len());
        for f in &failures {
            text.push('\n');
            text.push_str(f);
        }
        ToolOutcome { ok: true, text, tests_passed: Some(failures.is_empty()) }
    }
}

/// At most `n` characters of `s` (names from a reply are shown in errors, but not at any length).
fn clip(s: &str, n: usize) -> String {
    match s.char_indices().nth(n) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// `text` cut to [`MAX_RESULT`] bytes (at a character boundary), with a marker saying how much was cut.
fn truncate(text: String) -> String {
    if text.len() <= MAX_RESULT {
        return text;
    }
    let marker_room = 48;
    let mut end = MAX_RESULT - marker_room;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}\n… [truncated: {} more bytes]", &text[..end], text.len() - end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn task() -> AgentTask {
        let files = [
            ("README.md", "# demo\nsee src/lib.rs\n"),
            ("src/lib.rs", "pub fn add(a: i32, b: i32) -> i32 {\n    a - b\n}\n"),
            ("src/util/mod.rs", "// util\n"),
        ];
        AgentTask {
            name: "t".into(),
            system: "s".into(),
            request: "r".into(),
            tools: vec![
                ToolName::ListDir,
                ToolName::ReadFile,
                ToolName::WriteFile,
                ToolName::Search,
                ToolName::RunTests,
                ToolName::Calculator,
                ToolName::Finish,
            ],
            files: files.iter().map(|(p, t)| (p.to_string(), t.to_string())).collect(),
            tests: vec![
                TreeCheck { name: "adds".into(), file: "src/lib.rs".into(), contains: "a + b".into(), absent: false },
                TreeCheck { name: "no-sub".into(), file: "src/lib.rs".into(), contains: "a - b".into(), absent: true },
                TreeCheck { name: "notes".into(), file: "NOTES".into(), contains: "x".into(), absent: false },
            ],
            answer: None,
            variants: Vec::new(),
        }
    }

    fn run(s: &mut Sandbox, name: &str, arguments: Value) -> ToolOutcome {
        s.run(&ParsedCall { name: name.into(), arguments })
    }

    #[test]
    fn list_dir_lists_one_level_sorted_with_directories_marked() {
        let mut s = Sandbox::new(&task());
        assert_eq!(run(&mut s, "list_dir", json!({"path": ""})).text, "README.md\nsrc/");
        assert_eq!(run(&mut s, "list_dir", json!({"path": "."})).text, "README.md\nsrc/");
        assert_eq!(run(&mut s, "list_dir", json!({"path": "src/"})).text, "lib.rs\nutil/");
        let e = run(&mut s, "list_dir", json!({"path": "nope"}));
        assert!(!e.ok && e.text == "error: no such directory: nope", "{e:?}");
        let e = run(&mut s, "list_dir", json!({"path": "README.md"}));
        assert!(!e.ok && e.text.starts_with("error: not a directory"), "{e:?}");
    }

    #[test]
    fn read_and_write_files() {
        let mut s = Sandbox::new(&task());
        assert_eq!(run(&mut s, "read_file", json!({"path": "README.md"})).text, "# demo\nsee src/lib.rs\n");
        let e = run(&mut s, "read_file", json!({"path": "x"}));
        assert_eq!((e.ok, e.text.as_str()), (false, "error: no such file: x"));
        let w = run(&mut s, "write_file", json!({"path": "docs/a.txt", "content": "héllo"}));
        assert_eq!((w.ok, w.text.as_str()), (true, "wrote 6 bytes to docs/a.txt"));
        assert!(s.exists("docs/a.txt"));
        for bad in ["/etc/passwd", "../x", "a//b", "", "a/./b", "src/"] {
            let e = run(&mut s, "write_file", json!({"path": bad, "content": ""}));
            assert!(!e.ok && e.text.starts_with("error: invalid path"), "{bad}: {e:?}");
        }
        let e = run(&mut s, "write_file", json!({"path": "README.md/x", "content": ""}));
        assert!(!e.ok && e.text.contains("is a file"), "{e:?}");
        let e = run(&mut s, "write_file", json!({"path": "src", "content": ""}));
        assert!(!e.ok && e.text.contains("is a directory"), "{e:?}");
        let e = run(&mut s, "write_file", json!({"path": "big", "content": "x".repeat(MAX_WRITE + 1)}));
        assert!(!e.ok && e.text.contains("at most 65536"), "{e:?}");
        assert!(!s.exists("big"));
    }

    #[test]
    fn search_lists_matches_in_path_order_and_caps_them() {
        let mut s = Sandbox::new(&task());
        assert_eq!(
            run(&mut s, "search", json!({"pattern": "lib"})).text,
            "README.md:2: see src/lib.rs",
            "only file text is searched"
        );
        assert_eq!(run(&mut s, "search", json!({"pattern": "zzz"})).text, "no matches");
        let e = run(&mut s, "search", json!({"pattern": ""}));
        assert!(!e.ok && e.text.starts_with("error: "), "{e:?}");
        run(&mut s, "write_file", json!({"path": "many", "content": "hit\n".repeat(25)}));
        let out = run(&mut s, "search", json!({"pattern": "hit"})).text;
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 21);
        assert_eq!(lines[0], "many:1: hit");
        assert_eq!(lines[20], "… (5 more)");
    }

    #[test]
    fn run_tests_reports_each_failure() {
        let mut s = Sandbox::new(&task());
        let r = run(&mut s, "run_tests", json!({}));
        assert!(r.ok);
        assert_eq!(r.tests_passed, Some(false));
        assert_eq!(
            r.text,
            "0 passed, 3 failed\nFAIL adds: src/lib.rs does not contain \"a + b\"\n\
             FAIL no-sub: src/lib.rs contains \"a - b\"\nFAIL notes: NOTES is missing"
        );
        run(&mut s, "write_file", json!({"path": "src/lib.rs", "content": "a + b"}));
        run(&mut s, "write_file", json!({"path": "NOTES", "content": "x"}));
        let r = run(&mut s, "run_tests", json!({}));
        assert_eq!((r.text.as_str(), r.tests_passed), ("3 passed, 0 failed", Some(true)));
        let mut t = task();
        t.tests.clear();
        let r = Sandbox::new(&t).run(&ParsedCall { name: "run_tests".into(), arguments: json!({}) });
        assert_eq!((r.ok, r.text.as_str(), r.tests_passed), (true, "no tests", Some(true)));
    }

    #[test]
    fn calculator_finish_and_errors() {
        let mut s = Sandbox::new(&task());
        assert_eq!(run(&mut s, "calculator", json!({"expression": "6 * 7"})).text, "42");
        let e = run(&mut s, "calculator", json!({"expression": "1/0"}));
        assert!(!e.ok && e.text.starts_with("error: division by zero"), "{e:?}");
        let f = run(&mut s, "finish", json!({"answer": "42"}));
        assert_eq!((f.ok, f.text.as_str()), (true, "42"));
        let e = run(&mut s, "rm_rf", json!({}));
        assert_eq!((e.ok, e.text.as_str()), (false, "error: unknown tool `rm_rf`"));
        let mut t = task();
        t.tools = vec![ToolName::Finish];
        let e = Sandbox::new(&t).run(&ParsedCall { name: "read_file".into(), arguments: json!({"path": "a"}) });
        assert_eq!(e.text, "error: tool `read_file` is not offered in this task");
        let e = run(&mut s, "read_file", json!({"file": "a"}));
        assert!(!e.ok && e.text.starts_with("error: ") && e.text.contains("`path`"), "{e:?}");
        let e = run(&mut s, &"x".repeat(10_000), json!({}));
        assert!(e.text.len() < 100, "{}", e.text);
    }

    #[test]
    fn results_are_truncated_with_a_marker() {
        let mut s = Sandbox::new(&task());
        run(&mut s, "write_file", json!({"path": "big", "content": "é".repeat(MAX_WRITE / 2)}));
        let r = run(&mut s, "read_file", json!({"path": "big"}));
        assert!(r.ok && r.text.len() <= MAX_RESULT, "{}", r.text.len());
        assert!(r.text.ends_with("more bytes]"), "{}", &r.text[r.text.len() - 40..]);
    }
}
