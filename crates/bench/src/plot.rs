//! Line charts as SVG (plotters): text is written as SVG `<text>` elements for the viewer
//! to render, so no font is read at any point. Used by the RainBlock and dkv benchmarks.

use std::ops::Range;
use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::coord::ranged1d::{AsRangedCoord, Ranged, ValueFormatter};
use plotters::prelude::*;

const SVG_WIDTH_PX: u32 = 900;
const SVG_HEIGHT_PX: u32 = 560;
/// About the height of the plotting area inside the SVG (less caption, margins, x labels).
const PLOT_HEIGHT_PX: f64 = 450.0;

/// Line colours, all readable on white.
const LINE_COLOURS: [RGBColor; 8] = [
    RGBColor(31, 100, 180),
    RGBColor(230, 110, 0),
    RGBColor(40, 150, 60),
    RGBColor(200, 30, 40),
    RGBColor(130, 80, 180),
    RGBColor(120, 80, 60),
    RGBColor(210, 80, 160),
    RGBColor(90, 90, 90),
];

/// One line of a chart.
pub(crate) struct Line {
    pub(crate) label: String,
    /// Lines with the same colour index share a colour (e.g. one N's full and compact bytes).
    pub(crate) colour: usize,
    pub(crate) dashed: bool,
    /// (x, y), x a multiple of the chart's `x_step`.
    pub(crate) points: Vec<(f64, f64)>,
}

pub(crate) struct Chart<'a> {
    pub(crate) title: &'a str,
    pub(crate) x_label: &'a str,
    /// The spacing of the x values (1 for counts; 0.2 for Zipf exponents): the axis is
    /// labelled at its multiples and padded by half of it.
    pub(crate) x_step: f64,
    pub(crate) y_label: &'a str,
    pub(crate) lines: Vec<Line>,
}

impl Chart<'_> {
    /// Half a step beyond the smallest and largest x, so no point sits on the frame.
    fn x_range(&self) -> Range<f64> {
        let xs = self.lines.iter().flat_map(|line| line.points.iter().map(|&(x, _)| x));
        let (low, high) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(low, high), x| (low.min(x), high.max(x)));
        let half = self.x_step / 2.0;
        if low.is_finite() {
            (low - half)..(high + half)
        } else {
            (1.0 - half)..(1.0 + half)
        }
    }

    /// The share of the plot's height kept free above the lines for the legend (upper right).
    pub(crate) fn legend_share(&self) -> f64 {
        ((24.0 + 18.0 * self.lines.len() as f64) / PLOT_HEIGHT_PX).min(0.6)
    }

    pub(crate) fn ys(&self) -> impl Iterator<Item = f64> + '_ {
        self.lines.iter().flat_map(|line| line.points.iter().map(|&(_, y)| y)).filter(|y| y.is_finite())
    }
}

/// Draws `chart` into an SVG file at `path` with the y axis `y_range`.
pub(crate) fn draw<Y>(path: &Path, chart: &Chart<'_>, y_range: Y, y_format: &dyn Fn(&f64) -> String) -> Result<()>
where
    Y: AsRangedCoord<Value = f64>,
    Y::CoordDescType: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let failed = |error: &dyn std::fmt::Display| anyhow!("drawing {}: {error}", path.display());
    let root = SVGBackend::new(path, (SVG_WIDTH_PX, SVG_HEIGHT_PX)).into_drawing_area();
    root.fill(&WHITE).map_err(|error| failed(&error))?;
    let x_range = chart.x_range();
    // At most one label per step; only multiples of the step are labelled.
    let step = chart.x_step;
    let x_ticks = (((x_range.end - x_range.start) / step).round() as usize).clamp(2, 16);
    let mut context = ChartBuilder::on(&root)
        .caption(chart.title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(84)
        .build_cartesian_2d(x_range, y_range)
        .map_err(|error| failed(&error))?;
    context
        .configure_mesh()
        .x_desc(chart.x_label)
        .y_desc(chart.y_label)
        .x_labels(x_ticks)
        .x_label_formatter(&|x| {
            if ((x / step) - (x / step).round()).abs() < 1e-6 {
                axis_number((x / step).round() * step)
            } else {
                String::new()
            }
        })
        .y_label_formatter(y_format)
        .axis_desc_style(("sans-serif", 16))
        .draw()
        .map_err(|error| failed(&error))?;
    for line in &chart.lines {
        let style = LINE_COLOURS[line.colour % LINE_COLOURS.len()].stroke_width(2);
        let points = line.points.iter().copied().filter(|(_, y)| y.is_finite());
        let dashed = line.dashed;
        let annotated = if dashed {
            context.draw_series(DashedLineSeries::new(points, 8, 5, style)).map_err(|error| failed(&error))?
        } else {
            context.draw_series(LineSeries::new(points, style).point_size(3)).map_err(|error| failed(&error))?
        };
        annotated.label(line.label.as_str()).legend(move |(x, y)| {
            if dashed {
                PathElement::new(vec![(x, y), (x + 8, y)], style)
            } else {
                PathElement::new(vec![(x, y), (x + 20, y)], style)
            }
        });
    }
    context
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(|error| failed(&error))?;
    root.present().map_err(|error| failed(&error))?;
    Ok(())
}

/// A linear y axis from 0 to above the largest value (room for the legend).
pub(crate) fn linear_axis(chart: &Chart<'_>) -> Range<f64> {
    let top = chart.ys().fold(0.0f64, f64::max);
    0.0..if top > 0.0 { top / (1.0 - chart.legend_share()) } else { 1.0 }
}

/// A number for an axis label: no more digits than it needs.
pub(crate) fn axis_number(value: f64) -> String {
    let magnitude = value.abs();
    if magnitude >= 100.0 || value == value.round() {
        format!("{value:.0}")
    } else if magnitude >= 1.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    }
}

/// One line for [`line_chart`]: lines that share a `colour` are drawn in one colour.
pub struct Series {
    pub label: String,
    pub colour: usize,
    pub dashed: bool,
    pub points: Vec<(f64, f64)>,
}

/// Draws `series` as a line chart with a linear y axis from 0, for harnesses outside this
/// crate (x values are multiples of `x_step`).
pub fn line_chart(
    path: &Path,
    title: &str,
    x_label: &str,
    x_step: f64,
    y_label: &str,
    series: Vec<Series>,
) -> Result<()> {
    let lines = series
        .into_iter()
        .map(|series| Line { label: series.label, colour: series.colour, dashed: series.dashed, points: series.points })
        .collect();
    let chart = Chart { title, x_label, x_step, y_label, lines };
    draw(path, &chart, linear_axis(&chart), &|y| axis_number(*y))
}
