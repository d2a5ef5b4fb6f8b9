//! The nemesis machinery (Jepsen's word for whatever injects faults from outside the code under
//! test): signals to our own child processes (pause, kill), a database backend terminated, and
//! how a nemesis reports what it did. The database restart is the cluster's
//! ([`Cluster::restart_immediately`](crate::harness::cluster::Cluster::restart_immediately)), the
//! network faults the [`link`](crate::harness::link)'s; which nemesis hits which actor, and
//! when, is explore's ([`crate::explore::nemeses`]).
//!
//! A signal goes only to a process proven to be ours: the pid and start time recorded when we
//! spawned it, still running, and still our child. Anything else is left alone and the nemesis
//! counts as not reached.

use std::num::IntErrorKind;
use std::time::Duration;

use anyhow::Result;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde::Serialize;
use tokio_postgres::Client;

use crate::harness::process::ProcessId;

/// Ends the sessions of one actor in the current database, found by their `application_name`
/// (`outbox-lab consumer`); the count of sessions ended.
const TERMINATE_NAMED: &str = "
SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
  FROM pg_stat_activity
 WHERE datname = current_database()
   AND application_name = $1
   AND pid <> pg_backend_pid()";

/// Ends these backends (their pids) of the current database; the count ended.
const TERMINATE_BACKENDS: &str = "
SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
  FROM pg_stat_activity
 WHERE datname = current_database()
   AND pid = ANY($1)
   AND pid <> pg_backend_pid()";

/// Whether a scheduled fault happened — a crash point or a nemesis, in the words the history
/// keeps for every fault.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum FaultOutcome {
    /// It hit `process` (`relay0#1`), `at_ms` after the run started; for a nemesis on a
    /// delivery, the event ids that delivery carried.
    Fired {
        process: String,
        at_ms: u64,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        in_flight: Vec<String>,
    },
    /// The run ended without it (or its target was not running at that moment): the schedule
    /// ran without this fault, and tested nothing of it; `why`, where it is known (the
    /// deliveries it could not strike, the requests or COMMITs that never came).
    NotReached {
        #[serde(skip_serializing_if = "Option::is_none")]
        why: Option<String>,
    },
}

impl FaultOutcome {
    /// Not reached, for no reason known.
    pub const NOT_REACHED: FaultOutcome = FaultOutcome::NotReached { why: None };

    pub fn is_reached(&self) -> bool {
        matches!(self, FaultOutcome::Fired { .. })
    }
}

/// A child process of ours, identified when it was spawned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnChild(ProcessId);

impl OwnChild {
    /// The child just spawned as `pid`; `None` if it is already gone or not our child.
    pub fn spawned(pid: u32) -> Option<OwnChild> {
        let process = ProcessId::of(i32::try_from(pid).ok()?)?;
        process.is_our_child().then_some(OwnChild(process))
    }

    /// Sends `signal` if the process is still that child of ours; whether it was sent.
    pub fn signal(self, signal: Signal) -> bool {
        self.0.is_our_child() && kill(Pid::from_raw(self.0.pid), signal).is_ok()
    }

    /// Lets the stopped process go on (SIGCONT) after `hold`; also if the wait is cut short
    /// (the future dropped at the end of a run): a paused process never stays stopped.
    pub async fn resume_after(self, hold: Duration) {
        let _resume = Resume(self);
        tokio::time::sleep(hold).await;
    }

    /// Whether it is still that child of ours, stopped (SIGSTOP).
    pub fn is_stopped(self) -> bool {
        self.0.is_our_child() && self.0.is_stopped()
    }
}

/// Sends SIGCONT when dropped: a paused process never stays stopped.
struct Resume(OwnChild);

impl Drop for Resume {
    fn drop(&mut self) {
        self.0.signal(Signal::SIGCONT);
    }
}

/// Whose database sessions a db-kill-backend nemesis ends.
#[derive(Debug, Clone)]
pub enum Sessions {
    /// Those named so (`application_name`): the consumer, which is ours and names its own.
    Named(String),
    /// These backends, by pid, as an actor's [database link](crate::harness::link::postgres)
    /// saw them: a relay or the writer, whatever it calls its sessions.
    Backends(Vec<i32>),
}

/// Terminates `sessions` in `client`'s database; how many.
pub async fn terminate_backends(client: &Client, sessions: &Sessions) -> Result<i64> {
    let row = match sessions {
        Sessions::Named(name) => client.query_one(TERMINATE_NAMED, &[name]).await?,
        Sessions::Backends(pids) if pids.is_empty() => return Ok(0),
        Sessions::Backends(pids) => client.query_one(TERMINATE_BACKENDS, &[pids]).await?,
    };
    Ok(row.get(0))
}

/// `300ms`, `1.5s`, `2s`: a duration in a schedule.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let (number, unit_ms) = if let Some(n) = text.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1000.0)
    } else if let Some(n) = text.strip_suffix('m') {
        // Minutes: a clock's step (`clock:step:relay@1s-10m`).
        (n, 60_000.0)
    } else {
        return Err(format!("'{text}' is not a duration like 300ms or 1.5s"));
    };
    match number.parse::<f64>() {
        Ok(n) if n.is_finite() && (0.0..=600_000.0 / unit_ms).contains(&n) => {
            Ok(Duration::from_secs_f64(n * unit_ms / 1000.0))
        }
        _ => Err(format!(
            "'{text}' is not a duration like 300ms or 1.5s (at most 600s)"
        )),
    }
}

/// `number`, the `what` of `item` (`delivery number` of `kill:relay:on-delivery@3`): from 1 to
/// u32's most.
pub fn parse_ordinal(number: &str, item: &str, what: &str) -> Result<u32, String> {
    match number.parse::<u32>() {
        Ok(n) if n >= 1 => Ok(n),
        Err(e) if *e.kind() == IntErrorKind::PosOverflow => Err(format!(
            "'{number}' in '{item}' is too large for a {what} (at most {})",
            u32::MAX
        )),
        _ => Err(format!(
            "'{number}' in '{item}' is not a {what} of 1 or more"
        )),
    }
}

/// The form [`parse_duration`] reads back: whole seconds as `2s`, the rest in milliseconds.
pub fn format_duration(duration: Duration) -> String {
    let ms = duration.as_millis();
    if ms > 0 && ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Durations parse in both units and print back to what parses to the same value.
    #[test]
    fn durations_round_trip() {
        for (text, ms) in [
            ("300ms", 300),
            ("1.5s", 1500),
            ("2s", 2000),
            ("0ms", 0),
            ("10m", 600_000),
        ] {
            let d = parse_duration(text).unwrap();
            assert_eq!(d, Duration::from_millis(ms));
            assert_eq!(parse_duration(&format_duration(d)), Ok(d));
        }
        for bad in ["3", "1.5h", "-1s", "s", "700s", "11m"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
