//! A run's plots, drawn into `reports/<run>/plots/` from the run's artifacts alone (results.jsonl and the
//! provenance dumps), so `kvproof report DIR` redraws the same plots: per-turn wall time warm vs cold against
//! context length and the reuse fraction per turn for every growth curve, the failure-rate bounds of every
//! scenario (and per stale context), and the provenance heatmap of every captured divergence. SVG and PNG each.

use std::collections::BTreeMap;
use std::path::Path;

use super::ReportError;
use crate::check::growth::turns_of;
use crate::plot::bounds::{self, BoundBar};
use crate::plot::lines::{self, LineChart, Series};
use crate::plot::PlotError;
use crate::provenance;
use crate::record::GrowthTurn;
use crate::record::Summary;
use crate::record::TrialRecord;

pub const PLOTS_DIR: &str = "plots";

/// How the names of the plots [`draw_run`] draws begin (each is `<name>.svg` and `<name>.png`).
const PLOT_PREFIXES: [&str; 7] =
    ["growth-wall-", "growth-reuse-", "bounds", "staleness-", "agentic-wall-", "agentic-assertions-", "heatmap-"];

/// Whether `name` is a plot [`draw_run`] draws (other files in plots/ are someone else's and are kept).
pub fn is_plot_file(name: &str) -> bool {
    let stem = name.strip_suffix(".svg").or_else(|| name.strip_suffix(".png"));
    stem.is_some_and(|s| PLOT_PREFIXES.iter().any(|p| s.starts_with(p)))
}

/// Scenarios per bounds chart: more would crowd the labels.
const BARS_PER_CHART: usize = 6;
/// Heatmaps drawn per run: each diffs two dumps again.
const MAX_HEATMAPS: usize = 24;

/// One drawn plot; paths are relative to the run folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plot {
    /// "growth", "reuse", "bounds", "staleness", "agentic" or "heatmap".
    pub group: &'static str,
    pub title: String,
    pub svg: String,
    /// `None` when only an SVG exists.
    pub png: Option<String>,
}

impl From<PlotError> for ReportError {
    fn from(e: PlotError) -> Self {
        ReportError::Invalid { path: e.path, message: format!("cannot draw plot: {}", e.message) }
    }
}

/// A file-name stem from a scenario or case name: letters, digits, '-' and '_' kept, everything else '-'.
pub fn stem(name: &str) -> String {
    let mut s = String::with_capacity(name.len());
    for c in name.chars() {
        let c = if c.is_ascii_alphanumeric() || c == '_' { c } else { '-' };
        if !(c == '-' && s.ends_with('-')) {
            s.push(c);
        }
    }
    let s = s.trim_matches('-').to_string();
    if s.is_empty() {
        "plot".into()
    } else {
        s
    }
}

fn rel(name: &str, ext: &str) -> String {
    format!("{PLOTS_DIR}/{name}.{ext}")
}

fn line(dir: &Path, group: &'static str, name: &str, chart: &LineChart) -> Result<Plot, ReportError> {
    lines::draw(chart, &dir.join(PLOTS_DIR).join(name))?;
    Ok(Plot { group, title: chart.title.clone(), svg: rel(name, "svg"), png: Some(rel(name, "png")) })
}

/// Draw bound bars as `plots/<name>.svg` (and PNG).
fn bound_bars(
    dir: &Path,
    (group, name): (&'static str, &str),
    bars: &[BoundBar],
    title: String,
    x_desc: &str,
) -> Result<Plot, ReportError> {
    bounds::draw(bars, &title, x_desc, &dir.join(PLOTS_DIR).join(name))?;
    Ok(Plot { group, title, svg: rel(name, "svg"), png: Some(rel(name, "png")) })
}

/// One scenario's bars at its confidence, titled `<scenario>: <what> (<confidence>% upper bound)`; no chart
/// without bars.
fn scenario_bars(
    dir: &Path,
    group_name: (&'static str, &str),
    (scenario, confidence): (&str, f64),
    what: &str,
    bars: &[BoundBar],
    x_desc: &str,
) -> Result<Option<Plot>, ReportError> {
    if bars.is_empty() {
        return Ok(None);
    }
    let title = format!("{scenario}: {what} ({:.0}% upper bound)", confidence * 100.0);
    bound_bars(dir, group_name, bars, title, x_desc).map(Some)
}

fn growth_charts(scenario: &str, turns: &[GrowthTurn]) -> (LineChart, LineChart) {
    let reps = turns.first().map_or(0, |t| t.warm.repeats);
    let cold_reps = turns.first().map_or(0, |t| t.cold.repeats);
    let wall = LineChart {
        title: format!("{scenario}: per-turn wall time vs context (median of {reps} warm / {cold_reps} cold)"),
        x_label: "context length at the turn (prompt tokens)".into(),
        y_label: "wall time of the turn (ms)".into(),
        series: vec![
            Series {
                name: "warm: reuses its state, prefills the new tail".into(),
                points: turns.iter().map(|t| (t.context as f64, t.warm.wall_ms)).collect(),
            },
            Series {
                name: "cold: prefills the whole transcript".into(),
                points: turns.iter().map(|t| (t.context as f64, t.cold.wall_ms)).collect(),
            },
        ],
        y_from_zero: true,
        x_integer: false,
    };
    let pct = |a: usize, b: usize| 100.0 * crate::stats::share(a as f64, b as f64);
    // The oracle first, so the measured line is drawn over it: where they agree only the measured one shows.
    let mut series = Vec::new();
    if turns.iter().all(|t| t.expected_reuse.is_some()) {
        series.push(Series {
            name: "what a correct engine reuses (oracle)".into(),
            points: turns.iter().map(|t| (t.turn as f64, pct(t.expected_reuse.unwrap_or(0), t.context))).collect(),
        });
    }
    series.push(Series {
        name: "warm: reused / prompt tokens".into(),
        points: turns.iter().map(|t| (t.turn as f64, pct(t.reused, t.context))).collect(),
    });
    let reuse = LineChart {
        title: format!("{scenario}: share of the prompt reused, per turn"),
        x_label: "turn".into(),
        y_label: "prompt tokens reused (%)".into(),
        series,
        y_from_zero: true,
        x_integer: true,
    };
    (wall, reuse)
}

/// Redraw every plot of the run folder `dir`; returns them in the order index.html shows them.
pub fn draw_run(dir: &Path, summary: &Summary, trials: &[TrialRecord]) -> Result<Vec<Plot>, ReportError> {
    let out = dir.join(PLOTS_DIR);
    // A rebuilt report must not keep plots of the old one; other files in plots/ are kept, and a link at
    // plots/ or at a plot's name is removed, so the drawing below creates every file afresh.
    if std::fs::symlink_metadata(&out).is_ok_and(|m| m.file_type().is_symlink()) {
        std::fs::remove_file(&out).map_err(|source| ReportError::Io { path: out.clone(), source })?;
    }
    if out.is_dir() {
        super::out_dir::clear_own(&out, super::out_dir::Layout::Plots)?;
    }
    super::safe_file::ensure_dir(&out)?;
    let mut plots = Vec::new();

    let mut by_scenario: BTreeMap<&str, Vec<&TrialRecord>> = BTreeMap::new();
    for t in trials {
        by_scenario.entry(t.scenario.as_str()).or_default().push(t);
    }
    for s in &summary.scenarios {
        let turns = turns_of(by_scenario.get(s.name.as_str()).into_iter().flatten().copied());
        if turns.is_empty() {
            continue;
        }
        let (wall, reuse) = growth_charts(&s.name, &turns);
        plots.push(line(dir, "growth", &format!("growth-wall-{}", stem(&s.name)), &wall)?);
        plots.push(line(dir, "reuse", &format!("growth-reuse-{}", stem(&s.name)), &reuse)?);
    }

    let bars: Vec<BoundBar> = summary
        .scenarios
        .iter()
        .filter_map(|s| s.bound.map(|b| BoundBar::new(s.name.clone(), &b, s.max_failure_rate)))
        .collect();
    let charts = bars.len().div_ceil(BARS_PER_CHART);
    for (i, chunk) in bars.chunks(BARS_PER_CHART).enumerate() {
        let confs: Vec<f64> = summary.scenarios.iter().filter_map(|s| s.bound.map(|b| b.confidence)).collect();
        let conf = match confs.first() {
            Some(c) if confs.iter().all(|x| x == c) => format!("{:.0}%", c * 100.0),
            _ => "each scenario's confidence".to_string(),
        };
        let part = if charts > 1 { format!(" ({} of {charts})", i + 1) } else { String::new() };
        let title = format!("failure rate per scenario: observed and upper bound at {conf}{part}");
        let name = if charts > 1 { format!("bounds-{}", i + 1) } else { "bounds".to_string() };
        plots.push(bound_bars(dir, ("bounds", &name), chunk, title, "scenario (failures/trials)")?);
    }

    for s in &summary.scenarios {
        let Some(st) = &s.staleness else { continue };
        let bars: Vec<BoundBar> = st
            .contexts
            .iter()
            .filter_map(|c| {
                c.not_fresh_bound.map(|b| BoundBar {
                    split: Some((c.stale as u64, c.corrupt as u64)),
                    ..BoundBar::new(c.context.clone(), &b, s.max_failure_rate)
                })
            })
            .collect();
        let name = format!("staleness-{}", stem(&s.name));
        let what = "stale or corrupt warm replies per context";
        let x_desc = "stale context (stale or corrupt replies/cases)";
        plots.extend(scenario_bars(dir, ("staleness", &name), (&s.name, st.confidence), what, &bars, x_desc)?);
    }

    for s in &summary.scenarios {
        let Some(st) = &s.agentic else { continue };
        let mine: Vec<&TrialRecord> = by_scenario.get(s.name.as_str()).into_iter().flatten().copied().collect();
        let by_turn = super::agentic::wall_by_turn(&mine);
        if !by_turn.is_empty() {
            let wall = LineChart {
                title: format!("{}: per-turn wall time vs context (median over sessions, by turn)", s.name),
                x_label: "context length at the turn (prompt tokens, mean over sessions)".into(),
                y_label: "wall time of the turn (ms)".into(),
                series: vec![
                    Series {
                        name: "warm: the session, reusing its state".into(),
                        points: by_turn.iter().map(|&(_, x, w, _)| (x, w)).collect(),
                    },
                    Series {
                        name: "cold: the whole transcript, fresh".into(),
                        points: by_turn.iter().map(|&(_, x, _, c)| (x, c)).collect(),
                    },
                ],
                y_from_zero: true,
                x_integer: false,
            };
            plots.push(line(dir, "agentic", &format!("agentic-wall-{}", stem(&s.name)), &wall)?);
        }
        let bars: Vec<BoundBar> = [("warm", &st.total.warm), ("cold", &st.total.cold)]
            .into_iter()
            .flat_map(|(who, t)| {
                t.assertions.iter().filter(|r| r.applied > 0).filter_map(move |r| {
                    let broken = (r.applied - r.held) as u64;
                    let bound = crate::stats::one_sided(broken, r.applied as u64, st.confidence).ok()?;
                    Some(BoundBar::new(format!("{who}: {}", r.assertion), &bound, None))
                })
            })
            .collect();
        let name = format!("agentic-assertions-{}", stem(&s.name));
        let what = "per-turn assertions broken, warm beside cold";
        let x_desc = "assertion (broken/applied)";
        plots.extend(scenario_bars(dir, ("agentic", &name), (&s.name, st.confidence), what, &bars, x_desc)?);
    }

    for (i, (case, rdir)) in trials
        .iter()
        .filter_map(|t| t.provenance.as_ref().map(|p| (format!("{} / {}", t.scenario, t.name()), p.dir.clone())))
        .take(MAX_HEATMAPS)
        .enumerate()
    {
        let src = dir.join(&rdir).join(provenance::capture::DIFF_JSON);
        // results::read checked `rdir` stays inside the run folder; the file itself must not be a link either.
        if !std::fs::symlink_metadata(&src).is_ok_and(|m| m.is_file()) {
            continue;
        }
        let d = provenance::render::read_json(&src)
            .map_err(|e| ReportError::Invalid { path: src.clone(), message: e.to_string() })?;
        let case_dir = rdir.strip_prefix("provenance/").unwrap_or(&rdir);
        let name = format!("heatmap-{:02}-{}", i + 1, stem(case_dir));
        let title = format!("warm vs cold state, {case}: log10 max |diff| per row");
        for ext in ["svg", "png"] {
            crate::plot::heatmap::draw(&d, &out.join(format!("{name}.{ext}")), &title)?;
        }
        plots.push(Plot { group: "heatmap", title, svg: rel(&name, "svg"), png: Some(rel(&name, "png")) });
    }
    Ok(plots)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stems_are_file_safe() {
        assert_eq!(stem("inkling-small growth/1"), "inkling-small-growth-1");
        assert_eq!(stem("stale <glm>"), "stale-glm");
        assert_eq!(stem("../.."), "plot");
    }
}
