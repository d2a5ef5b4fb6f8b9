//! `outbox-lab completions SHELL`.

use std::io::Write as _;
use std::process::ExitCode;

use anyhow::Result;
use clap::CommandFactory;
use clap_complete::Shell;

use super::Cli;
use crate::error::{self, exit};

/// The script goes through a buffer: clap_complete panics on a write error; ours is returned,
/// and a reader that stops early (`| head`) is not an error.
pub fn run(shell: Shell) -> Result<ExitCode> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "outbox-lab", &mut script);
    error::stdout_write(std::io::stdout().write_all(&script))?;
    Ok(ExitCode::from(exit::OK))
}
