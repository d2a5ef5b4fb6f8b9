//! The writer: the business transaction that creates an order and, done right, its outbox row in
//! the same transaction; done wrong (dual write), sends the event itself.

use std::time::Duration;

use anyhow::Result;
use serde_json::json;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Transaction};
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
/// aggregate id, the aggregate type, the event type, the payload.
pub const INSERT_SQL_TYPES: [Type; 5] =
    [Type::UUID, Type::TEXT, Type::TEXT, Type::TEXT, Type::JSONB];

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
    let order_id = insert_order_with_events(&tx, customer_id, events_per_order, &outbox).await?;
    crash::point(CrashPoint::WriterAfterInsertBeforeCommit);
    end(tx, ending).await?;
    Ok(order_id)
}

/// Where an order's events are written.
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

/// The order and its events, in the caller's transaction, where `to` says.
pub async fn insert_order_with_events(
    tx: &Transaction<'_>,
    customer_id: i64,
    events_per_order: u32,
    to: &EventsTo,
) -> Result<i64> {
    let order_id: i64 = tx.query_one(INSERT_ORDER, &[&customer_id]).await?.get(0);
    let aggregate_id = order_id.to_string();
    let theirs = match to {
        EventsTo::Statement(sql) => Some(tx.prepare_typed(sql, &INSERT_SQL_TYPES).await?),
        _ => None,
    };
    let mut outbox_ids: Vec<i64> = Vec::with_capacity(events_per_order as usize);
    for n in 1..=events_per_order {
        let mut payload = order_payload(order_id);
        payload["seq"] = n.into();
        let event_type = event_type(n);
        let row = tx
            .query_one(INSERT_OUTBOX, &[&aggregate_id, &event_type, &payload])
            .await?;
        outbox_ids.push(row.get("id"));
        if let Some(statement) = &theirs {
            let event_id: Uuid = row.get("event_id");
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] =
                [&event_id, &aggregate_id, &"orders", &event_type, &payload];
            tx.execute(statement, &params).await?;
        }
    }
    if !matches!(to, EventsTo::Outbox) {
        tx.execute(DELETE_OUTBOX_ROWS, &[&outbox_ids]).await?;
    }
    Ok(order_id)
}

/// Orders written in pairs by two sessions whose transactions overlap, as on any busy server:
/// the second order of a pair commits first and the first `overlap` later (a slow request), so
/// outbox ids do not become visible in id order. Each pair takes at least `pace`. Each order
/// whose COMMIT succeeded is told to `committed` at once (its id, its customer).
#[allow(clippy::too_many_arguments)]
pub async fn write_overlapping_pairs(
    slow: &mut Client,
    fast: &mut Client,
    customers: &[i64],
    events_per_order: u32,
    to: &EventsTo,
    overlap: Duration,
    pace: Duration,
    committed: &mut dyn FnMut(i64, i64),
) -> Result<()> {
    for pair in customers.chunks(2) {
        let paced = tokio::time::sleep(pace);
        let slow_tx = slow.transaction().await?;
        let first = insert_order_with_events(&slow_tx, pair[0], events_per_order, to).await?;
        if let Some(&customer) = pair.get(1) {
            let fast_tx = fast.transaction().await?;
            let second = insert_order_with_events(&fast_tx, customer, events_per_order, to).await?;
            crash::point(CrashPoint::WriterAfterInsertBeforeCommit);
            fast_tx.commit().await?;
            committed(second, customer);
            tokio::time::sleep(overlap).await;
        }
        crash::point(CrashPoint::WriterAfterInsertBeforeCommit);
        slow_tx.commit().await?;
        committed(first, pair[0]);
        paced.await;
    }
    Ok(())
}

/// How the explore writer tells the lab an order's COMMIT succeeded, in its log: the
/// acknowledged orders a failover may lose ([`acknowledged_in`] reads them back). The
/// customer tells the order apart from a later one given the same id (a promoted standby
/// hands out again the ids it never received).
pub fn acknowledged_line(order_id: i64, customer_id: i64) -> String {
    format!("order {order_id} of customer {customer_id}{ACKNOWLEDGED}")
}

const ACKNOWLEDGED: &str = " committed, acknowledged";

/// The orders a writer's log says were acknowledged ([`acknowledged_line`]), in order: (order
/// id, customer id).
pub fn acknowledged_in(log: &str) -> impl Iterator<Item = (i64, i64)> + '_ {
    log.lines().filter_map(|line| {
        let line = line.split_once("] ").map_or(line, |(_, rest)| rest);
        let order = line.strip_suffix(ACKNOWLEDGED)?.strip_prefix("order ")?;
        let (order, customer) = order.split_once(" of customer ")?;
        Some((order.parse().ok()?, customer.parse().ok()?))
    })
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

    /// The lab reads back, from the writer's log among its other lines, exactly the orders it
    /// said were acknowledged.
    #[test]
    fn acknowledged_orders_round_trip_through_the_log() {
        let log = format!(
            "[app] {}\n[app] customer=3 sending\n[app] {}\norder 9 committed\n",
            acknowledged_line(12, 5),
            acknowledged_line(40, 17)
        );
        assert_eq!(
            acknowledged_in(&log).collect::<Vec<_>>(),
            [(12, 5), (40, 17)]
        );
    }
}
