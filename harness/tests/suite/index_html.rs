//! `index.html` of a run folder: one self-contained page that opens from the file system — every plot inline as
//! SVG, every link relative and resolving to a file of the run, nothing fetched from a network — and, when a
//! Chromium is installed, a headless screenshot through ci/screenshot-index.sh.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support;
use support::{kvproof, repo, text, tmp};

/// A run with a growth curve, semantic staleness and a bounded stress scenario (tiny engines, a few seconds).
fn make_run(dir: &Path) -> PathBuf {
    let scenarios = dir.join("scenarios");
    std::fs::create_dir_all(&scenarios).expect("dir");
    let files = [
        (
            "a-growth.json",
            r#"{"name": "growth", "engine": {"arch": "inkling", "preset": "tiny"}, "kind": "growth-curve", "seed": 1,
                "params": {"turns": 5, "opening": 20, "user_len": 20, "max_tokens": 8, "repeats": 2}}"#,
        ),
        (
            "b-stale.json",
            r#"{"name": "stale <glm>", "engine": {"arch": "glm", "preset": "tiny"}, "kind": "semantic-staleness",
                "seed": 1, "params": {"cases": 2}}"#,
        ),
        (
            "c-stress.json",
            r#"{"name": "stress", "engine": {"arch": "inkling", "preset": "tiny"}, "kind": "stress-pairs", "seed": 1,
                "params": {"pairs": 12}, "assert": {"max_failure_rate": 0.5}}"#,
        ),
    ];
    for (name, body) in files {
        std::fs::write(scenarios.join(name), body).expect("write scenario");
    }
    let out = dir.join("run");
    let o = kvproof().arg("run").arg(&scenarios).arg("--out").arg(&out).output().expect("run");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    out
}

/// Every value of `attr="..."` in `html`.
fn attrs<'a>(html: &'a str, attr: &str) -> Vec<&'a str> {
    let pat = format!(" {attr}=\"");
    html.match_indices(&pat)
        .map(|(i, _)| {
            let rest = &html[i + pat.len()..];
            &rest[..rest.find('"').unwrap_or(0)]
        })
        .collect()
}

fn unescape_path(href: &str) -> String {
    let bytes = href.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            out.push(u8::from_str_radix(&href[i + 1..i + 3], 16).expect("percent escape"));
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).expect("utf8")
}

#[test]
fn the_page_inlines_every_plot_and_links_only_to_files_of_the_run() {
    let dir = tmp("page");
    let run = make_run(&dir);
    // a provenance file from a captured case: the page must link it
    std::fs::create_dir_all(run.join("provenance/case-1")).expect("dir");
    std::fs::write(run.join("provenance/case-1/diff.txt"), "layer 0\n").expect("write");
    let o = kvproof().arg("report").arg(&run).output().expect("report");
    assert_eq!(o.status.code(), Some(0));

    let html = std::fs::read_to_string(run.join("index.html")).expect("index.html");
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(html.contains("content=\"default-src 'none'; style-src 'unsafe-inline'\""), "no-network policy");
    assert!(html.contains("<span class=\"badge pass\">PASS</span>"));
    assert!(html.contains("stale &lt;glm&gt;"), "names are escaped");
    assert!(!html.contains("<script") && !html.contains("<img") && !html.contains("<link"));

    // one inline figure per SVG in plots/, each linking its SVG and PNG
    let mut svgs: Vec<String> = std::fs::read_dir(run.join("plots"))
        .expect("plots")
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .filter(|n| n.ends_with(".svg"))
        .collect();
    svgs.sort();
    assert_eq!(
        svgs,
        ["bounds.svg", "growth-reuse-growth.svg", "growth-wall-growth.svg", "staleness-stale-glm.svg"],
        "plots drawn"
    );
    assert_eq!(html.matches("<figure").count(), svgs.len());
    assert_eq!(html.matches("<svg").count(), svgs.len(), "every plot inline");
    let scalable = html
        .match_indices("<svg")
        .filter(|(i, _)| html[*i..].split('>').next().is_some_and(|t| t.contains(" viewBox=\"0 0 ")));
    assert_eq!(scalable.count(), svgs.len(), "every inline SVG has a viewBox, so CSS can scale it");
    for s in &svgs {
        assert!(html.contains(&format!("href=\"plots/{s}\"")), "{s} not linked");
    }

    // every link is relative and names a file of the run
    let hrefs = attrs(&html, "href");
    assert!(hrefs.len() >= 15, "{hrefs:?}");
    for h in &hrefs {
        assert!(!h.contains("://") && !h.starts_with('/'), "not relative: {h}");
        let target = run.join(unescape_path(h));
        assert!(target.exists(), "{h} does not resolve to a file of the run");
    }
    for f in ["summary.md", "junit.xml", "run.json", "results.jsonl", "turns.csv", "growth.csv", "staleness.csv"] {
        assert!(hrefs.contains(&f), "{f} not linked");
    }
    assert!(hrefs.contains(&"provenance/case-1/diff.txt"), "provenance not linked");
    // the only URLs on the page are SVG namespace names, which are never fetched
    let urls = html.matches("http://").count() + html.matches("https://").count();
    assert_eq!(urls, html.matches("xmlns=\"http://www.w3.org/2000/svg\"").count(), "a URL other than xmlns");
    assert!(html.contains("Growth curves") && html.contains("Semantic staleness"));
}

/// Headless Chromium renders the page from the file system: the screenshot exists and is not a blank page.
#[test]
#[ignore = "needs a headless Chromium; .ci/run installs it and runs the ignored tests"]
fn headless_chromium_renders_the_page() {
    let chrome = std::env::var("CHROME").ok().or_else(|| {
        ["chromium", "chromium-browser", "google-chrome"]
            .into_iter()
            .find(|c| {
                Command::new("sh").arg("-c").arg(format!("command -v {c}")).output().is_ok_and(|o| o.status.success())
            })
            .map(str::to_string)
    });
    let chrome = chrome.expect("no Chromium on this machine (apt-get install chromium, or set CHROME)");
    let dir = tmp("screenshot");
    let run = make_run(&dir);
    let png = dir.join("index.png");
    let o = Command::new("bash")
        .arg(repo().join("ci/screenshot-index.sh"))
        .arg(&run)
        .arg(&png)
        .env("CHROME", chrome)
        .output()
        .expect("screenshot script");
    assert!(o.status.success(), "{}", text(&o));
    let bytes = std::fs::read(&png).expect("screenshot");
    assert_eq!(&bytes[1..4], b"PNG");
    // 1280x2000 of text, tables and plots compresses to far more than a blank page would
    assert!(bytes.len() > 60_000, "screenshot of {} bytes looks blank", bytes.len());
}
