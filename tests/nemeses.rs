//! explore's nemeses on real processes and a real PostgreSQL: a database restart loses no
//! committed event and every actor reconnects; a relay paused past its lease delivers after
//! another relay re-claimed its rows (claim-lease), which the fencing token stops
//! (claim-lease-fenced); a restart of a server that is not ours is refused.

use crate::common;

use std::path::PathBuf;

use common::{
    assert_passed, assert_usage_error, on_own_cluster, outbox_lab, run_json, scratch_dir, Run,
};

/// `outbox-lab explore ARGS --format json` on a throwaway cluster of its own (a database
/// restart restarts the whole server: not the one the other tests share).
fn explore_on_own_cluster(name: &str, args: &[&str]) -> (Run, PathBuf) {
    let results = scratch_dir(&format!("nemeses-{name}"));
    let output = on_own_cluster(&["explore"], &results, args)
        .output()
        .expect("outbox-lab runs");
    (Run::from(output), results)
}

/// PostgreSQL crashes (`-m immediate`) mid-run and comes back: outbox-idempotent loses no
/// committed event and ships none twice; the writer, the relay and the consumer reconnect
/// instead of dying; the history records the restart as fired.
#[test]
fn a_database_restart_loses_nothing_and_every_actor_reconnects() {
    let design = "outbox-idempotent";
    let (run, results) = explore_on_own_cluster(
        "restart",
        &["--design", design, "--schedule", "db:restart@60ms"],
    );
    assert_passed(&run);
    assert_eq!(run.metric(&format!("{design}.lost.violating")), 0);
    assert_eq!(run.metric(&format!("{design}.duplicate.violating")), 0);
    let history = common::explore_histories(&results, design).remove(0);
    let nemesis = &history["faults"][0];
    assert_eq!(nemesis["fault"], "db:restart@60ms");
    assert_eq!(nemesis["outcome"], "fired", "{history}");
    for process in history["processes"].as_array().unwrap() {
        let end = process["end"].as_str().unwrap();
        assert!(
            end == "ok" || end == "stopped at the end of the run",
            "{} did not reconnect: {end}",
            process["process"]
        );
    }
}

/// db:restart restarts the throwaway cluster only: against `--database-url` it is one line on
/// stderr and exit 2, before anything runs.
#[test]
fn a_database_restart_of_an_external_server_is_refused() {
    let results = scratch_dir("nemeses-external");
    let run = run_json(
        &["explore"],
        &results,
        &[
            "--design",
            "outbox-idempotent",
            "--schedule",
            "db:restart@60ms",
        ],
    );
    assert_usage_error(&run, "'db:restart@60ms' strikes the throwaway cluster only");
    assert_eq!(std::fs::read_dir(&results).unwrap().count(), 0);
}

/// The first relay to claim a batch stops right after, for longer than the lease; the other
/// re-claims and delivers those rows; the paused one goes on and delivers them again. Without a
/// fencing token the naive consumer ships them twice (claim-lease); with one, the consumer
/// refuses the paused relay's stale deliveries (409) and ships each event once
/// (claim-lease-fenced). Whichever relay claims first is struck (both are armed).
#[test]
fn a_relay_paused_past_its_lease_ships_twice_unless_fenced() {
    let schedule = "pause:relay:after-fetch@1+1s";
    let mut runs = Vec::new();
    for design in ["claim-lease", "claim-lease-fenced"] {
        let results = scratch_dir(&format!("nemeses-{design}"));
        let run = run_json(
            &["explore"],
            &results,
            // 12 orders: relay 0 surely claims a batch before relay 1 has taken everything.
            &["--design", design, "--orders", "12", "--schedule", schedule],
        );
        assert_passed(&run); // neither design claims duplicate: the metric says what happened
        let history = common::explore_histories(&results, design).remove(0);
        assert_eq!(history["faults"][0]["outcome"], "fired", "{history}");
        let struck = history["faults"][0]["process"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(
            ["relay0#1", "relay1#1"].contains(&struck.as_str()),
            "{history}"
        );
        runs.push((run, history));
    }
    let (unfenced, history) = &runs[0];
    assert_eq!(
        unfenced.metric("claim-lease.duplicate.violating"),
        1,
        "{history}"
    );
    let (fenced, history) = &runs[1];
    assert_eq!(
        fenced.metric("claim-lease-fenced.duplicate.violating"),
        0,
        "{history}"
    );
    assert_eq!(fenced.metric("claim-lease-fenced.lost.violating"), 0);
    // Not by luck: the paused relay did deliver after the re-claim, and was refused.
    let struck = &history["faults"][0]["process"];
    let refused =
        history["attempts"].as_array().unwrap().iter().any(|a| {
            a["process"] == *struck && a["error"].as_str().is_some_and(|e| e.contains("409"))
        });
    assert!(
        refused,
        "the paused relay's stale deliveries were not refused: {history}"
    );
}

/// A nemesis with a typo, or a pause at a crash point the design never passes, is one line on
/// stderr and exit 2, before any server is started.
#[test]
fn a_bad_nemesis_is_a_one_line_usage_error() {
    for (schedule, needle) in [
        ("pause:relay@60ms", "needs how long"),
        ("kill:relay@soon", "not a duration"),
        ("db:reboot@1s", "unknown database nemesis"),
        ("net:delay@2", "needs how long"),
        ("pause:relay:after-mark-before-send@1+1s", "never passes"),
    ] {
        let run = Run::from(
            outbox_lab()
                .args([
                    "explore",
                    "--design",
                    "outbox-idempotent",
                    "--schedule",
                    schedule,
                ])
                .output()
                .unwrap(),
        );
        assert_usage_error(&run, needle);
    }
}
