//! The storage scenarios (partial-index, cleanup, claim-vs-lock) and `outbox-lab prune`, on a
//! real PostgreSQL: the shapes and figures of the article, from the metrics and from the kept
//! databases.

use crate::common;

use std::sync::Mutex;

use chrono::{TimeDelta, Utc};
use common::{assert_passed, outbox_lab, query_i64, scenario, Run};
use outbox_lab::ops::partitions;

/// The scenarios that compare timings (cleanup's DROP against its DELETE, claim-vs-lock's
/// waits) run one at a time: on 2 cores, another scenario beside them is load their figures
/// would measure (a DROP once took 161 ms against a bound of 115).
static TIMED: Mutex<()> = Mutex::new(());

fn kept_database(run: &Run, suffix: &str) -> String {
    run.stderr
        .lines()
        .filter_map(|l| l.strip_prefix("kept database "))
        .find(|name| name.ends_with(suffix))
        .unwrap_or_else(|| panic!("no kept database *{suffix} in {}", run.stderr))
        .to_string()
}

/// partial-index at the article's size: the partial index reads under 1% of the seq scan's
/// buffers; without it the fetch filters out every published row; churn undoes it until VACUUM.
#[test]
fn partial_index_reads_a_few_buffers_until_churn() {
    let _alone = TIMED.lock().unwrap_or_else(|e| e.into_inner());
    let run = scenario("partial-index", &[]);
    assert_passed(&run);
    assert_eq!(run.metric_str("with_index.node"), "Index Scan");
    assert_eq!(
        run.metric_str("with_index.index_name"),
        "outbox_unpublished_idx"
    );
    assert_eq!(run.metric("with_index.rows"), 50);
    assert_eq!(run.metric_str("without_index.node"), "Seq Scan");
    assert_eq!(run.metric("without_index.rows_removed_by_filter"), 200_000);
    assert!(run.metric("with_index.buffers") * 100 < run.metric("without_index.buffers"));
    assert!(run.metric("without_index.buffers") >= run.metric("table_blocks"));
    // The article's table: ~62 MB, ~7,979 blocks.
    let blocks = run.metric("table_blocks");
    assert!((7_500..8_500).contains(&blocks), "{blocks} blocks");
    assert_eq!(run.metric("index_bytes"), 16_384);
    assert!(run.metric("churned_first.buffers") >= run.metric("without_index.buffers"));
    assert!(run.metric("churned_second.buffers") < run.metric("churned_first.buffers"));
    assert!(run.metric("churned_after_vacuum.buffers") < run.metric("churned_second.buffers"));
    let json = run.json();
    let plans: Vec<&str> = json["tables"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["title"].as_str())
        .filter(|t| t.starts_with("EXPLAIN"))
        .collect();
    assert_eq!(plans.len(), 2, "{plans:?}");
}

/// cleanup at the article's size: DELETE keeps the file and leaves 200,000 dead tuples, VACUUM
/// keeps the file, VACUUM FULL shrinks it; DETACH + DROP takes one partition, the guard keeps
/// the one with an unpublished row (checked in the kept database).
#[test]
fn cleanup_delete_keeps_the_file_and_drop_is_guarded() {
    let _alone = TIMED.lock().unwrap_or_else(|e| e.into_inner());
    let _timed = common::timed();
    let run = scenario("cleanup", &["--keep"]);
    assert_passed(&run);
    let before = run.metric("size_before_bytes");
    assert!(before > 60_000_000, "{before} bytes");
    assert_eq!(run.metric("size_after_delete_bytes"), before);
    assert_eq!(run.metric("dead_tuples_after_delete"), 200_000);
    assert_eq!(run.metric("size_after_vacuum_bytes"), before);
    assert_eq!(run.metric("dead_tuples_after_vacuum"), 0);
    assert!(run.metric("size_after_vacuum_full_bytes") < before / 100);
    assert!(run.metric_f64("detach_ms") < run.metric_f64("after_delete_ms"));
    assert_eq!(run.metric("partitions_dropped"), 1);
    assert_eq!(run.metric("guard_refused"), 1);
    assert_eq!(run.metric("dead_tuples_after_drop"), 0);

    let db = kept_database(&run, "_partitions");
    assert_eq!(
        query_i64(
            &db,
            "SELECT count(*) FROM pg_inherits WHERE inhparent = 'outbox_p'::regclass"
        ),
        run.metric("partitions_before") - 1
    );
    assert_eq!(
        query_i64(&db, "SELECT count(*) FROM outbox_p WHERE published_at IS NULL AND created_at < now() - interval '3 days'"),
        1
    );
    let delete = kept_database(&run, "_delete");
    assert_eq!(query_i64(&delete, "SELECT count(*) FROM outbox"), 50);
}

/// claim-vs-lock with a faster sink: the lock design gets the crashed batch back at once and
/// holds a transaction through the slow batch; the lease design waits for the lease and holds
/// none, at the price of a second UPDATE per event.
#[test]
fn claim_waits_for_its_lease_lock_holds_a_transaction() {
    let _alone = TIMED.lock().unwrap_or_else(|e| e.into_inner());
    let _timed = common::timed();
    let dir = common::scratch_dir("claim-vs-lock-faster");
    let text = include_str!("../scenarios/claim-vs-lock.toml")
        .replace("sink_delay_ms = 200", "sink_delay_ms = 100");
    std::fs::write(dir.join("claim-vs-lock.toml"), text).unwrap();
    let run = scenario("claim-vs-lock", &["--scenarios-dir", dir.to_str().unwrap()]);
    assert_passed(&run);
    assert_eq!(run.metric("lock.redelivered"), 10);
    assert_eq!(run.metric("claim.redelivered"), 10);
    // The timing bounds are the scenario's checks', relative to its parameters (lease_ms 2000,
    // sink_delay_ms 100 here, batch 10); their margins, from 20 runs of this very file beside
    // `yes`, retry-backoff's runs and a cargo build, are in scenarios/claim-vs-lock.toml:
    // lock.recovery_ms 54-208 ms (690 once in a whole suite), claim.recovery_ms 1,357-1,928,
    // claim.max_xact_ms 0-18.4, lock.max_xact_ms 1,059-1,464.
    let (lease_ms, sink_delay_ms) = (2_000.0, 100.0);
    let lock_recovery = run.metric_f64("lock.recovery_ms");
    assert!(lock_recovery <= lease_ms / 2.0, "{lock_recovery} ms");
    let claim_recovery = run.metric_f64("claim.recovery_ms");
    assert!(
        (lease_ms / 2.0..=2.0 * lease_ms).contains(&claim_recovery),
        "{claim_recovery} ms"
    );
    // The lock design's transaction stays open through every delivery but the first's wait.
    assert!(run.metric_f64("lock.max_xact_ms") >= 9.0 * sink_delay_ms);
    let claim_xact = run.metric_f64("claim.max_xact_ms");
    assert!(claim_xact <= sink_delay_ms / 2.0, "{claim_xact} ms");
    assert_eq!(run.metric_f64("lock.updates_per_event"), 1.0);
    assert_eq!(run.metric_f64("claim.updates_per_event"), 2.0);
    assert_eq!(run.metric("lock.overtaken"), 5);
}

/// A database of this test's own on the shared cluster, with `sql` applied.
fn database_with(name: &str, sql: &str) -> String {
    common::create_database(name, sql).url()
}

fn prune(url: &str, args: &[&str]) -> Run {
    let output = outbox_lab()
        .args(["prune", "--database-url", url])
        .args(args)
        .output()
        .unwrap();
    Run::from(output)
}

/// prune as operators run it: --dry-run changes nothing; the real run drops the old, fully
/// published partition and never the one that still has an unpublished row.
#[test]
fn prune_never_drops_a_partition_with_unpublished_rows() {
    let today = Utc::now().date_naive();
    let day = |ago: i64| today - TimeDelta::days(ago);
    let name = |ago: i64| partitions::daily_partition_name(day(ago));
    let mut sql = format!(
        "{}\nCREATE TABLE plain (id int);\n",
        partitions::CREATE_OUTBOX_P
    );
    for ago in [10, 9, 1, 0] {
        sql.push_str(&partitions::create_daily_partition(day(ago)));
        sql.push_str(";\n");
    }
    let row = |ago: i64, published: &str| {
        format!(
            "INSERT INTO outbox_p (aggregate_type, aggregate_id, event_type, payload, created_at, published_at) \
             VALUES ('orders', '{ago}', 'OrderCreated', '{{}}', '{} 12:00+00', {published});\n",
            day(ago)
        )
    };
    sql.push_str(&row(10, "now()"));
    sql.push_str(&row(9, "now()"));
    sql.push_str(&row(9, "NULL"));
    sql.push_str(&row(1, "now()"));
    let db = format!("prune_test_{}", std::process::id());
    let url = database_with(&db, &sql);
    let partitions_now = || {
        query_i64(
            &db,
            "SELECT count(*) FROM pg_inherits WHERE inhparent = 'outbox_p'::regclass",
        )
    };

    let dry = prune(&url, &["--older-than", "3d", "--dry-run"]);
    assert_eq!(dry.code, 0, "{}", dry.stderr);
    assert!(
        dry.stdout
            .contains(&format!("would drop public.{}", name(10))),
        "{}",
        dry.stdout
    );
    assert!(
        dry.stderr.contains(&format!("keeping public.{}", name(9))),
        "{}",
        dry.stderr
    );
    assert!(!dry.stdout.contains(&name(1)), "{}", dry.stdout);
    assert_eq!(partitions_now(), 4, "a dry run changes nothing");

    let real = prune(&url, &["--older-than", "3d"]);
    assert_eq!(real.code, 0, "{}", real.stderr);
    assert!(
        real.stdout
            .contains(&format!("dropped public.{}", name(10))),
        "{}",
        real.stdout
    );
    assert!(real.stderr.contains("1 unpublished row"), "{}", real.stderr);
    assert_eq!(partitions_now(), 3);
    assert_eq!(
        query_i64(
            &db,
            &format!(
                "SELECT count(*) FROM pg_class WHERE relname = '{}'",
                name(10)
            )
        ),
        0
    );
    assert_eq!(
        query_i64(
            &db,
            "SELECT count(*) FROM outbox_p WHERE published_at IS NULL"
        ),
        1
    );
    assert_eq!(query_i64(&db, "SELECT count(*) FROM outbox_p"), 3);

    let again = prune(&url, &["--older-than", "3d"]);
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert_eq!(partitions_now(), 3, "the guard holds on every run");

    for (args, needle) in [
        (&["--older-than", "3 days"][..], "e.g. 3d or 12h"),
        (
            &["--older-than", "3d", "--table", "nosuch"][..],
            "no table named 'nosuch'",
        ),
        (
            &["--older-than", "3d", "--table", "plain"][..],
            "is not partitioned",
        ),
    ] {
        let bad = prune(&url, args);
        assert_eq!(bad.code, 2, "{args:?}: {}", bad.stderr);
        assert_eq!(bad.stderr.trim().lines().count(), 1, "{}", bad.stderr);
        assert!(bad.stderr.contains(needle), "{args:?}: {}", bad.stderr);
    }
    assert_eq!(partitions_now(), 3);
}
