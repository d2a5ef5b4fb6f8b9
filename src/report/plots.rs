//! How the report page draws, with plotters' SVG backend: cumulative distributions, lines on a
//! log axis, horizontal bars and coloured grids (of counts, or of outcomes in words), from a result's
//! tables and metrics (never from the expectations). Which table becomes which plot is the
//! business of what made the result (a scenario's `plots`, explore's, verify's); nothing here
//! knows a scenario.

use anyhow::{anyhow, bail, Result};
use plotters::coord::ranged1d::SegmentedCoord;
use plotters::coord::types::RangedCoordi32;
use plotters::coord::{CoordTranslate, Shift};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::report::{decimals, Report, Table};

mod grid;
pub use grid::{category_grid, matrix_grid, Category};

/// Size of a plot in SVG pixels; the page scales it to its column.
const WIDTH: u32 = 760;
const HEIGHT: u32 = 380;
/// Okabe–Ito colours: told apart with every common colour-vision deficiency.
pub const SERIES_COLOURS: [RGBColor; 6] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
];
/// For a count that shows nothing went wrong, and for one that shows damage.
pub const GOOD: RGBColor = RGBColor(0, 158, 115);
pub const BAD: RGBColor = RGBColor(213, 94, 0);
/// For an outcome stuck for good without damage (a stall that never ends, a dead letter), and
/// for one that waited and then went on (Okabe–Ito, beside the two above).
pub const STUCK: RGBColor = RGBColor(204, 121, 167);
pub const WAITED: RGBColor = RGBColor(240, 228, 66);
const FONT: &str = "sans-serif";

/// One plot of the page.
#[derive(Debug, Clone)]
pub struct Plot {
    /// Stable name, for the page's anchors and for tests.
    pub id: &'static str,
    /// What it shows, as the figure's caption.
    pub title: String,
    /// A complete `<svg>` element.
    pub svg: String,
}

/// The first table of the report that has all these columns (None in a result saved without it,
/// by an older outbox-lab).
pub fn table_with<'r>(report: &'r Report, columns: &[&str]) -> Option<&'r Table> {
    report
        .tables
        .iter()
        .find(|t| columns.iter().all(|c| t.column(c).is_some()))
}

/// A grid of outcomes ([`category_grid`]) from the report's table of `rows` (its first column)
/// by `columns`; nothing where the result has no such table.
pub fn outcome_grid(
    id: &'static str,
    report: &Report,
    rows: &'static str,
    columns: impl IntoIterator<Item = &'static str>,
    kinds: &[Category],
) -> Result<Vec<Plot>> {
    let columns: Vec<&str> = std::iter::once(rows).chain(columns).collect();
    Ok(match table_with(report, &columns) {
        Some(outcomes) => vec![category_grid(id, outcomes, kinds)?],
        None => Vec::new(),
    })
}

/// The words along a chart's axes.
pub struct Axes<'a> {
    pub x: &'a str,
    pub y: &'a str,
}

/// Cumulative distribution of the numbers in column `value` per group of column `group` (log x
/// axis, y as a share): one step line per group, labelled with its count of `noun`.
pub fn cdf(samples: &Table, group: &str, value: &str, axes: Axes, noun: &str) -> Result<String> {
    let group = column(samples, group)?;
    let value = column(samples, value)?;
    let mut groups = grouped(samples, group, |row| number(&row[value]))?;
    let all = groups.iter().flat_map(|(_, v)| v.iter().copied());
    let (low, high) = bounds(all).ok_or_else(|| anyhow!("no {noun} in '{}'", samples.title))?;
    render(WIDTH, HEIGHT, |area| {
        let mut chart = ChartBuilder::on(area)
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(56)
            .build_cartesian_2d(((low * 0.8).max(0.01)..high * 1.25).log_scale(), 0.0..1.0)?;
        chart
            .configure_mesh()
            .x_desc(axes.x)
            .y_desc(axes.y)
            .y_label_formatter(&|share| format!("{:.0}%", share * 100.0))
            .x_label_formatter(&|v| short_number(*v))
            .label_style((FONT, 13))
            .draw()?;
        for (i, (name, values)) in groups.iter_mut().enumerate() {
            values.sort_by(f64::total_cmp);
            let colour = SERIES_COLOURS[i % SERIES_COLOURS.len()];
            let n = values.len() as f64;
            // A step at each sample: the share of samples at or below that value.
            let steps = values
                .iter()
                .enumerate()
                .flat_map(|(k, &v)| [(v, k as f64 / n), (v, (k + 1) as f64 / n)]);
            let label = format!("{name} ({} {noun})", values.len());
            line(&mut chart, steps, colour, label)?;
        }
        // A CDF climbs to the right: its lower right corner stays empty.
        legend(&mut chart, SeriesLabelPosition::LowerRight)
    })
}

/// Column `y` against column `x` (log x axis), a line per group of column `series`, each
/// point marked.
pub fn log_x_lines(points: &Table, series: &str, x: &str, y: &str, axes: Axes) -> Result<String> {
    let series = column(points, series)?;
    let x = column(points, x)?;
    let y = column(points, y)?;
    let lines = grouped(points, series, |row| {
        Ok((number(&row[x])?, number(&row[y])?))
    })?;
    let all = || lines.iter().flat_map(|(_, p)| p.iter().copied());
    let no_points = || anyhow!("no points in '{}'", points.title);
    let (low, high) = bounds(all().map(|p| p.0)).ok_or_else(no_points)?;
    let (_, top) = bounds(all().map(|p| p.1)).ok_or_else(no_points)?;
    render(WIDTH, HEIGHT, |area| {
        let mut chart = ChartBuilder::on(area)
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(70)
            .build_cartesian_2d(
                ((low / 2.0).max(0.5)..high * 2.0).log_scale(),
                0.0..top * 1.15,
            )?;
        chart
            .configure_mesh()
            .x_desc(axes.x)
            .y_desc(axes.y)
            .x_label_formatter(&|v| short_number(*v))
            .y_label_formatter(&|v| short_number(*v))
            .label_style((FONT, 13))
            .draw()?;
        for (i, (name, points)) in lines.iter().enumerate() {
            let colour = SERIES_COLOURS[i % SERIES_COLOURS.len()];
            line(&mut chart, points.iter().copied(), colour, name.clone())?;
            chart.draw_series(
                points
                    .iter()
                    .map(|&point| Circle::new(point, 4, colour.filled())),
            )?;
        }
        legend(&mut chart, SeriesLabelPosition::UpperLeft)
    })
}

/// A moment marked on a [`timeline`]: a vertical line with its label.
pub struct Marker {
    pub at: f64,
    pub label: String,
}

/// Column `y` against column `x` (linear axes) as one line, with `markers` as labelled
/// vertical lines: what happened over a run, and when its faults struck.
pub fn timeline(
    points: &Table,
    x: &str,
    y: &str,
    markers: &[Marker],
    axes: Axes,
) -> Result<String> {
    let (x, y) = (column(points, x)?, column(points, y)?);
    let line_points = points
        .rows
        .iter()
        .map(|row| Ok((number(&row[x])?, number(&row[y])?)))
        .collect::<Result<Vec<(f64, f64)>>>()?;
    let no_points = || anyhow!("no points in '{}'", points.title);
    let xs = line_points
        .iter()
        .map(|p| p.0)
        .chain(markers.iter().map(|m| m.at));
    let (_, right) = bounds(xs).ok_or_else(no_points)?;
    let (_, top) = bounds(line_points.iter().map(|p| p.1)).ok_or_else(no_points)?;
    let top = top.max(1.0) * 1.25;
    render(WIDTH, HEIGHT, |area| {
        let mut chart = ChartBuilder::on(area)
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..right * 1.05 + 1.0, 0.0..top)?;
        chart
            .configure_mesh()
            .x_desc(axes.x)
            .y_desc(axes.y)
            .x_label_formatter(&|v| short_number(*v))
            .y_label_formatter(&|v| short_number(*v))
            .label_style((FONT, 13))
            .draw()?;
        line(
            &mut chart,
            line_points.iter().copied(),
            SERIES_COLOURS[0],
            axes.y.into(),
        )?;
        for (i, marker) in markers.iter().enumerate() {
            let colour = BAD;
            chart.draw_series(LineSeries::new(
                [(marker.at, 0.0), (marker.at, top * 0.92)],
                colour.stroke_width(1),
            ))?;
            // Staggered, so that faults close in time keep readable labels.
            let height = top * (0.95 - 0.06 * (i % 4) as f64);
            chart.draw_series(std::iter::once(Text::new(
                marker.label.clone(),
                (marker.at, height),
                (FONT, 11).into_font().color(&colour),
            )))?;
        }
        legend(&mut chart, SeriesLabelPosition::UpperRight)
    })
}

/// A bar of a horizontal bar chart.
pub struct Bar {
    pub label: String,
    pub value: f64,
    /// Written at the end of the bar.
    pub text: String,
    pub colour: RGBColor,
}

/// Bars from top to bottom in the given order, labelled on the left, values written beside.
pub fn horizontal_bars(bars: &[Bar], x_desc: &str) -> Result<String> {
    if bars.is_empty() {
        bail!("nothing to draw");
    }
    let n = bars.len();
    let most = bars.iter().fold(0.0_f64, |a, b| a.max(b.value));
    // Room for the text after the longest bar; a scale even when every value is 0.
    let right = if most > 0.0 { most * 1.35 } else { 1.0 };
    let label_width = 16 + 7 * longest(bars.iter().map(|b| b.label.as_str()));
    let height = (60 + 40 * n as u32).max(200);
    render(WIDTH, height, |area| {
        let mut chart = ChartBuilder::on(area)
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(label_width)
            .build_cartesian_2d(0.0..right, categories(n))?;
        let top_down = |i: usize| (n - 1 - i) as i32;
        // Segment 0 is at the bottom: the first bar's label goes last.
        let labels: Vec<String> = bars.iter().rev().map(|b| b.label.clone()).collect();
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(n)
            .y_label_formatter(&|v| segment_label(v, &labels))
            .x_label_formatter(&|v| short_number(*v))
            .x_desc(x_desc)
            .label_style((FONT, 13))
            .draw()?;
        for (i, bar) in bars.iter().enumerate() {
            let y = top_down(i);
            let mut rect = Rectangle::new(
                [
                    (0.0, SegmentValue::Exact(y)),
                    (bar.value, SegmentValue::Exact(y + 1)),
                ],
                bar.colour.filled(),
            );
            rect.set_margin(6, 6, 0, 0);
            chart.draw_series(std::iter::once(rect))?;
            let style =
                TextStyle::from((FONT, 13).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
            chart.draw_series(std::iter::once(Text::new(
                format!(" {}", bar.text),
                (bar.value, SegmentValue::CenterOf(y)),
                style,
            )))?;
        }
        Ok(())
    })
}

/// The table's rows grouped by the text in column `key`, in order of first appearance, each
/// row read into a value.
fn grouped<T>(
    table: &Table,
    key: usize,
    value: impl Fn(&[String]) -> Result<T>,
) -> Result<Vec<(String, Vec<T>)>> {
    let mut groups: Vec<(String, Vec<T>)> = Vec::new();
    for row in &table.rows {
        let value = value(row)?;
        match groups.iter_mut().find(|(name, _)| *name == row[key]) {
            Some((_, values)) => values.push(value),
            None => groups.push((row[key].clone(), vec![value])),
        }
    }
    Ok(groups)
}

/// A line in `colour`, with its entry in the legend.
fn line<CT: CoordTranslate<From = (f64, f64)>>(
    chart: &mut ChartContext<'_, SVGBackend<'_>, CT>,
    points: impl IntoIterator<Item = (f64, f64)>,
    colour: RGBColor,
    label: String,
) -> Result<()> {
    chart
        .draw_series(LineSeries::new(points, colour.stroke_width(2)))?
        .label(label)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2)));
    Ok(())
}

/// The legend of the chart's lines, at `position`.
fn legend<'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, CT>,
    position: SeriesLabelPosition,
) -> Result<()> {
    chart
        .configure_series_labels()
        .position(position)
        .label_font((FONT, 13))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .draw()?;
    Ok(())
}

/// An axis of `n` categories, one segment each (an integer range includes its end).
fn categories(n: usize) -> SegmentedCoord<RangedCoordi32> {
    (0..n as i32 - 1).into_segmented()
}

/// Draws on a fresh white SVG canvas and returns the `<svg>` element.
fn render(
    width: u32,
    height: u32,
    draw: impl FnOnce(&DrawingArea<SVGBackend<'_>, Shift>) -> Result<()>,
) -> Result<String> {
    let mut svg = String::new();
    {
        let area = SVGBackend::with_string(&mut svg, (width, height)).into_drawing_area();
        area.fill(&WHITE)?;
        draw(&area)?;
        area.present()?;
    }
    Ok(svg)
}

/// The index of column `name`, or an error naming the table.
pub fn column(table: &Table, name: &str) -> Result<usize> {
    table
        .column(name)
        .ok_or_else(|| anyhow!("table '{}' has no column {name}", table.title))
}

/// A cell read as a number, or an error quoting it.
pub fn number(cell: &str) -> Result<f64> {
    cell.trim()
        .parse()
        .map_err(|_| anyhow!("'{cell}' is not a number"))
}

fn bounds(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    values.fold(None, |range, v| match range {
        None => Some((v, v)),
        Some((low, high)) => Some((low.min(v), high.max(v))),
    })
}

/// Axis labels without a wall of digits: 0.25, 2, 2.5, 20, 1k, 1.5k, 12k.
fn short_number(v: f64) -> String {
    match v.abs() {
        a if a >= 10_000.0 => format!("{:.0}k", v / 1000.0),
        a if a >= 1000.0 => format!("{}k", decimals(v / 1000.0, 1)),
        a if a >= 10.0 => format!("{v:.0}"),
        a if a >= 1.0 => decimals(v, 1),
        _ => decimals(v, 2),
    }
}

/// Characters of the longest label, to size the label area (plotters measures text only
/// roughly without a font library, so this errs on the wide side).
fn longest<'a>(labels: impl Iterator<Item = &'a str>) -> u32 {
    labels.map(|l| l.chars().count() as u32).max().unwrap_or(0)
}

/// The name of a segment of a categorical axis (plotters also asks beyond the last one).
fn segment_label(value: &SegmentValue<i32>, names: &[String]) -> String {
    match value {
        SegmentValue::CenterOf(i) => usize::try_from(*i)
            .ok()
            .and_then(|i| names.get(i))
            .cloned()
            .unwrap_or_default(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_numbers() {
        assert_eq!(short_number(0.0), "0");
        assert_eq!(short_number(0.25), "0.25");
        assert_eq!(short_number(5.0), "5");
        assert_eq!(short_number(2.5), "2.5");
        assert_eq!(short_number(100.0), "100");
        assert_eq!(short_number(1000.0), "1k");
        assert_eq!(short_number(1500.0), "1.5k");
        assert_eq!(short_number(25000.0), "25k");
    }
}
