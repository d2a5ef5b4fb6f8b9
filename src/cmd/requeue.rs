//! `outbox-lab requeue`: dead letters get their attempts back.

use std::process::ExitCode;

use anyhow::Result;

use super::outln;
use crate::connect;
use crate::error::exit;
use crate::outbox::relay;

pub async fn run(database_url: &str, max_attempts: i32) -> Result<ExitCode> {
    let client = connect::postgres(&connect::parse_url(database_url)?).await?;
    let rows = relay::requeue(&client, max_attempts).await?;
    outln!("requeued {rows} dead-letter outbox rows (attempts >= {max_attempts})")?;
    Ok(ExitCode::from(exit::OK))
}
