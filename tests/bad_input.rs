//! Bad input and broken environments: one line on stderr saying what to do, exit 2, and
//! nothing created.

use crate::common;

use std::io::Read;
use std::net::TcpListener;

use common::{assert_usage_error, outbox_lab, scratch_dir, Run};

fn run(args: &[&str]) -> Run {
    let results = scratch_dir("bad-input-results");
    let output = outbox_lab()
        .args(args)
        .arg("--results-dir")
        .arg(&results)
        .output()
        .unwrap();
    Run::from(output)
}

#[test]
fn unknown_scenario_lists_the_known_ones() {
    let run = run(&["scenario", "relay-crahs"]);
    assert_usage_error(&run, "unknown scenario 'relay-crahs'");
    assert!(run.stderr.contains("relay-crash"));
}

#[test]
fn malformed_database_url() {
    let run = run(&[
        "scenario",
        "dual-write",
        "--database-url",
        "postgres://u@localhost:notaport/db",
    ]);
    assert_usage_error(&run, "invalid --database-url");
}

#[test]
fn unreachable_server() {
    // Nothing listens on a port we just released.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
    assert_usage_error(
        &run(&["scenario", "dual-write", "--database-url", &url]),
        "cannot connect to PostgreSQL",
    );
}

#[test]
fn port_taken_by_something_that_is_not_postgres() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!(
        "postgres://postgres@{}/postgres",
        listener.local_addr().unwrap()
    );
    // Accept and hang up without a word, like a wrong service would.
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let mut buf = [0u8; 64];
            let _ = stream.read(&mut buf);
        }
    });
    assert_usage_error(
        &run(&["scenario", "dual-write", "--database-url", &url]),
        "cannot connect to PostgreSQL",
    );
}

#[test]
fn crash_after_larger_than_events() {
    let run = run(&[
        "scenario",
        "relay-crash",
        "--events",
        "3",
        "--crash-after",
        "5",
    ]);
    assert_usage_error(&run, "--crash-after 5 must be between 1 and --events (3)");
}

/// A misspelt network fault is rejected before anything runs.
#[test]
fn misspelt_network_fault() {
    assert_usage_error(
        &run(&[
            "scenario",
            "reply-lost",
            "--set",
            "faults=[\"reply-lots@2\"]",
        ]),
        "unknown network fault 'reply-lots'",
    );
}

#[test]
fn parameter_the_scenario_does_not_take() {
    assert_usage_error(
        &run(&["scenario", "dual-write", "--events", "3"]),
        "has no parameter events",
    );
}

#[test]
fn missing_postgres_binaries_say_what_to_install() {
    let run = run(&["scenario", "dual-write", "--pg-bin", "/nonexistent/bin"]);
    assert_usage_error(&run, "apt-get install postgresql");
}

/// `--pg-bin` relative to where outbox-lab is started, as anyone types it, means that
/// directory (the cluster is started from another).
#[test]
fn a_relative_pg_bin_is_read_from_where_outbox_lab_runs() {
    let bins = outbox_lab::harness::cluster::PgBinaries::find(None).unwrap();
    let bin = bins.initdb.parent().unwrap();
    let (parent, name) = (bin.parent().unwrap(), bin.file_name().unwrap());
    let output = outbox_lab()
        .current_dir(parent)
        .args(["scenario", "dual-write", "--format", "json", "--pg-bin"])
        .arg(name)
        .arg("--results-dir")
        .arg(scratch_dir("relative-pg-bin"))
        .output()
        .unwrap();
    common::assert_passed(&Run::from(output));
}

#[test]
fn malformed_scenario_file() {
    let dir = scratch_dir("bad-toml");
    std::fs::write(
        dir.join("relay-crash.toml"),
        "name = \"relay-crash\"\n[params\nevents = 5\n",
    )
    .unwrap();
    let run = run(&[
        "scenario",
        "relay-crash",
        "--scenarios-dir",
        dir.to_str().unwrap(),
    ]);
    assert_usage_error(&run, "malformed scenario file");
    assert!(run.stderr.contains("line 2"), "{}", run.stderr);
}

#[test]
fn malformed_expectation_in_scenario_file() {
    let dir = scratch_dir("bad-check");
    let text = include_str!("../scenarios/relay-crash.toml")
        .replace("equals = \"events\"", "equals = \"events +\"");
    std::fs::write(dir.join("relay-crash.toml"), text).unwrap();
    let run = run(&[
        "scenario",
        "relay-crash",
        "--scenarios-dir",
        dir.to_str().unwrap(),
    ]);
    assert_usage_error(&run, "cannot read expression 'events +'");
}

/// A check naming a metric the scenario does not report, or reading one in its bounds, is
/// refused before anything runs (not found after the run as "(not measured)").
#[test]
fn check_naming_an_unknown_metric_is_found_first() {
    let original = include_str!("../scenarios/relay-crash.toml");
    for (from, to, named) in [
        (
            "metric = \"naive.received\"",
            "metric = \"naive.recieved\"",
            "naive.recieved",
        ),
        (
            "equals = \"events\"",
            "equals = \"naive.distinct_event\"",
            "naive.distinct_event",
        ),
    ] {
        assert!(original.contains(from), "{from}");
        let dir = scratch_dir("unknown-metric");
        std::fs::write(dir.join("relay-crash.toml"), original.replace(from, to)).unwrap();
        let started = std::time::Instant::now();
        let run = run(&[
            "scenario",
            "relay-crash",
            "--scenarios-dir",
            dir.to_str().unwrap(),
        ]);
        assert_usage_error(
            &run,
            &format!("names '{named}', which scenario relay-crash does not report"),
        );
        assert!(run.stderr.contains("naive.received"), "{}", run.stderr);
        assert!(started.elapsed().as_secs() < 5, "the scenario ran first");
    }
}

#[test]
fn unknown_crash_point_in_a_child_is_rejected() {
    let spec = r#"{"database": {"server_url": "postgres://x@127.0.0.1/x", "name": "x"},
                   "crash_at": "writer-after-lunch", "role": {"writer": {}}}"#;
    let out = outbox_lab()
        .args(["child", "writer"])
        .env("OUTBOX_LAB_CHILD_SPEC", spec)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unknown crash point 'writer-after-lunch'"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// clap's own errors (a value not among the possible ones) are one line too.
#[test]
fn a_value_clap_rejects_is_one_line() {
    let run = run(&["scenario", "relay-crash", "--format", "xml"]);
    assert_usage_error(&run, "invalid value 'xml' for '--format");
    assert!(run.stderr.contains("text, json"), "{}", run.stderr);
}

/// outbox-lab without `--results-dir` (the commands that take none).
fn run_plain(args: &[&str]) -> Run {
    Run::from(outbox_lab().args(args).output().unwrap())
}

/// A relay's arguments: a database nothing listens on, so that only the one bad argument can
/// be what the error is about (an accepted argument would end in "cannot connect").
fn relay(extra: &[&str]) -> Run {
    let mut args = vec![
        "relay",
        "--database-url",
        "postgres://postgres@127.0.0.1:1/postgres",
    ];
    if !extra.contains(&"--sink") {
        args.extend(["--sink", "http://127.0.0.1:1"]);
    }
    args.extend(extra);
    run_plain(&args)
}

/// A relay that fetches no rows would never deliver; one that polls every 0 ms spins.
#[test]
fn relay_batch_and_interval_below_one() {
    assert_usage_error(
        &relay(&["--batch", "0"]),
        "'--batch <BATCH>': 0 is not in 1..",
    );
    assert_usage_error(&relay(&["--batch=-3"]), "-3 is not in 1..");
    assert_usage_error(
        &relay(&["--interval-ms", "0"]),
        "'--interval-ms <INTERVAL_MS>': 0 is not in 1..",
    );
    assert_usage_error(&relay(&["--workers", "0"]), "0 is not in 1..=16");
    // Workers split the aggregates among themselves: a partition of its own is another split.
    assert_usage_error(
        &relay(&["--workers", "2", "--partition", "0/2"]),
        "cannot be used with",
    );
}

/// A sink the relay cannot deliver to would dead-letter every event: refused up front.
#[test]
fn relay_sink_with_an_unknown_scheme() {
    for sink in ["ftp://x", "https://x", "localhost:8080"] {
        let run = relay(&["--sink", sink]);
        assert_usage_error(&run, &format!("invalid value '{sink}' for '--sink <URL>'"));
        assert!(run.stderr.contains("http://HOST:PORT"), "{}", run.stderr);
    }
}

/// A flag for another kind of sink would be silently ignored: refused, without the URL (it
/// may hold a password).
#[test]
fn relay_flags_of_another_sink() {
    let redis = "redis://:s3cret@127.0.0.1:1";
    for extra in [
        ["--in-flight", "4"],
        ["--http-body", "array"],
        ["--no-publish-acks", "--name=x"],
    ] {
        let run = relay(&[&["--sink", redis][..], &extra[..]].concat());
        assert_usage_error(&run, "leave");
        assert!(!run.stderr.contains("s3cret"), "{}", run.stderr);
    }
    let run = relay(&["--no-publish-acks"]);
    assert_usage_error(&run, "--no-publish-acks is for nats:// and amqp:// sinks");
}

/// `scenario all` applies a parameter to the scenarios that have it; one that none has is a
/// typo, refused before anything starts (the missing server binaries are never looked for).
#[test]
fn parameter_no_scenario_of_all_takes() {
    let run = run(&[
        "scenario",
        "all",
        "--set",
        "bogus=1",
        "--pg-bin",
        "/nonexistent/bin",
    ]);
    assert_usage_error(&run, "no scenario of this run has a parameter bogus");
    assert!(run.stderr.contains("crash_after"), "{}", run.stderr);
}

/// A --set value of the wrong type is the command line's fault, not the scenario file's.
#[test]
fn set_value_of_the_wrong_type() {
    let run = run(&["scenario", "relay-crash", "--set", "events=abc"]);
    assert_usage_error(&run, "--set events=abc");
    assert!(run.stderr.contains("expected u32"), "{}", run.stderr);
    assert!(!run.stderr.contains("malformed"), "{}", run.stderr);
}

/// An unwritable --results-dir is found before any server starts (here: before looking for the
/// PostgreSQL binaries, which do not exist either).
#[test]
fn unwritable_results_dir_is_found_first() {
    let out = outbox_lab()
        .args(["scenario", "dual-write", "--pg-bin", "/nonexistent/bin"])
        .args(["--results-dir", "/proc/outbox-lab-results"])
        .output()
        .unwrap();
    assert_usage_error(
        &Run::from(out),
        "cannot write results under /proc/outbox-lab-results",
    );
}

/// A --redis-url that answers nothing is found before any server starts.
#[test]
fn unreachable_redis_url_is_found_first() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let run = run(&[
        "scenario",
        "redis-stream",
        "--pg-bin",
        "/nonexistent/bin",
        "--redis-url",
        &format!("redis://127.0.0.1:{port}/"),
    ]);
    assert_usage_error(&run, "cannot connect to Redis");
}
