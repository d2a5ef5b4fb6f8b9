//! A process named beyond its pid: its pid and start time (a pid is reused, the pair is not),
//! read from `/proc`, and the only ways the harness signals one: stopped (asked, then killed
//! with its group), crashed (frozen with its children, then killed: a machine dying), and the
//! tests a nemesis makes first (still the same process, a child of ours, stopped).

use std::fs;
use std::time::Duration;

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use crate::wait;

/// A fast shutdown takes milliseconds; after this the process is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// A process named by its pid and its start time (clock ticks after boot, from
/// `/proc/PID/stat`): a pid is reused, the pair is not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessId {
    pub pid: i32,
    pub start: u64,
}

impl ProcessId {
    /// The process running as `pid` now, if any (a zombie counts as gone).
    pub fn of(pid: i32) -> Option<ProcessId> {
        let fields = stat_fields(pid)?;
        if fields.first().map(String::as_str) == Some("Z") {
            return None;
        }
        let start = fields.get(19)?.parse().ok()?;
        Some(ProcessId { pid, start })
    }

    /// Still this process, and a child of ours: the only processes a nemesis may signal.
    pub fn is_our_child(&self) -> bool {
        let parent = stat_fields(self.pid).and_then(|f| f.get(1)?.parse::<u32>().ok());
        self.is_running() && parent == Some(std::process::id())
    }

    /// Stopped by a signal (SIGSTOP): `T` in `/proc/PID/stat`.
    pub fn is_stopped(&self) -> bool {
        self.is_running()
            && stat_fields(self.pid).is_some_and(|f| f.first().map(String::as_str) == Some("T"))
    }

    /// The pids whose parent is this process (children of a process of ours are ours).
    fn children(&self) -> Vec<i32> {
        processes()
            .filter(|(_, fields)| fields.get(1).and_then(|p| p.parse().ok()) == Some(self.pid))
            .map(|(pid, _)| pid)
            .collect()
    }

    pub fn own() -> ProcessId {
        ProcessId::of(std::process::id() as i32).expect("our own /proc entry")
    }

    /// Still the same process, and not a zombie.
    pub fn is_running(&self) -> bool {
        ProcessId::of(self.pid) == Some(*self)
    }

    /// Dies at once with its children, as when its machine dies: all of them frozen (SIGSTOP,
    /// the parent first, so that it forks no more) before any is killed. A PostgreSQL backend
    /// leads a session of its own, out of reach of a kill of its postmaster's group, and one
    /// left running a moment would go on: a COMMIT waiting for a synchronous standby gives up
    /// when it sees the postmaster gone, and its order is visible to a relay's backend still
    /// alive.
    pub fn crash(&self) {
        if !self.is_running() {
            return;
        }
        self.signal_with(Signal::SIGSTOP, &[]);
        let children = self.children();
        self.signal_with(Signal::SIGSTOP, &children);
        self.signal_with(Signal::SIGKILL, &children);
    }

    /// Sends `signal` to the process, its group and `children`: PostgreSQL's backends each
    /// lead a session of their own, out of reach of the group.
    fn signal_with(&self, signal: Signal, children: &[i32]) {
        let pid = Pid::from_raw(self.pid);
        let _ = killpg(pid, signal);
        let _ = kill(pid, signal);
        for &child in children {
            let _ = kill(Pid::from_raw(child), signal);
        }
    }

    /// Asks it to stop with `signal`; if it has not ended after [`STOP_TIMEOUT`], kills its
    /// whole process group (a server we start leads one) and waits once more. Nothing is sent to
    /// a pid that is no longer this process.
    pub fn stop(&self, signal: Signal) {
        if !self.is_running() {
            return;
        }
        let pid = Pid::from_raw(self.pid);
        // A process of the server held by a nemesis (the failover's stopped walsender) would
        // hold the shutdown back, and outlive it stopped: every one runs again first, whether
        // in its group or a child.
        self.signal_with(Signal::SIGCONT, &self.children());
        let _ = kill(pid, signal);
        wait_gone(self);
        if self.is_running() {
            // A process that leads no group (one that ignored the signal) is killed alone.
            if killpg(pid, Signal::SIGKILL).is_err() && self.is_running() {
                let _ = kill(pid, Signal::SIGKILL);
            }
            wait_gone(self);
        }
    }
}

/// Every process now, with its [`stat_fields`].
pub(crate) fn processes() -> impl Iterator<Item = (i32, Vec<String>)> {
    fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| Some((pid, stat_fields(pid)?)))
}

/// The fields of `/proc/PID/stat` after the command name (which may hold spaces): the state
/// first, then the parent's pid, ... (proc(5) fields 3 onwards).
fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(
        stat.rsplit_once(')')?
            .1
            .split_whitespace()
            .map(str::to_string)
            .collect(),
    )
}

/// Gives a signalled process up to [`STOP_TIMEOUT`] to end (whether it did, the caller sees).
fn wait_gone(process: &ProcessId) {
    wait::blocking_up_to(STOP_TIMEOUT, Duration::from_millis(5), || {
        !process.is_running()
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A crash takes the children that lead sessions of their own (as PostgreSQL's backends
    /// do), not only the process's group.
    #[test]
    fn a_crash_kills_the_children_that_left_its_group() {
        use std::os::unix::process::CommandExt;
        let mut parent = std::process::Command::new("sh")
            .args(["-c", "setsid sleep 1000 & wait"])
            .process_group(0)
            .spawn()
            .unwrap();
        let process = ProcessId::of(parent.id() as i32).unwrap();
        let every = Duration::from_millis(10);
        let child = wait::blocking_up_to(STOP_TIMEOUT, every, || {
            process
                .children()
                .first()
                .and_then(|&pid| ProcessId::of(pid))
        })
        .expect("its child started");
        process.crash();
        parent.wait().unwrap();
        let gone = wait::blocking_up_to(STOP_TIMEOUT, every, || !child.is_running());
        let survived = gone.is_none();
        let _ = kill(Pid::from_raw(child.pid), Signal::SIGKILL);
        assert!(!survived, "the child of its own session outlived the crash");
    }
}
