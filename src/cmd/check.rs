//! `outbox-lab check`: the invariants judged on a database of your own.

use std::process::ExitCode;

use anyhow::{bail, Result};

use super::outln;
use crate::connect;
use crate::error::exit;
use crate::explore::checker;
use crate::explore::designs::Invariant;
use crate::judge::{counts, two_databases};
use crate::outbox::schema;
use crate::report::Table;

pub async fn run(database_url: &str, consumer_database_url: Option<&str>) -> Result<ExitCode> {
    let application = connect::postgres(&connect::parse_url(database_url)?).await?;
    let consumer = match consumer_database_url {
        Some(url) => Some(connect::postgres(&connect::parse_url(url)?).await?),
        None => None,
    };
    let needs = [
        (&application, "outbox", "--database-url"),
        (&application, "orders", "--database-url"),
    ];
    let judged = consumer.as_ref().unwrap_or(&application);
    let consumer_flag = match consumer {
        Some(_) => "--consumer-database-url",
        None => "--database-url (or give the consumer's with --consumer-database-url)",
    };
    for (client, table, flag) in
        needs
            .into_iter()
            .chain([(judged, "consumer.shipments", consumer_flag)])
    {
        if !schema::has_table(client, table).await? {
            bail!("the database of {flag} has no {table} table: check judges the application's orders and outbox against the consumer's tables");
        }
    }
    if let Some(consumer) = &consumer {
        two_databases::bring_application_rows(&application, consumer).await?;
    }
    let client = judged;
    let violations = checker::check_live(client).await?;
    let pending = counts::count(client, counts::UNPUBLISHED).await?;
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
