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

use anyhow::{anyhow, Result};
use futures_util::future::try_join_all;
use tokio::sync::watch;
use tokio_postgres::config::Host;
use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

use super::checker;
use super::designs::{Design, RelayVariant, Writer};
use super::history::{FaultOutcome, FaultRecord, History};
use super::nemeses::{self, Arena, LiveProcesses};
use super::schedule::{Fault, Role, Schedule};
use crate::error;
use crate::harness::child::role::{
    AmqpWorkerRole, ConsumerRole, ExploreRelayRole, ExploreWriterRole, JetStreamWorkerRole,
    Role as ChildRole, StreamWorkerRole,
};
use crate::harness::child::{ChildCommand, ChildEnd, ChildRun, ConsumerProcess};
use crate::harness::db::{Database, PgServer};
use crate::harness::foreign::{relay_name, Endpoints, RelayTemplate, Tail};
use crate::harness::nemesis::format_duration;
use crate::harness::nemesis::{Sessions, COUNT_FOREIGN_SESSIONS};
use crate::harness::proxy::Proxy;
use crate::harness::throwaway;
use crate::judge::invariants::pending;
use crate::judge::record;
use crate::outbox::consumer::{Faults, CONSUMER_APPLICATION_NAME};
use crate::outbox::crash::CrashPlan;
use crate::outbox::jetstream_consumer;
use crate::outbox::relay::RELAY_APPLICATION_NAME;
use crate::outbox::relay::{RelayConfig, RelayDesign, RelayOptions};
use crate::outbox::schema;
use crate::outbox::sink::{AmqpSink, NatsSink, SinkOptions};
use crate::outbox::stream_consumer;
use crate::outbox::writer::WRITER_APPLICATION_NAME;

/// Fills in what a relay of the user's may leave out of a delivery (the outbox id, the event
/// type), from the outbox row of the event id it sent: the order and duplicate invariants read
/// them from the receipts.
const COMPLETE_RECEIPTS: &str = "
UPDATE consumer.receipts r
   SET outbox_id = o.id, event_type = o.event_type
  FROM outbox o
 WHERE o.event_id = r.event_id
   AND (r.outbox_id IS NULL OR r.event_type = '')";

/// Deliveries the consumer has received.
const COUNT_RECEIPTS: &str = "SELECT count(*) FROM consumer.receipts";

/// Processes of one role a run may start before it counts as stuck.
const MAX_PROCESSES_PER_ROLE: u32 = 20;
/// Liveness, as a bound: every committed event is delivered within this time after the faults
/// end (the writer finished and the last fault fired), or the run is stuck. A drain takes tens
/// of milliseconds here; the rest is margin for a loaded machine. Every run of a stuck design
/// lasts this long, so it is short.
pub const LIVENESS_BOUND: Duration = Duration::from_secs(3);

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

/// The lab names its own sessions so (`application_name`).
const LAB_APPLICATION_NAME: &str = "outbox-lab supervisor";
/// Every session of ours in a run's database; any other is a relay of the user's.
pub const OUR_SESSIONS: [&str; 3] = [
    LAB_APPLICATION_NAME,
    WRITER_APPLICATION_NAME,
    CONSUMER_APPLICATION_NAME,
];
/// A relay of the user's must have connected to the database within this time of the start.
const CONNECT_BOUND: Duration = Duration::from_secs(10);
/// A relay of the user's that fails by itself (a non-zero status) this soon after it started,
/// before any fault, "exits at once": bad input, not a verdict.
const EXITS_AT_ONCE: Duration = Duration::from_secs(1);
/// A relay of the user's that ended is started again after this (no spinning on one that
/// cannot run).
const FOREIGN_RESTART_DELAY: Duration = Duration::from_millis(100);
/// A relay of the user's gets this long after SIGTERM before SIGKILL.
const FOREIGN_STOP_GRACE: Duration = Duration::from_secs(2);
/// Drained: nothing pending, and the consumer received nothing new for this long (a relay that
/// marks before it sends is still sending).
const DRAIN_SETTLE: Duration = Duration::from_millis(300);
/// How often the drain is looked at.
const DRAIN_POLL: Duration = Duration::from_millis(25);
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
const RESET_LOCK_TIMEOUT: Duration = Duration::from_secs(5);
/// The writer spreads its workload until this long after the last nemesis on the clock is
/// over: every nemesis strikes while events are being written.
const WRITING_AFTER_NEMESES: Duration = Duration::from_millis(250);
/// A relay of the user's whose first processes all end this soon, before any fault and before
/// any relay was seen connected to the database, does not run at all (`--relay-cmd true`).
const QUICK_EXITS_UNCONNECTED: u32 = 3;

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

/// The user's relay and what it needs.
pub struct ForeignRelays {
    pub template: RelayTemplate,
    /// Where it delivers.
    pub delivery: Delivery,
    /// Counts what is still to be delivered (by default, the outbox rows not marked published).
    pub pending_sql: String,
    /// The user's DDL, run after the article's tables in every run's fresh schema.
    pub schema: Option<String>,
}

/// Where the relays deliver, and so which consumer runs.
#[derive(Debug, Clone)]
pub enum Delivery {
    /// POSTs to our HTTP consumer.
    Http,
    /// XADDs to `stream` on the Redis at `url`, read by a consumer-group worker of ours.
    Redis { url: String, stream: String },
    /// Publishes to `outbox.event.<aggregate_type>` on the NATS at `url`, captured by the
    /// stream [`JETSTREAM_STREAM`] and read by a durable pull consumer of ours.
    Nats { url: String },
    /// Publishes to the durable queue `queue` on the RabbitMQ at `url`, read by a worker of
    /// ours with manual acks.
    Amqp { url: String, queue: String },
}

/// The JetStream stream a run's deliveries go to (made anew for every run).
const JETSTREAM_STREAM: &str = "outbox";

/// What a broker holds that our consumer has not acknowledged: a worker killed with messages
/// in hand has them delivered again only after the ack wait, so a quiet consumer is not yet a
/// drained one.
enum Backlog {
    /// Nothing waits elsewhere: our HTTP consumer applies every delivery before answering
    /// it, and a Redis worker takes over its predecessor's pending entries as it starts.
    Nothing,
    /// The durable consumer's messages not yet delivered, and delivered but not acked.
    Nats {
        url: String,
        consumer: Option<Box<async_nats::jetstream::consumer::PullConsumer>>,
    },
    /// The queue's messages ready for our worker (one it took and did not ack goes back when
    /// its channel closes: a killed worker's come back at once).
    Amqp {
        url: String,
        queue: String,
        channel: Option<lapin::Channel>,
    },
}

impl Backlog {
    fn new(delivery: &Delivery) -> Backlog {
        match delivery {
            Delivery::Http | Delivery::Redis { .. } => Backlog::Nothing,
            Delivery::Nats { url } => Backlog::Nats {
                url: url.clone(),
                consumer: None,
            },
            Delivery::Amqp { url, queue } => Backlog::Amqp {
                url: url.clone(),
                queue: queue.clone(),
                channel: None,
            },
        }
    }

    async fn count(&mut self) -> Result<i64> {
        if let Backlog::Amqp {
            url,
            queue,
            channel,
        } = self
        {
            if !channel.as_ref().is_some_and(|c| c.status().connected()) {
                *channel = Some(crate::connect::amqp(url).await?.create_channel().await?);
            }
            let channel = channel.as_ref().expect("opened above");
            return AmqpSink::ready_messages(channel, queue).await;
        }
        let Backlog::Nats { url, consumer } = self else {
            return Ok(0);
        };
        if consumer.is_none() {
            let jetstream = async_nats::jetstream::new(crate::connect::nats(url).await?);
            let stream = jetstream
                .get_stream(JETSTREAM_STREAM)
                .await
                .map_err(|e| anyhow!("{e}"))?;
            // Not there until the first worker created it: nothing is drained before that.
            *consumer = Some(Box::new(
                stream
                    .get_consumer(jetstream_consumer::DURABLE)
                    .await
                    .map_err(|e| anyhow!("{e}"))?,
            ));
        }
        let info = consumer
            .as_mut()
            .expect("set above")
            .info()
            .await
            .map_err(|e| anyhow!("{e}"))?;
        Ok((info.num_pending + info.num_ack_pending as u64) as i64)
    }
}

/// The Redis consumer's worker name, the same in every process: a restarted worker takes
/// over its predecessor's pending entries.
const STREAM_WORKER: &str = "verify-worker";
/// Entries a stream worker reads at a time.
const STREAM_READ_COUNT: usize = 100;

/// Counts the outbox rows a relay still owes (the judge's backlog).
pub const COUNT_PENDING: &str = concat!("SELECT count(*) FROM (", pending!(), ") owed");

/// A run of the user's relay ended before it could be judged, for a reason that is the input's
/// (the command, the relay), not the relay's verdict.
#[derive(Debug, thiserror::Error)]
pub enum ForeignRelayError {
    #[error(
        "{name} exited by itself {after_ms} ms after it started ({status}), before any fault: \
         is --relay-cmd right? its last lines: {tail}"
    )]
    ExitsAtOnce {
        name: String,
        status: String,
        after_ms: u128,
        tail: String,
    },
    #[error(
        "no relay connected to the database within {} s: does it read the URL it is given \
         ({{database_url}}, {{dsn}} or PGHOST...)? relay-0's last lines: {tail}",
        CONNECT_BOUND.as_secs()
    )]
    NeverConnects { tail: String },
}

/// One design's database, consumer port and workload, reused for all its runs.
pub struct Lab<'s> {
    pub design: &'static Design,
    relays: Relays,
    bounds: Bounds,
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
}

impl<'s> Lab<'s> {
    /// Creates the design's database with the article's schema, the watermark table, and the
    /// claim designs' lease columns and fences.
    pub async fn prepare(
        server: &'s PgServer,
        design: &'static Design,
        workload: Workload,
    ) -> Result<Lab<'s>> {
        let lab = Lab::open(server, design, workload, Relays::Ours, EXPLORE_BOUNDS).await?;
        {
            let client = lab.client().await?;
            schema::create(&client).await?;
            client.batch_execute(schema::ADD_RELAY_WATERMARK).await?;
            client.batch_execute(schema::ADD_CLAIM_COLUMNS).await?;
            client.batch_execute(schema::ADD_FENCING).await?;
        }
        Ok(lab)
    }

    /// A lab for the user's relays (`outbox-lab verify`): every run starts from a fresh schema,
    /// the article's tables and NOTIFY trigger then the user's DDL (made once here, so that a
    /// schema that does not apply is found before any run).
    pub async fn prepare_foreign(
        server: &'s PgServer,
        design: &'static Design,
        workload: Workload,
        foreign: ForeignRelays,
        bounds: Bounds,
    ) -> Result<Lab<'s>> {
        let lab = Lab::open(server, design, workload, Relays::Foreign(foreign), bounds).await?;
        lab.reset().await?;
        lab.try_pending_sql().await?;
        Ok(lab)
    }

    /// Runs the user's relay's count of what is still owed once, on the fresh schema: a
    /// statement that cannot count is bad input, found before any run.
    async fn try_pending_sql(&self) -> Result<()> {
        let Relays::Foreign(foreign) = &self.relays else {
            return Ok(());
        };
        let client = self.client().await?;
        let row = client
            .query_one(foreign.pending_sql.as_str(), &[])
            .await
            .map_err(|e| {
                self.user_sql_failed("--pending-sql does not run on the fresh schema", e)
            })?;
        row.try_get::<_, i64>(0).map_err(|_| {
            error::Error::Usage(anyhow!(
                "--pending-sql must return one bigint: the count still to be delivered"
            ))
        })?;
        Ok(())
    }

    async fn open(
        server: &'s PgServer,
        design: &'static Design,
        workload: Workload,
        relays: Relays,
        bounds: Bounds,
    ) -> Result<Lab<'s>> {
        let db = server.create_database(design.name).await?;
        let client = db.connect_as(LAB_APPLICATION_NAME).await?;
        bound_session(&client, &bounds).await?;
        let [port] = throwaway::free_ports()?;
        Ok(Lab {
            design,
            relays,
            bounds,
            server,
            db,
            client: tokio::sync::Mutex::new(client),
            port,
            workload,
        })
    }

    /// The lab's own connection, made again if the database restarted under it.
    pub async fn client(&self) -> Result<tokio::sync::MutexGuard<'_, Client>> {
        let mut client = self.client.lock().await;
        if client.is_closed() {
            *client = crate::connect::patiently(crate::connect::RECONNECT_PATIENCE, async || {
                self.db.connect_as(LAB_APPLICATION_NAME).await
            })
            .await?;
            bound_session(&client, &self.bounds).await?;
        }
        Ok(client)
    }

    /// Empties the tables (our relays), or makes the schema anew (the user's: their own
    /// tables, a stored position, start from nothing too).
    async fn reset(&self) -> Result<()> {
        let client = self.client().await?;
        match &self.relays {
            Relays::Ours => {
                client.batch_execute(schema::RESET).await?;
                client.batch_execute(schema::RESET_RELAY_WATERMARK).await?;
                client.batch_execute(schema::RESET_FENCES).await?;
            }
            Relays::Foreign(foreign) => {
                client.batch_execute(schema::RECREATE).await?;
                schema::create(&client).await?;
                client.batch_execute(schema::NOTIFY_TRIGGER).await?;
                if let Some(ddl) = &foreign.schema {
                    client
                        .batch_execute(ddl)
                        .await
                        .map_err(|e| self.user_sql_failed("--schema does not apply", e))?;
                    if let Some(why) = record::broken_by_user_schema(&client).await {
                        return Err(error::Error::Usage(anyhow!(
                            "--schema breaks outbox-lab's tables ({why}): your DDL may add \
                             tables, columns, indexes and triggers, not drop or change the \
                             article's outbox, orders and consumer tables"
                        ))
                        .into());
                    }
                }
                client.batch_execute(record::RECORD_WRITES).await?;
            }
        }
        Ok(())
    }

    /// The user's SQL failed: bad input, which says what and, when it was too slow, the bound.
    fn user_sql_failed(&self, what: &str, e: tokio_postgres::Error) -> anyhow::Error {
        let too_slow = e.code() == Some(&SqlState::QUERY_CANCELED);
        let why = anyhow::Error::from(e);
        let bound = match too_slow {
            true => format!(
                " (every statement is bounded by {} here, a quarter of --time-limit)",
                format_duration(self.bounds.statement)
            ),
            false => String::new(),
        };
        error::Error::Usage(anyhow!("{what}: {why:#}{bound}")).into()
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
        self.reset().await?;
        if let Delivery::Redis { url, stream } = self.delivery() {
            // An empty stream and its consumer group, which the first worker joins.
            let mut redis = crate::connect::redis(&url).await?;
            let _: i64 = redis::AsyncCommands::del(&mut redis, &stream).await?;
            let _: () = redis::AsyncCommands::xgroup_create_mkstream(
                &mut redis,
                &stream,
                stream_consumer::GROUP,
                "0",
            )
            .await?;
        }
        if let Delivery::Amqp { url, queue } = self.delivery() {
            // An empty durable queue.
            let connection = crate::connect::amqp(&url).await?;
            let channel = connection.create_channel().await?;
            AmqpSink::redeclare_queue(&channel, &queue).await?;
            let _ = connection.close(200, "declared".into()).await;
        }
        if let Delivery::Nats { url } = self.delivery() {
            // An empty stream capturing every aggregate type's subject; the worker creates its
            // durable consumer.
            let jetstream = async_nats::jetstream::new(crate::connect::nats(&url).await?);
            let config = NatsSink::stream_config(JETSTREAM_STREAM, "");
            NatsSink::create_fresh_stream(&jetstream, config).await?;
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
            writer_done: watch::channel(false).0,
            drained: watch::channel(false).0,
            relay_tail: Mutex::new(Tail::default()),
            nemeses_done: watch::channel(false).0,
            relay_connected: watch::channel(false).0,
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
            relay_sessions: match self.relays {
                Relays::Ours => Sessions::Named(format!("{RELAY_APPLICATION_NAME} r0")),
                Relays::Foreign(_) => Sessions::AllBut(OUR_SESSIONS.to_vec()),
            },
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
        let striking = async {
            let struck = nemeses::strike(schedule, &arena, &outcomes).await;
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
        nemeses::settle(schedule, proxy.as_ref(), arena.started, &outcomes);
        let client = self.client().await?;
        if let Relays::Foreign(_) = self.relays {
            // The rows the relay deleted once published come back, and what it left out of
            // its deliveries is filled in by the event id it did send.
            record::restore_deleted(&client).await?;
            client.batch_execute(COMPLETE_RECEIPTS).await?;
        }
        let violations = match cut_short {
            // Not drained: what is owed is pending, not lost, and liveness is not judged.
            Some(_) => checker::check_live(&client).await?,
            None => checker::check(&client, stuck.as_deref()).await?,
        };
        drop(client);
        let mut history = history.into_inner().expect("not poisoned");
        history.cut_short = cut_short;
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
        let writer_done = &stage.writer_done;
        let (all_done, _) = watch::channel(false);
        // The first error ends the run at once (a relay of the user's that is bad input does
        // not wait for the writer): dropping the rest kills their children.
        let producers = async {
            let relays =
                (0..self.design.relays).map(|i| self.keep_relay(i, faults, struck, history, stage));
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
            why = liveness_watchdog(faults, struck, writer_done, self.bounds.liveness) => {
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
    async fn keep_writer(
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
            let writer = self
                .writer_command(&stage.sink, stage.schedule)
                .crash_at(plan)
                .pause_at(nemeses::pause_point(stage.schedule, Role::Writer).filter(|_| n == 1))
                .spawn()?;
            stage.live.started(Role::Writer, &label, writer.pid());
            let run = writer.finish(self.bounds.child).await?;
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
        stage.writer_done.send_replace(true);
        Ok(stuck)
    }

    /// Runs relay `index`, and a new one after each crash; once the writer is done, tells it
    /// (by closing its stdin) to stop when nothing is left to deliver.
    async fn keep_relay(
        &self,
        index: u32,
        faults: &FaultLog,
        struck: &Struck<'_>,
        history: &Mutex<History>,
        stage: &Stage<'_>,
    ) -> Result<Option<String>> {
        if let Relays::Foreign(foreign) = &self.relays {
            return self
                .keep_foreign_relay(index, &foreign.template, faults, struck, history, stage)
                .await;
        }
        let writer_done = &stage.writer_done;
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
            let run = relay.finish(self.bounds.child).await?;
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

    /// Runs the user's relay `index`, and again whenever it ends (killed, crashed, or done by
    /// itself: reported all the same), until the outbox is drained; then SIGTERM.
    async fn keep_foreign_relay(
        &self,
        index: u32,
        template: &RelayTemplate,
        faults: &FaultLog,
        struck: &Struck<'_>,
        history: &Mutex<History>,
        stage: &Stage<'_>,
    ) -> Result<Option<String>> {
        let endpoints = self.endpoints(&stage.sink)?;
        let name = relay_name(index);
        let mut quick_exits = 0;
        for n in 1..=MAX_PROCESSES_PER_ROLE {
            let label = format!("{name}#{n}");
            let mut relay = template.spawn(&endpoints, index)?;
            if index == 0 {
                stage.live.started_own(Role::Relay, &label, relay.own());
                *stage.relay_tail.lock().expect("not poisoned") = relay.tail();
            }
            let mut drained = stage.drained.subscribe();
            let ended = tokio::select! {
                status = relay.exited() => Some(status?),
                _ = drained.wait_for(|drained| *drained) => None,
            };
            if index == 0 {
                stage.live.ended(Role::Relay, &label);
            }
            let tail = relay.tail();
            let Some(status) = ended else {
                let status = relay.stop(FOREIGN_STOP_GRACE).await?;
                let end = format!("stopped with SIGTERM once drained ({status})");
                record_foreign_end(history, &label, end, &tail.lines());
                return Ok(None);
            };
            let lived = relay.started.elapsed();
            let no_fault_yet = faults.last_fired().is_none() && struck.last().is_none();
            // With status 0 it may be a relay that drains what there is and ends (run from
            // cron): started again like any other, not refused — unless it never connects.
            let failed = status.code().is_some_and(|code| code != 0);
            let quick = lived < EXITS_AT_ONCE && no_fault_yet;
            if quick && !*stage.relay_connected.borrow() {
                quick_exits += 1;
            }
            if quick && (n == 1 && failed || quick_exits == QUICK_EXITS_UNCONNECTED) {
                return Err(error::Error::Usage(
                    ForeignRelayError::ExitsAtOnce {
                        name,
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

    /// For the user's relays: fails the run if none connects within [`CONNECT_BOUND`]; once
    /// the writer is done, says when the outbox is drained (nothing pending, nothing left for
    /// our consumer at the broker, nothing new at the consumer for [`DRAIN_SETTLE`]), and
    /// waits for the rest of the run. Nothing to do for ours, which drain themselves. Returns
    /// only to fail.
    async fn watch_foreign(&self, stage: &Stage<'_>) -> anyhow::Error {
        let Relays::Foreign(foreign) = &self.relays else {
            return std::future::pending().await;
        };
        let started = Instant::now();
        let mut connected = false;
        let mut settled: Option<(i64, Instant)> = None;
        let mut broker = Backlog::new(&foreign.delivery);
        loop {
            tokio::time::sleep(DRAIN_POLL).await;
            // The database may be restarting (a nemesis): look again later.
            let Ok(client) = self.client().await else {
                continue;
            };
            if !connected {
                let sessions = client
                    .query_one(COUNT_FOREIGN_SESSIONS, &[&OUR_SESSIONS.to_vec()])
                    .await;
                connected = sessions.is_ok_and(|row| row.get::<_, i64>(0) > 0);
                stage.relay_connected.send_replace(connected);
                if !connected && started.elapsed() > CONNECT_BOUND {
                    let tail = stage.relay_tail.lock().expect("not poisoned").lines();
                    let tail = tail.join(" | ");
                    return error::Error::Usage(ForeignRelayError::NeverConnects { tail }.into())
                        .into();
                }
            }
            if !*stage.writer_done.borrow() || !*stage.nemeses_done.borrow() {
                continue;
            }
            let pending = match client.query_one(&foreign.pending_sql, &[]).await {
                Ok(row) => row.get::<_, i64>(0),
                Err(e) if e.code() == Some(&SqlState::QUERY_CANCELED) => {
                    return self.user_sql_failed("--pending-sql took too long during the run", e);
                }
                Err(_) => continue,
            };
            let counts = async {
                let received: i64 = client.query_one(COUNT_RECEIPTS, &[]).await?.get(0);
                let pending = pending + broker.count().await?;
                anyhow::Ok((pending, received))
            };
            let Ok((pending, received)) = counts.await else {
                continue;
            };
            settled = match settled {
                _ if pending > 0 => None,
                Some((seen, since)) if seen == received => {
                    if since.elapsed() >= DRAIN_SETTLE {
                        stage.drained.send_replace(true);
                        return std::future::pending().await;
                    }
                    Some((seen, since))
                }
                _ => Some((received, Instant::now())),
            };
        }
    }

    /// What the user's relay is told: the database (as a URL, as libpq keywords, as libpq's
    /// variables) and where to deliver.
    fn endpoints(&self, sink: &str) -> Result<Endpoints> {
        let config = self.db.config()?;
        let host = match config.get_hosts().first() {
            Some(Host::Unix(dir)) => dir.to_string_lossy().into_owned(),
            Some(Host::Tcp(name)) => name.clone(),
            None => "localhost".into(),
        };
        let port = config
            .get_ports()
            .first()
            .copied()
            .unwrap_or(5432)
            .to_string();
        let user = config.get_user().unwrap_or("postgres").to_string();
        let dbname = self.db.name.clone();
        let password = config
            .get_password()
            .map(|p| String::from_utf8_lossy(p).into_owned());
        let encode = |text: &str| crate::connect::percent_encode(text.as_bytes());
        let credentials = match &password {
            Some(p) => format!("{}:{}", encode(&user), encode(p)),
            None => encode(&user),
        };
        let database_url = format!(
            "postgresql://{credentials}@{}:{port}/{}",
            encode(&host),
            encode(&dbname)
        );
        let quote = |v: &str| format!("'{}'", v.replace('\\', "\\\\").replace('\'', "\\'"));
        let mut dsn = format!(
            "host={} port={port} user={} dbname={}",
            quote(&host),
            quote(&user),
            quote(&dbname)
        );
        let mut libpq_env = vec![
            ("PGHOST".to_string(), host),
            ("PGPORT".to_string(), port),
            ("PGUSER".to_string(), user),
            ("PGDATABASE".to_string(), dbname),
        ];
        if let Some(p) = password {
            dsn.push_str(&format!(" password={}", quote(&p)));
            libpq_env.push(("PGPASSWORD".to_string(), p));
        }
        let none = String::new;
        let (http_url, redis_url, nats_url, amqp_url) = match self.delivery() {
            Delivery::Http => (sink.to_string(), none(), none(), none()),
            Delivery::Redis { url, .. } => (none(), url, none(), none()),
            Delivery::Nats { url } => (none(), none(), url, none()),
            Delivery::Amqp { url, .. } => (none(), none(), none(), url),
        };
        Ok(Endpoints {
            database_url,
            dsn,
            libpq_env,
            sink_url: sink.to_string(),
            http_url,
            redis_url,
            nats_url,
            amqp_url,
        })
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

    /// Where the relays deliver: our HTTP consumer, or the broker.
    fn sink_url(&self) -> String {
        match self.delivery() {
            Delivery::Http => format!("http://127.0.0.1:{}", self.port),
            Delivery::Redis { url, .. } | Delivery::Nats { url } | Delivery::Amqp { url, .. } => {
                url
            }
        }
    }

    /// The HTTP consumer on the lab's port, a Redis consumer-group worker or a JetStream worker.
    fn consumer_command(&self, plan: Option<CrashPlan>) -> ChildCommand<ChildRole> {
        let command = match self.delivery() {
            Delivery::Http => ChildCommand::new(
                &self.db,
                ConsumerRole {
                    kind: self.design.consumer,
                    port: self.port,
                    faults: Faults {
                        fail_every_delivery_of: self.design.poison_without_dead_letter,
                        ..Faults::default()
                    },
                },
            )
            .any_role(),
            Delivery::Redis { url, stream } => ChildCommand::new(
                &self.db,
                StreamWorkerRole {
                    redis_url: url,
                    stream,
                    worker: STREAM_WORKER.into(),
                    kind: self.design.consumer,
                    count: STREAM_READ_COUNT,
                    follow: true,
                },
            )
            .any_role(),
            Delivery::Nats { url } => ChildCommand::new(
                &self.db,
                JetStreamWorkerRole {
                    nats_url: url,
                    stream: JETSTREAM_STREAM.into(),
                    durable: jetstream_consumer::DURABLE.into(),
                    kind: self.design.consumer,
                    batch: STREAM_READ_COUNT,
                    follow: true,
                },
            )
            .any_role(),
            Delivery::Amqp { url, queue } => ChildCommand::new(
                &self.db,
                AmqpWorkerRole {
                    amqp_url: url,
                    queue,
                    kind: self.design.consumer,
                    batch: STREAM_READ_COUNT,
                },
            )
            .any_role(),
        };
        command.crash_at(plan)
    }

    /// The writer; a dual write sends to `sink` itself.
    fn writer_command(&self, sink: &str, schedule: &Schedule) -> ChildCommand<ExploreWriterRole> {
        // The relays may drain faster than the nemeses come: the workload is spread until they
        // are over, so that each strikes while events are written and relayed.
        let window = schedule
            .clock_over_at()
            .map_or(Duration::ZERO, |over| over + WRITING_AFTER_NEMESES);
        let role = ExploreWriterRole {
            orders: self.workload.orders,
            events_per_order: self.workload.events_per_order,
            overlap: self.workload.overlap,
            pace: window / self.workload.orders.div_ceil(2).max(1),
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
/// Bounds the lab's own session: a reset waits [`RESET_LOCK_TIMEOUT`] at most for a killed
/// child's locks, and no statement runs longer than the bounds say.
async fn bound_session(client: &Client, bounds: &Bounds) -> Result<()> {
    let sql = format!(
        "SET lock_timeout = {}; SET statement_timeout = {}",
        RESET_LOCK_TIMEOUT.as_millis(),
        bounds.statement.as_millis()
    );
    Ok(client.batch_execute(&sql).await?)
}

async fn liveness_watchdog(
    faults: &FaultLog,
    struck: &Struck<'_>,
    writer_done: &watch::Sender<bool>,
    bound: Duration,
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
        let deadline = faults_ended + bound;
        if Instant::now() >= deadline {
            return format!(
                "not drained within {} s after the writer finished and the last fault fired",
                bound.as_secs()
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
