//! cdc (beyond the article: log tailing, Debezium's way, which the article could not run): the
//! same measurements for three relays side by side, each following its own database — the
//! article's relay polling every 100 ms, the same relay woken by LISTEN/NOTIFY, and the
//! log-tailing relay reading a logical replication slot:
//! 1. latency of paced orders (consumer's received_at - outbox.created_at), p50 and p99;
//! 2. DB transactions committed while idle (pg_stat_database);
//! 3. the watermark-gap interleaving (A's transaction open while B commits a later id);
//! 4. a crash after sending, before marking (or confirming), and a restart.
//!
//! Then what only the log-tailing relay can do or suffer: the Debezium-style outbox (rows
//! deleted in the transaction that wrote them), and the hazard of a stopped relay, whose slot
//! retains the WAL written meanwhile, until it catches up ([`log_tailing`]).

mod log_tailing;

use std::time::Duration;

use anyhow::{bail, Result};
use serde::Deserialize;
use serde_json::json;
use tokio_postgres::types::ToSql;
use tokio_postgres::Client;

use super::{metric_names, Ctx, Experiment, Outcome, CHILD_TIMEOUT};
use crate::harness::child::{ChildCommand, ChildEnd, ConsumerProcess, Role, RunningChild};
use crate::harness::db::Database;
use crate::judge::counts;
use crate::judge::latency;
use crate::outbox::consumer::{ConsumerKind, Faults};
use crate::outbox::crash::{CrashPlan, CrashPoint};
use crate::outbox::relay::cdc;
use crate::outbox::relay::{RelayConfig, Wakeup, RELAY_APPLICATION_NAME};
use crate::outbox::schema;
use crate::outbox::writer::{event_type, Ending, INSERT_OUTBOX};
use crate::report::Table;
use crate::stats::round_ms;
use crate::wait;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// Orders written for the latency measurement, one event each.
    pub latency_events: u32,
    /// ... this far apart on average (jittered, seeded, so every poll phase is sampled).
    pub interval_ms: u64,
    /// How long the idle relays are watched for DB transactions.
    pub idle_ms: u64,
    /// Orders written for the crash, one event (one transaction) each.
    pub crash_events: u32,
    /// The relay dies after delivering this many of them.
    pub crash_after: u32,
    /// Debezium-style orders, whose outbox rows are deleted in the writing transaction.
    pub deleted_events: u32,
    /// Events written (one statement) while the log-tailing relay is down.
    pub retention_events: u32,
    /// Rows written to another table while the outbox is quiet (the slot's heartbeat problem).
    pub unrelated_rows: u32,
}

impl Experiment for Params {
    fn metrics(&self) -> Vec<String> {
        let figures = [
            "received",
            "lost",
            "duplicates",
            "p50_ms",
            "p99_ms",
            "idle_xacts",
            "gap_order",
        ];
        let mut metrics = metric_names(Design::ALL.map(Design::name), &figures);
        let log_tailing = [
            "cdc.deleted_rows_delivered",
            "cdc.orders_without_event",
            "slot.left",
            "slot.wal_written_bytes_down",
            "slot.retained_bytes_before",
            "slot.retained_bytes_down",
            "slot.retained_bytes_after",
            "slot.unconfirmed_bytes_down",
            "slot.unconfirmed_bytes_after",
            "slot.unrelated_written_bytes",
        ];
        let heartbeat = ["retained_bytes", "unconfirmed_bytes"];
        metrics.extend(metric_names(["heartbeat", "no_heartbeat"], &heartbeat));
        metrics.extend(metric_names([""], &log_tailing));
        metrics
    }

    fn validate(&self) -> Result<()> {
        if self.latency_events == 0 || self.crash_events == 0 {
            bail!("latency_events and crash_events must be at least 1");
        }
        if self.crash_after == 0 || self.crash_after > self.crash_events {
            bail!(
                "crash_after {} must be between 1 and crash_events ({})",
                self.crash_after,
                self.crash_events
            );
        }
        Ok(())
    }

    async fn run(&self, ctx: &Ctx<'_>) -> Result<Outcome> {
        run(ctx, self).await
    }
}

/// Bounds every wait for deliveries (a relay that stopped delivering fails the run, not hangs it).
const DELIVERY_LIMIT: Duration = Duration::from_secs(60);
/// How often the database is looked at while waiting.
const WAIT_POLL: Duration = Duration::from_millis(5);
/// The poll relay's interval and the NOTIFY relay's fallback poll.
const POLL_EVERY: Duration = Duration::from_millis(100);
const NOTIFY_FALLBACK: Duration = Duration::from_millis(1000);
/// Statistics reach pg_stat_database about once a second: let the previous phase's settle.
const STATS_SETTLE: Duration = Duration::from_millis(1100);

/// The three relays compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Design {
    Poll100,
    Notify,
    Cdc,
}

impl Design {
    const ALL: [Design; 3] = [Design::Poll100, Design::Notify, Design::Cdc];

    fn name(self) -> &'static str {
        match self {
            Design::Poll100 => "poll100",
            Design::Notify => "notify",
            Design::Cdc => "cdc",
        }
    }

    fn crash_point(self) -> CrashPoint {
        match self {
            Design::Cdc => CrashPoint::CdcRelayAfterSendBeforeConfirm,
            Design::Poll100 | Design::Notify => CrashPoint::RelayAfterSendBeforeMark,
        }
    }
}

/// One design's database, consumer and following relay.
struct Bench<'a> {
    ctx: &'a Ctx<'a>,
    design: Design,
    db: Database,
    client: Client,
    consumer: ConsumerProcess,
    /// The log-tailing relay's slot.
    slot: String,
    relay: Option<RunningChild>,
    /// Relay processes started so far, to name the next one.
    started: u32,
    /// Whether the next log-tailing relay confirms while the outbox is quiet.
    heartbeat: bool,
}

impl<'a> Bench<'a> {
    async fn new(ctx: &'a Ctx<'a>, design: Design) -> Result<Bench<'a>> {
        let db = ctx.database(design.name()).await?;
        let client = db.connect().await?;
        let slot = cdc::slot_name(&db.name);
        match design {
            Design::Notify => client.batch_execute(schema::NOTIFY_TRIGGER).await?,
            Design::Cdc => cdc::create_slot(&client, &slot, false).await?,
            Design::Poll100 => {}
        }
        let consumer = ctx
            .start_consumer(&db, ConsumerKind::Naive, &Faults::default())
            .await?;
        Ok(Bench {
            ctx,
            design,
            db,
            client,
            consumer,
            slot,
            relay: None,
            started: 0,
            heartbeat: true,
        })
    }

    /// The next relay process: its name, and its command.
    fn relay_command(&mut self) -> (String, ChildCommand<Role>) {
        let name = self.started.to_string();
        self.started += 1;
        let (ctx, db, sink) = (self.ctx, &self.db, &self.consumer.url);
        let config = RelayConfig::default();
        let command = match self.design {
            Design::Poll100 => ctx
                .relay(db, sink, &name, &config)
                .with(|relay| relay.follow = Some(Wakeup::Poll(POLL_EVERY)))
                .any_role(),
            Design::Notify => ctx
                .relay(db, sink, &name, &config)
                .with(|relay| {
                    relay.follow = Some(Wakeup::Notify {
                        fallback: NOTIFY_FALLBACK,
                    })
                })
                .any_role(),
            Design::Cdc => {
                let heartbeat = self.heartbeat;
                ctx.cdc_relay(db, sink, &name, &self.slot, &config)
                    .with(|relay| relay.heartbeat = heartbeat)
                    .any_role()
            }
        };
        (name, command)
    }

    /// Starts the following relay and waits until it is ready (streaming, for the slot;
    /// listening, for the NOTIFY relay: see `counts::RELAY_READY`).
    async fn start_relay(&mut self) -> Result<()> {
        let (name, command) = self.relay_command();
        self.relay = Some(command.spawn()?);
        let ready = match self.design {
            Design::Cdc => wait_until(&self.client, cdc::SLOT_ACTIVE, &[&self.slot]).await?,
            Design::Poll100 | Design::Notify => {
                let session = format!("{RELAY_APPLICATION_NAME} {name}");
                wait_until(&self.client, counts::RELAY_READY, &[&session]).await?
            }
        };
        if !ready {
            bail!("the {} relay did not connect", self.design.name());
        }
        Ok(())
    }

    /// Stops the following relay once it has marked (or confirmed) everything it delivered, so
    /// that nothing is delivered again but what the crash leaves behind.
    async fn stop_relay(&mut self) -> Result<()> {
        match self.design {
            Design::Cdc => cdc::wait_caught_up(&self.client, &self.slot, DELIVERY_LIMIT).await?,
            Design::Poll100 | Design::Notify => {
                if !wait_until(&self.client, counts::ALL_PUBLISHED, &[]).await? {
                    bail!("the {} relay left rows unmarked", self.design.name());
                }
            }
        }
        if let Some(relay) = self.relay.take() {
            relay.stop().await?;
        }
        Ok(())
    }

    async fn wait_all_received(&self, what: &str) -> Result<()> {
        if !wait_until(&self.client, counts::ALL_RECEIVED, &[]).await? {
            bail!(
                "the {} relay did not deliver {what} within {DELIVERY_LIMIT:?}",
                self.design.name()
            );
        }
        Ok(())
    }
}

pub async fn run(ctx: &Ctx<'_>, params: &Params) -> Result<Outcome> {
    let mut outcome = Outcome::default();
    let mut comparison = Table::new(
        "poll (100 ms) vs LISTEN/NOTIFY vs log tailing (logical replication slot)",
        &[
            "design",
            "received",
            "lost",
            "duplicates",
            "p50_ms",
            "p99_ms",
            "idle_db_transactions",
            "gap: receive order",
        ],
    );
    for design in Design::ALL {
        let mut bench = Bench::new(ctx, design).await?;
        let name = design.name();
        bench.start_relay().await?;
        let (p50_ms, p99_ms) = latency(&bench, params).await?;
        let idle_xacts = idle_transactions(&bench, params).await?;
        let gap_order = watermark_gap(&bench).await?;
        crash_and_restart(&mut bench, params, &mut outcome).await?;
        let row = counts::one_row(&bench.client, counts::DELIVERIES).await?;
        let (received, duplicates, lost) = (
            row.get::<_, i64>("received"),
            row.get::<_, i64>("duplicate_shipments"),
            row.get::<_, i64>("lost"),
        );
        let m = &mut outcome.metrics;
        m.set(format!("{name}.received"), received);
        m.set(format!("{name}.lost"), lost);
        m.set(format!("{name}.duplicates"), duplicates);
        m.set(format!("{name}.p50_ms"), round_ms(p50_ms));
        m.set(format!("{name}.p99_ms"), round_ms(p99_ms));
        m.set(format!("{name}.idle_xacts"), idle_xacts);
        m.set(format!("{name}.gap_order"), gap_order.clone());
        comparison.push(vec![
            name.into(),
            received.to_string(),
            lost.to_string(),
            duplicates.to_string(),
            format!("{:.1}", p50_ms),
            format!("{:.1}", p99_ms),
            idle_xacts.to_string(),
            gap_order,
        ]);
        if design == Design::Cdc {
            log_tailing::deleted_rows(&bench, params, &mut outcome).await?;
            log_tailing::wal_retention(&mut bench, params, &mut outcome).await?;
            log_tailing::unrelated_writes(&mut bench, params, &mut outcome).await?;
        }
        bench.stop_relay().await?;
        if design == Design::Cdc {
            cdc::drop_slot(&bench.client, &bench.slot).await?;
            let left = bench
                .client
                .query_one(cdc::SLOTS_OF_DATABASE, &[&bench.db.name])
                .await?
                .get::<_, i64>(0);
            outcome.metrics.set("slot.left", left);
        }
        bench.consumer.stop().await?;
    }
    outcome.tables.insert(0, comparison);
    outcome.notes.push(format!(
        "received = {} paced + 2 gap + {} crash events, plus what the restarted relay sent again; \
         idle = DB transactions committed over {} ms with nothing to deliver",
        params.latency_events, params.crash_events, params.idle_ms
    ));
    Ok(outcome)
}

/// Paced orders; returns p50 and p99 of their latency in ms.
async fn latency(bench: &Bench<'_>, params: &Params) -> Result<(f64, f64)> {
    bench
        .ctx
        .writer(&bench.db, params.latency_events, 1, Ending::Commit)
        .with(|writer| writer.interval = Some(Duration::from_millis(params.interval_ms)))
        .run(CHILD_TIMEOUT)
        .await?
        .expect(|e| *e == ChildEnd::Ok, "the paced writer")?;
    bench.wait_all_received("the paced orders").await?;
    let measured = latency::measure(&bench.client).await?;
    Ok((measured.p50_ms, measured.p99_ms))
}

/// DB transactions committed in the database while the relay has nothing to deliver.
async fn idle_transactions(bench: &Bench<'_>, params: &Params) -> Result<i64> {
    tokio::time::sleep(STATS_SETTLE).await;
    let before = counts::count(&bench.client, counts::XACT_COMMIT).await?;
    tokio::time::sleep(Duration::from_millis(params.idle_ms)).await;
    let after = counts::count(&bench.client, counts::XACT_COMMIT).await?;
    Ok(after - before)
}

/// Session A inserts and holds its transaction open; B inserts a later id and commits; A
/// commits once B was delivered. Returns the order the consumer received them in.
async fn watermark_gap(bench: &Bench<'_>) -> Result<String> {
    let session_a = bench.db.connect().await?;
    let received_before = counts::count(&bench.client, counts::RECEIVED).await?;
    session_a.batch_execute("BEGIN").await?;
    let payload = |session: &str| json!({ "session": session });
    session_a
        .execute(INSERT_OUTBOX, &[&"A", &event_type(1), &payload("A")])
        .await?;
    bench
        .client
        .execute(INSERT_OUTBOX, &[&"B", &event_type(1), &payload("B")])
        .await?;
    let b_first = received_before + 1;
    if !wait_until(&bench.client, counts::RECEIVED_AT_LEAST, &[&b_first]).await? {
        bail!("the {} relay did not deliver B", bench.design.name());
    }
    session_a.batch_execute("COMMIT").await?;
    bench.wait_all_received("A after its commit").await?;
    let order: String = bench
        .client
        .query_one(GAP_ORDER, &[&received_before])
        .await?
        .get(0);
    Ok(order)
}

/// The gap sessions' deliveries after receipt $1, in the order received (`B,A`).
const GAP_ORDER: &str = "
SELECT string_agg(order_id, ',' ORDER BY seq)
  FROM (SELECT seq, order_id FROM consumer.receipts
         WHERE NOT injected_fault ORDER BY seq OFFSET $1) r";

/// The relay is stopped, orders are written, a relay dies after delivering `crash_after` of
/// them, and a restarted one follows on.
async fn crash_and_restart(
    bench: &mut Bench<'_>,
    params: &Params,
    outcome: &mut Outcome,
) -> Result<()> {
    let name = bench.design.name();
    bench.stop_relay().await?;
    bench
        .ctx
        .run_writer(&bench.db, params.crash_events, Ending::Commit, None)
        .await?
        .expect(|e| *e == ChildEnd::Ok, "the writer")?;
    let crash = CrashPlan::new(bench.design.crash_point(), params.crash_after);
    let crashed = bench
        .relay_command()
        .1
        .crash_at(Some(crash))
        .run(CHILD_TIMEOUT)
        .await?
        .expect(
            |e| matches!(e, ChildEnd::Crashed { .. }),
            "the crashing relay",
        )?;
    outcome.notes.push(format!(
        "[{name}] relay {} after {} of {} deliveries",
        crashed.end, params.crash_after, params.crash_events
    ));
    bench.start_relay().await?;
    bench.wait_all_received("the crash's orders").await
}

/// Polls a one-boolean query until it says true; false if it did not within the limit.
async fn wait_until(client: &Client, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<bool> {
    let answer = wait::up_to(DELIVERY_LIMIT, WAIT_POLL, async || {
        Ok(client
            .query_one(sql, params)
            .await?
            .get::<_, Option<bool>>(0)
            == Some(true))
    })
    .await?;
    Ok(answer.is_some())
}
