//! The coloured grid for any matrix of counts (explore's designs × invariants, for one).

use anyhow::{bail, Result};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::{categories, longest, render, segment_label, Plot, FONT};
use crate::report::Table;

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
}
