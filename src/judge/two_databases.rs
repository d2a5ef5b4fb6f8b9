//! Judging a consumer that keeps its tables in another database than the outbox (the several
//! hosts setup): the application's rows that the invariants read are copied into temporary
//! tables of the consumer's session, where the invariants then run unchanged. Temporary tables
//! shadow same-named tables for that session only and vanish with it: nothing of either
//! database is written. When the application's database is the lab's own (a replicated pair
//! that failed over), the consumer's rows are copied into it instead.

use anyhow::{Context, Result};
use tokio_postgres::Client;

use super::record::copy;

/// The application's tables as the invariants read them: the columns they use, and their
/// types in the article's schema.
const APPLICATION_TABLES: [(&str, &str, &str); 2] = [
    ("orders", "id", "id bigint"),
    (
        "outbox",
        "id, event_id, aggregate_id, published_at",
        "id bigint, event_id uuid, aggregate_id text, published_at timestamptz",
    ),
];

/// Copies `orders` and `outbox` from the application's database into temporary tables of the
/// consumer's session (`consumer`), so that `consumer` can be judged as if they were one.
pub async fn bring_application_rows(application: &Client, consumer: &Client) -> Result<()> {
    // Unqualified names now mean the copies, whatever the consumer's database also holds.
    consumer.batch_execute("SET search_path = pg_temp").await?;
    for (table, columns, definition) in APPLICATION_TABLES {
        consumer
            .batch_execute(&format!("CREATE TEMPORARY TABLE {table} ({definition})"))
            .await?;
        copy(
            application,
            &format!("COPY (SELECT {columns} FROM {table}) TO STDOUT"),
            consumer,
            &format!("COPY pg_temp.{table} FROM STDIN"),
        )
        .await
        .with_context(|| format!("cannot copy {table} from the application's database"))?;
    }
    Ok(())
}

/// The consumer's tables (every one of its schema, the receipts and shipments among them).
const CONSUMER_TABLES: &str = "
SELECT table_name::text FROM information_schema.tables
 WHERE table_schema = 'consumer' AND table_type = 'BASE TABLE'
 ORDER BY 1";

/// The other way, when the application's database is the one that moved (a failover): the
/// consumer's rows, from its own database, copied over the consumer's (empty) tables in the
/// application's, so that the invariants read one database. The application's database is
/// the run's own, reset before each run.
pub async fn bring_consumer_rows(consumer: &Client, application: &Client) -> Result<()> {
    let tables: Vec<String> = consumer
        .query(CONSUMER_TABLES, &[])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    for table in tables {
        application
            .batch_execute(&format!("TRUNCATE consumer.\"{table}\""))
            .await?;
        copy(
            consumer,
            &format!("COPY consumer.\"{table}\" TO STDOUT"),
            application,
            &format!("COPY consumer.\"{table}\" FROM STDIN"),
        )
        .await
        .with_context(|| format!("cannot copy consumer.{table} from the consumer's database"))?;
    }
    Ok(())
}
