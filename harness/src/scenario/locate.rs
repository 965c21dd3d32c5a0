//! Where a value is in a scenario file's text: errors found after a value was read (a range check, a slot the
//! engine does not have) point at the value, not at the end of the object that held it. Only run for an error,
//! over text serde_json has read up to that value; a scan without recursion, so no input can exhaust the stack.

use super::strict::Segment;

/// The 1-based line and column (in bytes, as serde_json counts them) of byte `offset` of `text`.
pub fn line_column(text: &[u8], offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let column = before.len() - before.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1) + 1;
    (line, column)
}

/// The byte offset where the value at `path` starts, if the text holds it.
pub fn locate(text: &[u8], path: &[Segment]) -> Option<usize> {
    let mut at = skip_ws(text, 0);
    for segment in path {
        at = match (text.get(at)?, segment) {
            (b'{', Segment::Key(key)) => member(text, at, key)?,
            (b'[', Segment::Index(index)) => element(text, at, *index)?,
            _ => return None,
        };
    }
    Some(at)
}

/// `path` as messages write it: `params.tasks[0].name`.
pub fn parse_path(path: &str) -> Vec<Segment> {
    let mut out = Vec::new();
    for part in path.split('.') {
        let (key, mut indices) = part.split_once('[').map_or((part, ""), |(k, rest)| (k, rest));
        if !key.is_empty() {
            out.push(Segment::Key(key.to_string()));
        }
        while let Some((index, rest)) = indices.split_once(']') {
            match index.parse() {
                Ok(i) => out.push(Segment::Index(i)),
                Err(_) => return out,
            }
            indices = rest.strip_prefix('[').unwrap_or(rest);
        }
    }
    out
}

fn skip_ws(text: &[u8], mut at: usize) -> usize {
    while text.get(at).is_some_and(|b| b.is_ascii_whitespace()) {
        at += 1;
    }
    at
}

/// The offset just past the string starting at `at` (a `"`).
fn skip_string(text: &[u8], mut at: usize) -> Option<usize> {
    at += 1;
    loop {
        match text.get(at)? {
            b'"' => return Some(at + 1),
            b'\\' => at += 2,
            _ => at += 1,
        }
    }
}

/// The offset just past the value starting at `at`.
fn skip_value(text: &[u8], at: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut at = at;
    loop {
        match text.get(at)? {
            b'"' => at = skip_string(text, at)?,
            b'{' | b'[' => {
                depth += 1;
                at += 1;
            }
            b'}' | b']' => {
                depth = depth.checked_sub(1)?;
                at += 1;
            }
            _ if depth == 0 => {
                // a number or a literal: up to the next delimiter
                while text.get(at).is_some_and(|b| !matches!(b, b',' | b'}' | b']') && !b.is_ascii_whitespace()) {
                    at += 1;
                }
                return Some(at);
            }
            _ => at += 1,
        }
        if depth == 0 {
            return Some(at);
        }
    }
}

/// The start of member `key`'s value in the object at `at`.
fn member(text: &[u8], at: usize, key: &str) -> Option<usize> {
    let mut at = skip_ws(text, at + 1);
    loop {
        if text.get(at)? != &b'"' {
            return None;
        }
        let end = skip_string(text, at)?;
        let raw = std::str::from_utf8(&text[at..end]).ok()?;
        let found = if raw.contains('\\') {
            serde_json::from_str::<String>(raw).ok().is_some_and(|k| k == key)
        } else {
            &raw[1..raw.len() - 1] == key
        };
        at = skip_ws(text, end);
        if text.get(at)? != &b':' {
            return None;
        }
        at = skip_ws(text, at + 1);
        if found {
            return Some(at);
        }
        at = skip_ws(text, skip_value(text, at)?);
        match text.get(at)? {
            b',' => at = skip_ws(text, at + 1),
            _ => return None,
        }
    }
}

/// The start of element `index` of the array at `at`.
fn element(text: &[u8], at: usize, index: usize) -> Option<usize> {
    let mut at = skip_ws(text, at + 1);
    for _ in 0..index {
        if matches!(text.get(at)?, b']') {
            return None;
        }
        at = skip_ws(text, skip_value(text, at)?);
        match text.get(at)? {
            b',' => at = skip_ws(text, at + 1),
            _ => return None,
        }
    }
    (text.get(at)? != &b']').then_some(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str, path: &str) -> Option<(usize, usize)> {
        locate(text.as_bytes(), &parse_path(path)).map(|o| line_column(text.as_bytes(), o))
    }

    #[test]
    fn finds_values_by_path() {
        let text = "{\"a\": {\"b\": [1, {\"c\": \"x,}]\"}, [2]],\n  \"d\\u0065\": true}, \"e\": -1.5e3}";
        assert_eq!(at(text, "a.b[1].c"), Some((1, 23)));
        assert_eq!(at(text, "a.b[2][0]"), Some((1, 33)));
        assert_eq!(at(text, "a.de"), Some((2, 14)));
        assert_eq!(at(text, "e"), Some((2, 26)));
        assert_eq!(at(text, ""), Some((1, 1)));
        for missing in ["x", "a.b[3]", "a.b.c", "a[0]", "e.f"] {
            assert_eq!(at(text, missing), None, "{missing}");
        }
    }

    #[test]
    fn truncated_or_odd_text_finds_nothing_and_never_panics() {
        for text in ["", "{", "{\"a\"", "{\"a\":", "[", "{\"a\": [1, ", "\"", "{\"a\": \"\\", "}}}"] {
            for path in ["a", "a[0]", "[0]", "a.b"] {
                let _ = at(text, path);
            }
        }
        assert_eq!(
            parse_path("params.tasks[0].tests[12]"),
            vec![
                Segment::Key("params".into()),
                Segment::Key("tasks".into()),
                Segment::Index(0),
                Segment::Key("tests".into()),
                Segment::Index(12),
            ]
        );
    }
}
