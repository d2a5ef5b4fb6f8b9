//! `outbox-lab relay`: a relay against your own database until SIGTERM or Ctrl-C.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};

use crate::error::exit;
use crate::harness::run::interrupted;
use crate::ops::logging::{self, LogFormat};
use crate::ops::standalone;
use crate::outbox::relay::{Partition, RelayConfig, RelayOptions, Wakeup};
use crate::outbox::sink::{self, HttpBody, SinkOptions};
use crate::secrets;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum RelayMode {
    /// Poll every --interval-ms.
    Poll,
    /// LISTEN for the outbox trigger's NOTIFY; poll every --interval-ms anyway (a fallback).
    Notify,
}

#[derive(Debug, Args)]
pub struct RelayArgs {
    /// The database with the outbox table.
    #[arg(long, env = "OUTBOX_LAB_DATABASE_URL", hide_env_values = true)]
    database_url: String,
    /// http://HOST:PORT (an outbox-lab consumer, POST /events), redis://HOST:PORT (streams
    /// outbox.event.<aggregate_type>), nats://[TOKEN@]HOST:PORT (JetStream publishes to
    /// subjects outbox.event.<aggregate_type>, Nats-Msg-Id = event_id; a stream must capture
    /// them) or amqp://USER:PASSWORD@HOST:PORT/%2f (RabbitMQ: persistent messages to the
    /// durable queues outbox.event.<aggregate_type>, which must exist; message_id = event_id).
    /// A URL with credentials is best left out of the command line (any local user can read
    /// one): leave --sink out and set OUTBOX_LAB_SINK_URL.
    #[arg(long, value_name = "URL", env = "OUTBOX_LAB_SINK_URL", hide_env_values = true,
          value_parser = parse_sink)]
    sink: String,
    #[arg(long, value_enum, default_value = "poll")]
    mode: RelayMode,
    /// The poll interval, or the fallback poll with --mode notify (at least 1).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    interval_ms: u64,
    /// i/N: only aggregates with (hashtext(aggregate_id) & 2147483647) % N = i (N relays, one each).
    #[arg(long)]
    partition: Option<Partition>,
    /// Hold an aggregate's later events back while an earlier one is undelivered.
    #[arg(long)]
    guard: bool,
    /// Send a batch only once every streaming standby has flushed the WAL its rows were
    /// committed in (pg_stat_replication; none streaming: none waited for): a failover cannot
    /// take back what was sent.
    #[arg(long)]
    fence_standby: bool,
    /// Rows per fetch (at least 1).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i64).range(1..))]
    batch: i64,
    /// Aggregates delivered to at once over HTTP (per-aggregate order holds).
    #[arg(long, default_value_t = 1)]
    in_flight: usize,
    /// http:// sinks only: what a POST carries; with array, one request per batch, so
    /// --in-flight does not apply.
    #[arg(long, value_enum, default_value = "event")]
    http_body: HttpBody,
    /// Delivery loops in this relay, each over its share of the aggregates (per-aggregate order
    /// holds): one delivers while another waits for its COMMIT. Not with --partition.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=16),
          conflicts_with = "partition")]
    workers: u32,
    /// nats:// and amqp:// sinks only, the mistake: count an event published once it is
    /// written to the connection (a core NATS publish; an AMQP publish without confirm mode),
    /// without waiting for JetStream's ack or RabbitMQ's publisher confirm.
    #[arg(long)]
    no_publish_acks: bool,
    /// Names the relay in logs, metrics and pg_stat_activity.
    #[arg(long, default_value = "0")]
    name: String,
    /// Serve Prometheus metrics on ADDR/metrics.
    #[arg(long)]
    metrics_listen: Option<std::net::SocketAddr>,
    #[arg(long, value_enum, default_value = "text")]
    log_format: LogFormat,
}

pub async fn run(mut args: RelayArgs) -> Result<ExitCode> {
    args.sink = with_credentials_from_env(&args.sink);
    sink_flags_fit(&args)?;
    logging::init(args.log_format);
    let interval = Duration::from_millis(args.interval_ms);
    let relay = RelayOptions {
        name: args.name,
        sink: SinkOptions {
            in_flight: args.in_flight,
            http_body: args.http_body,
            publish_acks: !args.no_publish_acks,
            ..SinkOptions::new(&args.sink)
        },
        config: RelayConfig {
            batch: args.batch,
            partition: args.partition,
            head_of_line_guard: args.guard,
            fence_standby: args.fence_standby,
            workers: args.workers,
            ..RelayConfig::default()
        },
        follow: Some(match args.mode {
            RelayMode::Poll => Wakeup::Poll(interval),
            RelayMode::Notify => Wakeup::Notify { fallback: interval },
        }),
    };
    let shutdown = async {
        interrupted().await;
    };
    standalone::run_relay(&args.database_url, relay, args.metrics_listen, shutdown).await?;
    Ok(ExitCode::from(exit::OK))
}

/// A flag for one kind of sink given with another would be silently ignored: refused instead
/// (the URL is not repeated: it may hold a password).
fn sink_flags_fit(args: &RelayArgs) -> Result<()> {
    let http = args.sink.starts_with("http://");
    if !http && (args.in_flight != 1 || args.http_body != HttpBody::Event) {
        bail!("--in-flight and --http-body are for http:// sinks, and --sink is not one: leave them out");
    }
    if args.no_publish_acks && !(sink::is_nats(&args.sink) || sink::is_amqp(&args.sink)) {
        bail!("--no-publish-acks is for nats:// and amqp:// sinks, and --sink is neither: leave it out");
    }
    Ok(())
}

/// `verify`'s `{sink_url}` on a command line leaves a broker's credentials out (any local user
/// can read a command line); the same URL with them is in `OUTBOX_LAB_SINK_URL`, as verify
/// gives it to the relay: taken from there, so that `--sink {sink_url}` reaches a broker that
/// asks for them.
fn with_credentials_from_env(given: &str) -> String {
    match std::env::var(SINK_URL_VAR) {
        Ok(full) if full != given && secrets::without_secrets(&full) == given => full,
        _ => given.to_string(),
    }
}

/// Where verify gives a relay its sink's URL, credentials included.
const SINK_URL_VAR: &str = "OUTBOX_LAB_SINK_URL";

/// `--sink`: a URL the relay can deliver to ([`sink::check_url`]), refused before it starts.
fn parse_sink(url: &str) -> Result<String, String> {
    sink::check_url(url).map(|()| url.to_string())
}
