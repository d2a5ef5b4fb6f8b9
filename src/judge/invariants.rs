//! The invariants, defined once: what *ghost*, *lost*, *duplicate*, *order* and *liveness*
//! mean, for the scenarios' figures ([`super::counts`] builds them on these statements),
//! explore's checker and `outbox-lab check` alike.
//!
//! Each is judged from the database the run left behind — the orders, the outbox and the
//! consumer's shipments — never from a process's own account of what it did. A delivery is its
//! effect: a row in `consumer.shipments`, which the consumer writes in the transaction that
//! records the receipt, so "the consumer has it" means "its effect committed".
//!
//! - **ghost**: a shipment for an order that is not in `orders` — the naive app sent its event
//!   before a COMMIT that never came. One row per ghost shipment; offending: the order.
//! - **lost**: a committed event without any shipment. The committed events are the outbox
//!   rows; an order without an outbox row (the naive app's dual write, or an outbox whose rows
//!   are deleted as they are written) is its own event, found by its order id. One row per
//!   event. Judged *after recovery*: see below.
//! - **duplicate**: a business key — the order's shipment for one event type — shipped more
//!   than once: an event applied twice, or one event sent twice under fresh event ids (the naive
//!   app's retry), which counting by event id alone would not see. One row per key, with its
//!   number of shipments.
//! - **order**: per aggregate, an event the consumer received after a later event of the same
//!   aggregate (higher outbox id). Judged from the consumer's receipts alone (their sequence,
//!   each event by its *first* receipt; a receipt is written in the transaction of the event's
//!   effect); a redelivery that changes nothing is a duplicate, not a reordering. One row per
//!   reversal (an event received right after a later one); offending: the aggregate. An
//!   aggregate with one event (the naive app's order) cannot be out of order.
//! - **liveness**: every committed event is delivered within a bound after the faults end:
//!   explore's watchdog gives the relays [`LIVENESS_BOUND`](crate::explore::watchdog::LIVENESS_BOUND) from
//!   the later of the writer's end and the last fault, and a run that does not drain by then
//!   (or needs more processes than allowed) is stuck. Offending: the bound it hit, then the
//!   outbox rows still owed. A stuck run has not recovered, so a row a relay still owes is its
//!   liveness failure there, not a loss. A live database cannot tell slow from stuck; there,
//!   the outbox rows no relay has marked published are [`PENDING`]: the backlog the relays
//!   still owe.
//!
//! ## Unknown outcomes (Jepsen's `info`)
//!
//! A sender that died, or lost the connection after its request went out, does not know what
//! happened (`info` in explore's history): the event *may* have been applied. No invariant
//! reads the history, so `info` is never taken for "no": whether the consumer applied the event
//! is read from its shipments. Likewise a writer that died after sending COMMIT: its order is
//! committed if and only if it is in `orders`.
//!
//! ## After recovery, or live
//!
//! An outbox row without a shipment whose relay has not marked it (`published_at IS NULL`) is
//! still owed: the relay, or its restart, will send it — maybe again. That is a "maybe", so on
//! a live database ([`Moment::Live`], `outbox-lab check`) such a row is *pending*, not lost;
//! only an undelivered event that no relay owes any more (marked published, or with no outbox
//! row) is lost. Explore and the scenarios judge after recovery ([`Moment::AfterRecovery`]:
//! the relays have drained, so nothing is owed), where every undelivered event is lost — also
//! the ones a broken relay left unmarked behind its watermark.

use std::collections::BTreeMap;
use std::fmt;

use anyhow::Result;
use tokio_postgres::Client;

/// What a design may guarantee; the words of every verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Invariant {
    /// No shipment for an order that never committed.
    Ghost,
    /// Every committed event has its side effect.
    Lost,
    /// No business key (the order's shipment for one event type) has its side effect twice.
    Duplicate,
    /// Per aggregate, the consumer's first receipts follow outbox order.
    Order,
    /// Every committed event is delivered within a bound after the faults end.
    Liveness,
}

impl Invariant {
    pub const ALL: [Invariant; 5] = [
        Invariant::Ghost,
        Invariant::Lost,
        Invariant::Duplicate,
        Invariant::Order,
        Invariant::Liveness,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Invariant::Ghost => "ghost",
            Invariant::Lost => "lost",
            Invariant::Duplicate => "duplicate",
            Invariant::Order => "order",
            Invariant::Liveness => "liveness",
        }
    }

    /// The invariant called `name` (as [`Invariant::name`] says it).
    pub fn named(name: &str) -> Option<Invariant> {
        Invariant::ALL.into_iter().find(|i| i.name() == name)
    }

    pub fn meaning(self) -> &'static str {
        match self {
            Invariant::Ghost => "no shipment for an order that never committed",
            Invariant::Lost => "every committed event has its side effect",
            Invariant::Duplicate => {
                "no event, nor any order's event type, has its side effect twice"
            }
            Invariant::Order => "per aggregate, the consumer first receives events in outbox order",
            Invariant::Liveness => {
                "every committed event is delivered within the bound after the faults end"
            }
        }
    }

    /// The statement that finds its violations in the database (`None`: liveness, judged by
    /// the supervisor). Every one has an `offending` column naming what broke it.
    pub fn statement(self) -> Option<&'static str> {
        match self {
            Invariant::Ghost => Some(GHOSTS),
            Invariant::Lost => Some(LOST),
            Invariant::Duplicate => Some(DUPLICATES),
            Invariant::Order => Some(OUT_OF_ORDER),
            Invariant::Liveness => None,
        }
    }
}

impl fmt::Display for Invariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

// Each statement is written once, in a macro, so that the figures of `counts` can be built on
// it with `concat!` (`WITH lost AS (...) SELECT count(*) FROM lost`), and as a constant.

/// Ghost shipments: one row per shipment whose order never committed.
macro_rules! ghosts {
    () => {
        "
SELECT 'order ' || s.order_id AS offending, s.id AS shipment_id, s.order_id
  FROM consumer.shipments s
 WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.id::text = s.order_id)"
    };
}

/// Lost events: one row per committed event without a shipment. `pending`: its outbox row is
/// not marked published, so a relay still owes it (on a live database: not lost yet).
macro_rules! lost {
    () => {
        "
SELECT 'outbox ' || o.id AS offending, o.id AS outbox_id, o.aggregate_id AS order_id,
       o.published_at IS NULL AS pending
  FROM outbox o
 WHERE NOT EXISTS (SELECT 1 FROM consumer.shipments s WHERE s.event_id = o.event_id)
UNION ALL
SELECT 'order ' || ord.id, NULL, ord.id::text, false
  FROM orders ord
 WHERE NOT EXISTS (SELECT 1 FROM outbox o WHERE o.aggregate_id = ord.id::text)
   AND NOT EXISTS (SELECT 1 FROM consumer.shipments s WHERE s.order_id = ord.id::text)"
    };
}

/// Duplicates: one row per business key — the order's shipment for one event type — with more
/// than one shipment, and how many it has. Every event applied twice is one (same event id,
/// same order and type); so is an event sent twice under fresh event ids (the naive app's
/// retry), which counting by event id alone cannot see. An event's type is the one its
/// receipts name (the outbox's other columns are not read: it may live in another database).
macro_rules! duplicates {
    () => {
        "
SELECT CASE WHEN count(DISTINCT shipped.event_id) = 1
            THEN COALESCE('outbox ' || min(shipped.outbox_id),
                          'event ' || min(shipped.event_id::text))
            ELSE 'order ' || shipped.order_id || ' ' || shipped.event_type
       END AS offending,
       shipped.order_id, count(*) AS shipments
  FROM (SELECT s.order_id, s.event_id, o.id AS outbox_id,
               COALESCE(r.event_type, s.event_id::text) AS event_type
          FROM consumer.shipments s
          LEFT JOIN outbox o ON o.event_id = s.event_id
          LEFT JOIN (SELECT DISTINCT event_id, event_type FROM consumer.receipts) r
            ON r.event_id = s.event_id) shipped
 GROUP BY shipped.order_id, shipped.event_type
HAVING count(*) > 1"
    };
}

/// Reversals: per aggregate, in the consumer's receipt sequence (each event counted by its
/// first receipt that was not an injected fault, written in the transaction of its effect),
/// one row per event received right after a later one (higher outbox id, as its receipt
/// says). Read from the receipts alone: what the consumer saw, not what the outbox holds.
macro_rules! out_of_order {
    () => {
        "
WITH first_receipt AS (
  SELECT order_id AS aggregate_id, outbox_id, min(seq) AS seq
    FROM consumer.receipts
   WHERE NOT injected_fault AND outbox_id IS NOT NULL
   GROUP BY order_id, outbox_id),
applied AS (
  SELECT aggregate_id, outbox_id,
         lag(outbox_id) OVER (PARTITION BY aggregate_id ORDER BY seq) AS previous_id
    FROM first_receipt)
SELECT 'order ' || aggregate_id AS offending, aggregate_id AS order_id, outbox_id, previous_id
  FROM applied
 WHERE outbox_id < previous_id"
    };
}

/// The backlog: outbox rows no relay has marked published yet (it still owes them).
macro_rules! pending {
    () => {
        "
SELECT 'outbox ' || id AS offending, id AS outbox_id
  FROM outbox
 WHERE published_at IS NULL"
    };
}

pub(crate) use {duplicates, ghosts, lost, out_of_order, pending};

pub const GHOSTS: &str = ghosts!();
pub const LOST: &str = lost!();
pub const DUPLICATES: &str = duplicates!();
pub const OUT_OF_ORDER: &str = out_of_order!();
pub const PENDING: &str = pending!();

/// When the database is judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Moment {
    /// The relays have drained (explore, the scenarios): nothing is owed any more, every
    /// undelivered event is lost.
    AfterRecovery,
    /// The relays may still be working (`outbox-lab check`): a row not marked published is
    /// pending, not lost.
    Live,
}

/// What one run broke: offending ids per violated invariant (absent = held).
pub type Violations = BTreeMap<Invariant, Vec<String>>;

/// The distinct offending ids of a database invariant, sorted.
pub async fn offending(
    client: &Client,
    invariant: Invariant,
    moment: Moment,
) -> Result<Vec<String>> {
    let Some(statement) = invariant.statement() else {
        return Ok(Vec::new());
    };
    let live_filter = if invariant == Invariant::Lost && moment == Moment::Live {
        " WHERE NOT pending"
    } else {
        ""
    };
    let sql =
        format!("SELECT DISTINCT offending FROM ({statement}) violation{live_filter} ORDER BY 1");
    Ok(client
        .query(&sql, &[])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

/// Liveness, as explore's supervisor judged it: `stuck` says which bound a run hit (`None`: it
/// drained); the offending ids are that bound, then the outbox rows still owed.
async fn liveness(client: &Client, stuck: Option<&str>) -> Result<Vec<String>> {
    let Some(why) = stuck else {
        return Ok(Vec::new());
    };
    let owed = client
        .query(
            &format!("SELECT offending FROM ({PENDING}) owed ORDER BY outbox_id"),
            &[],
        )
        .await?;
    Ok(std::iter::once(why.to_string())
        .chain(owed.iter().map(|r| r.get(0)))
        .collect())
}

/// Every invariant: the database ones by their statements, liveness by `stuck` (the
/// supervisor's verdict; `None` on a live database, which cannot tell slow from stuck).
pub async fn judge(client: &Client, moment: Moment, stuck: Option<&str>) -> Result<Violations> {
    // A run that did not drain has not recovered: what a relay still owes is its liveness
    // failure, not a loss (a row marked published without its effect is lost either way).
    let moment = match stuck {
        Some(_) => Moment::Live,
        None => moment,
    };
    let mut violations = Violations::new();
    for invariant in Invariant::ALL {
        let ids = match invariant {
            Invariant::Liveness => liveness(client, stuck).await?,
            _ => offending(client, invariant, moment).await?,
        };
        if !ids.is_empty() {
            violations.insert(invariant, ids);
        }
    }
    Ok(violations)
}
