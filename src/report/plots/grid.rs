//! Coloured grids of a table's cells: by count, for any matrix of counts (explore's designs ×
//! invariants, for one), or by category, for a matrix of outcomes in words (horizon's designs ×
//! faults).

use anyhow::{bail, Result};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::{categories, longest, render, segment_label, Plot, FONT};
use crate::report::Table;

/// A cell no colour applies to (not a number, not a known outcome).
const UNKNOWN: RGBColor = RGBColor(221, 221, 221);

/// A coloured grid of counts: one row per table row (its first cell names it), one column per
/// further column; green where the count is 0, deeper red the larger it is, grey where a cell
/// does not start with a number. A cell counts by its leading number and is written as it is
/// (`3`, `3/40`, `3/40*`). Made for explore's matrix of violations (crash point or design ×
/// invariant), and for any table shaped like it.
pub fn matrix_grid(id: &'static str, matrix: &Table) -> Result<Plot> {
    check_shape(matrix)?;
    let counts: Vec<Vec<Option<f64>>> = matrix
        .rows
        .iter()
        .map(|row| row[1..].iter().map(|cell| leading_number(cell)).collect())
        .collect();
    let most = counts
        .iter()
        .flatten()
        .flatten()
        .fold(0.0_f64, |a, &b| a.max(b));
    let paint = |r: usize, c: usize| match counts[r].get(c).copied().flatten() {
        None => (UNKNOWN, BLACK),
        Some(n) if n <= 0.0 => (RGBColor(199, 233, 192), BLACK),
        Some(n) => (heat(n / most), if n / most > 0.5 { WHITE } else { BLACK }),
    };
    draw_grid(id, matrix, paint, &[])
}

/// What a cell of a [`category_grid`] may say, and its colour: the first category whose word
/// the cell's text starts with colours it.
pub struct Category {
    pub starts_with: &'static str,
    /// In the legend under the grid.
    pub label: &'static str,
    pub colour: RGBColor,
}

/// A coloured grid of outcomes in words: one row per table row (its first cell names it), one
/// column per further column, each cell written as it is and coloured by its [`Category`] (grey
/// where none applies), with a legend of the categories under it.
pub fn category_grid(id: &'static str, table: &Table, kinds: &[Category]) -> Result<Plot> {
    check_shape(table)?;
    let paint = |r: usize, c: usize| {
        let cell = table.rows[r].get(c + 1).map_or("", |cell| cell.trim());
        let kind = kinds.iter().find(|k| cell.starts_with(k.starts_with));
        (kind.map_or(UNKNOWN, |k| k.colour), BLACK)
    };
    let legend: Vec<(&str, RGBColor)> = kinds.iter().map(|k| (k.label, k.colour)).collect();
    draw_grid(id, table, paint, &legend)
}

/// A label column, at least one column of cells, and a row.
fn check_shape(table: &Table) -> Result<()> {
    if table.columns.len() < 2 || table.rows.is_empty() {
        bail!(
            "a matrix needs a label column, a column of counts and a row; '{}' has {} columns and {} rows",
            table.title,
            table.columns.len(),
            table.rows.len()
        );
    }
    Ok(())
}

/// Draws the grid: each cell filled and inked as `paint` says for (row, column of cells), its
/// text written in it, and the `legend`'s colours under it, if any.
fn draw_grid(
    id: &'static str,
    table: &Table,
    paint: impl Fn(usize, usize) -> (RGBColor, RGBColor),
    legend: &[(&str, RGBColor)],
) -> Result<Plot> {
    let (rows, columns) = (table.rows.len(), table.columns.len() - 1);
    let row_label_width = 12 + 7 * longest(table.rows.iter().map(|r| r[0].as_str()));
    let width = (row_label_width + 120 * columns as u32 + 24).max(360);
    let legend_height = if legend.is_empty() { 0 } else { 30 };
    let height = 70 + 30 * rows as u32 + legend_height;
    let svg = render(width, height, |area| {
        let (grid_area, legend_area) = area.split_vertically(height - legend_height);
        let mut chart = ChartBuilder::on(&grid_area)
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(row_label_width)
            .build_cartesian_2d(categories(columns), categories(rows))?;
        let top_down = |r: usize| (rows - 1 - r) as i32;
        // Segment 0 is at the bottom: the first row's name goes last.
        let row_names: Vec<String> = table.rows.iter().rev().map(|r| r[0].clone()).collect();
        chart
            .configure_mesh()
            .disable_mesh()
            .x_labels(columns)
            .y_labels(rows)
            .x_label_formatter(&|v| segment_label(v, &table.columns[1..]))
            .y_label_formatter(&|v| segment_label(v, &row_names))
            .label_style((FONT, 12))
            .draw()?;
        for r in 0..rows {
            for c in 0..columns {
                let (x, y) = (c as i32, top_down(r));
                let (fill, ink) = paint(r, c);
                let mut cell = Rectangle::new(
                    [
                        (SegmentValue::Exact(x), SegmentValue::Exact(y)),
                        (SegmentValue::Exact(x + 1), SegmentValue::Exact(y + 1)),
                    ],
                    fill.filled(),
                );
                cell.set_margin(1, 1, 1, 1);
                chart.draw_series(std::iter::once(cell))?;
                let text = table.rows[r].get(c + 1).cloned().unwrap_or_default();
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
        // The legend: a swatch and its words, one after another along the bottom.
        let mut x = row_label_width as i32;
        for (label, colour) in legend {
            legend_area.draw(&Rectangle::new([(x, 8), (x + 14, 22)], colour.filled()))?;
            let style =
                TextStyle::from((FONT, 12).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
            legend_area.draw(&Text::new(label.to_string(), (x + 20, 15), style))?;
            x += 40 + 7 * label.chars().count() as i32;
        }
        Ok(())
    })?;
    Ok(Plot {
        id,
        title: table.title.clone(),
        svg,
    })
}

/// `3` of `3`, `3/40` or `3/40*`; None when the text does not start with a digit.
fn leading_number(cell: &str) -> Option<f64> {
    let cell = cell.trim();
    let end = cell
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(cell.len());
    cell[..end].parse().ok()
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
    use crate::report::plots::{BAD, GOOD, STUCK};

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

    /// The category grid colours each cell by the first category its words start with (grey
    /// where none does) and lists the categories under the grid.
    #[test]
    fn category_grid_colours_cells_by_their_words() {
        let mut outcomes = Table::new("outcomes", &["design", "slow_commit", "idle"]);
        outcomes.push(vec!["watermark".into(), "skipped 3".into(), "fine".into()]);
        outcomes.push(vec![
            "gap_wait".into(),
            "stalled for good".into(),
            "n/a".into(),
        ]);
        let kinds = [
            Category {
                starts_with: "skipped",
                label: "skipped",
                colour: BAD,
            },
            Category {
                starts_with: "stalled for good",
                label: "stalled for good",
                colour: STUCK,
            },
            Category {
                starts_with: "fine",
                label: "fine",
                colour: GOOD,
            },
        ];
        let plot = category_grid("outcomes", &outcomes, &kinds).unwrap();
        for words in ["skipped 3", "stalled for good", "n/a", "gap_wait"] {
            assert!(plot.svg.contains(words), "no {words} in {}", plot.svg);
        }
        // Each colour fills its cell and its swatch in the legend; n/a is grey.
        for colour in ["#D55E00", "#CC79A7", "#009E73", "#DDDDDD"] {
            assert!(plot.svg.contains(colour), "no {colour} in {}", plot.svg);
        }
    }

    #[test]
    fn cells_count_by_their_leading_number() {
        assert_eq!(leading_number("3"), Some(3.0));
        assert_eq!(leading_number(" 3/40* "), Some(3.0));
        assert_eq!(leading_number("0/40"), Some(0.0));
        assert_eq!(leading_number("n/a"), None);
        assert_eq!(leading_number(""), None);
    }
}
