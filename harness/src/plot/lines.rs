//! Line charts: several named series of (x, y) points with axis labels, units, a legend and a title.

use std::path::{Path, PathBuf};

use plotters::prelude::*;

use super::{init_font, PlotError, FAMILY};

/// One series.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// A chart to draw.
#[derive(Debug, Clone, PartialEq)]
pub struct LineChart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
    /// Fix the y range to start at 0 (wall times, fractions).
    pub y_from_zero: bool,
    /// The x axis counts things (turns, nights): label whole numbers only.
    pub x_integer: bool,
}

/// A tick label without a trailing `.0`: `100`, `2.5`, `0.125`.
pub fn tick_label(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        return format!("{}", v.round() as i64);
    }
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Labels for an axis of whole numbers: fractional ticks get none.
pub fn integer_tick_label(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        tick_label(v)
    } else {
        String::new()
    }
}

const PALETTE: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

fn bounds(chart: &LineChart) -> ((f64, f64), (f64, f64)) {
    let pts = chart.series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::INFINITY, f64::NEG_INFINITY, f64::INFINITY, f64::NEG_INFINITY);
    for &(x, y) in pts {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if !x0.is_finite() {
        return ((0.0, 1.0), (0.0, 1.0));
    }
    if chart.y_from_zero {
        y0 = y0.min(0.0);
    }
    let pad = |a: f64, b: f64| if b > a { (b - a) * 0.05 } else { a.abs().max(1.0) * 0.05 };
    ((x0 - pad(x0, x1), x1 + pad(x0, x1)), (if chart.y_from_zero { y0 } else { y0 - pad(y0, y1) }, y1 + pad(y0, y1)))
}

fn render<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    c: &LineChart,
    path: &Path,
) -> Result<(), PlotError> {
    let e = |x: &dyn std::fmt::Display| PlotError::new(path, x);
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let ((x0, x1), (y0, y1)) = bounds(c);
    let mut chart = ChartBuilder::on(&root)
        .caption(&c.title, (FAMILY, 20))
        .margin(14)
        .x_label_area_size(44)
        .y_label_area_size(70)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(|x| e(&x))?;
    let x_ticks = if c.x_integer { ((x1 - x0).floor() as usize + 1).clamp(2, 12) } else { 10 };
    let x_format: &dyn Fn(&f64) -> String = if c.x_integer { &|v| integer_tick_label(*v) } else { &|v| tick_label(*v) };
    chart
        .configure_mesh()
        .x_labels(x_ticks)
        .x_label_formatter(x_format)
        .y_label_formatter(&|v| tick_label(*v))
        .x_desc(&c.x_label)
        .y_desc(&c.y_label)
        .label_style((FAMILY, 13))
        .light_line_style(RGBColor(238, 238, 238))
        .draw()
        .map_err(|x| e(&x))?;
    for (i, s) in c.series.iter().enumerate() {
        let colour = PALETTE[i % PALETTE.len()];
        chart
            .draw_series(LineSeries::new(s.points.iter().copied(), colour.stroke_width(2)))
            .map_err(|x| e(&x))?
            .label(s.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], colour.stroke_width(2)));
        chart.draw_series(s.points.iter().map(|&p| Circle::new(p, 3, colour.filled()))).map_err(|x| e(&x))?;
    }
    super::finish_with_legend(&mut chart, &root, SeriesLabelPosition::UpperLeft, path)
}

/// Draw `chart` as `<stem>.svg` and `<stem>.png`; returns both paths.
pub fn draw(chart: &LineChart, stem: &Path) -> Result<(PathBuf, PathBuf), PlotError> {
    init_font();
    let (svg, png) = (stem.with_extension("svg"), stem.with_extension("png"));
    let size = (900, 540);
    render(SVGBackend::new(&svg, size).into_drawing_area(), chart, &svg)?;
    render(BitMapBackend::new(&png, size).into_drawing_area(), chart, &png)?;
    Ok((svg, png))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tick_labels_drop_a_trailing_zero() {
        assert_eq!(tick_label(100.0), "100");
        assert_eq!(tick_label(2.5), "2.5");
        assert_eq!(tick_label(0.125), "0.125");
        assert_eq!(tick_label(-3.0), "-3");
        assert_eq!(integer_tick_label(2.0), "2");
        assert_eq!(integer_tick_label(2.5), "");
    }
}
