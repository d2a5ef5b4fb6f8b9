//! `outbox-lab crash-points`.

use std::process::ExitCode;

use anyhow::Result;

use super::outln;
use crate::error::exit;
use crate::outbox::crash::CrashPoint;
use crate::report::Table;

/// Every named crash point and the code path it interrupts.
pub fn run() -> Result<ExitCode> {
    let mut table = Table::new(
        "crash points",
        &["crash point", "in", "a crash there leaves"],
    );
    for point in CrashPoint::ALL {
        table.push(vec![
            point.name().into(),
            point.location().into(),
            point.meaning().into(),
        ]);
    }
    outln!("{}", table.render())?;
    outln!(
        "\nA child dies there with _exit({}) when its plan names it as NAME@N (N-th pass).",
        crate::error::exit::CRASHED
    )?;
    Ok(ExitCode::from(exit::OK))
}
