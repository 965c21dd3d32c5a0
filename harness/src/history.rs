//! The nightly history: `reports/history/history.csv`, to which every nightly run appends its headline numbers
//! (one row per run, scenario and metric), and the trend plots drawn from it (`trend-*.svg`/`.png` and an
//! `index.html` showing them), so a regression shows up as a step in a line rather than a number in one report.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::plot::lines::{self, LineChart, Series};
use minijinja::context;
use minijinja::value::Value;

use crate::record::Summary;
use crate::report::index_html::{environment, inline_svg};
use crate::report::{self, results};

/// The history page's markup.
const HISTORY_TEMPLATE: &str = include_str!("report/history.html.j2");

pub const HISTORY_CSV: &str = "history.csv";

#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}:{line}: {message}")]
    Parse { path: PathBuf, line: usize, message: String },
    #[error(transparent)]
    Report(#[from] report::ReportError),
    #[error(transparent)]
    Plot(#[from] crate::plot::PlotError),
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> HistoryError + '_ {
    move |source| HistoryError::Io { path: path.to_path_buf(), source }
}

/// One headline number of one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryRow {
    /// When the run started (Unix seconds).
    pub unix: u64,
    pub run: String,
    /// What was tested, e.g. the commit (`--label`); may be empty.
    pub label: String,
    /// The scenario, or `*` for the run as a whole.
    pub scenario: String,
    pub metric: String,
    pub value: f64,
}

/// The headline numbers of a finished run folder, from run.json and results.jsonl alone.
pub fn headline(dir: &Path, label: &str) -> Result<Vec<HistoryRow>, HistoryError> {
    let manifest = report::read_manifest(dir)?;
    let mut trials = results::read(&dir.join(report::RESULTS))?;
    crate::check::scenario::sort_trials(&manifest, &mut trials);
    let summary = crate::check::scenario::summarize(&manifest, &trials);
    Ok(rows_of(&summary, manifest.started_unix, label))
}

fn rows_of(s: &Summary, unix: u64, label: &str) -> Vec<HistoryRow> {
    let mut out = Vec::new();
    let mut push = |scenario: &str, metric: &str, value: f64| {
        if value.is_finite() {
            out.push(HistoryRow {
                unix,
                run: s.run.clone(),
                label: label.to_string(),
                scenario: scenario.to_string(),
                metric: metric.to_string(),
                value,
            });
        }
    };
    push("*", "pass", f64::from(u8::from(s.pass)));
    for sc in &s.scenarios {
        let n = sc.name.as_str();
        push(n, "pass", f64::from(u8::from(sc.pass)));
        push(n, "trials", sc.trials as f64);
        push(n, "failed", sc.failed as f64);
        push(n, "errors", sc.errors as f64);
        if let Some(b) = sc.bound {
            push(n, "failure_rate_upper", b.upper);
        }
        if let Some(g) = &sc.growth {
            push(n, "context_growth", g.context_growth);
            push(n, "warm_ratio", g.warm_ratio);
            push(n, "cold_ratio", g.cold_ratio);
            push(n, "warm_slope_ms_per_ktok", g.warm_slope_ms_per_ktok);
            push(n, "cold_slope_ms_per_ktok", g.cold_slope_ms_per_ktok);
            push(n, "reuse_fraction", g.reuse_fraction);
            push(n, "ideal_speedup", g.ideal_speedup);
            push(n, "prefill_speedup", g.prefill_speedup);
            push(n, "speedup_of_ideal", g.speedup_of_ideal);
            push(n, "speedup_of_token_ideal", g.speedup_of_token_ideal);
            if let Some(x) = g.cost_ideal_speedup {
                push(n, "cost_ideal_speedup", x);
            }
            if let Some(x) = g.expected_warm_ratio {
                push(n, "expected_warm_ratio", x);
            }
            if let Some(x) = g.warm_ratio_over_expected {
                push(n, "warm_ratio_over_expected", x);
            }
            push(n, "warm_last_ms", g.warm_last_ms);
            push(n, "cold_last_ms", g.cold_last_ms);
        }
        if let Some(st) = &sc.staleness {
            push(n, "stale", st.total.stale as f64);
            push(n, "corrupt", st.total.corrupt as f64);
            if let Some(b) = st.total.not_fresh_bound {
                push(n, "not_fresh_upper", b.upper);
            }
        }
        if let Some(a) = &sc.agentic {
            let t = &a.total;
            push(n, "agentic_sessions_parted", t.parted as f64);
            push(n, "agentic_reuse_share", t.reuse_share());
            push(n, "agentic_tokens_lost_to_rerender", t.lost as f64);
            push(n, "agentic_tool_calls_warm", t.warm.tool_calls as f64);
            push(n, "agentic_solved_warm", t.warm.solved as f64);
        }
    }
    out
}

/// Every row of a history file (none when it does not exist yet).
pub fn read(path: &Path) -> Result<Vec<HistoryRow>, HistoryError> {
    if std::fs::symlink_metadata(path).is_err() {
        return Ok(Vec::new());
    }
    // Not through a link: the history is appended to, and an append through a link writes elsewhere.
    let mut r = csv::Reader::from_reader(report::safe_file::open_regular(path)?);
    let mut out = Vec::new();
    for (i, row) in r.deserialize::<HistoryRow>().enumerate() {
        let row = row.map_err(|e| HistoryError::Parse {
            path: path.to_path_buf(),
            line: e.position().map_or(i + 2, |p| p.line() as usize),
            message: e.to_string(),
        })?;
        out.push(row);
    }
    Ok(out)
}

/// Append `rows` to the history file (header written when the file is new). Returns how many rows were added:
/// none when the run is already recorded (appending the same run twice would count a night twice).
pub fn append(path: &Path, rows: &[HistoryRow]) -> Result<usize, HistoryError> {
    let existing = read(path)?;
    let Some(run) = rows.first().map(|r| r.run.clone()) else { return Ok(0) };
    if existing.iter().any(|r| r.run == run) {
        return Ok(0);
    }
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(io(parent))?;
    }
    let new = !path.exists() || std::fs::metadata(path).map_err(io(path))?.len() == 0;
    let file = std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(io(path))?;
    let mut w = csv::WriterBuilder::new().has_headers(new).from_writer(file);
    for r in rows {
        w.serialize(r).map_err(|e| HistoryError::Parse {
            path: path.to_path_buf(),
            line: 0,
            message: e.to_string(),
        })?;
    }
    w.flush().map_err(io(path))?;
    Ok(rows.len())
}

/// The trend charts: one per metric worth watching, one series per scenario, runs in time order on the x axis.
fn charts(rows: &[HistoryRow]) -> Vec<(&'static str, LineChart)> {
    let mut runs: Vec<(u64, &str)> = rows.iter().map(|r| (r.unix, r.run.as_str())).collect();
    runs.sort();
    runs.dedup();
    let index: BTreeMap<&str, usize> = runs.iter().enumerate().map(|(i, (_, r))| (*r, i + 1)).collect();
    let series = |metric: &str, scale: f64| -> Vec<Series> {
        let mut by: BTreeMap<&str, Vec<(f64, f64)>> = BTreeMap::new();
        for r in rows.iter().filter(|r| r.metric == metric && r.scenario != "*") {
            by.entry(r.scenario.as_str()).or_default().push((index[r.run.as_str()] as f64, r.value * scale));
        }
        by.into_iter()
            .map(|(name, mut points)| {
                points.sort_by(|a, b| a.0.total_cmp(&b.0));
                Series { name: name.to_string(), points }
            })
            .collect()
    };
    let x = format!("nightly run (oldest first, {} runs)", runs.len());
    let mut out = Vec::new();
    let specs: [(&'static str, &str, &str, &str, f64); 4] = [
        (
            "trend-warm-ratio",
            "warm_ratio",
            "growth curves: warm per-turn wall time, last/first (fitted), per night",
            "warm last/first ratio (x)",
            1.0,
        ),
        (
            "trend-speedup-of-ideal",
            "speedup_of_ideal",
            "growth curves: prefill speedup from reuse as a share of the ideal, per night",
            "speedup / ideal (%)",
            100.0,
        ),
        (
            "trend-reuse-fraction",
            "reuse_fraction",
            "growth curves: share of prompt tokens reused, per night",
            "prompt tokens reused (%)",
            100.0,
        ),
        (
            "trend-failure-bound",
            "failure_rate_upper",
            "failure-rate upper bound per scenario, per night",
            "failure rate, upper bound (%)",
            100.0,
        ),
    ];
    for (stem, metric, title, y, scale) in specs {
        let s = series(metric, scale);
        if s.is_empty() {
            continue;
        }
        out.push((
            stem,
            LineChart {
                title: title.into(),
                x_label: x.clone(),
                y_label: y.into(),
                series: s,
                y_from_zero: true,
                x_integer: true,
            },
        ));
    }
    out
}

/// Redraw the trend plots and `index.html` in `dir` from its history file; returns the SVG paths drawn.
pub fn plot(dir: &Path) -> Result<Vec<PathBuf>, HistoryError> {
    let rows = read(&dir.join(HISTORY_CSV))?;
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let mut drawn = Vec::new();
    let runs: std::collections::BTreeSet<&str> = rows.iter().map(|r| r.run.as_str()).collect();
    let mut figures = Vec::new();
    for (stem, chart) in charts(&rows) {
        for ext in ["svg", "png"] {
            // Drawing writes by name: a link planted there is removed (the link only), never drawn through.
            let path = dir.join(format!("{stem}.{ext}"));
            if std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink()) {
                std::fs::remove_file(&path).map_err(io(&path))?;
            }
        }
        let (svg, _png) = lines::draw(&chart, &dir.join(stem))?;
        let text = std::fs::read_to_string(&svg).map_err(io(&svg))?;
        let inline =
            inline_svg(&text).map_err(|message| HistoryError::Parse { path: svg.clone(), line: 0, message })?;
        figures.push(context! { svg => Value::from_safe_string(inline), title => chart.title.clone(), stem });
        drawn.push(svg);
    }
    let template_error = |e: minijinja::Error| HistoryError::Parse {
        path: dir.join("index.html"),
        line: 0,
        message: format!("cannot render the page: {e:#}"),
    };
    let env = environment().map_err(template_error)?;
    let html = env
        .template_from_named_str("history.html", HISTORY_TEMPLATE)
        .and_then(|t| t.render(context! { runs => runs.len(), csv => HISTORY_CSV, figures }))
        .map_err(template_error)?;
    let index = dir.join("index.html");
    report::safe_file::replace(&index, html.as_bytes())?;
    Ok(drawn)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(unix: u64, run: &str, scenario: &str, metric: &str, value: f64) -> HistoryRow {
        HistoryRow {
            unix,
            run: run.into(),
            label: "abc123".into(),
            scenario: scenario.into(),
            metric: metric.into(),
            value,
        }
    }

    #[test]
    fn append_is_idempotent_per_run_and_reads_back() {
        let dir = std::env::temp_dir().join(format!("kvproof-history-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join(HISTORY_CSV);
        let night1 = vec![row(10, "n1", "g", "warm_ratio", 1.1), row(10, "n1", "*", "pass", 1.0)];
        assert_eq!(append(&path, &night1).expect("append"), 2);
        assert_eq!(append(&path, &night1).expect("again"), 0, "the same run is recorded once");
        assert_eq!(append(&path, &[row(20, "n2", "g", "warm_ratio", 1.3)]).expect("append"), 1);
        let back = read(&path).expect("read");
        assert_eq!(back.len(), 3);
        assert_eq!(back[2], row(20, "n2", "g", "warm_ratio", 1.3));
        let drawn = plot(&dir).expect("plot");
        assert_eq!(drawn.len(), 1, "only warm_ratio has data");
        let html = std::fs::read_to_string(dir.join("index.html")).expect("html");
        assert!(html.contains("<svg") && html.contains("2 runs recorded"), "{html}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_bad_line_is_named() {
        let dir = std::env::temp_dir().join(format!("kvproof-history-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join(HISTORY_CSV);
        std::fs::write(&path, "unix,run,label,scenario,metric,value\n1,a,,s,m,1.0\nx,b,,s,m,2\n").expect("write");
        let e = read(&path).expect_err("bad row");
        assert!(e.to_string().contains(":3:"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
