//! The tables of the article: the business table `orders`, the `outbox`, and the consumer's
//! schema (receipt log, processed events, shipments). Applied to each fresh database.

use anyhow::{Context, Result};
use tokio_postgres::Client;

/// The article's tables, column for column: the business table and the outbox.
pub const CREATE_OUTBOX: &str = r#"
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
"#;

/// The consumer's side (another service's database, in production): the receipt log the
/// article printed as "受信ログ", the processed events, the shipments; and where the Kafka
/// consumer is in its topic.
pub const CREATE_CONSUMER: &str = r#"
CREATE SCHEMA consumer;

-- every delivery the consumer processed (in the transaction of its side effect), and every
-- request it answered with an injected fault
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

-- the Kafka consumer's place in each partition: the next offset to read, written after each
-- batch's transaction (killed in between, it reads that batch again, as a consumer group
-- committing its offsets after processing does)
CREATE TABLE consumer.kafka_offsets (
  topic       text   NOT NULL,
  partition   int    NOT NULL,
  next_offset bigint NOT NULL,
  PRIMARY KEY (topic, partition)
);
"#;

/// Empties the outbox and the consumer's tables between runs on one database.
pub const RESET: &str = "
TRUNCATE outbox, orders, consumer.receipts, consumer.processed_events, consumer.shipments,
  consumer.kafka_offsets
RESTART IDENTITY";

/// Drops everything a run made (the article's tables, the consumer's, the judge's, and whatever
/// a relay of the user's created, in `public` or in schemas of its own), for a run that starts
/// from the schema files alone. Only ever run in a database of the run's own. With nothing but
/// `pg_catalog` on the search path meanwhile, so that nothing a relay made is called; then
/// `public` alone (no `$user` schema a relay may have made shadows a table).
pub const RECREATE: &str = r#"
SET search_path = pg_catalog;
DO $$
DECLARE
  made name;
BEGIN
  FOR made IN SELECT nspname FROM pg_namespace
               WHERE nspname NOT IN ('public', 'information_schema')
                 AND nspname NOT LIKE 'pg\_%'
  LOOP
    EXECUTE format('DROP SCHEMA %I CASCADE', made);
  END LOOP;
END $$;
DROP SCHEMA public CASCADE;
CREATE SCHEMA public;
SET search_path = public"#;

/// Where explore's stored watermark relay keeps its position across restarts.
pub const ADD_RELAY_WATERMARK: &str =
    "CREATE TABLE relay_watermark (relay text PRIMARY KEY, last_seen bigint NOT NULL)";

/// [`RESET`] for the watermark table, where it exists.
pub const RESET_RELAY_WATERMARK: &str = "TRUNCATE relay_watermark";

/// The gap-safe watermark of watermark-gap: each row remembers the transaction that wrote it.
pub const ADD_WRITER_XID: &str =
    "ALTER TABLE outbox ADD COLUMN xid xid8 NOT NULL DEFAULT pg_current_xact_id()";

/// The channel the relay LISTENs on.
pub const NOTIFY_CHANNEL: &str = "outbox_new";

/// The article's statement trigger: one notification per inserting statement, delivered at
/// COMMIT (and only then), so a woken relay never finds an uncommitted row. A transaction that
/// will be PREPAREd may not NOTIFY (PostgreSQL refuses to prepare it): it says so with
/// `outbox_lab.notify = off`, and its rows wake no relay (one that also polls finds them).
pub const NOTIFY_TRIGGER: &str = "
CREATE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF current_setting('outbox_lab.notify', true) IS DISTINCT FROM 'off' THEN
    PERFORM pg_notify('outbox_new', '');
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER outbox_notify_trg AFTER INSERT ON outbox
  FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();";

pub const DROP_NOTIFY_TRIGGER: &str = "
DROP TRIGGER outbox_notify_trg ON outbox;
DROP FUNCTION outbox_notify();";

/// The storage scenarios measure what each statement leaves behind (dead tuples, dead index
/// entries): autovacuum must not clean up in between, at a moment of its choosing.
pub const NO_AUTOVACUUM: &str = "ALTER TABLE outbox SET (autovacuum_enabled = off)";

/// The claim design of claim-vs-lock: a lease on each row instead of a lock.
pub const ADD_CLAIM_COLUMNS: &str =
    "ALTER TABLE outbox ADD COLUMN claimed_at timestamptz, ADD COLUMN claimed_by text";

/// Fencing tokens (explore's claim-lease-fenced): every claim takes the next number of a
/// sequence, the relay marks only rows still under its token, and the consumer keeps per
/// aggregate the highest token it accepted, refusing deliveries under an older one.
pub const ADD_FENCING: &str = "
CREATE SEQUENCE outbox_claim_token;
ALTER TABLE outbox ADD COLUMN claim_token bigint;
CREATE TABLE consumer.fences (
  aggregate_id text   PRIMARY KEY,
  token        bigint NOT NULL  -- the highest claim token accepted for the aggregate
);";

/// [`RESET`] for the consumer's fences, where they exist.
pub const RESET_FENCES: &str = "TRUNCATE consumer.fences";

/// Both sides, in a scenario's fresh database.
pub async fn create(client: &Client) -> Result<()> {
    client
        .batch_execute(CREATE_OUTBOX)
        .await
        .context("cannot create the outbox tables")?;
    client
        .batch_execute(CREATE_CONSUMER)
        .await
        .context("cannot create the consumer's tables")
}

/// Whether a table exists (`schema.table` or a table on the search path).
pub async fn has_table(client: &Client, name: &str) -> Result<bool> {
    let row = client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&name])
        .await?;
    Ok(row.get(0))
}

/// Whether the NOTIFY trigger is installed on the outbox.
pub async fn has_notify_trigger(client: &Client) -> Result<bool> {
    let exists = "SELECT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'outbox_notify_trg')";
    Ok(client.query_one(exists, &[]).await?.get(0))
}
