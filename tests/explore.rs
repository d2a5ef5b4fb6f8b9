//! explore on real PostgreSQL: the correct design holds what it claims over exhaustive and
//! random schedules, every deliberately broken design is caught with its characteristic
//! violation, a run's history is saved, and a bad schedule is a one-line usage error.

use crate::common;

use std::path::PathBuf;

use common::{assert_passed, outbox_lab, run_json, scratch_dir, server_url, Run};

/// `outbox-lab explore ARGS --format json` against this binary's cluster; also returns where
/// its results went.
fn explore(name: &str, args: &[&str]) -> (Run, PathBuf) {
    let results = scratch_dir(&format!("explore-{name}"));
    (run_json(&["explore"], &results, args), results)
}

/// outbox-idempotent claims ghost, lost, duplicate and liveness, and holds them over every
/// single crash (passes 1-2) and over seeded random multi-fault schedules.
#[test]
fn outbox_idempotent_holds_over_exhaustive_and_random_schedules() {
    let design = "outbox-idempotent";
    for (name, args) in [
        ("exhaustive", vec!["--design", design, "--max-pass", "2"]),
        (
            "random",
            vec!["--design", design, "--random", "15", "--seed", "7"],
        ),
    ] {
        let (run, _) = explore(name, &args);
        assert_passed(&run); // no claim violated
        let schedules = run.metric(&format!("{design}.schedules"));
        assert!(schedules >= 13, "{name}: {schedules} schedules");
        for invariant in ["ghost", "lost", "duplicate", "liveness"] {
            assert_eq!(
                run.metric(&format!("{design}.{invariant}.violating")),
                0,
                "{name}: {invariant}"
            );
        }
        // The rate counts every run (second runs too) over the matrix's time, which lies within
        // the command's: at least the schedules over the command's seconds (less the rate's
        // rounding to hundredths). At most 20 a second: each schedule resets its database and
        // starts a writer, relays and a consumer as processes (these two runs, beside `yes` and
        // other runs at load 7: 1.03 and 1.47 schedules/s); 20 a second would be under 50 ms
        // each.
        let per_s = run.metric_f64("schedules_per_s");
        let elapsed_s = run.json()["environment"]["elapsed_ms"].as_f64().unwrap() / 1000.0;
        assert!(
            (schedules as f64 / elapsed_s - 0.005..=20.0).contains(&per_s),
            "{name}: {per_s} schedules/s, {schedules} schedules in {elapsed_s} s"
        );
    }
}

/// Every broken design shows its flaw over every single crash; none breaks what it claims.
#[test]
fn broken_designs_are_caught_with_their_characteristic_violation() {
    let expected = [
        ("dual-write-commit-first", "lost"),
        ("dual-write-send-first", "ghost"),
        ("outbox-naive", "duplicate"),
        ("watermark-relay", "lost"),
        ("mark-before-send", "lost"),
        ("multi-relay-unpartitioned", "order"),
        ("guarded-no-dead-letter", "liveness"),
    ];
    let mut args = vec!["--max-pass", "2"];
    for (design, _) in expected {
        args.extend(["--design", design]);
    }
    let (run, _) = explore("broken", &args);
    assert_passed(&run); // no claim violated
    let json = run.json();
    for (design, flaw) in expected {
        let violating = run.metric(&format!("{design}.{flaw}.violating"));
        assert!(violating > 0, "{design} not caught: {flaw} never violated");
        // The smallest reproducer is printed as a ready command line.
        let reproducers = &json["tables"][1]["rows"];
        let row = reproducers
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r[0] == design && r[1] == flaw)
            .unwrap_or_else(|| panic!("no reproducer for {design} {flaw}"));
        let command = row[6].as_str().unwrap();
        assert!(
            command.starts_with(&format!(
                "outbox-lab explore --design {design} --schedule \""
            )),
            "{command}"
        );
    }
}

/// A relay that dies after sending, before marking, makes the naive consumer ship twice;
/// the history records both relay processes, the crash, and every attempt's outcome.
#[test]
fn one_schedule_reproduces_a_duplicate_and_saves_its_history() {
    let (run, results) = explore(
        "one",
        &[
            "--design",
            "outbox-naive",
            "--schedule",
            "relay:after-send@1",
        ],
    );
    assert_passed(&run); // no claim violated
    assert_eq!(run.metric("outbox-naive.schedules"), 1);
    assert_eq!(run.metric("outbox-naive.duplicate.violating"), 1);
    assert_eq!(run.metric("outbox-naive.lost.violating"), 0);
    let history = &common::explore_histories(&results, "outbox-naive")[0];
    assert_eq!(history["schedule"], "relay:after-send-before-mark@1");
    let processes = history["processes"].as_array().unwrap();
    assert!(processes.iter().any(
        |p| p["process"] == "relay0#1" && p["end"] == "crashed at relay-after-send-before-mark"
    ));
    assert!(processes
        .iter()
        .any(|p| p["process"] == "relay0#2" && p["end"] == "ok"));
    let fault = &history["faults"][0];
    assert_eq!(fault["fault"], "relay:after-send-before-mark@1");
    assert_eq!(fault["status"], "ok");
    assert_eq!(fault["outcome"], "fired");
    assert_eq!(fault["process"], "relay0#1");
    assert!(fault["at_ms"].as_u64().unwrap() > 0, "{fault}");
    assert!(!history["violations"]["duplicate"]
        .as_array()
        .unwrap()
        .is_empty());
}

/// A consumer that dies after committing, before replying, leaves the relay not knowing: the
/// attempt is recorded as `info`, and the idempotent consumer still ships once.
#[test]
fn unanswered_attempt_is_info_and_the_idempotent_consumer_holds() {
    let (run, results) = explore(
        "info",
        &[
            "--design",
            "outbox-idempotent",
            "--schedule",
            "consumer:after-commit@1",
        ],
    );
    assert_passed(&run); // no claim violated
    let history = &common::explore_histories(&results, "outbox-idempotent")[0];
    let outcomes: Vec<&str> = history["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["outcome"].as_str().unwrap())
        .collect();
    assert!(outcomes.contains(&"info"), "{outcomes:?}");
    assert!(outcomes.contains(&"ok"), "{outcomes:?}");
    assert!(history["processes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["end"] == "crashed at consumer-after-commit-before-reply"));
}

/// Liveness bites: a writer that dies before every COMMIT, in each of the 20 processes a run
/// may start, never finishes; the run is stuck, a claim of outbox-idempotent broken (exit 1).
#[test]
fn a_run_that_cannot_drain_violates_liveness() {
    let schedule = vec!["writer:after-insert@1"; 20].join(",");
    let (run, results) = explore(
        "liveness",
        &["--design", "outbox-idempotent", "--schedule", &schedule],
    );
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!(run.metric("outbox-idempotent.liveness.violating"), 1);
    assert_eq!(run.metric("outbox-idempotent.lost.violating"), 0);
    let history = &common::explore_histories(&results, "outbox-idempotent")[0];
    let why = history["violations"]["liveness"][0].as_str().unwrap();
    assert!(why.contains("the writer did not finish"), "{why}");
}

/// A crash point the workload never passes 99 times: the fault is not reached, the run is
/// reported apart and counts for no claim; with no other schedule, nothing was tested (exit 1).
#[test]
fn a_fault_not_reached_is_reported_apart_and_never_passes() {
    let (run, results) = explore(
        "not-reached",
        &[
            "--design",
            "outbox-idempotent",
            "--schedule",
            "relay:after-send@99",
        ],
    );
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!(run.metric("outbox-idempotent.schedules"), 1);
    assert_eq!(run.metric("outbox-idempotent.faults_not_reached"), 1);
    let json = run.json();
    let checks = json["checks"].as_array().unwrap();
    assert!(!checks.is_empty() && checks.iter().all(|c| c["pass"] == false));
    let row = &json["tables"][0]["rows"][0];
    assert_eq!(row[1], "0/0*", "{row}");
    assert_eq!(row[6], "1", "{row}");
    let history = &common::explore_histories(&results, "outbox-idempotent")[0];
    let fault = &history["faults"][0];
    assert_eq!(fault["fault"], "relay:after-send-before-mark@99");
    assert_eq!(fault["status"], "fail");
    assert_eq!(fault["outcome"], "not_reached");
}

/// The self-test bites: outbox-naive exists to show duplicates, but a writer that dies before
/// COMMIT causes no redelivery, so the checker is shown no duplicate — blind to it, as far as
/// this run can tell. explore does not cry all-clear: exit 1, "checker blind to duplicate".
#[test]
fn a_flaw_the_checker_does_not_see_fails_the_run() {
    let (run, _) = explore(
        "blind",
        &[
            "--design",
            "outbox-naive",
            "--schedule",
            "writer:after-insert@1",
        ],
    );
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!(run.metric("outbox-naive.duplicate.violating"), 0);
    let json = run.json();
    let failed: Vec<&str> = json["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["pass"] == false)
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        failed,
        ["checker sees duplicate: outbox-naive breaks it"],
        "only the self-test fails"
    );
    let text = Run::from(
        outbox_lab()
            .args(["explore", "--design", "outbox-naive"])
            .args(["--schedule", "writer:after-insert@1"])
            .args(["--database-url", server_url()])
            .arg("--results-dir")
            .arg(scratch_dir("explore-blind-text"))
            .output()
            .unwrap(),
    );
    assert_eq!(text.code, 1, "{}", text.stderr);
    assert!(
        text.stdout.contains("checker blind to duplicate"),
        "{}",
        text.stdout
    );
}

/// Liveness bites: the head-of-line guard behind a poison event with no dead letter blocks
/// order 1 for ever. The run is stopped at the liveness bound; the rows still owed are named,
/// and they are not counted as lost (the run never recovered).
#[test]
fn a_poison_event_without_dead_letter_violates_liveness() {
    let (run, results) = explore("poison", &["--design", "guarded-no-dead-letter"]);
    assert_passed(&run); // it claims no liveness, and shows its flaw
    assert_eq!(run.metric("guarded-no-dead-letter.liveness.violating"), 1);
    for invariant in ["ghost", "lost", "duplicate", "order"] {
        assert_eq!(
            run.metric(&format!("guarded-no-dead-letter.{invariant}.violating")),
            0,
            "{invariant}"
        );
    }
    let history = &common::explore_histories(&results, "guarded-no-dead-letter")[0];
    let offending: Vec<&str> = history["violations"]["liveness"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(offending[0].contains("not drained within"), "{offending:?}");
    assert_eq!(offending[1..], ["outbox 1", "outbox 2"]);
}

/// A schedule with a typo, or naming a crash point the design never passes, is one line on
/// stderr and exit 2, before any server is started.
#[test]
fn bad_schedule_is_a_one_line_usage_error() {
    for (args, needle) in [
        (
            vec!["explore", "--schedule", "relay:after-sned@1"],
            "invalid --schedule: no relay crash point starts with 'after-sned'",
        ),
        (
            vec![
                "explore",
                "--design",
                "outbox-idempotent",
                "--schedule",
                "writer:after-commit-before-send",
            ],
            "never passes",
        ),
        (
            vec!["explore", "--schedule", "relay:after-send@0"],
            "not a pass count",
        ),
        (
            vec!["explore", "--design", "outbox-magic"],
            "unknown design",
        ),
    ] {
        let run = Run::from(outbox_lab().args(&args).output().unwrap());
        assert_eq!(run.code, 2, "{args:?}: {}", run.stderr);
        assert_eq!(run.stderr.trim().lines().count(), 1, "{}", run.stderr);
        assert!(run.stderr.contains(needle), "{}", run.stderr);
        assert!(run.stdout.is_empty());
    }
}

/// A fault at a crash point of `relay` is reached whichever relay gets there first: every
/// relay is armed, the first to reach it takes it, and the history says which. Before, only
/// relay 0 was armed, and the lease design's other relay drained all 8 events before relay 0
/// fetched in 2 of 15 runs: NOT REACHED (20 of 20 reached now, by hand). Three runs each, a
/// pause and a crash.
#[test]
fn a_relay_fault_is_reached_by_whichever_relay_gets_there_first() {
    let design = "claim-lease-fenced";
    for schedule in [
        "pause:relay:after-fetch-before-send@1+600ms",
        "relay:after-send@3",
    ] {
        for k in 0..3 {
            let (run, results) = explore(
                &format!("first-to-reach-{k}"),
                &["--design", design, "--schedule", schedule],
            );
            assert_eq!(
                run.metric(&format!("{design}.faults_not_reached")),
                0,
                "{schedule}, run {k}: {}",
                run.stdout
            );
            let history = common::explore_histories(&results, design).remove(0);
            let struck = history["faults"][0]["process"]
                .as_str()
                .unwrap()
                .to_string();
            assert!(struck.starts_with("relay"), "{schedule}: {history}");
        }
    }
}
