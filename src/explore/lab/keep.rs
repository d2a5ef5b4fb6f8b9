//! Keeping every role running: the consumer, the writer and the relays (ours or the user's),
//! each started again whenever it dies, as production would, until the writer is done and the
//! outbox drained; every process recorded in the history with how it ended.

use std::sync::Mutex;
use std::time::Duration;

use anyhow::Result;
use futures_util::future::try_join_all;
use tokio::sync::watch;

use super::foreign::ForeignRelayError;
use super::{Lab, Relays, Stage, STOPPED_ONCE_DRAINED};
use crate::error;
use crate::explore::faults::FaultLog;
use crate::explore::history::History;
use crate::explore::nemeses;
use crate::explore::schedule::Role;
use crate::explore::watchdog::liveness_watchdog;
use crate::harness::child::{ChildEnd, ChildRun, ConsumerProcess};
use crate::harness::foreign::{relay_name, RelayTemplate};
use crate::outbox::crash::CrashPlan;

/// Processes of one role a run may start before it counts as stuck.
const MAX_PROCESSES_PER_ROLE: u32 = 20;
/// A relay of the user's that fails by itself (a non-zero status) this soon after it started,
/// before any fault, "exits at once": bad input, not a verdict.
const EXITS_AT_ONCE: Duration = Duration::from_secs(1);
/// A relay of the user's that ended is started again after this (no spinning on one that
/// cannot run).
const FOREIGN_RESTART_DELAY: Duration = Duration::from_millis(100);
/// A relay of the user's gets this long after SIGTERM before SIGKILL.
const FOREIGN_STOP_GRACE: Duration = Duration::from_secs(2);
/// A relay of the user's whose first processes all end by themselves this soon, before any
/// relay was seen connected to the database, does not run at all (`--relay-cmd true`).
const QUICK_EXITS_UNCONNECTED: u32 = 3;

impl Lab<'_> {
    /// Starts the writer and relays beside the first consumer, keeps everything running until
    /// drained; `Some(why)` when a bound was hit.
    pub(super) async fn supervise(
        &self,
        first_consumer: ConsumerProcess,
        faults: &FaultLog,
        history: &Mutex<History>,
        stage: &Stage<'_>,
    ) -> Result<Option<String>> {
        let writer_done = &stage.writer_done;
        let (all_done, _) = watch::channel(false);
        // The first error ends the run at once (a relay of the user's that is bad input does
        // not wait for the writer): dropping the rest kills their children.
        let producers = async {
            let relays =
                (0..self.design.relays).map(|i| self.keep_relay(i, faults, history, stage));
            let done = tokio::try_join!(
                self.keep_writer(faults, history, stage),
                try_join_all(relays)
            );
            all_done.send_replace(true);
            done
        };
        let everything = async {
            tokio::try_join!(
                self.keep_consumer(first_consumer, faults, history, &all_done, stage),
                producers
            )
        };
        // Returning drops the supervision, which kills every child it still has (kill_on_drop).
        let (consumer, (writer, relays)) = tokio::select! {
            ended = everything => ended?,
            why = liveness_watchdog(faults, writer_done, self.bounds.liveness) => {
                // A relay that never connected is not judged: its command is wrong.
                if let Some(never) = self.never_connected(stage) {
                    return Err(never);
                }
                // The user's relay may say why: its last line goes with the verdict.
                let last = stage.relay_tail.lock().expect("not poisoned").lines().pop();
                return Ok(Some(match last {
                    Some(line) => format!("{why}; relay-0's last line: {line}"),
                    None => why,
                }));
            }
            failed = self.watch_foreign(stage) => return Err(failed),
        };
        let stuck = [consumer, writer].into_iter().chain(relays);
        Ok(stuck.flatten().next())
    }

    /// Runs the writer, and a new one after each crash, until one finishes its orders.
    pub(super) async fn keep_writer(
        &self,
        faults: &FaultLog,
        history: &Mutex<History>,
        stage: &Stage<'_>,
    ) -> Result<Option<String>> {
        let mut stuck = Some(format!(
            "the writer did not finish in {MAX_PROCESSES_PER_ROLE} processes"
        ));
        for n in 1..=MAX_PROCESSES_PER_ROLE {
            let plan = faults.next(Role::Writer);
            let label = format!("writer#{n}");
            let database =
                stage
                    .links
                    .database(&self.database_of(Role::Writer)?, Role::Writer, 0)?;
            let writer = self
                .writer_command(&database, &stage.sink, stage.schedule)
                .crash_at(plan)
                .pause_at(nemeses::pause_point(stage.schedule, Role::Writer).filter(|_| n == 1))
                .spawn()?;
            stage.live.started(Role::Writer, 0, &label, writer.pid());
            let mut told = |line: &str| {
                let mut history = history.lock().expect("not poisoned");
                history.record_writer_line(&label, line);
            };
            let run = writer.finish_telling(self.bounds.child, &mut told).await?;
            stage.live.ended(Role::Writer, 0, &label);
            record(history, &label, plan, &run);
            match run.end {
                ChildEnd::Ok => {
                    stuck = None;
                    break;
                }
                ChildEnd::Crashed { .. } => faults.crashed(Role::Writer, &label),
                // A failed request (the naive app could not send): restarted, as a client retries.
                _ => {}
            }
        }
        stage.writer_done.send_replace(true);
        Ok(stuck)
    }

    /// Runs relay `index`, and a new one after each crash; once the writer is done, tells it
    /// (by closing its stdin) to stop when nothing is left to deliver.
    pub(super) async fn keep_relay(
        &self,
        index: u32,
        faults: &FaultLog,
        history: &Mutex<History>,
        stage: &Stage<'_>,
    ) -> Result<Option<String>> {
        if let Relays::Foreign(foreign) = &self.relays {
            return self
                .keep_foreign_relay(index, &foreign.template, faults, history, stage)
                .await;
        }
        let writer_done = &stage.writer_done;
        for n in 1..=MAX_PROCESSES_PER_ROLE {
            // A fault aimed at "relay" arms every relay, and the first to reach it takes it
            // (its claim): however fast another relay drains, the fault is reached.
            let armed = faults.next_indexed(Role::Relay);
            let plan = armed.map(|(_, plan)| plan);
            let pause =
                nemeses::pause_point_indexed(stage.schedule, Role::Relay).filter(|_| n == 1);
            let label = format!("relay{index}#{n}");
            let database = stage.links.database(&self.db, Role::Relay, index)?;
            let mut relay = self
                .relay_command(&database, index, &stage.relay_sinks[index as usize])
                .crash_at(plan)
                .pause_at(pause.map(|(_, plan)| plan))
                .first_to_reach(
                    armed.map(|(fault, _)| stage.claims.crash(fault)),
                    pause.map(|(nemesis, _)| stage.claims.pause(nemesis)),
                )
                .env(match (&stage.relay_clock, index) {
                    (Some(Ok(clock)), 0) => clock.env(),
                    _ => Vec::new(),
                })
                .spawn()?;
            stage.live.started(Role::Relay, index, &label, relay.pid());
            let mut done = writer_done.subscribe();
            tokio::select! {
                _ = relay.exited() => {}
                _ = done.wait_for(|done| *done) => {}
            }
            relay.close_stdin();
            let run = relay.finish(self.bounds.child).await?;
            stage.live.ended(Role::Relay, index, &label);
            record(history, &label, plan, &run);
            match run.end {
                ChildEnd::Ok => return Ok(None),
                ChildEnd::Crashed { .. } => faults.crashed(Role::Relay, &label),
                _ => {}
            }
        }
        Ok(Some(format!(
            "relay {index} did not drain in {MAX_PROCESSES_PER_ROLE} processes"
        )))
    }

    /// Runs the user's relay `index`, and again whenever it ends (killed, crashed, or done by
    /// itself: reported all the same), until the outbox is drained; then SIGTERM.
    pub(super) async fn keep_foreign_relay(
        &self,
        index: u32,
        template: &RelayTemplate,
        faults: &FaultLog,
        history: &Mutex<History>,
        stage: &Stage<'_>,
    ) -> Result<Option<String>> {
        let database = stage
            .links
            .database(&self.database_of(Role::Relay)?, Role::Relay, index)?;
        let endpoints = self.endpoints(&database, &stage.relay_sinks[index as usize], index)?;
        let name = relay_name(index);
        let mut quick_exits = 0;
        // Relay 0, every process of it, on the run's clock where the schedule steps it.
        let clock = match (&stage.relay_clock, index) {
            (Some(Ok(clock)), 0) => clock.env(),
            _ => Vec::new(),
        };
        for n in 1..=MAX_PROCESSES_PER_ROLE {
            let label = format!("{name}#{n}");
            let mut relay = template.spawn(&endpoints, index, self.identity.as_ref(), &clock)?;
            stage
                .live
                .started_own(Role::Relay, index, &label, relay.own());
            if index == 0 {
                *stage.relay_tail.lock().expect("not poisoned") = relay.tail();
            }
            let mut drained = stage.drained.subscribe();
            let ended = tokio::select! {
                status = relay.exited() => Some(status?),
                _ = drained.wait_for(|drained| *drained) => None,
            };
            stage.live.ended(Role::Relay, index, &label);
            let tail = relay.tail();
            let Some(status) = ended else {
                let status = relay.stop(FOREIGN_STOP_GRACE).await?;
                let end = format!("{STOPPED_ONCE_DRAINED} ({status})");
                record_foreign_end(history, &label, end, &tail.lines());
                return Ok(None);
            };
            let lived = relay.started.elapsed();
            let no_fault_yet = faults.last_fired().is_none() && !stage.struck_unlogged();
            // With status 0 it may be a relay that drains what there is and ends (run from
            // cron): started again like any other, not refused — unless it never connects.
            let failed = status.code().is_some_and(|code| code != 0);
            let quick = lived < EXITS_AT_ONCE && no_fault_yet;
            // Ending by itself at once, never connected: a nemesis meanwhile (a kill due at
            // 250 ms, struck on the next process) explains none of it.
            let by_itself = status.code().is_some();
            if lived < EXITS_AT_ONCE && by_itself && !*stage.relay_connected.borrow() {
                quick_exits += 1;
            }
            if quick && n == 1 && failed || quick_exits == QUICK_EXITS_UNCONNECTED {
                return Err(error::Error::Usage(
                    ForeignRelayError::ExitsAtOnce {
                        name,
                        when: match quick_exits {
                            QUICK_EXITS_UNCONNECTED => {
                                "as its processes before it did, none connected to the database"
                            }
                            _ => "before any fault",
                        },
                        status: status.to_string(),
                        after_ms: lived.as_millis(),
                        tail: tail.lines().join(" | "),
                    }
                    .into(),
                )
                .into());
            }
            let end = match status.code() {
                Some(0) => format!("{status} by itself before the end: started again"),
                _ => format!("{status}: started again"),
            };
            record_foreign_end(history, &label, end, &tail.lines());
            tokio::time::sleep(FOREIGN_RESTART_DELAY).await;
        }
        Ok(Some(format!(
            "{name} did not stay up in {MAX_PROCESSES_PER_ROLE} processes"
        )))
    }

    /// Keeps a consumer listening on the lab's port until the producers are done.
    pub(super) async fn keep_consumer(
        &self,
        first: ConsumerProcess,
        faults: &FaultLog,
        history: &Mutex<History>,
        all_done: &watch::Sender<bool>,
        stage: &Stage<'_>,
    ) -> Result<Option<String>> {
        let mut consumer = first;
        let mut plan = faults.next(Role::Consumer);
        let mut done = all_done.subscribe();
        for n in 1..=MAX_PROCESSES_PER_ROLE {
            let label = format!("consumer#{n}");
            tokio::select! {
                end = consumer.ended() => {
                    let end = end?;
                    stage.live.ended(Role::Consumer, 0, &label);
                    record_end(history, &label, plan, &end);
                    if matches!(end, ChildEnd::Crashed { .. }) {
                        faults.crashed(Role::Consumer, &label);
                    }
                }
                _ = done.wait_for(|done| *done) => {
                    consumer.stop().await?;
                    record_end(history, &label, plan, &ChildEnd::Ok);
                    return Ok(None);
                }
            }
            plan = faults.next(Role::Consumer);
            consumer = self.consumer_command(plan).spawn_consumer().await?;
            let label = format!("consumer#{}", n + 1);
            stage
                .live
                .started(Role::Consumer, 0, &label, consumer.pid());
        }
        consumer.stop().await?;
        Ok(Some(format!(
            "the consumer did not stay up in {MAX_PROCESSES_PER_ROLE} processes"
        )))
    }
}

/// A finished process and the attempts in its log.
fn record(history: &Mutex<History>, label: &str, plan: Option<CrashPlan>, run: &ChildRun) {
    let mut history = history.lock().expect("not poisoned");
    history.record_process(label, plan.map(|p| p.to_string()), run.end.to_string());
    history.record_attempts(label, &run.stdout);
}

/// A relay of the user's, how it ended, and the last line it printed.
fn record_foreign_end(history: &Mutex<History>, label: &str, end: String, tail: &[String]) {
    let end = match tail.last() {
        Some(line) => format!("{end}; its last line: {line}"),
        None => end,
    };
    let mut history = history.lock().expect("not poisoned");
    history.record_process(label, None, end);
}

fn record_end(history: &Mutex<History>, label: &str, plan: Option<CrashPlan>, end: &ChildEnd) {
    let mut history = history.lock().expect("not poisoned");
    let end = match end {
        ChildEnd::Ok => "stopped at the end of the run".to_string(),
        end => end.to_string(),
    };
    history.record_process(label, plan.map(|p| p.to_string()), end);
}
