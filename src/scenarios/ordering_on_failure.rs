//! ordering-on-failure (配送に失敗したときの順序): one relay, and the consumer answers 500 to the
//! first delivery of order1's first event. Without the head-of-line guard its later events
//! overtake it; with the guard order2 goes ahead while order1 waits and keeps its order. And when
//! that event fails until it is a dead letter, the guard holds order1's later events behind it
//! (the relay drains without them) until it is requeued; then order1 goes, in order.

use anyhow::Result;
use serde::Deserialize;

use super::{metric_names, Ctx, Experiment, Outcome};
use crate::harness::child::ChildEnd;
use crate::judge::counts;
use crate::outbox::consumer::{ConsumerKind, Faults};
use crate::outbox::relay::{self, RelayConfig};
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
        let mut metrics = metric_names(["guarded", "unguarded"], &["sequence", "out_of_order"]);
        metrics.extend(metric_names(
            ["dead_letter"],
            &["sequence_held", "sequence", "out_of_order"],
        ));
        metrics
    }

    async fn run(&self, ctx: &Ctx<'_>) -> Result<Outcome> {
        run(ctx, self).await
    }
}

/// The first row written: order1's first event, the one that fails once (or every time).
const FIRST_OUTBOX_ID: i64 = 1;
/// The dead-letter case's attempt limit: order1's first event is a dead letter after this many
/// failures, at once (a short backoff).
const DEAD_LETTER_ATTEMPTS: i32 = 2;
const DEAD_LETTER_BACKOFF: std::time::Duration = std::time::Duration::from_millis(10);

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
    dead_letter(ctx, params, &mut outcome, &mut table).await?;
    outcome.tables.push(table);
    Ok(outcome)
}

/// Guarded, and order1's first event fails every time until it is a dead letter: the relay
/// drains without order1's later events, held behind it; requeued (the cause fixed: a consumer
/// without the fault), order1 goes, in order.
async fn dead_letter(
    ctx: &Ctx<'_>,
    params: &Params,
    outcome: &mut Outcome,
    table: &mut Table,
) -> Result<()> {
    let db = ctx.database("dead_letter").await?;
    let client = db.connect().await?;
    ctx.writer(&db, params.orders, params.events_per_order, Ending::Commit)
        .run(super::CHILD_TIMEOUT)
        .await?
        .expect(|e| *e == ChildEnd::Ok, "the writer")?;
    let config = RelayConfig {
        head_of_line_guard: true,
        max_attempts: DEAD_LETTER_ATTEMPTS,
        backoff_base: DEAD_LETTER_BACKOFF,
        ..RelayConfig::default()
    };
    let poisoned = Faults {
        fail_every_delivery_of: Some(FIRST_OUTBOX_ID),
        ..Faults::default()
    };
    let sequence = async || -> Result<String> {
        Ok(client
            .query_one(counts::RECEIVE_SEQUENCE, &[])
            .await?
            .get(0))
    };
    for (faults, step) in [(poisoned, "held"), (Faults::default(), "requeued")] {
        let consumer = ctx
            .start_consumer(&db, ConsumerKind::Naive, &faults)
            .await?;
        let relay = ctx
            .run_relay(&db, &consumer.url, "0", &config, None)
            .await?
            .expect(|e| *e == ChildEnd::Ok, "the relay")?;
        consumer.stop().await?;
        outcome.notes.extend(
            relay
                .log_lines()
                .map(|l| format!("[dead_letter, {step}] {l}")),
        );
        if step == "held" {
            let held = sequence().await?;
            outcome.metrics.set("dead_letter.sequence_held", held);
            relay::requeue(&client, DEAD_LETTER_ATTEMPTS).await?;
        }
    }
    let sequence = sequence().await?;
    let reversals = counts::one_row(&client, counts::REVERSALS).await?;
    let out_of_order: i64 = reversals.get("orders_out_of_order");
    outcome
        .metrics
        .set("dead_letter.sequence", sequence.clone());
    outcome
        .metrics
        .set("dead_letter.out_of_order", out_of_order);
    table.push(vec![
        "guarded, a dead letter requeued".into(),
        sequence.replace(',', " , "),
        reversals.get::<_, i64>("reversals").to_string(),
    ]);
    Ok(())
}
