//! claim-vs-lock (よくある落とし穴): the two ways a relay keeps other relays off the rows it is
//! delivering. (a) The article's: row locks held by the delivering transaction. (b) A
//! `claimed_at`/`claimed_by` lease written by UPDATE and committed before delivering. A relay
//! dies in the middle of a batch while a second relay runs: the lock comes back at once, the
//! lease only when it expires. With a slow sink, the lock design keeps a transaction open through
//! the whole batch; the lease design writes every row twice instead.

use std::time::Duration;

use anyhow::{bail, Result};
use serde::Deserialize;
use tokio_postgres::Client;

use super::{metric_names, Ctx, Experiment, Outcome};
use crate::harness::child::ChildEnd;
use crate::harness::db::Database;
use crate::judge::counts;
use crate::outbox::consumer::{ConsumerKind, Faults};
use crate::outbox::crash::{CrashPlan, CrashPoint};
use crate::outbox::relay::{RelayConfig, RelayDesign, RELAY_APPLICATION_NAME};
use crate::outbox::schema;
use crate::outbox::writer::Ending;
use crate::report::{Metrics, Table};
use crate::stats::{round_ms, round_to};
use crate::wait;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// Rows per fetch: relay 0's batch.
    pub batch: u32,
    /// Rows written with the batch that relay 0 does not take (the second relay's work).
    pub later_events: u32,
    /// Relay 0 dies after delivering this many rows of its batch.
    pub crash_after: u32,
    /// The slow sink takes this long over each delivery.
    pub sink_delay_ms: u64,
    /// Claim design: a claim older than this may be taken by another relay.
    pub lease_ms: u64,
}

impl Experiment for Params {
    fn metrics(&self) -> Vec<String> {
        let figures = [
            "recovery_ms",
            "redelivered",
            "overtaken",
            "max_xact_ms",
            "horizon_held_share",
            "backend_xmin_held_share",
            "backend_xid_held_share",
            "sessions_sampled",
            "updates_per_event",
        ];
        metric_names(DESIGNS.iter().map(|d| d.name()), &figures)
    }

    fn validate(&self) -> Result<()> {
        if self.crash_after == 0 || self.crash_after >= self.batch {
            bail!(
                "crash_after {} must be between 1 and batch - 1 ({}): the crash falls mid-batch",
                self.crash_after,
                self.batch - 1
            );
        }
        Ok(())
    }

    async fn run(&self, ctx: &Ctx<'_>) -> Result<Outcome> {
        run(ctx, self).await
    }
}

/// How often the relay's session is looked at while the sink is slow.
const SAMPLE_EVERY: Duration = Duration::from_millis(10);
/// Bounds on waits for the children (they take seconds at most).
const WAIT_LIMIT: Duration = Duration::from_secs(30);
/// How often the database is looked at while waiting.
const WAIT_POLL: Duration = Duration::from_millis(5);

const DESIGNS: [RelayDesign; 2] = [RelayDesign::Lock, RelayDesign::Claim];

pub async fn run(ctx: &Ctx<'_>, params: &Params) -> Result<Outcome> {
    let mut outcome = Outcome::default();
    for design in DESIGNS {
        crash_mid_batch(ctx, params, design, &mut outcome).await?;
        slow_sink(ctx, params, design, &mut outcome).await?;
    }
    outcome
        .tables
        .insert(0, trade_offs(params, &outcome.metrics));
    Ok(outcome)
}

fn config(params: &Params, design: RelayDesign) -> RelayConfig {
    RelayConfig {
        design,
        lease: Duration::from_millis(params.lease_ms),
        batch: i64::from(params.batch),
        ..RelayConfig::default()
    }
}

/// A database whose outbox has the lease columns (both designs, so both write the same rows)
/// and `orders` committed orders.
async fn outbox_with_orders(ctx: &Ctx<'_>, part: &str, orders: u32) -> Result<(Database, Client)> {
    let db = ctx.database(part).await?;
    let client = db.connect().await?;
    client.batch_execute(schema::ADD_CLAIM_COLUMNS).await?;
    ctx.run_writer(&db, orders, Ending::Commit, None)
        .await?
        .expect(|e| *e == ChildEnd::Ok, "the writer")?;
    Ok((db, client))
}

/// Relay 0 (slow sink) takes a batch and dies after `crash_after` deliveries; relay 1 (fast
/// sink), started once relay 0 holds its batch, delivers the later rows and then the batch.
async fn crash_mid_batch(
    ctx: &Ctx<'_>,
    params: &Params,
    design: RelayDesign,
    outcome: &mut Outcome,
) -> Result<()> {
    let name = design.name();
    let orders = params.batch + params.later_events;
    let (db, client) = outbox_with_orders(ctx, &format!("{name}_crash"), orders).await?;
    let slow = ctx
        .start_consumer(&db, ConsumerKind::Naive, &slow_faults(params))
        .await?;
    let fast = ctx
        .start_consumer(&db, ConsumerKind::Naive, &Faults::default())
        .await?;
    let config = config(params, design);
    let crash = CrashPlan::new(CrashPoint::RelayAfterSendBeforeMark, params.crash_after);
    let first = ctx.spawn_relay(&db, &slow.url, "0", &config, Some(crash));
    // Relay 0 holds its whole batch by the time its first delivery arrives.
    wait_for_first_receipt(&client).await?;
    let second = ctx.spawn_relay(&db, &fast.url, "1", &config, None);
    let first = first
        .await??
        .expect(|e| matches!(e, ChildEnd::Crashed { .. }), "relay 0")?;
    let second = second.await??.expect(|e| *e == ChildEnd::Ok, "relay 1")?;
    slow.stop().await?;
    fast.stop().await?;
    outcome.notes.push(format!(
        "[{name}] relay 0 {} after {} deliveries of its batch of {}",
        first.end, params.crash_after, params.batch
    ));
    outcome
        .notes
        .extend(second.log_lines().map(|l| format!("[{name}] {l}")));

    let row = client
        .query_one(
            counts::REDELIVERY_AFTER_CRASH,
            &[&i64::from(params.batch), &i64::from(params.crash_after)],
        )
        .await?;
    let m = &mut outcome.metrics;
    m.set(
        format!("{name}.recovery_ms"),
        round_ms(row.get("recovery_ms")),
    );
    m.set(
        format!("{name}.redelivered"),
        row.get::<_, i64>("redelivered"),
    );
    m.set(format!("{name}.overtaken"), row.get::<_, i64>("overtaken"));
    let receipts = client.query(counts::RECEIPT_LOG, &[]).await?;
    outcome.tables.push(Table::from_rows(
        format!(
            "receipt log ({name}: relay 0 dies after outbox id {})",
            params.crash_after
        ),
        &receipts,
    ));
    Ok(())
}

/// One relay, no crash, a slow sink: how long its transactions stay open, sampled from
/// pg_stat_activity, and how many row versions it writes per event.
async fn slow_sink(
    ctx: &Ctx<'_>,
    params: &Params,
    design: RelayDesign,
    outcome: &mut Outcome,
) -> Result<()> {
    let name = design.name();
    let (db, client) = outbox_with_orders(ctx, &format!("{name}_slow"), params.batch).await?;
    let slow = ctx
        .start_consumer(&db, ConsumerKind::Naive, &slow_faults(params))
        .await?;
    let relay = ctx.spawn_relay(&db, &slow.url, "0", &config(params, design), None);
    let relays = format!("{RELAY_APPLICATION_NAME}%");
    let mut max_xact_ms = 0.0f64;
    // Samples taken while the relay's session existed, and in how many it held the horizon.
    let (mut samples, mut horizon_held, mut xmin_held, mut xid_held) = (0u32, 0u32, 0u32, 0u32);
    while !relay.is_finished() {
        let row = client.query_one(counts::RELAY_SESSIONS, &[&relays]).await?;
        if row.get::<_, i64>("sessions") > 0 {
            samples += 1;
            max_xact_ms = max_xact_ms.max(row.get("xact_ms"));
            horizon_held += u32::from(row.get::<_, bool>("horizon_held"));
            xmin_held += u32::from(row.get::<_, bool>("xmin_held"));
            xid_held += u32::from(row.get::<_, bool>("xid_held"));
        }
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
    if samples == 0 {
        bail!("the relay's session was never seen in pg_stat_activity");
    }
    let share = |held: u32| round_to(f64::from(held) / f64::from(samples), 100.0);
    relay.await??.expect(|e| *e == ChildEnd::Ok, "the relay")?;
    slow.stop().await?;
    // A session flushes its statistics as it ends, before it leaves pg_stat_activity.
    wait_until_relays_gone(&client, &relays).await?;
    let updates: i64 = client.query_one(counts::OUTBOX_UPDATES, &[]).await?.get(0);
    let m = &mut outcome.metrics;
    m.set(format!("{name}.max_xact_ms"), round_ms(max_xact_ms));
    m.set(format!("{name}.horizon_held_share"), share(horizon_held));
    m.set(format!("{name}.backend_xmin_held_share"), share(xmin_held));
    m.set(format!("{name}.backend_xid_held_share"), share(xid_held));
    m.set(format!("{name}.sessions_sampled"), samples);
    m.set(
        format!("{name}.updates_per_event"),
        updates as f64 / f64::from(params.batch),
    );
    Ok(())
}

fn slow_faults(params: &Params) -> Faults {
    Faults {
        delay: Duration::from_millis(params.sink_delay_ms),
        ..Faults::default()
    }
}

async fn wait_for_first_receipt(client: &Client) -> Result<()> {
    wait::until(
        "relay 0's first delivery",
        WAIT_LIMIT,
        WAIT_POLL,
        async || {
            Ok(client
                .query_one(counts::LAST_RECEIPT, &[])
                .await?
                .get::<_, i64>(0)
                > 0)
        },
    )
    .await
}

async fn wait_until_relays_gone(client: &Client, relays: &str) -> Result<()> {
    wait::until(
        "the relay's session to end",
        WAIT_LIMIT,
        WAIT_POLL,
        async || {
            let sessions: i64 = client
                .query_one(counts::RELAY_SESSIONS, &[&relays])
                .await?
                .get("sessions");
            Ok(sessions == 0)
        },
    )
    .await
}

/// The trade-off the article alludes to, measured.
fn trade_offs(params: &Params, metrics: &Metrics) -> Table {
    let mut table = Table::new(
        "lock (the article) vs claim (claimed_at lease)",
        &["", "lock", "claim"],
    );
    let show = |design: RelayDesign, metric: &str, as_percent: bool| {
        let measured = metrics.get(&format!("{}.{metric}", design.name()));
        match (measured.and_then(serde_json::Value::as_f64), as_percent) {
            (None, _) => String::new(),
            (Some(share), true) => format!("{:.0}%", share * 100.0),
            (Some(_), false) => measured.map(ToString::to_string).unwrap_or_default(),
        }
    };
    let rows = [
        (
            format!(
                "crash after {} of {}: batch back at the consumer (ms)",
                params.crash_after, params.batch
            ),
            "recovery_ms",
            false,
        ),
        (
            "younger events delivered before the crashed batch".into(),
            "overtaken",
            false,
        ),
        (
            format!(
                "longest open transaction, sink {} ms/event (ms)",
                params.sink_delay_ms
            ),
            "max_xact_ms",
            false,
        ),
        (
            "time it held back vacuum (a snapshot or a transaction id)".into(),
            "horizon_held_share",
            true,
        ),
        (
            "... by a snapshot (backend_xmin set)".into(),
            "backend_xmin_held_share",
            true,
        ),
        (
            "... by a transaction id (backend_xid set)".into(),
            "backend_xid_held_share",
            true,
        ),
        (
            "row versions written per event (n_tup_upd)".into(),
            "updates_per_event",
            false,
        ),
    ];
    for (what, metric, as_percent) in rows {
        let lock = show(RelayDesign::Lock, metric, as_percent);
        let claim = show(RelayDesign::Claim, metric, as_percent);
        table.push(vec![what, lock, claim]);
    }
    table
}
