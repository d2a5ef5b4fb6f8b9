//! `outbox-lab compare A B`.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Result;

use super::outln;
use crate::error::exit;
use crate::report::{self, compare};

/// Two saved runs side by side.
pub fn run(a: &Path, b: &Path) -> Result<ExitCode> {
    let (runs_a, runs_b) = (report::read_run(a)?, report::read_run(b)?);
    outln!("A = {}\nB = {}\n", a.display(), b.display())?;
    for table in compare::compare(&runs_a, &runs_b) {
        outln!("{}\n{}\n", table.title, table.render())?;
    }
    Ok(ExitCode::from(exit::OK))
}
