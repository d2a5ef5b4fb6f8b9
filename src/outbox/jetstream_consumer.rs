//! A durable pull consumer on a JetStream stream: fetches what the stream holds for it, applies
//! each message with the consumer's logic ([`consumer::apply`]) and acks it. At-least-once too:
//! a message not acked within the consumer's ack wait is delivered again. A database connection
//! lost while applying (a restart, a terminated session) is made again and the message applied
//! again before its ack: a worker that died instead would leave the message to come back only
//! after the ack wait, behind the later messages its successor fetched at once, and the
//! consumer would reorder what the relay sent in order.
//!
//! A message's body is the event as the HTTP consumer takes it: JSON with at least `event_id`
//! and `aggregate_id` (outbox-lab's relay publishes the whole event).

use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use async_nats::jetstream::consumer::{pull, AckPolicy, PullConsumer};
use futures_util::TryStreamExt;

use crate::connect;
use crate::outbox::consumer::{self, ConsumerKind};
use crate::outbox::event::Event;

/// The article's consumer group, as a durable consumer's name.
pub const DURABLE: &str = "shipping";

/// A worker gives up after this many fetches that each brought messages: far more than any
/// scenario writes, a bound on a stream that never runs dry.
const MAX_FETCHES: usize = 100_000;
/// A following worker's fetch waits this long for a first message before it asks again.
const FOLLOW_WAIT: Duration = Duration::from_millis(500);
/// A following worker redelivers, after this long, what a killed predecessor fetched and never
/// acked (JetStream's default would be 30 s).
const FOLLOW_ACK_WAIT: Duration = Duration::from_secs(2);

pub struct JetStreamWorker {
    consumer: PullConsumer,
    /// One pooled connection, so the consumer's logic prepares its statements once; made again
    /// when it is lost.
    db: deadpool_postgres::Pool,
    kind: ConsumerKind,
}

impl JetStreamWorker {
    /// The durable consumer `durable` on `stream` (created if missing: explicit acks, from the
    /// stream's first message; a following worker's unacked messages come again after
    /// [`FOLLOW_ACK_WAIT`]).
    pub async fn connect(
        url: &str,
        stream: &str,
        durable: &str,
        db: deadpool_postgres::Pool,
        kind: ConsumerKind,
        follow: bool,
    ) -> Result<JetStreamWorker> {
        let jetstream = async_nats::jetstream::new(connect::nats(url).await?);
        let stream = jetstream
            .get_stream(stream)
            .await
            .map_err(|e| anyhow!("JetStream stream {stream}: {e}"))?;
        let config = pull::Config {
            durable_name: Some(durable.to_string()),
            ack_policy: AckPolicy::Explicit,
            ack_wait: if follow {
                FOLLOW_ACK_WAIT
            } else {
                Duration::ZERO
            },
            ..Default::default()
        };
        let consumer = stream
            .get_or_create_consumer(durable, config)
            .await
            .map_err(|e| anyhow!("JetStream consumer {durable}: {e}"))?;
        Ok(JetStreamWorker { consumer, db, kind })
    }

    /// Applies and acks (waiting for the server to confirm each ack) what the stream holds
    /// for it, `batch` messages per fetch, until a fetch brings none; returns how many it
    /// applied.
    pub async fn drain(&mut self, batch: usize) -> Result<usize> {
        let mut applied = 0;
        for _ in 0..MAX_FETCHES {
            let fetched = self.fetch_and_apply(batch, None).await?;
            if fetched == 0 {
                return Ok(applied);
            }
            applied += fetched;
        }
        bail!("the stream did not run dry after {MAX_FETCHES} fetches")
    }

    /// Applies and acks new messages as they come, until killed.
    pub async fn follow(&mut self, batch: usize) -> Result<()> {
        loop {
            self.fetch_and_apply(batch, Some(FOLLOW_WAIT)).await?;
        }
    }

    /// One fetch of up to `batch` messages (waiting up to `wait` for the first, or not at
    /// all), each applied and acked; how many.
    async fn fetch_and_apply(&mut self, batch: usize, wait: Option<Duration>) -> Result<usize> {
        let fetch = self.consumer.fetch().max_messages(batch.max(1));
        let fetch = match wait {
            Some(wait) => fetch.expires(wait),
            None => fetch,
        };
        let mut messages = fetch
            .messages()
            .await
            .map_err(|e| anyhow!("JetStream fetch: {e}"))?;
        let mut fetched = 0;
        while let Some(message) = messages
            .try_next()
            .await
            .map_err(|e| anyhow!("JetStream fetch: {e}"))?
        {
            let event: Event = serde_json::from_slice(&message.payload)
                .map_err(|e| anyhow!("message on {} is not an event: {e}", message.subject))?;
            self.apply(&event).await?;
            message
                .double_ack()
                .await
                .map_err(|e| anyhow!("JetStream ack: {e}"))?;
            fetched += 1;
        }
        Ok(fetched)
    }

    /// Applies `event`, over a connection made again (patiently: the database may be
    /// restarting) for as long as the connection is lost under it, within
    /// [`connect::RECONNECT_PATIENCE`].
    async fn apply(&self, event: &Event) -> Result<()> {
        let until = std::time::Instant::now() + connect::RECONNECT_PATIENCE;
        loop {
            let db = connect::patiently(connect::RECONNECT_PATIENCE, async || {
                Ok(self.db.get().await?)
            })
            .await?;
            match consumer::apply(&db, self.kind, event).await {
                Err(e) if connect::lost_connection(&e) && std::time::Instant::now() < until => {}
                applied => return applied.map(drop),
            }
        }
    }
}
