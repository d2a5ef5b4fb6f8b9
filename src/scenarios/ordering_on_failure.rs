//! ordering-on-failure (配送に失敗したときの順序): one relay, and the consumer answers 500 to the
//! first delivery of order1's first event. Without the head-of-line guard its later events
//! overtake it; with the guard order2 goes ahead while order1 waits and keeps its order.

use anyhow::Result;
use serde::Deserialize;

use super::{metric_names, Ctx, Experiment, Outcome};
use crate::harness::child::ChildEnd;
use crate::judge::counts;
use crate::outbox::consumer::{ConsumerKind, Faults};
use crate::outbox::relay::RelayConfig;
use crate::outbox::writer::Ending;
use crate::report::Table;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub orders: u32,
    pub events_per_order: u32,
}

impl Experiment for Params {
    fn metrics(&self) -> Vec<String> {
        metric_names(["guarded", "unguarded"], &["sequence", "out_of_order"])
    }

    async fn run(&self, ctx: &Ctx<'_>) -> Result<Outcome> {
        run(ctx, self).await
    }
}

/// The first row written: order1's first event, the one that fails once.
const FIRST_OUTBOX_ID: i64 = 1;

pub async fn run(ctx: &Ctx<'_>, params: &Params) -> Result<Outcome> {
    let mut outcome = Outcome::default();
    let mut table = Table::new(
        "receive order",
        &["relay", "received, in order", "reversals"],
    );
    for (name, guarded) in [("unguarded", false), ("guarded", true)] {
        let db = ctx.database(name).await?;
        let client = db.connect().await?;
        let faults = Faults {
            fail_first_delivery_of: Some(FIRST_OUTBOX_ID),
            ..Faults::default()
        };
        let consumer = ctx
            .start_consumer(&db, ConsumerKind::Naive, &faults)
            .await?;
        ctx.writer(&db, params.orders, params.events_per_order, Ending::Commit)
            .run(super::CHILD_TIMEOUT)
            .await?
            .expect(|e| *e == ChildEnd::Ok, "the writer")?;
        let config = RelayConfig {
            head_of_line_guard: guarded,
            ..RelayConfig::default()
        };
        let relay = ctx
            .run_relay(&db, &consumer.url, "0", &config, None)
            .await?
            .expect(|e| *e == ChildEnd::Ok, "the relay")?;
        consumer.stop().await?;
        outcome
            .notes
            .extend(relay.log_lines().map(|l| format!("[{name}] {l}")));

        let sequence: String = client
            .query_one(counts::RECEIVE_SEQUENCE, &[])
            .await?
            .get(0);
        let reversals = counts::one_row(&client, counts::REVERSALS).await?;
        let out_of_order: i64 = reversals.get("orders_out_of_order");
        outcome
            .metrics
            .set(format!("{name}.sequence"), sequence.clone());
        outcome
            .metrics
            .set(format!("{name}.out_of_order"), out_of_order);
        table.push(vec![
            name.into(),
            sequence.replace(',', " , "),
            reversals.get::<_, i64>("reversals").to_string(),
        ]);
    }
    outcome.tables.push(table);
    Ok(outcome)
}
