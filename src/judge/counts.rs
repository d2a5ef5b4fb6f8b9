//! What happened, counted from the database with SQL, as the article counts it. Figures that
//! speak of ghosts, lost events, duplicates or reordering are counted over the one definition
//! of each in [`super::invariants`], never redefined here.

use anyhow::{Context, Result};
use tokio_postgres::{Client, Row};

use super::invariants::{duplicates, ghosts, lost, out_of_order, pending};
use crate::report::Table;

/// Deliveries as the consumer saw them (receipts), and what the invariants say of them:
/// orders with an event shipped more than once, the shipments beyond each event's first, and
/// the events lost.
pub const DELIVERIES: &str = concat!(
    "
WITH duplicate AS (",
    duplicates!(),
    "),
lost AS (",
    lost!(),
    ")
SELECT (SELECT count(*) FROM consumer.receipts WHERE NOT injected_fault) AS received,
       (SELECT count(DISTINCT event_id) FROM consumer.receipts WHERE NOT injected_fault)
         AS distinct_events,
       (SELECT count(*) FROM consumer.shipments) AS shipments,
       (SELECT count(DISTINCT order_id) FROM duplicate) AS orders_shipped_twice,
       (SELECT COALESCE(sum(shipments - 1), 0)::bigint FROM duplicate) AS duplicate_shipments,
       (SELECT count(*) FROM lost) AS lost"
);
/// The columns of [`DELIVERIES`], as scenarios report them.
pub const DELIVERY_FIGURES: [&str; 6] = [
    "received",
    "distinct_events",
    "shipments",
    "orders_shipped_twice",
    "duplicate_shipments",
    "lost",
];

/// The consumer kinds side by side (naive vs idempotent): a row per kind with its name, the
/// scenario's own figures, then columns of its [`DELIVERIES`] row.
pub struct ConsumerComparison {
    table: Table,
    /// Headers of the scenario's own figures come first.
    own: usize,
    /// The [`DELIVERIES`] columns shown after them.
    deliveries: Vec<&'static str>,
}

impl ConsumerComparison {
    /// A table headed `consumer`, the `own` figures' headers, then the `deliveries` columns'
    /// names (see [`ConsumerComparison::heading`]).
    pub fn new(title: &str, own: &[&str], deliveries: &[&'static str]) -> ConsumerComparison {
        let columns = [&["consumer"], own, deliveries].concat();
        ConsumerComparison {
            table: Table::new(title, &columns),
            own: own.len(),
            deliveries: deliveries.to_vec(),
        }
    }

    /// Heads the [`DELIVERIES`] column `column` with `heading` instead of its name.
    pub fn heading(mut self, column: &str, heading: &str) -> ConsumerComparison {
        if let Some(i) = self.deliveries.iter().position(|c| *c == column) {
            self.table.columns[1 + self.own + i] = heading.to_string();
        }
        self
    }

    /// The row of `consumer`: its own figures, then from its [`DELIVERIES`] row.
    pub fn push(&mut self, consumer: &str, own: Vec<String>, deliveries: &Row) {
        let counted = self
            .deliveries
            .iter()
            .map(|c| deliveries.get::<_, i64>(*c).to_string());
        let row = std::iter::once(consumer.to_string())
            .chain(own)
            .chain(counted)
            .collect();
        self.table.push(row);
    }

    pub fn table(self) -> Table {
        self.table
    }
}

/// The article's dual-write table: ghost shipments, and the orders (the dual write has no
/// outbox row) whose event was lost.
pub const DUAL_WRITE: &str = concat!(
    "
WITH ghost AS (",
    ghosts!(),
    "),
lost AS (",
    lost!(),
    ")
SELECT (SELECT count(*) FROM orders) AS orders,
       (SELECT count(*) FROM consumer.shipments) AS shipments,
       (SELECT count(*) FROM ghost) AS ghost_shipments,
       (SELECT count(*) FROM lost WHERE outbox_id IS NULL) AS orders_without_shipment"
);

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

/// The outbox ids of the lost events.
pub const LOST_IDS: &str = concat!(
    "SELECT outbox_id FROM (",
    lost!(),
    ") lost WHERE outbox_id IS NOT NULL ORDER BY outbox_id"
);

/// claim-vs-lock: relay 0 held the first $1 rows and died right after delivering $2 of them.
/// From that last delivery (its crash point follows it at once) until every row of its batch had
/// reached the consumer again (the second receipt of the rows it had sent, the first of the
/// others): the recovery, on the server's clock; and how many younger rows got there first.
pub const REDELIVERY_AFTER_CRASH: &str = "
WITH batch AS (
  SELECT id, row_number() OVER (ORDER BY id) AS n FROM outbox ORDER BY id LIMIT $1),
deliveries AS (
  SELECT b.n, r.received_at,
         row_number() OVER (PARTITION BY r.outbox_id ORDER BY r.seq) AS nth
    FROM consumer.receipts r
    JOIN batch b ON b.id = r.outbox_id
   WHERE NOT r.injected_fault),
crash AS (
  SELECT received_at AS at FROM deliveries WHERE n = $2 AND nth = 1),
back AS (
  SELECT max(received_at) AS at, count(*) AS redelivered
    FROM deliveries
   WHERE (n <= $2 AND nth = 2) OR (n > $2 AND nth = 1))
SELECT (EXTRACT(EPOCH FROM back.at - crash.at) * 1000)::float8 AS recovery_ms,
       back.redelivered,
       (SELECT count(*) FROM consumer.receipts r
         WHERE NOT r.injected_fault
           AND r.outbox_id NOT IN (SELECT id FROM batch)
           AND r.received_at < back.at) AS overtaken
  FROM crash, back";

/// The relays' sessions right now (relay children name them, see `RELAY_APPLICATION_NAME`): the
/// age of their open transactions, and whether they hold back the vacuum horizon, with a
/// snapshot (`backend_xmin`) or a transaction id (`backend_xid`), either of which does.
pub const RELAY_SESSIONS: &str = "
SELECT COALESCE(max(EXTRACT(EPOCH FROM clock_timestamp() - xact_start) * 1000), 0)::float8
         AS xact_ms,
       COALESCE(bool_or(backend_xmin IS NOT NULL), false) AS xmin_held,
       COALESCE(bool_or(backend_xid IS NOT NULL), false) AS xid_held,
       COALESCE(bool_or(backend_xmin IS NOT NULL OR backend_xid IS NOT NULL), false)
         AS horizon_held,
       count(*) AS sessions
  FROM pg_stat_activity
 WHERE datname = current_database() AND application_name LIKE $1";

/// Row versions written to the outbox by UPDATE, as flushed by sessions that have ended.
pub const OUTBOX_UPDATES: &str =
    "SELECT n_tup_upd FROM pg_stat_user_tables WHERE relid = to_regclass('outbox')";

/// Makes this session's own counts (rows inserted, deleted) visible in pg_stat_user_tables
/// right after the statement (PostgreSQL 15+; counts are otherwise flushed about once a second).
pub const FLUSH_OWN_STATS: &str = "SELECT pg_stat_force_next_flush()";

/// A table's size on disk and its live and dead tuples (after [`FLUSH_OWN_STATS`]).
pub const TABLE_STORAGE: &str = "
SELECT pg_relation_size(relid) AS relation_bytes,
       pg_total_relation_size(relid) AS total_bytes,
       pg_size_pretty(pg_relation_size(relid)) AS relation_size,
       pg_size_pretty(pg_total_relation_size(relid)) AS total_size,
       n_live_tup,
       n_dead_tup
  FROM pg_stat_user_tables
 WHERE relid = to_regclass($1)";

/// Dead tuples left in the partitions of $1, as pg_stat_user_tables counts them.
pub const PARTITION_DEAD_TUPLES: &str = "
SELECT COALESCE(sum(n_dead_tup), 0)::bigint
  FROM pg_stat_user_tables
 WHERE relid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = to_regclass($1))";

/// A relation's size on disk (table or index).
pub const RELATION_BYTES: &str = "SELECT pg_relation_size(to_regclass($1))";

/// The size and the live and dead tuples of `table`, this session's own changes included.
pub async fn table_storage(client: &Client, table: &str) -> Result<Row> {
    client
        .batch_execute(FLUSH_OWN_STATS)
        .await
        .context("cannot flush statistics (pg_stat_force_next_flush needs PostgreSQL 15+)")?;
    Ok(client.query_one(TABLE_STORAGE, &[&table]).await?)
}

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

/// Per aggregate, how often an event took effect right after a later one of the same
/// aggregate (the order invariant's reversals), and how many aggregates that happened to.
pub const REVERSALS: &str = concat!(
    "SELECT count(*) AS reversals, count(DISTINCT order_id) AS orders_out_of_order FROM (",
    out_of_order!(),
    ") reversal"
);

/// Commit-to-receipt latency per event as the article measures it: the consumer's received_at
/// minus the outbox row's created_at (one server clock for both).
pub const LATENCIES_MS: &str = "
SELECT r.seq, (EXTRACT(EPOCH FROM r.received_at - o.created_at) * 1000)::float8 AS latency_ms
  FROM consumer.receipts r
  JOIN outbox o ON o.event_id = r.event_id
 WHERE NOT r.injected_fault
 ORDER BY r.seq";

/// Transactions committed in this database so far (the server's statistics).
pub const XACT_COMMIT: &str =
    "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()";

/// Look-ups at the outbox table so far, sequential or by index (the server's statistics): a
/// relay's poll is one look-up in one transaction; ANALYZE and VACUUM count none.
pub const OUTBOX_LOOKUPS: &str = "
SELECT (COALESCE(seq_scan, 0) + COALESCE(idx_scan, 0))::bigint
  FROM pg_stat_user_tables WHERE relid = 'outbox'::regclass";

/// Sessions of this database waiting for the lock a notifying COMMIT takes (a lock on database
/// object 0, held until the commit ends): notifying commits go one at a time.
pub const WAITING_TO_NOTIFY: &str = "
SELECT count(*) FROM pg_stat_activity
 WHERE datname = current_database() AND wait_event_type = 'Lock' AND wait_event = 'object'";

/// Throughput of the writers: orders per second between the first and the last order.
pub const ORDERS_PER_S: &str = "
SELECT count(*) / GREATEST(EXTRACT(EPOCH FROM max(created_at) - min(created_at)), 0.001)::float8
  FROM orders";

/// Deliveries the relay counted as failed: every try raises `attempts`, the successful one too.
pub const RELAY_FAILURES: &str = "
SELECT (COALESCE(sum(attempts), 0) - count(*) FILTER (WHERE published_at IS NOT NULL))::bigint
  FROM outbox";

/// Whether every outbox row has taken effect at the consumer: none is (yet) lost.
pub const ALL_RECEIVED: &str = concat!(
    "SELECT NOT EXISTS (SELECT 1 FROM (",
    lost!(),
    ") lost WHERE outbox_id IS NOT NULL)"
);

/// Whether the relay has marked every outbox row published: nothing is pending.
pub const ALL_PUBLISHED: &str = concat!("SELECT NOT EXISTS (", pending!(), ")");

/// Whether the consumer has received (answered 200) at least $1 deliveries.
pub const RECEIVED_AT_LEAST: &str =
    "SELECT count(*) >= $1 FROM consumer.receipts WHERE NOT injected_fault";

/// Whether a relay child (its session named `outbox-lab relay NAME`, pattern $1) is ready: its
/// session has finished a first statement and waits for the next. That first statement is the
/// NOTIFY relay's LISTEN, so from then on no commit's notification is missed; the polling
/// relay is ready once connected. (A fresh session shows an empty `query`.)
pub const RELAY_READY: &str = "
SELECT count(*) > 0 FROM pg_stat_activity
 WHERE datname = current_database() AND application_name LIKE $1
   AND state = 'idle' AND query <> ''";

/// Events delivered whose outbox row no longer exists (the Debezium-style outbox deletes them).
pub const DELIVERED_WITHOUT_ROW: &str = "
SELECT count(DISTINCT r.event_id) FROM consumer.receipts r
 WHERE NOT r.injected_fault
   AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.event_id = r.event_id)";

/// Orders without an outbox row (their rows deleted as written) whose event was lost.
pub const ORDERS_WITHOUT_EVENT: &str = concat!(
    "SELECT count(*) FROM (",
    lost!(),
    ") lost WHERE outbox_id IS NULL"
);

pub const OUTBOX_ROWS: &str = "SELECT count(*) FROM outbox";

pub const RECEIVED: &str = "SELECT count(*) FROM consumer.receipts WHERE NOT injected_fault";
pub const PUBLISHED: &str = "SELECT count(*) FROM outbox WHERE published_at IS NOT NULL";
/// The backlog: outbox rows the relays still owe (see [`super::invariants::PENDING`]).
pub const UNPUBLISHED: &str = concat!("SELECT count(*) FROM (", pending!(), ") pending");

pub async fn count(client: &Client, sql: &str) -> Result<i64> {
    Ok(client.query_one(sql, &[]).await?.get(0))
}

/// Each delivery's times on the server's clock, in microseconds since the epoch: the outbox
/// row's INSERT and the consumer's receipt, with the row's ids (notify-latency sets the
/// writer's and the relay's own times beside them).
pub const RECEIPT_TIMES_US: &str = "
SELECT r.seq, o.id AS outbox_id, o.aggregate_id AS order_id,
       (EXTRACT(EPOCH FROM o.created_at) * 1000000)::bigint AS inserted_us,
       (EXTRACT(EPOCH FROM r.received_at) * 1000000)::bigint AS received_us
  FROM consumer.receipts r
  JOIN outbox o ON o.event_id = r.event_id
 WHERE NOT r.injected_fault
 ORDER BY r.seq";

/// The server's clock, in microseconds since the epoch.
pub const SERVER_CLOCK_US: &str =
    "SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::bigint";
