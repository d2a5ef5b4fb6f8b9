//! A consumer-group worker on a Redis Stream: reads with XREADGROUP (its own pending entries
//! first, as a restarted or claiming worker must, then new ones), applies each event with the
//! consumer's logic ([`consumer::apply`]) and XACKs. The stream is at-least-once too: a worker
//! that dies before XACK leaves its entries pending, and another worker claims them.

use std::time::Duration;

use anyhow::{anyhow, Result};
use redis::aio::MultiplexedConnection;
use redis::streams::{StreamId, StreamReadOptions, StreamReadReply};
use redis::AsyncCommands;

use crate::outbox::consumer::{self, ConsumerKind};
use crate::outbox::crash::{self, CrashPoint};
use crate::outbox::event::Event;

/// The article's consumer group.
pub const GROUP: &str = "shipping";

/// XREADGROUP start ids: "0" re-reads this worker's own pending entries, ">" reads new ones.
const OWN_PENDING: &str = "0";
const NEW_ENTRIES: &str = ">";
/// A following worker's XREADGROUP waits this long for an entry before asking again: under the
/// connection's response timeout, so an idle stream is no error.
const FOLLOW_BLOCK: Option<Duration> = Some(Duration::from_millis(100));

pub struct StreamWorker {
    pub redis: MultiplexedConnection,
    /// A pooled connection, so the consumer's logic prepares its statements once.
    pub db: deadpool_postgres::Object,
    pub stream: String,
    pub name: String,
    pub kind: ConsumerKind,
}

impl StreamWorker {
    /// Processes up to `count` of its pending entries, then up to `count` new ones; returns how
    /// many entries it applied.
    pub async fn work(&mut self, count: usize) -> Result<usize> {
        let mut applied = 0;
        for start in [OWN_PENDING, NEW_ENTRIES] {
            let entries = self.read(start, count).await?;
            applied += self.apply_and_ack(&entries).await?;
        }
        Ok(applied)
    }

    /// Applies and acknowledges entries as they arrive, until the process is killed
    /// (notify-latency's Redis consumer: its receipts time the deliveries; verify's). What a
    /// predecessor of the same name read and did not acknowledge (it died applying it) comes
    /// first: a following worker must not leave it pending for ever.
    pub async fn follow(&mut self, count: usize) -> Result<()> {
        loop {
            let pending = self.read(OWN_PENDING, count).await?;
            if pending.is_empty() {
                break;
            }
            self.apply_and_ack(&pending).await?;
        }
        loop {
            let entries = self.read_blocking(NEW_ENTRIES, count, FOLLOW_BLOCK).await?;
            self.apply_and_ack(&entries).await?;
        }
    }

    /// Applies each entry with the consumer's logic, then acknowledges them all; how many.
    async fn apply_and_ack(&mut self, entries: &[StreamId]) -> Result<usize> {
        if entries.is_empty() {
            return Ok(0);
        }
        for entry in entries {
            let event = event_of(&self.stream, entry)?;
            consumer::apply(&self.db, self.kind, &event).await?;
        }
        crash::point(CrashPoint::StreamWorkerAfterApplyBeforeAck);
        let ids: Vec<&str> = entries.iter().map(|e| e.id.as_str()).collect();
        let _: i64 = self.redis.xack(&self.stream, GROUP, &ids).await?;
        Ok(entries.len())
    }

    async fn read(&mut self, start: &str, count: usize) -> Result<Vec<StreamId>> {
        self.read_blocking(start, count, None).await
    }

    /// XREADGROUP, waiting up to `block` for an entry when there is none.
    async fn read_blocking(
        &mut self,
        start: &str,
        count: usize,
        block: Option<Duration>,
    ) -> Result<Vec<StreamId>> {
        let mut options = StreamReadOptions::default()
            .group(GROUP, &self.name)
            .count(count);
        if let Some(block) = block {
            options = options.block(block.as_millis() as usize);
        }
        let reply: Option<StreamReadReply> = self
            .redis
            .xread_options(&[&self.stream], &[start], &options)
            .await?;
        Ok(reply
            .into_iter()
            .flat_map(|r| r.keys)
            .flat_map(|k| k.ids)
            .collect())
    }
}

/// The event an entry carries; the aggregate type is the stream's suffix.
fn event_of(stream: &str, entry: &StreamId) -> Result<Event> {
    let field = |name: &str| {
        entry
            .get::<String>(name)
            .ok_or_else(|| anyhow!("stream entry {} has no {name}", entry.id))
    };
    // Only event_id and aggregate_id are required; the outbox id comes as `outbox_id` (ours)
    // or `id` (the outbox's own column name).
    let outbox_id = entry.get::<String>("outbox_id").or_else(|| entry.get("id"));
    Ok(Event {
        event_id: field("event_id")?.parse()?,
        outbox_id: outbox_id.map(|id| id.parse()).transpose()?,
        aggregate_type: stream.rsplit('.').next().unwrap_or_default().to_string(),
        aggregate_id: field("aggregate_id")?,
        event_type: entry.get("event_type").unwrap_or_default(),
        payload: match entry.get::<String>("payload") {
            Some(payload) => serde_json::from_str(&payload)?,
            None => serde_json::Value::Null,
        },
        fence: None,
    })
}
