//! `index.html` of a run folder: the verdict and summary tables, every plot inline (the SVG text itself, so the
//! page is one file that renders with no server and no network; a Content-Security-Policy forbids every fetch),
//! and relative links to the run's CSVs, JSONL, manifest and provenance files.
//!
//! The markup is the template `index.html.j2`, rendered with minijinja and HTML auto-escaping: every value is
//! escaped unless it was checked here first (the inlined SVGs by [`inline_svg`], hrefs by [`href`]).

use std::fmt::Write as _;
use std::path::Path;

use minijinja::syntax::SyntaxConfig;
use minijinja::value::Value;
use minijinja::{context, AutoEscape, Environment, UndefinedBehavior};

use super::plots::Plot;
use super::ReportError;
use crate::record::Manifest;
use crate::record::Summary;
use crate::record::TrialRecord;
use crate::record::{Status, Verdict};
use crate::stats;

pub const INDEX: &str = "index.html";

/// Failing trials listed on the page (the rest are in results.jsonl).
const SHOWN_FAILURES: usize = 25;

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

/// The page's template: its markup and style; the values come from [`render`].
const TEMPLATE: &str = include_str!("index.html.j2");

fn bound_text(b: Option<stats::Bound>) -> String {
    b.map_or_else(|| "—".to_string(), |b| format!("≤ {}", stats::percent(b.upper)))
}

fn scenario_rows(summary: &Summary) -> Vec<Value> {
    summary
        .scenarios
        .iter()
        .map(|s| {
            let bound = s.bound.map_or_else(
                || "—".to_string(),
                |b| format!("≤ {} ({:.0}%)", stats::percent(b.upper), b.confidence * 100.0),
            );
            let limit = s.max_failure_rate.map_or_else(|| "any failure fails".to_string(), stats::percent);
            context! {
                name => s.name.as_str(),
                kind => s.kind.as_str(),
                engine => s.engine.as_str(),
                passed => s.passed,
                trials => s.trials,
                failed => s.failed,
                inconclusive => s.inconclusive,
                errors => s.errors,
                bound,
                limit,
                pass => s.pass,
            }
        })
        .collect()
}

fn reasons(summary: &Summary) -> Vec<Value> {
    summary
        .scenarios
        .iter()
        .flat_map(|s| s.reasons.iter().map(move |r| context! { scenario => s.name.as_str(), reason => r.as_str() }))
        .collect()
}

fn growth_rows(summary: &Summary) -> Vec<Value> {
    use super::growth::or_unknown;
    summary
        .scenarios
        .iter()
        .filter_map(|s| s.growth.as_ref().map(|g| (s, g)))
        .map(|(s, g)| {
            context! {
                name => s.name.as_str(),
                context_first => g.context_first,
                context_last => g.context_last,
                context_growth => format!("{:.1}", g.context_growth),
                warm_first_ms => format!("{:.0}", g.warm_first_ms),
                warm_last_ms => format!("{:.0}", g.warm_last_ms),
                warm_ratio => format!("{:.2}", g.warm_ratio),
                warm_raw_ratio => format!("{:.2}", g.warm_raw_ratio),
                expected_warm_ratio => or_unknown(g.expected_warm_ratio, 2, "x"),
                warm_over_expected => super::growth::over_expected_cell(g, ("", "")),
                expected_warm_slope => or_unknown(g.expected_warm_slope_ms_per_ktok, 1, ""),
                cost_ideal_speedup => or_unknown(g.cost_ideal_speedup, 2, "x"),
                cold_first_ms => format!("{:.0}", g.cold_first_ms),
                cold_last_ms => format!("{:.0}", g.cold_last_ms),
                cold_ratio => format!("{:.2}", g.cold_ratio),
                warm_slope => format!("{:.1}", g.warm_slope_ms_per_ktok),
                cold_slope => format!("{:.1}", g.cold_slope_ms_per_ktok),
                reused => format!("{:.1}", 100.0 * g.reuse_fraction),
                prefill_speedup => format!("{:.2}", g.prefill_speedup),
                ideal_speedup => format!("{:.2}", g.ideal_speedup),
                speedup_of_ideal => format!("{:.0}", 100.0 * g.speedup_of_ideal),
                speedup_of_token_ideal => format!("{:.0}", 100.0 * g.speedup_of_token_ideal),
                wall_speedup => format!("{:.2}", g.wall_speedup),
                steal => super::growth::steal_cell(g.steal),
                pass => g.violations.is_empty(),
            }
        })
        .collect()
}

fn staleness_rows(summary: &Summary) -> Vec<Value> {
    let mut rows = Vec::new();
    for (s, st) in summary.scenarios.iter().filter_map(|s| s.staleness.as_ref().map(|g| (s, g))) {
        for c in st.contexts.iter().chain(std::iter::once(&st.total)) {
            rows.push(context! {
                scenario => s.name.as_str(),
                context => c.context.as_str(),
                cases => c.cases,
                fresh => c.fresh,
                stale => c.stale,
                corrupt => c.corrupt,
                inconclusive => c.inconclusive,
                errors => c.errors,
                distinguishable => c.distinguishable,
                stale_bound => bound_text(c.stale_bound),
                corrupt_bound => bound_text(c.corrupt_bound),
                not_fresh_bound => bound_text(c.not_fresh_bound),
            });
        }
    }
    rows
}

fn agentic_rows(summary: &Summary) -> Vec<Value> {
    let mut rows = Vec::new();
    for (s, st) in summary.scenarios.iter().filter_map(|s| s.agentic.as_ref().map(|g| (s, g))) {
        for t in st.tasks.iter().chain(std::iter::once(&st.total)) {
            let rates: Vec<Value> = t
                .warm
                .assertions
                .iter()
                .zip(&t.cold.assertions)
                .map(|(w, c)| {
                    context! {
                        name => w.assertion.name(),
                        warm => super::agentic::rate_cell(w),
                        cold => super::agentic::rate_cell(c),
                        differ => w.held * c.applied.max(1) != c.held * w.applied.max(1),
                    }
                })
                .collect();
            rows.push(context! {
                scenario => s.name.as_str(),
                task => t.task.as_str(),
                sessions => t.sessions,
                parted => t.parted,
                turns => format!("{} / {}", t.warm.turns, t.cold.turns),
                calls => format!("{} / {}", t.warm.tool_calls, t.cold.tool_calls),
                solved => format!("{} / {}", t.warm.solved, t.cold.solved),
                reuse_share => format!("{:.1}", 100.0 * t.reuse_share()),
                lost => format!("{} of {} ({} turns)", t.lost, t.token_exact, t.turns_losing),
                rates,
            });
        }
    }
    rows
}

/// Every plot with its SVG read and checked by [`inline_svg`]: the one value the template writes unescaped.
fn figures(dir: &Path, plots: &[Plot]) -> Result<Vec<Value>, ReportError> {
    plots
        .iter()
        .map(|p| {
            let path = dir.join(&p.svg);
            let text =
                std::fs::read_to_string(&path).map_err(|source| ReportError::Io { path: path.clone(), source })?;
            let svg = inline_svg(&text).map_err(|message| ReportError::Invalid { path: path.clone(), message })?;
            Ok(context! {
                svg => p.svg.as_str(),
                group => p.group,
                title => p.title.as_str(),
                png => p.png.as_deref(),
                markup => Value::from_safe_string(svg),
            })
        })
        .collect()
}

fn failure(t: &TrialRecord) -> Value {
    let reuse = match (t.expected_reuse, t.reused) {
        (Some(e), Some(r)) => Some(format!("prompt {} tokens, reused {r}, expected {e}", t.prompt_tokens)),
        _ => None,
    };
    let checks: Vec<Value> = t
        .checks
        .iter()
        .filter(|c| c.status == Status::Fail)
        .map(|c| context! { check => c.check.to_string(), detail => c.detail.as_str() })
        .collect();
    context! {
        scenario => t.scenario.as_str(),
        name => t.name(),
        verdict => t.verdict.name(),
        reuse,
        classified => t.staleness.as_ref().map(|o| o.label()),
        checks,
        error => t.error.as_deref(),
        provenance => t.provenance.as_ref().map(|p| context! { dir => p.dir.as_str(), headline => p.headline.as_str() }),
    }
}

/// Every regular file under `dir/sub`, as paths relative to `dir`, sorted.
fn files_under(dir: &Path, sub: &str) -> Vec<String> {
    let mut out = Vec::new();
    let root = dir.join(sub);
    // A link in place of the folder leads out of the run folder: nothing there is the run's.
    if !std::fs::symlink_metadata(&root).is_ok_and(|m| m.is_dir()) {
        return out;
    }
    let mut stack = vec![root];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let p = e.path();
            // The entry's own type: a link is neither descended into nor listed.
            let Ok(kind) = e.file_type() else { continue };
            if kind.is_dir() {
                stack.push(p);
            } else if !kind.is_file() {
                continue;
            } else if let Ok(r) = p.strip_prefix(dir) {
                out.push(r.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    out.sort();
    out
}

/// The run's files that exist, each with what it holds.
fn artifacts(dir: &Path) -> Vec<Value> {
    let described = [
        (super::SUMMARY, "summary (markdown, also the CI step summary)"),
        (super::JUNIT, "JUnit XML for CI test reports"),
        (super::RUN_JSON, "manifest: versions, seeds, engines, machine"),
        (super::RESULTS, "one JSON line per trial"),
        (super::TURNS, "one CSV row per request"),
        (super::growth::GROWTH_CSV, "growth curves, one row per turn"),
        (super::staleness::STALENESS_CSV, "semantic staleness, one row per case"),
        (super::agentic::AGENTIC_CSV, "agentic sessions, one row per warm turn"),
        (super::agentic::SESSIONS_MD, "agentic sessions, each transcript with its tool calls and assertions"),
    ];
    described
        .into_iter()
        .filter(|(name, _)| dir.join(name).is_file())
        .map(|(name, what)| context! { name, what })
        .collect()
}

/// The template environment: HTML auto-escaping for every template, undefined values are errors (a misspelt
/// name fails the tests instead of rendering as nothing), and the `href` filter.
pub fn environment() -> Result<Environment<'static>, minijinja::Error> {
    let mut env = Environment::new();
    env.set_auto_escape_callback(|_| AutoEscape::Html);
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    // Block tags on lines of their own leave no blank lines behind; the file's last newline is kept.
    env.set_syntax(SyntaxConfig::builder().trim_blocks(true).lstrip_blocks(true).keep_trailing_newline(true).build()?);
    // Percent-encoded paths hold only characters that need no escaping in an attribute.
    env.add_filter("href", |rel: &str| Value::from_safe_string(href(rel)));
    Ok(env)
}

/// The page for a run folder.
pub fn render(
    dir: &Path,
    manifest: &Manifest,
    summary: &Summary,
    trials: &[TrialRecord],
    plots: &[Plot],
) -> Result<String, ReportError> {
    let finished = manifest.finished_unix.map_or_else(
        || "not finished".to_string(),
        |f| format!("{} UTC, {} s", crate::record::stamp(f), f.saturating_sub(manifest.started_unix)),
    );
    let failing: Vec<&TrialRecord> =
        trials.iter().filter(|t| matches!(t.verdict, Verdict::Fail | Verdict::Error)).collect();
    let provenance = files_under(dir, "provenance");
    let ctx = context! {
        run => summary.run.as_str(),
        verdict => if summary.pass { "PASS" } else { "FAIL" },
        pass => summary.pass,
        totals => super::summary::totals_sentence(summary),
        kvproof_version => manifest.kvproof_version.as_str(),
        engines_version => manifest.engines_version.as_str(),
        started => crate::record::stamp(manifest.started_unix),
        finished,
        os => manifest.machine.os.as_str(),
        arch => manifest.machine.arch.as_str(),
        cpus => manifest.machine.cpus,
        fault => summary.fault.as_deref(),
        command => manifest.command.join(" "),
        scenarios => scenario_rows(summary),
        reasons => reasons(summary),
        growth => growth_rows(summary),
        staleness => staleness_rows(summary),
        agentic => agentic_rows(summary),
        plots => figures(dir, plots)?,
        failing_total => failing.len(),
        failing => failing.iter().take(SHOWN_FAILURES).map(|t| failure(t)).collect::<Vec<_>>(),
        failing_more => failing.len().saturating_sub(SHOWN_FAILURES),
        files => artifacts(dir),
        provenance_count => provenance.len(),
        provenance,
    };
    let template_error = |e: minijinja::Error| ReportError::Invalid {
        path: dir.join(INDEX),
        message: format!("cannot render the page: {e:#}"),
    };
    let env = environment().map_err(template_error)?;
    env.template_from_named_str(INDEX, TEMPLATE).and_then(|t| t.render(ctx)).map_err(template_error)
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
    fn encodes_hrefs() {
        assert_eq!(href("provenance/case 1/diff.csv"), "provenance/case%201/diff.csv");
        assert_eq!(href("plots/a\"b.svg"), "plots/a%22b.svg");
    }

    #[test]
    fn values_are_escaped_unless_marked_safe() {
        let env = environment().expect("environment");
        let page = env
            .template_from_named_str("t.html", "<p title=\"{{ a }}\">{{ a }}</p><a href=\"{{ f|href }}\">{{ svg }}</a>")
            .and_then(|t| {
                t.render(context! {
                    a => "<b>&\"x\"</b>",
                    f => "plots/a b.svg",
                    svg => Value::from_safe_string("<svg></svg>".into()),
                })
            })
            .expect("render");
        assert_eq!(
            page,
            "<p title=\"&lt;b&gt;&amp;&quot;x&quot;&lt;&#x2f;b&gt;\">&lt;b&gt;&amp;&quot;x&quot;&lt;&#x2f;b&gt;</p>\
             <a href=\"plots/a%20b.svg\"><svg></svg></a>"
        );
        let missing = env.render_str("{{ nope }}", context! {}).expect_err("strict");
        assert!(missing.to_string().contains("undefined"), "{missing}");
    }

    #[test]
    fn the_template_parses() {
        environment().expect("environment").template_from_named_str(INDEX, TEMPLATE).expect("index.html.j2");
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
