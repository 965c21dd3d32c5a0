//! Failure-rate bounds per scenario: the observed rate and its Clopper–Pearson upper bound, against the limit
//! the scenario sets.

use std::path::{Path, PathBuf};

use plotters::prelude::*;

use super::{init_font, PlotError, FAMILY};

/// One scenario's numbers.
#[derive(Debug, Clone, PartialEq)]
pub struct BoundBar {
    pub scenario: String,
    pub failures: u64,
    pub trials: u64,
    /// Upper bound of the failure rate at the scenario's confidence.
    pub upper: f64,
    /// The scenario's `max_failure_rate`, if any.
    pub limit: Option<f64>,
}

fn render<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    bars: &[BoundBar],
    title: &str,
    path: &Path,
) -> Result<(), PlotError> {
    let e = |x: &dyn std::fmt::Display| PlotError::new(path, x);
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let top = bars.iter().map(|b| b.upper.max(b.limit.unwrap_or(0.0))).fold(0.0, f64::max).max(1e-3) * 100.0 * 1.15;
    let n = bars.len().max(1);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, (FAMILY, 20))
        .margin(14)
        .x_label_area_size(60)
        .y_label_area_size(70)
        .build_cartesian_2d((0..n).into_segmented(), 0f64..top)
        .map_err(|x| e(&x))?;
    let names: Vec<String> = bars.iter().map(|b| format!("{} ({}/{})", b.scenario, b.failures, b.trials)).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => names.get(*i).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .x_desc("scenario (failures/trials)")
        .y_desc("failure rate (%)")
        .label_style((FAMILY, 12))
        .draw()
        .map_err(|x| e(&x))?;
    let blue = RGBColor(31, 119, 180);
    chart
        .draw_series(bars.iter().enumerate().map(|(i, b)| {
            let mut r = Rectangle::new(
                [(SegmentValue::Exact(i), 0.0), (SegmentValue::Exact(i + 1), b.upper * 100.0)],
                blue.mix(0.35).filled(),
            );
            r.set_margin(0, 0, 40, 40);
            r
        }))
        .map_err(|x| e(&x))?
        .label("upper bound of the failure rate")
        .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], blue.mix(0.35).filled()));
    chart
        .draw_series(bars.iter().enumerate().map(|(i, b)| {
            Circle::new(
                (SegmentValue::CenterOf(i), 100.0 * b.failures as f64 / b.trials.max(1) as f64),
                4,
                blue.filled(),
            )
        }))
        .map_err(|x| e(&x))?
        .label("observed failure rate")
        .legend(move |(x, y)| Circle::new((x + 7, y), 4, blue.filled()));
    let red = RGBColor(214, 39, 40);
    chart
        .draw_series(bars.iter().enumerate().filter_map(|(i, b)| {
            b.limit.map(|l| {
                PathElement::new(
                    vec![(SegmentValue::Exact(i), l * 100.0), (SegmentValue::Exact(i + 1), l * 100.0)],
                    red.stroke_width(2),
                )
            })
        }))
        .map_err(|x| e(&x))?
        .label("max_failure_rate the scenario allows")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 14, y)], red.stroke_width(2)));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(180, 180, 180))
        .label_font((FAMILY, 13))
        .draw()
        .map_err(|x| e(&x))?;
    root.present().map_err(|x| e(&x))
}

/// Draw `<stem>.svg` and `<stem>.png`.
pub fn draw(bars: &[BoundBar], title: &str, stem: &Path) -> Result<(PathBuf, PathBuf), PlotError> {
    init_font();
    let (svg, png) = (stem.with_extension("svg"), stem.with_extension("png"));
    let size = (900, 540);
    render(SVGBackend::new(&svg, size).into_drawing_area(), bars, title, &svg)?;
    render(BitMapBackend::new(&png, size).into_drawing_area(), bars, title, &png)?;
    Ok((svg, png))
}
