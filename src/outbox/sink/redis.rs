//! The Redis Stream sink: `XADD outbox.event.<aggregate_type>`, one pipeline per batch, each
//! XADD acknowledged on its own.

use anyhow::{anyhow, Result};

use super::{all_failed, topic, SinkOptions};
use crate::connect;
use crate::outbox::event::Event;

/// XADDs events to `outbox.event.<aggregate_type>` with the outbox row's fields.
#[derive(Clone)]
pub struct RedisSink {
    connection: redis::aio::MultiplexedConnection,
    stream_prefix: String,
}

impl RedisSink {
    /// The stream of an aggregate type, as Debezium's outbox router names its topics.
    pub fn stream_name(prefix: &str, aggregate_type: &str) -> String {
        topic(prefix, aggregate_type)
    }

    /// Connected to the Redis `options` name.
    pub(super) async fn connect(options: &SinkOptions) -> Result<Self> {
        Ok(RedisSink {
            connection: connect::redis(&options.url).await?,
            stream_prefix: options.stream_prefix.clone(),
        })
    }

    /// One pipeline for the whole batch, not a transaction (no MULTI/EXEC): Redis answers each
    /// XADD on its own, and some can be appended while others fail (a stream key holding
    /// another type answers WRONGTYPE). Each event is delivered if and only if its own XADD was
    /// acknowledged; a connection error fails every event whose reply did not come back (it
    /// may still have been appended: a lost reply is a failure, retried).
    pub(super) async fn deliver(
        &self,
        events: &[Event],
        on_delivered: impl Fn(&Event),
    ) -> Vec<Result<()>> {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        // Built once per run of events of one aggregate type, the event id and the payload
        // written into buffers reused from event to event: no allocation per event here.
        let mut stream = (None, String::new());
        let mut event_id = uuid::Uuid::encode_buffer();
        let mut payload = Vec::new();
        for event in events {
            if stream.0 != Some(event.aggregate_type.as_str()) {
                stream = (
                    Some(event.aggregate_type.as_str()),
                    Self::stream_name(&self.stream_prefix, &event.aggregate_type),
                );
            }
            payload.clear();
            // A Value always serializes.
            let _ = serde_json::to_writer(&mut payload, &event.payload);
            pipe.cmd("XADD")
                .arg(&stream.1)
                .arg("*")
                .arg("event_id")
                .arg(&*event.event_id.hyphenated().encode_lower(&mut event_id))
                .arg("aggregate_id")
                .arg(&event.aggregate_id)
                .arg("event_type")
                .arg(&event.event_type)
                .arg("payload")
                .arg(&payload[..])
                .arg("outbox_id")
                .arg(event.outbox_id.unwrap_or_default());
        }
        let mut connection = self.connection.clone();
        let replies = match pipe
            .query_async::<Vec<redis::RedisResult<redis::Value>>>(&mut connection)
            .await
        {
            Ok(replies) => replies,
            Err(e) => return all_failed(events, &format!("XADD: {e}")),
        };
        let mut replies = replies.into_iter();
        events
            .iter()
            .map(|event| match replies.next() {
                Some(Ok(_)) => {
                    on_delivered(event);
                    Ok(())
                }
                Some(Err(e)) => Err(anyhow!("XADD: {e}")),
                None => Err(anyhow!("XADD: no reply")),
            })
            .collect()
    }
}
