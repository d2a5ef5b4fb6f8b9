//! A durable pull consumer on a JetStream stream: fetches what the stream holds for it, applies
//! each message with the consumer's logic ([`consumer::apply`]) and acks it. At-least-once too:
//! a message not acked within the consumer's ack wait is delivered again.

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

pub struct JetStreamWorker {
    consumer: PullConsumer,
    /// A pooled connection, so the consumer's logic prepares its statements once.
    db: deadpool_postgres::Object,
    kind: ConsumerKind,
}

impl JetStreamWorker {
    /// The durable consumer `durable` on `stream` (created if missing: explicit acks, from the
    /// stream's first message).
    pub async fn connect(
        url: &str,
        stream: &str,
        durable: &str,
        db: deadpool_postgres::Object,
        kind: ConsumerKind,
    ) -> Result<JetStreamWorker> {
        let jetstream = async_nats::jetstream::new(connect::nats(url).await?);
        let stream = jetstream
            .get_stream(stream)
            .await
            .map_err(|e| anyhow!("JetStream stream {stream}: {e}"))?;
        let config = pull::Config {
            durable_name: Some(durable.to_string()),
            ack_policy: AckPolicy::Explicit,
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
            let mut messages = self
                .consumer
                .fetch()
                .max_messages(batch.max(1))
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
                consumer::apply(&self.db, self.kind, &event).await?;
                message
                    .double_ack()
                    .await
                    .map_err(|e| anyhow!("JetStream ack: {e}"))?;
                fetched += 1;
            }
            if fetched == 0 {
                return Ok(applied);
            }
            applied += fetched;
        }
        bail!("the stream did not run dry after {MAX_FETCHES} fetches")
    }
}
