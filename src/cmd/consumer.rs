//! `outbox-lab consumer`: the HTTP consumer, or a JetStream or RabbitMQ one, against your own
//! database until SIGTERM or Ctrl-C.

use std::process::ExitCode;

use anyhow::Result;
use clap::Args;

use crate::error::exit;
use crate::harness::run::interrupted;
use crate::ops::logging::{self, LogFormat};
use crate::ops::standalone::{self, ConsumerSource};
use crate::outbox::consumer::ConsumerKind;
use crate::outbox::sink;

#[derive(Debug, Args)]
pub struct ConsumerArgs {
    /// Where to serve POST /events (port 0: any free port, printed at start).
    #[arg(long, required_unless_present = "from", conflicts_with = "from")]
    listen: Option<std::net::SocketAddr>,
    /// Take the events from a broker instead: nats://[TOKEN@]HOST:PORT (JetStream: follows the
    /// durable consumer `shipping` on --stream) or amqp://USER:PASSWORD@HOST:PORT/%2f (RabbitMQ:
    /// takes from --queue), acking each event once applied. Or leave it out and set
    /// OUTBOX_LAB_BROKER_URL, where no other local user can read the credentials.
    #[arg(long, value_name = "URL", env = "OUTBOX_LAB_BROKER_URL", hide_env_values = true,
          value_parser = parse_broker)]
    from: Option<String>,
    /// The JetStream stream to follow (created if missing, capturing outbox.event.>).
    #[arg(long, default_value = "outbox", requires = "from")]
    stream: String,
    /// The RabbitMQ queue to take from (declared durable if missing).
    #[arg(long, default_value = "outbox.event.orders", requires = "from")]
    queue: String,
    /// The database with the consumer's tables (schema consumer).
    #[arg(long, env = "OUTBOX_LAB_DATABASE_URL", hide_env_values = true)]
    database_url: String,
    /// Ship each event once, however often it arrives (dedup by event_id).
    #[arg(long)]
    idempotent: bool,
    /// Create the consumer's tables if they are missing.
    #[arg(long)]
    create_schema: bool,
    #[arg(long, value_enum, default_value = "text")]
    log_format: LogFormat,
}

pub async fn run(args: ConsumerArgs) -> Result<ExitCode> {
    logging::init(args.log_format);
    let kind = if args.idempotent {
        ConsumerKind::Idempotent
    } else {
        ConsumerKind::Naive
    };
    let shutdown = async {
        interrupted().await;
    };
    let source = match (args.listen, args.from) {
        (Some(listen), _) => ConsumerSource::Http(listen),
        (None, Some(url)) if sink::is_amqp(&url) => ConsumerSource::Amqp {
            url,
            queue: args.queue,
        },
        (None, Some(url)) => ConsumerSource::Nats {
            url,
            stream: args.stream,
        },
        (None, None) => unreachable!("clap requires --listen or --from"),
    };
    standalone::run_consumer(
        &args.database_url,
        source,
        kind,
        args.create_schema,
        shutdown,
    )
    .await?;
    Ok(ExitCode::from(exit::OK))
}

/// A NATS or AMQP URL outbox-lab can use: the relay's sink check, for the other end.
fn parse_broker(url: &str) -> Result<String, String> {
    if !sink::is_nats(url) && !sink::is_amqp(url) {
        return Err("give nats://[TOKEN@]HOST:PORT or amqp://USER:PASSWORD@HOST:PORT/%2f".into());
    }
    sink::check_url(url).map(|()| url.to_string())
}
