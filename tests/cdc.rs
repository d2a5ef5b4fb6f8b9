//! The log-tailing relay and the faulty network, on a real PostgreSQL (wal_level=logical):
//! outcomes asserted from the run's metrics and from the server.

use crate::common;

use common::{assert_passed, scenario, scenario_alone};

/// A CDC relay that dies after sending and before confirming loses nothing: the restarted relay
/// streams the unconfirmed transaction again (one duplicate), and the slot is dropped after.
/// On a cluster of its own: its WAL figures are the whole cluster's.
#[test]
fn cdc_relay_crash_after_send_before_confirm_loses_nothing() {
    let _timed = common::timed(); // its latencies are judged against each other
    let run = scenario_alone("cdc", &["--quick"]);
    assert_passed(&run);
    assert_eq!(run.metric("cdc.lost"), 0);
    assert_eq!(run.metric("cdc.duplicates"), 1);
    let events = run.json()["params"]["latency_events"].as_i64().unwrap()
        + 2
        + run.json()["params"]["crash_events"].as_i64().unwrap();
    assert_eq!(run.metric("cdc.received"), events + 1);
    // The article's relay sends the whole crashed batch again.
    assert_eq!(
        run.metric("poll100.duplicates"),
        run.json()["params"]["crash_after"].as_i64().unwrap()
    );
    assert_eq!(run.metric("cdc.deleted_rows_delivered"), 5);
    assert_eq!(run.metric("cdc.orders_without_event"), 0);
    assert!(run.metric("slot.retained_bytes_down") >= run.metric("slot.wal_written_bytes_down"));
    assert!(run.metric("slot.retained_bytes_after") < run.metric("slot.retained_bytes_down"));
    // Other tables written, the outbox quiet: only the relay's heartbeat lets that WAL go.
    let unrelated = run.metric("slot.unrelated_written_bytes");
    assert!(run.metric("no_heartbeat.retained_bytes") >= unrelated);
    assert!(run.metric("heartbeat.retained_bytes") * 10 <= unrelated);
    assert_eq!(run.metric("heartbeat.unconfirmed_bytes"), 0);
    // Nothing of the run is left on the server: no slot retains WAL (counted on the server).
    assert_eq!(run.metric("slot.left"), 0);
}

/// Replies lost after the consumer committed: the naive consumer ships those orders twice, the
/// idempotent one never, and every event arrives.
#[test]
fn reply_lost_duplicates_for_naive_none_for_idempotent() {
    let run = scenario("reply-lost", &[]);
    assert_passed(&run);
    assert_eq!(run.metric("naive.replies_lost"), 2);
    assert_eq!(run.metric("naive.resets"), 1);
    assert_eq!(run.metric("naive.duplicate_shipments"), 2);
    assert_eq!(run.metric("idempotent.replies_lost"), 2);
    assert_eq!(run.metric("idempotent.duplicate_shipments"), 0);
    assert_eq!(run.metric("idempotent.distinct_events"), 5);
    assert_eq!(run.metric("lost"), 0);
}
