//! The fault log: one record of every fault of a run's schedule — the crash points its
//! processes are armed with, the nemeses struck on the clock, the network faults the proxy
//! fired — on one clock, started when the writer and the relays are, each fired (which
//! process, when) or not reached.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::history::{FaultOutcome, FaultRecord};
use super::schedule::{Fault, Role, Schedule};
use crate::outbox::crash::CrashPlan;

/// The schedule's faults as the run goes. What is left unfired at the end was not reached.
pub struct FaultLog {
    started: Instant,
    /// The crash points, in the schedule's order: each arms the next process of its role
    /// until it fires.
    crashes: Mutex<Vec<(Fault, FaultOutcome)>>,
    /// The nemeses' outcomes, in the schedule's order.
    nemeses: Mutex<Vec<FaultOutcome>>,
    /// The harness' own part of the faults (a server restarted, a standby promoted and the
    /// links re-pointed): harness time, which no relay is given less time for.
    harness: Mutex<HarnessWork>,
}

/// The faults the harness is doing now, and when it last finished one.
#[derive(Default)]
struct HarnessWork {
    doing: u32,
    done_at: Option<Instant>,
}

/// The harness is doing a fault while this lives (see [`FaultLog::harness_doing`]).
pub struct HarnessDoing<'a>(&'a FaultLog);

impl Drop for HarnessDoing<'_> {
    fn drop(&mut self) {
        let mut work = self.0.harness.lock().expect("not poisoned");
        work.doing -= 1;
        work.done_at = Some(Instant::now());
    }
}

impl FaultLog {
    /// Every fault of `schedule`, none fired; the clock starts now (see [`FaultLog::start`]).
    pub fn new(schedule: &Schedule) -> FaultLog {
        let crashes = schedule
            .faults
            .iter()
            .map(|&fault| (fault, FaultOutcome::NOT_REACHED));
        FaultLog {
            started: Instant::now(),
            crashes: Mutex::new(crashes.collect()),
            nemeses: Mutex::new(vec![FaultOutcome::NOT_REACHED; schedule.nemeses.len()]),
            harness: Mutex::default(),
        }
    }

    /// Starts the clock again: when the writer and the relays start (the first consumer is
    /// already listening), before anything can fire.
    pub fn start(&mut self) {
        self.started = Instant::now();
    }

    /// When the clock started.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// The moment `at`, on the clock.
    fn ms(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.started).as_millis() as u64
    }

    /// What the next process of `role` is armed with: the role's first crash point not fired.
    pub fn next(&self, role: Role) -> Option<CrashPlan> {
        self.next_indexed(role).map(|(_, plan)| plan)
    }

    /// [`FaultLog::next`], with its index among the schedule's crash points.
    pub fn next_indexed(&self, role: Role) -> Option<(usize, CrashPlan)> {
        let crashes = self.crashes.lock().expect("not poisoned");
        crashes
            .iter()
            .enumerate()
            .find(|(_, (fault, outcome))| fault.role == role && !outcome.is_reached())
            .map(|(index, (fault, _))| (index, fault.plan))
    }

    /// `process` of `role` died at its crash point now: the next process of the role gets the
    /// following one.
    pub fn crashed(&self, role: Role, process: &str) {
        let at_ms = self.ms(Instant::now());
        let mut crashes = self.crashes.lock().expect("not poisoned");
        if let Some((_, outcome)) = crashes
            .iter_mut()
            .find(|(fault, outcome)| fault.role == role && !outcome.is_reached())
        {
            *outcome = FaultOutcome::Fired {
                process: process.to_string(),
                at_ms,
                in_flight: Vec::new(),
            };
        }
    }

    /// Nemesis `index` of the schedule struck `process` at `at`.
    pub fn struck(&self, index: usize, process: String, at: Instant) {
        self.struck_in_flight(index, process, at, Vec::new());
    }

    /// Nemesis `index` struck `process` at `at` while the events `in_flight` were being
    /// delivered.
    pub fn struck_in_flight(
        &self,
        index: usize,
        process: String,
        at: Instant,
        in_flight: Vec<String>,
    ) {
        let at_ms = self.ms(at);
        self.nemeses.lock().expect("not poisoned")[index] = FaultOutcome::Fired {
            process,
            at_ms,
            in_flight,
        };
    }

    /// Nemesis `index` did not strike, for this reason (unless it strikes after all).
    pub fn not_reached(&self, index: usize, why: String) {
        let mut nemeses = self.nemeses.lock().expect("not poisoned");
        if !nemeses[index].is_reached() {
            nemeses[index] = FaultOutcome::NotReached { why: Some(why) };
        }
    }

    /// The harness does its own part of a fault (restarts a server, promotes a standby) until
    /// the guard is dropped (see [`FaultLog::faults_over`]).
    pub fn harness_doing(&self) -> HarnessDoing<'_> {
        self.harness.lock().expect("not poisoned").doing += 1;
        HarnessDoing(self)
    }

    /// When the faults were over for the relays, if any fired: the last one fired, or later,
    /// when the harness finished doing one, or now while it still is (the liveness bound
    /// starts there: a restart's or a promotion's seconds are the harness', not the relays').
    pub fn faults_over(&self) -> Option<Instant> {
        let fired = self.last_fired()?;
        let work = self.harness.lock().expect("not poisoned");
        if work.doing > 0 {
            return Some(Instant::now());
        }
        Some(work.done_at.map_or(fired, |done| done.max(fired)))
    }

    /// When the last fault fired, crash point or nemesis, if any did.
    pub fn last_fired(&self) -> Option<Instant> {
        let crashes = self.crashes.lock().expect("not poisoned");
        let nemeses = self.nemeses.lock().expect("not poisoned");
        let outcomes = crashes
            .iter()
            .map(|(_, outcome)| outcome)
            .chain(nemeses.iter());
        outcomes
            .filter_map(|outcome| match outcome {
                FaultOutcome::Fired { at_ms, .. } => Some(*at_ms),
                FaultOutcome::NotReached { .. } => None,
            })
            .max()
            .map(|at_ms| self.started + Duration::from_millis(at_ms))
    }

    /// Every fault with its outcome: the crash points, then the nemeses, each in the
    /// schedule's order.
    pub fn records(self, schedule: &Schedule) -> Vec<FaultRecord> {
        let crashes = self.crashes.into_inner().expect("not poisoned");
        let nemeses = self.nemeses.into_inner().expect("not poisoned");
        let crashes = crashes
            .into_iter()
            .map(|(fault, outcome)| FaultRecord::new(fault.to_string(), outcome));
        let nemeses = schedule
            .nemeses
            .iter()
            .zip(nemeses)
            .map(|(nemesis, outcome)| FaultRecord::new(nemesis.to_string(), outcome));
        crashes.chain(nemeses).collect()
    }
}
