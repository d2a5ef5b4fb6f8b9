//! The supervisor (Jepsen's nemesis and process manager): runs one schedule against a design.
//! It resets the design's database, starts the consumer, the writer and the relays as child
//! processes armed with the schedule's faults, restarts every process that dies — as production
//! would — until the writer is done and the outbox drained, and hands the database to the
//! checker. It records every fault of the schedule — crash points and nemeses — as fired
//! (which process, when) or not reached. Beside the processes it strikes the schedule's
//! [`nemeses`] (it tells them which process of each role runs now), with the relays talking to
//! the consumer through a [`Proxy`] when the schedule has network faults. Every wait is
//! bounded; a run that does not drain within [`LIVENESS_BOUND`] after its faults end is a
//! liveness failure, not a hang.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Result;
use futures_util::future::join_all;
use tokio::sync::watch;
use tokio_postgres::Client;

use super::checker;
use super::designs::{Design, RelayVariant, Writer};
use super::history::{FaultOutcome, FaultRecord, History};
use super::nemeses::{self, Arena, LiveProcesses};
use super::schedule::{Fault, Role, Schedule};
use crate::harness::child::role::{ConsumerRole, ExploreRelayRole, ExploreWriterRole};
use crate::harness::child::{ChildCommand, ChildEnd, ChildRun, ConsumerProcess};
use crate::harness::db::{Database, PgServer};
use crate::harness::proxy::Proxy;
use crate::outbox::consumer::Faults;
use crate::outbox::crash::CrashPlan;
use crate::outbox::relay::{RelayConfig, RelayDesign, RelayOptions};
use crate::outbox::schema;
use crate::outbox::sink::SinkOptions;

/// Processes of one role a run may start before it counts as stuck.
const MAX_PROCESSES_PER_ROLE: u32 = 20;
/// Liveness, as a bound: every committed event is delivered within this time after the faults
/// end (the writer finished and the last fault fired), or the run is stuck. A drain takes tens
/// of milliseconds here; the rest is margin for a loaded machine. Every run of a stuck design
/// lasts this long, so it is short.
pub const LIVENESS_BOUND: Duration = Duration::from_secs(3);
/// No run may take longer, whatever happens (a writer that hangs).
const RUN_TIMEOUT: Duration = Duration::from_secs(30);
/// No single child may take longer.
const CHILD_TIMEOUT: Duration = Duration::from_secs(25);
/// Relays give up draining after this long and end with an error.
const RELAY_DEADLINE: Duration = Duration::from_secs(20);
/// A failed delivery is retried after 10 ms, 20 ms, 40 ms, ...: quick enough for a consumer that
/// is being restarted, slow enough not to spin.
const RELAY_BACKOFF: Duration = Duration::from_millis(10);
/// High enough that no event becomes a dead letter while a crashed consumer restarts.
const RELAY_MAX_ATTEMPTS: i32 = 20;
/// How often an idle relay polls.
const RELAY_IDLE_POLL: Duration = Duration::from_millis(5);
/// The claim designs' lease: shorter than the pause nemeses' holds, longer than any delivery.
const CLAIM_LEASE: Duration = Duration::from_millis(250);
/// A delivery unanswered this long failed (a lost or delayed reply): short, so that a network
/// nemesis costs a run half a second, not the default five.
const RELAY_REQUEST_TIMEOUT: Duration = Duration::from_millis(500);
/// The reset between runs waits this long at most for a killed child's session (which the
/// server ends a moment after the process) to release its locks.
const RESET_LOCK_TIMEOUT: &str = "SET lock_timeout = '5s'";

/// What the writer writes in every run.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    pub orders: u32,
    /// Events per order (OrderCreated, OrderUpdated2, ...): more than one gives order a meaning.
    pub events_per_order: u32,
    /// How long the first order of each pair commits after the second.
    pub overlap: Duration,
}

/// One design's database, consumer port and workload, reused for all its runs.
pub struct Lab<'s> {
    pub design: &'static Design,
    /// The run's server: the db-restart nemesis restarts it.
    server: &'s PgServer,
    db: Database,
    /// Resets the database and runs the checker; connected again after a database restart.
    client: tokio::sync::Mutex<Client>,
    /// The consumer's port, the same for every restart so that senders find it again.
    port: u16,
    workload: Workload,
}

/// The schedule's faults as the run goes: which fired (in which process, when), which are
/// still waiting for their process. What is left at the end was not reached.
struct FaultLog {
    started: Instant,
    faults: Mutex<Vec<ScheduledFault>>,
}

struct ScheduledFault {
    fault: Fault,
    fired: Option<FaultOutcome>,
}

impl FaultLog {
    fn new(schedule: &Schedule, started: Instant) -> FaultLog {
        let faults = schedule
            .faults
            .iter()
            .map(|&fault| ScheduledFault { fault, fired: None })
            .collect();
        FaultLog {
            started,
            faults: Mutex::new(faults),
        }
    }

    /// What the next process of `role` is armed with: the role's first fault not fired yet.
    fn next(&self, role: Role) -> Option<CrashPlan> {
        let faults = self.faults.lock().expect("not poisoned");
        faults
            .iter()
            .find(|f| f.fault.role == role && f.fired.is_none())
            .map(|f| f.fault.plan)
    }

    /// `process` of `role` died at its plan: the fault fired now, and the next process of the
    /// role gets the following one.
    fn fired(&self, role: Role, process: &str) {
        let at_ms = self.started.elapsed().as_millis() as u64;
        let mut faults = self.faults.lock().expect("not poisoned");
        if let Some(f) = faults
            .iter_mut()
            .find(|f| f.fault.role == role && f.fired.is_none())
        {
            f.fired = Some(FaultOutcome::Fired {
                process: process.to_string(),
                at_ms,
            });
        }
    }

    /// When the last fault fired, if any did.
    fn last_fired(&self) -> Option<Instant> {
        let faults = self.faults.lock().expect("not poisoned");
        faults
            .iter()
            .filter_map(|f| match &f.fired {
                Some(FaultOutcome::Fired { at_ms, .. }) => Some(*at_ms),
                _ => None,
            })
            .max()
            .map(|at_ms| self.started + Duration::from_millis(at_ms))
    }

    /// Every fault with its outcome, in the schedule's order; those that never fired were not
    /// reached.
    fn records(&self) -> Vec<FaultRecord> {
        let faults = self.faults.lock().expect("not poisoned");
        faults
            .iter()
            .map(|f| {
                let outcome = f.fired.clone().unwrap_or(FaultOutcome::NotReached);
                FaultRecord::new(f.fault.to_string(), outcome)
            })
            .collect()
    }
}

/// The nemeses' outcomes as they strike, on their clock (started with the writer and relays).
struct Struck<'r> {
    started: Instant,
    outcomes: &'r Mutex<Vec<FaultOutcome>>,
}

impl Struck<'_> {
    /// When the last nemesis struck, if any did.
    fn last(&self) -> Option<Instant> {
        let outcomes = self.outcomes.lock().expect("not poisoned");
        let fired = outcomes.iter().filter_map(|outcome| match outcome {
            FaultOutcome::Fired { at_ms, .. } => Some(*at_ms),
            FaultOutcome::NotReached => None,
        });
        fired
            .max()
            .map(|at_ms| self.started + Duration::from_millis(at_ms))
    }
}

/// What the processes of one run share with the nemeses: where relays send, which process of
/// each role runs now, where the first process of a role stops itself.
struct Stage<'r> {
    schedule: &'r Schedule,
    live: LiveProcesses,
    /// The consumer's URL, or the proxy's in front of it.
    sink: String,
}

impl<'s> Lab<'s> {
    /// Creates the design's database with the article's schema, the watermark table, and the
    /// claim designs' lease columns and fences.
    pub async fn prepare(
        server: &'s PgServer,
        design: &'static Design,
        workload: Workload,
    ) -> Result<Lab<'s>> {
        let db = server.create_database(design.name).await?;
        let client = db.connect().await?;
        schema::create(&client).await?;
        client.batch_execute(schema::ADD_RELAY_WATERMARK).await?;
        client.batch_execute(schema::ADD_CLAIM_COLUMNS).await?;
        client.batch_execute(schema::ADD_FENCING).await?;
        client.batch_execute(RESET_LOCK_TIMEOUT).await?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        Ok(Lab {
            design,
            server,
            db,
            client: tokio::sync::Mutex::new(client),
            port,
            workload,
        })
    }

    /// The lab's own connection, made again if the database restarted under it.
    async fn client(&self) -> Result<tokio::sync::MutexGuard<'_, Client>> {
        let mut client = self.client.lock().await;
        if client.is_closed() {
            *client = crate::connect::patiently(crate::connect::RECONNECT_PATIENCE, async || {
                self.db.connect().await
            })
            .await?;
            client.batch_execute(RESET_LOCK_TIMEOUT).await?;
        }
        Ok(client)
    }

    /// Runs `schedule` from an empty database and judges what it left.
    pub async fn run(&self, schedule: &Schedule) -> Result<History> {
        let started = Instant::now();
        {
            let client = self.client().await?;
            client.batch_execute(schema::RESET).await?;
            client.batch_execute(schema::RESET_RELAY_WATERMARK).await?;
            client.batch_execute(schema::RESET_FENCES).await?;
        }
        let history = Mutex::new(History {
            design: self.design.name.to_string(),
            schedule: schedule.to_string(),
            ..History::default()
        });
        let faults = FaultLog::new(schedule, started);
        let proxy = match nemeses::proxy_faults(schedule) {
            Some(faults) => Some(Proxy::start(&self.sink_url(), faults).await?),
            None => None,
        };
        let stage = Stage {
            schedule,
            live: LiveProcesses::default(),
            sink: proxy
                .as_ref()
                .map_or_else(|| self.sink_url(), |p| p.url.clone()),
        };
        let outcomes = nemeses::not_reached(schedule);
        let (over, over_seen) = watch::channel(false);
        // The consumer first: the nemeses' clock starts when the writer and relays do.
        let first_consumer = self
            .consumer_command(faults.next(Role::Consumer))
            .pause_at(nemeses::pause_point(schedule, Role::Consumer))
            .spawn_consumer()
            .await?;
        stage
            .live
            .started(Role::Consumer, "consumer#1", first_consumer.pid());
        let arena = Arena {
            started: Instant::now(),
            live: &stage.live,
            server: self.server,
            db: &self.db,
            over: over_seen,
        };
        let struck = Struck {
            started: arena.started,
            outcomes: &outcomes,
        };
        let supervised = async {
            let stuck = self
                .supervise(first_consumer, &faults, &struck, &history, &stage)
                .await;
            over.send_replace(true);
            stuck
        };
        let run = async { tokio::join!(supervised, nemeses::strike(schedule, &arena, &outcomes)) };
        let stuck = match tokio::time::timeout(RUN_TIMEOUT, run).await {
            Ok((stuck, struck)) => {
                struck?;
                stuck?
            }
            // Dropping the supervision kills every child it still had (kill_on_drop).
            Err(_) => Some(format!("not drained within {RUN_TIMEOUT:?}")),
        };
        nemeses::settle(schedule, proxy.as_ref(), arena.started, &outcomes);
        let violations = checker::check(&*self.client().await?, stuck.as_deref()).await?;
        let mut history = history.into_inner().expect("not poisoned");
        history.faults = faults.records();
        let nemeses = outcomes.into_inner().expect("not poisoned");
        history.faults.extend(nemeses::records(schedule, nemeses));
        for (invariant, ids) in violations {
            history.violations.insert(invariant.name().to_string(), ids);
        }
        history.elapsed_ms = started.elapsed().as_millis() as u64;
        Ok(history)
    }

    /// Starts the writer and relays beside the first consumer, keeps everything running until
    /// drained; `Some(why)` when a bound was hit.
    async fn supervise(
        &self,
        first_consumer: ConsumerProcess,
        faults: &FaultLog,
        struck: &Struck<'_>,
        history: &Mutex<History>,
        stage: &Stage<'_>,
    ) -> Result<Option<String>> {
        let (writer_done, _) = watch::channel(false);
        let (all_done, _) = watch::channel(false);
        let producers = async {
            let relays = (0..self.design.relays)
                .map(|i| self.keep_relay(i, faults, history, &writer_done, stage));
            let (writer, relays) = tokio::join!(
                self.keep_writer(faults, history, &writer_done, stage),
                join_all(relays)
            );
            all_done.send_replace(true);
            (writer, relays)
        };
        let everything = async {
            tokio::join!(
                self.keep_consumer(first_consumer, faults, history, &all_done, stage),
                producers
            )
        };
        // Returning drops the supervision, which kills every child it still has (kill_on_drop).
        let (consumer, (writer, relays)) = tokio::select! {
            ended = everything => ended,
            why = liveness_watchdog(faults, struck, &writer_done) => return Ok(Some(why)),
        };
        let mut stuck = vec![consumer?, writer?];
        for relay in relays {
            stuck.push(relay?);
        }
        Ok(stuck.into_iter().flatten().next())
    }

    /// Runs the writer, and a new one after each crash, until one finishes its orders.
    async fn keep_writer(
        &self,
        faults: &FaultLog,
        history: &Mutex<History>,
        writer_done: &watch::Sender<bool>,
        stage: &Stage<'_>,
    ) -> Result<Option<String>> {
        let mut stuck = Some(format!(
            "the writer did not finish in {MAX_PROCESSES_PER_ROLE} processes"
        ));
        for n in 1..=MAX_PROCESSES_PER_ROLE {
            let plan = faults.next(Role::Writer);
            let label = format!("writer#{n}");
            let writer = self
                .writer_command(&stage.sink)
                .crash_at(plan)
                .pause_at(nemeses::pause_point(stage.schedule, Role::Writer).filter(|_| n == 1))
                .spawn()?;
            stage.live.started(Role::Writer, &label, writer.pid());
            let run = writer.finish(CHILD_TIMEOUT).await?;
            stage.live.ended(Role::Writer, &label);
            record(history, &label, plan, &run);
            match run.end {
                ChildEnd::Ok => {
                    stuck = None;
                    break;
                }
                ChildEnd::Crashed { .. } => faults.fired(Role::Writer, &label),
                // A failed request (the naive app could not send): restarted, as a client retries.
                _ => {}
            }
        }
        writer_done.send_replace(true);
        Ok(stuck)
    }

    /// Runs relay `index`, and a new one after each crash; once the writer is done, tells it
    /// (by closing its stdin) to stop when nothing is left to deliver.
    async fn keep_relay(
        &self,
        index: u32,
        faults: &FaultLog,
        history: &Mutex<History>,
        writer_done: &watch::Sender<bool>,
        stage: &Stage<'_>,
    ) -> Result<Option<String>> {
        for n in 1..=MAX_PROCESSES_PER_ROLE {
            // Faults aimed at "relay" hit relay 0; the others run unarmed.
            let plan = faults.next(Role::Relay).filter(|_| index == 0);
            let pause = nemeses::pause_point(stage.schedule, Role::Relay);
            let label = format!("relay{index}#{n}");
            let mut relay = self
                .relay_command(index, &stage.sink)
                .crash_at(plan)
                .pause_at(pause.filter(|_| index == 0 && n == 1))
                .spawn()?;
            if index == 0 {
                stage.live.started(Role::Relay, &label, relay.pid());
            }
            let mut done = writer_done.subscribe();
            tokio::select! {
                _ = relay.exited() => {}
                _ = done.wait_for(|done| *done) => {}
            }
            relay.close_stdin();
            let run = relay.finish(CHILD_TIMEOUT).await?;
            stage.live.ended(Role::Relay, &label);
            record(history, &label, plan, &run);
            match run.end {
                ChildEnd::Ok => return Ok(None),
                ChildEnd::Crashed { .. } if index == 0 => faults.fired(Role::Relay, &label),
                _ => {}
            }
        }
        Ok(Some(format!(
            "relay {index} did not drain in {MAX_PROCESSES_PER_ROLE} processes"
        )))
    }

    /// Keeps a consumer listening on the lab's port until the producers are done.
    async fn keep_consumer(
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
                    stage.live.ended(Role::Consumer, &label);
                    record_end(history, &label, plan, &end);
                    if matches!(end, ChildEnd::Crashed { .. }) {
                        faults.fired(Role::Consumer, &label);
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
            stage.live.started(Role::Consumer, &label, consumer.pid());
        }
        consumer.stop().await?;
        Ok(Some(format!(
            "the consumer did not stay up in {MAX_PROCESSES_PER_ROLE} processes"
        )))
    }

    fn sink_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn consumer_command(&self, plan: Option<CrashPlan>) -> ChildCommand<ConsumerRole> {
        let role = ConsumerRole {
            kind: self.design.consumer,
            port: self.port,
            faults: Faults {
                fail_every_delivery_of: self.design.poison_without_dead_letter,
                ..Faults::default()
            },
        };
        ChildCommand::new(&self.db, role).crash_at(plan)
    }

    /// The writer; a dual write sends to `sink` itself.
    fn writer_command(&self, sink: &str) -> ChildCommand<ExploreWriterRole> {
        let role = ExploreWriterRole {
            orders: self.workload.orders,
            events_per_order: self.workload.events_per_order,
            overlap: self.workload.overlap,
            dual_write: match self.design.writer {
                Writer::Outbox => None,
                Writer::DualWrite(order) => Some((order, sink.to_string())),
            },
        };
        ChildCommand::new(&self.db, role)
    }

    /// Relay `index`, delivering to `sink`.
    fn relay_command(&self, index: u32, sink: &str) -> ChildCommand<ExploreRelayRole> {
        let variant = self
            .design
            .relay
            .expect("only designs with relays start relays");
        let config = RelayConfig {
            design: match variant {
                RelayVariant::MarkFirst => RelayDesign::MarkBeforeSend,
                RelayVariant::ClaimLease => RelayDesign::Claim,
                RelayVariant::ClaimLeaseFenced => RelayDesign::FencedClaim,
                _ => RelayDesign::Lock,
            },
            lease: CLAIM_LEASE,
            batch: self.design.batch,
            max_attempts: match self.design.poison_without_dead_letter {
                // No dead letter: a row is retried for ever.
                Some(_) => i32::MAX,
                None => RELAY_MAX_ATTEMPTS,
            },
            backoff_base: RELAY_BACKOFF,
            idle_poll: RELAY_IDLE_POLL,
            deadline: RELAY_DEADLINE,
            head_of_line_guard: variant == RelayVariant::Guarded,
            request_timeout: RELAY_REQUEST_TIMEOUT,
            // Every attempt in the log: the history the checker audits.
            log_attempts: true,
            ..RelayConfig::default()
        };
        let relay = RelayOptions {
            name: format!("r{index}"),
            sink: SinkOptions::new(sink),
            config,
            follow: None,
        };
        let role = ExploreRelayRole {
            stored_watermark: variant == RelayVariant::StoredWatermark,
            relay,
        };
        ChildCommand::new(&self.db, role)
    }
}

/// Liveness: once the writer is done, the relays must drain within [`LIVENESS_BOUND`] of the
/// last fault, crash or nemesis (a fault that fires later starts the wait again); returns the
/// bound they missed.
async fn liveness_watchdog(
    faults: &FaultLog,
    struck: &Struck<'_>,
    writer_done: &watch::Sender<bool>,
) -> String {
    let mut done = writer_done.subscribe();
    // The sender outlives this future: it lives in the supervision that polls it.
    let _ = done.wait_for(|done| *done).await;
    let writer_done_at = Instant::now();
    loop {
        let faults_ended = [faults.last_fired(), struck.last()]
            .into_iter()
            .flatten()
            .fold(writer_done_at, Instant::max);
        let deadline = faults_ended + LIVENESS_BOUND;
        if Instant::now() >= deadline {
            return format!(
                "not drained within {} s after the writer finished and the last fault fired",
                LIVENESS_BOUND.as_secs()
            );
        }
        tokio::time::sleep_until(deadline.into()).await;
    }
}

/// A finished process and the attempts in its log.
fn record(history: &Mutex<History>, label: &str, plan: Option<CrashPlan>, run: &ChildRun) {
    let mut history = history.lock().expect("not poisoned");
    history.record_process(label, plan.map(|p| p.to_string()), run.end.to_string());
    history.record_attempts(label, &run.stdout);
}

fn record_end(history: &Mutex<History>, label: &str, plan: Option<CrashPlan>, end: &ChildEnd) {
    let mut history = history.lock().expect("not poisoned");
    let end = match end {
        ChildEnd::Ok => "stopped at the end of the run".to_string(),
        end => end.to_string(),
    };
    history.record_process(label, plan.map(|p| p.to_string()), end);
}
