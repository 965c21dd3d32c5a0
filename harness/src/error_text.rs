//! An error as one line for the terminal: the message and each cause after it, where a cause whose text the
//! message before it already holds is left out (many messages embed their source as `{path}: {source}`, and
//! printing the chain as well would say it twice).

use std::fmt::Write;

/// `e` and its causes, joined by ": ", every text printed once.
pub fn render(e: &anyhow::Error) -> String {
    let mut out = String::new();
    let mut previous = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !previous.is_empty() && previous.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        let _ = write!(out, "{text}");
        previous = text;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("{path}: {source}")]
    struct Embeds {
        path: String,
        source: std::io::Error,
    }

    #[test]
    fn a_cause_the_message_holds_is_printed_once() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let e = anyhow::Error::new(Embeds { path: "a/run.json".into(), source: io });
        assert_eq!(render(&e), "a/run.json: no such file");
        let e = e.context("reading the report");
        assert_eq!(render(&e), "reading the report: a/run.json: no such file");
    }

    #[test]
    fn a_cause_the_message_does_not_hold_is_kept() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let e = anyhow::Error::new(io).context("writing x");
        assert_eq!(render(&e), "writing x: no such file");
    }
}
