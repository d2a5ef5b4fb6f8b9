//! The judge's own record of a run whose relays are strangers' (`outbox-lab verify`, the zoo),
//! so that the verdict rests on nothing a relay can touch.
//!
//! What was written is what the writer itself told the lab as it happened (its log:
//! [`WrittenOrder`], each order's events and how its COMMIT ended), kept outside every database.
//! After the run it goes into the judge's schema (`judge`), in the consumer's database, which no
//! relay may connect to, with a copy of the application's orders and outbox as the run left
//! them (read with nothing on the search path but `pg_catalog`, so that nothing a relay made is
//! called). The judged tables `judge.orders` and `judge.outbox` are built from them, and every
//! invariant reads those, beside the consumer's own tables:
//! - an order committed if the database has it (whatever the writer was told), or if the writer
//!   was told it committed and no failover took it (then it is `acknowledged-lost`, the
//!   database's loss);
//! - the outbox is the committed orders' events as the writer wrote them; an event's row a relay
//!   deleted counts as published (a relay may delete what it is done with: Debezium's
//!   insert-then-delete, many libraries' cleanup), one it kept says whether it marked it;
//! - a row a relay rewrote (its event id, aggregate, type) is a `lost` event, named so; a
//!   shipment of an event the writer never wrote, or wrote in a transaction that did not
//!   commit, is a `ghost`, also where its order id names a committed order (a relay's forgery;
//!   an id a promoted standby gave again).
//!
//! The writer's acknowledged orders are read back against the database after the run: an
//! order it was told committed and that is gone (a failover lost it) is `acknowledged-lost`.
//!
//! It also owns the check that the user's DDL (`--schema`) left outbox-lab's tables usable:
//! every statement the writer and the judge run on them still prepares.

use anyhow::{Context, Result};
use futures_util::{pin_mut, SinkExt, TryStreamExt};
use tokio_postgres::Client;
use uuid::Uuid;

use crate::outbox::writer::{self, WrittenOrder};

/// The judge's schema in the consumer's database, made anew with it for every run.
pub const JUDGE_TABLES: &str = "
CREATE SCHEMA judge;
-- what the writer told: every event of every order, and how the order's COMMIT ended
CREATE TABLE judge.written (
  order_id bigint NOT NULL, customer_id bigint NOT NULL, outbox_id bigint NOT NULL,
  event_id uuid NOT NULL, event_type text NOT NULL, outcome text NOT NULL,
  ended_at timestamptz);  -- when the writer knew how its COMMIT ended
-- the application's rows as the run left them
CREATE TABLE judge.app_orders (id bigint, customer_id bigint, committed_at timestamptz);
CREATE TABLE judge.app_outbox (
  id bigint, event_id uuid, aggregate_id text, event_type text,
  created_at timestamptz, published_at timestamptz);
-- what the invariants read: the committed orders, and their events as written
CREATE TABLE judge.orders (id bigint PRIMARY KEY, customer_id bigint, committed_at timestamptz);
CREATE TABLE judge.outbox (
  id bigint PRIMARY KEY, event_id uuid NOT NULL, aggregate_id text NOT NULL,
  event_type text NOT NULL, created_at timestamptz, published_at timestamptz);";

/// The judge's sessions read its own tables first (and the consumer's by their schema).
pub const JUDGE_SEARCH_PATH: &str = "SET search_path = judge";

/// The application's rows the judge copies, read where nothing a relay made is on the path.
const READ_APPLICATION: [(&str, &str); 2] = [
    (
        "judge.app_orders",
        "SELECT id, customer_id,
                CASE WHEN current_setting('track_commit_timestamp')::bool
                     THEN pg_xact_commit_timestamp(xmin) END
           FROM public.orders",
    ),
    (
        "judge.app_outbox",
        "SELECT id, event_id, aggregate_id, event_type, created_at, published_at
           FROM public.outbox",
    ),
];

/// The writer's record (`$1`..`$7`, one array element per event; `$7` ms since the epoch).
const INSERT_WRITTEN: &str = "
INSERT INTO judge.written
SELECT order_id, customer_id, outbox_id, event_id, event_type, outcome,
       to_timestamp(ended_ms / 1000.0)
  FROM unnest($1::bigint[], $2::bigint[], $3::bigint[], $4::uuid[], $5::text[], $6::text[],
              $7::bigint[])
       AS w(order_id, customer_id, outbox_id, event_id, event_type, outcome, ended_ms)";

/// The committed orders (`$1`: the run failed over, so a COMMIT the writer saw succeed may be
/// gone), each committed when the writer was told (on the machine's clock: not the server's,
/// which a clock nemesis may step), or, where it was never told, when the server stamped it.
/// An order id a promoted standby gave again is the order the database has.
const JUDGED_ORDERS: &str = "
INSERT INTO judge.orders
SELECT DISTINCT ON (w.order_id) w.order_id, w.customer_id,
       coalesce(w.ended_at, a.committed_at)
  FROM judge.written w
  LEFT JOIN judge.app_orders a ON a.id = w.order_id AND a.customer_id = w.customer_id
 WHERE a.id IS NOT NULL OR (w.outcome = 'ok' AND NOT $1::bool)
 ORDER BY w.order_id, a.id IS NULL";

/// The committed orders' events as written, each marked as the relays left its row (one they
/// deleted: done with). Where the writer wrote two events under one outbox id (a promoted
/// standby gave the id again, to the same customer's order written again), the one whose row
/// the database has is the committed one.
const JUDGED_OUTBOX: &str = "
INSERT INTO judge.outbox
SELECT DISTINCT ON (w.outbox_id)
       w.outbox_id, w.event_id, w.order_id::text, w.event_type, a.created_at,
       CASE WHEN a.id IS NULL THEN clock_timestamp() ELSE a.published_at END
  FROM judge.written w
  JOIN judge.orders o ON o.id = w.order_id AND o.customer_id = w.customer_id
  LEFT JOIN judge.app_outbox a ON a.id = w.outbox_id
 ORDER BY w.outbox_id, a.event_id IS NOT DISTINCT FROM w.event_id DESC, w.ended_at DESC";

/// Rows a relay rewrote: what the event is (its id, aggregate, type) differs from what the
/// writer wrote. Lost: the event as written was not what was delivered.
const REWRITTEN: &str = "
SELECT 'outbox ' || a.id || ' (rewritten by a relay)'
  FROM judge.app_outbox a
  JOIN judge.written w ON w.outbox_id = a.id
  JOIN judge.orders o ON o.id = w.order_id AND o.customer_id = w.customer_id
 WHERE (a.event_id, a.aggregate_id, a.event_type)
       IS DISTINCT FROM (w.event_id, w.order_id::text, w.event_type)
 ORDER BY a.id";

/// Shipments of an event that never committed, for an order id that names a committed order
/// (a shipment for an order id that names none is a ghost already): an event the writer never
/// wrote (`event ... (never written)`), or one it wrote in a transaction that did not commit,
/// whose order id a promoted standby gave again to another order (`order N`, the order it was
/// written for).
const GHOSTS_OF_COMMITTED_ORDERS: &str = "
SELECT DISTINCT CASE WHEN w.order_id IS NULL THEN 'event ' || s.event_id || ' (never written)'
                     ELSE 'order ' || w.order_id END
  FROM consumer.shipments s
  JOIN judge.orders o ON o.id::text = s.order_id
  LEFT JOIN (SELECT DISTINCT event_id, order_id FROM judge.written) w
    ON w.event_id = s.event_id
 WHERE NOT EXISTS (SELECT 1 FROM judge.outbox j WHERE j.event_id = s.event_id)
 ORDER BY 1";

/// The orders the writer was told committed that the database no longer has (`order N`; `(its
/// id given again to another order)` when the id now names another customer's: a promoted
/// standby hands out again the ids it never received).
const ACKNOWLEDGED_LOST: &str = "
SELECT 'order ' || w.order_id
       || CASE WHEN EXISTS (SELECT 1 FROM judge.app_orders a WHERE a.id = w.order_id)
               THEN ' (its id given again to another order)' ELSE '' END
  FROM (SELECT DISTINCT order_id, customer_id FROM judge.written WHERE outcome = 'ok') w
 WHERE NOT EXISTS (SELECT 1 FROM judge.app_orders a
                    WHERE a.id = w.order_id AND a.customer_id = w.customer_id)
 ORDER BY w.order_id";

/// Fills in what a relay of the user's may leave out of a delivery (the outbox id, the event
/// type), from the event as written, by the event id it sent: the order and duplicate
/// invariants read them from the receipts.
const COMPLETE_RECEIPTS: &str = "
UPDATE consumer.receipts r
   SET outbox_id = o.id, event_type = o.event_type
  FROM judge.outbox o
 WHERE o.event_id = r.event_id
   AND (r.outbox_id IS NULL OR r.event_type = '')";

/// Of the events never delivered, those whose transaction committed after the consumer had
/// received a later one (a higher outbox id): a relay that reads past the largest id it
/// delivered was already past them when they committed. The first such later receipt, and how
/// long before the commit it came: at least 50 ms, since verify's writer commits each pair of
/// orders 1 ms apart, out of id order, and an event lost for another reason (a relay killed
/// after marking) may have committed a moment after a later one was delivered.
const SKIPPED_EVENTS: &str = "
SELECT 'outbox ' || o.id AS lost, later.outbox_id AS later_id,
       round(extract(epoch FROM w.ended_at - later.received_at) * 1000)::bigint AS after_ms
  FROM judge.outbox o
  JOIN (SELECT DISTINCT outbox_id, ended_at FROM judge.written) w ON w.outbox_id = o.id
  CROSS JOIN LATERAL (
    SELECT r.outbox_id, min(r.received_at) AS received_at
      FROM consumer.receipts r
     WHERE r.outbox_id > o.id AND NOT r.injected_fault
     GROUP BY r.outbox_id
    HAVING min(r.received_at) < w.ended_at - interval '50 milliseconds'
     ORDER BY 2
     LIMIT 1) later
 WHERE NOT EXISTS (SELECT 1 FROM consumer.shipments s WHERE s.event_id = o.event_id)";

/// What the judge found beside the invariants' statements.
#[derive(Debug, Default)]
pub struct Tampering {
    /// Rows a relay rewrote (lost: the event as written was not delivered as written).
    pub rewritten: Vec<String>,
    /// Shipments of events that never committed, under the id of an order that did (ghosts).
    pub ghosts: Vec<String>,
}

/// What a lost event's offending id says when the relays were already past it when it
/// committed (`outbox 12 (skipped: ...)`).
pub const SKIPPED: &str = " (skipped: ";

/// The events lost because a relay was already past them when they committed, each with how it
/// reads in a verdict: `outbox 12` -> `outbox 12 (skipped: committed 2012 ms after outbox 40
/// was delivered)`.
pub async fn skipped(judge: &Client) -> Result<Vec<(String, String)>> {
    let rows = judge.query(SKIPPED_EVENTS, &[]).await?;
    Ok(rows
        .iter()
        .map(|row| {
            let lost: String = row.get("lost");
            let later: i64 = row.get("later_id");
            let after_ms: i64 = row.get("after_ms");
            let said = format!(
                "{lost}{SKIPPED}committed {after_ms} ms after outbox {later} was delivered)"
            );
            (lost, said)
        })
        .collect())
}

/// Builds the judge's tables in the consumer's database (`judge`, a session of it) from the
/// writer's record (`written`) and the application's rows as the run left them (`application`,
/// a session of the server's own role), and completes the consumer's receipts from them.
/// `failed_over`: a COMMIT the writer saw succeed may be gone.
pub async fn judge_from_record(
    application: &Client,
    judge: &Client,
    written: &[WrittenOrder],
    failed_over: bool,
) -> Result<()> {
    application
        .batch_execute("SET search_path = pg_catalog")
        .await?;
    let copied = async {
        for (table, select) in READ_APPLICATION {
            copy(
                application,
                &format!("COPY ({select}) TO STDOUT"),
                judge,
                &format!("COPY {table} FROM STDIN"),
            )
            .await
            .with_context(|| format!("cannot copy the application's rows into {table}"))?;
        }
        anyhow::Ok(())
    }
    .await;
    application
        .batch_execute("SET search_path = public")
        .await?;
    copied?;
    let events = || {
        written
            .iter()
            .flat_map(|w| w.order.events.iter().map(move |event| (w, event)))
    };
    let orders: Vec<i64> = events().map(|(w, _)| w.order.order_id).collect();
    let customers: Vec<i64> = events().map(|(w, _)| w.order.customer_id).collect();
    let outbox_ids: Vec<i64> = events().map(|(_, e)| e.outbox_id).collect();
    let event_ids: Vec<Uuid> = events().map(|(_, e)| e.event_id).collect();
    let types: Vec<&str> = events().map(|(_, e)| e.event_type.as_str()).collect();
    let outcomes: Vec<&str> = events().map(|(w, _)| w.outcome.name()).collect();
    let ended: Vec<Option<i64>> = events().map(|(w, _)| w.ended_at_ms).collect();
    judge
        .execute(
            INSERT_WRITTEN,
            &[
                &orders,
                &customers,
                &outbox_ids,
                &event_ids,
                &types,
                &outcomes,
                &ended,
            ],
        )
        .await?;
    judge.execute(JUDGED_ORDERS, &[&failed_over]).await?;
    judge.batch_execute(JUDGED_OUTBOX).await?;
    judge.batch_execute(COMPLETE_RECEIPTS).await?;
    Ok(())
}

/// What the judge finds of a relay that tampered with the outbox or forged deliveries.
pub async fn tampering(judge: &Client) -> Result<Tampering> {
    let texts = async |sql: &str| -> Result<Vec<String>> {
        let rows = judge.query(sql, &[]).await?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    };
    Ok(Tampering {
        rewritten: texts(REWRITTEN).await?,
        ghosts: texts(GHOSTS_OF_COMMITTED_ORDERS).await?,
    })
}

/// What a ghost shipment's offending id says when its order was acknowledged and then lost
/// (`order 12 (lost in failover)`): the database's doing, not the relay's.
pub const LOST_IN_FAILOVER: &str = " (lost in failover)";

/// The acknowledged orders gone from the application's database, as `order N`, from the
/// judge's tables.
pub async fn acknowledged_lost(judge: &Client) -> Result<Vec<String>> {
    let rows = judge.query(ACKNOWLEDGED_LOST, &[]).await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// Of the orders the writers were told committed (`acknowledged`: order id, customer), those
/// the database (`client`, its orders) no longer has: for our own relays, judged in the
/// application's database.
pub async fn acknowledged_lost_in(
    client: &Client,
    acknowledged: &[(i64, i64)],
) -> Result<Vec<String>> {
    if acknowledged.is_empty() {
        return Ok(Vec::new());
    }
    let (ids, customers): (Vec<i64>, Vec<i64>) = acknowledged.iter().copied().unzip();
    let rows = client
        .query(
            "SELECT 'order ' || a.id
                    || CASE WHEN EXISTS (SELECT 1 FROM orders o WHERE o.id = a.id)
                            THEN ' (its id given again to another order)' ELSE '' END
               FROM unnest($1::bigint[], $2::bigint[]) AS a(id, customer_id)
              WHERE NOT EXISTS (SELECT 1 FROM orders o
                                 WHERE o.id = a.id AND o.customer_id = a.customer_id)
              ORDER BY a.id",
            &[&ids, &customers],
        )
        .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// The first of outbox-lab's statements on the application's tables that no longer prepares on
/// the schema as the user's DDL left it, with the server's reason: the writer's inserts, the
/// judge's reads. `None` when all of them do.
pub async fn broken_by_user_schema(client: &Client) -> Option<String> {
    let reads = READ_APPLICATION.iter().map(|(_, select)| *select);
    let ours = [writer::INSERT_ORDER, writer::INSERT_OUTBOX].into_iter();
    for statement in ours.chain(reads) {
        if let Err(e) = client.prepare(statement).await {
            let reason = e
                .as_db_error()
                .map_or_else(|| e.to_string(), |db| db.message().to_string());
            return Some(reason);
        }
    }
    None
}

/// Streams what `copy_out` (a `COPY ... TO STDOUT`) reads from `from` into `copy_in` (a `COPY
/// ... FROM STDIN`) on `to`, chunk by chunk.
pub async fn copy(from: &Client, copy_out: &str, to: &Client, copy_in: &str) -> Result<()> {
    let rows = from.copy_out(copy_out).await?;
    let into = to.copy_in(copy_in).await?;
    pin_mut!(rows, into);
    while let Some(chunk) = rows.try_next().await? {
        into.send(chunk).await?;
    }
    into.finish().await?;
    Ok(())
}
