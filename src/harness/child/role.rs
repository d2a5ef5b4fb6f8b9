//! The contract between a run and its child processes: one Rust type per role, used on both
//! sides. The parent fills a [`ChildSpec`] and hands it to the child as JSON in its environment
//! ([`SPEC_ENV`]: private to the user, unlike a command line, so URLs with passwords stay
//! private too); the child reads the same type back and runs the role. A renamed field is a
//! compile error on both sides at once.

use std::time::Duration;

use clap::Args;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::harness::db::Database;
use crate::outbox::consumer::{ConsumerKind, Faults};
use crate::outbox::crash::CrashPlan;
use crate::outbox::relay::{RelayConfig, RelayOptions};
use crate::outbox::sink::SinkOptions;
use crate::outbox::writer::{DualWriteOrder, Ending};

/// The environment variable that carries a child's [`ChildSpec`].
pub const SPEC_ENV: &str = "OUTBOX_LAB_CHILD_SPEC";

/// `outbox-lab child ROLE`: the role's name is on the command line for `ps` to show; what the
/// child does comes from [`SPEC_ENV`].
#[derive(Debug, Args)]
pub struct ChildArgs {
    /// The role's name, as `ps` shows it (the role itself comes from the environment).
    pub role: String,
}

/// Everything a child is told.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChildSpec {
    /// The database it works in.
    pub database: Database,
    /// Where it dies, if it is to die.
    pub crash_at: Option<CrashPlan>,
    /// Where it stops itself (SIGSTOP) for a pause nemesis, if anywhere.
    #[serde(default)]
    pub pause_at: Option<CrashPlan>,
    /// Where several processes are armed with its crash (or its pause), the file the first to
    /// reach it creates: only that one dies (stops).
    #[serde(default)]
    pub crash_claim: Option<std::path::PathBuf>,
    #[serde(default)]
    pub pause_claim: Option<std::path::PathBuf>,
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
    JetStreamWorker(JetStreamWorkerRole) = "jetstream-worker",
    AmqpWorker(AmqpWorkerRole) = "amqp-worker",
    KafkaWorker(KafkaWorkerRole) = "kafka-worker",
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
    /// Print when each COMMIT returned ([`crate::outbox::phases`]).
    pub report_commits: bool,
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
            report_commits: false,
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
    /// Confirms the stream's position while the outbox is quiet (see the CDC relay).
    pub heartbeat: bool,
}

/// A consumer-group worker on a Redis Stream: its pending entries, then new ones.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StreamWorkerRole {
    pub redis_url: String,
    pub stream: String,
    pub worker: String,
    pub kind: ConsumerKind,
    /// Entries read at a time.
    pub count: usize,
    /// Keep reading new entries until killed, instead of stopping after one read of each kind.
    pub follow: bool,
}

/// A durable pull consumer on a JetStream stream: applies and acks what the stream holds for it,
/// then prints `applied N`; or, following, new messages until killed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JetStreamWorkerRole {
    /// With its token, if any: children get it in their environment, never on a command line.
    pub nats_url: String,
    pub stream: String,
    /// The durable consumer's name.
    pub durable: String,
    pub kind: ConsumerKind,
    /// Messages fetched at a time.
    pub batch: usize,
    /// Keep fetching new messages until killed, instead of stopping when the stream runs dry.
    pub follow: bool,
}

/// A RabbitMQ queue's consumer with manual acks, following the queue until killed (prints
/// `listening URL` once connected).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AmqpWorkerRole {
    /// With its credentials: children get it in their environment, never on a command line.
    pub amqp_url: String,
    pub queue: String,
    pub kind: ConsumerKind,
    /// Messages taken, applied and acked at a time.
    pub batch: usize,
}

/// A Kafka topic's consumer, its offsets kept in its database: drains the topic once, or
/// follows it until killed (then prints `listening URL` once connected).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KafkaWorkerRole {
    /// With its credentials: children get it in their environment, never on a command line.
    pub kafka_url: String,
    pub topic: String,
    pub kind: ConsumerKind,
    /// Records read and applied at a time, per partition.
    pub batch: usize,
    /// Keep reading new records until killed, instead of stopping when the topic runs dry.
    pub follow: bool,
}

/// The HTTP consumer; prints `listening URL` and serves until killed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ConsumerRole {
    pub kind: ConsumerKind,
    /// Listen here (0: any free port); a restarted consumer takes its predecessor's port.
    pub port: u16,
    pub faults: Faults,
}

/// explore's writer: the workload's orders (customers 1..=orders, each order with its
/// events), skipping those already committed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExploreWriterRole {
    pub orders: u32,
    pub events_per_order: u32,
    /// How long the first order of each pair stays uncommitted after the second commits.
    pub overlap: Duration,
    /// Each pair takes at least this long: the workload spread over a window (verify's
    /// nemeses strike while events are still being written).
    pub pace: Duration,
    /// Be the naive app instead: write the order and POST its event (one per order) itself,
    /// in this order, to this sink.
    pub dual_write: Option<(DualWriteOrder, String)>,
    /// Insert each event with this statement of the user's instead (`--insert-sql`).
    pub insert_sql: Option<String>,
}

/// explore's relay: until its outbox is drained and stdin is closed ("the writer is done").
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExploreRelayRole {
    /// The stored watermark relay (broken on purpose), instead of the table relay in the design
    /// `relay.config` says.
    pub stored_watermark: bool,
    pub relay: RelayOptions,
}
