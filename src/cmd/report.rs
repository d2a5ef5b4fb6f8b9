//! `outbox-lab report DIR`.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Result;

use super::{outln, plots};
use crate::error::exit;
use crate::report::{self, html};

/// A saved run's tables printed again, and its report.html rewritten.
pub fn run(dir: &Path) -> Result<ExitCode> {
    let reports = report::read_run(dir)?;
    for report in &reports {
        outln!("{}", report.render_text())?;
    }
    outln!("{}", crate::report::summary(&reports))?;
    let page = html::write(dir, &reports, plots)?;
    crate::errln!("page written to {}", page.display());
    Ok(ExitCode::from(exit::OK))
}
