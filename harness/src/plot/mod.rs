//! Plots (plotters): SVG always, PNG beside it, text drawn with an embedded font so no system font library is
//! needed.

pub mod bounds;
pub mod heatmap;
pub mod lines;

use std::sync::Once;

/// DejaVu Sans (Bitstream Vera license, harness/assets/DejaVuSans.LICENSE).
static FONT: &[u8] = include_bytes!("../../assets/DejaVuSans.ttf");

/// The family every plot uses.
pub const FAMILY: &str = "sans-serif";

/// Register the embedded font with plotters once per process.
pub fn init_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // the font is compiled in and known good; a failure here would only mean text is not drawn
        let _ = plotters::style::register_font(FAMILY, plotters::style::FontStyle::Normal, FONT);
    });
}

/// Errors of the plotting code: the file being drawn and what went wrong.
#[derive(Debug, thiserror::Error)]
#[error("{path}: cannot draw plot: {message}")]
pub struct PlotError {
    pub path: std::path::PathBuf,
    pub message: String,
}

impl PlotError {
    pub fn new(path: &std::path::Path, e: impl std::fmt::Display) -> Self {
        PlotError { path: path.to_path_buf(), message: e.to_string() }
    }
}

/// Draw the chart's series legend at `position` (the same box on every chart), then present the picture.
pub(crate) fn finish_with_legend<'a, DB, CT>(
    chart: &mut plotters::chart::ChartContext<'a, DB, CT>,
    root: &plotters::drawing::DrawingArea<DB, plotters::coord::Shift>,
    position: plotters::chart::SeriesLabelPosition,
    path: &std::path::Path,
) -> Result<(), PlotError>
where
    DB: plotters::backend::DrawingBackend + 'a,
    CT: plotters::coord::CoordTranslate,
{
    use plotters::style::{Color, RGBColor, WHITE};
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(180, 180, 180))
        .label_font((FAMILY, 13))
        .draw()
        .map_err(|x| PlotError::new(path, x))?;
    root.present().map_err(|x| PlotError::new(path, x))
}
