//! The provenance heatmap: layers x positions, colour = log10 of the largest |diff| in that row.
//!
//! The diff it draws may come from a hostile dump or diff.json: one band per layer the diff lists (by rank, so a
//! layer index never sizes anything), the picture no taller than `MAX_HEIGHT`, positions clamped to i64.

use std::collections::HashMap;
use std::path::Path;

use plotters::prelude::*;

use super::lines::integer_tick_label;
use super::{init_font, PlotError, FAMILY};
use kvproof_engines::state_diff::StateDiff;

/// Colour for log10|diff| in [lo, hi]: pale yellow (tiny) to dark red (large).
/// The tallest picture drawn, however many layers a diff lists (bands get thinner).
pub const MAX_HEIGHT: u32 = 4096;
/// Pixels above and below the bands (title, axis, footer).
const FRAME_HEIGHT: u32 = 184;
/// A layer's band when few layers are drawn.
const BAND_HEIGHT: u32 = 28;

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
    let positions = i64::try_from(d.covered).unwrap_or(i64::MAX).max(1);
    // Band of each listed layer (its rank), the first listing winning; tensors of unlisted layers are not drawn.
    let mut rank: HashMap<usize, usize> = HashMap::new();
    for (i, l) in d.layers.iter().enumerate() {
        rank.entry(l.layer).or_insert(i);
    }
    let e = |x: &dyn std::fmt::Display| PlotError::new(path, x);
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let (upper, footer) = root.split_vertically(size.1 - 28);
    let (main, legend) = upper.split_horizontally(size.0 - 170);
    // Band r spans [r - 0.5, r + 0.5], so its label sits at the middle of its band.
    let band = |layer: usize| rank.get(&layer).map(|&r| (r as f64 - 0.5, r as f64 + 0.5));
    // Every position is drawn clamped to the axis: plotters maps an i64 onto pixels with unchecked arithmetic, so a
    // position a diff file puts far past `covered` (or below 0) would overflow inside it.
    let x = move |p: i64| p.clamp(0, positions);
    let mut chart = ChartBuilder::on(&main)
        .caption(title, (FAMILY, 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0..positions, -0.5..layers as f64 - 0.5)
        .map_err(|x| e(&x))?;
    let layer_label = |v: &f64| match integer_tick_label(*v).is_empty() {
        true => String::new(),
        false => d.layers.get(v.round() as usize).map(|l| l.layer.to_string()).unwrap_or_default(),
    };
    chart
        .configure_mesh()
        .disable_mesh()
        .y_labels(layers.min(40))
        .y_label_formatter(&layer_label)
        .x_desc("position (absolute)")
        .y_desc("layer")
        .label_style((FAMILY, 13))
        .draw()
        .map_err(|x| e(&x))?;
    // Positions both states hold and compared identical are light grey; positions one side does not hold (outside
    // a ring's window, past a shorter state) stay white: "no difference" must look different from "not compared".
    let identical = d.tensors.iter().filter_map(|t| band(t.layer).map(|b| (t, b))).flat_map(|(t, (y0, y1))| {
        t.compared
            .iter()
            .map(move |&(p0, p1)| Rectangle::new([(x(p0), y0), (x(p1), y1)], RGBColor(235, 235, 235).filled()))
    });
    chart.draw_series(identical).map_err(|x| e(&x))?;
    let cells = d.tensors.iter().filter_map(|t| band(t.layer).map(|b| (t, b))).flat_map(|(t, (y0, y1))| {
        t.divergent.iter().map(move |&(p, v)| {
            let c = colour((v as f64).max(1e-12).log10(), lo, hi);
            Rectangle::new([(x(p), y0), (x(p.saturating_add(1)), y1)], c.filled())
        })
    });
    chart.draw_series(cells).map_err(|x| e(&x))?;
    // The first divergent row (lowest position, then layer), ringed, and named under the chart: the same row
    // summary.md and diff.txt name.
    if let Some(f) = &d.first {
        if let Some((y0, y1)) = band(f.layer) {
            let (p0, p1) = (x(f.position), x(f.position.saturating_add(1)));
            let ring = Rectangle::new([(p0, y0), (p1, y1)], BLACK.stroke_width(2));
            chart.draw_series(std::iter::once(ring)).map_err(|x| e(&x))?;
        }
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
    let bands = u32::try_from(layers).unwrap_or(u32::MAX).saturating_mul(BAND_HEIGHT);
    let size = (960, FRAME_HEIGHT + bands.min(MAX_HEIGHT - FRAME_HEIGHT));
    if path.extension().is_some_and(|x| x == "png") {
        render(BitMapBackend::new(path, size).into_drawing_area(), d, path, title, size, (lo, hi))
    } else {
        render(SVGBackend::new(path, size).into_drawing_area(), d, path, title, size, (lo, hi))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvproof_engines::dump::CacheKind;
    use kvproof_engines::state_diff::{Distance, FirstRow, LayerDiff, RecordDiff, RowStats, TensorDiff};

    const DISTANCE: Distance = Distance { max_abs: 1.0, max_ulp: 1 };

    fn one_differing_row() -> RowStats {
        RowStats { rows_compared: 1, rows_identical: 0, distance: DISTANCE }
    }

    fn layer(layer: usize) -> LayerDiff {
        LayerDiff {
            layer,
            rows: one_differing_row(),
            rows_only_one_side: 0,
            first_divergent_pos: Some(0),
            first_tensor: Some("k".into()),
            writer_a: None,
            writer_b: None,
        }
    }

    fn tensor(layer: usize, position: i64) -> TensorDiff {
        TensorDiff {
            layer,
            name: "k".into(),
            kind: CacheKind::Full,
            rows: one_differing_row(),
            only_in_a: 0,
            only_in_b: 0,
            first_divergent_pos: Some(position),
            writer_a: None,
            writer_b: None,
            misplaced_a: 0,
            misplaced_b: 0,
            rotation_a: None,
            rotation_b: None,
            divergent: vec![(position, 1.0)],
            compared: vec![(position, position.saturating_add(1))],
        }
    }

    /// The (width, height) an SVG declares.
    fn svg_size(path: &Path) -> (u64, u64) {
        let svg = std::fs::read_to_string(path).expect("svg");
        let attr = |name: &str| -> u64 {
            let at = svg.find(&format!("{name}=\"")).expect(name) + name.len() + 2;
            svg[at..].split('"').next().and_then(|v| v.parse().ok()).expect("a number")
        };
        (attr("width"), attr("height"))
    }

    #[test]
    fn layer_indices_and_positions_from_a_diff_file_do_not_size_the_picture() {
        // what a hostile diff.json (or dump) may claim: huge layer indices, many layers, positions at the i64 edge
        let dir = std::env::temp_dir().join(format!("kvproof-heatmap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp");
        let edge = i64::MAX - 1;
        let mut layers: Vec<LayerDiff> = (0..20_000).map(layer).collect();
        layers.push(layer(usize::MAX));
        let d = StateDiff {
            arch: "x".into(),
            len_a: usize::MAX,
            len_b: usize::MAX,
            covered: usize::MAX,
            record: RecordDiff { len_a: 0, len_b: 0, first_diff: None, tainted_a: false, tainted_b: false },
            first: Some(FirstRow {
                layer: usize::MAX,
                tensor: "k".into(),
                kind: CacheKind::Full,
                position: edge,
                writer_a: None,
                writer_b: None,
                distance: DISTANCE,
            }),
            layers,
            tensors: vec![tensor(0, 3), tensor(usize::MAX, edge), tensor(7, i64::MAX)],
        };
        let path = dir.join("h.svg");
        draw(&d, &path, "hostile").expect("drawn");
        let (w, h) = svg_size(&path);
        assert!(w <= 960 && h <= u64::from(MAX_HEIGHT), "{w} x {h}");
        // positions far outside what the diff says it covered (plotters overflowed placing them)
        let mut outside = tensor(0, i64::MAX);
        outside.compared = vec![(i64::MIN, i64::MAX)];
        let d = StateDiff {
            covered: 40,
            first: d.first.map(|f| FirstRow { layer: 0, position: i64::MAX, ..f }),
            tensors: vec![outside, tensor(1, i64::MIN)],
            ..d
        };
        for ext in ["svg", "png"] {
            draw(&d, &dir.join(format!("outside.{ext}")), "outside").expect("drawn");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
