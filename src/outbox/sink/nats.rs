//! The NATS JetStream sink: a publish to `outbox.event.<aggregate_type>` with the event id as
//! `Nats-Msg-Id`, the whole batch in flight, each publish acknowledged on its own (or, the
//! mistake, core NATS publishes that nobody acknowledges); and the JetStream stream that
//! captures those subjects (its configuration, made anew).

use std::time::Duration;

use anyhow::{anyhow, Result};
use async_nats::jetstream::stream;
use bytes::Bytes;

use super::{topic, SinkOptions};
use crate::connect;
use crate::outbox::event::Event;

/// Publishes events to JetStream, on `outbox.event.<aggregate_type>`, each with its event id as
/// `Nats-Msg-Id` (the stream drops a publish whose id it has seen within its duplicate window).
#[derive(Clone)]
pub struct NatsSink {
    /// Its timeout is the relay's request timeout: an unacknowledged publish failed.
    jetstream: async_nats::jetstream::Context,
    /// The mistake, when asked for: publish without asking JetStream for an ack, on this
    /// connection.
    fire_and_forget: Option<async_nats::Client>,
    /// Before every subject (the run's subject prefix on an external server).
    subject_prefix: String,
}

impl NatsSink {
    /// The subject of an aggregate type, as Debezium's outbox router names its topics.
    pub fn subject(prefix: &str, aggregate_type: &str) -> String {
        topic(prefix, aggregate_type)
    }

    /// Connected to the NATS server (or cluster) `options` name; a JetStream publish
    /// unacknowledged after `request_timeout` failed.
    pub(super) async fn connect(options: &SinkOptions, request_timeout: Duration) -> Result<Self> {
        let client = connect::nats(&options.url).await?;
        let mut jetstream = async_nats::jetstream::new(client.clone());
        jetstream.set_timeout(request_timeout);
        Ok(NatsSink {
            jetstream,
            fire_and_forget: (!options.publish_acks).then_some(client),
            subject_prefix: options.stream_prefix.clone(),
        })
    }

    /// The stream `name`, capturing every aggregate type's subject under `subject_prefix`; a
    /// scenario sets what else it needs (its duplicate window, its replicas).
    pub fn stream_config(name: &str, subject_prefix: &str) -> stream::Config {
        stream::Config {
            name: name.to_string(),
            subjects: vec![Self::subject(subject_prefix, ">")],
            ..Default::default()
        }
    }

    /// The stream `config` describes, made anew: an earlier one of its name is deleted first
    /// (with what it held).
    pub async fn create_fresh_stream(
        jetstream: &async_nats::jetstream::Context,
        config: stream::Config,
    ) -> Result<stream::Stream> {
        let name = config.name.clone();
        let _ = jetstream.delete_stream(&name).await;
        jetstream
            .create_stream(config)
            .await
            .map_err(|e| anyhow!("cannot create JetStream stream {name}: {e}"))
    }

    /// What is published for an event: the event as JSON, its id as `Nats-Msg-Id`.
    fn message(event: &Event) -> (async_nats::HeaderMap, Bytes) {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(
            async_nats::header::NATS_MESSAGE_ID,
            event.event_id.to_string().as_str(),
        );
        // An event always serializes.
        let payload = serde_json::to_vec(event).unwrap_or_default();
        (headers, payload.into())
    }

    /// Every event published before the first ack is awaited (the whole batch in flight, as
    /// the Redis pipeline is), then each ack awaited in batch order. Each event is delivered if
    /// and only if its own publish was acknowledged by the stream (a duplicate the stream
    /// dropped included: it holds the event); a publish unacknowledged within the timeout
    /// failed, although the stream may hold it (a lost ack is a failure, retried).
    pub(super) async fn deliver(
        &self,
        events: &[Event],
        on_delivered: impl Fn(&Event),
    ) -> Vec<Result<()>> {
        if let Some(client) = &self.fire_and_forget {
            return self.fire_and_forget(client, events, on_delivered).await;
        }
        let mut acks = Vec::with_capacity(events.len());
        let mut subject = (None, String::new());
        for event in events {
            if subject.0 != Some(event.aggregate_type.as_str()) {
                subject = (
                    Some(event.aggregate_type.as_str()),
                    Self::subject(&self.subject_prefix, &event.aggregate_type),
                );
            }
            let (headers, payload) = Self::message(event);
            let published = self
                .jetstream
                .publish_with_headers(subject.1.clone(), headers, payload)
                .await;
            acks.push(published);
        }
        let mut results = Vec::with_capacity(events.len());
        for (event, published) in events.iter().zip(acks) {
            let acked = match published {
                Ok(ack) => ack.await.map_err(|e| anyhow!("JetStream publish ack: {e}")),
                Err(e) => Err(anyhow!("JetStream publish: {e}")),
            };
            if acked.is_ok() {
                on_delivered(event);
            }
            results.push(acked.map(drop));
        }
        results
    }

    /// The mistake: core NATS publishes, flushed once, and every event written to the
    /// connection counts as delivered — whether a stream stored it or not (none may capture the
    /// subject; the server may die with it in a buffer).
    async fn fire_and_forget(
        &self,
        client: &async_nats::Client,
        events: &[Event],
        on_delivered: impl Fn(&Event),
    ) -> Vec<Result<()>> {
        let mut written = Vec::with_capacity(events.len());
        for event in events {
            let subject = Self::subject(&self.subject_prefix, &event.aggregate_type);
            let (headers, payload) = Self::message(event);
            let published = client
                .publish_with_headers(subject, headers, payload)
                .await
                .map_err(|e| anyhow!("NATS publish: {e}"));
            written.push(published);
        }
        let flushed = client.flush().await.map_err(|e| anyhow!("NATS flush: {e}"));
        events
            .iter()
            .zip(written)
            .map(|(event, published)| {
                let delivered = match (&flushed, published) {
                    (Ok(()), Ok(())) => Ok(()),
                    (Err(e), Ok(())) => Err(anyhow!("{e}")),
                    (_, Err(e)) => Err(e),
                };
                if delivered.is_ok() {
                    on_delivered(event);
                }
                delivered
            })
            .collect()
    }
}
