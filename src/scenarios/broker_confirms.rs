//! broker-confirms (パブリッシャーコンファームなしで公開済みにする誤り): RabbitMQ killed with
//! SIGKILL mid-stream. A relay marks an event published once RabbitMQ confirmed it (publisher
//! confirms: stored and fsynced), or — the mistake — as soon as `basic_publish` wrote it to the
//! connection. Each round and each case: a writer commits `events` orders, a relay drains the
//! outbox into the durable queue, the broker is killed once the outbox says `kill_after` rows
//! were published (read from the database, not timed), started again on the same ports and
//! directories, and the relay goes on until the outbox is drained. Then the queue is drained
//! by the naive AMQP consumer and counted against the outbox: an event published in the outbox
//! that the queue never held is lost; a message beyond an event's first is a duplicate (a
//! confirm lost with the broker: the event is published again).
//!
//! With confirms nothing is lost, whenever the kill falls. Without, what is lost is what the
//! broker had taken but not yet stored when it died, and what the relay went on writing to the
//! dead connection until it noticed: it depends on timing, and is shown round by round rather
//! than checked.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use super::{metric_names, Ctx, Experiment, Outcome, CHILD_TIMEOUT};
use crate::harness::child::ChildEnd;
use crate::judge::counts;
use crate::outbox::amqp_consumer::AmqpWorker;
use crate::outbox::consumer::{self, ConsumerKind};
use crate::outbox::relay::RelayConfig;
use crate::outbox::sink::AmqpSink;
use crate::outbox::writer::Ending;
use crate::report::Table;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// Orders written per round and case, each with one event.
    pub events: u32,
    /// Rounds, each with both relays and a kill of the broker under each.
    pub rounds: u32,
    /// The broker is killed once the outbox holds this many published rows.
    pub kill_after: u32,
    /// Rows per relay fetch (and so per batch in flight).
    pub batch: i64,
}

/// The two relays: marking after the confirm, or after `basic_publish` alone.
const CASES: [&str; 2] = ["confirms", "no_confirms"];
/// The consumer that counts what the queue held: one shipment per message.
const KIND: ConsumerKind = ConsumerKind::Naive;
/// Messages the consumer applies per transaction.
const DRAIN_BATCH: usize = 500;
/// The writer's aggregate type: the relay publishes to its queue.
const AGGREGATE_TYPE: &str = "orders";
/// How often the outbox is looked at for the moment of the kill.
const KILL_POLL: Duration = Duration::from_millis(2);
/// The relay's first retry while the broker is down; each further one waits twice as long, up
/// to [`RETRY_BACKOFF_MAX`]: a relay waiting out the restart retries at least that often, not
/// as long again as the restart took (10-13 s on a busy 2-core machine, longer under CI).
const RETRY_BACKOFF: Duration = Duration::from_millis(20);
const RETRY_BACKOFF_MAX: Duration = Duration::from_millis(500);
/// Attempts before a row is a dead letter: more than a broker restart takes, with a retry every
/// half second at most (a dead letter would be neither published nor lost, and the outbox not
/// drained).
const MAX_ATTEMPTS: i32 = 400;
/// A relay's run includes the broker's restart, which may itself take up to its start bound of
/// a minute.
const RELAY_TIMEOUT: Duration = Duration::from_secs(150);
/// Longer than RabbitMQ's delayed write of its definitions.
const DECLARATION_SETTLE: Duration = Duration::from_secs(3);

const UNPUBLISHED: &str = "SELECT count(*) FROM outbox WHERE published_at IS NULL";

impl Experiment for Params {
    fn metrics(&self) -> Vec<String> {
        let mut metrics = metric_names(CASES, &["lost", "duplicates", "rounds_with_loss"]);
        metrics.extend(["rounds".to_string(), "restart_ms_max".to_string()]);
        metrics
    }

    fn validate(&self) -> Result<()> {
        if self.rounds == 0 {
            bail!("rounds must be at least 1");
        }
        if self.batch < 1 {
            bail!("batch must be at least 1");
        }
        if self.kill_after == 0 || self.kill_after >= self.events {
            bail!(
                "kill_after {} must be between 1 and events ({}) - 1: the broker dies while the \
                 relay still has events to publish",
                self.kill_after,
                self.events
            );
        }
        Ok(())
    }

    async fn run(&self, ctx: &Ctx<'_>) -> Result<Outcome> {
        run(ctx, self).await
    }
}

/// What one relay's round came to.
struct Round {
    /// Published rows in the outbox when the kill was sent.
    published_at_kill: i64,
    restart: Duration,
    /// What the queue held, counted by the naive consumer ([`counts::DELIVERIES`]).
    received: i64,
    distinct: i64,
    lost: i64,
    duplicates: i64,
}

pub async fn run(ctx: &Ctx<'_>, params: &Params) -> Result<Outcome> {
    ctx.amqp().require_private()?;
    // The private broker starts on first use (unless an earlier scenario of the run started it).
    let clock = Instant::now();
    let url = ctx.amqp().url().await?;
    let first_use = clock.elapsed();
    // Declared once and given time to reach the broker's disk (RabbitMQ writes its definitions
    // with a delay of up to 2 s): a queue declared just before a SIGKILL can be gone after the
    // restart, which is the broker losing its definition, not the relay losing messages (seen
    // under CI's load: every publish after the restart returned "no queue"). Each round empties
    // it instead.
    let queue = ctx
        .amqp()
        .declare_queue(&AmqpSink::queue_name("", AGGREGATE_TYPE))
        .await?;
    tokio::time::sleep(DECLARATION_SETTLE).await;
    let mut outcome = Outcome::default();
    let mut rounds = Table::new(
        "every round: the broker killed mid-stream, then the queue counted against the outbox",
        &[
            "round",
            "relay",
            "published_at_kill",
            "restart_ms",
            "queue_messages",
            "distinct_events",
            "lost",
            "duplicates",
        ],
    );
    let mut totals = [(0i64, 0i64, 0i64); 2];
    let mut restart_ms_max = 0u128;
    for round in 1..=params.rounds {
        for (case, total) in CASES.iter().zip(totals.iter_mut()) {
            let result = one_round(ctx, params, &url, &queue, case, round).await?;
            total.0 += result.lost;
            total.1 += result.duplicates;
            total.2 += i64::from(result.lost > 0);
            restart_ms_max = restart_ms_max.max(result.restart.as_millis());
            rounds.push(vec![
                round.to_string(),
                case.to_string(),
                result.published_at_kill.to_string(),
                result.restart.as_millis().to_string(),
                result.received.to_string(),
                result.distinct.to_string(),
                result.lost.to_string(),
                result.duplicates.to_string(),
            ]);
        }
    }
    let mut summary = Table::new(
        format!("{} rounds, summed", params.rounds),
        &["relay", "lost", "duplicates", "rounds_with_loss"],
    );
    for (case, (lost, duplicates, with_loss)) in CASES.iter().zip(totals) {
        outcome.metrics.set(format!("{case}.lost"), lost);
        outcome
            .metrics
            .set(format!("{case}.duplicates"), duplicates);
        outcome
            .metrics
            .set(format!("{case}.rounds_with_loss"), with_loss);
        summary.push(vec![
            case.to_string(),
            lost.to_string(),
            duplicates.to_string(),
            with_loss.to_string(),
        ]);
    }
    outcome.metrics.set("rounds", params.rounds);
    outcome.metrics.set("restart_ms_max", restart_ms_max as u64);
    outcome.tables.push(summary);
    outcome.tables.push(rounds);
    outcome.notes.push(format!(
        "each round: {} events, the relay's batch {}; RabbitMQ SIGKILLed once the outbox held {} \
         published rows, then started again on the same ports and directories. Without \
         confirms, what is lost is what the broker had taken but not yet stored when it died, and \
         what the relay went on writing to the dead connection until it noticed: it depends on \
         timing, round by round. RabbitMQ was ready {} ms after the scenario first asked for it",
        params.events,
        params.batch,
        params.kill_after,
        first_use.as_millis()
    ));
    Ok(outcome)
}

/// One relay (`case`) through one kill of the broker, and the queue counted after.
async fn one_round(
    ctx: &Ctx<'_>,
    params: &Params,
    url: &str,
    queue: &str,
    case: &str,
    round: u32,
) -> Result<Round> {
    let db = ctx.database(&format!("{case}_{round}")).await?;
    let client = db.connect().await?;
    // Empty each round and case: what it holds after is this relay's alone.
    ctx.amqp().purge_queue(queue).await?;
    ctx.run_writer(&db, params.events, Ending::Commit, None)
        .await?
        .expect(|e| *e == ChildEnd::Ok, "the writer")?;
    let config = RelayConfig {
        batch: params.batch,
        backoff_base: RETRY_BACKOFF,
        backoff_max: RETRY_BACKOFF_MAX,
        max_attempts: MAX_ATTEMPTS,
        ..RelayConfig::default()
    };
    let confirms = case == "confirms";
    let relay = tokio::spawn(
        ctx.relay(&db, url, &format!("{case}-{round}"), &config)
            .with(|role| role.sink.publish_acks = confirms)
            .run(RELAY_TIMEOUT),
    );
    let clock = Instant::now();
    let published_at_kill = loop {
        let published: i64 = client.query_one(counts::PUBLISHED, &[]).await?.get(0);
        if published >= i64::from(params.kill_after) {
            break published;
        }
        if relay.is_finished() || clock.elapsed() > CHILD_TIMEOUT {
            relay.abort();
            bail!(
                "[{case}, round {round}] the relay had published {published} events, not \
                 kill_after = {}, when it ended or the wait did",
                params.kill_after
            );
        }
        tokio::time::sleep(KILL_POLL).await;
    };
    let restart = ctx.amqp().crash_and_restart().await?;
    relay
        .await
        .context("the relay task failed")??
        .expect(|e| *e == ChildEnd::Ok, "the relay")?;
    let unpublished: i64 = client.query_one(UNPUBLISHED, &[]).await?.get(0);
    if unpublished > 0 {
        bail!("[{case}, round {round}] the relay ended with {unpublished} events unpublished");
    }

    let pooled = consumer::pool(db.config()?, 1)?.get().await?;
    let mut worker = AmqpWorker::connect(url, pooled, KIND).await?;
    worker.drain(queue, DRAIN_BATCH).await?;
    worker.close().await?;
    let row = counts::one_row(&client, counts::DELIVERIES).await?;
    Ok(Round {
        published_at_kill,
        restart,
        received: row.get("received"),
        distinct: row.get("distinct_events"),
        lost: row.get("lost"),
        duplicates: row.get("duplicate_shipments"),
    })
}
