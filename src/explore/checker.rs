//! The checker: judges a run by the database it left behind, after recovery. One query per
//! invariant, each returning the offending ids, so a verdict names what broke and not only how
//! often. It reads the final state (orders, outbox, shipments), never a process's own account of
//! what it did: an attempt whose outcome is unknown (`info` in the history) counts as neither
//! delivered nor lost here; only its effect in the database, or the lack of one, does.

use std::collections::BTreeMap;

use anyhow::Result;
use tokio_postgres::Client;

use super::designs::Invariant;

/// Shipments for orders that do not exist: the naive app sent before a COMMIT that never came.
pub const GHOSTS: &str = "
SELECT DISTINCT 'order ' || s.order_id
  FROM consumer.shipments s
 WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.id::text = s.order_id)
 ORDER BY 1";

/// Committed events without a shipment. The committed events are the outbox rows; when a
/// design writes no outbox (dual write), each committed order is its one event.
pub const LOST: &str = "
SELECT 'outbox ' || o.id
  FROM outbox o
 WHERE NOT EXISTS (SELECT 1 FROM consumer.shipments s WHERE s.event_id = o.event_id)
UNION ALL
SELECT 'order ' || ord.id
  FROM orders ord
 WHERE NOT EXISTS (SELECT 1 FROM outbox o WHERE o.aggregate_id = ord.id::text)
   AND NOT EXISTS (SELECT 1 FROM consumer.shipments s WHERE s.order_id = ord.id::text)
 ORDER BY 1";

/// Events with more than one shipment.
pub const DUPLICATES: &str = "
SELECT COALESCE('outbox ' || o.id, 'event ' || s.event_id)
  FROM consumer.shipments s
  LEFT JOIN outbox o ON o.event_id = s.event_id
 GROUP BY s.event_id, o.id
HAVING count(*) > 1
 ORDER BY 1";

/// Aggregates where an event's first shipment came after the first shipment of a later event
/// (higher outbox id) of the same aggregate. Shipment ids are taken inside the consumer's
/// transaction, in the order the consumer applied the events.
pub const OUT_OF_ORDER: &str = "
WITH first_effect AS (
  SELECT o.aggregate_id, o.id AS outbox_id, min(s.id) AS shipment_id
    FROM consumer.shipments s
    JOIN outbox o ON o.event_id = s.event_id
   GROUP BY o.aggregate_id, o.id
)
SELECT DISTINCT 'order ' || earlier.aggregate_id
  FROM first_effect earlier
  JOIN first_effect later
    ON later.aggregate_id = earlier.aggregate_id
   AND later.outbox_id > earlier.outbox_id
   AND later.shipment_id < earlier.shipment_id
 ORDER BY 1";

/// What one run broke: offending ids per violated invariant (absent = held).
pub type Violations = BTreeMap<Invariant, Vec<String>>;

/// Runs every database invariant's query; `stuck` is the supervisor's liveness verdict.
pub async fn check(client: &Client, stuck: Option<&str>) -> Result<Violations> {
    let mut violations = Violations::new();
    for (invariant, sql) in [
        (Invariant::Ghost, GHOSTS),
        (Invariant::Lost, LOST),
        (Invariant::Duplicate, DUPLICATES),
        (Invariant::Order, OUT_OF_ORDER),
    ] {
        let ids: Vec<String> = client
            .query(sql, &[])
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        if !ids.is_empty() {
            violations.insert(invariant, ids);
        }
    }
    if let Some(why) = stuck {
        violations.insert(Invariant::Liveness, vec![why.to_string()]);
    }
    Ok(violations)
}
