//! `outbox-lab consumer`: the HTTP consumer against your own database until SIGTERM or Ctrl-C.

use std::process::ExitCode;

use anyhow::Result;
use clap::Args;

use crate::error::exit;
use crate::harness::run::interrupted;
use crate::ops::logging::{self, LogFormat};
use crate::ops::standalone;
use crate::outbox::consumer::ConsumerKind;

#[derive(Debug, Args)]
pub struct ConsumerArgs {
    /// Where to serve POST /events (port 0: any free port, printed at start).
    #[arg(long)]
    listen: std::net::SocketAddr,
    /// The database with the consumer's tables (schema consumer).
    #[arg(long, env = "OUTBOX_LAB_DATABASE_URL")]
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
    standalone::run_consumer(
        &args.database_url,
        args.listen,
        kind,
        args.create_schema,
        shutdown,
    )
    .await?;
    Ok(ExitCode::from(exit::OK))
}
