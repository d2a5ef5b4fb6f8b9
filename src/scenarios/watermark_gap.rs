//! watermark-gap (よくある落とし穴): session A inserts and holds its transaction open, session B
//! inserts a later id and commits. A relay that fetches `id > last_seen` moves past A's id and
//! never delivers it; the `published_at IS NULL` relay delivers both; so does a watermark over
//! the writing transaction's id (xid8) that only advances past finished transactions — and
//! therefore waits behind any transaction left open in the cluster, measured here too.

use std::time::{Duration, Instant};

use anyhow::Result;
use serde::Deserialize;
use serde_json::json;
use tokio_postgres::Client;

use super::{metric_names, Ctx, Experiment, Outcome};
use crate::harness::db::Database;
use crate::judge::counts;
use crate::outbox::consumer::{ConsumerKind, Faults};
use crate::outbox::relay::watermark::{WatermarkRelay, XidWatermarkRelay};
use crate::outbox::relay::{drive, OutboxRelay, Relay, RelayConfig, Until};
use crate::outbox::schema;
use crate::outbox::sink::{HttpSink, Sink};
use crate::outbox::writer::{event_type, INSERT_OUTBOX};
use crate::report::Table;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {}

impl Experiment for Params {
    fn metrics(&self) -> Vec<String> {
        let mut metrics = metric_names(
            ["published_at", "watermark", "xid8"],
            &["delivered", "lost"],
        );
        metrics.push("xid8.stall_ms".into());
        metrics
    }

    async fn run(&self, ctx: &Ctx<'_>) -> Result<Outcome> {
        run(ctx, self).await
    }
}

/// How long each relay keeps polling after A commits before what it missed counts as lost.
const CATCH_UP: Duration = Duration::from_secs(1);
const POLL_INTERVAL: Duration = Duration::from_millis(20);
/// How long a transaction stays open in another database while the xid8 relay waits behind it.
const IDLE_ELSEWHERE: Duration = Duration::from_secs(2);

pub async fn run(ctx: &Ctx<'_>, _params: &Params) -> Result<Outcome> {
    let mut outcome = Outcome::default();
    let mut table = Table::new(
        "what each relay delivered",
        &[
            "relay",
            "pass 1 (A open, B committed)",
            "after A commits (polled up to 1 s)",
            "delivered",
            "lost",
        ],
    );
    for design in ["watermark", "published_at", "xid8"] {
        let db = ctx.database(design).await?;
        let client = db.connect().await?;
        client.batch_execute(schema::ADD_WRITER_XID).await?;
        let consumer = ctx
            .start_consumer(&db, ConsumerKind::Naive, &Faults::default())
            .await?;
        let sink = HttpSink::new(&consumer.url)?;
        let (delivered, lost) = match design {
            "watermark" => {
                let relay = WatermarkRelay::connect(&db.config()?, sink).await?;
                interleave(&db, &client, relay, &mut outcome, &mut table).await?
            }
            "published_at" => {
                let relay = Relay::connect(
                    &db.config()?,
                    Sink::Http(sink),
                    RelayConfig::default(),
                    "published_at",
                    false,
                )
                .await?;
                interleave(&db, &client, relay, &mut outcome, &mut table).await?
            }
            _ => {
                let relay = XidWatermarkRelay::connect(&db.config()?, sink).await?;
                interleave(&db, &client, relay, &mut outcome, &mut table).await?
            }
        };
        consumer.stop().await?;
        outcome
            .metrics
            .set(format!("{design}.delivered"), delivered);
        outcome.metrics.set(format!("{design}.lost"), lost);
    }
    outcome.tables.push(table);
    stall_behind_idle_transaction(ctx, &mut outcome).await?;
    Ok(outcome)
}

/// The price of the xid8 watermark: it only moves past transactions older than every one still
/// running in the cluster, in any database. A transaction left open in another database holds
/// back an event committed after it began, for as long as it stays open.
async fn stall_behind_idle_transaction(ctx: &Ctx<'_>, outcome: &mut Outcome) -> Result<()> {
    let db = ctx.database("xid8_stall").await?;
    let client = db.connect().await?;
    client.batch_execute(schema::ADD_WRITER_XID).await?;
    let elsewhere = ctx.database("idle_elsewhere").await?.connect().await?;
    let consumer = ctx
        .start_consumer(&db, ConsumerKind::Naive, &Faults::default())
        .await?;
    let mut relay =
        XidWatermarkRelay::connect(&db.config()?, HttpSink::new(&consumer.url)?).await?;
    // An idle transaction with a transaction id of its own, as an application might leave one.
    elsewhere
        .batch_execute("BEGIN; SELECT pg_current_xact_id();")
        .await?;
    client
        .query_one(
            INSERT_OUTBOX,
            &[&"C", &event_type(1), &json!({"session": "C"})],
        )
        .await?;
    let committed = Instant::now();
    let close_elsewhere = async {
        tokio::time::sleep(IDLE_ELSEWHERE).await;
        elsewhere.batch_execute("COMMIT").await
    };
    let until = Until::Drained {
        idle: POLL_INTERVAL,
        deadline: IDLE_ELSEWHERE * 5,
        once: None,
    };
    // Timed when the relay has delivered, not when the other transaction is closed.
    let delivered = async {
        let ended = drive(&mut relay, until, std::future::pending()).await;
        (ended, committed.elapsed())
    };
    let ((drained, stall), closed) = tokio::join!(delivered, close_elsewhere);
    closed?;
    drained?.or_gave_up("xid8")?;
    let stall_ms = stall.as_secs_f64() * 1000.0;
    consumer.stop().await?;
    outcome.metrics.set("xid8.stall_ms", stall_ms);
    let mut table = Table::new(
        "the xid8 watermark behind a transaction left open in another database",
        &[
            "open elsewhere for (ms)",
            "event committed after it began, delivered after (ms)",
        ],
    );
    table.push(vec![
        IDLE_ELSEWHERE.as_millis().to_string(),
        format!("{stall_ms:.0}"),
    ]);
    outcome.tables.push(table);
    Ok(())
}

/// A inserts and stays open while B commits; one pass of `relay`; A commits; the relay polls on
/// until it has nothing left or CATCH_UP is over. Returns (delivered, lost).
async fn interleave<R: OutboxRelay>(
    db: &Database,
    client: &Client,
    mut relay: R,
    outcome: &mut Outcome,
    table: &mut Table,
) -> Result<(i64, i64)> {
    let design = relay.name().to_string();
    let session_a = db.connect().await?;
    let session_b = db.connect().await?;
    session_a.batch_execute("BEGIN").await?;
    let id_a: i64 = session_a
        .query_one(
            INSERT_OUTBOX,
            &[&"A", &event_type(1), &json!({"session": "A"})],
        )
        .await?
        .get(0);
    let id_b: i64 = session_b
        .query_one(
            INSERT_OUTBOX,
            &[&"B", &event_type(1), &json!({"session": "B"})],
        )
        .await?
        .get(0);
    outcome.notes.push(format!(
        "[{design}] A inserted id={id_a} (uncommitted), B inserted id={id_b} (committed)"
    ));

    relay.pass().await?;
    let first = counts::ids(client, counts::RECEIVED_AFTER, &[&0i64]).await?;
    session_a.batch_execute("COMMIT").await?;
    let seen: i64 = client.query_one(counts::LAST_RECEIPT, &[]).await?.get(0);
    // A relay polls on: give each one the same time to catch up. (The xid8 watermark also
    // waits for every older transaction of the cluster, in any database, to finish: it may
    // run out of time, which is its result, not an error.)
    let until = Until::Drained {
        idle: POLL_INTERVAL,
        deadline: CATCH_UP,
        once: None,
    };
    drive(&mut relay, until, std::future::pending()).await?;
    let second = counts::ids(client, counts::RECEIVED_AFTER, &[&seen]).await?;
    let lost = counts::ids(client, counts::LOST_IDS, &[]).await?;
    let delivered = first.len() + second.len();
    table.push(vec![
        design,
        format!("{first:?}"),
        format!("{second:?}"),
        delivered.to_string(),
        format!("{lost:?}"),
    ]);
    Ok((delivered as i64, lost.len() as i64))
}
