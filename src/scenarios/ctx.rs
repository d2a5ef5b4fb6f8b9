//! What a scenario gets to work with: its databases, its child processes (writer, relays,
//! consumers), Redis, NATS, RabbitMQ, Kafka, progress, and the article's figures from its scenario file.

use anyhow::Result;

use super::{Scenario, CHILD_TIMEOUT};
use crate::harness::brokers::Brokers;
use crate::harness::child::role::{CdcRelayRole, ConsumerRole, WriterRole};
use crate::harness::child::{ChildCommand, ChildRun, ConsumerProcess};
use crate::harness::db::{Database, PgServer};
use crate::harness::kafka_server::Kafka;
use crate::harness::nats_server::NatsCluster;
use crate::harness::rabbitmq_server::Amqp;
use crate::outbox::consumer::{ConsumerKind, Faults};
use crate::outbox::crash::CrashPlan;
use crate::outbox::relay::{RelayConfig, RelayOptions};
use crate::outbox::schema;
use crate::outbox::sink::{self, SinkOptions};
use crate::outbox::writer::Ending;
use crate::report::progress::Progress;
use crate::report::{Metrics, Table};
use crate::scenarios::spec::Spec;

/// What a scenario measured.
#[derive(Default)]
pub struct Outcome {
    pub metrics: Metrics,
    pub tables: Vec<Table>,
    pub notes: Vec<String>,
}

/// What a scenario gets to work with.
pub struct Ctx<'a> {
    pub(super) server: &'a PgServer,
    pub(super) brokers: &'a Brokers,
    pub(super) scenario: Scenario,
    pub(super) spec: &'a Spec,
    pub(super) progress: &'a Progress,
}

impl Ctx<'_> {
    /// Where the scenario's long steps show their progress (hidden unless a person watches).
    pub fn progress(&self) -> &Progress {
        self.progress
    }

    /// The article's figure for `metric`, from the scenario file's checks ("" where it has none),
    /// for tables that put the article beside the measurement.
    pub fn article(&self, metric: &str) -> String {
        self.spec
            .checks
            .iter()
            .filter(|check| check.metric == metric)
            .find_map(|check| check.article_text())
            .unwrap_or_default()
    }

    /// A fresh database with the article's schema, named after the scenario and `part`.
    pub async fn database(&self, part: &str) -> Result<Database> {
        self.database_on(self.server, part).await
    }

    /// [`Ctx::database`] on `server`, a server of the scenario's own.
    pub async fn database_on(&self, server: &PgServer, part: &str) -> Result<Database> {
        let label = format!("{}_{part}", self.scenario.name());
        let db = server.create_database(&label).await?;
        schema::create(&db.connect().await?).await?;
        Ok(db)
    }

    pub async fn start_consumer(
        &self,
        db: &Database,
        kind: ConsumerKind,
        faults: &Faults,
    ) -> Result<ConsumerProcess> {
        let role = ConsumerRole {
            kind,
            port: 0,
            faults: faults.clone(),
        };
        ChildCommand::new(db, role).spawn_consumer().await
    }

    /// A writer child creating `orders` orders with one outbox row each.
    pub async fn run_writer(
        &self,
        db: &Database,
        orders: u32,
        ending: Ending,
        crash: Option<CrashPlan>,
    ) -> Result<ChildRun> {
        self.writer(db, orders, 1, ending)
            .crash_at(crash)
            .run(CHILD_TIMEOUT)
            .await
    }

    /// A writer child; change its role (pacing...) as needed.
    pub fn writer(
        &self,
        db: &Database,
        orders: u32,
        events_per_order: u32,
        ending: Ending,
    ) -> ChildCommand<WriterRole> {
        ChildCommand::new(db, WriterRole::new(orders, events_per_order, ending))
    }

    /// A relay child draining the outbox into `sink` (the consumer's URL or Redis').
    pub async fn run_relay(
        &self,
        db: &Database,
        sink: &str,
        name: &str,
        config: &RelayConfig,
        crash: Option<CrashPlan>,
    ) -> Result<ChildRun> {
        self.relay(db, sink, name, config)
            .crash_at(crash)
            .run(CHILD_TIMEOUT)
            .await
    }

    /// A relay child started in the background, for scenarios that watch it while it runs.
    pub fn spawn_relay(
        &self,
        db: &Database,
        sink: &str,
        name: &str,
        config: &RelayConfig,
        crash: Option<CrashPlan>,
    ) -> tokio::task::JoinHandle<Result<ChildRun>> {
        tokio::spawn(
            self.relay(db, sink, name, config)
                .crash_at(crash)
                .run(CHILD_TIMEOUT),
        )
    }

    /// A relay child; change its role (`follow`, `sink.in_flight`) as needed.
    pub fn relay(
        &self,
        db: &Database,
        sink: &str,
        name: &str,
        config: &RelayConfig,
    ) -> ChildCommand<RelayOptions> {
        let role = RelayOptions {
            name: name.to_string(),
            sink: self.sink(sink),
            config: config.clone(),
            follow: None,
        };
        ChildCommand::new(db, role)
    }

    /// A log-tailing relay child following `slot` until stopped.
    pub fn cdc_relay(
        &self,
        db: &Database,
        sink: &str,
        name: &str,
        slot: &str,
        config: &RelayConfig,
    ) -> ChildCommand<CdcRelayRole> {
        let role = CdcRelayRole {
            name: name.to_string(),
            sink: self.sink(sink),
            config: config.clone(),
            slot: slot.to_string(),
            heartbeat: true,
        };
        ChildCommand::new(db, role)
    }

    /// Where a relay child delivers: one event after another, streams (or subjects) named for
    /// this run.
    fn sink(&self, url: &str) -> SinkOptions {
        let brokers = self.brokers;
        let prefix = if sink::is_nats(url) {
            brokers.nats.subject_prefix()
        } else if sink::is_amqp(url) {
            brokers.amqp.name_prefix()
        } else if sink::is_kafka(url) {
            brokers.kafka.name_prefix()
        } else {
            brokers.redis.key_prefix()
        };
        SinkOptions {
            stream_prefix: prefix.to_string(),
            ..SinkOptions::new(url)
        }
    }

    /// The run's Redis URL (a private server is started on first use).
    pub async fn redis_url(&self) -> Result<String> {
        self.brokers.redis.url().await
    }

    pub fn redis_key_prefix(&self) -> &str {
        self.brokers.redis.key_prefix()
    }

    /// The run's NATS URL, with its credentials (a private server is started on first use).
    pub async fn nats_url(&self) -> Result<String> {
        self.brokers.nats.url().await
    }

    /// A private 3-node NATS cluster, started now (whatever `--nats-url` says: its nodes are
    /// killed), stopped when dropped.
    pub async fn nats_cluster(&self) -> Result<NatsCluster> {
        self.brokers.nats.cluster().await
    }

    /// What this run's JetStream stream and consumer names start with.
    pub fn nats_name_prefix(&self) -> &str {
        self.brokers.nats.name_prefix()
    }

    /// What this run's NATS subjects start with.
    pub fn nats_subject_prefix(&self) -> &str {
        self.brokers.nats.subject_prefix()
    }

    /// The run's RabbitMQ: its URL with credentials (a private broker is started on first use),
    /// its queues, and the private broker's crash.
    pub fn amqp(&self) -> &Amqp {
        &self.brokers.amqp
    }

    /// The run's Kafka: its URL with credentials (a private broker is started on first use),
    /// its topics.
    pub fn kafka(&self) -> &Kafka {
        &self.brokers.kafka
    }
}
