//! The system prompt of an agentic session: the task's own text, the offered tools as one compact JSON line
//! each, and the call format `calls` parses. Compact because the models under test are small and so are their
//! contexts.

use serde_json::Value;

use super::tools::{describe, schema};
use crate::scenario::params::{AgentTask, ToolName};

/// The system prompt for `task`. Only offered tools appear (a tool the model cannot call would only invite
/// calls the sandbox refuses); the closing sentence about `finish` appears only when `finish` is offered.
pub fn system_prompt(task: &AgentTask) -> String {
    let mut out = format!("{}\n\nYou can call these tools:\n", task.system);
    for &t in &task.tools {
        out.push_str(&tool_line(t));
        out.push('\n');
    }
    out.push_str("To call a tool, reply with <tool_call>{\"name\": \"TOOL\", \"arguments\": {...}}</tool_call>.");
    if task.tools.contains(&ToolName::Finish) {
        out.push_str(" Call finish with your answer when done.");
    }
    // One worked call: small models copy a shown call far more readily than they follow a described format.
    if let Some(&t) = task.tools.first() {
        let call = serde_json::json!({ "name": t.name(), "arguments": example_arguments(t, task) });
        out.push_str(&format!("\nExample: <tool_call>{call}</tool_call>"));
    }
    out
}

/// Plausible arguments for an example call of `t` in `task` (a path of its tree where one is needed).
fn example_arguments(t: ToolName, task: &AgentTask) -> Value {
    let file = task.files.keys().next().map_or("notes.txt", String::as_str);
    match t {
        ToolName::ListDir => serde_json::json!({ "path": "." }),
        ToolName::ReadFile => serde_json::json!({ "path": file }),
        ToolName::WriteFile => serde_json::json!({ "path": file, "content": "..." }),
        ToolName::Search => serde_json::json!({ "pattern": "port" }),
        ToolName::RunTests => serde_json::json!({}),
        ToolName::Calculator => serde_json::json!({ "expression": "2 * (3 + 4)" }),
        ToolName::Finish => serde_json::json!({ "answer": "42" }),
    }
}

/// `{"name":..,"description":..,"parameters":<schema>}` in that order (serde_json's map would sort the keys).
fn tool_line(t: ToolName) -> String {
    let name = Value::from(t.name());
    let description = Value::from(describe(t));
    format!("{{\"name\":{name},\"description\":{description},\"parameters\":{}}}", schema(t))
}

#[cfg(test)]
mod tests {
    use super::*;
    use strum::IntoEnumIterator;

    fn task(tools: Vec<ToolName>) -> AgentTask {
        AgentTask {
            name: "t".into(),
            system: "You fix code.".into(),
            request: "r".into(),
            tools,
            files: Default::default(),
            tests: Vec::new(),
            answer: None,
            variants: Vec::new(),
        }
    }

    #[test]
    fn lists_every_offered_tool_and_no_other() {
        let offered = vec![ToolName::ReadFile, ToolName::WriteFile, ToolName::RunTests];
        let p = system_prompt(&task(offered.clone()));
        assert!(p.starts_with("You fix code.\n\nYou can call these tools:\n"), "{p}");
        for t in ToolName::iter() {
            assert_eq!(p.contains(t.name()), offered.contains(&t), "{t} in:\n{p}");
        }
        assert!(p.contains("<tool_call>") && !p.contains("finish"), "{p}");
        let p = system_prompt(&task(ToolName::iter().collect()));
        for t in ToolName::iter() {
            assert!(p.contains(&format!("{{\"name\":\"{t}\",\"description\":")), "{t} in:\n{p}");
        }
        assert!(p.contains("Call finish with your answer when done."), "{p}");
    }

    #[test]
    fn the_example_is_a_valid_call_of_the_first_offered_tool() {
        for t in ToolName::iter() {
            let p = system_prompt(&task(vec![t, ToolName::Finish]));
            let example = p.lines().last().and_then(|l| l.strip_prefix("Example: ")).expect("example line");
            let calls = crate::agent::calls::parse(example).expect("parses");
            assert_eq!(calls.len(), 1);
            assert_eq!(calls[0].name, t.name());
            crate::agent::tools::check_arguments(t, &calls[0].arguments).expect("fits the schema");
        }
    }

    #[test]
    fn each_tool_line_is_json_with_its_schema() {
        let p = system_prompt(&task(vec![ToolName::WriteFile, ToolName::Finish]));
        let lines: Vec<Value> =
            p.lines().filter(|l| l.starts_with('{')).map(|l| serde_json::from_str(l).expect("a JSON line")).collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["name"], "write_file");
        assert_eq!(lines[0]["parameters"], schema(ToolName::WriteFile));
        assert_eq!(lines[1]["description"], describe(ToolName::Finish));
    }
}
