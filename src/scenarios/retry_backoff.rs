//! retry-backoff (ポーリング・リレーの実装): the consumer answers 500 to the next requests; the
//! relay retries with a doubling backoff. Then the dead letter: a consumer that always fails
//! leaves the row at the attempt limit, unfetched, until `requeue` brings it back.

use std::time::Duration;

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
    pub events: u32,
    /// The consumer answers 500 to this many requests first.
    pub fail_next: u32,
    pub backoff_ms: u64,
    pub max_attempts: i32,
}

impl Experiment for Params {
    fn metrics(&self) -> Vec<String> {
        let events = (1..=self.events).map(|n| format!("event{n}"));
        let mut figures = vec!["attempts".to_string()];
        figures.extend((1..self.max_attempts.max(1)).map(|g| format!("gap{g}_ms")));
        let mut metrics = metric_names(events, &figures);
        let totals = [
            "published",
            "sent_total",
            "dead_letter",
            "dead_letter.attempts",
            "dead_letter.refetched",
            "requeued",
            "requeued_delivered",
        ];
        metrics.extend(metric_names([""], &totals));
        metrics
    }

    async fn run(&self, ctx: &Ctx<'_>) -> Result<Outcome> {
        run(ctx, self).await
    }
}

/// "Always fails", for the dead-letter part: more requests than the relay will ever make.
const ALWAYS: u32 = 1_000_000;

pub async fn run(ctx: &Ctx<'_>, params: &Params) -> Result<Outcome> {
    let config = RelayConfig {
        max_attempts: params.max_attempts,
        backoff_base: Duration::from_millis(params.backoff_ms),
        ..RelayConfig::default()
    };
    let mut outcome = Outcome::default();
    retries(ctx, params, &config, &mut outcome).await?;
    dead_letter(ctx, &config, &mut outcome).await?;
    Ok(outcome)
}

async fn retries(
    ctx: &Ctx<'_>,
    params: &Params,
    config: &RelayConfig,
    outcome: &mut Outcome,
) -> Result<()> {
    let db = ctx.database("retry").await?;
    let client = db.connect().await?;
    let faults = Faults {
        fail_next: params.fail_next,
        ..Faults::default()
    };
    let consumer = ctx
        .start_consumer(&db, ConsumerKind::Naive, &faults)
        .await?;
    ctx.run_writer(&db, params.events, Ending::Commit, None)
        .await?
        .expect(|e| *e == ChildEnd::Ok, "the writer")?;
    let relay = ctx
        .run_relay(&db, &consumer.url, "0", config, None)
        .await?
        .expect(|e| *e == ChildEnd::Ok, "the relay")?;
    consumer.stop().await?;
    outcome.notes.extend(relay.log_lines().map(str::to_string));

    let rows = client.query(counts::OUTBOX_ATTEMPTS, &[]).await?;
    for (n, row) in rows.iter().enumerate() {
        outcome.metrics.set(
            format!("event{}.attempts", n + 1),
            row.get::<_, i32>("attempts"),
        );
    }
    let published = rows.iter().filter(|r| {
        r.get::<_, Option<chrono::DateTime<chrono::Utc>>>("published_at")
            .is_some()
    });
    outcome.metrics.set("published", published.count() as i64);
    outcome
        .tables
        .push(Table::from_rows("outbox after the retries", &rows));

    let tries = client.query(counts::TRIES, &[]).await?;
    let delivered = tries
        .iter()
        .filter(|r| r.get::<_, String>("reply") == "200")
        .count();
    outcome.metrics.set("sent_total", delivered as i64);
    // The gaps between tries of each row, as the consumer saw them: the backoff, measured.
    for (n, row) in rows.iter().enumerate() {
        let id: i64 = row.get("id");
        let gaps = tries
            .iter()
            .filter(|t| t.get::<_, Option<i64>>("outbox_id") == Some(id))
            .filter_map(|t| t.get::<_, Option<f64>>("gap_ms"));
        for (g, gap) in gaps.enumerate() {
            outcome.metrics.set(
                format!("event{}.gap{}_ms", n + 1, g + 1),
                (gap * 10.0).round() / 10.0,
            );
        }
    }
    outcome
        .tables
        .push(Table::from_rows("tries as the consumer saw them", &tries));
    Ok(())
}

async fn dead_letter(ctx: &Ctx<'_>, config: &RelayConfig, outcome: &mut Outcome) -> Result<()> {
    let db = ctx.database("dead_letter").await?;
    let client = db.connect().await?;
    let failing = ctx
        .start_consumer(
            &db,
            ConsumerKind::Naive,
            &Faults {
                fail_next: ALWAYS,
                ..Faults::default()
            },
        )
        .await?;
    ctx.run_writer(&db, 1, Ending::Commit, None)
        .await?
        .expect(|e| *e == ChildEnd::Ok, "the writer")?;
    // Gives up by itself once the row reaches the attempt limit.
    ctx.run_relay(&db, &failing.url, "0", config, None)
        .await?
        .expect(|e| *e == ChildEnd::Ok, "the relay")?;
    let dead = client
        .query(relay::sql::DEAD_LETTERS, &[&config.max_attempts])
        .await?;
    outcome.metrics.set("dead_letter", dead.len() as i64);
    if let Some(row) = dead.first() {
        outcome
            .metrics
            .set("dead_letter.attempts", row.get::<_, i32>("attempts"));
    }
    outcome.tables.push(Table::from_rows(
        "dead letters (published_at IS NULL AND attempts >= 5)",
        &dead,
    ));

    // A relay started now does not fetch it.
    let before: i64 = client.query_one(counts::LAST_RECEIPT, &[]).await?.get(0);
    ctx.run_relay(&db, &failing.url, "1", config, None)
        .await?
        .expect(|e| *e == ChildEnd::Ok, "the second relay")?;
    let after: i64 = client.query_one(counts::LAST_RECEIPT, &[]).await?.get(0);
    outcome.metrics.set("dead_letter.refetched", after - before);
    failing.stop().await?;

    // The cause is fixed (a healthy consumer), the row is requeued and delivered.
    let healthy = ctx
        .start_consumer(&db, ConsumerKind::Naive, &Faults::default())
        .await?;
    outcome.metrics.set(
        "requeued",
        relay::requeue(&client, config.max_attempts).await? as i64,
    );
    ctx.run_relay(&db, &healthy.url, "2", config, None)
        .await?
        .expect(|e| *e == ChildEnd::Ok, "the relay after requeue")?;
    healthy.stop().await?;
    let delivered = counts::ids(&client, counts::RECEIVED_AFTER, &[&after]).await?;
    outcome
        .metrics
        .set("requeued_delivered", delivered.len() as i64);
    Ok(())
}
