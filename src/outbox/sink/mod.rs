//! Where relays deliver events: [`Sink`], chosen by the URL a relay is given
//! ([`SinkOptions::connect`]; [`check_url`] refuses a URL no sink takes). One file per sink:
//! `http.rs` (the outbox-lab consumer, an event or a batch per request: [`HttpSink`]),
//! `redis.rs` (a Redis Stream per aggregate type: [`RedisSink`]), `nats.rs` (NATS JetStream:
//! [`NatsSink`]), `amqp.rs` (RabbitMQ: [`AmqpSink`]) and `kafka.rs` (a Kafka topic per
//! aggregate type, keyed by aggregate: [`KafkaSink`]). Here, beside the URL's parsing, the
//! sink that delivers nowhere ([`DISCARD_URL`]: batch-throughput's ceiling, the relay's
//! database work alone) and what the sinks share: the name of an aggregate type's stream,
//! subject or queue, and a batch delivered or failed as a whole.

mod amqp;
mod http;
mod kafka;
mod nats;
mod redis;

use std::time::Duration;

use anyhow::{anyhow, Result};

pub use self::amqp::AmqpSink;
pub use self::http::{HttpBody, HttpSink};
pub use self::kafka::{
    partition_for_key, KafkaSink, EVENT_ID_HEADER, FETCH_MAX_BYTES, FETCH_WAIT_MS, PARTITIONS,
};
pub use self::nats::NatsSink;
pub use self::redis::RedisSink;
use crate::outbox::event::Event;

/// A delivery that has not been answered in this time counts as failed (and is retried): a
/// reply lost on the way back is a failure, although the consumer may have acted on it.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// A relay's destination.
#[derive(Clone)]
pub enum Sink {
    Http(HttpSink),
    Redis(RedisSink),
    Nats(NatsSink),
    Amqp(AmqpSink),
    Kafka(KafkaSink),
    /// Takes the whole batch at once and delivers it nowhere: what is left of a relay's time is
    /// its database's (batch-throughput's ceiling).
    Discard,
}

impl Sink {
    /// Delivers a batch, in order; `on_delivered` runs after each event known to be delivered
    /// (the relay's crash point). Results come back in batch order.
    pub async fn deliver(
        &self,
        events: &[Event],
        on_delivered: impl Fn(&Event),
    ) -> Vec<Result<()>> {
        match self {
            Sink::Http(http) => http.deliver(events, on_delivered).await,
            Sink::Redis(redis) => redis.deliver(events, on_delivered).await,
            Sink::Nats(nats) => nats.deliver(events, on_delivered).await,
            Sink::Amqp(amqp) => amqp.deliver(events, on_delivered).await,
            Sink::Kafka(kafka) => kafka.deliver(events, on_delivered).await,
            Sink::Discard => all_delivered(events, on_delivered),
        }
    }
}

/// Where a relay delivers, as it is told (the request timeout is the relay's:
/// [`RelayConfig::request_timeout`](crate::outbox::relay::RelayConfig)).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SinkOptions {
    /// `http://…` (the consumer), a Redis URL (a stream per aggregate type), `nats://…`
    /// (JetStream: a subject per aggregate type, in a stream that must exist), `amqp://…`
    /// (RabbitMQ: a durable queue per aggregate type, which must exist) or `kafka://…` (a
    /// topic per aggregate type, which must exist).
    pub url: String,
    /// Aggregates delivered to at once over HTTP, one event per request (per-aggregate order
    /// holds); 1: strictly one event after another. Kafka: Produce requests in flight at once
    /// per partition (its producers' `max.in.flight.requests.per.connection`), where
    /// `records_per_request` splits a partition's share of a batch.
    pub in_flight: usize,
    /// Kafka: records per Produce request (its producers' `batch.size`, in records); 0: a
    /// partition's share of a batch in one request.
    #[serde(default)]
    pub records_per_request: usize,
    /// HTTP: one event per request, or the whole batch in one.
    pub http_body: HttpBody,
    /// Before every stream name (the run's key prefix on an external Redis), NATS subject
    /// (the run's subject prefix on an external NATS), AMQP queue (the run's name prefix on
    /// an external RabbitMQ) or Kafka topic (likewise).
    pub stream_prefix: String,
    /// NATS: an event counts as delivered once JetStream acked its publish. `false` is the
    /// mistake, fire-and-forget: a core NATS publish, delivered as soon as it is written to the
    /// connection, stored or not. AMQP likewise: with `true`, an event counts as delivered
    /// once RabbitMQ confirmed it (publisher confirms: stored, fsynced); `false` is the mistake,
    /// no confirm mode, delivered as soon as `basic_publish` wrote it to the connection.
    #[serde(default = "publish_acks_by_default")]
    pub publish_acks: bool,
}

fn publish_acks_by_default() -> bool {
    true
}

impl SinkOptions {
    /// One event after another, streams named as the article names them.
    pub fn new(url: &str) -> SinkOptions {
        SinkOptions {
            url: url.to_string(),
            in_flight: 1,
            records_per_request: 0,
            http_body: HttpBody::Event,
            stream_prefix: String::new(),
            publish_acks: true,
        }
    }

    /// The sink these options describe: `http://…` for the HTTP consumer, a Redis URL
    /// ([`is_redis`]) for a Redis Stream, `nats://…` for JetStream, `amqp://…` for RabbitMQ,
    /// [`DISCARD_URL`] for nowhere. An HTTP delivery, a JetStream publish or a RabbitMQ publish
    /// unanswered after `request_timeout` failed.
    pub async fn connect(&self, request_timeout: Duration) -> Result<Sink> {
        if self.url == DISCARD_URL {
            Ok(Sink::Discard)
        } else if is_amqp(&self.url) {
            Ok(Sink::Amqp(AmqpSink::connect(self, request_timeout).await?))
        } else if is_kafka(&self.url) {
            Ok(Sink::Kafka(
                KafkaSink::connect(self, request_timeout).await?,
            ))
        } else if is_nats(&self.url) {
            Ok(Sink::Nats(NatsSink::connect(self, request_timeout).await?))
        } else if is_redis(&self.url) {
            Ok(Sink::Redis(RedisSink::connect(self).await?))
        } else {
            Ok(Sink::Http(HttpSink::with_options(self, request_timeout)?))
        }
    }
}

/// The sink that delivers nowhere ([`Sink::Discard`]): for the harness' own relays only (a
/// relay told to deliver nowhere from the command line would lose every event), so
/// [`check_url`] refuses it.
pub const DISCARD_URL: &str = "discard:";

/// A Redis URL: TCP (`redis://`, `rediss://`) or a Unix socket (`redis+unix://`, `unix://`).
pub fn is_redis(url: &str) -> bool {
    ["redis://", "rediss://", "redis+unix://", "unix://"]
        .iter()
        .any(|scheme| url.starts_with(scheme))
}

/// A NATS URL (`nats://[TOKEN@|USER:PASSWORD@]HOST:PORT`), or a cluster's, comma-separated.
pub fn is_nats(url: &str) -> bool {
    url.starts_with("nats://")
}

/// An AMQP URL (`amqp://USER:PASSWORD@HOST:PORT/%2f`; no TLS).
pub fn is_amqp(url: &str) -> bool {
    url.starts_with("amqp://")
}

/// A Kafka URL (`kafka://[USER:PASSWORD@]HOST:PORT[,HOST:PORT…]`; SASL PLAIN, no TLS).
pub fn is_kafka(url: &str) -> bool {
    url.starts_with("kafka://")
}

/// Checks a sink URL before anything connects: `http://HOST[:PORT]` (the HTTP client speaks no
/// TLS), a Redis URL ([`is_redis`]) that the Redis client accepts, a NATS URL ([`is_nats`]) or
/// an AMQP URL ([`is_amqp`]) or a Kafka URL ([`is_kafka`]). Anything else would have dead-lettered every event; the error
/// says what to give instead.
pub fn check_url(url: &str) -> Result<(), String> {
    const GIVE: &str = "give http://HOST:PORT (an outbox-lab consumer), redis://HOST:PORT (a \
                        Redis), nats://HOST:PORT (NATS JetStream), \
                        amqp://USER:PASSWORD@HOST:PORT/%2f (RabbitMQ) or \
                        kafka://[USER:PASSWORD@]HOST:PORT (Kafka)";
    if let Some(rest) = url.strip_prefix("amqp://") {
        // The client would connect to localhost where the URL names no host.
        let authority = rest.split('/').next().unwrap_or_default();
        let host = authority.rsplit('@').next().unwrap_or_default();
        if host.is_empty() || host.starts_with(':') {
            return Err(format!("no host; {GIVE}"));
        }
        return url
            .parse::<lapin::uri::AMQPUri>()
            .map(drop)
            .map_err(|e| format!("not an AMQP URL outbox-lab can use ({e}); {GIVE}"));
    }
    if is_kafka(url) {
        return crate::connect::kafka_url(url)
            .map(drop)
            .map_err(|e| format!("not a Kafka URL outbox-lab can use ({e}); {GIVE}"));
    }
    if is_nats(url) {
        // A cluster's nodes, separated by commas, each a NATS URL.
        return url.split(',').try_for_each(|one| {
            match one.trim().parse::<async_nats::ServerAddr>() {
                Ok(addr) if addr.host().is_empty() => Err(format!("no host; {GIVE}")),
                Ok(_) => Ok(()),
                Err(e) => Err(format!("not a NATS URL outbox-lab can use ({e}); {GIVE}")),
            }
        });
    }
    if is_redis(url) {
        return ::redis::Client::open(url)
            .map(drop)
            .map_err(|e| format!("not a Redis URL outbox-lab can use ({e}); {GIVE}"));
    }
    let why = match url.strip_prefix("http://") {
        Some(rest) if rest.trim_matches('/').is_empty() => "no host",
        Some(_) => match HttpSink::new(url) {
            Ok(sink) if sink.uri.host().is_some() => return Ok(()),
            _ => "not a valid URL",
        },
        None if url.starts_with("https://") => {
            "https is not supported (the relay speaks plain HTTP)"
        }
        None if url.contains("://") => "unknown scheme",
        None => "no scheme",
    };
    Err(format!("{why}; {GIVE}"))
}

/// The destination of an aggregate type's events — a Redis stream, a NATS subject, a RabbitMQ
/// queue, a Kafka topic — named as Debezium's outbox router names its topics, after the run's `prefix`.
fn topic(prefix: &str, aggregate_type: &str) -> String {
    format!("{prefix}outbox.event.{aggregate_type}")
}

/// A batch taken as a whole: every event delivered, in order.
fn all_delivered(events: &[Event], on_delivered: impl Fn(&Event)) -> Vec<Result<()>> {
    events
        .iter()
        .map(|event| {
            on_delivered(event);
            Ok(())
        })
        .collect()
}

/// A batch that failed as a whole: every event with the same `error`.
fn all_failed(events: &[Event], error: &str) -> Vec<Result<()>> {
    events
        .iter()
        .map(|_| Err(anyhow!(error.to_string())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::check_url;

    #[test]
    fn sink_urls_are_http_or_redis_or_nats_or_amqp_or_kafka() {
        for good in [
            "http://127.0.0.1:8080",
            "http://consumer/",
            "redis://10.0.0.6:6379",
            "nats://127.0.0.1:4222",
            "nats://token@127.0.0.1:4222",
            "amqp://user:pass@127.0.0.1:5672/%2f",
            "amqp://127.0.0.1",
            "nats://token@127.0.0.1:4222,nats://token@127.0.0.1:4223",
            "kafka://127.0.0.1:9092",
            "kafka://user:p%40ss@127.0.0.1:9092,127.0.0.1:9093",
        ] {
            assert_eq!(check_url(good), Ok(()), "{good}");
        }
        for bad in [
            "ftp://x",
            "https://x",
            "localhost:8080",
            "http://",
            "http://a b",
            "nats://",
            "amqp://",
            "amqp://user:pass@/%2f",
            "amqp://user:pass@127.0.0.1:notaport/%2f",
            "nats://127.0.0.1:4222,nats://",
            "kafka://",
            "kafka://127.0.0.1",
            "kafka://user@127.0.0.1:9092",
            "kafka://127.0.0.1:9092,",
            super::DISCARD_URL,
        ] {
            let e = check_url(bad).unwrap_err();
            assert!(e.contains("give http://HOST:PORT"), "{bad}: {e}");
        }
    }
}
