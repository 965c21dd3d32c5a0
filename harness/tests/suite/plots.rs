//! Plots are drawn as SVG and PNG with titles, axis labels and legends.

use kvproof::plot::bounds::{self, BoundBar};
use kvproof::plot::lines::{self, LineChart, Series};

use crate::support;
use support::tmp;

#[test]
fn line_chart_has_title_axes_and_legend() {
    let dir = tmp("lines");
    let chart = LineChart {
        title: "per-turn wall time vs context length".into(),
        x_label: "context length (tokens)".into(),
        y_label: "wall time per turn (ms)".into(),
        series: vec![
            Series {
                name: "warm (reuse)".into(),
                points: (1..=6).map(|i| (i as f64 * 500.0, 40.0 + i as f64)).collect(),
            },
            Series { name: "cold".into(), points: (1..=6).map(|i| (i as f64 * 500.0, 60.0 * i as f64)).collect() },
        ],
        y_from_zero: true,
        x_integer: false,
    };
    let (svg, png) = lines::draw(&chart, &dir.join("wall")).expect("draw");
    let text = std::fs::read_to_string(&svg).expect("svg");
    for needle in [
        "per-turn wall time vs context length",
        "context length (tokens)",
        "wall time per turn (ms)",
        "warm (reuse)",
        "cold",
    ] {
        assert!(text.contains(needle), "svg lacks {needle:?}");
    }
    let labels = text_lines(&text);
    assert!(labels.contains(&"3000"), "x tick labels are whole numbers: {labels:?}");
    assert!(!labels.iter().any(|l| l.ends_with(".0")), "a tick label ends in .0: {labels:?}");
    assert!(std::fs::metadata(&png).expect("png").len() > 5000);
}

#[test]
fn an_integer_axis_labels_whole_numbers_only() {
    let dir = tmp("integer-axis");
    let chart = LineChart {
        title: "trend".into(),
        x_label: "night".into(),
        y_label: "ratio (x)".into(),
        series: vec![Series { name: "a".into(), points: vec![(1.0, 1.1), (2.0, 1.12), (3.0, 1.09)] }],
        y_from_zero: true,
        x_integer: true,
    };
    let (svg, _) = lines::draw(&chart, &dir.join("trend")).expect("draw");
    let text = std::fs::read_to_string(&svg).expect("svg");
    let labels = text_lines(&text);
    for n in ["1", "2", "3"] {
        assert!(labels.contains(&n), "x tick {n} missing: {labels:?}");
    }
    for frac in ["1.5", "2.5", "1.2", "2.4"] {
        assert!(!labels.contains(&frac), "fractional x tick {frac} on a whole-number axis: {labels:?}");
    }
}

/// The texts of an SVG's `<text>` elements (plotters writes each on the line after its tag).
fn text_lines(svg: &str) -> Vec<&str> {
    let lines: Vec<&str> = svg.lines().collect();
    lines.windows(2).filter(|w| w[0].trim_start().starts_with("<text")).map(|w| w[1].trim()).collect()
}

/// The bar of `failures` in `trials`, bounded above at `upper`: no limit, no split.
fn bar(label: &str, failures: u64, trials: u64, upper: f64) -> BoundBar {
    BoundBar { label: label.into(), failures, trials, upper, limit: None, split: None }
}

#[test]
fn bounds_chart_draws_every_scenario() {
    let dir = tmp("bounds");
    let bars = vec![
        BoundBar { limit: Some(0.01), ..bar("inkling-stress", 0, 299, 0.00997) },
        BoundBar { limit: Some(0.01), ..bar("glm53-stress", 2, 300, 0.0213) },
    ];
    let (svg, png) =
        bounds::draw(&bars, "failure-rate bounds (95% one-sided)", "scenario (failures/trials)", &dir.join("bounds"))
            .expect("draw");
    let text = std::fs::read_to_string(&svg).expect("svg");
    assert!(text.contains("inkling-stress (0/299)") && text.contains("glm53-stress (2/300)"), "scenario labels");
    assert!(text.contains("failure rate (%)"));
    assert!(std::fs::metadata(&png).expect("png").len() > 5000);
    assert_bars_fill_the_axis(&text, 2);
}

#[test]
fn one_bar_fills_the_axis_and_no_limit_means_no_limit_legend() {
    let dir = tmp("one-bar");
    let bars = vec![bar("previous-turn", 3, 50, 0.15)];
    let (svg, _) = bounds::draw(&bars, "t", "stale context", &dir.join("b")).expect("draw");
    let text = std::fs::read_to_string(&svg).expect("svg");
    assert_bars_fill_the_axis(&text, 1);
    assert!(!text.contains("max_failure_rate"), "a limit legend without a limit");
}

#[test]
fn a_staleness_chart_splits_stale_from_corrupt() {
    let dir = tmp("split");
    let bars = vec![
        BoundBar { split: Some((15, 5)), ..bar("previous-turn", 20, 50, 0.55) },
        BoundBar { split: Some((0, 0)), ..bar("other-slot", 0, 50, 0.058) },
    ];
    let (svg, _) = bounds::draw(&bars, "t", "stale context", &dir.join("s")).expect("draw");
    let text = std::fs::read_to_string(&svg).expect("svg");
    let labels = text_lines(&text);
    assert!(labels.iter().any(|l| l.starts_with("observed stale(X)")), "{labels:?}");
    assert!(labels.iter().any(|l| l.starts_with("observed corrupt")), "{labels:?}");
    let height = |fill: &str| -> Vec<f64> {
        text.lines()
            .filter(|l| {
                l.starts_with("<rect") && l.contains(&format!("fill=\"{fill}\"")) && !l.contains("width=\"14\"")
            })
            .filter_map(|l| l.split(" height=\"").nth(1)?.split('"').next()?.parse().ok())
            .collect()
    };
    let (stale, corrupt) = (height("#FF7F0E"), height("#B41E1E"));
    assert_eq!((stale.len(), corrupt.len()), (2, 2), "{stale:?} {corrupt:?}");
    // 15 stale of 50 is three times 5 corrupt of 50; the other context has neither
    assert!((stale[0] - 3.0 * corrupt[0]).abs() <= 2.0, "stale {} vs corrupt {}", stale[0], corrupt[0]);
    assert!(stale[1] <= 1.0 && corrupt[1] <= 1.0, "{stale:?} {corrupt:?}");
}

/// The `n` bars are the only segments: the last one ends a margin (40 px) before the plot area's right edge (no
/// empty segment after it).
fn assert_bars_fill_the_axis(svg: &str, n: usize) {
    let attr = |tag: &str, name: &str| -> f64 {
        let key = format!(" {name}=\"");
        let from = tag.find(&key).expect("attribute") + key.len();
        tag[from..].split('"').next().and_then(|v| v.parse().ok()).expect("number")
    };
    let bars: Vec<(f64, f64)> = svg
        .lines()
        .filter(|l| l.starts_with("<rect") && l.contains("fill=\"#1F77B4\"") && attr(l, "width") > 20.0)
        .map(|l| (attr(l, "x"), attr(l, "width")))
        .collect();
    assert_eq!(bars.len(), n, "bars: {bars:?}");
    let right = svg
        .lines()
        .filter(|l| l.starts_with("<line") && l.contains("opacity=\"0.1\""))
        .map(|l| attr(l, "x2"))
        .fold(0.0, f64::max);
    let (x, w) = bars[n - 1];
    assert!((x + w + 40.0 - right).abs() <= 2.0, "last bar ends at {} but the axis at {right}", x + w);
}
