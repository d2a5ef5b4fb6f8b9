//! clock-skew's designs: two lease designs that differ only in whose clock sets the lease, two
//! retrying relays that differ only in whose clock sets a retry's due time; each on a database
//! of its own, its relays (processes of outbox-lab's, relay 0 on the round's clock) following
//! the outbox into a naive consumer started afresh for each step, and the events each is given.

use std::time::Duration;

use anyhow::{bail, Result};
use serde_json::json;
use tokio_postgres::Client;

use super::Params;
use crate::harness::child::{ConsumerProcess, RunningChild};
use crate::harness::clock::FakeClock;
use crate::harness::db::{Database, PgServer};
use crate::judge::counts;
use crate::outbox::consumer::{ConsumerKind, Faults};
use crate::outbox::relay::{LeaseClock, RelayConfig, RelayDesign, Wakeup};
use crate::outbox::schema;
use crate::outbox::writer::{event_type, INSERT_OUTBOX};
use crate::scenarios::Ctx;
use crate::wait;

/// Whose clock sets what.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Design {
    /// A claim whose lease (`claimed_at`, and the claim's "expired") is the relay's clock.
    AppClockLease,
    /// outbox-lab's claim: the lease is the server's clock.
    DbClockLease,
    /// The article's relay, its retry due times written from the relay's clock and compared
    /// with the server's (as txoutbox's `retry_at`).
    AppClockRetry,
    /// The article's relay: due times written and compared on the server's clock.
    DbClockRetry,
}

impl Design {
    pub const ALL: [Design; 4] = [
        Design::AppClockLease,
        Design::DbClockLease,
        Design::AppClockRetry,
        Design::DbClockRetry,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Design::AppClockLease => "app_clock_lease",
            Design::DbClockLease => "db_clock_lease",
            Design::AppClockRetry => "app_clock_retry",
            Design::DbClockRetry => "db_clock_retry",
        }
    }

    fn lease_clock(self) -> LeaseClock {
        match self {
            Design::AppClockLease | Design::AppClockRetry => LeaseClock::Relay,
            Design::DbClockLease | Design::DbClockRetry => LeaseClock::Database,
        }
    }

    /// The lease designs: three relays drain a backlog (a lease is only taken from another
    /// relay); the retrying ones: one relay, a poison event and one that fails once.
    pub fn leases(self) -> bool {
        matches!(self, Design::AppClockLease | Design::DbClockLease)
    }

    /// Its relays: three for a lease, one for a retry schedule (a second relay, on the true
    /// clock, would write the due times of the rows it happened to fetch). A lease taken after
    /// the server's step needs a relay still sending when another claims again: with two, the
    /// other may be between its mark and its next claim; with three, both others must be.
    pub fn relays(self) -> u32 {
        match self.leases() {
            true => 3,
            false => 1,
        }
    }

    fn config(self, params: &Params) -> RelayConfig {
        let lease_clock = self.lease_clock();
        let defaults = RelayConfig::default();
        match self.leases() {
            true => RelayConfig {
                design: RelayDesign::Claim,
                lease: Duration::from_millis(params.lease_ms),
                lease_clock,
                batch: params.batch,
                ..defaults
            },
            false => RelayConfig {
                design: RelayDesign::Lock,
                lease_clock,
                backoff_base: Duration::from_millis(params.backoff_base_ms),
                max_attempts: params.max_attempts,
                ..defaults
            },
        }
    }

    /// The lease designs' consumer takes `send_ms` over each event (a lease is live while its
    /// batch is sent); the retrying ones' fails the poison event every time and the retried
    /// one once.
    fn consumer_faults(self, params: &Params) -> Faults {
        match self.leases() {
            true => Faults {
                delay: Duration::from_millis(params.send_ms),
                ..Faults::default()
            },
            false => Faults {
                fail_every_delivery_of: Some(POISON.id),
                fail_first_delivery_of: Some(RETRIED.id),
                ..Faults::default()
            },
        }
    }
}

/// An event the retrying designs are given after the step: its outbox id (the outbox's ids
/// start at 1 each step) and its aggregate.
pub struct Retried {
    pub id: i64,
    pub aggregate: &'static str,
}

/// Every delivery fails: it is retried until its attempts run out (a dead letter).
pub const POISON: Retried = Retried {
    id: 1,
    aggregate: "poison",
};
/// Its first delivery fails: it is delivered on its first retry, when that is due.
pub const RETRIED: Retried = Retried {
    id: 2,
    aggregate: "retried",
};

/// Whether $1 relays each hold a lease on a row not marked yet.
const EVERY_RELAY_SENDING: &str = "
SELECT count(DISTINCT claimed_by) >= $1 FROM outbox
 WHERE published_at IS NULL AND claimed_by IS NOT NULL";
/// How long after the step a lease design's relays have to deliver every event once.
pub const DRAIN_LIMIT: Duration = Duration::from_secs(20);
const DRAIN_POLL: Duration = Duration::from_millis(20);
/// Bounds the wait for every lease relay to be sending.
const SENDING_LIMIT: Duration = Duration::from_secs(20);
const SENDING_POLL: Duration = Duration::from_millis(2);

/// A design's database, for the whole scenario.
pub struct Bench {
    pub design: Design,
    pub db: Database,
    /// The scenario's own session on it, to write and count.
    pub client: Client,
}

impl Bench {
    pub async fn new(ctx: &Ctx<'_>, server: &PgServer, design: Design) -> Result<Bench> {
        let db = ctx.database_on(server, design.name()).await?;
        let client = db.connect().await?;
        if design.leases() {
            client.batch_execute(schema::ADD_CLAIM_COLUMNS).await?;
        }
        Ok(Bench { design, db, client })
    }

    /// Empties the outbox and the consumer's tables, ids from 1 again; starts its consumer
    /// afresh (its faults count from now) and, for a lease design, writes the backlog.
    pub async fn prepare(&self, ctx: &Ctx<'_>, params: &Params) -> Result<ConsumerProcess> {
        self.client.batch_execute(schema::RESET).await?;
        let faults = self.design.consumer_faults(params);
        let consumer = ctx
            .start_consumer(&self.db, ConsumerKind::Naive, &faults)
            .await?;
        if self.design.leases() {
            let payload = json!({ "clock-skew": "backlog" });
            for order in 1..=params.backlog {
                let aggregate = order.to_string();
                self.client
                    .execute(INSERT_OUTBOX, &[&aggregate, &event_type(1), &payload])
                    .await?;
            }
        }
        Ok(consumer)
    }

    /// Relay `index` of the design, following the outbox into `consumer`; relay 0 on `clock`.
    pub fn spawn_relay(
        &self,
        ctx: &Ctx<'_>,
        consumer: &ConsumerProcess,
        index: u32,
        clock: &FakeClock,
        params: &Params,
    ) -> Result<RunningChild> {
        let name = format!("{}-{index}", self.design.name());
        let config = self.design.config(params);
        let env = match index {
            0 => clock.env(),
            _ => Vec::new(),
        };
        let poll = Duration::from_millis(params.poll_ms);
        ctx.relay(&self.db, &consumer.url, &name, &config)
            .with(|relay| relay.follow = Some(Wakeup::Poll(poll)))
            .env(env)
            .spawn()
    }

    /// Waits until each of a lease design's relays holds a lease on a row it has not marked
    /// yet (it is sending): the clock steps then. A relay started late on a busy machine would
    /// otherwise claim for the first time after the step, on the new time.
    pub async fn wait_every_relay_sending(&self) -> Result<()> {
        if !self.design.leases() {
            return Ok(());
        }
        let what = format!("every {} relay to hold a lease", self.design.name());
        let relays = i64::from(self.design.relays());
        wait::until(what, SENDING_LIMIT, SENDING_POLL, async || {
            let row = self
                .client
                .query_one(EVERY_RELAY_SENDING, &[&relays])
                .await?;
            Ok(row.get::<_, bool>(0))
        })
        .await
    }

    /// How long its relays run after the step: a retrying design's `watch_ms` (its schedule is
    /// judged within it); a lease design's until every event was received once, at most
    /// [`DRAIN_LIMIT`].
    pub async fn watch(&self, params: &Params) -> Result<()> {
        if !self.design.leases() {
            tokio::time::sleep(Duration::from_millis(params.watch_ms)).await;
            return Ok(());
        }
        wait::up_to(DRAIN_LIMIT, DRAIN_POLL, async || {
            let row = self.client.query_one(counts::ALL_RECEIVED, &[]).await?;
            Ok(row.get::<_, bool>(0))
        })
        .await?;
        Ok(())
    }

    /// The retrying designs' events, written after the step: the poison one, then the one
    /// retried once (their ids are the consumer's faults').
    pub async fn write_retried(&self) -> Result<()> {
        if self.design.leases() {
            return Ok(());
        }
        let payload = json!({ "clock-skew": "retried" });
        for event in [POISON, RETRIED] {
            let row = self
                .client
                .query_one(INSERT_OUTBOX, &[&event.aggregate, &event_type(1), &payload])
                .await?;
            let id: i64 = row.get("id");
            if id != event.id {
                bail!(
                    "the {} event took outbox id {id}, not {}",
                    event.aggregate,
                    event.id
                );
            }
        }
        Ok(())
    }
}
