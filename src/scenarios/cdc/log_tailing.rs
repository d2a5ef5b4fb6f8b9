//! What only the log-tailing relay can do or suffer: the Debezium-style outbox (rows deleted in
//! the transaction that wrote them, delivered from the log all the same), the WAL its slot
//! retains while it is stopped, until it catches up, and the WAL it retains while running, when
//! other tables are written and the outbox is quiet, unless it confirms by itself (heartbeat).

use std::time::Duration;

use anyhow::{Context, Result};

use super::{wait_until, Bench, Outcome, Params, CHILD_TIMEOUT, DELIVERY_LIMIT};
use crate::harness::child::ChildEnd;
use crate::judge::counts;
use crate::outbox::relay::cdc;
use crate::outbox::writer::{Ending, LOAD_EVENTS};
use crate::report::Table;

/// Debezium-style: orders whose outbox rows are deleted in the same transaction.
pub(super) async fn deleted_rows(
    bench: &Bench<'_>,
    params: &Params,
    outcome: &mut Outcome,
) -> Result<()> {
    let received_before = counts::count(&bench.client, counts::RECEIVED).await?;
    let rows_before = counts::count(&bench.client, counts::OUTBOX_ROWS).await?;
    bench
        .ctx
        .writer(&bench.db, params.deleted_events, 1, Ending::Commit)
        .with(|writer| writer.delete_outbox = true)
        .run(CHILD_TIMEOUT)
        .await?
        .expect(|e| *e == ChildEnd::Ok, "the Debezium-style writer")?;
    let expected = received_before + i64::from(params.deleted_events);
    // A shortfall is reported below as orders without their event, not as an error.
    wait_until(&bench.client, counts::RECEIVED_AT_LEAST, &[&expected]).await?;
    let delivered = counts::count(&bench.client, counts::DELIVERED_WITHOUT_ROW).await?;
    let unannounced = counts::count(&bench.client, counts::ORDERS_WITHOUT_EVENT).await?;
    let rows_left = counts::count(&bench.client, counts::OUTBOX_ROWS).await? - rows_before;
    let m = &mut outcome.metrics;
    m.set("cdc.deleted_rows_delivered", delivered);
    m.set("cdc.orders_without_event", unannounced);
    let mut table = Table::new(
        "Debezium-style outbox: rows deleted in the transaction that wrote them (cdc)",
        &[
            "orders written",
            "outbox rows left",
            "events delivered",
            "orders without their event",
        ],
    );
    table.push(vec![
        params.deleted_events.to_string(),
        rows_left.to_string(),
        delivered.to_string(),
        unannounced.to_string(),
    ]);
    outcome.tables.push(table);
    Ok(())
}

/// Stops the log-tailing relay, writes, and measures what the slot retains; restarts it and
/// measures again once it has caught up.
pub(super) async fn wal_retention(
    bench: &mut Bench<'_>,
    params: &Params,
    outcome: &mut Outcome,
) -> Result<()> {
    let mut moments = vec![("relay running, caught up", slot_retained(bench).await?)];
    bench.stop_relay().await?;
    let client = &bench.client;
    let start: String = client.query_one(cdc::CURRENT_WAL_LSN, &[]).await?.get(0);
    client
        .execute(LOAD_EVENTS, &[&i64::from(params.retention_events)])
        .await?;
    let written: i64 = client.query_one(cdc::WAL_SINCE, &[&start]).await?.get(0);
    moments.push(("relay down, events written", slot_retained(bench).await?));
    bench.start_relay().await?;
    bench
        .wait_all_received("the events written while it was down")
        .await?;
    // restart_lsn moves to a running-transactions record once the relay confirms past it, and
    // the slot holds one such candidate at a time: the first round applies the candidate found
    // during the catch-up, the second the checkpoint's own.
    for _ in 0..2 {
        bench
            .client
            .batch_execute(cdc::CHECKPOINT)
            .await
            .context("CHECKPOINT (needs superuser or pg_checkpoint)")?;
        cdc::wait_caught_up(&bench.client, &bench.slot, DELIVERY_LIMIT).await?;
    }
    moments.push(("relay caught up again", slot_retained(bench).await?));

    let m = &mut outcome.metrics;
    m.set("slot.wal_written_bytes_down", written);
    m.set("slot.retained_bytes_before", moments[0].1 .0);
    m.set("slot.retained_bytes_down", moments[1].1 .0);
    m.set("slot.retained_bytes_after", moments[2].1 .0);
    m.set("slot.unconfirmed_bytes_down", moments[1].1 .1);
    m.set("slot.unconfirmed_bytes_after", moments[2].1 .1);
    let mut table = Table::new(
        format!(
            "WAL the slot retains (relay stopped, {} events written)",
            params.retention_events
        ),
        &["moment", "retained_bytes", "unconfirmed_bytes"],
    );
    for (label, (retained, unconfirmed)) in moments {
        table.push(vec![
            label.into(),
            retained.to_string(),
            unconfirmed.to_string(),
        ]);
    }
    outcome.tables.push(table);
    outcome.notes.push(format!(
        "[cdc] WAL written while the relay was down: {written} bytes; retained_bytes = \
         pg_current_wal_lsn() - restart_lsn, unconfirmed_bytes = pg_current_wal_lsn() - \
         confirmed_flush_lsn"
    ));
    Ok(())
}

/// Another table of the application's, written while the outbox is quiet.
const CREATE_UNRELATED: &str =
    "CREATE TABLE IF NOT EXISTS unrelated_writes (id bigserial PRIMARY KEY, padding text NOT NULL)";
const WRITE_UNRELATED: &str =
    "INSERT INTO unrelated_writes (padding) SELECT repeat('x', 200) FROM generate_series(1, $1::bigint)";
/// How long a running relay is given to confirm by itself: its heartbeat takes milliseconds
/// (the server sends a keepalive as soon as it has decoded up to the end of the WAL).
const HEARTBEAT_LIMIT: Duration = Duration::from_secs(1);

/// The relay running and caught up, other tables written, the outbox quiet: the WAL the slot
/// retains afterwards, with the relay's heartbeat off (the position never moves: every byte
/// stays) and on (confirmed on the server's keepalives: the slot lets the WAL go). The relay
/// with the heartbeat is left running.
pub(super) async fn unrelated_writes(
    bench: &mut Bench<'_>,
    params: &Params,
    outcome: &mut Outcome,
) -> Result<()> {
    bench.client.batch_execute(CREATE_UNRELATED).await?;
    let mut table = Table::new(
        format!(
            "WAL the slot retains after {} rows written to another table, outbox quiet",
            params.unrelated_rows
        ),
        &[
            "relay",
            "wal written",
            "retained_bytes",
            "unconfirmed_bytes",
        ],
    );
    let mut written: i64 = 0;
    for (name, heartbeat) in [("no_heartbeat", false), ("heartbeat", true)] {
        bench.stop_relay().await?;
        bench.heartbeat = heartbeat;
        bench.start_relay().await?;
        let client = &bench.client;
        let start: String = client.query_one(cdc::CURRENT_WAL_LSN, &[]).await?.get(0);
        client
            .execute(WRITE_UNRELATED, &[&i64::from(params.unrelated_rows)])
            .await?;
        written = client.query_one(cdc::WAL_SINCE, &[&start]).await?.get(0);
        // As in wal_retention: restart_lsn follows a confirmation past a checkpoint's record.
        for _ in 0..2 {
            client.batch_execute(cdc::CHECKPOINT).await?;
            cdc::wait_confirmed_by_itself(client, &bench.slot, HEARTBEAT_LIMIT).await?;
        }
        let (retained, unconfirmed) = slot_retained(bench).await?;
        let m = &mut outcome.metrics;
        m.set(format!("{name}.retained_bytes"), retained);
        m.set(format!("{name}.unconfirmed_bytes"), unconfirmed);
        table.push(vec![
            name.replace('_', " "),
            written.to_string(),
            retained.to_string(),
            unconfirmed.to_string(),
        ]);
    }
    outcome.metrics.set("slot.unrelated_written_bytes", written);
    outcome.tables.push(table);
    Ok(())
}

/// The WAL the slot retains and the part its relay has not confirmed, in bytes.
async fn slot_retained(bench: &Bench<'_>) -> Result<(i64, i64)> {
    let row = bench
        .client
        .query_one(cdc::SLOT_RETAINED, &[&bench.slot])
        .await?;
    Ok((row.get("retained_bytes"), row.get("unconfirmed_bytes")))
}
