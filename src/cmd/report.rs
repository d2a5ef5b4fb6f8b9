//! `outbox-lab report DIR...`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;

use super::{outln, plots};
use crate::error::exit;
use crate::report::{self, html};

/// Saved runs' tables printed again, and one report.html of them all written in the first
/// run's directory (`scenario all` and `zoo` on one page).
pub fn run(dirs: &[PathBuf]) -> Result<ExitCode> {
    let mut reports = Vec::new();
    for dir in dirs {
        reports.extend(report::read_run(dir)?);
    }
    let dir = &dirs[0];
    for report in &reports {
        outln!("{}", report.render_text())?;
    }
    outln!("{}", crate::report::summary(&reports))?;
    let page = html::write(dir, &reports, plots)?;
    crate::errln!("page written to {}", page.display());
    Ok(ExitCode::from(exit::OK))
}
