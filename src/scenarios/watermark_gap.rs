//! watermark-gap (よくある落とし穴): session A inserts and holds its transaction open, session B
//! inserts a later id and commits. A relay that fetches `id > last_seen` moves past A's id and
//! never delivers it; the `published_at IS NULL` relay delivers both; so does a watermark over
//! the writing transaction's id (xid8) that only advances past finished transactions.

use std::time::{Duration, Instant};

use anyhow::Result;
use serde::Deserialize;
use serde_json::json;
use tokio_postgres::Client;

use super::{Ctx, Experiment, Outcome};
use crate::judge::counts;
use crate::outbox::consumer::{ConsumerKind, Faults};
use crate::outbox::relay::{Relay, RelayConfig, WatermarkRelay, XidWatermarkRelay};
use crate::outbox::schema;
use crate::outbox::sink::{HttpSink, Sink};
use crate::outbox::writer::{event_type, INSERT_OUTBOX};
use crate::report::Table;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {}

impl Experiment for Params {
    async fn run(&self, ctx: &Ctx<'_>) -> Result<Outcome> {
        run(ctx, self).await
    }
}

/// How long each relay keeps polling after A commits before what it missed counts as lost.
const CATCH_UP: Duration = Duration::from_secs(1);
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// The three relays, each run against its own copy of the same interleaving.
enum GapRelay {
    Watermark(WatermarkRelay),
    PublishedAt(Box<Relay>),
    Xid8(XidWatermarkRelay),
}

impl GapRelay {
    fn name(&self) -> &'static str {
        match self {
            GapRelay::Watermark(_) => "watermark",
            GapRelay::PublishedAt(_) => "published_at",
            GapRelay::Xid8(_) => "xid8",
        }
    }

    /// One pass over the outbox.
    async fn pass(&mut self, client: &Client, sink: &HttpSink) -> Result<()> {
        match self {
            GapRelay::Watermark(relay) => drop(relay.deliver_new(client, sink).await?),
            GapRelay::PublishedAt(relay) => drop(relay.deliver_batch().await?),
            GapRelay::Xid8(relay) => drop(relay.deliver_new(client, sink).await?),
        }
        Ok(())
    }
}

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
        let mut relay = match design {
            "watermark" => GapRelay::Watermark(WatermarkRelay::default()),
            "published_at" => GapRelay::PublishedAt(Box::new(
                Relay::connect(
                    &db.config()?,
                    Sink::Http(sink.clone()),
                    RelayConfig::default(),
                    "published_at",
                    false,
                )
                .await?,
            )),
            _ => GapRelay::Xid8(XidWatermarkRelay::default()),
        };

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

        relay.pass(&client, &sink).await?;
        let first = counts::ids(&client, counts::RECEIVED_AFTER, &[&0i64]).await?;
        session_a.batch_execute("COMMIT").await?;
        let seen: i64 = client.query_one(counts::LAST_RECEIPT, &[]).await?.get(0);
        // A relay polls on: give each one the same time to catch up. (The xid8 watermark also
        // waits for every older transaction of the cluster, in any database, to finish.)
        let catch_up_until = Instant::now() + CATCH_UP;
        loop {
            relay.pass(&client, &sink).await?;
            let missing = counts::ids(&client, counts::LOST_IDS, &[]).await?;
            if missing.is_empty() || Instant::now() > catch_up_until {
                break;
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
        let second = counts::ids(&client, counts::RECEIVED_AFTER, &[&seen]).await?;
        consumer.stop().await?;

        let lost = counts::ids(&client, counts::LOST_IDS, &[]).await?;
        let delivered = first.len() + second.len();
        outcome
            .metrics
            .set(format!("{}.delivered", relay.name()), delivered as i64);
        outcome
            .metrics
            .set(format!("{}.lost", relay.name()), lost.len() as i64);
        table.push(vec![
            relay.name().into(),
            format!("{first:?}"),
            format!("{second:?}"),
            delivered.to_string(),
            format!("{lost:?}"),
        ]);
    }
    outcome.tables.push(table);
    Ok(outcome)
}
