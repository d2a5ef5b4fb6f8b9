//! The contract between a run and its child processes: one Rust type per role, used on both
//! sides. The parent fills a [`ChildSpec`] and hands it to the child as JSON in its environment
//! ([`SPEC_ENV`]: private to the user, unlike a command line, so URLs with passwords stay
//! private too); the child reads the same type back and runs the role. A renamed field is a
//! compile error on both sides at once.

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::explore::actors::{self, ExploreRelayRole, ExploreWriterRole};
use crate::harness::db::Database;
use crate::harness::redis_server;
use crate::ops::logging::{self, LogFormat};
use crate::outbox::consumer::{self, ConsumerKind, Faults};
use crate::outbox::crash::{self, CrashPlan};
use crate::outbox::relay::cdc::{CdcConfig, CdcRelay};
use crate::outbox::relay::{drive, RelayConfig, RelayOptions, RELAY_APPLICATION_NAME};
use crate::outbox::sink::{HttpSink, SinkOptions};
use crate::outbox::stream_consumer::StreamWorker;
use crate::outbox::writer::{self, DualWriteOrder, Ending};

/// The environment variable that carries a child's [`ChildSpec`].
pub const SPEC_ENV: &str = "OUTBOX_LAB_CHILD_SPEC";

/// `outbox-lab child ROLE`: the role's name is on the command line for `ps` to show; what the
/// child does comes from [`SPEC_ENV`].
#[derive(Debug, Args)]
pub struct ChildArgs {
    /// The role's name, as `ps` shows it (the role itself comes from the environment).
    role: String,
}

/// Everything a child is told.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChildSpec {
    /// The database it works in.
    pub database: Database,
    /// Where it dies, if it is to die.
    pub crash_at: Option<CrashPlan>,
    pub role: Role,
}

/// Declares [`Role`] (what a child process is), the name `ps` shows for each, and the
/// conversion from each role's type.
macro_rules! roles {
    ($($variant:ident($role:ty) = $name:literal),* $(,)?) => {
        /// What a child process is.
        #[derive(Debug, Clone, Serialize, Deserialize)]
        #[serde(rename_all = "kebab-case")]
        pub enum Role {
            $($variant($role),)*
        }

        impl Role {
            /// The name `ps` shows.
            pub fn name(&self) -> &'static str {
                match self {
                    $(Role::$variant(_) => $name,)*
                }
            }
        }

        $(impl From<$role> for Role {
            fn from(role: $role) -> Role {
                Role::$variant(role)
            }
        })*
    };
}

roles!(
    Writer(WriterRole) = "writer",
    NaiveApp(NaiveAppRole) = "naive-app",
    Relay(RelayOptions) = "relay",
    CdcRelay(CdcRelayRole) = "cdc-relay",
    StreamWorker(StreamWorkerRole) = "stream-worker",
    Consumer(ConsumerRole) = "consumer",
    ExploreWriter(ExploreWriterRole) = "explore-writer",
    ExploreRelay(ExploreRelayRole) = "explore-relay",
);

/// Creates orders, each with its outbox rows in the same transaction.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WriterRole {
    pub orders: u32,
    pub events_per_order: u32,
    pub ending: Ending,
    /// Pace the orders this far apart on average, each shifted by up to ±half of it.
    pub interval: Option<Duration>,
    /// Chooses the shifts; the same seed gives the same schedule.
    pub seed: u64,
    /// Instead of `orders`: write as fast as possible for this long.
    pub duration: Option<Duration>,
    /// Delete the outbox rows again in the same transaction (the Debezium-style outbox).
    pub delete_outbox: bool,
}

impl WriterRole {
    pub fn new(orders: u32, events_per_order: u32, ending: Ending) -> WriterRole {
        WriterRole {
            orders,
            events_per_order,
            ending,
            interval: None,
            seed: 1,
            duration: None,
            delete_outbox: false,
        }
    }
}

/// The naive app: INSERT the order and POST the event itself.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NaiveAppRole {
    pub sink: String,
    pub customer_id: i64,
    pub event_id: Uuid,
    pub order: DualWriteOrder,
    pub ending: Ending,
}

/// The log-tailing relay: streams the outbox's INSERTs from a replication slot until killed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CdcRelayRole {
    pub name: String,
    pub sink: SinkOptions,
    /// Its retries (`max_attempts`, `backoff_base`) and request timeout.
    pub config: RelayConfig,
    pub slot: String,
}

/// A consumer-group worker on a Redis Stream: its pending entries, then new ones.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StreamWorkerRole {
    pub redis_url: String,
    pub stream: String,
    pub worker: String,
    pub kind: ConsumerKind,
    pub count: usize,
}

/// The HTTP consumer; prints `listening URL` and serves until killed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ConsumerRole {
    pub kind: ConsumerKind,
    /// Listen here (0: any free port); a restarted consumer takes its predecessor's port.
    pub port: u16,
    pub faults: Faults,
}

/// The child's side: reads its spec, arms its crash plan, and runs its role.
pub async fn run_role(args: ChildArgs) -> Result<()> {
    // A child must not outlive the run that started it.
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)?;
    logging::init(LogFormat::Text);
    let spec = std::env::var(SPEC_ENV).with_context(|| {
        format!(
            "child {}: no {SPEC_ENV} (children are started by outbox-lab)",
            args.role
        )
    })?;
    let spec: ChildSpec = serde_json::from_str(&spec)
        .with_context(|| format!("child {}: unreadable {SPEC_ENV}", args.role))?;
    if let Some(plan) = spec.crash_at {
        crash::arm(plan);
    }
    let db = spec.database;
    match spec.role {
        Role::Writer(role) => write_orders(&db, role).await,
        Role::NaiveApp(role) => {
            let mut client = db.connect().await?;
            let sink = HttpSink::new(&role.sink)?;
            let NaiveAppRole {
                customer_id,
                event_id,
                order,
                ending,
                ..
            } = role;
            writer::dual_write(&mut client, &sink, customer_id, event_id, order, ending).await?;
            Ok(())
        }
        Role::Relay(options) => {
            let mut relay = options.connect(&db.config()?).await?;
            drive(&mut relay, options.until(), std::future::pending())
                .await?
                .or_gave_up(&options.name)
                .map(drop)
        }
        Role::CdcRelay(role) => {
            let config = CdcConfig {
                slot: role.slot,
                backoff_base: role.config.backoff_base,
                max_attempts: role.config.max_attempts as u32,
            };
            let mut connection = db.config()?;
            connection.application_name(format!("{RELAY_APPLICATION_NAME} {}", role.name));
            let sink = role.sink.connect(role.config.request_timeout).await?;
            CdcRelay::connect(&connection, sink, config, Some(role.name))
                .await?
                .follow()
                .await
        }
        Role::StreamWorker(role) => {
            let mut worker = StreamWorker {
                redis: redis_server::connect(&role.redis_url).await?,
                db: consumer::pool(db.config()?, 1)?.get().await?,
                stream: role.stream,
                name: role.worker,
                kind: role.kind,
            };
            let applied = worker.work(role.count).await?;
            println!("applied {applied}");
            Ok(())
        }
        Role::Consumer(role) => {
            let listener = tokio::net::TcpListener::bind(("127.0.0.1", role.port)).await?;
            // Serves until the parent kills it.
            let until_killed = std::future::pending();
            consumer::serve(
                listener,
                db.config()?,
                role.kind,
                role.faults,
                announce_listening,
                until_killed,
            )
            .await
        }
        Role::ExploreWriter(role) => actors::run_writer(&db, role).await,
        Role::ExploreRelay(role) => actors::run_relay(&db, role).await,
    }
}

/// The writer role: `orders` orders (or as many as fit in `duration`), paced if asked.
async fn write_orders(db: &Database, role: WriterRole) -> Result<()> {
    let mut client = db.connect().await?;
    let started = Instant::now();
    let until = role.duration.map(|d| started + d);
    for customer_id in 1.. {
        let done = match until {
            Some(until) => Instant::now() >= until,
            None => customer_id > i64::from(role.orders),
        };
        if done {
            break;
        }
        if let Some(interval) = role.interval {
            let at = writer::paced_offset(
                customer_id as u64 - 1,
                interval.as_millis() as u64,
                role.seed,
            );
            tokio::time::sleep_until((started + at).into()).await;
        }
        writer::create_order_with_events(
            &mut client,
            customer_id,
            role.events_per_order,
            role.ending,
            role.delete_outbox,
        )
        .await?;
    }
    Ok(())
}

/// A consumer child prints `listening URL` once it serves; the parent reads that line.
fn announce_listening(addr: std::net::SocketAddr) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "listening http://{addr}");
    let _ = out.flush();
}
