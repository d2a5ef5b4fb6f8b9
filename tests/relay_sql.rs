//! The relay's SQL statements run on their own against a fresh outbox: the partition filter
//! for every aggregate id, `requeue` (dead letters only, never a row under retry or a row a
//! relay holds), and a failed delivery unmarked after the lock design's early mark.

use crate::common;

use std::time::Duration;

use common::{block_on, create_database};
use outbox_lab::outbox::relay::{self, sql};
use outbox_lab::outbox::schema;
use tokio_postgres::types::ToSql;

/// An aggregate id whose `hashtext` is -2^31 (i32::MIN), the one value `abs()` cannot take.
/// Found once by a search over "agg-1", "agg-2", ... (4.2 billion strings) with a Rust copy of PostgreSQL's
/// `hash_bytes` (lookup3), checked against `SELECT hashtext(...)` on PostgreSQL 15; the test
/// asserts it again below.
const MIN_HASH_AGGREGATE: &str = "agg-4206553701";

/// The partitioned fetch takes every row, the one whose hash is -2^31 included: before, while
/// that row was undelivered, every fetch of a partitioned relay that scanned it failed with
/// "integer out of range" (abs(-2^31)), whichever partition the relay had.
#[test]
fn partitioned_fetch_takes_the_aggregate_hashing_to_i32_min() {
    let db = create_database("relay_sql_partition_min_hash", schema::CREATE_OUTBOX);
    block_on(async {
        let client = db.connect().await.unwrap();
        let hash: i32 = client
            .query_one("SELECT hashtext($1)", &[&MIN_HASH_AGGREGATE])
            .await
            .unwrap()
            .get(0);
        assert_eq!(
            hash,
            i32::MIN,
            "{MIN_HASH_AGGREGATE} no longer hashes to -2^31"
        );
        client
            .batch_execute(&format!(
                "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
                 SELECT 'orders', 'order-' || g, 'OrderCreated', '{{}}' FROM generate_series(1, 50) g;
                 INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
                 VALUES ('orders', '{MIN_HASH_AGGREGATE}', 'OrderCreated', '{{}}')"
            ))
            .await
            .unwrap();
        let fetch = sql::fetch_statement(true, false);
        let count = 3i32;
        let mut taken: Vec<i64> = Vec::new();
        for index in 0..count {
            let params: [&(dyn ToSql + Sync); 4] = [&5i32, &1000i64, &index, &count];
            let rows = client
                .query(&fetch, &params)
                .await
                .unwrap_or_else(|e| panic!("partition {index}/{count}: {e:?}"));
            taken.extend(rows.iter().map(|r| r.get::<_, i64>("id")));
        }
        taken.sort();
        // Every row in exactly one partition.
        assert_eq!(taken, (1..=51).collect::<Vec<i64>>());
        // Non-negative hashes keep their partition (x & 0x7fffffff = x = abs(x)).
        let moved: i64 = client
            .query_one(
                "SELECT count(*) FROM outbox WHERE hashtext(aggregate_id) >= 0
                    AND (hashtext(aggregate_id) & 2147483647) % 3 <> abs(hashtext(aggregate_id)) % 3",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(moved, 0);
    });
}

/// Requeue gives dead letters (attempts >= the relay's limit) their attempts back, and only
/// them: a row under retry keeps its attempts and its backoff. Before, every unpublished row
/// was reset.
#[test]
fn requeue_takes_only_dead_letters() {
    let db = create_database("relay_sql_requeue_dead_only", schema::CREATE_OUTBOX);
    block_on(async {
        let client = db.connect().await.unwrap();
        client
            .batch_execute(
                "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, attempts, next_attempt_at)
                 VALUES ('orders', '1', 'OrderCreated', '{}', 1, clock_timestamp() + interval '1 hour'),
                        ('orders', '2', 'OrderCreated', '{}', 5, clock_timestamp() + interval '1 hour'),
                        ('orders', '3', 'OrderCreated', '{}', 0, clock_timestamp())",
            )
            .await
            .unwrap();
        assert_eq!(relay::requeue(&client, 5).await.unwrap(), 1);
        let rows = client
            .query(
                "SELECT aggregate_id, attempts, next_attempt_at > clock_timestamp() + interval '50 minutes'
                   FROM outbox ORDER BY id",
                &[],
            )
            .await
            .unwrap();
        let rows: Vec<(String, i32, bool)> = rows
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect();
        assert_eq!(
            rows,
            vec![
                ("1".to_string(), 1, true),
                ("2".to_string(), 0, false),
                ("3".to_string(), 0, false),
            ]
        );
    });
}

/// A dead letter that another session holds (FOR UPDATE, transaction open) is skipped: requeue
/// neither waits for it nor touches it, and still requeues the others. Before, it blocked.
#[test]
fn requeue_skips_locked_dead_letters_without_waiting() {
    let db = create_database("relay_sql_requeue_skip_locked", schema::CREATE_OUTBOX);
    block_on(async {
        let client = db.connect().await.unwrap();
        let holder = db.connect().await.unwrap();
        client
            .batch_execute(
                "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, attempts)
                 VALUES ('orders', 'held', 'OrderCreated', '{}', 5),
                        ('orders', 'free', 'OrderCreated', '{}', 5)",
            )
            .await
            .unwrap();
        holder
            .batch_execute("BEGIN; SELECT 1 FROM outbox WHERE aggregate_id = 'held' FOR UPDATE")
            .await
            .unwrap();
        let requeued = tokio::time::timeout(Duration::from_secs(5), relay::requeue(&client, 5))
            .await
            .expect("requeue waited for a locked row")
            .unwrap();
        assert_eq!(requeued, 1);
        holder.batch_execute("ROLLBACK").await.unwrap();
        let attempts: Vec<(String, i32)> = client
            .query("SELECT aggregate_id, attempts FROM outbox ORDER BY id", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        assert_eq!(
            attempts,
            vec![("held".to_string(), 5), ("free".to_string(), 0)]
        );
    });
}

/// The lock design marks its batch beside the send and unmarks a failed delivery in the same
/// transaction: the row ends as MARK_FAILED alone leaves it (unpublished, one attempt more, the
/// same backoff, the error), so an early mark never shows.
#[test]
fn a_failed_delivery_unmarked_ends_as_if_never_marked() {
    let db = create_database("relay_sql_unmark_failed", schema::CREATE_OUTBOX);
    block_on(async {
        let client = db.connect().await.unwrap();
        client
            .batch_execute(
                "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, attempts)
                 VALUES ('orders', '1', 'OrderCreated', '{}', 3), ('orders', '2', 'OrderCreated', '{}', 3)",
            )
            .await
            .unwrap();
        let (base_ms, max_ms) = (200.0f64, 1_000_000.0f64);
        // Due times on the server's clock (the relay's lease clock, the article's).
        let server_clock: Option<std::time::SystemTime> = None;
        // Row 1 the article's way, row 2 marked first and unmarked.
        client
            .execute(
                sql::MARK_FAILED,
                &[&1i64, &"refused", &base_ms, &max_ms, &server_clock],
            )
            .await
            .unwrap();
        client.batch_execute("BEGIN").await.unwrap();
        client
            .execute(sql::MARK_PUBLISHED, &[&vec![2i64]])
            .await
            .unwrap();
        client
            .execute(
                sql::UNMARK_FAILED,
                &[&2i64, &"refused", &base_ms, &max_ms, &server_clock],
            )
            .await
            .unwrap();
        client.batch_execute("COMMIT").await.unwrap();
        let rows = client
            .query(
                "SELECT published_at IS NULL, attempts, last_error FROM outbox ORDER BY id",
                &[],
            )
            .await
            .unwrap();
        let rows: Vec<(bool, i32, String)> = rows
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect();
        let expected = (true, 4, "refused".to_string());
        assert_eq!(rows, vec![expected.clone(), expected]);
        // The same backoff (200 ms * 2^3): row 2's is later only by the moments between the two
        // statements, where another exponent would move it 0.8 s or 1.6 s.
        let later_s: f64 = client
            .query_one(
                "SELECT EXTRACT(EPOCH FROM max(next_attempt_at) FILTER (WHERE id = 2)
                                        - max(next_attempt_at) FILTER (WHERE id = 1))::float8
                   FROM outbox",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert!((0.0..0.7).contains(&later_s), "{later_s} s");
    });
}
