//! The judged cannot touch the judge: hostile relays of our own (tests/relays/stranger.py) try
//! what a stranger's relay could, and each test asserts the exact verdict, and what each attempt
//! came to. Most as root only: it is root that runs strangers' relays as a uid of their own.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::Duration;

use crate::common;

use common::host::{command_lines_with, runs_as_root};
use common::verify::verify;
use common::{assert_passed, assert_usage_error, run_json, scratch_dir};

/// The hostile relay, acting as `act`, writing what it tried to `evidence`.
fn stranger(act: &str, evidence: &Path, extra: &str) -> String {
    let relay = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/relays/stranger.py");
    format!(
        "'{}' --act {act} --evidence '{}' --batch 20 --mode notify {extra}",
        relay.display(),
        evidence.display()
    )
}

/// A file the relay (another uid) may append to, in a directory of its own.
fn evidence_file(name: &str) -> PathBuf {
    let dir = scratch_dir(name);
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
    dir.join("evidence")
}

/// What the relay wrote it tried, a line each (`relay-0 what: refused (...)`).
fn evidence(file: &Path) -> Vec<String> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// The line of `lines` about `what`.
fn about<'a>(lines: &'a [String], what: &str) -> &'a str {
    lines
        .iter()
        .find(|line| line.contains(what))
        .unwrap_or_else(|| panic!("nothing about {what:?} in {lines:#?}"))
}

/// The offending ids of `invariant` in the main run of the verify whose results are in
/// `results` (its history: every id, not the table's first ten).
fn offending(results: &Path, invariant: &str) -> Vec<String> {
    let history = history_of(results);
    let main: serde_json::Value = serde_json::from_str(history.lines().next().unwrap()).unwrap();
    let ids = main["violations"][invariant].as_array().cloned();
    ids.unwrap_or_default()
        .iter()
        .map(|id| id.as_str().unwrap().to_string())
        .collect()
}

/// A relay that delivers nothing and marks every row published, after trying to write the
/// consumer's shipments and the judge's record and to reach the consumer's database: every
/// attempt refused, every event judged lost.
#[test]
fn a_relay_that_delivers_nothing_cannot_forge_the_verdict() {
    if !runs_as_root("a_relay_that_delivers_nothing_cannot_forge_the_verdict") {
        return;
    }
    let file = evidence_file("stranger-forge");
    let run = verify(&[
        "--relay-cmd",
        &stranger("forge", &file, ""),
        "--events",
        "100",
        "--nemesis",
        "none",
    ]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!(run.metric("verify.written"), 100);
    assert_eq!(run.metric("verify.delivered_distinct"), 0);
    assert_eq!(run.metric("verify.lost.violating"), 100);
    let lines = evidence(&file);
    for what in ["write the consumer's shipments", "write the judge's record"] {
        assert!(about(&lines, what).contains("refused"), "{lines:#?}");
    }
    // Its link admits only its role, to its database.
    for what in [
        "connect to the consumer's database",
        "connect as the superuser",
    ] {
        let line = about(&lines, what);
        assert!(
            line.contains("refused") && line.contains("link admits only"),
            "{line}"
        );
    }
}

/// A relay that sends the odd ids and deletes the even ones (and tries the judge's copy):
/// written is what the writer committed, and every erased id is lost.
#[test]
fn a_relay_that_erases_what_it_did_not_send_is_caught() {
    if !runs_as_root("a_relay_that_erases_what_it_did_not_send_is_caught") {
        return;
    }
    let file = evidence_file("stranger-erase");
    let results = scratch_dir("stranger-erase-results");
    let run = run_json(
        &["verify"],
        &results,
        &[
            "--relay-cmd",
            &stranger("erase", &file, ""),
            "--events",
            "100",
            "--nemesis",
            "none",
        ],
    );
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!(run.metric("verify.written"), 100);
    assert_eq!(run.metric("verify.lost.violating"), 50);
    let mut lost: Vec<String> = offending(&results, "lost")
        .iter()
        .map(|id| id.split(" (").next().unwrap().to_string())
        .collect();
    lost.sort_by_key(|id| id.trim_start_matches("outbox ").parse::<i64>().unwrap());
    let even: Vec<String> = (1..=50).map(|k| format!("outbox {}", 2 * k)).collect();
    assert_eq!(lost, even);
    let lines = evidence(&file);
    assert!(
        about(&lines, "erase the judge's copy").contains("refused"),
        "{lines:#?}"
    );
}

/// A relay's role is no superuser and may do nothing but its outbox's work: no shell command,
/// no dblink, no other role's session ended, no orders read, no outbox row inserted, no
/// trigger disabled, no server file read. It then relays honestly, and passes.
#[test]
fn a_relay_has_no_privilege_beyond_its_outbox() {
    if !runs_as_root("a_relay_has_no_privilege_beyond_its_outbox") {
        return;
    }
    let file = evidence_file("stranger-escalate");
    let run = verify(&[
        "--relay-cmd",
        &stranger("escalate", &file, ""),
        "--events",
        "40",
        "--nemesis",
        "none",
    ]);
    assert_passed(&run);
    let lines = evidence(&file);
    assert!(
        about(&lines, "am I a superuser").ends_with("done []"),
        "{lines:#?}"
    );
    for (what, why) in [
        ("run a shell command", "pg_execute_server_program"),
        ("create dblink", "permission denied to create extension"),
        ("end the other sessions", "InsufficientPrivilege"),
        ("read the orders", "permission denied for table orders"),
        ("insert an outbox row", "permission denied for table outbox"),
        ("disable the outbox's triggers", "must be owner"),
        (
            "read the server's files",
            "permission denied for function pg_ls_dir",
        ),
    ] {
        let line = about(&lines, what);
        assert!(line.contains("refused") && line.contains(why), "{line}");
    }
}

/// A relay that leaves a process behind (setsid, a double fork): gone when verify ends, said so
/// in the history; the next, honest run is unaffected.
#[test]
fn nothing_a_relay_started_outlives_its_run() {
    if !runs_as_root("nothing_a_relay_started_outlives_its_run") {
        return;
    }
    let file = evidence_file("stranger-leftover");
    let results = scratch_dir("stranger-leftover-results");
    let run = run_json(
        &["verify"],
        &results,
        &[
            "--relay-cmd",
            &stranger("leftover", &file, ""),
            "--events",
            "40",
            "--nemesis",
            "none",
        ],
    );
    assert_passed(&run);
    assert!(about(&evidence(&file), "left a process behind").contains("left"));
    assert_eq!(command_lines_with("sleep 6001.77"), Vec::<String>::new());
    let history = history_of(&results);
    assert!(
        history.contains("1 process(es) the relays started still ran after they stopped"),
        "{history}"
    );
    let honest = verify(&[
        "--relay-cmd",
        &stranger("honest", &evidence_file("stranger-after"), ""),
        "--events",
        "40",
        "--nemesis",
        "none",
    ]);
    assert_passed(&honest);
}

/// Two runs at once: neither's relay reads the other's environment (its database password,
/// its broker's token) or reaches the other's database link, while the relays of one run
/// (one uid) do read each other's: the probe bites.
#[test]
fn runs_cannot_read_or_reach_each_other() {
    if !runs_as_root("runs_cannot_read_or_reach_each_other") {
        return;
    }
    let spy = |name: &str, relays: &'static str| {
        let file = evidence_file(name);
        let relay = stranger("spy", &file, "--spy-for-s 4");
        let handle = thread::spawn(move || {
            verify(&[
                "--relay-cmd",
                &relay,
                "--relays",
                relays,
                "--events",
                "40",
                "--nemesis",
                "none",
            ])
        });
        (file, handle)
    };
    let (first, first_run) = spy("stranger-spy-a", "1");
    thread::sleep(Duration::from_secs(1));
    let (second, second_run) = spy("stranger-spy-b", "2");
    assert_passed(&first_run.join().unwrap());
    assert_passed(&second_run.join().unwrap());
    // Neither run's relays read another uid's environment or reach another run's link; the
    // second run's two relays (one uid) read each other's: the probe bites.
    for (lines, relays) in [(evidence(&first), 1), (evidence(&second), 2)] {
        let said = |what: &str| -> Vec<&String> {
            lines.iter().filter(|line| line.contains(what)).collect()
        };
        for what in [
            "other users' relays' environments read",
            "other database links reached",
        ] {
            let found = said(what);
            assert_eq!(found.len(), relays, "{lines:#?}");
            assert!(found.iter().all(|line| line.ends_with(": 0")), "{lines:#?}");
        }
        assert!(said("its own run's database links reached")
            .iter()
            .all(|line| !line.ends_with(": 0")));
        let siblings = said("its own run's relays' environments read");
        match relays {
            1 => assert!(
                siblings.iter().all(|line| line.ends_with(": 0")),
                "{lines:#?}"
            ),
            _ => assert!(
                siblings.iter().all(|line| !line.ends_with(": 0")),
                "{lines:#?}"
            ),
        }
    }
}

/// The user the servers run as is no user for a stranger's relay, as root is not.
#[test]
fn run_as_refuses_the_servers_user() {
    if !runs_as_root("run_as_refuses_the_servers_user") {
        return;
    }
    let run = verify(&["--relay-cmd", "true", "--run-as", "postgres"]);
    assert_usage_error(&run, "the throwaway servers run as postgres");
}

/// Every line of the run's histories.
fn history_of(results: &Path) -> String {
    let run = std::fs::read_dir(results).unwrap().next().unwrap().unwrap();
    let history = run.path().join("history/verify.jsonl");
    std::fs::read_to_string(&history).unwrap()
}

/// On a server whose role may not make roles (the user's, `--database-url`), the relay has that
/// role; the consumer's and the judge's records are then on a private cluster of outbox-lab's
/// own, out of its reach: a forging relay is judged lost all the same, an honest one passes.
#[test]
fn where_no_role_can_be_made_the_judge_keeps_its_records_elsewhere() {
    if !runs_as_root("where_no_role_can_be_made_the_judge_keeps_its_records_elsewhere") {
        return;
    }
    let owner = common::verify::PlainOwner::new("plain_owner");
    let url = owner.url.clone();
    let run_on = |act: &str, file: &Path| {
        let results = scratch_dir("stranger-plain-results");
        let output = common::outbox_lab()
            .args(["verify", "--format", "json", "--database-url", &url])
            .arg("--results-dir")
            .arg(&results)
            .args(["--relay-cmd", &stranger(act, file, "")])
            .args(["--events", "100", "--nemesis", "none"])
            .output()
            .unwrap();
        common::Run::from(output)
    };
    let file = evidence_file("stranger-plain");
    let forged = run_on("forge", &file);
    assert_eq!(forged.code, 1, "{}", forged.stderr);
    assert_eq!(forged.metric("verify.lost.violating"), 100);
    let lines = evidence(&file);
    // Refused by its link (which admits the URL's role to the run's database alone), and not
    // on this server at all.
    let reach = about(&lines, "connect to the consumer's database");
    assert!(reach.contains("refused"), "{reach}");
    assert_passed(&run_on("honest", &evidence_file("stranger-plain-honest")));
}
