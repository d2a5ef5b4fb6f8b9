//! explore's writer and relay as they run in a child process (`outbox-lab child explore-writer`,
//! `explore-relay`): the workload, and a relay loop that keeps polling until the parent closes
//! its stdin ("the writer is done") and nothing is left to deliver.

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;
use uuid::Uuid;

use super::designs::RelayVariant;
use crate::harness::db::Database;
use crate::outbox::relay::watermark::StoredWatermarkRelay;
use crate::outbox::relay::{drive, RelayOptions, Until};
use crate::outbox::sink::HttpSink;
use crate::outbox::writer::{self, DualWriteOrder, Ending};

/// The workload: customers 1..=orders, each order with its events.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExploreWriterRole {
    pub orders: u32,
    pub events_per_order: u32,
    /// How long the first order of each pair stays uncommitted after the second commits.
    pub overlap: Duration,
    /// Be the naive app instead: write the order and POST its event (one per order) itself,
    /// in this order, to this sink.
    pub dual_write: Option<(DualWriteOrder, String)>,
}

/// Writes the orders not committed yet (a restarted writer retries only those).
pub async fn run_writer(db: &Database, args: ExploreWriterRole) -> Result<()> {
    let customers: Vec<i64> = (1..=i64::from(args.orders)).collect();
    let mut client = db.connect().await?;
    let todo = writer::uncommitted_customers(&client, &customers).await?;
    let Some((order, sink)) = args.dual_write else {
        let mut second_session = db.connect().await?;
        let overlap = args.overlap;
        return writer::write_overlapping_pairs(
            &mut client,
            &mut second_session,
            &todo,
            args.events_per_order,
            overlap,
        )
        .await;
    };
    let sink = HttpSink::new(&sink)?;
    for customer in todo {
        // The same attempt lines as a relay's, for the history.
        log_line(format_args!("customer={customer} sending"));
        let sent = writer::dual_write(
            &mut client,
            &sink,
            customer,
            Uuid::new_v4(),
            order,
            Ending::Commit,
        )
        .await;
        match sent {
            Ok(_) => log_line(format_args!("customer={customer} sent")),
            Err(e) => {
                log_line(format_args!("customer={customer} failed: {e:#}"));
                // The request failed: end like a crashed request; the restart retries.
                return Err(e.context(format!("order of customer {customer}")));
            }
        }
    }
    Ok(())
}

fn log_line(line: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "[app] {line}");
    let _ = out.flush();
}

/// One relay variant, until its outbox is drained and stdin is closed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExploreRelayRole {
    /// The stored watermark relay, or the table relay in the design `relay.config` says.
    pub variant: RelayVariant,
    pub relay: RelayOptions,
}

/// Polls until stdin is closed and nothing is pending, or gives up at the deadline.
pub async fn run_relay(db: &Database, role: ExploreRelayRole) -> Result<()> {
    let writer_done = Arc::new(AtomicBool::new(false));
    let flag = writer_done.clone();
    tokio::spawn(async move {
        let mut input = Vec::new();
        let _ = tokio::io::stdin().read_to_end(&mut input).await;
        flag.store(true, Ordering::SeqCst);
    });
    let options = role.relay;
    let until = Until::Drained {
        idle: options.config.idle_poll,
        deadline: options.config.deadline,
        once: Some(&writer_done),
    };
    let ended = match role.variant {
        RelayVariant::StoredWatermark => {
            let client = db.connect().await?;
            let sink = HttpSink::new(&options.sink.url)?;
            let mut relay = StoredWatermarkRelay::new(client, sink, options.name.clone());
            drive(&mut relay, until, std::future::pending()).await?
        }
        _ => {
            let mut relay = options.connect(&db.config()?).await?;
            drive(&mut relay, until, std::future::pending()).await?
        }
    };
    ended.or_gave_up(&options.name).map(drop)
}
