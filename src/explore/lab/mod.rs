//! The lab (Jepsen's process manager): runs one schedule against a design. It resets the
//! design's database, starts the consumer, the writer and the relays as child processes armed
//! with the schedule's crash points, keeps every role running — restarting each process that
//! dies, as production would ([`keep`]) — until the writer is done and the outbox drained, and
//! hands the database to the checker. Beside the processes the schedule's [`nemeses`] strike
//! (told which process of each role runs now), with the relays talking to the consumer (or
//! Redis) through a proxy when the schedule has network faults or nemeses on a delivery
//! ([`delivery::Middle`]); the [`FaultLog`] records every fault on one clock, and the
//! [`watchdog`](super::watchdog) makes a run that does not drain a liveness failure, not a
//! hang. Every wait is bounded.
//!
//! Its rooms: [`database`] (the design's database, reset between runs), [`delivery`] (where
//! the relays deliver and the consumer that reads it), [`commands`] (the children of our
//! designs), [`foreign`] (the user's relays, for `verify`), [`keep`] (keeping the roles running).

mod commands;
mod database;
mod delivery;
mod foreign;
mod keep;

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Result;
use tokio::sync::watch;
use tokio_postgres::Client;

use super::checker;
use super::designs::Design;
use super::faults::FaultLog;
use super::history::History;
use super::nemeses::{self, Arena, DbLinks, LiveProcesses, TxnWorkload};
use super::schedule::{ClockTarget, Nemesis, Role, Schedule, TxnFault};
use super::watchdog::LIVENESS_BOUND;
use crate::harness::clock::{self, FakeClock};
use crate::harness::db::{Database, PgServer};
use crate::harness::foreign::Tail;
use crate::harness::link::faults::FaultRecord;
use crate::harness::replicated::VirtualPrimary;
use crate::harness::roles::ActorRoles;
use crate::harness::run_as::RelayIdentity;
use crate::harness::throwaway::RunDir;
use crate::judge::invariants::Invariant;
use crate::judge::{record, two_databases};
use crate::outbox::writer::{CommitOutcome, EventsTo};

pub use delivery::Delivery;
use delivery::Middle;
pub use foreign::{ForeignRelayError, ForeignRelays, COUNT_PENDING};

/// How the history says a relay of the user's ended that the lab stopped once the outbox was
/// drained (any other end is its own: a crash, an exit).
pub const STOPPED_ONCE_DRAINED: &str = "stopped with SIGTERM once drained";

/// How long a run and its parts may take.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// See [`LIVENESS_BOUND`].
    pub liveness: Duration,
    /// No run may take longer, whatever happens (a writer that hangs).
    pub run: Duration,
    /// No single child may take longer.
    pub child: Duration,
    /// No statement of the lab's may take longer (the user's `--schema` and `--pending-sql`
    /// among them): slow SQL is an error that says so, not a hang.
    pub statement: Duration,
}

/// explore's: small workloads, relays of ours.
pub const EXPLORE_BOUNDS: Bounds = Bounds {
    liveness: LIVENESS_BOUND,
    run: Duration::from_secs(30),
    child: Duration::from_secs(25),
    statement: Duration::from_secs(25),
};

/// What the writer writes in every run.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    pub orders: u32,
    /// Events per order (OrderCreated, OrderUpdated2, ...): more than one gives order a meaning.
    pub events_per_order: u32,
    /// How long the first order of each pair commits after the second.
    pub overlap: Duration,
}

/// Who the relays are.
pub enum Relays {
    /// The design's variant: child processes of ours, with crash points, told by closing
    /// their stdin to drain and stop.
    Ours,
    /// The user's command (`outbox-lab verify`): no crash points; stopped with SIGTERM once
    /// the outbox is drained.
    Foreign(ForeignRelays),
}

/// One design's database, consumer port and workload, reused for all its runs.
pub struct Lab<'s> {
    pub design: &'static Design,
    relays: Relays,
    bounds: Bounds,
    /// The run's server: the db-restart nemesis restarts it.
    server: &'s PgServer,
    /// The replicated pair the application's database is on instead (db:failover), behind
    /// an address of its own; the consumer's database stays on the run's server, apart.
    pair: Option<VirtualPrimary>,
    /// The application's database: the orders, the outbox, the user's tables.
    db: Database,
    /// The consumer's database: `db` for our relays, else apart (on the run's server when `db`
    /// is on the pair). For strangers' relays it also holds the judge's record, and no relay
    /// may connect to it.
    consumer_db: Database,
    /// The roles strangers' relays and the writer reach `db` as (least privilege), where they
    /// could be made; `None`: the server's own role (ours; or the user's server whose role may
    /// not create roles).
    roles: Option<ActorRoles>,
    /// A private cluster of the lab's own holding `consumer_db`, where strangers' relays get
    /// the user's server's role, which could reach a database of it.
    _judge_server: Option<PgServer>,
    /// Who strangers' relays run as, claimed for the lab (outbox-lab runs as root): every
    /// process of it ends with each run.
    identity: Option<RelayIdentity>,
    /// Resets the database and runs the checker; connected again after a database restart.
    client: tokio::sync::Mutex<Client>,
    /// The consumer's port, the same for every restart so that senders find it again.
    port: u16,
    workload: Workload,
}

/// Where the relays armed with one crash point (or pause) race for it: the first to reach it
/// creates its claim, a file here, and only it fires (`crash::arm`). A directory of the
/// run's, removed with it.
struct Claims(RunDir);

impl Claims {
    fn new() -> Result<Claims> {
        Ok(Claims(RunDir::create("claims", None)?))
    }

    /// The claim of the schedule's crash point `fault`.
    fn crash(&self, fault: usize) -> PathBuf {
        self.0.path().join(format!("crash-{fault}"))
    }

    /// The claim of the schedule's pause at a point, nemesis `nemesis`.
    fn pause(&self, nemesis: usize) -> PathBuf {
        self.0.path().join(format!("pause-{nemesis}"))
    }
}

impl Drop for Claims {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(self.0.path());
    }
}

/// What the processes of one run share with the nemeses: where relays send, which process of
/// each role runs now, where the first process of a role stops itself.
struct Stage<'r> {
    schedule: &'r Schedule,
    live: LiveProcesses,
    /// What the fault proxy in front of the deliveries (HTTP's, Kafka's) did, where the
    /// schedule has one.
    proxied: Option<&'r FaultRecord>,
    /// The consumer's URL, or the proxy's in front of it.
    sink: String,
    /// Each relay's way to the consumer: through a port of the proxy's of its own, so that the
    /// proxy knows who sent what.
    relay_sinks: Vec<String>,
    /// Each relay's and the writer's way to the database.
    links: DbLinks,
    /// The writer has finished.
    writer_done: watch::Sender<bool>,
    /// The user's relays are done: nothing pending, nothing more arriving.
    drained: watch::Sender<bool>,
    /// What the user's relay 0 (its latest process) printed last, for a verdict that needs it.
    relay_tail: Mutex<Tail>,
    /// Every nemesis has struck (or cannot any more): the user's relays are not drained before.
    nemeses_done: watch::Sender<bool>,
    /// A session of the user's relays was seen in the database.
    relay_connected: watch::Sender<bool>,
    /// Where our relays race for a crash point or a pause.
    claims: Claims,
    /// Relay 0's wall clock, where the schedule steps it (or why it cannot reach the relay).
    relay_clock: Option<Result<FakeClock, String>>,
}

impl Stage<'_> {
    /// Whether a fault has struck that the run's log hears of only at its end: a lost COMMIT
    /// answer on a database link, a request the fault proxy reset or whose reply it lost.
    fn struck_unlogged(&self) -> bool {
        self.links.lost_a_commit() || self.proxied.is_some_and(FaultRecord::struck_any)
    }
}

/// Whether `schedule` steps relay 0's wall clock.
fn steps_the_relays_clock(schedule: &Schedule) -> bool {
    schedule.nemeses.iter().any(|n| {
        matches!(
            n,
            Nemesis::ClockStep {
                target: ClockTarget::Relay,
                ..
            }
        )
    })
}

impl<'s> Lab<'s> {
    /// A wall clock for relay 0, or why none reaches it: a program of the user's linked
    /// statically reads the clock past libfaketime.
    fn relay_clock(&self) -> Result<Result<FakeClock, String>> {
        if let Relays::Foreign(foreign) = &self.relays {
            let program = foreign.template.program();
            if clock::statically_linked(program) {
                return Ok(Err(format!(
                    "{program} is statically linked: libfaketime, which steps a clock, cannot \
                     reach it"
                )));
            }
        }
        Ok(Ok(FakeClock::new(self.relay_user())?))
    }

    /// Where the relays deliver.
    fn delivery(&self) -> Delivery {
        match &self.relays {
            Relays::Foreign(foreign) => foreign.delivery.clone(),
            Relays::Ours => Delivery::Http,
        }
    }

    /// Runs `schedule` from an empty database and judges what it left.
    pub async fn run(&self, schedule: &Schedule) -> Result<History> {
        let started = Instant::now();
        if let Some(pair) = &self.pair {
            pair.ready().await?;
        }
        self.reset().await?;
        self.delivery().make_empty().await?;
        let history = Mutex::new(History {
            design: self.design.name.to_string(),
            schedule: schedule.to_string(),
            ..History::default()
        });
        let mut faults = FaultLog::new(schedule);
        let (tell, deliveries) = tokio::sync::mpsc::unbounded_channel();
        let relays = self.design.relays;
        let proxy_faults = nemeses::proxy_faults(schedule, tell.clone());
        let watch = proxy_faults
            .as_ref()
            .and_then(|faults| faults.watch.clone());
        let sink_down = proxy_faults.as_ref().map(|faults| faults.down.clone());
        let middle = match proxy_faults {
            Some(faults) => Some(self.stand_between(faults).await?),
            None => self.let_relays_in(tell)?,
        };
        let proxied = middle.as_ref().and_then(Middle::record);
        let stage = Stage {
            schedule,
            live: LiveProcesses::default(),
            proxied,
            sink: match middle.as_ref().and_then(Middle::http) {
                Some(proxy) => proxy.url.clone(),
                None => self.sink_url(),
            },
            relay_sinks: (0..relays)
                .map(|i| match &middle {
                    Some(middle) => middle.relay_url(i),
                    None => self.sink_url(),
                })
                .collect(),
            links: DbLinks::start(
                &self.db,
                relays,
                schedule,
                self.relay_user(),
                self.admitted()?
                    .as_ref()
                    .map(|(r, w)| (r.as_str(), w.as_str())),
            )
            .await?,
            writer_done: watch::channel(false).0,
            drained: watch::channel(false).0,
            relay_tail: Mutex::new(Tail::default()),
            nemeses_done: watch::channel(false).0,
            relay_connected: watch::channel(false).0,
            claims: Claims::new()?,
            relay_clock: match steps_the_relays_clock(schedule) {
                true => Some(self.relay_clock()?),
                false => None,
            },
        };
        let (over, over_seen) = watch::channel(false);
        // The consumer first: the nemeses' clock starts when the writer and relays do.
        let first_consumer = self
            .consumer_command(faults.next(Role::Consumer))
            .pause_at(nemeses::pause_point(schedule, Role::Consumer))
            .spawn_consumer()
            .await?;
        stage
            .live
            .started(Role::Consumer, 0, "consumer#1", first_consumer.pid());
        faults.start();
        let workload = TxnWorkload {
            db: self.database_of(Role::Writer)?,
            events_per_order: self.workload.events_per_order,
            to: match &self.relays {
                Relays::Foreign(ForeignRelays {
                    insert_sql: Some(sql),
                    ..
                }) => EventsTo::Statement(sql.clone()),
                _ => EventsTo::Outbox,
            },
        };
        let arena = Arena {
            faults: &faults,
            live: &stage.live,
            server: self.server,
            db: &self.db,
            consumer_db: &self.consumer_db,
            pair: self.pair.as_ref(),
            links: &stage.links,
            workload: &workload,
            history: &history,
            relay_clock: stage.relay_clock.as_ref(),
            sink_down,
            over: over_seen,
            done: &stage.nemeses_done,
        };
        let supervised = async {
            let stuck = self
                .supervise(first_consumer, &faults, &history, &stage)
                .await;
            over.send_replace(true);
            stuck
        };
        let striking = async {
            let struck = nemeses::strike(schedule, &arena, deliveries).await;
            stage.nemeses_done.send_replace(true);
            struck
        };
        let run = async { tokio::join!(supervised, striking) };
        let mut cut_short = None;
        let stuck = match tokio::time::timeout(self.bounds.run, run).await {
            // The supervision's failure first: a nemesis may fail only because the run did.
            Ok((stuck, struck)) => {
                let stuck = stuck?;
                struck?;
                stuck
            }
            // Dropping the supervision kills every child it still had (kill_on_drop).
            Err(_) => {
                let why = format!("cut short by the run's bound of {:?}", self.bounds.run);
                match self.relays {
                    // The user's time limit ended it: inconclusive, not the relay's fault.
                    Relays::Foreign(_) => {
                        cut_short = Some(why);
                        None
                    }
                    Relays::Ours => Some(why),
                }
            }
        };
        if let Some(identity) = &self.identity {
            // Whatever the relays started and left running (setsid, a double fork) ends with
            // the run: it must not write while the run is judged, nor into the next run.
            let ended = identity.leftovers();
            identity.end_every_process();
            if ended > 0 {
                history.lock().expect("not poisoned").record_process(
                    "relays' leftovers",
                    None,
                    format!(
                        "{ended} process(es) the relays started still ran after they stopped \
                         (outside their process group: setsid, a double fork): ended with SIGKILL"
                    ),
                );
            }
        }
        nemeses::settle(schedule, proxied, &stage.links, &faults);
        let faults = faults.records(schedule);
        let failed_over = faults.iter().any(|f| {
            f.outcome.is_reached() && matches!(f.fault.parse(), Ok(Nemesis::DbFailover { .. }))
        });
        let stuck = stuck.map(
            |why| match failed_over && stage.links.relay_sessions() == 0 {
                true => format!(
                "{why}; no relay had a database session at the end: none connected again after \
                 the failover"
            ),
                false => why,
            },
        );
        // A transaction of the workload's held the horizon (the bound counted from its end), or
        // left ids that never commit: the relays that did not drain were stalled behind it.
        let behind: Vec<String> = faults
            .iter()
            .filter(|f| f.outcome.is_reached())
            .filter_map(|f| match f.fault.parse() {
                Ok(Nemesis::Txn(TxnFault::Rollback { .. })) => {
                    Some(format!("the gap {} left (ids that never commit)", f.fault))
                }
                Ok(Nemesis::Txn(_)) => Some(format!(
                    "{} (not caught up within the bound after it ended)",
                    f.fault
                )),
                _ => None,
            })
            .collect();
        let stuck = stuck.map(|why| match behind.as_slice() {
            [] => why,
            behind => format!("{why}; stalled behind {}", behind.join(", or ")),
        });
        let mut history = history.into_inner().expect("not poisoned");
        let (violations, acknowledged_lost) = match self.relays {
            Relays::Foreign(_) => {
                self.judge_strangers(&history, failed_over, cut_short.is_some(), stuck.as_deref())
                    .await?
            }
            Relays::Ours => {
                let client = self.client().await?;
                if self.pair.is_some() {
                    // The consumer's side effects, beside what the application's database kept.
                    let consumer = self.consumer_db.connect().await?;
                    two_databases::bring_consumer_rows(&consumer, &client).await?;
                }
                let acknowledged: Vec<(i64, i64)> = history
                    .written
                    .iter()
                    .filter(|w| w.outcome == CommitOutcome::Ok)
                    .map(|w| (w.order.order_id, w.order.customer_id))
                    .collect();
                let violations = checker::check(&client, stuck.as_deref()).await?;
                let lost = record::acknowledged_lost_in(&client, &acknowledged).await?;
                (violations, lost)
            }
        };
        history.acknowledged_lost = acknowledged_lost;
        history.cut_short = cut_short;
        history.faults = faults;
        history.held = watch.map(|watch| watch.held()).unwrap_or_default();
        for (invariant, ids) in violations {
            history.violations.insert(invariant.name().to_string(), ids);
        }
        if let Some(ghosts) = history.violations.get_mut(Invariant::Ghost.name()) {
            for ghost in ghosts.iter_mut() {
                // `order 34` of an acknowledged order lost `order 34 (its id given again...)`.
                let lost = history.acknowledged_lost.iter().any(|lost| {
                    lost == ghost
                        || lost
                            .strip_prefix(ghost.as_str())
                            .is_some_and(|rest| rest.starts_with(" ("))
                });
                if lost {
                    ghost.push_str(record::LOST_IN_FAILOVER);
                }
            }
        }
        history.elapsed_ms = started.elapsed().as_millis() as u64;
        Ok(history)
    }
}
