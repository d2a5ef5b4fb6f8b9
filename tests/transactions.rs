//! verify under the transactions a relay must wait for (`txn:*`): a relay that reads past the
//! largest id it delivered, with the usual safety lag, is judged lost with the cause "skipped"
//! under the default nemeses; one that waits for each id in turn stalls for good behind a
//! rolled-back id, said so; one that waits for every older transaction (xid8) catches up once
//! a transaction idle for 3 s ends. Relays of tests/relays/horizon.py.

use std::path::Path;

use crate::common;

use common::verify::verify_alone;
use common::{assert_passed, scratch_dir, Run};

/// horizon.py as `design`, with its mark's table and its own count of what it owes.
fn horizon(design: &str, extra: &[&str]) -> Run {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/relays");
    let relay = format!(
        "'{}' --design {design} --batch 50 --mode notify",
        dir.join("horizon.py").display()
    );
    let pending = match design {
        "xid8" => {
            "SELECT count(*) FROM outbox WHERE (xmin::text::bigint, id) > \
             (SELECT coalesce(max(last_xid), 0), coalesce(max(last_id), 0) FROM horizon_mark)"
        }
        _ => {
            "SELECT count(*) FROM outbox WHERE id > \
             (SELECT coalesce(max(last_id), 0) FROM horizon_mark)"
        }
    };
    let schema = dir.join("horizon_schema.sql");
    let mut args = vec![
        "--relay-cmd",
        &relay,
        "--schema",
        schema.to_str().unwrap(),
        "--pending-sql",
        pending,
        "--events",
        "400",
    ];
    args.extend(extra);
    let results = scratch_dir(&format!("horizon-{design}"));
    Run::from(verify_alone(&results, &args).output().unwrap())
}

/// The lost events of the main run, from its history (every id, as the verdict words it).
fn lost(run: &Run) -> Vec<String> {
    let table = run.table("violations");
    let rows = table["rows"].as_array().unwrap();
    let row = rows.iter().find(|r| r[0] == "lost");
    row.map(|r| {
        r[3].as_str()
            .unwrap()
            .split(", ")
            .map(str::to_string)
            .collect()
    })
    .unwrap_or_default()
}

/// `id > mark` with a 200 ms safety lag, under every default nemesis: the slow commit's two
/// events are lost, and the verdict says they were skipped (committed after a later event was
/// delivered); every fault fired. The same relay without the slow commit loses nothing: the
/// cause is the slow commit.
#[test]
fn a_watermark_with_a_safety_lag_skips_a_slow_commit() {
    let run = horizon("lag-watermark", &[]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!(run.metric("verify.faults_not_reached"), 0);
    assert_eq!(run.metric("verify.lost.violating"), 2, "{}", run.stdout);
    assert_eq!(run.metric("verify.lost.skipped"), 2);
    let lost = lost(&run);
    assert!(
        lost.iter()
            .all(|id| id.contains("(skipped: committed ") && id.contains(" was delivered)")),
        "{lost:?}"
    );
    let without = horizon(
        "lag-watermark",
        &["--nemesis", "kill,pause,db-restart,txn-idle,txn-rollback"],
    );
    assert_passed(&without);
}

/// Waiting for each id in turn: a rolled-back id is a gap that never fills, and the relay stalls
/// behind it for good: a liveness failure that says so.
#[test]
fn a_relay_waiting_for_every_id_stalls_behind_a_rollback() {
    let run = horizon("gap-wait", &["--schedule", "txn:rollback@1s"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!(run.metric("verify.faults_fired"), 1);
    assert_eq!(run.metric("verify.lost.violating"), 0);
    let table = run.table("violations");
    let liveness = table["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r[0] == "liveness")
        .unwrap_or_else(|| panic!("no liveness row in {table}"))
        .clone();
    let said = liveness[3].as_str().unwrap();
    assert!(
        said.contains("stalled behind the gap txn:rollback@1s left (ids that never commit)"),
        "{said}"
    );
}

/// Waiting for every older transaction (xid8): a session idle in transaction for 3 s holds it
/// back, and once it ends the relay catches up within the bound, which counts from then: it
/// passes, every event delivered.
#[test]
fn a_relay_waiting_for_older_transactions_catches_up_once_they_end() {
    let run = horizon("xid8", &["--schedule", "txn:idle@1s+3s"]);
    assert_passed(&run);
    assert_eq!(run.metric("verify.delivered_distinct"), 400);
}
