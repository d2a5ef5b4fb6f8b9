//! The plots of the report page, drawn with plotters' SVG backend from a scenario's saved
//! tables and metrics (never from the expectations): latency distribution per relay mode,
//! throughput against batch size per sink, ordering violations per relay configuration, table
//! size through the cleanup steps, and a coloured grid for any matrix of counts.

use anyhow::{anyhow, bail, Context, Result};
use plotters::coord::ranged1d::SegmentedCoord;
use plotters::coord::types::RangedCoordi32;
use plotters::coord::{CoordTranslate, Shift};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::report::{decimals, Metrics, Report, Table};

/// Size of a plot in SVG pixels; the page scales it to its column.
const WIDTH: u32 = 760;
const HEIGHT: u32 = 380;
/// Okabe–Ito colours: told apart with every common colour-vision deficiency.
const SERIES_COLOURS: [RGBColor; 6] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
];
const GOOD: RGBColor = RGBColor(0, 158, 115);
const BAD: RGBColor = RGBColor(213, 94, 0);
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

/// The plots a scenario's result supports; none when it has no table to draw from (a result
/// saved by an older outbox-lab, a scenario without a plot).
pub fn for_report(report: &Report) -> Result<Vec<Plot>> {
    let plot = match report.scenario.as_str() {
        "notify-latency" => table_with(report, &["mode", "latency_ms"]).map(latency_cdf),
        "batch-throughput" => {
            table_with(report, &["sink", "batch", "events_per_s"]).map(throughput_by_batch)
        }
        "multi-relay-ordering" => {
            table_with(report, &["relays", "partitioned", "orders_out_of_order"])
                .map(ordering_violations)
        }
        "cleanup" => Some(cleanup_table_size(&report.metrics)),
        "explore" => {
            let invariants = ["design", "ghost", "lost", "duplicate", "order", "liveness"];
            let matrix = report.tables.iter().find_map(|t| t.select(&invariants));
            matrix.map(|m| matrix_grid("explore-matrix", &m))
        }
        _ => None,
    };
    let plot = plot
        .transpose()
        .with_context(|| format!("cannot plot the results of {}", report.scenario))?;
    Ok(plot.into_iter().collect())
}

/// The first table of the report that has all these columns.
fn table_with<'r>(report: &'r Report, columns: &[&str]) -> Option<&'r Table> {
    report
        .tables
        .iter()
        .find(|t| columns.iter().all(|c| t.column(c).is_some()))
}

/// Cumulative distribution of latency per relay mode (log x axis): one step line per mode, from
/// a table with the columns `mode` and `latency_ms` (one row per event).
pub fn latency_cdf(samples: &Table) -> Result<Plot> {
    let mode = column(samples, "mode")?;
    let latency = column(samples, "latency_ms")?;
    let mut modes = grouped(samples, mode, |row| number(&row[latency]))?;
    let all = modes.iter().flat_map(|(_, v)| v.iter().copied());
    let (low, high) = bounds(all).ok_or_else(|| anyhow!("no latency samples"))?;
    let svg = render(WIDTH, HEIGHT, |area| {
        let mut chart = ChartBuilder::on(area)
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(56)
            .build_cartesian_2d(((low * 0.8).max(0.01)..high * 1.25).log_scale(), 0.0..1.0)?;
        chart
            .configure_mesh()
            .x_desc("latency, created_at to received_at (ms, log scale)")
            .y_desc("share of events")
            .y_label_formatter(&|share| format!("{:.0}%", share * 100.0))
            .x_label_formatter(&|ms| short_number(*ms))
            .label_style((FONT, 13))
            .draw()?;
        for (i, (name, values)) in modes.iter_mut().enumerate() {
            values.sort_by(f64::total_cmp);
            let colour = SERIES_COLOURS[i % SERIES_COLOURS.len()];
            let n = values.len() as f64;
            // A step at each sample: the share of events delivered within that latency.
            let steps = values
                .iter()
                .enumerate()
                .flat_map(|(k, &ms)| [(ms, k as f64 / n), (ms, (k + 1) as f64 / n)]);
            let label = format!("{name} ({} events)", values.len());
            line(&mut chart, steps, colour, label)?;
        }
        // A CDF climbs to the right: its lower right corner stays empty.
        legend(&mut chart, SeriesLabelPosition::LowerRight)
    })?;
    Ok(Plot {
        id: "latency-cdf",
        title: "Latency distribution per relay mode (cumulative)".into(),
        svg,
    })
}

/// Events per second against batch size (log x axis), a line per sink, from a table with the
/// columns `sink`, `batch` and `events_per_s`.
pub fn throughput_by_batch(cells: &Table) -> Result<Plot> {
    let sink = column(cells, "sink")?;
    let batch = column(cells, "batch")?;
    let rate = column(cells, "events_per_s")?;
    let sinks = grouped(cells, sink, |row| {
        Ok((number(&row[batch])?, number(&row[rate])?))
    })?;
    let points = || sinks.iter().flat_map(|(_, p)| p.iter().copied());
    let (low, high) = bounds(points().map(|p| p.0)).ok_or_else(|| anyhow!("no cells"))?;
    let (_, top) = bounds(points().map(|p| p.1)).ok_or_else(|| anyhow!("no cells"))?;
    let svg = render(WIDTH, HEIGHT, |area| {
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
            .x_desc("batch size (rows per fetch, log scale)")
            .y_desc("events per second")
            .x_label_formatter(&|b| short_number(*b))
            .y_label_formatter(&|r| short_number(*r))
            .label_style((FONT, 13))
            .draw()?;
        for (i, (name, points)) in sinks.iter().enumerate() {
            let colour = SERIES_COLOURS[i % SERIES_COLOURS.len()];
            line(&mut chart, points.iter().copied(), colour, name.clone())?;
            chart.draw_series(
                points
                    .iter()
                    .map(|&point| Circle::new(point, 4, colour.filled())),
            )?;
        }
        legend(&mut chart, SeriesLabelPosition::UpperLeft)
    })?;
    Ok(Plot {
        id: "throughput-by-batch",
        title: "Throughput against batch size, per sink".into(),
        svg,
    })
}

/// Orders delivered out of order per relay configuration, from a table with the columns
/// `relays`, `partitioned` and `orders_out_of_order` (and `reversals`, shown beside, if there).
pub fn ordering_violations(configurations: &Table) -> Result<Plot> {
    let relays = column(configurations, "relays")?;
    let partitioned = column(configurations, "partitioned")?;
    let out_of_order = column(configurations, "orders_out_of_order")?;
    let reversals = configurations.column("reversals");
    let mut bars = Vec::new();
    for row in &configurations.rows {
        let count = number(&row[out_of_order])?;
        let layout = match row[partitioned].as_str() {
            "true" | "t" => "partitioned",
            _ => "unpartitioned",
        };
        let plural = if row[relays] == "1" {
            "relay"
        } else {
            "relays"
        };
        let mut value = format!("{count:.0} orders");
        if let Some(reversals) = reversals {
            value.push_str(&format!(" ({} reversals)", row[reversals]));
        }
        bars.push(Bar {
            label: format!("{} {plural}, {layout}", row[relays]),
            value: count,
            text: value,
            colour: if count > 0.0 { BAD } else { GOOD },
        });
    }
    Ok(Plot {
        id: "ordering-violations",
        title: "Orders whose events arrived out of order, per relay configuration".into(),
        svg: horizontal_bars(&bars, "orders with an event overtaken by a later one")?,
    })
}

/// The outbox table's file size after each step of the cleanup scenario, from its metrics
/// `size_<step>_bytes` (before, after DELETE, after VACUUM, after VACUUM FULL).
pub fn cleanup_table_size(metrics: &Metrics) -> Result<Plot> {
    let steps = [
        ("after loading", "size_before_bytes"),
        ("after DELETE", "size_after_delete_bytes"),
        ("after VACUUM", "size_after_vacuum_bytes"),
        ("after VACUUM FULL", "size_after_vacuum_full_bytes"),
    ];
    let bars = steps
        .iter()
        .map(|(label, metric)| {
            let bytes = metrics
                .get(metric)
                .and_then(serde_json::Value::as_f64)
                .ok_or_else(|| anyhow!("metric {metric} missing"))?;
            let mb = bytes / 1_048_576.0;
            let text = if mb < 1.0 {
                format!("{:.0} kB", bytes / 1024.0)
            } else {
                format!("{mb:.1} MB")
            };
            Ok(Bar {
                label: label.to_string(),
                value: mb,
                text,
                colour: SERIES_COLOURS[0],
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Plot {
        id: "cleanup-table-size",
        title: "Size of the outbox table's file through the cleanup steps".into(),
        svg: horizontal_bars(&bars, "table file size (MB)")?,
    })
}

/// A coloured grid of counts: one row per table row (its first cell names it), one column per
/// further column; green where the count is 0, deeper red the larger it is, grey where a cell
/// does not start with a number. A cell counts by its leading number and is written as it is
/// (`3`, `3/40`, `3/40*`). Made for explore's matrix of violations (crash point or design ×
/// invariant), and for any table shaped like it.
pub fn matrix_grid(id: &'static str, matrix: &Table) -> Result<Plot> {
    if matrix.columns.len() < 2 || matrix.rows.is_empty() {
        bail!(
            "a matrix needs a label column, a column of counts and a row; '{}' has {} columns and {} rows",
            matrix.title,
            matrix.columns.len(),
            matrix.rows.len()
        );
    }
    let (rows, columns) = (matrix.rows.len(), matrix.columns.len() - 1);
    let counts: Vec<Vec<Option<f64>>> = matrix
        .rows
        .iter()
        .map(|row| {
            (1..=columns)
                .map(|c| row.get(c).and_then(|cell| leading_number(cell)))
                .collect()
        })
        .collect();
    let most = counts
        .iter()
        .flatten()
        .flatten()
        .fold(0.0_f64, |a, &b| a.max(b));
    let row_label_width = 12 + 7 * longest(matrix.rows.iter().map(|r| r[0].as_str()));
    let width = (row_label_width + 120 * columns as u32 + 24).max(360);
    let height = 70 + 30 * rows as u32;
    let svg = render(width, height, |area| {
        let mut chart = ChartBuilder::on(area)
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(row_label_width)
            .build_cartesian_2d(categories(columns), categories(rows))?;
        let top_down = |r: usize| (rows - 1 - r) as i32;
        // Segment 0 is at the bottom: the first row's name goes last.
        let row_names: Vec<String> = matrix.rows.iter().rev().map(|r| r[0].clone()).collect();
        chart
            .configure_mesh()
            .disable_mesh()
            .x_labels(columns)
            .y_labels(rows)
            .x_label_formatter(&|v| segment_label(v, &matrix.columns[1..]))
            .y_label_formatter(&|v| segment_label(v, &row_names))
            .label_style((FONT, 12))
            .draw()?;
        for (r, row) in counts.iter().enumerate() {
            for (c, count) in row.iter().enumerate() {
                let (x, y) = (c as i32, top_down(r));
                let fill = match *count {
                    None => RGBColor(221, 221, 221),
                    Some(n) if n <= 0.0 => RGBColor(199, 233, 192),
                    Some(n) => heat(n / most),
                };
                let mut cell = Rectangle::new(
                    [
                        (SegmentValue::Exact(x), SegmentValue::Exact(y)),
                        (SegmentValue::Exact(x + 1), SegmentValue::Exact(y + 1)),
                    ],
                    fill.filled(),
                );
                cell.set_margin(1, 1, 1, 1);
                chart.draw_series(std::iter::once(cell))?;
                let text = matrix.rows[r].get(c + 1).cloned().unwrap_or_default();
                let ink = match *count {
                    Some(n) if n > 0.0 && n / most > 0.5 => WHITE,
                    _ => BLACK,
                };
                let style = TextStyle::from((FONT, 13).into_font())
                    .color(&ink)
                    .pos(Pos::new(HPos::Center, VPos::Center));
                chart.draw_series(std::iter::once(Text::new(
                    text,
                    (SegmentValue::CenterOf(x), SegmentValue::CenterOf(y)),
                    style,
                )))?;
            }
        }
        Ok(())
    })?;
    Ok(Plot {
        id,
        title: matrix.title.clone(),
        svg,
    })
}

/// A bar of a horizontal bar chart.
struct Bar {
    label: String,
    value: f64,
    /// Written at the end of the bar.
    text: String,
    colour: RGBColor,
}

/// Bars from top to bottom in the given order, labelled on the left, values written beside.
fn horizontal_bars(bars: &[Bar], x_desc: &str) -> Result<String> {
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

fn column(table: &Table, name: &str) -> Result<usize> {
    table
        .column(name)
        .ok_or_else(|| anyhow!("table '{}' has no column {name}", table.title))
}

fn number(cell: &str) -> Result<f64> {
    cell.trim()
        .parse()
        .map_err(|_| anyhow!("'{cell}' is not a number"))
}

/// `3` of `3`, `3/40` or `3/40*`; None when the text does not start with a digit.
fn leading_number(cell: &str) -> Option<f64> {
    let cell = cell.trim();
    let end = cell
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(cell.len());
    cell[..end].parse().ok()
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

/// From light orange (a few) to dark red (the most), for counts above zero.
fn heat(share: f64) -> RGBColor {
    let share = share.clamp(0.0, 1.0);
    let mix = |light: f64, dark: f64| (light + (dark - light) * share).round() as u8;
    RGBColor(mix(253.0, 165.0), mix(208.0, 15.0), mix(162.0, 21.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The matrix grid draws any rows × columns table of counts: a cell per count, its number
    /// written in it, non-numbers greyed.
    #[test]
    fn matrix_grid_draws_a_cell_per_count() {
        let mut matrix = Table::new(
            "violations per crash point and design",
            &["crash point", "naive", "idempotent", "mark-before-send"],
        );
        matrix.push(vec![
            "relay-after-send-before-mark".into(),
            "3".into(),
            "0".into(),
            "0".into(),
        ]);
        matrix.push(vec![
            "writer-before-commit".into(),
            "0/40".into(),
            "2/40*".into(),
            "n/a".into(),
        ]);
        let plot = matrix_grid("explore-matrix", &matrix).unwrap();
        assert!(plot.svg.starts_with("<svg"), "{}", &plot.svg[..80]);
        assert!(plot.svg.contains("relay-after-send-before-mark"));
        assert!(plot.svg.contains("mark-before-send"));
        assert!(plot.svg.contains("n/a"));
        assert!(plot.svg.contains("2/40*"));
        // Six cells: one rectangle each, besides the white canvas.
        assert!(plot.svg.matches("<rect").count() >= 7, "{}", plot.svg);
    }

    /// A matrix without counts is refused with a sentence, not drawn empty.
    #[test]
    fn matrix_grid_refuses_an_empty_table() {
        let empty = Table::new("empty", &["crash point"]);
        let error = matrix_grid("explore-matrix", &empty).unwrap_err();
        assert!(error.to_string().contains("a matrix needs"), "{error}");
    }

    #[test]
    fn cells_count_by_their_leading_number() {
        assert_eq!(leading_number("3"), Some(3.0));
        assert_eq!(leading_number(" 3/40* "), Some(3.0));
        assert_eq!(leading_number("0/40"), Some(0.0));
        assert_eq!(leading_number("n/a"), None);
        assert_eq!(leading_number(""), None);
    }

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
