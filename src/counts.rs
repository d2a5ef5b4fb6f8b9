//! What happened, counted from the database with SQL, as the article counts it.

use anyhow::Result;
use tokio_postgres::{Client, Row};

/// Deliveries as the consumer saw them, and what is missing at the consumer.
pub const DELIVERIES: &str = "
SELECT (SELECT count(*) FROM consumer.receipts WHERE NOT injected_fault) AS received,
       (SELECT count(DISTINCT event_id) FROM consumer.receipts WHERE NOT injected_fault)
         AS distinct_events,
       (SELECT count(*) FROM consumer.shipments) AS shipments,
       (SELECT count(*) FROM (SELECT order_id FROM consumer.shipments
                               GROUP BY order_id HAVING count(*) > 1) twice)
         AS orders_shipped_twice,
       (SELECT count(*) - count(DISTINCT event_id) FROM consumer.shipments)
         AS duplicate_shipments,
       (SELECT count(*) FROM outbox o
         WHERE NOT EXISTS (SELECT 1 FROM consumer.receipts r
                            WHERE r.event_id = o.event_id AND NOT r.injected_fault)) AS lost";

/// The article's dual-write table.
pub const DUAL_WRITE: &str = "
SELECT (SELECT count(*) FROM orders) AS orders,
       (SELECT count(*) FROM consumer.shipments) AS shipments,
       (SELECT count(*) FROM consumer.shipments s
         WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.id::text = s.order_id))
         AS ghost_shipments,
       (SELECT count(*) FROM orders o
         WHERE NOT EXISTS (SELECT 1 FROM consumer.shipments s WHERE s.order_id = o.id::text))
         AS orders_without_shipment";

/// What one naive-app path left behind: its order (by customer) and its shipment (by event).
pub const DUAL_WRITE_PATH: &str = "
SELECT EXISTS (SELECT 1 FROM orders WHERE customer_id = $1) AS order_committed,
       EXISTS (SELECT 1 FROM consumer.shipments WHERE event_id = $2) AS shipment_created";

/// The article's `SELECT (SELECT count(*) FROM orders) AS orders, (...) AS outbox`.
pub const ORDERS_AND_OUTBOX: &str =
    "SELECT (SELECT count(*) FROM orders) AS orders, (SELECT count(*) FROM outbox) AS outbox";

/// The consumer's receipt log, as the article prints it.
pub const RECEIPT_LOG: &str = "
SELECT seq, order_id, outbox_id, received_at
  FROM consumer.receipts
 WHERE NOT injected_fault
 ORDER BY seq";

/// Every try, answered or not, with the gap since the previous try of the same row.
pub const TRIES: &str = "
SELECT seq, outbox_id, received_at,
       CASE WHEN injected_fault THEN 'HTTP 500 (injected)' ELSE '200' END AS reply,
       (EXTRACT(EPOCH FROM received_at - lag(received_at)
          OVER (PARTITION BY outbox_id ORDER BY seq)) * 1000)::float8 AS gap_ms
  FROM consumer.receipts
 ORDER BY seq";

pub const SHIPMENTS_PER_ORDER: &str = "
SELECT order_id, count(*) AS shipments
  FROM consumer.shipments
 GROUP BY order_id
 ORDER BY length(order_id), order_id";

/// The outbox as the article shows it after the relay crash.
pub const OUTBOX_PUBLISHED: &str = "
SELECT id, aggregate_id, published_at IS NOT NULL AS published FROM outbox ORDER BY id";

/// The outbox as the article shows it after retries.
pub const OUTBOX_ATTEMPTS: &str = "
SELECT id, attempts, last_error, published_at, next_attempt_at FROM outbox ORDER BY id";

/// Outbox ids the consumer received (answered 200) after receipt `seq`.
pub const RECEIVED_AFTER: &str = "
SELECT outbox_id FROM consumer.receipts WHERE seq > $1 AND NOT injected_fault ORDER BY seq";

/// The highest receipt so far (0 when none).
pub const LAST_RECEIPT: &str = "SELECT COALESCE(max(seq), 0) FROM consumer.receipts";

/// Committed outbox rows the consumer never received.
pub const LOST_IDS: &str = "
SELECT o.id FROM outbox o
 WHERE NOT EXISTS (SELECT 1 FROM consumer.receipts r
                    WHERE r.event_id = o.event_id AND NOT r.injected_fault)
 ORDER BY o.id";

pub async fn one_row(client: &Client, sql: &str) -> Result<Row> {
    Ok(client.query_one(sql, &[]).await?)
}

/// A single bigint column as a list.
pub async fn ids(
    client: &Client,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<Vec<i64>> {
    Ok(client
        .query(sql, params)
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

/// The order in which the consumer received events, as `order<aggregate>#<n>` labels (n: the
/// event's place within its aggregate, by outbox id).
pub const RECEIVE_SEQUENCE: &str = "
SELECT COALESCE(string_agg('order' || o.aggregate_id || '#' || o.n, ',' ORDER BY r.seq), '')
  FROM consumer.receipts r
  JOIN (SELECT id, row_number() OVER (PARTITION BY aggregate_id ORDER BY id) AS n, aggregate_id
          FROM outbox) o ON o.id = r.outbox_id
 WHERE NOT r.injected_fault";

/// Per aggregate, how often the consumer received an event after a later one of the same
/// aggregate (its outbox id went backwards), and how many aggregates that happened to.
pub const REVERSALS: &str = "
SELECT count(*) AS reversals, count(DISTINCT order_id) AS orders_out_of_order
  FROM (SELECT order_id, outbox_id,
               lag(outbox_id) OVER (PARTITION BY order_id ORDER BY seq) AS previous_id
          FROM consumer.receipts
         WHERE NOT injected_fault) r
 WHERE outbox_id < previous_id";

/// Commit-to-receipt latency per event as the article measures it: the consumer's received_at
/// minus the outbox row's created_at (one server clock for both).
pub const LATENCIES_MS: &str = "
SELECT (EXTRACT(EPOCH FROM r.received_at - o.created_at) * 1000)::float8
  FROM consumer.receipts r
  JOIN outbox o ON o.event_id = r.event_id
 WHERE NOT r.injected_fault
 ORDER BY r.seq";

/// Transactions committed in this database so far (the server's statistics).
pub const XACT_COMMIT: &str =
    "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()";

/// Throughput of the writers: orders per second between the first and the last order.
pub const ORDERS_PER_S: &str = "
SELECT count(*) / GREATEST(EXTRACT(EPOCH FROM max(created_at) - min(created_at)), 0.001)::float8
  FROM orders";

pub const RECEIVED: &str = "SELECT count(*) FROM consumer.receipts WHERE NOT injected_fault";
pub const PUBLISHED: &str = "SELECT count(*) FROM outbox WHERE published_at IS NOT NULL";

pub async fn count(client: &Client, sql: &str) -> Result<i64> {
    Ok(client.query_one(sql, &[]).await?.get(0))
}
