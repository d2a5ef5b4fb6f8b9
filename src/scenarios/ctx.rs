//! What a scenario gets to work with: its databases, its child processes (writer, relays,
//! consumers), Redis, progress, and the article's figures from its scenario file.

use anyhow::Result;

use super::{Scenario, CHILD_TIMEOUT};
use crate::harness::child::{ChildCommand, ChildRun, ConsumerProcess};
use crate::harness::db::{Database, PgServer};
use crate::harness::redis_server::Redis;
use crate::outbox::consumer::{ConsumerKind, Faults};
use crate::outbox::crash::CrashPlan;
use crate::outbox::relay::RelayConfig;
use crate::outbox::schema;
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
    pub(super) redis: &'a Redis,
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
        let label = format!("{}_{part}", self.scenario.name());
        let db = self.server.create_database(&label).await?;
        schema::create(&db.connect().await?).await?;
        Ok(db)
    }

    pub async fn start_consumer(
        &self,
        db: &Database,
        kind: ConsumerKind,
        faults: &Faults,
    ) -> Result<ConsumerProcess> {
        let mut cmd = ChildCommand::new("consumer", db)
            .arg("kind", kind.name())
            .arg("fail-next", faults.fail_next)
            .arg("delay-ms", faults.delay.as_millis());
        if let Some(id) = faults.fail_first_delivery_of {
            cmd = cmd.arg("fail-first-delivery-of", id);
        }
        cmd.spawn_consumer().await
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

    /// The command line of a writer child; add pacing options as needed.
    pub fn writer(
        &self,
        db: &Database,
        orders: u32,
        events_per_order: u32,
        ending: Ending,
    ) -> ChildCommand {
        ChildCommand::new("writer", db)
            .arg("orders", orders)
            .arg("events-per-order", events_per_order)
            .arg_enum("ending", ending)
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

    /// The command line of a relay child; add `--follow`, `--in-flight` as needed.
    pub fn relay(
        &self,
        db: &Database,
        sink: &str,
        name: &str,
        config: &RelayConfig,
    ) -> ChildCommand {
        let mut cmd = self
            .relay_child("relay", db, sink, name, config)
            .arg_enum("design", config.design)
            .arg("lease-ms", config.lease.as_millis())
            .arg("batch", config.batch)
            .arg("deadline-ms", config.deadline.as_millis());
        if let Some(partition) = config.partition {
            cmd = cmd.arg("partition", partition);
        }
        if config.head_of_line_guard {
            cmd = cmd.flag("guard");
        }
        cmd
    }

    /// The command line of a log-tailing relay child following `slot` until stopped.
    pub fn cdc_relay(
        &self,
        db: &Database,
        sink: &str,
        name: &str,
        slot: &str,
        config: &RelayConfig,
    ) -> ChildCommand {
        self.relay_child("cdc-relay", db, sink, name, config)
            .arg("slot", slot)
    }

    /// What every relay child is told: where to deliver, its name, its retries.
    fn relay_child(
        &self,
        role: &str,
        db: &Database,
        sink: &str,
        name: &str,
        config: &RelayConfig,
    ) -> ChildCommand {
        ChildCommand::new(role, db)
            .arg("sink", sink)
            .arg("name", name)
            .arg("max-attempts", config.max_attempts)
            .arg("backoff-ms", config.backoff_base.as_millis())
            .arg("request-timeout-ms", config.request_timeout.as_millis())
            .arg("stream-prefix", self.redis.key_prefix())
    }

    /// The run's Redis URL (a private server is started on first use).
    pub async fn redis_url(&self) -> Result<String> {
        self.redis.url().await
    }

    pub fn redis_key_prefix(&self) -> &str {
        self.redis.key_prefix()
    }
}
