//! `outbox-lab check`: the invariants judged on a database of your own.

use std::process::ExitCode;

use anyhow::{bail, Result};

use super::outln;
use crate::connect;
use crate::error::exit;
use crate::explore::checker;
use crate::explore::designs::Invariant;
use crate::judge::counts;
use crate::outbox::schema;
use crate::report::Table;

pub async fn run(database_url: &str) -> Result<ExitCode> {
    let client = connect::postgres(&connect::parse_url(database_url)?).await?;
    for table in ["outbox", "consumer.shipments"] {
        if !schema::has_table(&client, table).await? {
            bail!("this database has no {table} table: check judges a database with the outbox and the consumer's tables");
        }
    }
    let violations = checker::check_live(&client).await?;
    let pending = counts::count(&client, counts::UNPUBLISHED).await?;
    let mut table = Table::new(
        "invariants",
        &["invariant", "violations", "offending (first 10)"],
    );
    for invariant in Invariant::ALL
        .into_iter()
        .filter(|i| *i != Invariant::Liveness)
    {
        let ids = violations
            .get(&invariant)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let first: Vec<&str> = ids.iter().take(10).map(String::as_str).collect();
        table.push(vec![
            invariant.name().into(),
            ids.len().to_string(),
            first.join(", "),
        ]);
    }
    outln!("{}", table.render())?;
    if pending > 0 {
        outln!(
            "{pending} outbox rows are pending (not marked published): a relay still owes them, \
             so they are not counted as lost; check again once the relays have drained"
        )?;
    }
    Ok(ExitCode::from(if violations.is_empty() {
        outln!("clean: no ghost, lost, duplicate or out-of-order shipment")?;
        exit::OK
    } else {
        exit::CHECK_FAILED
    }))
}
