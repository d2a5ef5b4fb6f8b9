//! `outbox-lab verify` given bad input — a relay command that is not there, exits at once or
//! never connects, user SQL that does not apply, breaks our tables or is too slow — and a run
//! cut short by --time-limit, inconclusive rather than a verdict.

use crate::common;

use common::verify::{our_relay, verify, verify_alone};
use common::{assert_usage_error, run_tracked, scratch_dir, throwaway_dirs_of};

#[test]
fn a_relay_command_that_is_not_there_is_bad_input() {
    let run = verify(&["--relay-cmd", "no-such-relay-xyz --batch 5"]);
    assert_usage_error(&run, "program 'no-such-relay-xyz' not found");
    let run = verify(&["--relay-cmd", "sh -c {nope}"]);
    assert_usage_error(&run, "unknown placeholder {nope}");
    let run = verify(&["--relay-cmd", "sh", "--relays", "0"]);
    assert_usage_error(&run, "0 is not in 1..=8");
    let run = verify(&["--relay-cmd", "sh", "--events", "-1"]);
    assert_usage_error(&run, "is not in 10..=100000");
    let run = verify(&["--relay-cmd", "sh", "--schedule", "pause:relay@250ms+0ms"]);
    assert_usage_error(&run, "pauses nothing");
    let run = verify(&["--relay-cmd", "sh", "--nemesis", "kill,flood"]);
    assert_usage_error(&run, "unknown nemesis 'flood'");
    let run = verify(&[
        "--relay-cmd",
        "sh",
        "--nemesis",
        "kill",
        "--replication",
        "sync",
    ]);
    assert_usage_error(
        &run,
        "--replication says how the database of a db-failover replicates",
    );
    let run = verify(&[
        "--relay-cmd",
        "sh",
        "--sink",
        "redis",
        "--schedule",
        "net:reset@5",
    ]);
    assert_usage_error(&run, "with --sink redis, use kill");
    // A nemesis on a delivery needs outbox-lab in the path: never an approximate trigger.
    for sink in ["nats", "amqp"] {
        let run = verify(&[
            "--relay-cmd",
            "sh",
            "--sink",
            sink,
            "--schedule",
            "kill:relay:on-delivery@3",
        ]);
        assert_usage_error(
            &run,
            "exactly only through its HTTP, Redis and Kafka proxies",
        );
    }
    let run = verify(&[
        "--relay-cmd",
        "sh",
        "--schedule",
        "kill:writer:on-delivery@3",
    ]);
    assert_usage_error(&run, "on-delivery strikes the relay that sent the delivery");
    // --insert-sql goes with a count of what the relay owes in its own table.
    let run = verify(&["--relay-cmd", "sh", "--insert-sql", "SELECT 1"]);
    assert_usage_error(&run, "--pending-sql");
}

/// An insert of the user's that does not prepare on their schema is bad input naming
/// --insert-sql, found before any run.
#[test]
fn an_insert_that_does_not_prepare_is_bad_input() {
    let run = verify(&[
        "--relay-cmd",
        "sh",
        "--pending-sql",
        "SELECT 0::bigint",
        "--insert-sql",
        "INSERT INTO no_such_table VALUES ($1)",
    ]);
    assert_usage_error(&run, "--insert-sql does not prepare on your schema");
    assert!(run.stderr.contains("no_such_table"), "{}", run.stderr);
}

/// A relay that exits at once, before any fault, is bad input with its last lines; the
/// throwaway cluster and the relay are gone afterwards.
#[test]
fn a_relay_that_exits_at_once_is_bad_input_and_nothing_is_left() {
    let results = scratch_dir("verify-exits");
    let (pid, run) = run_tracked(&mut verify_alone(
        &results,
        &[
            "--relay-cmd",
            "sh -c 'echo cannot parse my config >&2; exit 3'",
        ],
    ));
    assert_usage_error(&run, "exited by itself");
    assert!(
        run.stderr.contains("cannot parse my config"),
        "{}",
        run.stderr
    );
    assert!(throwaway_dirs_of("pg", pid).is_empty());
}

/// A relay that runs but never connects to the database is bad input, said by the liveness
/// bound at the latest (the default run's comes before the 30 s connect bound).
#[test]
fn a_relay_that_never_connects_is_bad_input() {
    let run = verify(&[
        "--relay-cmd",
        "sh -c 'echo waiting for Kafka >&2; exec sleep 60'",
    ]);
    assert_usage_error(&run, "no relay connected to the database");
    assert!(run.stderr.contains("waiting for Kafka"), "{}", run.stderr);
}

#[test]
fn a_schema_file_that_does_not_apply_is_bad_input() {
    let dir = scratch_dir("verify-schema");
    let schema = dir.join("schema.sql");
    std::fs::write(&schema, "CREATE TABLEX relay_offsets (id int);").unwrap();
    let run = verify(&["--relay-cmd", "sh", "--schema", schema.to_str().unwrap()]);
    assert_usage_error(&run, "--schema does not apply");
    let run = verify(&[
        "--relay-cmd",
        "sh",
        "--pending-sql",
        "SELECT count(*) FROM nowhere",
    ]);
    assert_usage_error(&run, "--pending-sql does not run");
    let run = verify(&["--relay-cmd", "sh", "--pending-sql", "SELECT 'many'"]);
    assert_usage_error(&run, "--pending-sql must return one bigint");
}

/// A relay that does nothing and ends at once with status 0 (`true`) never connects: bad
/// input, said within seconds — not a liveness verdict after the time limit.
#[test]
fn a_relay_that_ends_at_once_with_status_0_is_bad_input() {
    let started = std::time::Instant::now();
    let run = verify(&["--relay-cmd", "true"]);
    assert_usage_error(&run, "exited by itself");
    assert!(started.elapsed().as_secs() < 10, "{:?}", started.elapsed());
}

/// A relay whose processes keep ending by themselves before any connects to the database does
/// not run at all, though a nemesis struck one of them meanwhile (the kill due at 250 ms): bad
/// input, at once, not a liveness verdict after the bound (which the build before gave).
#[test]
fn a_relay_that_keeps_ending_unconnected_is_bad_input_whatever_struck_meanwhile() {
    let started = std::time::Instant::now();
    let run = verify(&["--relay-cmd", "sleep 0.1"]);
    assert_usage_error(&run, "none connected to the database");
    assert!(started.elapsed().as_secs() < 10, "{:?}", started.elapsed());
}

/// A schema file that drops or changes outbox-lab's tables is bad input naming --schema: it
/// runs as the relays' role, which may not (the consumer's tables are not even in its
/// database); on a server whose role is the relays' too (no roles could be made there), the
/// check after it finds what it broke.
#[test]
fn a_schema_that_breaks_our_tables_is_bad_input() {
    let dir = scratch_dir("verify-schema-breaks");
    let owner = common::verify::PlainOwner::new("schema_breaker");
    for (ddl, as_relay) in [
        (
            "DROP TABLE consumer.shipments;",
            "schema \"consumer\" does not exist",
        ),
        (
            "DROP TABLE outbox CASCADE;",
            "must be owner of table outbox",
        ),
        (
            "ALTER TABLE outbox DROP COLUMN payload;",
            "must be owner of table outbox",
        ),
    ] {
        let schema = dir.join("schema.sql");
        std::fs::write(&schema, ddl).unwrap();
        let schema = schema.to_str().unwrap();
        let run = verify(&["--relay-cmd", "sh", "--schema", schema]);
        assert_usage_error(&run, "--schema does not apply");
        assert!(run.stderr.contains(as_relay), "{}", run.stderr);
        if ddl.contains("outbox") {
            let results = scratch_dir("verify-schema-breaks-owner");
            let output = common::outbox_lab()
                .args(["verify", "--format", "json", "--database-url", &owner.url])
                .arg("--results-dir")
                .arg(&results)
                .args(["--relay-cmd", "sh", "--schema", schema])
                .output()
                .unwrap();
            assert_usage_error(
                &common::Run::from(output),
                "--schema breaks outbox-lab's tables",
            );
        }
    }
}

/// The user's SQL runs under a statement timeout of a quarter of --time-limit: too slow is
/// bad input that says so, within seconds, not a hang.
#[test]
fn slow_user_sql_is_bad_input_within_its_bound() {
    let dir = scratch_dir("verify-slow-sql");
    let schema = dir.join("schema.sql");
    std::fs::write(&schema, "SELECT pg_sleep(1000);").unwrap();
    for args in [
        vec!["--pending-sql", "SELECT count(*) FROM pg_sleep(1000)"],
        vec!["--schema", schema.to_str().unwrap()],
    ] {
        let started = std::time::Instant::now();
        let mut all = vec!["--relay-cmd", "sh", "--time-limit", "8s"];
        all.extend(args);
        let run = verify(&all);
        assert_usage_error(&run, "bounded by 2s here, a quarter of --time-limit");
        assert!(started.elapsed().as_secs() < 8, "{:?}", started.elapsed());
    }
}

/// A run cut short by --time-limit before the relays drained is inconclusive (exit 4), not
/// a liveness violation of the relay's.
#[test]
fn a_run_cut_short_by_the_time_limit_is_inconclusive() {
    let run = verify(&[
        "--relay-cmd",
        &our_relay(""),
        "--events",
        "100000",
        "--time-limit",
        "5s",
        "--nemesis",
        "none",
    ]);
    assert_eq!(run.code, 4, "{}", run.stderr);
    assert_eq!(run.metric("verify.inconclusive"), 1);
    assert_eq!(run.metric("verify.liveness.violating"), 0);
    assert_eq!(run.metric("verify.lost.violating"), 0);
    assert!(run.metric("verify.written") < 100_000);
    assert!(run.stderr.contains("inconclusive"), "{}", run.stderr);
}
