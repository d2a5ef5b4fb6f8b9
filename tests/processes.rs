//! No process left behind: whatever a relay of the user's starts goes with it (killed by a
//! nemesis, or stopped at the end although it ignores SIGTERM), and outbox-lab's own children
//! each lead a process group of their own that goes with them, however the run ends.

use crate::common;

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::{assert_passed, long_run, processes_whose, run_json, scratch_dir, throwaway_dirs_of};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use outbox_lab::wait;

/// The processes whose command line (arguments joined by spaces) contains `needle`.
fn processes_running(needle: &str) -> Vec<i32> {
    processes_whose("cmdline", |pid, cmdline| {
        cmdline.contains(needle) && !is_zombie(pid)
    })
}

/// `/proc/PID/stat` after the command name: state, ppid, pgrp, ...
fn stat_fields(pid: i32) -> Vec<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default()
}

fn is_zombie(pid: i32) -> bool {
    stat_fields(pid).first().is_some_and(|state| state == "Z")
}

fn parent_of(pid: i32) -> Option<i32> {
    stat_fields(pid).get(1)?.parse().ok()
}

fn group_of(pid: i32) -> Option<i32> {
    stat_fields(pid).get(2)?.parse().ok()
}

/// The processes of group `group` still running (zombies do not count).
fn group_members(group: i32) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| group_of(*pid) == Some(group) && !is_zombie(*pid))
        .collect()
}

/// Kills what a failed test found left behind: one failure must not burden the machine.
fn kill_all(pids: &[i32]) {
    for pid in pids {
        let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
    }
}

/// What still runs matching `needle`, once given up to 5 s to go.
fn survivors(needle: &str) -> Vec<i32> {
    wait::blocking_up_to(Duration::from_secs(5), Duration::from_millis(20), || {
        processes_running(needle).is_empty()
    });
    processes_running(needle)
}

/// A relay of the user's that starts a `sleep` which ignores SIGTERM: the first one killed
/// by the kill nemesis, the last stopped with SIGTERM once drained. Neither's `sleep` survives
/// verify (before: both did, reparented to init).
#[test]
fn what_a_foreign_relay_started_goes_with_it() {
    // A duration of its own: how this test's sleeps are told from anything else running.
    let sleep = format!("sleep 1232.{}", std::process::id());
    let relay = format!(
        "bash -c 'trap \"\" TERM; {sleep} & exec {} relay --mode notify --interval-ms 50'",
        env!("CARGO_BIN_EXE_outbox-lab")
    );
    let results = scratch_dir("processes-foreign");
    let run = run_json(
        &["verify"],
        &results,
        &[
            "--relay-cmd",
            &relay,
            "--schedule",
            "kill:relay@300ms",
            "--events",
            "200",
        ],
    );
    let left = survivors(&sleep);
    kill_all(&left);
    assert_passed(&run);
    assert_eq!(run.metric("verify.faults_fired"), 1);
    assert!(
        left.is_empty(),
        "{} of the relays' sleeps outlived verify",
        left.len()
    );
}

/// Starts `scenario retry-backoff` (a long one), waits until children of its are running, and
/// returns it with those children's pids.
#[allow(clippy::zombie_processes)] // returned to the caller, which waits for it
fn start_run_with_children() -> (Child, Vec<i32>) {
    let mut run = long_run(&scratch_dir("processes-own"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = run.id() as i32;
    let children = || -> Vec<i32> {
        processes_running(" child ")
            .into_iter()
            .filter(|child| parent_of(*child) == Some(pid))
            .collect()
    };
    let found = wait::blocking_up_to(Duration::from_secs(60), Duration::from_millis(20), || {
        !children().is_empty()
    });
    if found.is_none() {
        let _ = run.kill();
        let _ = run.wait();
        panic!("no child of the run appeared within 60 s");
    }
    (run, children())
}

/// outbox-lab's children each lead a process group of their own; SIGTERM to outbox-lab (it
/// cleans up and exits 130) leaves no process of those groups running.
#[test]
fn our_children_lead_their_own_groups_and_go_with_the_run() {
    let (mut run, children) = start_run_with_children();
    let groups: Vec<Option<i32>> = children.iter().map(|c| group_of(*c)).collect();
    kill(Pid::from_raw(run.id() as i32), Signal::SIGTERM).unwrap();
    let started = Instant::now();
    let status = run.wait().unwrap();
    assert!(started.elapsed() < Duration::from_secs(30));
    let own_groups: Vec<bool> = children
        .iter()
        .zip(&groups)
        .map(|(child, group)| *group == Some(*child))
        .collect();
    let left: Vec<i32> = children.iter().flat_map(|c| group_members(*c)).collect();
    kill_all(&left);
    assert_eq!(status.code(), Some(130));
    assert!(
        own_groups.iter().all(|own| *own),
        "children {children:?} in groups {groups:?}: not each its own"
    );
    assert!(left.is_empty(), "still running: {left:?}");
    assert!(throwaway_dirs_of("pg", run.id()).is_empty());
}
