//! The relay: reads undelivered outbox rows, delivers them, and marks them published — or, for
//! the watermark designs, remembers how far it got.
//!
//! Every relay is an [`OutboxRelay`] (one pass: fetch, deliver, mark; what is pending; how to
//! wait for more), and every relay is driven by the one loop, [`drive`], with its stop
//! conditions ([`Until`]): drained (optionally only once told the writer is done), a deadline,
//! or a shutdown signal. The designs:
//! - [`Relay`] over the outbox table, with [`RelayDesign::Lock`] (the article's: row locks held
//!   by the delivering transaction, in [`lock`]), [`RelayDesign::Claim`] (a committed lease, in
//!   [`claim`]) and [`RelayDesign::MarkBeforeSend`] (broken on purpose, for explore); it wakes
//!   up by polling or LISTEN/NOTIFY ([`Wakeup`]).
//! - The [`watermark`] relays, which mark nothing: the plain one loses events (watermark-gap),
//!   the xid8 one is gap-safe, the stored one is the plain one as production builds it.
//! - The log-tailing [`cdc`] relay (a logical replication slot, [`pgoutput`] decoded): a stream,
//!   not passes, so it follows the slot on its own until stopped.
//!
//! Its SQL is in [`sql`], as the article writes it.

pub mod cdc;
mod claim;
mod lock;
pub mod pgoutput;
mod polling;
pub mod sql;
pub mod watermark;

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};
use tokio_postgres::Client;
use tracing::info;

use crate::outbox::sink::{Sink, SinkOptions, DEFAULT_REQUEST_TIMEOUT};
pub use polling::Relay;

/// Relay children name their sessions `outbox-lab relay NAME` (`application_name`).
pub const RELAY_APPLICATION_NAME: &str = "outbox-lab relay";

/// How a relay keeps other relays off the rows it is delivering.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
pub enum RelayDesign {
    /// The article's: row locks held by the delivering transaction (`FOR UPDATE SKIP LOCKED`).
    #[default]
    Lock,
    /// A lease: `claimed_at`/`claimed_by` written and committed before delivering.
    Claim,
    /// The lease with a fencing token (explore's claim-lease-fenced): each claim takes a new
    /// token, sent with its events and checked by the mark; needs [`schema::ADD_FENCING`].
    ///
    /// [`schema::ADD_FENCING`]: crate::outbox::schema::ADD_FENCING
    #[value(skip)]
    FencedClaim,
    /// Broken on purpose (explore): mark the batch published and commit, then send.
    MarkBeforeSend,
}

impl RelayDesign {
    pub fn name(self) -> &'static str {
        match self {
            RelayDesign::Lock => "lock",
            RelayDesign::Claim => "claim",
            RelayDesign::FencedClaim => "fenced-claim",
            RelayDesign::MarkBeforeSend => "mark-before-send",
        }
    }
}

/// Relay `index` of `count` relays that split the aggregates between them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Partition {
    pub index: u32,
    pub count: u32,
}

impl std::str::FromStr for Partition {
    type Err = String;

    /// `i/N`, e.g. `0/4`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let parsed = s
            .split_once('/')
            .and_then(|(i, n)| Some((i.parse().ok()?, n.parse().ok()?)));
        match parsed {
            Some((index, count)) if index < count => Ok(Partition { index, count }),
            _ => Err(format!("'{s}' is not a partition i/N with i < N")),
        }
    }
}

impl std::fmt::Display for Partition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// How a following relay learns that there is something to deliver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Wakeup {
    /// Poll again after this long.
    Poll(Duration),
    /// LISTEN on [`schema::NOTIFY_CHANNEL`]; poll anyway after `fallback` (notifications sent
    /// while not listening, e.g. during a reconnect, are lost).
    Notify { fallback: Duration },
}

impl std::str::FromStr for Wakeup {
    type Err = String;

    /// `poll:1000` (milliseconds) or `notify:1000` (fallback poll in milliseconds).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let parsed = s
            .split_once(':')
            .and_then(|(mode, ms)| Some((mode, ms.parse::<u64>().ok()?)));
        match parsed {
            Some(("poll", ms)) => Ok(Wakeup::Poll(Duration::from_millis(ms))),
            Some(("notify", ms)) => Ok(Wakeup::Notify {
                fallback: Duration::from_millis(ms),
            }),
            _ => Err(format!("'{s}' is not poll:MS or notify:MS")),
        }
    }
}

impl Wakeup {
    /// How long a relay sleeps when nothing wakes it sooner.
    pub fn fallback(self) -> Duration {
        match self {
            Wakeup::Poll(every) => every,
            Wakeup::Notify { fallback } => fallback,
        }
    }
}

impl std::fmt::Display for Wakeup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Wakeup::Poll(every) => write!(f, "poll:{}", every.as_millis()),
            Wakeup::Notify { fallback } => write!(f, "notify:{}", fallback.as_millis()),
        }
    }
}

/// How the article's relay behaves.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RelayConfig {
    /// Lock (the article) or claim (lease).
    pub design: RelayDesign,
    /// Claim design: another relay may take a claimed row once its claim is this old.
    pub lease: Duration,
    /// Rows per fetch (the article's LIMIT 100).
    pub batch: i64,
    /// Rows with this many attempts are dead letters (the article's `attempts < 5`).
    pub max_attempts: i32,
    /// The first retry waits this long; each further one twice as long.
    pub backoff_base: Duration,
    /// How long to sleep when nothing is due and nothing is waiting for a backoff.
    pub idle_poll: Duration,
    /// Draining gives up after this long (a bound, so a stuck run cannot hang the harness).
    pub deadline: Duration,
    /// Only this relay's share of the aggregates, when several relays split them.
    pub partition: Option<Partition>,
    /// Skip events whose aggregate has an earlier undelivered event.
    pub head_of_line_guard: bool,
    /// An HTTP delivery unanswered for this long failed (a lost reply included).
    pub request_timeout: Duration,
    /// Also log every delivery attempt (`sending`, `sent`): the history explore audits.
    pub log_attempts: bool,
    /// Also log when it woke, fetched and sent ([`crate::outbox::phases`]): notify-latency's
    /// split of a delivery's time.
    pub log_phases: bool,
    /// Delivery loops in this one relay (lock design): each its own connection, fetching only
    /// its partition of the aggregates (`i/workers`, as [`Partition`] splits them), so
    /// per-aggregate order holds and each holds one batch's locks at a time; one delivers while
    /// another waits for its COMMIT's WAL flush, and PostgreSQL's group commit merges their
    /// flushes. 1: the article's one loop.
    #[serde(default = "one_worker")]
    pub workers: u32,
}

fn one_worker() -> u32 {
    1
}

/// The attempts after which a row is a dead letter, unless a relay is told otherwise.
pub const DEFAULT_MAX_ATTEMPTS: i32 = 5;

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            design: RelayDesign::Lock,
            lease: Duration::from_secs(30),
            batch: 100,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            backoff_base: Duration::from_millis(200),
            idle_poll: Duration::from_millis(10),
            deadline: Duration::from_secs(60),
            partition: None,
            head_of_line_guard: false,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            log_attempts: false,
            log_phases: false,
            workers: 1,
        }
    }
}

/// Everything a relay process is told — by `outbox-lab relay`'s flags, by a scenario (as a
/// child's role), by explore: its name, where it delivers, how it behaves, how it wakes up.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RelayOptions {
    /// Names it in log lines, metrics, leases and pg_stat_activity.
    pub name: String,
    pub sink: SinkOptions,
    pub config: RelayConfig,
    /// Keep delivering until stopped, waking up as this says; `None`: until drained.
    pub follow: Option<Wakeup>,
}

impl RelayOptions {
    /// Its connection settings: `db`, named `outbox-lab relay NAME` so that its session can be
    /// found in pg_stat_activity.
    pub fn connection(&self, db: &tokio_postgres::Config) -> tokio_postgres::Config {
        let mut db = db.clone();
        db.application_name(format!("{RELAY_APPLICATION_NAME} {}", self.name));
        db
    }

    /// When [`drive`] stops it: drained (within the configured deadline), or never by itself.
    pub fn until(&self) -> Until<'static> {
        match self.follow {
            Some(wakeup) => Until::Shutdown(wakeup),
            None => Until::Drained {
                idle: self.config.idle_poll,
                deadline: self.config.deadline,
                once: None,
            },
        }
    }

    /// The table relay these options describe, connected (LISTENing if it follows NOTIFY).
    pub async fn connect(&self, db: &tokio_postgres::Config) -> Result<Relay> {
        let sink = self.sink.connect(self.config.request_timeout).await?;
        self.connect_with(db, sink).await
    }

    /// The same, delivering to `sink`, connected already (by a caller that says which flag
    /// gave it, when it fails).
    pub async fn connect_with(&self, db: &tokio_postgres::Config, sink: Sink) -> Result<Relay> {
        let listen = matches!(self.follow, Some(Wakeup::Notify { .. }));
        Relay::connect(
            &self.connection(db),
            sink,
            self.config.clone(),
            &self.name,
            listen,
        )
        .await
    }
}

/// What one pass did.
#[derive(Debug, Default, Clone, Copy)]
pub struct Pass {
    /// Rows it dealt with: delivered, or set aside for a retry (0: nothing to do).
    pub fetched: usize,
    pub sent: usize,
    pub failed: usize,
    /// A whole batch came back: more rows are likely waiting, so a following relay fetches
    /// again at once instead of waiting.
    pub full: bool,
}

/// What a relay still has to deliver.
#[derive(Debug, Clone, Copy)]
pub struct Pending {
    pub rows: i64,
    /// How long until the earliest of them is due (a retry's backoff), when not due yet.
    pub next_due: Option<Duration>,
}

/// A relay design: one pass at a time, driven by [`drive`].
// Used through generics only (never `dyn`), so the futures' Send-ness follows the types.
#[allow(async_fn_in_trait)]
pub trait OutboxRelay {
    /// Its name in log lines (`[relay NAME] ...`).
    fn name(&self) -> &str;
    /// Fetch, deliver, mark: one batch.
    async fn pass(&mut self) -> Result<Pass>;
    /// What it has still to deliver.
    async fn pending(&self) -> Result<Pending>;
    /// Waits until there may be something new, as `wakeup` says (polling, unless it listens).
    async fn wait_for_work(&mut self, wakeup: Wakeup) -> Result<()> {
        tokio::time::sleep(wakeup.fallback()).await;
        Ok(())
    }
}

/// When [`drive`] stops.
pub enum Until<'a> {
    /// Nothing left to deliver — and, with `once`, only after that flag is set (explore's "the
    /// writer is done"); an empty pass sleeps `idle` (or until a retry is due). After
    /// `deadline` it gives up ([`Ended::GaveUp`]): a bound, so a stuck run cannot hang.
    Drained {
        idle: Duration,
        deadline: Duration,
        once: Option<&'a AtomicBool>,
    },
    /// Until the shutdown future resolves, waking up as [`Wakeup`] says. A batch under way is
    /// always finished (sent, marked, committed) first: stopping loses nothing and sends
    /// nothing twice.
    Shutdown(Wakeup),
}

/// How [`drive`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    Drained {
        sent: u64,
    },
    Shutdown {
        sent: u64,
    },
    /// The deadline passed with rows left.
    GaveUp {
        pending: i64,
        after: Duration,
    },
}

impl Ended {
    /// A relay that gave up is an error where draining was its job.
    pub fn or_gave_up(self, name: &str) -> Result<u64> {
        match self {
            Ended::Drained { sent } | Ended::Shutdown { sent } => Ok(sent),
            Ended::GaveUp { pending, after } => {
                bail!("relay {name} gave up after {after:?}: {pending} rows still undelivered")
            }
        }
    }
}

/// The one relay loop: passes until `until` says stop.
pub async fn drive<R: OutboxRelay>(
    relay: &mut R,
    until: Until<'_>,
    shutdown: impl Future<Output = ()>,
) -> Result<Ended> {
    tokio::pin!(shutdown);
    // Polled once up front: a signal handler the shutdown future installs is in place before the
    // first pass.
    if futures_util::FutureExt::now_or_never(shutdown.as_mut()).is_some() {
        return Ok(Ended::Shutdown { sent: 0 });
    }
    let started = Instant::now();
    let mut sent = 0u64;
    loop {
        let pass = relay.pass().await?;
        sent += pass.sent as u64;
        match &until {
            Until::Shutdown(wakeup) => {
                // Heard after every pass, a full one too.
                let wait = async {
                    if pass.full {
                        Ok(())
                    } else {
                        relay.wait_for_work(*wakeup).await
                    }
                };
                tokio::select! {
                    biased;
                    () = &mut shutdown => {
                        info!(relay = %relay.name(), "stopping after its last batch");
                        return Ok(Ended::Shutdown { sent });
                    }
                    waited = wait => waited?,
                }
            }
            Until::Drained {
                idle,
                deadline,
                once,
            } => {
                if pass.fetched > 0 {
                    continue;
                }
                // Read the flag before counting: once it is set (the writer is done), a count
                // taken after seeing it includes everything written.
                let may_stop = once.is_none_or(|flag| flag.load(Ordering::SeqCst));
                let pending = if may_stop {
                    Some(relay.pending().await?)
                } else {
                    None
                };
                if pending.is_some_and(|p| p.rows == 0) {
                    info!(relay = %relay.name(), "exit. sent_total={sent}");
                    return Ok(Ended::Drained { sent });
                }
                if started.elapsed() > *deadline {
                    let pending = match pending {
                        Some(p) => p.rows,
                        None => relay.pending().await?.rows,
                    };
                    return Ok(Ended::GaveUp {
                        pending,
                        after: *deadline,
                    });
                }
                let wait = pending.and_then(|p| p.next_due).unwrap_or(*idle);
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// How a draining relay spent its time on the batches that found rows, on its own clock: what a
/// throughput figure divides by. The phases are the steps of a batch as the relay waits on
/// them, added up over its workers; whatever is left of `busy` × `workers` went between
/// batches.
#[derive(Debug, Default, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BatchTimings {
    /// The relay's delivery loops ([`RelayConfig::workers`]), whose phases are added up here.
    #[serde(default = "one_worker")]
    pub workers: u32,
    /// Batches that found rows, and the rows they fetched.
    pub batches: u64,
    pub events: u64,
    /// From the start of the first fetch that found rows to the end of the last commit (of any
    /// worker): the process's start, its connections and the final empty fetch are outside it.
    pub busy: Duration,
    /// BEGIN and the fetch, until the rows are in hand.
    pub fetch: Duration,
    /// The sink's deliveries (and the record of any failure).
    pub send: Duration,
    /// The UPDATE that marks the delivered rows published.
    pub mark: Duration,
    pub commit: Duration,
}

/// When each step of one batch ended.
pub(crate) struct BatchClock {
    pub started: Instant,
    pub fetched: Instant,
    pub sent: Instant,
    pub marked: Instant,
    pub committed: Instant,
}

/// Adds up a relay's [`BatchTimings`], batch after batch.
#[derive(Debug, Default)]
pub(crate) struct BatchTimer {
    first_fetch: Option<Instant>,
    last_commit: Option<Instant>,
    timings: BatchTimings,
}

impl BatchTimer {
    /// Counts a batch of `rows` rows; an empty fetch is not a batch.
    pub fn record(&mut self, rows: usize, clock: &BatchClock) {
        if rows == 0 {
            return;
        }
        let first_fetch = *self.first_fetch.get_or_insert(clock.started);
        self.last_commit = Some(clock.committed);
        let timings = &mut self.timings;
        timings.batches += 1;
        timings.events += rows as u64;
        timings.busy = clock.committed - first_fetch;
        timings.fetch += clock.fetched - clock.started;
        timings.send += clock.sent - clock.fetched;
        timings.mark += clock.marked - clock.sent;
        timings.commit += clock.committed - clock.marked;
    }

    /// The timings of workers that ran side by side: their batches and phases added up, busy
    /// from the first fetch of any to the last commit of any.
    pub fn merged<'a>(timers: impl IntoIterator<Item = &'a BatchTimer>) -> BatchTimings {
        let mut merged = BatchTimings::default();
        let (mut first, mut last): (Option<Instant>, Option<Instant>) = (None, None);
        for timer in timers {
            merged.workers += 1;
            let t = &timer.timings;
            merged.batches += t.batches;
            merged.events += t.events;
            merged.fetch += t.fetch;
            merged.send += t.send;
            merged.mark += t.mark;
            merged.commit += t.commit;
            if let (Some(f), Some(l)) = (timer.first_fetch, timer.last_commit) {
                first = Some(first.map_or(f, |first| first.min(f)));
                last = Some(last.map_or(l, |last| last.max(l)));
            }
        }
        if let (Some(first), Some(last)) = (first, last) {
            merged.busy = last - first;
        }
        merged
    }
}

/// A relay's counters since it started.
#[derive(Debug, Default)]
pub struct RelayStats {
    pub delivered: AtomicU64,
    pub failed: AtomicU64,
}

/// Gives dead letters (undelivered rows with `max_attempts` attempts or more, the relays' limit)
/// their attempts back (`outbox-lab requeue`): a row still under retry keeps its backoff, and a
/// row a relay holds locked is skipped, not waited for. Returns rows requeued.
pub async fn requeue(client: &Client, max_attempts: i32) -> Result<u64> {
    Ok(client.execute(sql::REQUEUE, &[&max_attempts]).await?)
}
