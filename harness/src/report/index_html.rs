//! `index.html` of a run folder: the verdict and summary tables, every plot inline (the SVG text itself, so the
//! page is one file that renders with no server and no network; a Content-Security-Policy forbids every fetch),
//! and relative links to the run's CSVs, JSONL, manifest and provenance files.

use std::fmt::Write as _;
use std::path::Path;

use super::manifest::Manifest;
use super::plots::Plot;
use super::summary::{ScenarioSummary, Summary};
use super::ReportError;
use crate::record::TrialRecord;
use crate::record::{Status, Verdict};
use crate::stats;

pub const INDEX: &str = "index.html";

/// Failing trials listed on the page (the rest are in results.jsonl).
const SHOWN_FAILURES: usize = 25;

/// Escaping for HTML text and attributes: the XML escaping JUnit files use is valid HTML5 too.
pub use super::junit::escape as esc;

/// A relative path as an href: every byte outside a safe set percent-encoded.
pub fn href(rel: &str) -> String {
    let mut out = String::new();
    for b in rel.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~/".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// An SVG file's markup, ready to inline: the XML prolog dropped, a viewBox added when missing (so CSS can scale
/// it), and nothing that could execute or fetch.
pub fn inline_svg(text: &str) -> Result<String, String> {
    let start = text.find("<svg").ok_or("no <svg> element")?;
    let mut svg = text[start..].trim_end().to_string();
    let lower = svg.to_ascii_lowercase();
    for bad in ["<script", "<foreignobject", "href=\"http", "href='http", "@import", "url(http"] {
        if lower.contains(bad) {
            return Err(format!("refusing to inline an SVG containing `{bad}`"));
        }
    }
    let open_end = svg.find('>').ok_or("unterminated <svg> tag")?;
    let open = &svg[..open_end];
    if !open.contains("viewBox") {
        let attr = |name: &str| -> Option<f64> {
            let at = open.find(&format!(" {name}=\""))? + name.len() + 3;
            let rest = &open[at..];
            rest[..rest.find('"')?].trim_end_matches("px").parse().ok()
        };
        if let (Some(w), Some(h)) = (attr("width"), attr("height")) {
            svg.insert_str(4, &format!(" viewBox=\"0 0 {w} {h}\""));
        }
    }
    Ok(svg)
}

const STYLE: &str = "
body { font-family: system-ui, -apple-system, 'Segoe UI', sans-serif; margin: 24px auto; max-width: 1180px;
       padding: 0 16px; color: #222; }
h1 { font-size: 1.5em; } h2 { margin-top: 1.6em; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
table { border-collapse: collapse; margin: 8px 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
.pass { color: #1a7f37; font-weight: bold; } .fail { color: #cf222e; font-weight: bold; }
.badge { display: inline-block; padding: 2px 10px; border-radius: 4px; color: #fff; }
.badge.pass { background: #1a7f37; color: #fff; } .badge.fail { background: #cf222e; color: #fff; }
figure { margin: 16px 0; border: 1px solid #e3e3e3; padding: 8px; }
figure svg { display: block; width: 100%; max-width: 900px; height: auto; }
figcaption { font-size: 0.9em; color: #555; margin-top: 4px; }
code { background: #f6f8fa; padding: 1px 4px; }
ul.files { columns: 2; }
";

fn verdict_span(pass: bool) -> &'static str {
    if pass {
        "<span class=\"pass\">pass</span>"
    } else {
        "<span class=\"fail\">FAIL</span>"
    }
}

fn scenario_rows(html: &mut String, summary: &Summary) {
    html.push_str(
        "<table><tr><th>scenario</th><th>kind</th><th>engine</th><th>passed</th><th>failed</th>\
         <th>inconclusive</th><th>errors</th><th>failure rate (upper bound)</th><th>limit</th><th>verdict</th></tr>\n",
    );
    for s in &summary.scenarios {
        let bound = s.bound.map_or_else(
            || "—".to_string(),
            |b| format!("≤ {} ({:.0}%)", stats::percent(b.upper), b.confidence * 100.0),
        );
        let limit = s.max_failure_rate.map_or_else(|| "any failure fails".to_string(), stats::percent);
        let _ = writeln!(
            html,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}/{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{}</td></tr>",
            esc(&s.name),
            esc(&s.kind),
            esc(&s.engine),
            s.passed,
            s.trials,
            s.failed,
            s.inconclusive,
            s.errors,
            esc(&bound),
            esc(&limit),
            verdict_span(s.pass)
        );
    }
    html.push_str("</table>\n");
    let failing: Vec<&ScenarioSummary> = summary.scenarios.iter().filter(|s| !s.reasons.is_empty()).collect();
    if !failing.is_empty() {
        html.push_str("<h3>Why it failed</h3><ul>\n");
        for s in failing {
            for r in &s.reasons {
                let _ = writeln!(html, "<li><b>{}</b>: {}</li>", esc(&s.name), esc(r));
            }
        }
        html.push_str("</ul>\n");
    }
}

fn growth_rows(html: &mut String, summary: &Summary) {
    let rows: Vec<_> = summary.scenarios.iter().filter_map(|s| s.growth.as_ref().map(|g| (s, g))).collect();
    if rows.is_empty() {
        return;
    }
    html.push_str(
        "<h2>Growth curves</h2><p>Per-turn wall time (median of repeats) from turn 2, the first turn with something \
         to reuse, to the last. The warm ratio is last/first of the least-squares line of wall time against context \
         (raw last/first of the two turns in brackets); the cold ratio is last/first of the medians; slopes are \
         least-squares.</p>\n<table><tr>\
         <th>scenario</th><th>context (tokens)</th><th>warm ms, fitted ratio (raw)</th><th>cold ms, ratio</th>\
         <th>slope warm / cold (ms per 1k tokens)</th><th>reused</th><th>prefill speedup / ideal</th>\
         <th>wall speedup</th><th>assertions</th></tr>\n",
    );
    for (s, g) in rows {
        let _ = writeln!(
            html,
            "<tr><td>{}</td><td>{} → {} ({:.1}x)</td><td>{:.0} → {:.0}, <b>{:.2}x</b> ({:.2}x)</td><td>{:.0} → {:.0}, \
             <b>{:.2}x</b></td><td>{:.1} / {:.1}</td><td>{:.1}%</td><td>{:.2}x / {:.2}x ({:.0}%)</td>\
             <td>{:.2}x</td><td>{}</td></tr>",
            esc(&s.name),
            g.context_first,
            g.context_last,
            g.context_growth,
            g.warm_first_ms,
            g.warm_last_ms,
            g.warm_ratio,
            g.warm_raw_ratio,
            g.cold_first_ms,
            g.cold_last_ms,
            g.cold_ratio,
            g.warm_slope_ms_per_ktok,
            g.cold_slope_ms_per_ktok,
            100.0 * g.reuse_fraction,
            g.prefill_speedup,
            g.ideal_speedup,
            100.0 * g.speedup_of_ideal,
            g.wall_speedup,
            verdict_span(g.violations.is_empty())
        );
    }
    html.push_str("</table>\n");
}

fn staleness_rows(html: &mut String, summary: &Summary) {
    let rows: Vec<_> = summary.scenarios.iter().filter_map(|s| s.staleness.as_ref().map(|g| (s, g))).collect();
    if rows.is_empty() {
        return;
    }
    html.push_str(
        "<h2>Semantic staleness</h2><p>Each warm reply: <i>fresh</i> (equals a cold run of the current prompt), \
         <i>stale(X)</i> (equals what stale context X produces) or <i>corrupt</i> (neither). Bounds are one-sided \
         Clopper–Pearson upper bounds over conclusive cases.</p>\n<table><tr><th>scenario</th><th>context</th>\
         <th>cases</th><th>fresh</th><th>stale</th><th>corrupt</th><th>inconclusive</th><th>errors</th>\
         <th>distinguishable</th><th>stale rate</th><th>corrupt rate</th><th>not fresh</th></tr>\n",
    );
    let b = |x: Option<stats::Bound>| x.map_or_else(|| "—".to_string(), |b| format!("≤ {}", stats::percent(b.upper)));
    for (s, st) in rows {
        for c in st.contexts.iter().chain(std::iter::once(&st.total)) {
            let _ = writeln!(
                html,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
                 <td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&s.name),
                esc(&c.context),
                c.cases,
                c.fresh,
                c.stale,
                c.corrupt,
                c.inconclusive,
                c.errors,
                c.distinguishable,
                esc(&b(c.stale_bound)),
                esc(&b(c.corrupt_bound)),
                esc(&b(c.not_fresh_bound)),
            );
        }
    }
    html.push_str("</table>\n");
}

fn figures(html: &mut String, dir: &Path, plots: &[Plot]) -> Result<(), ReportError> {
    if plots.is_empty() {
        return Ok(());
    }
    html.push_str("<h2>Plots</h2>\n");
    for p in plots {
        let path = dir.join(&p.svg);
        let text = std::fs::read_to_string(&path).map_err(|source| ReportError::Io { path: path.clone(), source })?;
        let svg = inline_svg(&text).map_err(|message| ReportError::Invalid { path: path.clone(), message })?;
        let png = p.png.as_ref().map_or_else(String::new, |png| format!(" · <a href=\"{}\">PNG</a>", href(png)));
        let _ = writeln!(
            html,
            "<figure id=\"{}\" data-group=\"{}\">{svg}<figcaption>{} — <a href=\"{}\">SVG</a>{png}</figcaption></figure>",
            esc(&p.svg),
            p.group,
            esc(&p.title),
            href(&p.svg)
        );
    }
    Ok(())
}

fn failures(html: &mut String, trials: &[TrialRecord]) {
    let failing: Vec<&TrialRecord> =
        trials.iter().filter(|t| matches!(t.verdict, Verdict::Fail | Verdict::Error)).collect();
    if failing.is_empty() {
        return;
    }
    let _ = writeln!(html, "<h2>Failing trials ({})</h2>", failing.len());
    for t in failing.iter().take(SHOWN_FAILURES) {
        let _ = writeln!(html, "<h3>{} / {} ({})</h3><ul>", esc(&t.scenario), esc(&t.name()), t.verdict.name());
        if let (Some(e), Some(r)) = (t.expected_reuse, t.reused) {
            let _ = writeln!(html, "<li>prompt {} tokens, reused {r}, expected {e}</li>", t.prompt_tokens);
        }
        if let Some(o) = &t.staleness {
            let _ = writeln!(html, "<li>classified <b>{}</b></li>", esc(&o.label()));
        }
        for c in t.checks.iter().filter(|c| c.status == Status::Fail) {
            let _ = writeln!(html, "<li><code>{}</code>: {}</li>", c.check, esc(&c.detail));
        }
        if let Some(e) = &t.error {
            let _ = writeln!(html, "<li>error: {}</li>", esc(e));
        }
        if let Some(p) = &t.provenance {
            let _ = writeln!(
                html,
                "<li>provenance: <a href=\"{}/\">{}</a> — {}</li>",
                href(&p.dir),
                esc(&p.dir),
                esc(&p.headline)
            );
        }
        html.push_str("</ul>\n");
    }
    if failing.len() > SHOWN_FAILURES {
        let _ = writeln!(html, "<p>… and {} more in results.jsonl.</p>", failing.len() - SHOWN_FAILURES);
    }
}

/// Every regular file under `dir/sub`, as paths relative to `dir`, sorted.
fn files_under(dir: &Path, sub: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.join(sub)];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Ok(r) = p.strip_prefix(dir) {
                out.push(r.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    out.sort();
    out
}

fn artifacts(html: &mut String, dir: &Path) {
    html.push_str("<h2>Files</h2><ul class=\"files\">\n");
    let described = [
        (super::SUMMARY, "summary (markdown, also the CI step summary)"),
        (super::JUNIT, "JUnit XML for CI test reports"),
        (super::RUN_JSON, "manifest: versions, seeds, engines, machine"),
        (super::RESULTS, "one JSON line per trial"),
        (super::TURNS, "one CSV row per request"),
        (super::growth::GROWTH_CSV, "growth curves, one row per turn"),
        (super::staleness::STALENESS_CSV, "semantic staleness, one row per case"),
    ];
    for (name, what) in described {
        if dir.join(name).is_file() {
            let _ = writeln!(html, "<li><a href=\"{}\">{}</a> — {what}</li>", href(name), esc(name));
        }
    }
    html.push_str("</ul>\n");
    let prov = files_under(dir, "provenance");
    if !prov.is_empty() {
        let _ = writeln!(html, "<h3>Provenance ({} files)</h3><ul class=\"files\">", prov.len());
        for f in prov {
            let _ = writeln!(html, "<li><a href=\"{}\">{}</a></li>", href(&f), esc(&f));
        }
        html.push_str("</ul>\n");
    }
}

/// The page for a run folder.
pub fn render(
    dir: &Path,
    manifest: &Manifest,
    summary: &Summary,
    trials: &[TrialRecord],
    plots: &[Plot],
) -> Result<String, ReportError> {
    let verdict = if summary.pass { "PASS" } else { "FAIL" };
    let mut html = String::new();
    let _ = write!(
        html,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>kvproof run {run}: {verdict}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n\
         <h1>kvproof run <code>{run}</code> <span class=\"badge {cls}\">{verdict}</span></h1>\n",
        run = esc(&summary.run),
        cls = if summary.pass { "pass" } else { "fail" },
    );
    let _ = writeln!(html, "<p>{}</p>", esc(&super::summary::totals_sentence(summary)));
    let finished = manifest.finished_unix.map_or_else(
        || "not finished".to_string(),
        |f| format!("{} UTC, {} s", super::manifest::stamp(f), f.saturating_sub(manifest.started_unix)),
    );
    let _ = writeln!(
        html,
        "<p>kvproof {} · engines {} · started {} UTC · finished {} · {} {} with {} CPUs{}</p>\n<p>command: \
         <code>{}</code></p>",
        esc(&manifest.kvproof_version),
        esc(&manifest.engines_version),
        super::manifest::stamp(manifest.started_unix),
        esc(&finished),
        esc(&manifest.machine.os),
        esc(&manifest.machine.arch),
        manifest.machine.cpus,
        summary.fault.as_ref().map_or_else(String::new, |f| format!(" · fault override <code>{}</code>", esc(f))),
        esc(&manifest.command.join(" "))
    );
    html.push_str("<h2>Scenarios</h2>\n");
    scenario_rows(&mut html, summary);
    growth_rows(&mut html, summary);
    staleness_rows(&mut html, summary);
    figures(&mut html, dir, plots)?;
    failures(&mut html, trials);
    artifacts(&mut html, dir);
    html.push_str(
        "<p>Rebuild this page and every summary from the artifacts with <code>kvproof report DIR</code>.</p>\n",
    );
    html.push_str("</body>\n</html>\n");
    Ok(html)
}

/// Write `index.html` into the run folder.
pub fn write(
    dir: &Path,
    manifest: &Manifest,
    summary: &Summary,
    trials: &[TrialRecord],
    plots: &[Plot],
) -> Result<(), ReportError> {
    let html = render(dir, manifest, summary, trials, plots)?;
    super::write_atomic(&dir.join(INDEX), html.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_and_encodes() {
        assert_eq!(esc("<a href=\"x\">&'"), "&lt;a href=&quot;x&quot;&gt;&amp;&apos;");
        assert_eq!(href("provenance/case 1/diff.csv"), "provenance/case%201/diff.csv");
        assert_eq!(href("plots/a\"b.svg"), "plots/a%22b.svg");
    }

    #[test]
    fn svgs_are_inlined_with_a_viewbox_and_refused_with_scripts() {
        let s = inline_svg("<?xml version=\"1.0\"?>\n<svg width=\"900\" height=\"540\" xmlns=\"x\"><rect/></svg>\n")
            .expect("inline");
        assert!(s.starts_with("<svg viewBox=\"0 0 900 540\" width=\"900\""), "{s}");
        assert!(inline_svg("<svg><script>alert(1)</script></svg>").is_err());
        assert!(inline_svg("not svg").is_err());
        let kept = inline_svg("<svg viewBox=\"0 0 1 1\"></svg>").expect("inline");
        assert_eq!(kept, "<svg viewBox=\"0 0 1 1\"></svg>");
    }
}
