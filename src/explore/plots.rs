//! Explore's plot on the report page: its matrix of designs × invariants as a coloured grid.

use anyhow::{Context, Result};

use crate::report::plots::{matrix_grid, Plot};
use crate::report::Report;

/// The columns of explore's matrix that the grid shows (its verdict column stays in the table).
const INVARIANTS: [&str; 6] = ["design", "ghost", "lost", "duplicate", "order", "liveness"];

/// The grid of an explore result; none for any other result, or one without the matrix.
pub fn for_report(report: &Report) -> Result<Vec<Plot>> {
    if report.scenario != "explore" {
        return Ok(Vec::new());
    }
    let matrix = report.tables.iter().find_map(|t| t.select(&INVARIANTS));
    matrix
        .map(|m| matrix_grid("explore-matrix", &m))
        .transpose()
        .context("cannot plot the results of explore")
        .map(|plot| plot.into_iter().collect())
}
