//! `outbox-lab child ROLE` (hidden): one component in a child process of a run; the roles and
//! their arguments are the harness's ([`crate::harness::child`]).

use std::process::ExitCode;

use anyhow::Result;

use crate::error::exit;
use crate::harness::child::{self, ChildArgs};

pub async fn run(args: ChildArgs) -> Result<ExitCode> {
    child::run_role(args).await?;
    Ok(ExitCode::from(exit::OK))
}
