//! `outbox-lab list`.

use std::process::ExitCode;

use anyhow::Result;

use super::outln;
use crate::error::exit;
use crate::scenarios::Scenario;

/// The scenarios under the article's section headings, in the article's order.
pub fn run() -> Result<ExitCode> {
    let specs = Scenario::ALL
        .iter()
        .map(|s| s.spec(None))
        .collect::<Result<Vec<_>>>()?;
    let width = specs.iter().map(|s| s.name.len()).max().unwrap_or(0);
    let mut section = None;
    for spec in &specs {
        if section != Some(&spec.section) {
            if section.is_some() {
                outln!()?;
            }
            outln!("{}", spec.section)?;
            section = Some(&spec.section);
        }
        outln!("  {:width$}  {}", spec.name, spec.summary)?;
    }
    outln!("\nRun one with `outbox-lab scenario NAME`, or all with `outbox-lab scenario all`.")?;
    Ok(ExitCode::from(exit::OK))
}
