//! Where relays deliver events: the HTTP consumer (keep-alive client; one event per request, as
//! the article posts them, or a batch per request: [`HttpBody`]), a Redis Stream
//! (`XADD outbox.event.<aggregate_type>`, one pipeline per batch, each XADD acknowledged on its
//! own), NATS JetStream (a publish to `outbox.event.<aggregate_type>` with the event id as
//! `Nats-Msg-Id`, the whole batch in flight, each publish acknowledged on its own) or RabbitMQ
//! (a persistent message to the durable queue `outbox.event.<aggregate_type>` with the event id
//! as `message_id`, the whole batch in flight, each confirmed on its own). Beside them, nowhere
//! ([`DISCARD_URL`]): batch-throughput's ceiling, the relay's database work alone.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use async_nats::jetstream::stream;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Uri};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use tokio::sync::Semaphore;

use crate::connect;
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
            Sink::Discard => events
                .iter()
                .map(|event| {
                    on_delivered(event);
                    Ok(())
                })
                .collect(),
        }
    }
}

/// Where a relay delivers, as it is told (the request timeout is the relay's:
/// [`RelayConfig::request_timeout`](crate::outbox::relay::RelayConfig)).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SinkOptions {
    /// `http://…` (the consumer), a Redis URL (a stream per aggregate type), `nats://…`
    /// (JetStream: a subject per aggregate type, in a stream that must exist) or `amqp://…`
    /// (RabbitMQ: a durable queue per aggregate type, which must exist).
    pub url: String,
    /// Aggregates delivered to at once over HTTP, one event per request (per-aggregate order
    /// holds); 1: strictly one event after another.
    pub in_flight: usize,
    /// HTTP: one event per request, or the whole batch in one.
    pub http_body: HttpBody,
    /// Before every stream name (the run's key prefix on an external Redis), NATS subject
    /// (the run's subject prefix on an external NATS) or AMQP queue (the run's name prefix on
    /// an external RabbitMQ).
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

/// What an HTTP request carries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum HttpBody {
    /// One event, as the article's relay posts them: the consumer commits once per event.
    #[default]
    Event,
    /// The batch as a JSON array, in batch order: the consumer applies it in one transaction
    /// (idempotent per event) and the answer covers every event in it.
    Array,
}

impl SinkOptions {
    /// One event after another, streams named as the article names them.
    pub fn new(url: &str) -> SinkOptions {
        SinkOptions {
            url: url.to_string(),
            in_flight: 1,
            http_body: HttpBody::Event,
            stream_prefix: String::new(),
            publish_acks: true,
        }
    }

    /// The sink these options describe: `http://…` for the HTTP consumer, a Redis URL
    /// ([`is_redis`]) for a Redis Stream, `nats://…` for JetStream, `amqp://…` for RabbitMQ,
    /// [`DISCARD_URL`] for nowhere. An
    /// HTTP delivery, a JetStream publish or a RabbitMQ publish unanswered after
    /// `request_timeout` failed.
    pub async fn connect(&self, request_timeout: Duration) -> Result<Sink> {
        if self.url == DISCARD_URL {
            Ok(Sink::Discard)
        } else if is_amqp(&self.url) {
            let sink = AmqpSink {
                url: self.url.clone(),
                open: Arc::new(tokio::sync::Mutex::new(None)),
                confirms: self.publish_acks,
                queue_prefix: self.stream_prefix.clone(),
                request_timeout,
            };
            // Connected now: a wrong URL or password is an error at once, not a retried event.
            *sink.open.lock().await = Some(sink.open_channel().await?);
            Ok(Sink::Amqp(sink))
        } else if is_nats(&self.url) {
            let client = connect::nats(&self.url).await?;
            let mut jetstream = async_nats::jetstream::new(client.clone());
            jetstream.set_timeout(request_timeout);
            Ok(Sink::Nats(NatsSink {
                jetstream,
                fire_and_forget: (!self.publish_acks).then_some(client),
                subject_prefix: self.stream_prefix.clone(),
            }))
        } else if is_redis(&self.url) {
            let connection = connect::redis(&self.url).await?;
            Ok(Sink::Redis(RedisSink {
                connection,
                stream_prefix: self.stream_prefix.clone(),
            }))
        } else {
            Ok(Sink::Http(HttpSink {
                in_flight: self.in_flight.max(1),
                body: self.http_body,
                request_timeout,
                ..HttpSink::new(&self.url)?
            }))
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

/// Checks a sink URL before anything connects: `http://HOST[:PORT]` (the HTTP client speaks no
/// TLS), a Redis URL ([`is_redis`]) that the Redis client accepts, a NATS URL ([`is_nats`]) or
/// an AMQP URL ([`is_amqp`]). Anything else would have dead-lettered every event; the error
/// says what to give instead.
pub fn check_url(url: &str) -> Result<(), String> {
    const GIVE: &str = "give http://HOST:PORT (an outbox-lab consumer), redis://HOST:PORT (a \
                        Redis), nats://HOST:PORT (NATS JetStream) or \
                        amqp://USER:PASSWORD@HOST:PORT/%2f (RabbitMQ)";
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
        return redis::Client::open(url)
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

/// POSTs events as JSON to `<base>/events`, one per request or a batch as an array
/// ([`HttpBody`]); a 2xx answer is a delivery of everything the request carried.
#[derive(Clone)]
pub struct HttpSink {
    uri: Uri,
    client: Client<HttpConnector, Full<Bytes>>,
    in_flight: usize,
    body: HttpBody,
    request_timeout: Duration,
}

impl HttpSink {
    pub fn new(base_url: &str) -> Result<HttpSink> {
        let uri: Uri = format!("{}/events", base_url.trim_end_matches('/'))
            .parse()
            .with_context(|| format!("invalid sink URL '{}'", crate::secrets::redact(base_url)))?;
        let mut connector = HttpConnector::new();
        // Each request goes out at once, not held back by Nagle for an earlier segment's ACK.
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Ok(HttpSink {
            uri,
            client,
            in_flight: 1,
            body: HttpBody::Event,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
        })
    }

    /// Where it POSTs, its password masked: for messages, log lines and `last_error`.
    fn shown_uri(&self) -> String {
        crate::secrets::redact(&self.uri.to_string())
    }

    pub async fn send(&self, event: &Event) -> Result<()> {
        self.post(serde_json::to_vec(event)?).await
    }

    /// POSTs a JSON body; Ok on a 2xx answer.
    async fn post(&self, body: Vec<u8>) -> Result<()> {
        let request = Request::post(self.uri.clone())
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))?;
        let response = tokio::time::timeout(self.request_timeout, self.client.request(request))
            .await
            .map_err(|_| {
                anyhow!(
                    "no answer from {} within {:?}",
                    self.shown_uri(),
                    self.request_timeout
                )
            })?
            .map_err(|e| anyhow!("POST {}: {}", self.shown_uri(), error_chain(&e)))?;
        let status = response.status();
        // Read the body to the end so the connection can be reused.
        let _ = response.into_body().collect().await;
        if !status.is_success() {
            bail!("HTTP {status}");
        }
        Ok(())
    }

    /// The batch in one request (an array body): delivered or failed as a whole. Otherwise one
    /// event after another; or, with `in_flight` > 1, aggregates side by side and each
    /// aggregate's events still one after another, so per-aggregate order holds.
    async fn deliver(&self, events: &[Event], on_delivered: impl Fn(&Event)) -> Vec<Result<()>> {
        if self.body == HttpBody::Array {
            let sent = match serde_json::to_vec(events) {
                Ok(body) => self.post(body).await,
                Err(e) => Err(e.into()),
            };
            return match sent {
                Ok(()) => events
                    .iter()
                    .map(|event| {
                        on_delivered(event);
                        Ok(())
                    })
                    .collect(),
                Err(e) => {
                    let error = format!("{e:#}");
                    events.iter().map(|_| Err(anyhow!(error.clone()))).collect()
                }
            };
        }
        if self.in_flight <= 1 {
            let mut results = Vec::with_capacity(events.len());
            for event in events {
                let result = self.send(event).await;
                if result.is_ok() {
                    on_delivered(event);
                }
                results.push(result);
            }
            return results;
        }
        let mut by_aggregate: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, event) in events.iter().enumerate() {
            by_aggregate
                .entry(event.aggregate_id.as_str())
                .or_default()
                .push(i);
        }
        let permits = Arc::new(Semaphore::new(self.in_flight));
        let mut tasks = tokio::task::JoinSet::new();
        for indexes in by_aggregate.into_values() {
            let sink = self.clone();
            let permits = permits.clone();
            let group: Vec<(usize, Event)> = indexes
                .into_iter()
                .map(|i| (i, events[i].clone()))
                .collect();
            tasks.spawn(async move {
                let _permit = permits.acquire_owned().await.expect("never closed");
                let mut results = Vec::with_capacity(group.len());
                for (i, event) in group {
                    results.push((i, sink.send(&event).await));
                }
                results
            });
        }
        let mut results: Vec<Option<Result<()>>> = events.iter().map(|_| None).collect();
        while let Some(done) = tasks.join_next().await {
            for (i, result) in done.unwrap_or_default() {
                if result.is_ok() {
                    on_delivered(&events[i]);
                }
                results[i] = Some(result);
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(anyhow!("delivery task failed"))))
            .collect()
    }
}

/// XADDs events to `outbox.event.<aggregate_type>` with the outbox row's fields.
#[derive(Clone)]
pub struct RedisSink {
    connection: redis::aio::MultiplexedConnection,
    stream_prefix: String,
}

impl RedisSink {
    /// The stream of an aggregate type, as Debezium's outbox router names its topics.
    pub fn stream_name(prefix: &str, aggregate_type: &str) -> String {
        format!("{prefix}outbox.event.{aggregate_type}")
    }

    /// One pipeline for the whole batch, not a transaction (no MULTI/EXEC): Redis answers each
    /// XADD on its own, and some can be appended while others fail (a stream key holding
    /// another type answers WRONGTYPE). Each event is delivered if and only if its own XADD was
    /// acknowledged; a connection error fails every event whose reply did not come back (it
    /// may still have been appended: a lost reply is a failure, retried).
    async fn deliver(&self, events: &[Event], on_delivered: impl Fn(&Event)) -> Vec<Result<()>> {
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
            Err(e) => {
                let error = format!("XADD: {e}");
                return events.iter().map(|_| Err(anyhow!(error.clone()))).collect();
            }
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
        format!("{prefix}outbox.event.{aggregate_type}")
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
    async fn deliver(&self, events: &[Event], on_delivered: impl Fn(&Event)) -> Vec<Result<()>> {
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
        format!("{prefix}outbox.event.{aggregate_type}")
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
    async fn deliver(&self, events: &[Event], on_delivered: impl Fn(&Event)) -> Vec<Result<()>> {
        use lapin::options::BasicPublishOptions;
        use lapin::{BasicProperties, Confirmation};
        // Held only to open the channel: a relay's workers publish on it side by side.
        let channel = {
            let mut open = self.open.lock().await;
            if !open.as_ref().is_some_and(|(c, _)| c.status().connected()) {
                match self.open_channel().await {
                    Ok(pair) => *open = Some(pair),
                    Err(e) => {
                        *open = None;
                        let error = format!("{e:#}");
                        return events.iter().map(|_| Err(anyhow!(error.clone()))).collect();
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
            let sent = channel
                .basic_publish("".into(), queue.into(), options, &payload, properties)
                .await;
            published.push(sent);
        }
        let deadline = tokio::time::Instant::now() + self.request_timeout;
        let mut results = Vec::with_capacity(events.len());
        for (event, sent) in events.iter().zip(published) {
            let delivered = match sent {
                Err(e) => Err(anyhow!("AMQP publish: {e}")),
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

/// "client error (Connect): tcp connect error: Connection refused (os error 111)".
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::check_url;

    #[test]
    fn sink_urls_are_http_or_redis_or_nats_or_amqp() {
        for good in [
            "http://127.0.0.1:8080",
            "http://consumer/",
            "redis://10.0.0.6:6379",
            "nats://127.0.0.1:4222",
            "nats://token@127.0.0.1:4222",
            "amqp://user:pass@127.0.0.1:5672/%2f",
            "amqp://127.0.0.1",
            "nats://token@127.0.0.1:4222,nats://token@127.0.0.1:4223",
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
            super::DISCARD_URL,
        ] {
            let e = check_url(bad).unwrap_err();
            assert!(e.contains("give http://HOST:PORT"), "{bad}: {e}");
        }
    }
}
