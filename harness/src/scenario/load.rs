//! Reading scenario files: every error names the file, the line and column of the offending value, the field path
//! and what was expected. Files and names have size limits, checked before anything is read whole.

use std::io::Read;
use std::path::{Path, PathBuf};

use super::locate::{self, line_column};
use super::message::{self, shorten};
use super::strict::{self, ErrorAt};
use super::types::Scenario;

/// A scenario file larger than this is refused before it is read.
pub const MAX_SCENARIO_BYTES: u64 = 1 << 20;
/// Names (the scenario's, tasks', corpus ids, placeholders) longer than this, in bytes, are refused.
pub const MAX_NAME_LEN: usize = 128;

#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// A JSON or schema error at a position (1-based line and column, as editors count them).
    #[error("{path}:{line}:{column}: {message}")]
    Parse { path: PathBuf, line: usize, column: usize, message: String },
    /// A file over its size limit; `size` is what was seen (a stream is not read further than the limit).
    #[error("{path}: {what} holds at most {max} bytes; this one has {}", seen(*.size, *.max))]
    TooLarge { path: PathBuf, size: u64, max: u64, what: &'static str },
    #[error("{path}: no scenario files (*.json) in this folder")]
    Empty { path: PathBuf },
    #[error("{path}: scenario name `{name}` is already used by {first}")]
    DuplicateName { path: PathBuf, name: String, first: PathBuf },
}

/// A size as far as it was seen: a stream read one byte past the limit is "more than" it.
fn seen(size: u64, max: u64) -> String {
    if size == max + 1 {
        format!("more than {max}")
    } else {
        size.to_string()
    }
}

impl ScenarioError {
    pub fn path(&self) -> &Path {
        match self {
            ScenarioError::Io { path, .. }
            | ScenarioError::Parse { path, .. }
            | ScenarioError::TooLarge { path, .. }
            | ScenarioError::Empty { path }
            | ScenarioError::DuplicateName { path, .. } => path,
        }
    }

    /// An error at byte `offset` of `text`.
    pub(super) fn at(path: &Path, text: &[u8], offset: usize, message: &str) -> ScenarioError {
        let (line, column) = line_column(text, offset);
        ScenarioError::Parse { path: path.to_path_buf(), line, column, message: shorten(message) }
    }
}

/// Read at most `max` bytes of `path`: a larger file is refused before it is read whole (its size as the file
/// system reports it, and again as read, for files whose size is not known ahead, e.g. a pipe).
pub(super) fn read_limited(path: &Path, max: u64, what: &'static str) -> Result<Vec<u8>, ScenarioError> {
    let io = |source| ScenarioError::Io { path: path.to_path_buf(), source };
    let file = std::fs::File::open(path).map_err(io)?;
    let too_large = |size| ScenarioError::TooLarge { path: path.to_path_buf(), size, max, what };
    let size = file.metadata().map_err(io)?.len();
    if size > max {
        return Err(too_large(size));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    file.take(max + 1).read_to_end(&mut bytes).map_err(io)?;
    if bytes.len() as u64 > max {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

/// `bytes` as text; else an error at the line and column of the first byte that is not UTF-8.
pub(super) fn utf8<'b>(path: &Path, bytes: &'b [u8]) -> Result<&'b str, ScenarioError> {
    std::str::from_utf8(bytes).map_err(|e| {
        let at = e.valid_up_to();
        let message = format!("not UTF-8 text: byte 0x{:02x} is not valid here", bytes[at]);
        ScenarioError::at(path, bytes, at, &message)
    })
}

/// Parse one scenario from text, with nothing read from disk: no corpus, no path resolved. `path` only names it
/// in errors.
pub fn parse_str(path: &Path, text: &str) -> Result<Scenario, ScenarioError> {
    if text.len() as u64 > MAX_SCENARIO_BYTES {
        let size = text.len() as u64;
        return Err(ScenarioError::TooLarge { path: path.into(), size, max: MAX_SCENARIO_BYTES, what: "a scenario" });
    }
    let mut scenario: Scenario = strict::from_str(text).map_err(|(e, at)| error_at(path, text, &e, &at))?;
    scenario.path = path.to_path_buf();
    Ok(scenario)
}

/// Where and what a deserialization error of `text` is: the value it is about (the field a check names, else where the
/// reader was) and the message led by the field path.
pub(super) fn error_at(path: &Path, text: &str, e: &serde_json::Error, at: &ErrorAt) -> ScenarioError {
    // serde_json appends " at line L column C"; the position goes in front instead, as compilers print it.
    let full = e.to_string();
    let bare = full.rfind(" at line ").map_or(full.as_str(), |i| &full[..i]);
    let tracked = render(&at.path);
    // A key's error is where the reader stopped, just past the key (the top level checks its keys itself, so its
    // errors about keys are known by serde's wording).
    let in_key = at.in_key || bare.starts_with("unknown field") || bare.starts_with("duplicate field");
    let (message, field) = match message::leading_path(bare) {
        Some(field) => (bare.to_string(), Some(locate::parse_path(field))),
        None if tracked.is_empty() => (bare.to_string(), (!in_key).then(Vec::new)),
        None => (format!("{tracked}: {bare}"), (!in_key).then(|| at.path.clone())),
    };
    // A syntax error is where the reader stopped; an error about a value is at that value.
    let about_a_value = e.classify() == serde_json::error::Category::Data;
    let offset = field.filter(|_| about_a_value).and_then(|f| locate::locate(text.as_bytes(), &f));
    match offset {
        Some(offset) => ScenarioError::at(path, text.as_bytes(), offset, &message),
        None => ScenarioError::Parse {
            path: path.to_path_buf(),
            line: e.line(),
            column: e.column(),
            message: shorten(&message),
        },
    }
}

/// A path as messages write it (`params.tasks[0].name`), long keys cut.
fn render(path: &[strict::Segment]) -> String {
    let mut out = String::new();
    for segment in path {
        match segment {
            strict::Segment::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(&message::clip(k));
            }
            strict::Segment::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

/// Parse one scenario from text and read what it names (a corpus, next to `path`).
pub fn load_str(path: &Path, text: &str) -> Result<Scenario, ScenarioError> {
    let mut scenario = parse_str(path, text)?;
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
    let bytes = read_limited(path, MAX_SCENARIO_BYTES, "a scenario")?;
    load_str(path, utf8(path, &bytes)?)
}

/// Fuzz entry: arbitrary bytes through the scenario reader (size limit, UTF-8, parse and every check) and through
/// both corpus line readers, all in memory (no file is opened: a corpus a scenario names is not read).
pub fn fuzz_scenario(data: &[u8]) {
    let path = Path::new("fuzz.json");
    if let Ok(text) = utf8(path, data) {
        let _ = parse_str(path, text);
    }
    let _ = super::corpus::parse_bytes(path, data, false);
    let _ = super::corpus::parse_bytes(path, data, true);
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
        // the folder's schema and its kill map (`kvproof mutants`) sit beside the scenarios
        let is_schema = p.file_name().is_some_and(|n| n == "schema.json" || n == "kills.json");
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
    use kvproof_engines::scratch_dir::ScratchDir;

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

    #[test]
    fn every_shipped_scenario_still_loads() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios");
        let mut loaded = 0;
        for folder in std::fs::read_dir(&root).expect("scenarios/") {
            let folder = folder.expect("entry").path();
            if !folder.is_dir() || collect_files(&folder).is_err() {
                continue;
            }
            for file in collect_files(&folder).expect("files") {
                load_file(&file).unwrap_or_else(|e| panic!("{e}"));
                loaded += 1;
            }
        }
        assert!(loaded > 10, "{loaded} scenarios found");
    }

    /// Every struct of the format, written as an array instead of an object: each is refused at the array.
    #[test]
    fn structs_are_never_read_from_arrays() {
        let agentic = |tasks: &str| {
            format!(
                r#"{{"name": "s", "engine": {{"arch": "inkling"}}, "kind": "agentic", "params": {{"tasks": {tasks}}}}}"#
            )
        };
        let task = r#"{"name": "t", "system": "s", "request": "r", "tools": ["run_tests"], "tests": %}"#;
        let cases = [
            (r#"{"name": "s", "engine": {"arch": "inkling"}, "kind": "stress-pairs", "params": []}"#, "params"),
            (r#"{"name": "s", "engine": {"arch": "inkling"}, "kind": "stress-pairs", "params": [5]}"#, "params"),
            (r#"{"name": "s", "engine": ["inkling"], "kind": "boundary-matrix"}"#, "engine"),
            (r#"{"name": "s", "engine": {"arch": "inkling"}, "kind": "boundary-matrix", "assert": []}"#, "assert"),
            (r#"{"name": "s", "engine": {"arch": "inkling"}, "kind": "growth-curve", "params": [3]}"#, "params"),
            (&agentic(r#"[["t", "s", "r", ["finish"]]]"#), "params.tasks[0]"),
            (&agentic(&format!("[{}]", task.replace('%', r#"[["c", "f", "x"]]"#))), "params.tasks[0].tests[0]"),
            ("[\"s\", {\"arch\": \"inkling\"}, 0, \"boundary-matrix\"]", "a scenario object"),
        ];
        for (text, field) in cases {
            let msg = refused(parse(text));
            assert!(msg.contains(field) && msg.contains("expected"), "{text}: {msg}");
            let at = text.find('[').expect("an array") + 1;
            // the column of the array the object was expected at (or of the inner array for nested ones)
            let inner = text.rfind("[[").map_or(at, |i| i + 2);
            assert!(
                msg.starts_with(&format!("s.json:1:{at}:")) || msg.starts_with(&format!("s.json:1:{inner}:")),
                "{text}: {msg}"
            );
        }
    }

    #[test]
    fn range_errors_point_at_the_value_and_name_the_field() {
        let text = "{\"name\": \"s\", \"engine\": {\"arch\": \"inkling\"}, \"kind\": \"stress-pairs\",\n\
                    \"params\": {\n  \"max_tokens\": 4,\n  \"pairs\": 0,\n  \"slot\": 0\n}}";
        let msg = parse(text).expect_err("pairs 0").to_string();
        assert!(msg.starts_with("s.json:4:12: params.pairs:"), "{msg}");
        let text =
            "{\"name\": \"s\", \"kind\": \"boundary-matrix\",\n\"assert\": {\"confidence\": 1.5, \"state\": true},\n\
                    \"engine\": {\"arch\": \"inkling\"}}";
        let msg = parse(text).expect_err("confidence").to_string();
        assert!(msg.starts_with("s.json:2:26: assert.confidence:"), "{msg}");
        let text =
            "{\"name\": \"s\", \"kind\": \"boundary-matrix\", \"engine\": {\"url\": \"http://127.0.0.1:1/v1\",\n\
                    \"reset\": \"none\",\n\"cold\": {\"bypass_slot\": 0}}}";
        let msg = parse(text).expect_err("bypass slot").to_string();
        assert!(msg.starts_with("s.json:3:25: engine.cold.bypass_slot:"), "{msg}");
    }

    #[test]
    fn a_bound_over_the_expected_warm_ratio_at_or_below_one_is_refused_naming_file_and_field() {
        for bad in ["1", "1.0", "0.5", "0", "-2"] {
            let text = format!(
                "{{\"name\": \"g\", \"engine\": {{\"arch\": \"inkling\"}}, \"kind\": \"growth-curve\",\n\
                 \"assert\": {{\"max_warm_ratio_over_expected\": {bad}}}}}"
            );
            let msg = parse(&text).expect_err(bad).to_string();
            assert!(msg.starts_with("s.json:2:"), "{bad}: {msg}");
            assert!(msg.contains("assert.max_warm_ratio_over_expected:"), "{bad}: {msg}");
        }
        let ok = r#"{"name": "g", "engine": {"arch": "inkling"}, "kind": "growth-curve",
                     "assert": {"max_warm_ratio_over_expected": 1.5, "require": ["warm-growth"]}}"#;
        let s = parse(ok).expect("a bound above 1");
        assert_eq!(s.assertions.max_warm_ratio_over_expected, Some(1.5));
        for (text, needle) in [
            (
                r#"{"name": "g", "engine": {"arch": "inkling"}, "kind": "stress-pairs",
                    "assert": {"max_warm_ratio_over_expected": 1.5}}"#,
                "assert.max_warm_ratio_over_expected: applies to kind growth-curve only",
            ),
            (
                r#"{"name": "g", "engine": {"arch": "inkling"}, "kind": "growth-curve",
                    "assert": {"require": ["warm-growth"]}}"#,
                "assert.require: `warm-growth` is judged only on a growth curve with \
                 assert.max_warm_ratio_over_expected",
            ),
            (
                r#"{"name": "g", "engine": {"arch": "inkling"}, "kind": "stress-pairs",
                    "assert": {"require": ["rate"]}}"#,
                "assert.require: `rate` is judged only on a scenario with assert.max_failure_rate",
            ),
        ] {
            let msg = parse(text).expect_err(needle).to_string();
            assert!(msg.starts_with("s.json:") && msg.contains(needle), "{msg}");
        }
    }

    #[test]
    fn a_value_of_the_wrong_type_says_what_is_expected() {
        let msg = parse(r#"{"name": "s", "engine": {"arch": "inkling"}, "kind": 5}"#).expect_err("kind 5").to_string();
        assert!(msg.starts_with("s.json:1:54: kind:"), "{msg}");
        assert!(msg.contains("expected a string") && msg.contains("`boundary-matrix`"), "{msg}");
        let text =
            r#"{"name": "s", "engine": {"arch": "inkling"}, "kind": "boundary-matrix", "params": {"cases": [true]}}"#;
        let msg = parse(text).expect_err("case true").to_string();
        assert!(
            msg.contains("params.cases[0]") && msg.contains("expected a string") && msg.contains("`extend`"),
            "{msg}"
        );
    }

    /// File `name` holding `bytes`, in a scratch folder of its own (removed when the folder is dropped).
    fn temp_file(name: &str, bytes: &[u8]) -> (ScratchDir, PathBuf) {
        let dir = ScratchDir::new(&format!("load-{}-{name}", std::process::id()));
        let p = dir.join(name);
        std::fs::write(&p, bytes).expect("write");
        (dir, p)
    }

    #[test]
    fn a_file_that_is_not_utf8_gets_the_line_and_column_of_the_bad_byte() {
        let (_dir, p) = temp_file("latin1.json", b"{\"name\": \"a\",\n \"description\": \"caf\xe9\"}");
        let msg = load_file(&p).expect_err("latin-1").to_string();
        assert!(msg.starts_with(&format!("{}:2:21:", p.display())) && msg.contains("UTF-8"), "{msg}");
    }

    /// The error of a load that must fail, without printing what it loaded (which may be huge) when it did not.
    fn refused(result: Result<Scenario, ScenarioError>) -> String {
        match result {
            Ok(s) => panic!(
                "loaded: `{}` ({} bytes of description)",
                &s.name[..s.name.len().min(40)],
                s.description.map_or(0, |d| d.len())
            ),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn an_oversized_file_is_refused() {
        let big = format!(
            r#"{{"name": "s", "engine": {{"arch": "inkling"}}, "kind": "boundary-matrix", "description": "{}"}}"#,
            "x".repeat(MAX_SCENARIO_BYTES as usize)
        );
        let (_dir, p) = temp_file("big.json", big.as_bytes());
        let msg = refused(load_file(&p));
        assert!(msg.contains(&format!("at most {MAX_SCENARIO_BYTES} bytes")), "{}", &msg[..msg.len().min(300)]);
    }

    #[test]
    fn an_overlong_name_is_refused_and_not_echoed_whole() {
        let long = "n".repeat(MAX_NAME_LEN + 1);
        let text = format!(r#"{{"name": "{long}", "engine": {{"arch": "inkling"}}, "kind": "boundary-matrix"}}"#);
        let msg = refused(parse(&text));
        assert!(msg.starts_with("s.json:1:10: name:") && msg.contains(&format!("at most {MAX_NAME_LEN}")), "{msg}");
        assert!(msg.len() < 400, "the name is not echoed whole: {} bytes", msg.len());
    }

    #[test]
    fn a_huge_unknown_key_or_variant_is_not_echoed_whole() {
        let key = "k".repeat(1_000_000);
        let text = format!(r#"{{"name": "s", "{key}": 1}}"#);
        let msg = refused(parse(&text));
        assert!(msg.contains("unknown field") && msg.contains("1000000 bytes"), "{}", &msg[..msg.len().min(300)]);
        assert!(msg.len() < 1000, "the key is not echoed whole: {} bytes", msg.len());
        let text = format!(
            r#"{{"name": "s", "engine": {{"arch": "inkling"}}, "kind": "boundary-matrix", "params": {{"cases": ["{key}"]}}}}"#
        );
        let msg = refused(parse(&text));
        assert!(msg.contains("unknown variant") && msg.len() < 1000, "{}", &msg[..msg.len().min(300)]);
    }

    /// The fuzz target's seed corpus: each file through the entry point, the scenarios loading (or, the near-valid
    /// ones, refused), and every prefix and a byte flip at each position never panicking.
    #[test]
    fn fuzz_seeds_run_through_the_entry_point() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/scenario");
        let mut seeds: Vec<PathBuf> =
            std::fs::read_dir(&dir).expect("fuzz/corpus/scenario").map(|e| e.expect("entry").path()).collect();
        seeds.sort();
        assert!(seeds.len() >= 3, "{seeds:?}");
        for seed in seeds {
            let bytes = std::fs::read(&seed).expect("seed");
            let name = seed.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            fuzz_scenario(&bytes);
            let text = std::str::from_utf8(&bytes).expect("UTF-8 seed");
            match name.rsplit_once('.') {
                Some((_, "json")) => assert_eq!(parse_str(&seed, text).is_ok(), !name.starts_with("near-"), "{name}"),
                _ => {
                    assert!(super::super::corpus::parse_bytes(&seed, &bytes, name.contains("stale")).is_ok(), "{name}")
                }
            }
            for cut in 0..bytes.len() {
                fuzz_scenario(&bytes[..cut]);
                let mut flipped = bytes.clone();
                flipped[cut] ^= 0x5a;
                fuzz_scenario(&flipped);
            }
        }
    }
}
