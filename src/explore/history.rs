//! The history of a run, in Jepsen's terms: every scheduled fault with what became of it
//! (`ok`: it fired, in which process and when; `fail`: it was not reached), every process that
//! ran (what it was armed with, how it ended) and every delivery attempt with its outcome as the
//! sender knew it: `ok`, `fail` (it did not happen) or `info` (unknown: the sender died, or the
//! connection broke after the request went out). Read from the senders' log lines, saved as one JSON line per run under
//! `results/<run-id>/history/`, so that every verdict can be audited.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Result;
use serde::Serialize;

use crate::outbox::writer;
use crate::report;

pub use crate::harness::link::watch::Held;
pub use crate::harness::nemesis::FaultOutcome;

/// A sender's log line before each try (relays: `[relay r0] outbox id=3 sending`).
const SENDING: &str = " sending";
const SENT: &str = " sent";
const FAILED: &str = " failed: ";

/// How an operation ended, as Jepsen says it: a delivery attempt for its sender, a fault for
/// the supervisor that scheduled it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Ok,
    Fail,
    Info,
}

impl Outcome {
    /// A refused connection or an error status means the event was not processed; any other
    /// error (connection closed, reset, timeout) leaves the sender not knowing.
    fn of_error(error: &str) -> Outcome {
        if error.contains("Connection refused") || error.starts_with("HTTP ") {
            Outcome::Fail
        } else {
            Outcome::Info
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Attempt {
    /// Which incarnation tried (`relay0#2`: relay 0, second process).
    pub process: String,
    /// What it tried to deliver (`outbox id=3`, `customer=2`).
    pub event: String,
    pub outcome: Outcome,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One scheduled fault and what became of it. Any kind of fault is recorded the same way: a
/// crash point today, a nemesis ("pause relay at 2 s for 3 s") as well.
#[derive(Debug, Clone, Serialize)]
pub struct FaultRecord {
    /// The fault as the schedule writes it (`relay:after-send-before-mark@2`).
    pub fault: String,
    /// `ok` when it fired, `fail` when it was not reached.
    pub status: Outcome,
    #[serde(flatten)]
    pub outcome: FaultOutcome,
}

impl FaultRecord {
    pub fn new(fault: String, outcome: FaultOutcome) -> FaultRecord {
        let status = match outcome {
            FaultOutcome::Fired { .. } => Outcome::Ok,
            FaultOutcome::NotReached { .. } => Outcome::Fail,
        };
        FaultRecord {
            fault,
            status,
            outcome,
        }
    }
}

/// A database session an actor lost, and went on with another.
#[derive(Debug, Clone, Serialize)]
pub struct SessionLost {
    /// Whose (`writer#1`).
    pub process: String,
    pub error: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Process {
    pub process: String,
    /// The crash plan it was started with, if any.
    pub armed: Option<String>,
    pub end: String,
}

/// Everything one run did, and the checker's verdict on it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct History {
    pub design: String,
    pub schedule: String,
    /// Set on the second run of a violation's smallest schedule: the invariant it re-checks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rerun_of: Option<String>,
    pub elapsed_ms: u64,
    /// Why the run ended before it could be judged whole (a bound of the user's): its verdict
    /// is inconclusive, as Jepsen's unknown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cut_short: Option<String>,
    /// Every fault of the schedule, crash points then nemeses, fired or not reached.
    pub faults: Vec<FaultRecord>,
    /// The deliveries a proxy held on their way to the consumer while a nemesis struck:
    /// harness time, which the relay's latency does not count.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub held: Vec<Held>,
    pub processes: Vec<Process>,
    pub attempts: Vec<Attempt>,
    /// Offending ids per violated invariant.
    pub violations: BTreeMap<String, Vec<String>>,
    /// Every order the writers wrote, with its events and how its COMMIT ended, as their logs
    /// told it as it happened: the judge's own record of what was written, kept outside every
    /// database.
    #[serde(skip)]
    pub written: Vec<writer::WrittenOrder>,
    /// The database sessions the writers lost and made again, whoever ended them (a nemesis,
    /// a restart, someone else): each is recorded.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sessions_lost: Vec<SessionLost>,
    /// Acknowledged orders the database no longer has after the run (`order 12`): a failover
    /// lost them. The database's loss, told apart from a relay's `lost`; a shipment of one is
    /// a ghost "lost in failover".
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub acknowledged_lost: Vec<String>,
}

impl History {
    /// Whether a fault of the schedule was not reached: such a run is reported apart, never
    /// counted as a run that passed.
    pub fn faults_not_reached(&self) -> bool {
        self.faults.iter().any(|f| !f.outcome.is_reached())
    }

    /// The attempts in one process's log. A sender announces each event (`sending`) before it
    /// goes out, a batch at a time, and reports each answer (`sent`, `failed: ...`); an
    /// announced event never answered is `info`: the process died before it learned the outcome.
    pub fn record_attempts(&mut self, process: &str, log: &str) {
        let mut unanswered: Vec<&str> = Vec::new();
        for line in log.lines() {
            // Drop the `[relay NAME] ` prefix.
            let line = line.split_once("] ").map_or(line, |(_, rest)| rest);
            let (event, outcome, error) = if let Some(event) = line.strip_suffix(SENDING) {
                unanswered.push(event);
                continue;
            } else if let Some(event) = line.strip_suffix(SENT) {
                (event, Outcome::Ok, None)
            } else if let Some((event, error)) = line.split_once(FAILED) {
                (event, Outcome::of_error(error), Some(error))
            } else {
                continue;
            };
            if let Some(i) = unanswered.iter().position(|e| *e == event) {
                unanswered.remove(i);
            }
            self.push_attempt(process, event, outcome, error);
        }
        for event in unanswered {
            self.push_attempt(process, event, Outcome::Info, None);
        }
    }

    fn push_attempt(&mut self, process: &str, event: &str, outcome: Outcome, error: Option<&str>) {
        self.attempts.push(Attempt {
            process: process.to_string(),
            event: event.to_string(),
            outcome,
            error: error.map(str::to_string),
        });
    }

    /// A line of a writer's log (`label`: its process), as it comes: an order it wrote or how
    /// its COMMIT ended, or a database session it lost (recorded as such, whoever ended it).
    /// Taken line by line, so that what a writer told is kept even when the run is cut short.
    pub fn record_writer_line(&mut self, label: &str, line: &str) {
        if let Some(step) = writer::write_step_in(line) {
            writer::record_step(&mut self.written, step);
            return;
        }
        let line = line.split_once("] ").map_or(line, |(_, rest)| rest);
        if let Some(error) = line.strip_prefix(writer::SESSION_LOST) {
            self.sessions_lost.push(SessionLost {
                process: label.to_string(),
                error: error.to_string(),
            });
        }
    }

    pub fn record_process(&mut self, process: &str, armed: Option<String>, end: String) {
        self.processes.push(Process {
            process: process.to_string(),
            armed,
            end,
        });
    }
}

/// Appends a design's runs to `<dir>/history/<design>.jsonl`, one JSON document per line (a
/// file of the run's, [`report::write_run_file`]).
pub fn save(dir: &Path, design: &str, runs: &[History]) -> Result<()> {
    let dir = dir.join("history");
    report::create_run_dir(&dir)?;
    let mut lines = String::new();
    for run in runs {
        lines.push_str(&serde_json::to_string(run)?);
        lines.push('\n');
    }
    report::write_run_file(&dir.join(format!("{design}.jsonl")), &lines, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A try the sender never heard back from is `info`; refused is `fail`; 2xx is `ok`.
    #[test]
    fn attempts_are_classified_as_the_sender_knew_them() {
        let mut history = History::default();
        history.record_attempts(
            "relay0#1",
            "[relay r0] outbox id=1 sending\n[relay r0] outbox id=1 sent\n\
             [relay r0] outbox id=2 sending\n[relay r0] outbox id=3 sending\n\
             [relay r0] outbox id=4 sending\n\
             [relay r0] outbox id=2 failed: POST x: client error (Connect): Connection refused\n\
             [relay r0] outbox id=3 failed: POST x: connection closed before message completed\n",
        );
        let outcomes: Vec<(&str, Outcome)> = history
            .attempts
            .iter()
            .map(|a| (a.event.as_str(), a.outcome))
            .collect();
        assert_eq!(
            outcomes,
            [
                ("outbox id=1", Outcome::Ok),
                ("outbox id=2", Outcome::Fail),
                ("outbox id=3", Outcome::Info),
                ("outbox id=4", Outcome::Info),
            ]
        );
    }
}
