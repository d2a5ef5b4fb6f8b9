//! explore's nemeses (Jepsen's word): faults from outside the code under test. Their grammar
//! is the schedule's ([`super::schedule::Nemesis`]); what each does to a process, the database
//! or the network is the harness's ([`crate::harness::nemesis`], the cluster, the proxy). This
//! module owns the nemesis schedules of the default run and striking them during a run: which
//! process of each role is live, the clock they strike on, and what became of each; those
//! struck on a delivery are [`on_delivery`]'s; the actors' database links are [`db_links`].

mod db_links;
mod on_delivery;
mod transactions;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use futures_util::future::join_all;
use nix::sys::signal::Signal;
use tokio::sync::{mpsc, watch};

use super::designs::Design;
use super::faults::FaultLog;
use super::history::History;
use super::schedule::{ClockTarget, DbNetFault, Nemesis, Role, Schedule, FAILOVER_HOLD};
use crate::connect;
use crate::harness::clock::FakeClock;
use crate::harness::db::{Database, PgServer};
use crate::harness::link::faults::{FaultPlan, FaultRecord, ProxyFaults};
use crate::harness::link::postgres::PgLink;
use crate::harness::link::watch::{DeliveryWatch, WatchedDelivery};
use crate::harness::nemesis::{format_duration, terminate_backends, OwnChild, Sessions};
use crate::harness::replicated::VirtualPrimary;
use crate::outbox::consumer::CONSUMER_APPLICATION_NAME;
use crate::outbox::crash::CrashPlan;
pub use db_links::DbLinks;
use on_delivery::{on_delivery, strike_on_delivery, Holding};
pub use transactions::{end_prepared, TxnWorkload};

/// The nemesis schedules of the default run: all of them for the design that claims everything.
const DEFAULT_SCHEDULES: [&str; 15] = [
    "pause:relay@60ms+300ms",
    LEASE_OUTLIVED,
    "pause:consumer@60ms+300ms",
    "kill:writer@30ms",
    "kill:relay@60ms",
    "kill:consumer@60ms",
    "db:restart@60ms",
    "db:kill-backend:relay@60ms",
    "db:kill-backend:consumer@60ms",
    "net:reset@2",
    "net:reply-lost@2",
    "net:delay@2+700ms",
    "kill:relay:on-delivery@2",
    "pause:relay:on-delivery@2+300ms",
    "db:kill-backend:relay:on-delivery@2",
];

/// Relay 0 stops right after its first claim, before sending, for longer than the claim
/// designs' lease: another relay re-claims its rows before it goes on.
pub const LEASE_OUTLIVED: &str = "pause:relay:after-fetch@1+600ms";

/// The designs the default run strikes, and with what: every nemesis for the design that
/// claims everything; the lease outlived for the claim designs.
const STRUCK_BY_DEFAULT: [(&str, &[&str]); 3] = [
    ("outbox-idempotent-ordered", &DEFAULT_SCHEDULES),
    ("claim-lease", &[LEASE_OUTLIVED]),
    ("claim-lease-fenced", &[LEASE_OUTLIVED]),
];

/// The nemesis schedules the default run adds for `design` (the database restart only on
/// the throwaway cluster).
pub fn default_schedules(design: &Design, throwaway_cluster: bool) -> Vec<Schedule> {
    let Some((_, schedules)) = STRUCK_BY_DEFAULT.iter().find(|(d, _)| *d == design.name) else {
        return Vec::new();
    };
    schedules
        .iter()
        .map(|text| text.parse::<Schedule>().expect("default schedules parse"))
        .filter(|s| throwaway_cluster || !s.nemeses.iter().any(|n| n.needs_throwaway_cluster()))
        .collect()
}

/// The proxy's plan for the schedule's network nemeses and the deliveries its nemeses strike
/// on (told through `tell`); `None` when there are none (the relays then talk to the consumer
/// directly).
pub fn proxy_faults(
    schedule: &Schedule,
    tell: mpsc::UnboundedSender<WatchedDelivery>,
) -> Option<ProxyFaults> {
    let plans: Vec<FaultPlan> = schedule
        .nemeses
        .iter()
        .filter_map(|n| match n {
            Nemesis::Net(plan) => Some(*plan),
            _ => None,
        })
        .collect();
    let watched: Vec<_> = on_delivery(schedule)
        .map(|(_, strike, number)| (number, strike.moment()))
        .collect();
    let watch = (!watched.is_empty()).then(|| DeliveryWatch::new(watched, tell));
    let outage = schedule
        .nemeses
        .iter()
        .any(|n| matches!(n, Nemesis::NetDown { .. }));
    (!plans.is_empty() || watch.is_some() || outage).then(|| ProxyFaults {
        latency: Duration::ZERO,
        plans,
        watch,
        down: Arc::default(),
    })
}

/// Where the role's first process stops itself, for a `pause:ROLE:STEP@N+FOR` nemesis.
pub fn pause_point(schedule: &Schedule, role: Role) -> Option<CrashPlan> {
    pause_point_indexed(schedule, role).map(|(_, plan)| plan)
}

/// [`pause_point`], with its nemesis' index in the schedule.
pub fn pause_point_indexed(schedule: &Schedule, role: Role) -> Option<(usize, CrashPlan)> {
    let mut nemeses = schedule.nemeses.iter().enumerate();
    nemeses.find_map(|(index, n)| match n {
        Nemesis::PauseAtPoint { fault, .. } if fault.role == role => Some((index, fault.plan)),
        _ => None,
    })
}

/// The process of each role a nemesis may hit now: the one the supervisor started last, until
/// it ends; relays by their index (a timed nemesis on `relay` hits relay 0, one on a delivery
/// the relay that sent it).
#[derive(Default)]
pub struct LiveProcesses {
    running: Mutex<BTreeMap<(Role, u32), (String, OwnChild)>>,
}

impl LiveProcesses {
    /// The supervisor started `label` (`relay0#2`) as `pid`: the role's process `index` (0 for
    /// the writer and the consumer).
    pub fn started(&self, role: Role, index: u32, label: &str, pid: Option<u32>) {
        self.started_own(role, index, label, pid.and_then(OwnChild::spawned));
    }

    /// The supervisor started `label`, proven ours already.
    pub fn started_own(&self, role: Role, index: u32, label: &str, child: Option<OwnChild>) {
        if let Some(child) = child {
            let mut running = self.running.lock().expect("not poisoned");
            running.insert((role, index), (label.to_string(), child));
        }
    }

    /// `label` ended: nothing of its role and index to hit until the next one starts.
    pub fn ended(&self, role: Role, index: u32, label: &str) {
        let mut running = self.running.lock().expect("not poisoned");
        if running.get(&(role, index)).is_some_and(|(l, _)| l == label) {
            running.remove(&(role, index));
        }
    }

    /// The first process of `role` (any index) seen stopped at its pause point; `None` if the
    /// run ended first.
    async fn first_stopped(
        &self,
        role: Role,
        over: &watch::Receiver<bool>,
    ) -> Option<(String, OwnChild)> {
        loop {
            if *over.borrow() {
                return None;
            }
            let stopped = {
                let running = self.running.lock().expect("not poisoned");
                let mut of_role = running.iter().filter(|((r, _), _)| *r == role);
                of_role
                    .find(|(_, (_, child))| child.is_stopped())
                    .map(|(_, found)| found.clone())
            };
            if stopped.is_some() {
                return stopped;
            }
            tokio::time::sleep(STOPPED_POLL).await;
        }
    }

    fn now(&self, role: Role, index: u32) -> Option<(String, OwnChild)> {
        let running = self.running.lock().expect("not poisoned");
        running.get(&(role, index)).cloned()
    }
}

/// How often a db-kill-backend nemesis looks again for a session of its target.
const SESSION_POLL: Duration = Duration::from_millis(5);
/// How often a nemesis looks whether a process has stopped itself at its pause point.
const STOPPED_POLL: Duration = Duration::from_millis(2);

/// What the nemeses of one run work on.
pub struct Arena<'a> {
    /// The run's fault log: its clock, and where each nemesis says it struck.
    pub faults: &'a FaultLog,
    pub live: &'a LiveProcesses,
    pub server: &'a PgServer,
    /// The application's database (the outbox, the orders).
    pub db: &'a Database,
    /// The consumer's: the application's, or a server apart when the application's fails over.
    pub consumer_db: &'a Database,
    /// The replicated pair the application's database is on, where it is (db:failover).
    pub pair: Option<&'a VirtualPrimary>,
    /// The relays' and the writer's links to the database: their sessions, their faults.
    pub links: &'a DbLinks,
    /// Where the workload's transactions of a `txn:*` nemesis are made, and what they write.
    pub workload: &'a TxnWorkload,
    /// The run's history: what those transactions wrote goes into its record of writes.
    pub history: &'a Mutex<History>,
    /// Relay 0's wall clock, where the schedule steps it: the clock, or why it cannot reach
    /// the relay (a statically linked program).
    pub relay_clock: Option<&'a Result<FakeClock, String>>,
    /// The switch of the sink's outage (`net:down`), where the schedule has one.
    pub sink_down: Option<Arc<AtomicBool>>,
    /// Set when the supervisor is done: a nemesis not yet due is then not reached.
    pub over: watch::Receiver<bool>,
    /// Set when every timed nemesis has struck and no relay is held by one on a delivery: a
    /// relay of the user's is not drained before (those on a delivery not yet made may never
    /// come).
    pub done: &'a watch::Sender<bool>,
}

impl Arena<'_> {
    /// The role's process once one is up: at once, or as soon as the next one is when the
    /// role is between two (a nemesis due while a killed relay is being restarted strikes the
    /// restarted one, and says when); None if the run ended first.
    async fn up(&self, role: Role) -> Option<(String, OwnChild)> {
        loop {
            if let Some(found) = self.live.now(role, 0) {
                return Some(found);
            }
            if *self.over.borrow() {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Sends `signal` to the role's process once one is up ([`Arena::up`]); one that has just
    /// ended, and is not yet known to have (a kill 10 ms after another), is passed over for the
    /// next. The process signalled; None if the run ended first.
    async fn signal_up(&self, role: Role, signal: Signal) -> Option<(String, OwnChild)> {
        loop {
            let (label, child) = self.up(role).await?;
            if child.signal(signal) {
                return Some((label, child));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// The label of the role's process now (`relay-0#2`), or the role's name between two.
    fn label(&self, role: Role) -> String {
        let label = self.live.now(role, 0).map(|(label, _)| label);
        label.unwrap_or_else(|| role.name().to_string())
    }

    /// Sleeps until `at` after the start; false if the run was over first.
    async fn until(&self, at: Duration) -> bool {
        let mut over = self.over.clone();
        let due = tokio::select! {
            _ = tokio::time::sleep_until((self.faults.started() + at).into()) => true,
            _ = over.wait_for(|over| *over) => false,
        };
        due && !*self.over.borrow()
    }
}

/// Strikes every nemesis of `schedule` (the network ones are the proxy's: see [`settle`]), those
/// on a delivery as the proxy tells of it through `deliveries`; each says in the fault log when
/// it struck.
pub async fn strike(
    schedule: &Schedule,
    arena: &Arena<'_>,
    deliveries: mpsc::UnboundedReceiver<WatchedDelivery>,
) -> Result<()> {
    let holding = Holding {
        state: Mutex::new((true, 0)),
        done: arena.done,
    };
    let timed = async {
        let struck = strike_timed(schedule, arena).await;
        holding.change(|(timed_left, _)| *timed_left = false);
        struck
    };
    let (timed, on_delivery) = tokio::join!(
        timed,
        strike_on_delivery(schedule, arena, deliveries, &holding)
    );
    timed.and(on_delivery)
}

/// Strikes the nemeses of `schedule` that are not on a delivery.
async fn strike_timed(schedule: &Schedule, arena: &Arena<'_>) -> Result<()> {
    let fire = |i: usize, process: String| arena.faults.struck(i, process, Instant::now());
    let strikes = schedule.nemeses.iter().enumerate().map(|(i, nemesis)| {
        let fire = &fire;
        async move {
            match *nemesis {
                Nemesis::Pause { role, at, hold } => {
                    if arena.until(at).await {
                        if let Some((label, child)) = arena.signal_up(role, Signal::SIGSTOP).await {
                            fire(i, label);
                            child.resume_after(hold).await;
                        }
                    }
                }
                Nemesis::PauseAtPoint { fault, hold } => {
                    // Every first process of the role is armed with it; the first to reach
                    // the point stops (relays race for it: see `crash::arm`).
                    let stopped = arena.live.first_stopped(fault.role, &arena.over).await;
                    if let Some((label, child)) = stopped {
                        fire(i, label);
                        child.resume_after(hold).await;
                    }
                }
                Nemesis::Kill { role, at } => {
                    if arena.until(at).await {
                        if let Some((label, _)) = arena.signal_up(role, Signal::SIGKILL).await {
                            // Dying, it is no target any more (a kill 10 ms later hits the next).
                            arena.live.ended(role, 0, &label);
                            fire(i, label);
                        }
                    }
                }
                Nemesis::DbRestart { at } => {
                    if arena.until(at).await {
                        let _doing = arena.faults.harness_doing();
                        let struck = Instant::now();
                        fire(i, "postgres".into());
                        let before = outbox_sequence(arena.db).await;
                        match arena.pair {
                            // The application's database is there, not on the run's server.
                            Some(pair) => pair.restart_immediately().await?,
                            None => arena.server.restart_immediately().await?,
                        }
                        // A crash loses the values the sequence had logged ahead: ids jump.
                        let after = outbox_sequence(arena.db).await;
                        if let (Some(before), Some(after)) = (before, after) {
                            let jump = format!(
                                "postgres; outbox_id_seq at {before} before the crash, {after} \
                                 once it was back (ids logged ahead and lost, and any taken \
                                 meanwhile: {})",
                                after - before
                            );
                            arena.faults.struck(i, jump, struck);
                        }
                    }
                }
                Nemesis::DbFailover { at } => {
                    let Some(pair) = arena.pair else {
                        anyhow::bail!("{nemesis} needs the database on a replicated pair");
                    };
                    if arena.until(at).await {
                        // Struck from the hold on: what the actors do from then is its doing.
                        let _doing = arena.faults.harness_doing();
                        pair.hold_replication().await?;
                        fire(
                            i,
                            format!(
                                "the primary (replication held {}, {})",
                                format_duration(FAILOVER_HOLD),
                                pair.replication().name()
                            ),
                        );
                        pair.fail_over_after(FAILOVER_HOLD, arena.over.clone())
                            .await?;
                    }
                }
                Nemesis::DbKillBackend { role, at } => {
                    if arena.until(at).await {
                        if let Some(label) = kill_backends(arena, role).await? {
                            fire(i, label);
                        }
                    }
                }
                Nemesis::DbNet { role, fault } => {
                    let link = arena.links.of(role);
                    match fault {
                        DbNetFault::Reset { at } => {
                            if arena.until(at).await {
                                // Struck once the link has a connection to cut (an actor
                                // reconnecting is struck as soon as it has one again).
                                while link.reset() == 0 && !*arena.over.borrow() {
                                    tokio::time::sleep(SESSION_POLL).await;
                                }
                                if !*arena.over.borrow() {
                                    fire(i, format!("{}'s database link", arena.label(role)));
                                }
                            }
                        }
                        DbNetFault::Partition { at, hold } => {
                            if arena.until(at).await {
                                fire(i, format!("{}'s database link", arena.label(role)));
                                let mut over = arena.over.clone();
                                tokio::select! {
                                    _ = link.partition(hold) => {}
                                    _ = over.wait_for(|over| *over) => {}
                                }
                            }
                        }
                        DbNetFault::CommitLost { .. } => {}
                    }
                }
                Nemesis::NetDown { at, hold } => {
                    if let (Some(down), true) = (&arena.sink_down, arena.until(at).await) {
                        /// The sink comes back also when the run ends first.
                        struct Up<'a>(&'a AtomicBool);
                        impl Drop for Up<'_> {
                            fn drop(&mut self) {
                                self.0.store(false, Ordering::SeqCst);
                            }
                        }
                        down.store(true, Ordering::SeqCst);
                        let _up = Up(down);
                        fire(i, "the sink".into());
                        let mut over = arena.over.clone();
                        tokio::select! {
                            _ = tokio::time::sleep(hold) => {}
                            _ = over.wait_for(|over| *over) => {}
                        }
                    }
                }
                Nemesis::Txn(fault) => transactions::strike(i, fault, arena, arena.history).await?,
                Nemesis::ClockStep { target, at, by_ms } => {
                    if arena.until(at).await {
                        let clock = match target {
                            ClockTarget::Relay => arena.relay_clock,
                            ClockTarget::Db => arena.server.clock(),
                        };
                        match (clock, target) {
                            (Some(Ok(clock)), _) => {
                                let off_ms = clock.step(by_ms)?;
                                let whose = match target {
                                    ClockTarget::Relay => format!("{}'s", arena.label(Role::Relay)),
                                    ClockTarget::Db => "the database server's".into(),
                                };
                                fire(i, format!("{whose} wall clock, now {off_ms:+} ms off"));
                            }
                            (Some(Err(why)), _) => arena.faults.not_reached(i, why.clone()),
                            (None, ClockTarget::Db) => arena.faults.not_reached(
                                i,
                                "the database server is not one of outbox-lab's (its clock is \
                                 yours)"
                                    .into(),
                            ),
                            (None, ClockTarget::Relay) => arena.faults.not_reached(
                                i,
                                "relay 0 was not started on a clock of the run's".into(),
                            ),
                        }
                    }
                }
                Nemesis::Net(_) | Nemesis::OnDelivery { .. } => {}
            }
            anyhow::Ok(())
        }
    });
    for result in join_all(strikes).await {
        result?;
    }
    Ok(())
}

/// The network nemeses' outcomes, read from the proxies after the run into the fault log.
pub fn settle(
    schedule: &Schedule,
    proxied: Option<&FaultRecord>,
    links: &DbLinks,
    faults: &FaultLog,
) {
    for (i, nemesis) in schedule.nemeses.iter().enumerate() {
        match (*nemesis, proxied) {
            (Nemesis::Net(plan), Some(proxied)) => match proxied.struck_at(plan.on_request) {
                Some(at) => {
                    let process = format!("request {} through the proxy", plan.on_request);
                    faults.struck(i, process, at);
                }
                None => {
                    let requests = proxied.counts().requests;
                    faults.not_reached(i, format!("{requests} requests went through the proxy"));
                }
            },
            (
                Nemesis::DbNet {
                    role,
                    fault: DbNetFault::CommitLost { on_commit },
                },
                _,
            ) => {
                let link = links.of(role);
                match link.commit_lost(on_commit) {
                    Some((at, backend)) => {
                        let backend =
                            backend.map_or(String::new(), |pid| format!(", backend {pid}"));
                        let process =
                            format!("{}'s committing answer {on_commit}{backend}", role.name());
                        faults.struck(i, process, at);
                    }
                    None => faults.not_reached(i, commit_not_reached(role, link)),
                }
            }
            _ => {}
        }
    }
}

/// Why `dbnet:commit-lost` on `role` was not reached, and what to do.
fn commit_not_reached(role: Role, link: &PgLink) -> String {
    let role = role.name();
    let leave_out = "leave dbnet-commit-lost out";
    match link.committing_answers() {
        0 => format!(
            "{role}'s link made no committing answer (COMMIT, or a write in autocommit): \
             {leave_out}"
        ),
        made => format!(
            "{role}'s link made {made} committing answer{} (COMMIT, or a write in autocommit): \
             try dbnet:commit-lost:{role}@{made} or {leave_out}",
            if made == 1 { "" } else { "s" }
        ),
    }
}

/// Where the outbox's id sequence stands (`last_value`), if it can be read (the server up, the
/// article's outbox there).
async fn outbox_sequence(db: &Database) -> Option<i64> {
    let client = connect::patiently(connect::RECONNECT_PATIENCE, async || db.connect().await)
        .await
        .ok()?;
    let row = client
        .query_one("SELECT last_value FROM public.outbox_id_seq", &[])
        .await
        .ok()?;
    Some(row.get(0))
}

/// Ends the database sessions of `role` (relay 0, or the consumer) once it has one; what was
/// struck, `None` if the run ended first.
async fn kill_backends(arena: &Arena<'_>, role: Role) -> Result<Option<String>> {
    // A target between two sessions (reconnecting) is struck as soon as it has one again, as
    // a process between two is.
    let mut client = None;
    loop {
        let sessions = match role {
            Role::Consumer => Sessions::Named(CONSUMER_APPLICATION_NAME.to_string()),
            _ => Sessions::Backends(arena.links.of(role).backends()),
        };
        let db = match role {
            Role::Consumer => arena.consumer_db,
            _ => arena.db,
        };
        // Patiently, and again after a restart (a nemesis beside this one).
        let connected = match client.take() {
            Some(client) => client,
            None => {
                connect::patiently(connect::RECONNECT_PATIENCE, async || db.connect().await).await?
            }
        };
        match terminate_backends(&connected, &sessions).await {
            Ok(0) => client = Some(connected),
            Ok(_) => return Ok(Some(format!("{}'s sessions", arena.label(role)))),
            Err(e) if connect::lost_connection(&e) => {}
            Err(e) => return Err(e),
        }
        if *arena.over.borrow() {
            return Ok(None);
        }
        tokio::time::sleep(SESSION_POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every form parses to what prints back the same; the default schedules parse.
    #[test]
    fn nemeses_round_trip() {
        for text in DEFAULT_SCHEDULES.iter().chain(&[
            "pause:relay@1.5s+3s",
            "db:restart@1.5s",
            "db:failover@1s",
            "kill:consumer@2s",
            "kill:relay:on-delivery@3",
            "pause:relay:on-delivery@3+2.5s",
            "db:kill-backend:relay:on-delivery@7",
            "net:down@300ms+2s",
            "dbnet:reset:writer@1s",
            "dbnet:partition:relay@250ms+1500ms",
            "dbnet:commit-lost:writer@3",
        ]) {
            let nemesis: Nemesis = text.parse().unwrap();
            assert_eq!(
                nemesis.to_string().parse::<Nemesis>(),
                Ok(nemesis),
                "{text}"
            );
            assert!(super::super::schedule::KINDS
                .iter()
                .any(|(kind, _, _)| *kind == nemesis.kind()));
        }
        assert_eq!(
            "pause:relay:after-fetch@1+300ms"
                .parse::<Nemesis>()
                .unwrap()
                .to_string(),
            "pause:relay:after-fetch-before-send@1+300ms"
        );
    }
}
