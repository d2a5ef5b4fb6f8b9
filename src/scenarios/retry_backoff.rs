//! retry-backoff (ポーリング・リレーの実装): the consumer answers 500 to the next requests; the
//! relay retries with a doubling backoff, timed over a few rounds (each backoff the median of
//! its rounds; the tables show the first). Then the dead letter: a consumer that always fails
//! leaves the row at the attempt limit, unfetched, until `requeue` brings it back.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Result};
use serde::Deserialize;

use super::{metric_names, Ctx, Experiment, Outcome};
use crate::harness::child::ChildEnd;
use crate::judge::counts;
use crate::outbox::consumer::{ConsumerKind, Faults};
use crate::outbox::relay::{self, RelayConfig};
use crate::outbox::writer::Ending;
use crate::report::Table;
use crate::stats::median;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub events: u32,
    /// The consumer answers 500 to this many requests first.
    pub fail_next: u32,
    pub backoff_ms: u64,
    pub max_attempts: i32,
    /// The retries are timed this many times; each backoff is the median of its rounds, so that
    /// a stall of the machine in one round does not move it.
    pub rounds: u32,
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

    fn validate(&self) -> Result<()> {
        if self.rounds == 0 {
            bail!("rounds must be at least 1");
        }
        Ok(())
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

/// The retries, timed `rounds` times, each round on a database of its own. Its counts (attempts,
/// published, deliveries) are the first round's, unless a later round counted otherwise: then
/// that round's, so that the check fails. Each backoff is the median of its rounds.
async fn retries(
    ctx: &Ctx<'_>,
    params: &Params,
    config: &RelayConfig,
    outcome: &mut Outcome,
) -> Result<()> {
    let mut first_counts: Vec<(String, i64)> = Vec::new();
    let mut gaps_ms: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for round in 0..params.rounds {
        let measured = retry_round(ctx, params, config, round, outcome).await?;
        for (name, count) in measured.counts {
            match first_counts.iter().find(|(first, _)| *first == name) {
                Some((_, first)) if *first == count => {}
                Some(_) => outcome.metrics.set(name, count),
                None => {
                    outcome.metrics.set(name.clone(), count);
                    first_counts.push((name, count));
                }
            }
        }
        for (name, gap_ms) in measured.gaps_ms {
            gaps_ms.entry(name).or_default().push(gap_ms);
        }
    }
    for (name, each) in gaps_ms {
        outcome
            .metrics
            .set(name, (median(&each) * 10.0).round() / 10.0);
    }
    Ok(())
}

/// What one round of retries measured: its counts and the gaps between each event's tries.
struct RetryRound {
    counts: Vec<(String, i64)>,
    gaps_ms: Vec<(String, f64)>,
}

/// One round: the consumer answers 500 to the first requests, one relay drains the outbox. The
/// first round's tables and relay lines go into the report.
async fn retry_round(
    ctx: &Ctx<'_>,
    params: &Params,
    config: &RelayConfig,
    round: u32,
    outcome: &mut Outcome,
) -> Result<RetryRound> {
    let db = ctx.database(&format!("retry_{round}")).await?;
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

    let rows = client.query(counts::OUTBOX_ATTEMPTS, &[]).await?;
    let mut counts: Vec<(String, i64)> = rows
        .iter()
        .enumerate()
        .map(|(n, row)| {
            let attempts = row.get::<_, i32>("attempts");
            (format!("event{}.attempts", n + 1), i64::from(attempts))
        })
        .collect();
    let published = rows.iter().filter(|r| {
        r.get::<_, Option<chrono::DateTime<chrono::Utc>>>("published_at")
            .is_some()
    });
    counts.push(("published".into(), published.count() as i64));

    let tries = client.query(counts::TRIES, &[]).await?;
    let delivered = tries
        .iter()
        .filter(|r| r.get::<_, String>("reply") == "200")
        .count();
    counts.push(("sent_total".into(), delivered as i64));
    // The gaps between tries of each row, as the consumer saw them: the backoff, measured.
    let mut gaps_ms = Vec::new();
    for (n, row) in rows.iter().enumerate() {
        let id: i64 = row.get("id");
        let gaps = tries
            .iter()
            .filter(|t| t.get::<_, Option<i64>>("outbox_id") == Some(id))
            .filter_map(|t| t.get::<_, Option<f64>>("gap_ms"));
        for (g, gap) in gaps.enumerate() {
            gaps_ms.push((format!("event{}.gap{}_ms", n + 1, g + 1), gap));
        }
    }
    if round == 0 {
        outcome.notes.extend(relay.log_lines().map(str::to_string));
        outcome
            .tables
            .push(Table::from_rows("outbox after the retries", &rows));
        outcome
            .tables
            .push(Table::from_rows("tries as the consumer saw them", &tries));
    }
    Ok(RetryRound { counts, gaps_ms })
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
