//! What the judge records for itself while a relay of the user's runs (`outbox-lab verify`),
//! so that the verdict does not depend on what the relay leaves in the outbox: every outbox row
//! as it was committed, copied by a trigger in the writer's own transaction (a rolled-back write
//! leaves no copy). A relay may delete its rows once published (Debezium's insert-then-delete,
//! many libraries' cleanup); before judging, the rows it deleted are put back from the copy,
//! marked published — the relay was done with them — so that every invariant, count and
//! latency reads one outbox whatever the relay did to it.
//!
//! The writer's acknowledged orders are read back against the database after the run: an
//! order it was told committed and that is gone (a failover lost it) is `acknowledged-lost`.
//!
//! It also owns the check that the user's DDL (`--schema`) left outbox-lab's tables usable:
//! every statement the writer, the consumer and the judge run on them still prepares.

use anyhow::Result;
use tokio_postgres::Client;

use crate::judge::invariants::Invariant;
use crate::outbox::{consumer, writer};

/// The judge's own schema (dropped with the rest at every reset) and the trigger that copies
/// each committed outbox row into it.
pub const RECORD_WRITES: &str = "
CREATE SCHEMA judge;
CREATE TABLE judge.written (id bigint PRIMARY KEY, row jsonb NOT NULL);
CREATE FUNCTION judge.record_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO judge.written (id, row) VALUES (NEW.id, to_jsonb(NEW));
  RETURN NULL;
END $$;
CREATE TRIGGER judge_record_write AFTER INSERT ON outbox
  FOR EACH ROW EXECUTE FUNCTION judge.record_write();";

/// Puts back the rows a relay deleted, as they were written and marked published, without
/// firing the user's triggers again (the table's owner may switch them off: no superuser
/// needed). The number put back.
const RESTORE_DELETED: &str = "
WITH restored AS (
  INSERT INTO outbox
  SELECT (jsonb_populate_record(NULL::outbox,
            w.row || jsonb_build_object('published_at',
                                        COALESCE(w.row->>'published_at', clock_timestamp()::text)))).*
    FROM judge.written w
   WHERE NOT EXISTS (SELECT 1 FROM outbox o WHERE o.id = w.id)
  RETURNING 1)
SELECT count(*) FROM restored";

/// Of the orders the writer saw acknowledged (`$1` their ids, `$2` their customers), those the
/// database no longer has: a failover lost them. An order of another customer under the same
/// id is a later one, given the lost order's id again by the promoted standby (a sequence is
/// WAL-logged 32 values ahead): said so, since a consumer then takes the new order for the
/// lost one.
const ACKNOWLEDGED_LOST: &str = "
SELECT 'order ' || a.id
       || CASE WHEN EXISTS (SELECT 1 FROM orders o WHERE o.id = a.id)
               THEN ' (its id given again to another order)' ELSE '' END
  FROM unnest($1::bigint[], $2::bigint[]) AS a(id, customer_id)
 WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.id = a.id AND o.customer_id = a.customer_id)
 ORDER BY a.id";

/// What a ghost shipment's offending id says when its order was acknowledged and then lost
/// (`order 12 (lost in failover)`): the database's doing, not the relay's.
pub const LOST_IN_FAILOVER: &str = " (lost in failover)";

/// The acknowledged orders (`acknowledged`, the writer's log: order id, customer) gone from the
/// database, as `order N`.
pub async fn acknowledged_lost(
    client: &Client,
    acknowledged: &[(i64, i64)],
) -> Result<Vec<String>> {
    if acknowledged.is_empty() {
        return Ok(Vec::new());
    }
    let (ids, customers): (Vec<i64>, Vec<i64>) = acknowledged.iter().copied().unzip();
    let rows = client.query(ACKNOWLEDGED_LOST, &[&ids, &customers]).await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// Restores the outbox rows the relays deleted (see the module's doc); how many.
pub async fn restore_deleted(client: &Client) -> Result<i64> {
    client
        .batch_execute("ALTER TABLE outbox DISABLE TRIGGER USER")
        .await?;
    let restored = client.query_one(RESTORE_DELETED, &[]).await;
    client
        .batch_execute("ALTER TABLE outbox ENABLE TRIGGER USER")
        .await?;
    Ok(restored?.get(0))
}

/// The first of outbox-lab's statements that no longer prepares on the schema as the user's DDL
/// left it, with the server's reason: the writer's inserts, the judge's invariants, the record
/// of writes. `None` when all of them do.
pub async fn broken_by_user_schema(client: &Client) -> Option<String> {
    let ours = [
        writer::INSERT_ORDER,
        writer::INSERT_OUTBOX,
        consumer::RECORD_RECEIPT,
        consumer::CREATE_SHIPMENT,
        consumer::SHIP_FIRST_DELIVERY,
        consumer::RECORD_BATCH_RECEIPTS,
        consumer::SHIP_BATCH_FIRST_DELIVERIES,
        RESTORE_DELETED,
    ];
    let judged = Invariant::ALL.into_iter().filter_map(Invariant::statement);
    for statement in ours.into_iter().chain(judged) {
        if let Err(e) = client.prepare(statement).await {
            let reason = e
                .as_db_error()
                .map_or_else(|| e.to_string(), |db| db.message().to_string());
            return Some(reason);
        }
    }
    None
}
