//! A reader that stops early (`outbox-lab list | head -1`) is no failure: the command stops
//! quietly with status 0, never a panic; nor is a standard error that is gone (closed, or a pipe
//! whose reader left): a run goes on to its own status.

use crate::common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::{outbox_lab, scratch_dir, Run};
use outbox_lab::judge::expectations::CheckResult;
use outbox_lab::report::{Environment, Metrics, Report, Table};

/// Runs `command` with stdout a pipe whose reading end is already closed: its first write
/// fails with EPIPE, every time (no race with a reader).
fn with_stdout_closed(mut command: Command) -> Run {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let output = command
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    Run::from(output)
}

fn assert_quiet_success(run: &Run, what: &str) {
    assert_eq!(run.code, 0, "{what}: stderr: {}", run.stderr);
    assert!(!run.stderr.contains("panicked"), "{what}: {}", run.stderr);
    assert!(!run.stderr.contains("error"), "{what}: {}", run.stderr);
}

fn outbox_lab_with(args: &[&str]) -> Command {
    let mut command = outbox_lab();
    command.args(args);
    command
}

#[test]
fn list_into_a_closed_pipe_exits_0() {
    let run = with_stdout_closed(outbox_lab_with(&["list"]));
    assert_quiet_success(&run, "list");
}

#[test]
fn crash_points_into_a_closed_pipe_exits_0() {
    let run = with_stdout_closed(outbox_lab_with(&["crash-points"]));
    assert_quiet_success(&run, "crash-points");
}

#[test]
fn completions_into_a_closed_pipe_exit_0() {
    let run = with_stdout_closed(outbox_lab_with(&["completions", "bash"]));
    assert_quiet_success(&run, "completions");
}

/// `| head -1`: the reader takes a line and goes away while outbox-lab is still writing.
#[test]
fn a_reader_that_takes_one_line_and_leaves() {
    for args in [
        ["list"].as_slice(),
        &["crash-points"],
        &["completions", "zsh"],
    ] {
        let mut child = outbox_lab_with(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let mut first = [0u8; 1];
        std::io::Read::read_exact(&mut stdout, &mut first).unwrap();
        drop(stdout);
        let run = Run::from(child.wait_with_output().unwrap());
        assert_quiet_success(&run, &args.join(" "));
    }
}

/// A saved run of one made-up scenario, as `outbox-lab scenario` writes it.
fn saved_run(dir: &Path) {
    let mut table = Table::new("deliveries", &["relay", "delivered"]);
    for n in 0..200 {
        table.push(vec![n.to_string(), (n * 7).to_string()]);
    }
    let mut metrics = Metrics::default();
    metrics.set("delivered", 5);
    Report {
        scenario: "relay-crash".into(),
        section: "a section".into(),
        params: serde_json::json!({ "events": 5 }),
        metrics,
        tables: vec![table],
        checks: vec![CheckResult {
            name: "every event delivered".into(),
            metric: "delivered".into(),
            expected: "5".into(),
            actual: "5".into(),
            article: None,
            pass: true,
        }],
        targets: vec![],
        notes: vec![],
        environment: Environment {
            postgres_version: "17".into(),
            outbox_lab_version: "0.1.0".into(),
            started_at: "2026-12-02T15:36:35.000Z".into(),
            elapsed_ms: 1,
            server: "throwaway".into(),
        },
    }
    .write_files(dir)
    .unwrap();
}

#[test]
fn report_and_compare_into_a_closed_pipe_exit_0() {
    let dir = scratch_dir("pipes-run");
    saved_run(&dir);
    let dir = dir.to_str().unwrap();
    let run = with_stdout_closed(outbox_lab_with(&["report", dir]));
    assert_quiet_success(&run, "report");
    let run = with_stdout_closed(outbox_lab_with(&["compare", dir, dir]));
    assert_quiet_success(&run, "compare");
    // With a reader, the same run prints (the saved run is one `report` reads).
    let printed = Run::from(outbox_lab_with(&["report", dir]).output().unwrap());
    assert_eq!(printed.code, 0, "{}", printed.stderr);
    assert!(printed.stdout.contains("deliveries"), "{}", printed.stdout);
}

/// A standard error whose reader is gone (EPIPE on every write) or that is closed: a scenario
/// still runs to its own status (0: every check passed), never a panic (101).
#[test]
fn a_run_with_stderr_gone_ends_with_its_own_status() {
    let results = scratch_dir("stderr-gone");
    let scenario = || {
        let mut command = outbox_lab_with(&["scenario", "relay-crash", "--results-dir"]);
        command.arg(&results).stdout(Stdio::null());
        command
    };
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let status = scenario().stderr(writer).status().unwrap();
    assert_eq!(status.code(), Some(0), "stderr a broken pipe");
    let status = scenario().stderr(Stdio::null()).status().unwrap();
    assert_eq!(status.code(), Some(0), "stderr to /dev/null");
}
