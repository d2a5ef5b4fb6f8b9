//! The writer: the business transaction that creates an order and, done right, its outbox row in
//! the same transaction; done wrong (dual write), sends the event itself.

use std::time::Duration;

use anyhow::Result;
use serde_json::json;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, GenericClient, Transaction};
use uuid::Uuid;

use crate::outbox::crash::{self, CrashPoint};
use crate::outbox::event::Event;
use crate::outbox::sink::HttpSink;

/// The writer names its sessions so (`application_name`).
pub const WRITER_APPLICATION_NAME: &str = "outbox-lab writer";

pub const INSERT_ORDER: &str =
    "INSERT INTO orders(customer_id, amount) VALUES ($1, 1200) RETURNING id";

pub const INSERT_OUTBOX: &str = "
INSERT INTO outbox(aggregate_type, aggregate_id, event_type, payload)
VALUES ('orders', $1, $2, $3)
RETURNING id, event_id";

/// The types of the parameters of a user's insert (`verify --insert-sql`): the event id, the
/// aggregate id, the aggregate type, the event type, the payload, and the writer's wall clock
/// (`$6`, for a library whose own writer stamps a row with its process's clock, not the
/// database's: under `clock:step:db` the two differ, and the insert must take the library's).
/// A statement may leave any of them unused.
pub const INSERT_SQL_TYPES: [Type; 6] = [
    Type::UUID,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::JSONB,
    Type::TIMESTAMPTZ,
];

/// The Debezium-style outbox: the rows go again in the transaction that wrote them; only the
/// WAL (and so a log-tailing relay) ever carries them.
pub const DELETE_OUTBOX_ROWS: &str = "DELETE FROM outbox WHERE id = ANY($1)";

/// Events without orders, many at once, for throughput runs: one statement for `$1` rows.
pub const LOAD_EVENTS: &str = "
INSERT INTO outbox(aggregate_type, aggregate_id, event_type, payload)
SELECT 'orders', g::text, 'OrderCreated', jsonb_build_object('order_id', g, 'amount', '1200')
  FROM generate_series(1, $1::bigint) g";

/// The n-th event (1-based) of an order: OrderCreated, then OrderUpdated2, OrderUpdated3, ...
pub fn event_type(n: u32) -> String {
    match n {
        1 => "OrderCreated".into(),
        n => format!("OrderUpdated{n}"),
    }
}

/// How the business transaction ends.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
pub enum Ending {
    Commit,
    Rollback,
}

/// The order of the two writes in the naive app.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
pub enum DualWriteOrder {
    /// COMMIT the order, then POST the event.
    CommitFirst,
    /// POST the event, then COMMIT (or roll back) the order.
    SendFirst,
}

/// When the k-th paced order is written: every `interval_ms` on average, shifted by up to half
/// an interval either way. The shifts follow the golden-ratio sequence (seeded), which spreads
/// the writes evenly over every phase of a relay's poll cycle: with evenly spaced writes all
/// samples would share one phase, and a 1 s poll's median latency would land anywhere in
/// 400-600 ms by luck of that phase.
pub fn paced_offset(k: u64, interval_ms: u64, seed: u64) -> Duration {
    const GOLDEN_RATIO_FRACTION: f64 = 0.618_033_988_749_895;
    let shift = ((seed + k) as f64 * GOLDEN_RATIO_FRACTION).fract() - 0.5;
    let at_ms = (k as f64 + 0.5 + shift) * interval_ms as f64;
    Duration::from_secs_f64(at_ms / 1000.0)
}

/// The event payload of an order, as the article writes it.
pub fn order_payload(order_id: i64) -> serde_json::Value {
    json!({ "order_id": order_id, "amount": "1200" })
}

/// Customers (of those asked for) whose order is committed: a restarted writer skips them, as a
/// client retrying a request it is unsure about would, by its own request key.
pub const COMMITTED_CUSTOMERS: &str = "SELECT customer_id FROM orders WHERE customer_id = ANY($1)";

/// The outbox way: the order and its events in one transaction; nothing is sent here. With
/// `delete_outbox`, the transaction deletes its outbox rows again (Debezium-style).
pub async fn create_order_with_events(
    client: &mut Client,
    customer_id: i64,
    events_per_order: u32,
    ending: Ending,
    delete_outbox: bool,
) -> Result<i64> {
    let tx = client.transaction().await?;
    let outbox = match delete_outbox {
        true => EventsTo::OutboxDeleted,
        false => EventsTo::Outbox,
    };
    let inserted = insert_order_with_events(&tx, customer_id, events_per_order, &outbox).await?;
    crash::point(CrashPoint::WriterAfterInsertBeforeCommit);
    end(tx, ending).await?;
    Ok(inserted.order_id)
}

/// Where an order's events are written.
#[derive(Debug, Clone)]
pub enum EventsTo {
    /// The article's outbox.
    Outbox,
    /// The article's outbox, the rows deleted again in the same transaction (Debezium-style).
    OutboxDeleted,
    /// The user's statement (`verify --insert-sql`), with [`INSERT_SQL_TYPES`]; the article's
    /// outbox row is written and deleted again beside it, so that the judge's record of writes
    /// (a trigger on it) has the event: no relay ever sees that row.
    Statement(String),
}

/// An event the writer inserted: its outbox row's id, its event id, its type.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WrittenEvent {
    pub outbox_id: i64,
    pub event_id: Uuid,
    pub event_type: String,
}

/// An order and its events, inserted in a transaction not yet ended.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct InsertedOrder {
    pub order_id: i64,
    pub customer_id: i64,
    pub events: Vec<WrittenEvent>,
}

/// How an order's COMMIT ended, as the writer knows it (Jepsen's ok, fail, info).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CommitOutcome {
    /// The server said it committed.
    Ok,
    /// The server said it did not.
    Failed,
    /// No answer came (the connection was lost, the writer died): committed if, and only if,
    /// the order is in the database.
    Unknown,
}

impl CommitOutcome {
    pub fn name(self) -> &'static str {
        match self {
            CommitOutcome::Ok => "ok",
            CommitOutcome::Failed => "failed",
            CommitOutcome::Unknown => "unknown",
        }
    }
}

/// What the writer tells the lab of each order, a line each as it happens (the typed contract
/// of its log, [`write_step_line`]): the order and its events once inserted, before its COMMIT;
/// then how the COMMIT ended. The lab keeps them outside every database, where no relay
/// reaches: the judge's record of what was written.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "step", rename_all = "lowercase")]
pub enum WriteStep {
    Inserted(InsertedOrder),
    Ended {
        order_id: i64,
        outcome: CommitOutcome,
        /// When the writer knew (its wall clock, ms since the epoch): for a relay that skips
        /// it, when it committed.
        at_ms: i64,
    },
}

/// An order as the writer wrote it, and how its COMMIT ended ([`CommitOutcome::Unknown`] when
/// the writer never told), and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenOrder {
    pub order: InsertedOrder,
    pub outcome: CommitOutcome,
    /// When its end was known (the wall clock, ms since the epoch), if it was.
    pub ended_at_ms: Option<i64>,
}

/// The wall clock now, in ms since the epoch: when a write's end was known.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// Starts the writer's log line of a database session it lost (then the error): the lab records
/// each, whoever ended it (a nemesis, a restart, or someone else).
pub const SESSION_LOST: &str = "lost its database session: ";

/// Starts a [`WriteStep`]'s line in the writer's log.
const WRITE_STEP: &str = "write ";

/// The log line of a [`WriteStep`].
pub fn write_step_line(step: &WriteStep) -> String {
    let json = serde_json::to_string(step).expect("a write step serializes");
    format!("{WRITE_STEP}{json}")
}

/// The [`WriteStep`] a line of the writer's log tells of ([`write_step_line`], after a
/// `[role] ` tag), if it tells of one (a line cut short by a kill does not).
pub fn write_step_in(line: &str) -> Option<WriteStep> {
    let line = line.split_once("] ").map_or(line, |(_, rest)| rest);
    serde_json::from_str(line.strip_prefix(WRITE_STEP)?).ok()
}

/// Adds what `step` tells to `written` (the orders as the writer told them, in the order they
/// were inserted): a new order, or how an order's COMMIT ended.
pub fn record_step(written: &mut Vec<WrittenOrder>, step: WriteStep) {
    match step {
        WriteStep::Inserted(order) => written.push(WrittenOrder {
            order,
            outcome: CommitOutcome::Unknown,
            ended_at_ms: None,
        }),
        WriteStep::Ended {
            order_id,
            outcome,
            at_ms,
        } => {
            let mut told = written.iter_mut().rev();
            if let Some(ended) = told.find(|w| w.order.order_id == order_id) {
                ended.outcome = outcome;
                ended.ended_at_ms = Some(at_ms);
            }
        }
    }
}

/// The order and its events, in the caller's transaction (a `Transaction`, or a session after
/// its own `BEGIN`: one that will end in `PREPARE TRANSACTION`), where `to` says.
pub async fn insert_order_with_events(
    tx: &impl GenericClient,
    customer_id: i64,
    events_per_order: u32,
    to: &EventsTo,
) -> Result<InsertedOrder> {
    let order_id: i64 = tx.query_one(INSERT_ORDER, &[&customer_id]).await?.get(0);
    let aggregate_id = order_id.to_string();
    let theirs = match to {
        EventsTo::Statement(sql) => Some(tx.prepare_typed(sql, &INSERT_SQL_TYPES).await?),
        _ => None,
    };
    let mut events = Vec::with_capacity(events_per_order as usize);
    for n in 1..=events_per_order {
        let mut payload = order_payload(order_id);
        payload["seq"] = n.into();
        let event_type = event_type(n);
        let row = tx
            .query_one(INSERT_OUTBOX, &[&aggregate_id, &event_type, &payload])
            .await?;
        let event_id: Uuid = row.get("event_id");
        if let Some(statement) = &theirs {
            // The harness's clock, which no nemesis steps: an application's process's.
            let written_at = chrono::Utc::now();
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 6] = [
                &event_id,
                &aggregate_id,
                &"orders",
                &event_type,
                &payload,
                &written_at,
            ];
            tx.execute(statement, &params).await?;
        }
        events.push(WrittenEvent {
            outbox_id: row.get("id"),
            event_id,
            event_type,
        });
    }
    if !matches!(to, EventsTo::Outbox) {
        let ids: Vec<i64> = events.iter().map(|e| e.outbox_id).collect();
        tx.execute(DELETE_OUTBOX_ROWS, &[&ids]).await?;
    }
    Ok(InsertedOrder {
        order_id,
        customer_id,
        events,
    })
}

/// Commits `tx` and tells `step` how it ended (a lost connection leaves it unknown).
async fn commit_told(
    tx: Transaction<'_>,
    order_id: i64,
    step: &mut dyn FnMut(WriteStep),
) -> Result<()> {
    let committed = tx.commit().await.map_err(anyhow::Error::from);
    let outcome = match &committed {
        Ok(()) => CommitOutcome::Ok,
        Err(e) if crate::connect::lost_connection(e) => CommitOutcome::Unknown,
        Err(_) => CommitOutcome::Failed,
    };
    step(WriteStep::Ended {
        order_id,
        outcome,
        at_ms: now_ms(),
    });
    committed
}

/// Orders written in pairs by two sessions whose transactions overlap, as on any busy server:
/// the second order of a pair commits first and the first `overlap` later (a slow request), so
/// outbox ids do not become visible in id order. Each pair takes at least `pace`. Each step of
/// each order is told to `step` as it happens: inserted (with its events), then how its COMMIT
/// ended.
#[allow(clippy::too_many_arguments)]
pub async fn write_overlapping_pairs(
    slow: &mut Client,
    fast: &mut Client,
    customers: &[i64],
    events_per_order: u32,
    to: &EventsTo,
    overlap: Duration,
    pace: Duration,
    step: &mut dyn FnMut(WriteStep),
) -> Result<()> {
    for pair in customers.chunks(2) {
        let paced = tokio::time::sleep(pace);
        let slow_tx = slow.transaction().await?;
        let first = insert_order_with_events(&slow_tx, pair[0], events_per_order, to).await?;
        let first_id = first.order_id;
        step(WriteStep::Inserted(first));
        if let Some(&customer) = pair.get(1) {
            let fast_tx = fast.transaction().await?;
            let second = insert_order_with_events(&fast_tx, customer, events_per_order, to).await?;
            let second_id = second.order_id;
            step(WriteStep::Inserted(second));
            crash::point(CrashPoint::WriterAfterInsertBeforeCommit);
            commit_told(fast_tx, second_id, step).await?;
            tokio::time::sleep(overlap).await;
        }
        crash::point(CrashPoint::WriterAfterInsertBeforeCommit);
        commit_told(slow_tx, first_id, step).await?;
        paced.await;
    }
    Ok(())
}

/// Of `customers`, those without a committed order, in order.
pub async fn uncommitted_customers(client: &Client, customers: &[i64]) -> Result<Vec<i64>> {
    let committed: Vec<i64> = client
        .query(COMMITTED_CUSTOMERS, &[&customers])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    Ok(customers
        .iter()
        .copied()
        .filter(|c| !committed.contains(c))
        .collect())
}

async fn end(tx: Transaction<'_>, ending: Ending) -> Result<()> {
    match ending {
        Ending::Commit => tx.commit().await?,
        Ending::Rollback => tx.rollback().await?,
    }
    Ok(())
}

/// The naive app of the article: INSERT the order and POST the event, as two separate writes.
pub async fn dual_write(
    client: &mut Client,
    sink: &HttpSink,
    customer_id: i64,
    event_id: Uuid,
    order: DualWriteOrder,
    ending: Ending,
) -> Result<i64> {
    let tx = client.transaction().await?;
    let order_id: i64 = tx.query_one(INSERT_ORDER, &[&customer_id]).await?.get(0);
    let event = Event {
        event_id,
        outbox_id: None,
        aggregate_type: "orders".into(),
        aggregate_id: order_id.to_string(),
        event_type: event_type(1),
        payload: order_payload(order_id),
        fence: None,
    };
    match order {
        DualWriteOrder::CommitFirst => {
            end(tx, ending).await?;
            crash::point(CrashPoint::WriterAfterCommitBeforeSend);
            sink.send(&event).await?;
        }
        DualWriteOrder::SendFirst => {
            sink.send(&event).await?;
            crash::point(CrashPoint::WriterAfterSendBeforeCommit);
            end(tx, ending).await?;
        }
    }
    Ok(order_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lab reads back, from the writer's log among its other lines, every order it wrote
    /// with how its COMMIT ended: as told, or unknown when no end was told (the writer died, or
    /// its last line was cut short).
    #[test]
    fn written_orders_round_trip_through_the_log() {
        let order = |order_id: i64, customer_id| InsertedOrder {
            order_id,
            customer_id,
            events: vec![WrittenEvent {
                outbox_id: order_id * 2,
                event_id: Uuid::new_v4(),
                event_type: event_type(1),
            }],
        };
        let ended = |order_id, outcome| WriteStep::Ended {
            order_id,
            outcome,
            at_ms: 1_765_000_000_000 + order_id,
        };
        let first = order(12, 5);
        let cut = write_step_line(&ended(40, CommitOutcome::Ok));
        let log = [
            write_step_line(&WriteStep::Inserted(first.clone())),
            "customer=3 sending".to_string(),
            write_step_line(&WriteStep::Inserted(order(40, 17))),
            write_step_line(&ended(12, CommitOutcome::Ok)),
            write_step_line(&WriteStep::Inserted(order(41, 18))),
            write_step_line(&ended(41, CommitOutcome::Failed)),
            cut[..cut.len() - 3].to_string(),
        ]
        .map(|line| format!("[app] {line}\n"))
        .concat();
        let mut written = Vec::new();
        for step in log.lines().filter_map(write_step_in) {
            record_step(&mut written, step);
        }
        let outcomes: Vec<(i64, CommitOutcome)> = written
            .iter()
            .map(|w| (w.order.order_id, w.outcome))
            .collect();
        assert_eq!(
            outcomes,
            [
                (12, CommitOutcome::Ok),
                (40, CommitOutcome::Unknown),
                (41, CommitOutcome::Failed)
            ]
        );
        assert_eq!(written[0].order, first);
        assert_eq!(written[0].ended_at_ms, Some(1_765_000_000_012));
        assert_eq!(written[1].ended_at_ms, None);
    }
}
