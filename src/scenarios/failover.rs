//! failover (beyond the article: the database replicated, and its failover): the outbox lives on
//! a [primary with a streaming standby](crate::harness::replicated), the application and the
//! article's relay reach "the primary" through [database links](crate::harness::link::postgres)
//! (a virtual IP), and the consumer's side effects live on another server. While the
//! replication is held back, the application commits orders and the relay delivers their
//! events; then the primary's machine dies, the standby is promoted and the links re-pointed at
//! it; the relay reconnects with the same URL and goes on.
//!
//! - `async`: the primary answered COMMITs the standby never received. Those orders are gone
//!   (`acknowledged_lost`: the database's loss, not the relay's), and the relay had already
//!   shipped them: ghosts, shipments of orders that no longer exist.
//! - `sync`: COMMIT waits for the standby, so nothing the application was told is lost and the
//!   relay never sees an order the standby lacks; the price is each COMMIT's wait
//!   (`commit_p50_ms`, beside async's).
//! - `sync_cancelled`: synchronous, but each COMMIT's wait for the standby is cancelled. The
//!   order committed locally is then answered and visible: the relay ships it, the failover
//!   loses it, a ghost even under synchronous replication (PostgreSQL's documented hole).
//! - `fenced`: asynchronous, and the relay sends only what the standby has flushed
//!   (`fence_standby`): the acknowledged orders are lost all the same, but none was shipped.
//! - `cdc`: asynchronous, and the log-tailing relay (a logical slot). The slot is not on the
//!   promoted standby (PostgreSQL 15): the relay cannot resume, and every event committed
//!   after the failover is never delivered (`lost`).
//! - `cdc_failover_slot`: the same on PostgreSQL 17 or later with a failover slot: the
//!   standby's copy takes over, the relay resumes, nothing is lost, and the primary never sent
//!   it what the standby lacked: no ghost either.
//!
//! The orders as the promoted standby has them are brought beside the consumer's shipments
//! ([`two_databases`]) and judged there by the one definition of a ghost.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde::Deserialize;
use tokio_postgres::Client;
use uuid::Uuid;

use super::{metric_names, Ctx, Experiment, Outcome, CHILD_TIMEOUT};
use crate::connect;
use crate::harness::cluster::PgBinaries;
use crate::harness::db::Database;
use crate::harness::link::postgres::PgProxy;
use crate::harness::replicated::{Replicated, Replication};
use crate::judge::invariants::GHOSTS;
use crate::judge::{counts, two_databases};
use crate::outbox::consumer::{ConsumerKind, Faults};
use crate::outbox::relay::{cdc, RelayConfig, Wakeup};
use crate::outbox::schema;
use crate::outbox::writer::{self, INSERT_ORDER, INSERT_OUTBOX};
use crate::report::Table;
use crate::stats;
use crate::wait;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// Orders committed, delivered and replicated before the replication is held.
    pub orders_before: u32,
    /// Orders the application tries to commit while the replication is held.
    pub orders_held: u32,
    /// Orders committed on the promoted standby: the relay found it and goes on.
    pub orders_after: u32,
    /// How long the application keeps trying while the replication is held (a synchronous
    /// COMMIT waits all of it), before the primary dies.
    pub hold_ms: u64,
    /// PostgreSQL 17 or later, for the failover slot's case: its server bin directory (a
    /// relative one is taken from the checkout outbox-lab was built in). `scripts/setup`
    /// installs PostgreSQL 18 there.
    pub failover_slot_pg_bin: PathBuf,
}

impl Params {
    /// The server binaries of `case`'s pair.
    fn binaries(&self, ctx: &Ctx<'_>, case: Case) -> Result<PgBinaries> {
        if case != Case::CdcFailoverSlot {
            return ctx.server.binaries();
        }
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(&self.failover_slot_pg_bin);
        PgBinaries::find(Some(&dir)).map_err(|_| {
            anyhow!(
                "the failover scenario's failover slot needs PostgreSQL 17 or later, not found \
                 in {}: run scripts/setup (it installs PostgreSQL 18 there), or --set \
                 failover_slot_pg_bin='\"DIR\"'",
                dir.display()
            )
        })
    }
}

/// The outbox's database on the pair (the pair is the run's own: one name serves).
const DATABASE: &str = "outboxlab_failover";
/// The relay polls this often: it finds the held orders, and the promoted standby, quickly.
const RELAY_POLL: Duration = Duration::from_millis(20);
/// The log-tailing relay's slot, on the primary.
const SLOT: &str = "outboxlab_failover";
/// Bounds each wait for the relay to deliver.
const DELIVERY_LIMIT: Duration = Duration::from_secs(30);
/// PostgreSQL logs a sequence's value 32 ahead: orders within them get ids the promoted
/// standby never hands out again, so a lost order's id is not taken by a new one, and a ghost is
/// told by its order id.
const SEQUENCE_LOG_AHEAD: u32 = 32;

/// What each case reports, in the table's order.
const FIGURES: [&str; 6] = [
    "acknowledged",
    "acknowledged_lost",
    "shipments",
    "ghost_shipments",
    "events_never_delivered",
    "commit_p50_ms",
];

/// The cases, each on a pair of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Case {
    Async,
    Sync,
    /// Synchronous, and each COMMIT's wait for the standby cancelled, the application's and the
    /// relay's (`pg_cancel_backend`, as a timeout on every session would): PostgreSQL warns that the transaction
    /// "has already committed locally, but might not have been replicated", answers COMMIT,
    /// and the order is visible to the relay.
    SyncCancelled,
    /// Asynchronous, and the relay fenced (`fence_standby`): it sends a batch only once the
    /// standby has flushed the WAL of its rows' commits.
    Fenced,
    /// Asynchronous, and the log-tailing relay: its logical slot lives on the primary only
    /// (before PostgreSQL 17's failover slots), so after the promotion it has nothing to
    /// stream from.
    Cdc,
    /// The same on PostgreSQL 17 or later (`failover_slot_pg_bin`), its slot a failover slot:
    /// the standby holds a copy that takes over at the promotion, and the primary sends the
    /// slot's changes only once the standby has them (`synchronized_standby_slots`).
    CdcFailoverSlot,
}

const CASES: [Case; 6] = [
    Case::Async,
    Case::Sync,
    Case::SyncCancelled,
    Case::Fenced,
    Case::Cdc,
    Case::CdcFailoverSlot,
];

impl Case {
    fn name(self) -> &'static str {
        match self {
            Case::Async => "async",
            Case::Sync => "sync",
            Case::SyncCancelled => "sync_cancelled",
            Case::Fenced => "fenced",
            Case::Cdc => "cdc",
            Case::CdcFailoverSlot => "cdc_failover_slot",
        }
    }

    /// The log-tailing relay's cases.
    fn tails_the_log(self) -> bool {
        matches!(self, Case::Cdc | Case::CdcFailoverSlot)
    }

    /// What the relay sees of the held orders: all of them, but for a relay that waits for the
    /// standby (the fence, the failover slot's reader).
    fn ships_what_the_primary_has(self) -> bool {
        !matches!(self, Case::Fenced | Case::CdcFailoverSlot)
    }

    fn replication(self) -> Replication {
        match self {
            Case::Async | Case::Fenced | Case::Cdc | Case::CdcFailoverSlot => Replication::Async,
            Case::Sync | Case::SyncCancelled => Replication::Sync,
        }
    }
}

/// Cancels the waits of these backends (the actors') for the synchronous standby, and
/// nothing else: a backend running a statement would see it fail.
const CANCEL_SYNC_WAITS: &str = "
SELECT count(pg_cancel_backend(pid)) FROM pg_stat_activity
 WHERE pid = ANY($1) AND wait_event = 'SyncRep'";
/// The actors' COMMITs wait this long for the standby before their wait is cancelled.
const CANCEL_EVERY: Duration = Duration::from_millis(50);

/// Events the consumer has shipped (one shipment per event: the idempotent consumer).
const SHIPPED: &str = "SELECT count(*) FROM consumer.shipments";
/// The acknowledged events the database no longer has.
const ACKNOWLEDGED_LOST: &str = "
SELECT count(*) FROM unnest($1::uuid[]) AS acknowledged(event_id)
 WHERE NOT EXISTS (SELECT 1 FROM outbox o WHERE o.event_id = acknowledged.event_id)";
/// What the relay still owes on the promoted standby.
const UNPUBLISHED: &str = "SELECT count(*) FROM outbox WHERE published_at IS NULL";

impl Experiment for Params {
    fn metrics(&self) -> Vec<String> {
        metric_names(CASES.map(Case::name), &FIGURES)
    }

    fn validate(&self) -> Result<()> {
        if self.orders_before == 0 || self.orders_held == 0 || self.orders_after == 0 {
            bail!("orders_before, orders_held and orders_after must each be at least 1");
        }
        if self.orders_before + self.orders_held > SEQUENCE_LOG_AHEAD {
            bail!(
                "orders_before + orders_held must be at most {SEQUENCE_LOG_AHEAD} (PostgreSQL \
                 logs a sequence that far ahead: past it the promoted standby would give a new \
                 order the id of a lost one)"
            );
        }
        if !(100..=10_000).contains(&self.hold_ms) {
            bail!("hold_ms must be 100..=10000");
        }
        Ok(())
    }

    async fn run(&self, ctx: &Ctx<'_>) -> Result<Outcome> {
        let mut outcome = Outcome::default();
        let columns: Vec<&str> = ["case"].into_iter().chain(FIGURES).collect();
        let mut table = Table::new(
            "the primary dies with orders its standby never received; the standby is promoted",
            &columns,
        );
        let progress = ctx.progress().bar(CASES.len() as u64, "failovers");
        for case in CASES {
            let bins = self.binaries(ctx, case)?;
            let pair = Replicated::start(
                &bins,
                case.replication(),
                case == Case::CdcFailoverSlot,
                false,
            )
            .await
            .context("cannot start the primary and its standby")?;
            let (figures, said) = fail_over(ctx, self, pair, case).await?;
            let name = case.name();
            outcome
                .notes
                .extend(said.map(|said| format!("[{name}] {said}")));
            let mut row = vec![name.to_string()];
            for (figure, value) in FIGURES.iter().zip(figures) {
                outcome
                    .metrics
                    .set(format!("{name}.{figure}"), value.clone());
                row.push(value.to_string());
            }
            table.push(row);
            progress.inc(1);
        }
        progress.finish_and_clear();
        outcome.tables.push(table);
        Ok(outcome)
    }
}

/// One case on its own pair: the figures of [`FIGURES`], and what the relay said of the
/// promoted standby where that is the point.
async fn fail_over(
    ctx: &Ctx<'_>,
    params: &Params,
    mut pair: Replicated,
    case: Case,
) -> Result<(Vec<serde_json::Value>, Option<String>)> {
    let admin = connect::postgres(&connect::parse_url(&pair.url())?).await?;
    admin
        .batch_execute(&format!("CREATE DATABASE {DATABASE}"))
        .await?;
    let db = Database {
        server_url: pair.url(),
        name: DATABASE.into(),
    };
    schema::create(&db.connect().await?).await?;
    // The consumer's side effects live on another server: the failover does not touch them.
    let consumer_db = ctx.database(case.name()).await?;
    let consumer = ctx
        .start_consumer(&consumer_db, ConsumerKind::Idempotent, &Faults::default())
        .await?;
    let shipments = consumer_db.connect().await?;
    let proxy = PgProxy::start(&db.config()?, 2, None).await?;
    let (app, relay_link) = (proxy.link(0).database(&db)?, proxy.link(1).database(&db)?);
    let primary = db.connect().await?;
    if case.tails_the_log() {
        cdc::create_slot(&primary, SLOT, case == Case::CdcFailoverSlot).await?;
    }
    let relay_command = |name: &str| match case {
        Case::Cdc | Case::CdcFailoverSlot => ctx
            .cdc_relay(
                &relay_link,
                &consumer.url,
                name,
                SLOT,
                &RelayConfig::default(),
            )
            .any_role(),
        _ => {
            let config = RelayConfig {
                fence_standby: case == Case::Fenced,
                ..RelayConfig::default()
            };
            ctx.relay(&relay_link, &consumer.url, name, &config)
                .with(|relay| relay.follow = Some(Wakeup::Poll(RELAY_POLL)))
                .any_role()
        }
    };
    let relay = relay_command("0").spawn()?;

    let acknowledged = Arc::new(Mutex::new(Vec::new()));
    let mut commit_ms = Vec::new();
    let mut client = connect::postgres(&app.config()?).await?;
    for _ in 0..params.orders_before {
        let started = Instant::now();
        let event = create_order(&mut client).await?;
        commit_ms.push(started.elapsed().as_secs_f64() * 1000.0);
        acknowledged.lock().expect("not poisoned").push(event);
    }
    // Marked (or confirmed) too, and replayed: the relay's mark would otherwise wait for a
    // held standby.
    delivered(&shipments, i64::from(params.orders_before)).await?;
    match case.tails_the_log() {
        true => cdc::wait_caught_up(&primary, SLOT, DELIVERY_LIMIT).await?,
        false => {
            wait::until(
                "the relay to mark what it delivered",
                DELIVERY_LIMIT,
                RELAY_POLL,
                async || Ok(primary.query_one(UNPUBLISHED, &[]).await?.get::<_, i64>(0) == 0),
            )
            .await?
        }
    }
    pair.caught_up().await?;
    if case == Case::CdcFailoverSlot {
        pair.sync_slots(SLOT).await?;
    }

    // The standby now receives nothing: the application goes on committing (asynchronous) or
    // waits at COMMIT (synchronous), and the relay delivers what it can see.
    pair.hold_replication().await?;
    let held = {
        let acknowledged = acknowledged.clone();
        let orders = params.orders_held;
        tokio::spawn(async move {
            for _ in 0..orders {
                let event = create_order(&mut client).await?;
                acknowledged.lock().expect("not poisoned").push(event);
            }
            anyhow::Ok(())
        })
    };
    let hold = Duration::from_millis(params.hold_ms);
    match case {
        Case::Async | Case::Sync | Case::Fenced | Case::Cdc | Case::CdcFailoverSlot => {
            tokio::time::sleep(hold).await
        }
        Case::SyncCancelled => {
            let started = Instant::now();
            while started.elapsed() < hold {
                tokio::time::sleep(CANCEL_EVERY).await;
                // The relay's mark COMMIT waits as well: cancelled too, as one timeout for
                // every session would.
                let backends = [proxy.link(0).backends(), proxy.link(1).backends()].concat();
                primary.execute(CANCEL_SYNC_WAITS, &[&backends]).await?;
            }
        }
    }
    // What the relay can see, it delivers (the fenced relay, and the failover slot's reader,
    // wait for the standby instead).
    if case.ships_what_the_primary_has() {
        let committed = acknowledged.lock().expect("not poisoned").len() as i64;
        delivered(&shipments, committed).await?;
    }

    pair.fail_over().await.context("cannot fail over")?;
    held.abort();
    proxy.repoint(&pair.standby_config()?)?;
    let mut client = connect::patiently(connect::RECONNECT_PATIENCE, async || {
        connect::postgres(&app.config()?).await
    })
    .await?;
    for _ in 0..params.orders_after {
        let event = create_order(&mut client).await?;
        acknowledged.lock().expect("not poisoned").push(event);
    }
    // The same database, on the promoted standby (the harness goes straight to it).
    let promoted = Database {
        server_url: pair.url(),
        ..db.clone()
    }
    .connect()
    .await?;
    let mut said = None;
    match case {
        // The log-tailing relay's stream ended with its server; started again (as a supervisor
        // would), it finds no slot to stream from: what it says is the case's note.
        Case::Cdc => {
            relay.stop().await?;
            let again = relay_command("1").run(CHILD_TIMEOUT).await?;
            said = Some(format!(
                "the log-tailing relay, started again: {}",
                again.end
            ));
        }
        // Started again, it streams from the standby's copy of its slot, until every event
        // the promoted standby holds is shipped (or the bound: what is missing then is lost).
        Case::CdcFailoverSlot => {
            relay.stop().await?;
            let again = relay_command("1").spawn()?;
            wait::up_to(DELIVERY_LIMIT, RELAY_POLL, async || {
                let events: i64 = promoted.query_one(counts::OUTBOX_ROWS, &[]).await?.get(0);
                Ok(shipments.query_one(SHIPPED, &[]).await?.get::<_, i64>(0) >= events)
            })
            .await?;
            again.stop().await?;
        }
        _ => {
            let drained = wait::up_to(DELIVERY_LIMIT, RELAY_POLL, async || {
                Ok(promoted.query_one(UNPUBLISHED, &[]).await?.get::<_, i64>(0) == 0)
            })
            .await?;
            relay.stop().await?;
            if drained.is_none() {
                bail!(
                    "the relay did not deliver the promoted standby's outbox within \
                     {DELIVERY_LIMIT:?}"
                );
            }
        }
    }
    consumer.stop().await?;
    drop(proxy);

    let acknowledged = acknowledged.lock().expect("not poisoned").clone();
    let acknowledged_lost: i64 = promoted
        .query_one(ACKNOWLEDGED_LOST, &[&acknowledged])
        .await?
        .get(0);
    two_databases::bring_application_rows(&promoted, &shipments).await?;
    let deliveries = counts::one_row(&shipments, counts::DELIVERIES).await?;
    let ghosts: i64 = shipments
        .query_one(&format!("SELECT count(*) FROM ({GHOSTS}) g"), &[])
        .await?
        .get(0);
    let figures = vec![
        (acknowledged.len() as i64).into(),
        acknowledged_lost.into(),
        deliveries.get::<_, i64>("shipments").into(),
        ghosts.into(),
        deliveries.get::<_, i64>("lost").into(),
        stats::round_ms(stats::median(&commit_ms)).into(),
    ];
    Ok((figures, said))
}

/// The business transaction: the order and its event, one COMMIT; the event's id once the
/// COMMIT was answered.
async fn create_order(client: &mut Client) -> Result<Uuid> {
    let tx = client.transaction().await?;
    let id: i64 = tx.query_one(INSERT_ORDER, &[&1_i64]).await?.get(0);
    let payload = writer::order_payload(id);
    let row = tx
        .query_one(
            INSERT_OUTBOX,
            &[&id.to_string(), &writer::event_type(1), &payload],
        )
        .await?;
    tx.commit().await?;
    Ok(row.get("event_id"))
}

/// Waits until the consumer has shipped `events`.
async fn delivered(shipments: &Client, events: i64) -> Result<()> {
    wait::until(
        format!("the relay to deliver {events} events"),
        DELIVERY_LIMIT,
        RELAY_POLL,
        async || Ok(shipments.query_one(SHIPPED, &[]).await?.get::<_, i64>(0) >= events),
    )
    .await
}
