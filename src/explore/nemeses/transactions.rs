//! The workload's transactions that the relays must wait for, or must not wait for forever
//! (`txn:*`): a slow commit, a session idle in transaction, a rollback that leaves a gap, a
//! prepared transaction. Each runs in a session of the writer's (its role, straight to the
//! database: what it does is the nemesis's, not the writer's link's), writes an order and its
//! events as the writer does, and goes into the judge's record as the writer's orders do, with
//! how its COMMIT ended and when. While its transaction is open the harness holds the run (a
//! guard on the fault log): the relays' liveness bound starts when it ends.

use std::cell::Cell;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Result;
use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

use super::Arena;
use crate::connect;
use crate::explore::history::History;
use crate::explore::schedule::TxnFault;
use crate::harness::db::Database;
use crate::harness::nemesis::format_duration;
use crate::outbox::writer::{self, CommitOutcome, EventsTo, InsertedOrder, WrittenOrder};

/// The nemeses' sessions are named so (`application_name`).
const TXN_APPLICATION_NAME: &str = "outbox-lab workload transaction";
/// The customers of the nemeses' orders: far past the writer's (1 to the run's orders, which a
/// restarted writer looks up), one per nemesis of the schedule.
const NEMESIS_CUSTOMERS: i64 = 1_000_000_000;

/// Where the workload's transactions are made, and what they write.
pub struct TxnWorkload {
    /// The application's database as the writer reaches it (its role), straight to the server.
    pub db: Database,
    pub events_per_order: u32,
    pub to: EventsTo,
}

/// Strikes `fault` (the schedule's nemesis `index`) once it is due; what it wrote goes into
/// `history`'s record of what was written.
pub(super) async fn strike(
    index: usize,
    fault: TxnFault,
    arena: &Arena<'_>,
    history: &Mutex<History>,
) -> Result<()> {
    // (`history` is the arena's: passed apart so that the record's lock is plainly its own.)
    if !arena.until(fault.at()).await {
        return Ok(());
    }
    let _doing = arena.faults.harness_doing();
    // A session lost before the fault struck (the server restarting under another nemesis, a
    // crash that lands just after it connected) took nothing with it: the fault begins again.
    let patience = Instant::now() + connect::RECONNECT_PATIENCE;
    loop {
        let struck = Cell::new(false);
        match strike_once(index, fault, arena, history, &struck).await {
            Err(e)
                if !struck.get() && connect::lost_connection(&e) && Instant::now() < patience => {}
            result => return result,
        }
    }
}

/// One try at `fault`, in a session of its own; `has_struck` is set once it has.
async fn strike_once(
    index: usize,
    fault: TxnFault,
    arena: &Arena<'_>,
    history: &Mutex<History>,
    has_struck: &Cell<bool>,
) -> Result<()> {
    let work = arena.workload;
    let mut client = session(&work.db).await?;
    let customer = NEMESIS_CUSTOMERS + index as i64;
    let struck = |what: String| {
        has_struck.set(true);
        arena.faults.struck(index, what, Instant::now())
    };
    let record = |order: InsertedOrder, outcome: CommitOutcome| {
        let mut history = history.lock().expect("not poisoned");
        history.written.push(WrittenOrder {
            order,
            outcome,
            ended_at_ms: Some(writer::now_ms()),
        });
    };
    let hold = fault.hold();
    match fault {
        TxnFault::Idle { .. } => {
            let tx = client.transaction().await?;
            let xid: String = tx
                .query_one("SELECT pg_current_xact_id()::text", &[])
                .await?
                .get(0);
            struck(format!(
                "transaction {xid}, idle for {}",
                format_duration(hold)
            ));
            held(arena, hold).await;
            let _ = tx.rollback().await;
        }
        TxnFault::Rollback { .. } => {
            let tx = client.transaction().await?;
            let order = insert(&tx, customer, work).await?;
            struck(format!("{}, rolled back", order_words(&order)));
            // A session lost now ends the transaction the same way.
            let _ = tx.rollback().await;
            record(order, CommitOutcome::Failed);
        }
        TxnFault::SlowCommit { .. } => {
            let tx = client.transaction().await?;
            let order = insert(&tx, customer, work).await?;
            struck(format!(
                "{}, committed {} later",
                order_words(&order),
                format_duration(hold)
            ));
            // And not before a later event is delivered: then a relay that reads past the
            // largest id it delivered is past this one (a relay behind its backlog is not yet).
            if !held(arena, hold).await || !later_delivered(arena, history, &order).await {
                // The run ended first: it never committed.
                let _ = tx.rollback().await;
                record(order, CommitOutcome::Failed);
                return Ok(());
            }
            let committed = tx.commit().await.map_err(anyhow::Error::from);
            let outcome = match &committed {
                Ok(()) => CommitOutcome::Ok,
                Err(e) if connect::lost_connection(e) => CommitOutcome::Unknown,
                Err(_) => CommitOutcome::Failed,
            };
            record(order, outcome);
        }
        TxnFault::Prepared { .. } => {
            let gid = format!("{}_txn{index}", work.db.name);
            let tx = client.transaction().await?;
            // A transaction that notified cannot be prepared: the article's trigger keeps quiet.
            tx.batch_execute("SET LOCAL outbox_lab.notify = 'off'")
                .await?;
            let order = insert(&tx, customer, work).await?;
            if let Err(e) = tx
                .batch_execute(&format!("PREPARE TRANSACTION '{gid}'"))
                .await
            {
                let why = match e.code() {
                    // PostgreSQL's default: max_prepared_transactions = 0.
                    Some(c) if *c == SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE => {
                        "the server allows no prepared transactions (max_prepared_transactions \
                         = 0)"
                    }
                    // A trigger of the user's schema notified in it.
                    Some(c) if *c == SqlState::FEATURE_NOT_SUPPORTED => {
                        "its transaction notified (a trigger of your schema's NOTIFY), which \
                         PostgreSQL cannot PREPARE"
                    }
                    _ => return Err(e.into()),
                };
                arena.faults.not_reached(index, why.into());
                return Ok(());
            }
            // The session is out of its transaction now: what the wrapper would roll back is
            // the prepared transaction's, which only COMMIT or ROLLBACK PREPARED ends.
            drop(tx);
            struck(format!(
                "{}, prepared as '{gid}', committed {} later",
                order_words(&order),
                format_duration(hold)
            ));
            let in_time = held(arena, hold).await;
            // A new session: the server may have restarted meanwhile, which it survives.
            let finisher = session(&work.db).await?;
            let (end, outcome) = match in_time {
                true => ("COMMIT PREPARED", CommitOutcome::Ok),
                false => ("ROLLBACK PREPARED", CommitOutcome::Failed),
            };
            finisher.batch_execute(&format!("{end} '{gid}'")).await?;
            record(order, outcome);
        }
    }
    Ok(())
}

/// A session of the writer's role, made patiently (the server may be restarting).
async fn session(db: &Database) -> Result<Client> {
    connect::patiently(connect::RECONNECT_PATIENCE, async || {
        db.connect_as(TXN_APPLICATION_NAME).await
    })
    .await
}

/// An order of `customer` and its events, as the writer writes them.
async fn insert(
    tx: &tokio_postgres::Transaction<'_>,
    customer: i64,
    work: &TxnWorkload,
) -> Result<InsertedOrder> {
    writer::insert_order_with_events(tx, customer, work.events_per_order, &work.to).await
}

/// `order 12 (outbox ids 23-24)`.
fn order_words(order: &InsertedOrder) -> String {
    let ids: Vec<i64> = order.events.iter().map(|e| e.outbox_id).collect();
    match (ids.first(), ids.last()) {
        (Some(first), Some(last)) if first != last => {
            format!("order {} (outbox ids {first}-{last})", order.order_id)
        }
        (Some(id), _) => format!("order {} (outbox id {id})", order.order_id),
        _ => format!("order {}", order.order_id),
    }
}

/// How long a slow commit waits, past its hold, for a later event to be delivered: the
/// relays catching up on a backlog (a restart, the other nemeses) take seconds.
const LATER_DELIVERY_LIMIT: Duration = Duration::from_secs(15);
/// How often it looks.
const LATER_DELIVERY_POLL: Duration = Duration::from_millis(20);
/// How long after that delivery it commits.
const AFTER_LATER_DELIVERY: Duration = Duration::from_millis(200);

/// Waits until the consumer has received an event written after `order` (a larger outbox id),
/// at most [`LATER_DELIVERY_LIMIT`]; false if the run ended first.
async fn later_delivered(
    arena: &Arena<'_>,
    history: &Mutex<History>,
    order: &InsertedOrder,
) -> bool {
    let last = order.events.iter().map(|e| e.outbox_id).max().unwrap_or(0);
    let started = Instant::now();
    let mut consumer: Option<Client> = None;
    while started.elapsed() < LATER_DELIVERY_LIMIT {
        if *arena.over.borrow() {
            return false;
        }
        let later: Vec<uuid::Uuid> = {
            let history = history.lock().expect("not poisoned");
            let written = history.written.iter().flat_map(|w| &w.order.events);
            written
                .filter(|e| e.outbox_id > last)
                .map(|e| e.event_id)
                .collect()
        };
        if consumer.as_ref().is_none_or(|c| c.is_closed()) {
            consumer = arena.consumer_db.connect().await.ok();
        }
        if let (Some(consumer), false) = (&consumer, later.is_empty()) {
            let received = consumer.query_one(LATER_RECEIVED, &[&later]).await;
            if received.is_ok_and(|row| row.get::<_, bool>(0)) {
                // Committed plainly after it: the judge tells a skip from the writer's own
                // commits out of id order, 1 ms apart, by 50 ms (judge::record).
                tokio::time::sleep(AFTER_LATER_DELIVERY).await;
                return true;
            }
        }
        tokio::time::sleep(LATER_DELIVERY_POLL).await;
    }
    true
}

/// Whether the consumer has received one of `$1` (event ids).
const LATER_RECEIVED: &str = "
SELECT EXISTS (SELECT 1 FROM consumer.receipts
                WHERE event_id = ANY($1) AND NOT injected_fault)";

/// Holds for `hold`, or until the run is over; whether the whole hold passed.
async fn held(arena: &Arena<'_>, hold: Duration) -> bool {
    let mut over = arena.over.clone();
    tokio::select! {
        _ = tokio::time::sleep(hold) => true,
        _ = over.wait_for(|over| *over) => false,
    }
}

/// Ends the prepared transactions a run left in `client`'s database (a run cut short while one
/// was held): one left behind would hold the horizon, and its locks, for good.
pub async fn end_prepared(client: &Client) -> Result<()> {
    let left = client
        .query(
            "SELECT gid FROM pg_catalog.pg_prepared_xacts WHERE database = current_database()",
            &[],
        )
        .await?;
    for row in left {
        let gid: String = row.get(0);
        client
            .batch_execute(&format!("ROLLBACK PREPARED '{}'", gid.replace('\'', "''")))
            .await?;
    }
    Ok(())
}
