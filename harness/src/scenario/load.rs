//! Reading scenario files: every error names the file, and parse errors the line and column.

use std::path::{Path, PathBuf};

use super::types::Scenario;

#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// A JSON or schema error at a position (1-based line and column, as editors count them).
    #[error("{path}:{line}:{column}: {message}")]
    Parse { path: PathBuf, line: usize, column: usize, message: String },
    #[error("{path}: no scenario files (*.json) in this folder")]
    Empty { path: PathBuf },
    #[error("{path}: scenario name `{name}` is already used by {first}")]
    DuplicateName { path: PathBuf, name: String, first: PathBuf },
}

impl ScenarioError {
    pub fn path(&self) -> &Path {
        match self {
            ScenarioError::Io { path, .. }
            | ScenarioError::Parse { path, .. }
            | ScenarioError::Empty { path }
            | ScenarioError::DuplicateName { path, .. } => path,
        }
    }
}

/// Parse one scenario from text; `path` only names it in errors.
pub fn load_str(path: &Path, text: &str) -> Result<Scenario, ScenarioError> {
    let mut scenario: Scenario = serde_json::from_str(text).map_err(|e| {
        // serde_json appends " at line L column C"; the position goes in front instead, as compilers print it.
        let full = e.to_string();
        let message = match full.rfind(" at line ") {
            Some(i) => full[..i].to_string(),
            None => full,
        };
        ScenarioError::Parse { path: path.to_path_buf(), line: e.line(), column: e.column(), message }
    })?;
    scenario.path = path.to_path_buf();
    // a GGUF file named by a relative path is found next to the scenario, as a corpus is
    if let super::EngineSpec::Bundled { gguf: Some(model), .. } = &mut scenario.engine {
        let known = kvproof_engines::gguf::KNOWN_MODELS.contains(&model.as_str());
        if !known && Path::new(model.as_str()).is_relative() {
            *model = path.parent().unwrap_or(Path::new(".")).join(&*model).display().to_string();
        }
    }
    let corpus = match &scenario.params {
        super::Params::StressPairs(p) => p.corpus.as_deref().map(|f| (f, false)),
        super::Params::SemanticStaleness(p) => p.corpus.as_deref().map(|f| (f, true)),
        _ => None,
    };
    if let Some((file, stale)) = corpus {
        scenario.corpus = Some(std::sync::Arc::new(super::corpus::load(path, file, stale)?));
    }
    Ok(scenario)
}

pub fn load_file(path: &Path) -> Result<Scenario, ScenarioError> {
    let text =
        std::fs::read_to_string(path).map_err(|source| ScenarioError::Io { path: path.to_path_buf(), source })?;
    load_str(path, &text)
}

/// The scenario files a path names: the file itself, or a folder's `*.json` (not recursive, `schema.json`
/// excluded), sorted by name so runs are repeatable.
pub fn collect_files(path: &Path) -> Result<Vec<PathBuf>, ScenarioError> {
    let meta = std::fs::metadata(path).map_err(|source| ScenarioError::Io { path: path.to_path_buf(), source })?;
    if !meta.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let entries = std::fs::read_dir(path).map_err(|source| ScenarioError::Io { path: path.to_path_buf(), source })?;
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| ScenarioError::Io { path: path.to_path_buf(), source })?;
        let p = entry.path();
        let is_json = p.extension().is_some_and(|e| e == "json");
        let is_schema = p.file_name().is_some_and(|n| n == "schema.json");
        if is_json && !is_schema && p.is_file() {
            files.push(p);
        }
    }
    files.sort();
    if files.is_empty() {
        return Err(ScenarioError::Empty { path: path.to_path_buf() });
    }
    Ok(files)
}

/// Load every scenario the paths name, in order; names must be unique across the set (they key the results).
pub fn load_paths(paths: &[PathBuf]) -> Result<Vec<Scenario>, ScenarioError> {
    let mut out: Vec<Scenario> = Vec::new();
    for path in paths {
        for file in collect_files(path)? {
            let s = load_file(&file)?;
            if let Some(first) = out.iter().find(|o| o.name == s.name) {
                return Err(ScenarioError::DuplicateName { path: file, name: s.name, first: first.path.clone() });
            }
            out.push(s);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::{EngineSpec, Kind, Params};

    fn parse(text: &str) -> Result<Scenario, ScenarioError> {
        load_str(Path::new("s.json"), text)
    }

    #[test]
    fn minimal_bundled_scenario_gets_defaults() {
        let s = parse(r#"{"name": "b", "engine": {"arch": "inkling"}, "kind": "boundary-matrix"}"#).expect("parse");
        assert_eq!(s.kind, Kind::BoundaryMatrix);
        assert!(matches!(s.engine, EngineSpec::Bundled { seed: 0, fault: None, .. }));
        assert!(matches!(s.params, Params::BoundaryMatrix(ref p) if p.cases.is_none() && p.max_tokens == 8));
        assert_eq!(s.assertions.confidence, 0.95);
    }

    #[test]
    fn unknown_top_level_key_is_named_with_its_position() {
        let err = parse("{\n  \"name\": \"b\",\n  \"engin\": {}\n}").expect_err("unknown key");
        let msg = err.to_string();
        assert!(msg.starts_with("s.json:3:"), "{msg}");
        assert!(msg.contains("unknown field `engin`"), "{msg}");
    }

    #[test]
    fn unknown_key_inside_params_is_named_at_its_line() {
        let text = "{\"name\": \"s\", \"engine\": {\"arch\": \"inkling\"}, \"kind\": \"stress-pairs\",\n\
                    \"params\": {\n  \"pairs\": 10,\n  \"pair\": 3\n}}";
        let msg = parse(text).expect_err("unknown").to_string();
        assert!(msg.starts_with("s.json:4:"), "{msg}");
        assert!(msg.contains("unknown field `pair`"), "{msg}");
    }

    #[test]
    fn params_before_kind_is_rejected() {
        let msg = parse(r#"{"name": "s", "params": {}, "kind": "stress-pairs", "engine": {"arch": "inkling"}}"#)
            .expect_err("order")
            .to_string();
        assert!(msg.contains("`kind` must come before `params`"), "{msg}");
    }

    #[test]
    fn engine_errors_name_the_field() {
        for (engine, needle) in [
            (r#"{"arch": "nope"}"#, "engine.arch"),
            (r#"{"arch": "inkling", "preset": "huge"}"#, "engine.preset"),
            (r#"{"arch": "inkling", "fault": "not-a-fault"}"#, "engine.fault"),
            (r#"{"arch": "inkling", "command": ["x"]}"#, "only one of"),
            (r#"{"command": ["x"], "url": "http://127.0.0.1:1/v1"}"#, "only one of"),
            (r#"{"arch": "inkling", "cold": "bypass"}"#, "engine.cold"),
            (r#"{"url": "http://127.0.0.1:1/v1", "reset": "none"}"#, "engine.cold"),
            (r#"{"url": "http://127.0.0.1:1/v1", "cold": "bypass", "reset": "none", "seed": 1}"#, "bundled engines"),
            (r#"{"command": []}"#, "engine.command"),
            (r#"{"command": ["x"], "seed": 1}"#, "bundled engines"),
            (r#"{"arch": "inkling", "colour": 1}"#, "unknown field `colour`"),
        ] {
            let text = format!(r#"{{"name": "s", "engine": {engine}, "kind": "boundary-matrix"}}"#);
            let msg = parse(&text).expect_err(engine).to_string();
            assert!(msg.contains(needle), "{engine}: {msg}");
            assert!(msg.starts_with("s.json:1:"), "{msg}");
        }
    }

    #[test]
    fn ranges_are_checked() {
        for (extra, needle) in [
            (r#""kind": "stress-pairs", "params": {"turns": [1, 3]}"#, "params.turns"),
            (r#""kind": "stress-pairs", "params": {"pairs": 0}"#, "params.pairs"),
            (r#""kind": "boundary-matrix", "assert": {"confidence": 1.0}"#, "assert.confidence"),
            (r#""kind": "boundary-matrix", "assert": {"max_failure_rate": 2}"#, "max_failure_rate"),
            (r#""kind": "boundary-matrix", "params": {"cases": []}"#, "params.cases"),
            (r#""kind": "boundary-matrix", "params": {"cases": ["extendd"]}"#, "unknown variant `extendd`"),
        ] {
            let text = format!(r#"{{"name": "s", "engine": {{"arch": "inkling"}}, {extra}}}"#);
            let msg = parse(&text).expect_err(extra).to_string();
            assert!(msg.contains(needle), "{extra}: {msg}");
        }
    }

    #[test]
    fn duplicate_keys_and_truncated_files_are_errors() {
        let msg = parse(r#"{"name": "a", "name": "b"}"#).expect_err("dup").to_string();
        assert!(msg.contains("duplicate field `name`"), "{msg}");
        let msg = parse("{\"name\": \"a\",\n").expect_err("eof").to_string();
        assert!(msg.starts_with("s.json:2:"), "{msg}");
    }
}
