//! A consumer of a RabbitMQ queue with manual acks: takes what the queue holds (`basic.get`),
//! applies it with the consumer's logic, a batch per transaction ([`consumer::apply_batch`]),
//! and acks it once applied. At-least-once too: a message taken but not acked goes back to the
//! queue when the channel closes.

use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use lapin::options::{BasicAckOptions, BasicGetOptions};

use crate::connect;
use crate::outbox::consumer::{self, ConsumerKind};
use crate::outbox::event::Event;
use crate::outbox::sink::AmqpSink;

/// A worker gives up after this many messages: far more than any scenario writes, a bound on a
/// queue that never runs dry.
const MAX_MESSAGES: usize = 1_000_000;
/// How long a following worker waits before it looks at an empty queue again.
const FOLLOW_POLL: Duration = Duration::from_millis(20);

pub struct AmqpWorker {
    connection: lapin::Connection,
    channel: lapin::Channel,
    /// A pooled connection, so the consumer's logic prepares its statements once.
    db: deadpool_postgres::Object,
    kind: ConsumerKind,
}

impl AmqpWorker {
    pub async fn connect(
        url: &str,
        db: deadpool_postgres::Object,
        kind: ConsumerKind,
    ) -> Result<AmqpWorker> {
        let connection = connect::amqp(url).await?;
        let channel = connection.create_channel().await?;
        Ok(AmqpWorker {
            connection,
            channel,
            db,
            kind,
        })
    }

    /// Declares `queue` as the relays' sink wants it, if it is not there yet.
    pub async fn declare_queue(&self, queue: &str) -> Result<()> {
        AmqpSink::declare_queue(&self.channel, queue).await
    }

    /// Applies and acks what `queue` holds, until it is empty: up to `batch` messages taken,
    /// applied in one transaction ([`consumer::apply_batch`]), then acked together (the last
    /// one's ack with `multiple`); returns how many it applied.
    pub async fn drain(&mut self, queue: &str, batch: usize) -> Result<usize> {
        let mut applied = 0;
        while applied < MAX_MESSAGES {
            let taken = self.take_and_apply(queue, batch).await?;
            if taken == 0 {
                return Ok(applied);
            }
            applied += taken;
        }
        bail!("queue {queue} did not run dry after {MAX_MESSAGES} messages")
    }

    /// Applies and acks new messages as they come, until killed: the queue is looked at again
    /// [`FOLLOW_POLL`] after it was found empty.
    pub async fn follow(&mut self, queue: &str, batch: usize) -> Result<()> {
        loop {
            if self.take_and_apply(queue, batch).await? == 0 {
                tokio::time::sleep(FOLLOW_POLL).await;
            }
        }
    }

    /// Takes up to `batch` messages, applies them in one transaction and acks them together;
    /// how many.
    async fn take_and_apply(&mut self, queue: &str, batch: usize) -> Result<usize> {
        let mut events = Vec::with_capacity(batch);
        let mut last = None;
        while events.len() < batch.max(1) {
            let Some(message) = self
                .channel
                .basic_get(queue.into(), BasicGetOptions { no_ack: false })
                .await
                .with_context(|| format!("cannot take a message from queue {queue}"))?
            else {
                break;
            };
            let event: Event = serde_json::from_slice(&message.delivery.data)
                .map_err(|e| anyhow!("a message on queue {queue} is not an event: {e}"))?;
            events.push(event);
            last = Some(message.delivery);
        }
        let Some(last) = last else {
            return Ok(0);
        };
        consumer::apply_batch(&self.db, self.kind, &events).await?;
        last.ack(BasicAckOptions { multiple: true })
            .await
            .map_err(|e| anyhow!("AMQP ack: {e}"))?;
        Ok(events.len())
    }

    pub async fn close(self) -> Result<()> {
        self.connection.close(200, "drained".into()).await?;
        Ok(())
    }
}
