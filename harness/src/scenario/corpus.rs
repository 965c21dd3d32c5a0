//! Conversations written as text for scenarios to draw their turns from (`params.corpus`, a JSON Lines file next
//! to the scenario): the engine meets them through its own tokenizer and chat template, as a user's engine meets
//! chat text, where kvproof's synthetic id sequences would miss what real text shows.
//!
//! Two shapes of line: a chat (`{"id", "system"?, "turns": [user messages]}`, for stress pairs and growth curves)
//! and a staleness case (`{"id", "system"?, "opening", "stale": [one or two messages], "current"}`: questions
//! whose fresh answers differ). Every line is checked as the file is read; errors name the file, line and column.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::ScenarioError;

/// A corpus file is read whole: a larger one is refused, not allocated.
pub const MAX_CORPUS_BYTES: u64 = 8 << 20;
/// One message, in bytes.
pub const MAX_MESSAGE_BYTES: usize = 16 << 10;

/// One conversation: the user's messages in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CorpusChat {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    pub turns: Vec<String>,
}

/// One staleness case: an opening, the stale context's message(s), and the current question.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CorpusStale {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    pub opening: String,
    pub stale: Vec<String>,
    pub current: String,
}

/// A corpus as a scenario holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Corpus {
    Chats(Vec<CorpusChat>),
    Stale(Vec<CorpusStale>),
}

/// What a scenario read: the file (for the manifest) and its lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadedCorpus {
    pub path: PathBuf,
    pub sha256: String,
    pub corpus: Corpus,
}

trait Line {
    fn id(&self) -> &str;
    fn messages(&self) -> Vec<&str>;
    fn check(&self) -> Result<(), String>;
}

impl Line for CorpusChat {
    fn id(&self) -> &str {
        &self.id
    }
    fn messages(&self) -> Vec<&str> {
        self.system.iter().chain(&self.turns).map(String::as_str).collect()
    }
    fn check(&self) -> Result<(), String> {
        if self.turns.is_empty() {
            return Err(format!("`{}`: `turns` is empty", self.id));
        }
        Ok(())
    }
}

impl Line for CorpusStale {
    fn id(&self) -> &str {
        &self.id
    }
    fn messages(&self) -> Vec<&str> {
        let mut m: Vec<&str> = self.system.iter().map(String::as_str).collect();
        m.push(&self.opening);
        m.extend(self.stale.iter().map(String::as_str));
        m.push(&self.current);
        m
    }
    fn check(&self) -> Result<(), String> {
        if !(1..=2).contains(&self.stale.len()) {
            return Err(format!("`{}`: `stale` holds {} messages, not 1 or 2", self.id, self.stale.len()));
        }
        if self.stale.contains(&self.current) {
            return Err(format!("`{}`: the current question repeats a stale one", self.id));
        }
        Ok(())
    }
}

fn parse<T: for<'de> Deserialize<'de> + Line>(path: &Path, text: &str) -> Result<Vec<T>, ScenarioError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = |column: usize, message: &str| ScenarioError::Parse {
            path: path.to_path_buf(),
            line: i + 1,
            column,
            message: super::message::shorten(message),
        };
        let item: T = super::strict::from_str(line).map_err(|(e, error_at)| {
            // the position within the line, moved to the line's place in the file
            match super::load::error_at(path, line, &e, &error_at) {
                ScenarioError::Parse { column, message, .. } => at(column, &message),
                other => other,
            }
        })?;
        item.check().map_err(|m| at(1, &m))?;
        super::types::check_name_len("id", item.id()).map_err(|m| at(1, &m))?;
        for m in item.messages() {
            if m.trim().is_empty() || m.len() > MAX_MESSAGE_BYTES {
                return Err(at(1, &format!("a message is empty or longer than {MAX_MESSAGE_BYTES} bytes")));
            }
        }
        out.push(item);
    }
    if out.is_empty() {
        return Err(ScenarioError::Parse { path: path.to_path_buf(), line: 1, column: 1, message: "no lines".into() });
    }
    Ok(out)
}

/// A corpus file's bytes as chats or (`stale`) staleness cases; `path` names it in errors.
pub fn parse_bytes(path: &Path, bytes: &[u8], stale: bool) -> Result<Corpus, ScenarioError> {
    if bytes.len() as u64 > MAX_CORPUS_BYTES {
        let size = bytes.len() as u64;
        return Err(ScenarioError::TooLarge { path: path.into(), size, max: MAX_CORPUS_BYTES, what: "a corpus" });
    }
    let text = super::load::utf8(path, bytes)?;
    Ok(if stale { Corpus::Stale(parse(path, text)?) } else { Corpus::Chats(parse(path, text)?) })
}

/// Read `file` (relative to the scenario's folder) as chats or as staleness cases.
pub fn load(scenario: &Path, file: &str, stale: bool) -> Result<LoadedCorpus, ScenarioError> {
    let path = scenario.parent().unwrap_or(Path::new(".")).join(file);
    let bytes = super::load::read_limited(&path, MAX_CORPUS_BYTES, "a corpus")?;
    let corpus = parse_bytes(&path, &bytes, stale)?;
    use sha2::Digest as _;
    let sha256 = sha2::Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
    Ok(LoadedCorpus { path, sha256, corpus })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvproof_engines::scratch_dir::ScratchDir;

    /// Writes corpus `name` into `dir`; the path of a scenario beside it (what corpus paths are relative to).
    fn write(dir: &Path, name: &str, text: impl AsRef<[u8]>) -> PathBuf {
        std::fs::write(dir.join(name), text).expect("write");
        dir.join("scenario.json")
    }

    #[test]
    fn chats_and_stale_cases_load_and_bad_lines_are_named() {
        let dir = ScratchDir::new(&format!("corpus-{}-lines", std::process::id()));
        let s = write(
            &dir,
            "c.jsonl",
            "{\"id\": \"a\", \"turns\": [\"hi\", \"more\"]}\n\n{\"id\": \"b\", \"turns\": [\"x\"]}\n",
        );
        let c = load(&s, "c.jsonl", false).expect("load");
        assert!(matches!(&c.corpus, Corpus::Chats(v) if v.len() == 2 && v[0].turns.len() == 2));
        assert_eq!(c.sha256.len(), 64);
        let s = write(&dir, "bad.jsonl", "{\"id\": \"a\", \"turns\": [\"hi\"]}\n{\"id\": \"b\", \"turn\": [\"x\"]}\n");
        let e = load(&s, "bad.jsonl", false).expect_err("unknown key").to_string();
        assert!(e.contains("bad.jsonl:2:") && e.contains("unknown field `turn`"), "{e}");
        let s = write(&dir, "empty.jsonl", "{\"id\": \"a\", \"turns\": []}\n");
        assert!(load(&s, "empty.jsonl", false).expect_err("empty").to_string().contains("empty.jsonl:1:"));
        let s =
            write(&dir, "s.jsonl", "{\"id\": \"q\", \"opening\": \"o\", \"stale\": [\"A?\"], \"current\": \"B?\"}\n");
        assert!(matches!(load(&s, "s.jsonl", true).expect("stale").corpus, Corpus::Stale(v) if v.len() == 1));
        let s = write(&dir, "s2.jsonl", "{\"id\": \"q\", \"opening\": \"o\", \"stale\": [], \"current\": \"B?\"}\n");
        assert!(load(&s, "s2.jsonl", true).expect_err("no stale").to_string().contains("not 1 or 2"));
        let s = write(&dir, "bin.jsonl", b"{\"id\": \"a\", \"turns\": [\"x\"]}\n\xff\xfe\n");
        let e = load(&s, "bin.jsonl", false).expect_err("binary").to_string();
        assert!(e.contains("bin.jsonl:2:1:") && e.contains("not UTF-8"), "{e}");
        assert!(load(&s, "missing.jsonl", false).expect_err("missing").to_string().contains("missing.jsonl"));
    }

    #[test]
    fn a_line_is_an_object_never_an_array_and_its_id_is_a_short_name() {
        let dir = ScratchDir::new(&format!("corpus-{}-objects", std::process::id()));
        let s = write(&dir, "arr.jsonl", "{\"id\": \"a\", \"turns\": [\"hi\"]}\n[\"b\", null, [\"x\"]]\n");
        let e = load(&s, "arr.jsonl", false).expect_err("an array line").to_string();
        assert!(e.contains("arr.jsonl:2:1:") && e.contains("expected an object"), "{e}");
        let s = write(&dir, "stale-arr.jsonl", "[\"q\", null, \"o\", [\"A?\"], \"B?\"]\n");
        let e = load(&s, "stale-arr.jsonl", true).expect_err("an array line").to_string();
        assert!(e.contains("expected an object"), "{e}");
        let long = "i".repeat(crate::scenario::MAX_NAME_LEN + 1);
        let s = write(&dir, "long-id.jsonl", format!("{{\"id\": \"{long}\", \"turns\": [\"x\"]}}\n"));
        let e = load(&s, "long-id.jsonl", false).expect_err("a long id").to_string();
        assert!(e.contains("long-id.jsonl:1:") && e.contains("id: ") && e.len() < 300, "{e}");
    }
}
