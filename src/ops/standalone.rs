//! The actors as long-running processes against your own PostgreSQL (and Redis, NATS or
//! RabbitMQ):
//! `outbox-lab relay` and `outbox-lab consumer`, to spread relays and consumers over several
//! hosts. They run the very components the scenarios use. SIGTERM or Ctrl-C stops them
//! gracefully: the relay finishes its batch (sent, marked, committed), the consumer its requests.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_postgres::Client;
use tracing::info;

use crate::connect;
use crate::outbox::amqp_consumer::AmqpWorker;
use crate::outbox::consumer::{self, ConsumerKind, Faults};
use crate::outbox::jetstream_consumer::{JetStreamWorker, DURABLE};
use crate::outbox::relay::{drive, sql, RelayOptions, RelayStats, Wakeup};
use crate::outbox::schema;
use crate::outbox::sink::NatsSink;
use crate::secrets;

/// Messages a broker's consumer takes at a time.
const FOLLOW_BATCH: usize = 100;

/// Delivers until `shutdown` resolves (`relay.follow` says how it wakes up).
pub async fn run_relay(
    database_url: &str,
    relay: RelayOptions,
    metrics_listen: Option<SocketAddr>,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    let db = connect::parse_url(database_url)?;
    let client = connect::postgres(&relay.connection(&db)).await?;
    if !schema::has_table(&client, "outbox").await? {
        bail!("this database has no outbox table: create it first (the article's, in outbox-lab's src/outbox/schema.rs)");
    }
    let listens = matches!(relay.follow, Some(Wakeup::Notify { .. }));
    if listens && !schema::has_notify_trigger(&client).await? {
        crate::errln!(
            "warning: no outbox_notify_trg trigger: only the fallback poll will find new rows; create it with:{}",
            schema::NOTIFY_TRIGGER
        );
    }
    let sink = relay
        .sink
        .connect(relay.config.request_timeout)
        .await
        .context("cannot deliver to --sink (or OUTBOX_LAB_SINK_URL)")?;
    let mut connected = relay.connect_with(&db, sink).await?;
    if let Some(addr) = metrics_listen {
        let listener = bind(addr).await?;
        let bound = listener.local_addr()?;
        let exporter = Exporter {
            stats: connected.stats(),
            client,
            name: relay.name.clone(),
            max_attempts: relay.config.max_attempts,
        };
        tokio::spawn(serve_metrics(listener, Arc::new(exporter)));
        info!(relay = %relay.name, "metrics on http://{bound}/metrics");
    }
    let until = relay
        .follow
        .map_or_else(|| "until drained".to_string(), |wakeup| wakeup.to_string());
    let sink = secrets::without_secrets(&relay.sink.url);
    info!(relay = %relay.name, "delivering to {sink} ({until})");
    drive(&mut connected, relay.until(), shutdown)
        .await
        .map(drop)
}

/// Where a standalone consumer takes its events from.
pub enum ConsumerSource {
    /// Serves `POST /events` here.
    Http(SocketAddr),
    /// Follows the durable consumer `shipping` on this JetStream stream (created if missing,
    /// capturing `outbox.event.>`).
    Nats { url: String, stream: String },
    /// Takes from this RabbitMQ queue (declared durable if missing), acking what it applied.
    Amqp { url: String, queue: String },
}

/// Applies events from `source` until `shutdown` resolves; with `create_schema`, creates the
/// consumer's tables (schema `consumer`) if they are missing.
pub async fn run_consumer(
    database_url: &str,
    source: ConsumerSource,
    kind: ConsumerKind,
    create_schema: bool,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    let db = connect::parse_url(database_url)?;
    let client = connect::postgres(&db).await?;
    if !schema::has_table(&client, "consumer.receipts").await? {
        if !create_schema {
            bail!("this database has no consumer tables (schema consumer): rerun with --create-schema");
        }
        client.batch_execute(schema::CREATE_CONSUMER).await?;
    }
    let name = kind.name();
    match source {
        ConsumerSource::Http(listen) => {
            let listener = bind(listen).await?;
            let announce = |addr: SocketAddr| info!(consumer = name, "listening http://{addr}");
            consumer::serve(listener, db, kind, Faults::default(), announce, shutdown).await?;
        }
        ConsumerSource::Nats { url, stream } => {
            let jetstream = async_nats::jetstream::new(connect::nats(&url).await?);
            jetstream
                .get_or_create_stream(NatsSink::stream_config(&stream, ""))
                .await
                .map_err(|e| anyhow!("JetStream stream {stream}: {e}"))?;
            let pool = consumer::pool(db, 1)?;
            let mut worker =
                JetStreamWorker::connect(&url, &stream, DURABLE, pool, kind, true).await?;
            info!(
                consumer = name,
                "following JetStream stream {stream} as {DURABLE} on {}",
                secrets::without_secrets(&url)
            );
            tokio::select! {
                followed = worker.follow(FOLLOW_BATCH) => followed?,
                () = shutdown => {}
            }
        }
        ConsumerSource::Amqp { url, queue } => {
            let pooled = consumer::pool(db, 1)?.get().await?;
            let mut worker = AmqpWorker::connect(&url, pooled, kind).await?;
            worker.declare_queue(&queue).await?;
            info!(
                consumer = name,
                "taking from RabbitMQ queue {queue} on {}",
                secrets::without_secrets(&url)
            );
            tokio::select! {
                followed = worker.follow(&queue, FOLLOW_BATCH) => followed?,
                () = shutdown => {}
            }
        }
    }
    info!(consumer = name, "stopped");
    Ok(())
}

async fn bind(addr: SocketAddr) -> Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} (in use? choose another address)"))
}

/// The relay's `/metrics` (Prometheus text format).
struct Exporter {
    stats: Arc<RelayStats>,
    /// Reads the backlog figures from the outbox at each scrape.
    client: Client,
    name: String,
    max_attempts: i32,
}

impl Exporter {
    async fn render(&self) -> Result<String> {
        let backlog = self
            .client
            .query_one(sql::BACKLOG, &[&self.max_attempts])
            .await?;
        let (dead_letters, lag_s): (i64, f64) = (backlog.get(0), backlog.get(1));
        let delivered = self.stats.delivered.load(Ordering::Relaxed);
        let failed = self.stats.failed.load(Ordering::Relaxed);
        Ok(exposition(
            &self.name,
            delivered,
            failed,
            dead_letters,
            lag_s,
        ))
    }
}

/// The `/metrics` page (Prometheus text format) of the relay named `relay`.
fn exposition(relay: &str, delivered: u64, failed: u64, dead_letters: i64, lag_s: f64) -> String {
    let relay = escape_label_value(relay);
    format!(
        "# HELP outbox_relay_delivered_total Events this relay delivered.\n\
         # TYPE outbox_relay_delivered_total counter\n\
         outbox_relay_delivered_total{{relay=\"{relay}\"}} {delivered}\n\
         # HELP outbox_relay_failed_total Deliveries that failed (each is retried after its backoff).\n\
         # TYPE outbox_relay_failed_total counter\n\
         outbox_relay_failed_total{{relay=\"{relay}\"}} {failed}\n\
         # HELP outbox_dead_letters Undelivered rows that used up their attempts.\n\
         # TYPE outbox_dead_letters gauge\n\
         outbox_dead_letters {dead_letters}\n\
         # HELP outbox_oldest_unpublished_age_seconds Age of the oldest row still to deliver.\n\
         # TYPE outbox_oldest_unpublished_age_seconds gauge\n\
         outbox_oldest_unpublished_age_seconds {lag_s:.3}\n"
    )
}

/// A label value as the Prometheus text format writes it: backslash, double quote and newline
/// escaped (`\\`, `\"`, `\n`).
fn escape_label_value(value: &str) -> String {
    let mut escaped = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => escaped.push_str("\\\\"),
            '"' => escaped.push_str("\\\""),
            '\n' => escaped.push_str("\\n"),
            c => escaped.push(c),
        }
    }
    escaped
}

async fn serve_metrics(listener: TcpListener, exporter: Arc<Exporter>) {
    while let Ok((stream, _)) = listener.accept().await {
        let exporter = exporter.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| scrape(exporter.clone(), request));
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn scrape(
    exporter: Arc<Exporter>,
    request: Request<hyper::body::Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (status, body) = match request.uri().path() {
        "/metrics" => match exporter.render().await {
            Ok(text) => (StatusCode::OK, text),
            Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}\n")),
        },
        _ => (StatusCode::NOT_FOUND, "see /metrics\n".to_string()),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::exposition;

    /// A relay's name is a label value: a quote, a backslash or a newline in it is escaped
    /// (Prometheus text format), so it cannot end the label or add a line.
    #[test]
    fn label_values_are_escaped() {
        let plain = exposition("relay-1", 3, 1, 0, 0.25);
        assert!(plain.contains("outbox_relay_delivered_total{relay=\"relay-1\"} 3\n"));
        let name = "a\"} 1\nfake_metric{x=\"\\";
        let text = exposition(name, 3, 1, 0, 0.25);
        assert_eq!(text.lines().count(), plain.lines().count(), "{text}");
        assert!(
            !text.lines().any(|l| l.starts_with("fake_metric")),
            "{text}"
        );
        let escaped = r#"relay="a\"} 1\nfake_metric{x=\"\\""#;
        assert!(
            text.contains(&format!("outbox_relay_delivered_total{{{escaped}}} 3\n")),
            "{text}"
        );
        assert!(text.contains(&format!("outbox_relay_failed_total{{{escaped}}} 1\n")));
    }
}
