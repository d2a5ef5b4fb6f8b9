//! The tables of the article: the business table `orders`, the `outbox`, and the consumer's
//! schema (receipt log, processed events, shipments). Applied to each fresh database.

use anyhow::{Context, Result};
use tokio_postgres::Client;

/// The article's tables, column for column, plus the consumer's receipt log that the article
/// printed as "受信ログ".
pub const CREATE: &str = r#"
CREATE TABLE orders (
  id          bigserial   PRIMARY KEY,
  customer_id bigint      NOT NULL,
  amount      numeric     NOT NULL,
  created_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE outbox (
  id              bigserial   PRIMARY KEY,
  event_id        uuid        NOT NULL DEFAULT gen_random_uuid(),  -- idempotency key
  aggregate_type  text        NOT NULL,   -- e.g. orders (names the topic)
  aggregate_id    text        NOT NULL,   -- e.g. the order id (the unit of ordering)
  event_type      text        NOT NULL,   -- e.g. OrderCreated
  payload         jsonb       NOT NULL,
  created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
  published_at    timestamptz,            -- NULL = not delivered yet
  attempts        integer     NOT NULL DEFAULT 0,
  next_attempt_at timestamptz NOT NULL DEFAULT clock_timestamp(),
  last_error      text
);
-- only the undelivered rows: the relay's fetch stays small however much is published
CREATE INDEX outbox_unpublished_idx ON outbox (id) WHERE published_at IS NULL;

CREATE SCHEMA consumer;

-- every HTTP request that reached the consumer, answered or not
CREATE TABLE consumer.receipts (
  seq            bigserial   PRIMARY KEY,
  event_id       uuid        NOT NULL,
  outbox_id      bigint,               -- NULL when the sender has no outbox (dual write)
  order_id       text        NOT NULL,
  event_type     text        NOT NULL,
  injected_fault boolean     NOT NULL, -- answered 500 on purpose, nothing processed
  received_at    timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE consumer.processed_events (
  event_id     uuid PRIMARY KEY,
  processed_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- the side effect: one shipment instruction per processed event
CREATE TABLE consumer.shipments (
  id         bigserial   PRIMARY KEY,
  order_id   text        NOT NULL,
  event_id   uuid        NOT NULL,
  created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
"#;

/// The gap-safe watermark of watermark-gap: each row remembers the transaction that wrote it.
pub const ADD_WRITER_XID: &str =
    "ALTER TABLE outbox ADD COLUMN xid xid8 NOT NULL DEFAULT pg_current_xact_id()";

/// Where explore's stored watermark relay keeps its position across restarts.
pub const ADD_RELAY_WATERMARK: &str =
    "CREATE TABLE relay_watermark (relay text PRIMARY KEY, last_seen bigint NOT NULL)";

/// Empties every table and restarts the ids, so that explore reuses one database for many runs
/// (a schedule costs a TRUNCATE instead of a CREATE DATABASE). The lock timeout bounds the wait
/// for a killed child's session, which the server ends a moment after the process.
pub const RESET: &str = "
SET lock_timeout = '5s';
TRUNCATE orders, outbox, relay_watermark,
         consumer.receipts, consumer.processed_events, consumer.shipments
RESTART IDENTITY";

pub async fn create(client: &Client) -> Result<()> {
    client
        .batch_execute(CREATE)
        .await
        .context("cannot create the schema")
}
