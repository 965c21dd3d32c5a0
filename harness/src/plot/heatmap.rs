//! The provenance heatmap: layers x positions, colour = log10 of the largest |diff| in that row.

use std::path::Path;

use plotters::prelude::*;

use super::lines::integer_tick_label;
use super::{init_font, PlotError, FAMILY};
use kvproof_engines::state_diff::StateDiff;

/// Colour for log10|diff| in [lo, hi]: pale yellow (tiny) to dark red (large).
fn colour(v: f64, lo: f64, hi: f64) -> RGBColor {
    let t = if hi > lo { ((v - lo) / (hi - lo)).clamp(0.0, 1.0) } else { 1.0 };
    let lerp = |a: f64, b: f64| (a + (b - a) * t) as u8;
    RGBColor(lerp(255.0, 140.0), lerp(230.0, 0.0), lerp(120.0, 20.0))
}

fn render<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    d: &StateDiff,
    path: &Path,
    title: &str,
    size: (u32, u32),
    (lo, hi): (f64, f64),
) -> Result<(), PlotError> {
    let layers = d.layers.len().max(1);
    let positions = d.covered.max(1);
    let e = |x: &dyn std::fmt::Display| PlotError::new(path, x);
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let (upper, footer) = root.split_vertically(size.1 - 28);
    let (main, legend) = upper.split_horizontally(size.0 - 170);
    // Layer L spans [L - 0.5, L + 0.5], so its label sits at the middle of its band.
    let band = |l: usize| (l as f64 - 0.5, l as f64 + 0.5);
    let mut chart = ChartBuilder::on(&main)
        .caption(title, (FAMILY, 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0..positions as i64, -0.5..layers as f64 - 0.5)
        .map_err(|x| e(&x))?;
    chart
        .configure_mesh()
        .disable_mesh()
        .y_labels(layers.min(40))
        .y_label_formatter(&|v| integer_tick_label(*v))
        .x_desc("position (absolute)")
        .y_desc("layer")
        .label_style((FAMILY, 13))
        .draw()
        .map_err(|x| e(&x))?;
    // Positions both states hold and compared identical are light grey; positions one side does not hold (outside
    // a ring's window, past a shorter state) stay white: "no difference" must look different from "not compared".
    let identical = d.tensors.iter().flat_map(|t| {
        let (y0, y1) = band(t.layer);
        t.compared.iter().map(move |&(p0, p1)| Rectangle::new([(p0, y0), (p1, y1)], RGBColor(235, 235, 235).filled()))
    });
    chart.draw_series(identical).map_err(|x| e(&x))?;
    let cells = d.tensors.iter().flat_map(|t| {
        let (y0, y1) = band(t.layer);
        t.divergent.iter().map(move |&(p, v)| {
            let c = colour((v as f64).max(1e-12).log10(), lo, hi);
            Rectangle::new([(p, y0), (p + 1, y1)], c.filled())
        })
    });
    chart.draw_series(cells).map_err(|x| e(&x))?;
    // The first divergent row (lowest position, then layer), ringed, and named under the chart: the same row
    // summary.md and diff.txt name.
    if let Some(f) = &d.first {
        let (y0, y1) = band(f.layer);
        let ring = Rectangle::new([(f.position, y0), (f.position + 1, y1)], BLACK.stroke_width(2));
        chart.draw_series(std::iter::once(ring)).map_err(|x| e(&x))?;
        let line = format!("first divergent row: {}", f.describe("warm", "cold"));
        footer.draw(&Text::new(line, (12, 6), (FAMILY, 13))).map_err(|x| e(&x))?;
    }
    // colour bar
    let steps = 20;
    for i in 0..steps {
        let v = lo + (hi - lo) * i as f64 / (steps - 1) as f64;
        let y = 60 + (steps - 1 - i) * 12;
        legend.draw(&Rectangle::new([(10, y), (40, y + 12)], colour(v, lo, hi).filled())).map_err(|x| e(&x))?;
    }
    let text = |s: String, y: i32| Text::new(s, (46, y), (FAMILY, 13));
    legend.draw(&Text::new("log10 |diff|", (10, 40), (FAMILY, 13))).map_err(|x| e(&x))?;
    legend.draw(&text(format!("{hi:.1}"), 60)).map_err(|x| e(&x))?;
    legend.draw(&text(format!("{lo:.1}"), 60 + (steps - 1) * 12)).map_err(|x| e(&x))?;
    legend.draw(&Rectangle::new([(10, 320), (40, 332)], RGBColor(235, 235, 235).filled())).map_err(|x| e(&x))?;
    legend.draw(&text("identical".into(), 320)).map_err(|x| e(&x))?;
    let grey = RGBColor(200, 200, 200);
    legend.draw(&Rectangle::new([(10, 344), (40, 356)], grey.stroke_width(1))).map_err(|x| e(&x))?;
    legend.draw(&text("not held by both".into(), 344)).map_err(|x| e(&x))?;
    root.present().map_err(|x| e(&x))
}

/// Draw `d` to `path` (SVG; with a `.png` extension, a PNG).
pub fn draw(d: &StateDiff, path: &Path, title: &str) -> Result<(), PlotError> {
    init_font();
    let layers = d.layers.len().max(1);
    let logs: Vec<f64> =
        d.tensors.iter().flat_map(|t| t.divergent.iter()).map(|&(_, v)| (v as f64).max(1e-12).log10()).collect();
    let lo = logs.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = logs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let (lo, hi) = if logs.is_empty() { (-12.0, 0.0) } else { (lo, hi) };
    let size = (960, 184 + 28 * layers as u32);
    if path.extension().is_some_and(|x| x == "png") {
        render(BitMapBackend::new(path, size).into_drawing_area(), d, path, title, size, (lo, hi))
    } else {
        render(SVGBackend::new(path, size).into_drawing_area(), d, path, title, size, (lo, hi))
    }
}
