//! `outbox-lab requeue`: dead letters get their attempts back.

use std::process::ExitCode;

use anyhow::Result;

use super::outln;
use crate::connect;
use crate::error::exit;
use crate::outbox::relay;

pub async fn run(database_url: &str) -> Result<ExitCode> {
    let client = connect::postgres(&connect::parse_url(database_url)?).await?;
    let rows = relay::requeue(&client).await?;
    outln!("requeued {rows} undelivered outbox rows")?;
    Ok(ExitCode::from(exit::OK))
}
