//! Bulk loading for the storage scenarios: many outbox rows at once with binary COPY (not row by
//! row), each with a payload padded like the article's, whose 200,000 published rows filled
//! ~62 MB (~7,979 blocks of 8 kB) of `outbox` and ~52 MB of an `outbox_p` partition.

use anyhow::{Context, Result};
use chrono::{DateTime, TimeDelta, Utc};
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::types::Type;
use tokio_postgres::Client;

use crate::outbox::writer::order_payload;
use crate::report::progress::Progress;

/// The columns COPY fills, in both `outbox` and `outbox_p`; ids and event ids take their defaults.
const COPY_OUTBOX_ROWS: &str = "
COPY {table} (aggregate_type, aggregate_id, event_type, payload, created_at, published_at)
FROM STDIN (FORMAT binary)";

const COPY_TYPES: [Type; 6] = [
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::JSONB,
    Type::TIMESTAMPTZ,
    Type::TIMESTAMPTZ,
];

/// A run of outbox rows, one order event each.
#[derive(Debug, Clone)]
pub struct OutboxRows {
    pub count: i64,
    /// The order id of the first row (aggregate_id and the payload's order_id); the next count up.
    pub first_order_id: i64,
    /// Characters of padding in each payload (`"note"`), to size the rows like the article's.
    pub payload_padding: usize,
    /// created_at of the first row; each next row is 1 ms younger.
    pub created_from: DateTime<Utc>,
    /// Published rows get published_at = created_at + 1 s; the others NULL.
    pub published: bool,
}

/// Rows between two moves of the progress bar: a move per row would cost more than the row.
const ROWS_PER_TICK: i64 = 1000;

/// COPYs the rows into `table` (a table of ours, not user input); returns rows copied.
pub async fn copy_rows(
    client: &Client,
    table: &str,
    rows: &OutboxRows,
    progress: &Progress,
) -> Result<u64> {
    let bar = progress.bar(rows.count.max(0) as u64, format!("COPY into {table}"));
    let sink = client
        .copy_in(&COPY_OUTBOX_ROWS.replace("{table}", table))
        .await
        .with_context(|| format!("cannot start COPY into {table}"))?;
    let writer = BinaryCopyInWriter::new(sink, &COPY_TYPES);
    tokio::pin!(writer);
    let padding = "x".repeat(rows.payload_padding);
    for n in 0..rows.count {
        let order_id = rows.first_order_id + n;
        let mut payload = order_payload(order_id);
        payload["note"] = padding.as_str().into();
        let created_at = rows.created_from + TimeDelta::milliseconds(n);
        let published_at = rows.published.then(|| created_at + TimeDelta::seconds(1));
        writer
            .as_mut()
            .write(&[
                &"orders",
                &order_id.to_string(),
                &"OrderCreated",
                &payload,
                &created_at,
                &published_at,
            ])
            .await?;
        if (n + 1) % ROWS_PER_TICK == 0 {
            bar.inc(ROWS_PER_TICK as u64);
        }
    }
    let copied = writer
        .finish()
        .await
        .with_context(|| format!("COPY into {table} failed"));
    bar.finish_and_clear();
    copied
}
