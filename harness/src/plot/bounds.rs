//! Failure-rate bounds per scenario: the observed rate and its Clopper–Pearson upper bound, against the limit
//! the scenario sets.

use std::path::{Path, PathBuf};

use plotters::prelude::*;

use super::lines::tick_label;
use super::{init_font, PlotError, FAMILY};
use crate::stats::Bound;

/// One scenario's numbers.
#[derive(Debug, Clone, PartialEq)]
pub struct BoundBar {
    /// What the bar counts: a scenario, or a stale context.
    pub label: String,
    pub failures: u64,
    pub trials: u64,
    /// Upper bound of the failure rate at the scenario's confidence.
    pub upper: f64,
    /// The scenario's `max_failure_rate`, if any.
    pub limit: Option<f64>,
    /// For staleness: the failures split into (stale, corrupt), drawn stacked under the bound.
    pub split: Option<(u64, u64)>,
}

impl BoundBar {
    /// The bar of `bound`, labelled `label`, against the limit `limit` (no split).
    pub fn new(label: String, bound: &Bound, limit: Option<f64>) -> Self {
        BoundBar { label, failures: bound.failures, trials: bound.trials, upper: bound.upper, limit, split: None }
    }
}

/// The x axis: bar i spans [i, i + 1], and the only key points are the bar centres, where the names go.
struct BarAxis {
    bars: usize,
}

impl Ranged for BarAxis {
    type FormatOption = plotters::coord::ranged1d::DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let share = v / self.bars as f64;
        limit.0 + (share * f64::from(limit.1 - limit.0)).round() as i32
    }

    fn key_points<Hint: plotters::coord::ranged1d::KeyPointHint>(&self, _hint: Hint) -> Vec<f64> {
        (0..self.bars).map(|i| i as f64 + 0.5).collect()
    }

    fn range(&self) -> std::ops::Range<f64> {
        0.0..self.bars as f64
    }
}

fn render<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    bars: &[BoundBar],
    title: &str,
    x_desc: &str,
    path: &Path,
) -> Result<(), PlotError> {
    let e = |x: &dyn std::fmt::Display| PlotError::new(path, x);
    root.fill(&WHITE).map_err(|x| e(&x))?;
    // headroom above the tallest bar for the legend (upper right), which grows with its entries
    let entries = 2
        + usize::from(bars.iter().any(|b| b.limit.is_some()))
        + 2 * usize::from(bars.iter().any(|b| b.split.is_some()));
    let tallest = bars.iter().map(|b| b.upper.max(b.limit.unwrap_or(0.0))).fold(0.0, f64::max).max(1e-3) * 100.0;
    let top = tallest * (1.1 + 0.08 * entries as f64);
    let n = bars.len().max(1);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, (FAMILY, 20))
        .margin(14)
        .x_label_area_size(60)
        .y_label_area_size(70)
        .build_cartesian_2d(BarAxis { bars: n }, 0f64..top)
        .map_err(|x| e(&x))?;
    let names: Vec<String> = bars.iter().map(|b| format!("{} ({}/{})", b.label, b.failures, b.trials)).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&|v| names.get(v.floor() as usize).cloned().unwrap_or_default())
        .y_label_formatter(&|v| tick_label(*v))
        .x_desc(x_desc)
        .y_desc("failure rate (%)")
        .label_style((FAMILY, 12))
        .draw()
        .map_err(|x| e(&x))?;
    let blue = RGBColor(31, 119, 180);
    chart
        .draw_series(bars.iter().enumerate().map(|(i, b)| {
            let mut r = Rectangle::new([(i as f64, 0.0), (i as f64 + 1.0, b.upper * 100.0)], blue.mix(0.35).filled());
            r.set_margin(0, 0, 40, 40);
            r
        }))
        .map_err(|x| e(&x))?
        .label("upper bound of the failure rate")
        .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], blue.mix(0.35).filled()));
    if bars.iter().any(|b| b.split.is_some()) {
        // observed stale (orange) with observed corrupt (red) stacked on it: what kind of wrong the replies were
        let (orange, dark) = (RGBColor(255, 127, 14), RGBColor(180, 30, 30));
        let pct = |n: u64, b: &BoundBar| 100.0 * n as f64 / b.trials.max(1) as f64;
        let stacked = |i: usize, lo: f64, hi: f64, c: RGBColor| {
            let mut r = Rectangle::new([(i as f64, lo), (i as f64 + 1.0, hi)], c.filled());
            r.set_margin(0, 0, 70, 70);
            r
        };
        chart
            .draw_series(
                bars.iter()
                    .enumerate()
                    .filter_map(|(i, b)| b.split.map(|(stale, _)| stacked(i, 0.0, pct(stale, b), orange))),
            )
            .map_err(|x| e(&x))?
            .label("observed stale(X): another context's answer")
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], orange.filled()));
        chart
            .draw_series(bars.iter().enumerate().filter_map(|(i, b)| {
                b.split.map(|(stale, corrupt)| stacked(i, pct(stale, b), pct(stale + corrupt, b), dark))
            }))
            .map_err(|x| e(&x))?
            .label("observed corrupt: neither fresh nor stale")
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], dark.filled()));
    }
    chart
        .draw_series(bars.iter().enumerate().map(|(i, b)| {
            Circle::new((i as f64 + 0.5, 100.0 * b.failures as f64 / b.trials.max(1) as f64), 4, blue.filled())
        }))
        .map_err(|x| e(&x))?
        .label("observed failure rate")
        .legend(move |(x, y)| Circle::new((x + 7, y), 4, blue.filled()));
    let red = RGBColor(214, 39, 40);
    if bars.iter().any(|b| b.limit.is_some()) {
        chart
            .draw_series(bars.iter().enumerate().filter_map(|(i, b)| {
                b.limit.map(|l| {
                    PathElement::new(vec![(i as f64, l * 100.0), (i as f64 + 1.0, l * 100.0)], red.stroke_width(2))
                })
            }))
            .map_err(|x| e(&x))?
            .label("max_failure_rate the scenario allows")
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 14, y)], red.stroke_width(2)));
    }
    super::finish_with_legend(&mut chart, &root, SeriesLabelPosition::UpperRight, path)
}

/// Draw `<stem>.svg` and `<stem>.png`; `x_desc` names what a bar is (with "(failures/trials)").
pub fn draw(bars: &[BoundBar], title: &str, x_desc: &str, stem: &Path) -> Result<(PathBuf, PathBuf), PlotError> {
    init_font();
    let (svg, png) = (stem.with_extension("svg"), stem.with_extension("png"));
    let size = (900, 540);
    render(SVGBackend::new(&svg, size).into_drawing_area(), bars, title, x_desc, &svg)?;
    render(BitMapBackend::new(&png, size).into_drawing_area(), bars, title, x_desc, &png)?;
    Ok((svg, png))
}
