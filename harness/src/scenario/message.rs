//! The text of a scenario error: what the file said is quoted back only in part (a 10 MB key is not printed
//! whole), and the field path a message starts with is found so the loader can point at that value.

/// A quoted key, name or value longer than this many bytes is cut.
pub const MAX_ECHO: usize = 64;
/// A whole message longer than this many bytes is cut.
pub const MAX_MESSAGE: usize = 1024;

/// `message` with every `quoted` or "quoted" span longer than `MAX_ECHO` cut to its start, an ellipsis and its
/// length, and the whole cut to `MAX_MESSAGE`.
pub fn shorten(message: &str) -> String {
    let mut out = String::with_capacity(message.len().min(MAX_MESSAGE + 64));
    let mut rest = message;
    while let Some(open) = rest.find(['`', '"']) {
        let quote = rest[open..].chars().next().unwrap_or('"');
        out.push_str(&rest[..=open]);
        let inner = &rest[open + 1..];
        let Some(close) = inner.find(quote) else {
            rest = inner;
            break;
        };
        out.push_str(&clip(&inner[..close]));
        out.push(quote);
        rest = &inner[close + 1..];
        if out.len() > MAX_MESSAGE {
            break;
        }
    }
    out.push_str(&clip_to(rest, MAX_MESSAGE.saturating_sub(out.len()).max(MAX_ECHO)));
    if out.len() > MAX_MESSAGE {
        let cut = floor_char_boundary(&out, MAX_MESSAGE);
        out.truncate(cut);
        out.push('…');
    }
    out
}

/// `text` itself when short, else its start, an ellipsis and its length.
pub fn clip(text: &str) -> String {
    clip_to(text, MAX_ECHO)
}

fn clip_to(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let cut = floor_char_boundary(text, max / 2);
    format!("{}… ({} bytes)", &text[..cut], text.len())
}

fn floor_char_boundary(text: &str, mut at: usize) -> usize {
    at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// The field path a message starts with (`params.pairs: 0 is not in ...` → `params.pairs`): every check of the
/// format names its field that way.
pub fn leading_path(message: &str) -> Option<&str> {
    let (head, _) = message.split_once(": ")?;
    let top = head.split(['.', '[']).next()?;
    let known = super::types::FIELDS.contains(&top);
    let plain = head.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '[' | ']' | '$'));
    (known && plain).then_some(head)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_quotes_are_cut_and_short_ones_kept() {
        let key = "k".repeat(10 << 20);
        let msg = shorten(&format!("unknown field `{key}`, expected one of `name`, `engine`"));
        assert!(msg.starts_with("unknown field `kkkk") && msg.contains(&format!("… ({} bytes)`", key.len())), "{msg}");
        assert!(msg.ends_with(", expected one of `name`, `engine`"), "{msg}");
        assert!(msg.len() < 200, "{msg}");
        let msg = shorten(&format!("invalid type: string \"{key}\", expected an object"));
        assert!(msg.len() < 200 && msg.ends_with("expected an object"), "{msg}");
        assert_eq!(shorten("plain `short` text"), "plain `short` text");
        let unclosed = shorten(&format!("a `{}", "é".repeat(5000)));
        assert!(unclosed.len() <= MAX_MESSAGE + 40, "{}", unclosed.len());
        assert!(shorten(&"x".repeat(1 << 20)).len() <= MAX_MESSAGE + 40);
    }

    #[test]
    fn the_leading_path_is_a_field_of_the_format() {
        assert_eq!(leading_path("params.tasks[0].name: `a` is empty"), Some("params.tasks[0].name"));
        assert_eq!(leading_path("engine: give only one of"), Some("engine"));
        assert_eq!(leading_path("invalid type: string"), None);
        assert_eq!(leading_path("kind boundary: x"), None);
    }
}
