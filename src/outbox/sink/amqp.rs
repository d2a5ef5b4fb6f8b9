//! The RabbitMQ sink: a persistent message to the durable queue `outbox.event.<aggregate_type>`
//! with the event id as `message_id`, the whole batch in flight, each confirmed on its own (or,
//! the mistake, not confirmed at all); and those queues as outbox-lab wants them (declared,
//! made anew, counted).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};

use super::{all_failed, topic, SinkOptions};
use crate::connect;
use crate::outbox::event::Event;

/// Publishes events to RabbitMQ through the default exchange, each to the durable queue
/// `outbox.event.<aggregate_type>` as a persistent message (delivery mode 2) with its event id
/// as `message_id` and the event as JSON.
#[derive(Clone)]
pub struct AmqpSink {
    url: String,
    /// The connection and its channel (in confirm mode unless the mistake is asked for), opened
    /// again when the broker went away: lapin does not reconnect by itself.
    open: Arc<tokio::sync::Mutex<Option<(lapin::Connection, lapin::Channel)>>>,
    /// Publisher confirms; `false`: the mistake.
    confirms: bool,
    /// Before every queue name (the run's name prefix on an external broker).
    queue_prefix: String,
    /// A batch whose confirms are not all in within this time failed where they are missing.
    request_timeout: Duration,
}

impl AmqpSink {
    /// The queue of an aggregate type, named as Debezium's outbox router names its topics.
    pub fn queue_name(prefix: &str, aggregate_type: &str) -> String {
        topic(prefix, aggregate_type)
    }

    /// Connected to the RabbitMQ `options` name: a wrong URL or password is an error at once,
    /// not a retried event. A batch whose confirms are not all in after `request_timeout`
    /// failed where they are missing.
    pub(super) async fn connect(options: &SinkOptions, request_timeout: Duration) -> Result<Self> {
        let sink = AmqpSink {
            url: options.url.clone(),
            open: Arc::new(tokio::sync::Mutex::new(None)),
            confirms: options.publish_acks,
            queue_prefix: options.stream_prefix.clone(),
            request_timeout,
        };
        *sink.open.lock().await = Some(sink.open_channel().await?);
        Ok(sink)
    }

    /// Declares the durable queue `name` as outbox-lab's relays and consumers want it (or finds
    /// it so): a classic queue of the second version (RabbitMQ 3.10's new on-disk index and
    /// store), which took 15-25% more confirmed messages per second than the first here.
    pub async fn declare_queue(channel: &lapin::Channel, name: &str) -> Result<()> {
        let mut arguments = lapin::types::FieldTable::default();
        arguments.insert(
            "x-queue-version".into(),
            lapin::types::AMQPValue::LongInt(2),
        );
        let options = lapin::options::QueueDeclareOptions {
            durable: true,
            ..Default::default()
        };
        channel
            .queue_declare(name.into(), options, arguments)
            .await
            .with_context(|| format!("cannot declare queue {name}"))?;
        Ok(())
    }

    /// The durable queue `name` made anew: an earlier one is deleted first (with what it
    /// held).
    pub async fn redeclare_queue(channel: &lapin::Channel, name: &str) -> Result<()> {
        channel
            .queue_delete(name.into(), lapin::options::QueueDeleteOptions::default())
            .await
            .with_context(|| format!("cannot delete queue {name}"))?;
        Self::declare_queue(channel, name).await
    }

    /// The messages queue `name` holds ready for a consumer (not those taken and unacked).
    pub async fn ready_messages(channel: &lapin::Channel, name: &str) -> Result<i64> {
        let options = lapin::options::QueueDeclareOptions {
            passive: true,
            ..Default::default()
        };
        let declared = channel
            .queue_declare(name.into(), options, lapin::types::FieldTable::default())
            .await
            .with_context(|| format!("cannot count queue {name}"))?;
        Ok(i64::from(declared.message_count()))
    }

    async fn open_channel(&self) -> Result<(lapin::Connection, lapin::Channel)> {
        let connection = connect::amqp(&self.url).await?;
        let channel = connection.create_channel().await?;
        if self.confirms {
            channel
                .confirm_select(lapin::options::ConfirmSelectOptions::default())
                .await?;
        }
        Ok((connection, channel))
    }

    /// Every event published before the first confirm is awaited (the whole batch in flight),
    /// then each confirm awaited in batch order. With confirms, an event is delivered if and
    /// only if its own confirm is an Ack of a routed message (published `mandatory`: one with
    /// no queue to go to comes back, and fails); without, as soon as `basic_publish` returned.
    /// A connection that failed is opened again by the next batch.
    pub(super) async fn deliver(
        &self,
        events: &[Event],
        on_delivered: impl Fn(&Event),
    ) -> Vec<Result<()>> {
        use lapin::options::BasicPublishOptions;
        use lapin::{BasicProperties, Confirmation};
        // Every step is bounded by the request timeout: a broker killed or half started can
        // leave lapin waiting for ever (a channel that never opens, a publish never written).
        let deadline = tokio::time::Instant::now() + self.request_timeout;
        let timed_out = || anyhow!("no answer from RabbitMQ within {:?}", self.request_timeout);
        // Held only to open the channel: a relay's workers publish on it side by side.
        let channel = {
            let mut open = self.open.lock().await;
            if !open.as_ref().is_some_and(|(c, _)| c.status().connected()) {
                let opened = tokio::time::timeout_at(deadline, self.open_channel()).await;
                match opened.unwrap_or_else(|_| Err(timed_out())) {
                    Ok(pair) => *open = Some(pair),
                    Err(e) => {
                        *open = None;
                        return all_failed(events, &format!("{e:#}"));
                    }
                }
            }
            open.as_ref().expect("just opened").1.clone()
        };
        let options = BasicPublishOptions {
            mandatory: self.confirms,
            ..BasicPublishOptions::default()
        };
        let mut published = Vec::with_capacity(events.len());
        for event in events {
            let queue = Self::queue_name(&self.queue_prefix, &event.aggregate_type);
            let properties = BasicProperties::default()
                .with_delivery_mode(2)
                .with_message_id(event.event_id.to_string().into())
                .with_content_type("application/json".into());
            // An event always serializes.
            let payload = serde_json::to_vec(event).unwrap_or_default();
            let publish =
                channel.basic_publish("".into(), queue.into(), options, &payload, properties);
            let sent = match tokio::time::timeout_at(deadline, publish).await {
                Ok(sent) => sent.map_err(|e| anyhow!("AMQP publish: {e}")),
                Err(_) => Err(timed_out()),
            };
            published.push(sent);
        }
        if published.iter().any(Result::is_err) {
            // The next batch opens a connection anew rather than trust this one.
            *self.open.lock().await = None;
        }
        let mut results = Vec::with_capacity(events.len());
        for (event, sent) in events.iter().zip(published) {
            let delivered = match sent {
                Err(e) => Err(e),
                Ok(_) if !self.confirms => Ok(()),
                Ok(confirm) => match tokio::time::timeout_at(deadline, confirm).await {
                    Err(_) => Err(anyhow!(
                        "no publisher confirm within {:?}",
                        self.request_timeout
                    )),
                    Ok(Err(e)) => Err(anyhow!("AMQP publisher confirm: {e}")),
                    Ok(Ok(Confirmation::Ack(None))) => Ok(()),
                    Ok(Ok(Confirmation::Ack(Some(_)))) => Err(anyhow!(
                        "returned by RabbitMQ: no queue {}",
                        Self::queue_name(&self.queue_prefix, &event.aggregate_type)
                    )),
                    Ok(Ok(Confirmation::Nack(_))) => Err(anyhow!("nacked by RabbitMQ")),
                    Ok(Ok(Confirmation::NotRequested)) => {
                        Err(anyhow!("the channel is not in confirm mode"))
                    }
                },
            };
            if delivered.is_ok() {
                on_delivered(event);
            }
            results.push(delivered);
        }
        results
    }
}
