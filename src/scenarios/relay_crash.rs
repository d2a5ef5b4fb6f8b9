//! relay-crash (少なくとも1回配送になる理由 / 冪等なコンシューマ): the relay delivers K of N
//! events and dies before marking them; a restarted relay delivers all N again. Run once per
//! consumer kind: the naive one ships K orders twice, the idempotent one none.

use anyhow::{bail, Result};
use serde::Deserialize;

use super::{metric_names, Ctx, Experiment, Outcome};
use crate::harness::child::ChildEnd;
use crate::judge::counts;
use crate::outbox::consumer::{ConsumerKind, Faults};
use crate::outbox::crash::{CrashPlan, CrashPoint};
use crate::outbox::relay::RelayConfig;
use crate::outbox::writer::Ending;
use crate::report::Table;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// Orders written, each with one event.
    pub events: u32,
    /// The first relay dies after delivering this many.
    pub crash_after: u32,
    /// Rows per fetch; the crash must fall inside the first batch.
    pub batch: u32,
}

/// Both consumers meet the same crash: the naive one ships twice, the idempotent one does not.
const CONSUMERS: [ConsumerKind; 2] = [ConsumerKind::Naive, ConsumerKind::Idempotent];

impl Experiment for Params {
    fn metrics(&self) -> Vec<String> {
        let mut metrics =
            metric_names(CONSUMERS.map(ConsumerKind::name), &counts::DELIVERY_FIGURES);
        metrics.push("lost".into());
        metrics
    }

    fn validate(&self) -> Result<()> {
        super::check_crash_after(self.events, self.crash_after)?;
        if self.crash_after > self.batch {
            bail!(
                "--crash-after {} must not exceed the batch size {}",
                self.crash_after,
                self.batch
            );
        }
        Ok(())
    }

    async fn run(&self, ctx: &Ctx<'_>) -> Result<Outcome> {
        run(ctx, self).await
    }
}

pub async fn run(ctx: &Ctx<'_>, params: &Params) -> Result<Outcome> {
    let mut outcome = Outcome::default();
    let mut summary = counts::ConsumerComparison::new(
        "naive vs idempotent",
        &[],
        &[
            "received",
            "distinct_events",
            "shipments",
            "orders_shipped_twice",
            "lost",
        ],
    )
    .heading("received", "http_received");
    let mut lost_total = 0i64;
    for kind in CONSUMERS {
        let name = kind.name();
        let db = ctx.database(name).await?;
        let client = db.connect().await?;
        let consumer = ctx.start_consumer(&db, kind, &Faults::default()).await?;
        ctx.run_writer(&db, params.events, Ending::Commit, None)
            .await?
            .expect(|e| *e == ChildEnd::Ok, "the writer")?;
        let config = RelayConfig {
            batch: i64::from(params.batch),
            ..RelayConfig::default()
        };
        let crash = CrashPlan::new(CrashPoint::RelayAfterSendBeforeMark, params.crash_after);
        let first = ctx
            .run_relay(&db, &consumer.url, "0", &config, Some(crash))
            .await?
            .expect(|e| matches!(e, ChildEnd::Crashed { .. }), "the first relay")?;
        outcome.notes.push(format!(
            "[{name}] relay 0 {} after {} deliveries, before marking published",
            first.end, params.crash_after
        ));
        let after_crash = client.query(counts::OUTBOX_PUBLISHED, &[]).await?;
        outcome.tables.push(Table::from_rows(
            format!("outbox after the crash ({name})"),
            &after_crash,
        ));
        let second = ctx
            .run_relay(&db, &consumer.url, "1", &config, None)
            .await?
            .expect(|e| *e == ChildEnd::Ok, "the restarted relay")?;
        outcome
            .notes
            .extend(second.log_lines().map(|l| format!("[{name}] {l}")));
        consumer.stop().await?;

        let receipts = client.query(counts::RECEIPT_LOG, &[]).await?;
        outcome.tables.push(Table::from_rows(
            format!("receipt log ({name} consumer)"),
            &receipts,
        ));
        let shipments = client.query(counts::SHIPMENTS_PER_ORDER, &[]).await?;
        outcome.tables.push(Table::from_rows(
            format!("shipments per order ({name} consumer)"),
            &shipments,
        ));
        let row = counts::one_row(&client, counts::DELIVERIES).await?;
        outcome.metrics.set_row(name, &row);
        lost_total += row.get::<_, i64>("lost");
        summary.push(name, vec![], &row);
    }
    outcome.metrics.set("lost", lost_total);
    outcome.tables.insert(0, summary.table());
    Ok(outcome)
}
