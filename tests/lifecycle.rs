//! The throwaway cluster: nothing of ours is left behind after a run that passes, a run whose
//! check fails, a run stopped with Ctrl-C, and (by the next run) a run killed with SIGKILL.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::{long_run, outbox_lab, run_tracked, scratch_dir, throwaway_dirs_of};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use outbox_lab::harness::process::ProcessId;
use outbox_lab::wait;

/// The postmaster's pid, once the cluster in `dir` is ready.
fn ready_postmaster(dir: &Path) -> Option<i32> {
    let pid_file = std::fs::read_to_string(dir.join("server/data/postmaster.pid")).ok()?;
    let mut lines = pid_file.lines();
    let pid = lines.next()?.trim().parse().ok()?;
    (pid_file.lines().nth(7).map(str::trim) == Some("ready")).then_some(pid)
}

/// True while `pid` runs (a zombie does not count).
fn alive(pid: i32) -> bool {
    ProcessId::of(pid).is_some()
}

/// The cluster directory's name (`outbox-lab-pg-PID-...`): it appears, unencoded, in the
/// address the run's children are given.
fn run_tag(dir: &Path) -> String {
    dir.file_name().unwrap().to_string_lossy().into_owned()
}

/// Processes whose environment mentions `needle` (our children are handed the cluster's
/// address, its socket directory, in theirs: percent-encoded in a URL, so look for the
/// directory's name, see [`run_tag`]).
fn processes_mentioning(needle: &str) -> Vec<i32> {
    common::processes_whose("environ", |_, environ| environ.contains(needle))
}

/// Starts a long scenario on its own cluster, waits until it is under way, and returns the child, its cluster directory and the postmaster's pid.
fn start_long_run() -> (Child, PathBuf, i32) {
    start_long_run_with(Stdio::null())
}

/// [`start_long_run`], with its stderr going to `stderr`.
#[allow(clippy::zombie_processes)] // returned to the caller, which waits for it
fn start_long_run_with(stderr: Stdio) -> (Child, PathBuf, i32) {
    let results = scratch_dir("lifecycle-long");
    let mut child = long_run(&results)
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let started = Instant::now();
    loop {
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("cluster never became ready");
        }
        if let Some(dir) = throwaway_dirs_of("pg", child.id()).pop() {
            if let Some(postmaster) = ready_postmaster(&dir) {
                // Let the scenario get under way: a child of the run running (so its databases
                // are created), however slow the machine.
                wait::blocking_up_to(Duration::from_secs(30), Duration::from_millis(20), || {
                    !processes_mentioning(&run_tag(&dir)).is_empty()
                });
                return (child, dir, postmaster);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_gone(pid: i32) -> bool {
    let started = Instant::now();
    while alive(pid) && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    !alive(pid)
}

/// A passing run removes its cluster.
#[test]
fn passing_run_removes_its_cluster() {
    let (pid, run) = run_tracked(
        outbox_lab()
            .args(["scenario", "outbox-atomicity", "--results-dir"])
            .arg(scratch_dir("lifecycle-pass")),
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stdout.contains("outbox-atomicity: 7 of 7 checks pass"),
        "{}",
        run.stdout
    );
    assert!(throwaway_dirs_of("pg", pid).is_empty());
}

/// A run whose check fails exits 1, says which check, and removes its cluster.
#[test]
fn failing_check_exits_1_and_removes_its_cluster() {
    let dir = scratch_dir("lifecycle-fail");
    let text = include_str!("../scenarios/dual-write.toml").replacen(
        "equals = \"3\"",
        "equals = \"4\"",
        1,
    );
    std::fs::write(dir.join("dual-write.toml"), text).unwrap();
    let (pid, run) = run_tracked(
        outbox_lab()
            .args(["scenario", "dual-write", "--scenarios-dir"])
            .arg(&dir)
            .arg("--results-dir")
            .arg(&dir),
    );
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(run.stdout.contains("FAIL"), "{}", run.stdout);
    assert!(
        run.stdout.contains("dual-write: 9 of 10 checks pass"),
        "{}",
        run.stdout
    );
    assert!(throwaway_dirs_of("pg", pid).is_empty());
}

/// Ctrl-C mid-scenario: exit 130, the cluster, its directory and every child are gone.
#[test]
fn sigint_cleans_up_cluster_and_children() {
    let (mut child, dir, postmaster) = start_long_run();
    let address = run_tag(&dir);
    assert!(
        !processes_mentioning(&address).is_empty(),
        "no child of the run found: the check below would prove nothing"
    );
    kill(Pid::from_raw(child.id() as i32), Signal::SIGINT).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    assert!(
        wait_gone(postmaster),
        "postmaster {postmaster} still running"
    );
    assert!(!dir.exists(), "{} left behind", dir.display());
    // The children were signalled before the run exited; give them time to be reaped.
    let gone = wait::blocking_up_to(Duration::from_secs(10), Duration::from_millis(20), || {
        processes_mentioning(&address).is_empty()
    });
    assert!(
        gone.is_some(),
        "children of the run still running: {:?}",
        processes_mentioning(&address)
    );
}

/// SIGKILL leaves the cluster behind (nothing else can run); the next run removes it.
#[test]
fn cluster_of_a_killed_run_is_removed_by_the_next_run() {
    let (mut child, dir, postmaster) = start_long_run();
    kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL).unwrap();
    child.wait().unwrap();
    assert!(dir.exists(), "a SIGKILLed run cannot clean up");
    let next = outbox_lab()
        .args([
            "scenario",
            "outbox-atomicity",
            "--format",
            "json",
            "--results-dir",
        ])
        .arg(scratch_dir("lifecycle-next"))
        .output()
        .unwrap();
    assert_eq!(
        next.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&next.stderr)
    );
    assert!(
        wait_gone(postmaster),
        "postmaster {postmaster} of the killed run still running"
    );
    assert!(!dir.exists(), "{} left behind", dir.display());
}

/// The failover scenario's primary and standby, of a run SIGKILLed while the replication is
/// held (the primary's walsender stopped): both left behind, both removed (their postmasters
/// gone) by the next run, without waiting out the stopped walsender, which goes too.
#[test]
fn the_standby_of_a_killed_run_is_removed_by_the_next_run() {
    let _alone = common::holding_replication();
    let mut child = outbox_lab()
        .args([
            "scenario",
            "failover",
            "--set",
            "hold_ms=10000",
            "--results-dir",
        ])
        .arg(scratch_dir("lifecycle-failover"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let standby = wait::blocking_up_to(Duration::from_secs(60), Duration::from_millis(20), || {
        let dir = throwaway_dirs_of("pg-standby", child.id()).pop()?;
        let pid_file = std::fs::read_to_string(dir.join("server/data/postmaster.pid")).ok()?;
        let pid: i32 = pid_file.lines().next()?.trim().parse().ok()?;
        // A hot standby says "ready" once it takes reads (PostgreSQL 15), or "standby".
        let status = pid_file.lines().nth(7).map(str::trim);
        matches!(status, Some("ready" | "standby")).then_some((dir, pid))
    });
    let Some((dir, postmaster)) = standby else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("the standby never became ready");
    };
    // Killed while the primary's walsender is held (stopped): its shutdown must not wait on it.
    let before = common::stopped_walsenders_but(&[]);
    let held = wait::blocking_up_to(Duration::from_secs(30), Duration::from_millis(20), || {
        let held = common::stopped_walsenders_but(&before);
        (!held.is_empty()).then_some(held)
    });
    kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL).unwrap();
    child.wait().unwrap();
    let held = held.expect("the walsender was never held");
    let left = any_throwaway_dirs_of(child.id());
    assert!(dir.exists(), "a SIGKILLed run cannot clean up");
    let next = outbox_lab()
        .args(["scenario", "outbox-atomicity", "--results-dir"])
        .arg(scratch_dir("lifecycle-failover-next"))
        .output()
        .unwrap();
    assert_eq!(
        next.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&next.stderr)
    );
    assert!(
        wait_gone(postmaster),
        "standby {postmaster} of the killed run still running"
    );
    // A backend leads a session of its own: the stopped one is not in its postmaster's group.
    for walsender in held {
        assert!(
            wait_gone(walsender),
            "the held walsender {walsender} of the killed run is still there"
        );
    }
    for dir in left {
        assert!(!dir.exists(), "{} left behind", dir.display());
    }
}

/// The server going away mid-run is a harness failure, not bad input: exit 3, one line on
/// stderr, and the run's directory is still removed.
#[test]
fn server_gone_mid_run_exits_3() {
    let (mut child, dir, postmaster) = start_long_run_with(Stdio::piped());
    kill(Pid::from_raw(postmaster), Signal::SIGKILL).unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(3), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "not one line: {stderr}");
    assert!(stderr.contains("outbox-lab: error: "), "{stderr}");
    assert!(!dir.exists(), "{} left behind", dir.display());
}

/// Throwaway directories of any kind that the outbox-lab process `pid` created.
fn any_throwaway_dirs_of(pid: u32) -> Vec<PathBuf> {
    let infix = format!("-{pid}-");
    std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("outbox-lab-") && name.contains(&infix))
        .map(|name| std::env::temp_dir().join(name))
        .collect()
}

/// Ctrl-C or SIGTERM in the first 1.5 s (before, during and after initdb, during the start):
/// every time, nothing of the run is left in the temp dir. Before, an interrupt during initdb
/// sometimes left its half-made cluster (initdb's own postgres still writing while the
/// directory was removed), and one before the signals were watched killed the run outright.
#[test]
fn early_interrupts_leave_nothing_behind() {
    let results = scratch_dir("lifecycle-early");
    for attempt in 0..12u64 {
        let delay = Duration::from_millis(60 + attempt * 120);
        let signal = [Signal::SIGINT, Signal::SIGTERM][attempt as usize % 2];
        let mut child = outbox_lab()
            .args([
                "scenario",
                "relay-crash",
                "--format",
                "json",
                "--results-dir",
            ])
            .arg(&results)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(delay);
        kill(Pid::from_raw(child.id() as i32), signal).unwrap();
        let ended =
            wait::blocking_up_to(Duration::from_secs(30), Duration::from_millis(10), || {
                child.try_wait().unwrap().is_some()
            });
        if ended.is_none() {
            let _ = child.kill();
        }
        let status = child.wait().unwrap();
        let left = any_throwaway_dirs_of(child.id());
        for dir in &left {
            let _ = std::process::Command::new("rm")
                .arg("-rf")
                .arg(dir)
                .status();
        }
        assert!(
            ended.is_some(),
            "{signal} after {delay:?}: still running after 30 s"
        );
        assert!(
            left.is_empty(),
            "{signal} after {delay:?} ({status}): left {left:?}"
        );
    }
}
