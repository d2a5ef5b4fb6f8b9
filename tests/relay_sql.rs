//! The relay's SQL statements run on their own against a fresh outbox: `requeue` (dead letters
//! only, never a row under retry or a row a relay holds).

mod common;

use std::time::Duration;

use common::{block_on, create_database};
use outbox_lab::outbox::relay;
use outbox_lab::outbox::schema;

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
