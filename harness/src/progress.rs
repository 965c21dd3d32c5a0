//! A progress bar on a terminal; nothing at all on CI or when output is not a terminal (logs stay clean).

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

#[derive(Debug, Clone)]
pub struct Progress {
    bar: ProgressBar,
}

/// Whether a bar should be drawn: stderr is a terminal and `CI` is not set (CI systems set `CI=true`).
pub fn wanted() -> bool {
    let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0");
    std::io::stderr().is_terminal() && !ci
}

impl Progress {
    pub fn new(total: u64, enabled: bool) -> Self {
        if !enabled {
            return Progress::hidden();
        }
        let bar = ProgressBar::new(total);
        if let Ok(style) =
            ProgressStyle::with_template("{prefix:>20} [{bar:30}] {pos}/{len} turns {elapsed_precise} {msg}")
        {
            bar.set_style(style.progress_chars("=> "));
        }
        Progress { bar }
    }

    pub fn hidden() -> Self {
        Progress { bar: ProgressBar::hidden() }
    }

    pub fn set_prefix(&self, prefix: &str) {
        self.bar.set_prefix(prefix.to_string());
    }

    pub fn inc(&self, n: u64) {
        self.bar.inc(n);
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
