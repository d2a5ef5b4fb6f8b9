//! What a relay is told: its design, partition, wakeup and limits ([`RelayConfig`]), and where
//! it delivers and how it stops ([`RelayOptions`]), as the standalone relay's flags, explore's
//! and the scenarios' children set them.

use std::time::Duration;

use anyhow::Result;
use serde::{Deserialize, Serialize};

use super::{Relay, Until, RELAY_APPLICATION_NAME};
use crate::outbox::sink::{Sink, SinkOptions, DEFAULT_REQUEST_TIMEOUT};

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
#[serde(rename_all = "kebab-case")]
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

/// Whose wall clock sets a relay's leases (the claim designs) and its retries' due times.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LeaseClock {
    /// The database server's (`clock_timestamp()`), one clock for every relay: the article's.
    #[default]
    Database,
    /// Broken on purpose (the clock-skew scenario): the relay process's own, passed in with each
    /// statement, as libraries that compute `now + lease` in the application do. The fetch still
    /// compares due times with the server's clock: a relay whose clock is off by a step writes
    /// due times that fire at once, or wait for the step; a relay ahead takes live leases.
    Relay,
}

impl LeaseClock {
    /// The time to write and compare leases and due times with: the relay's wall clock, or
    /// none (the statements then read the server's).
    pub fn now(self) -> Option<std::time::SystemTime> {
        match self {
            LeaseClock::Database => None,
            LeaseClock::Relay => Some(std::time::SystemTime::now()),
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
    /// Whose wall clock the lease and the retries' due times are taken from.
    #[serde(default)]
    pub lease_clock: LeaseClock,
    /// Rows per fetch (the article's LIMIT 100).
    pub batch: i64,
    /// Rows with this many attempts are dead letters (the article's `attempts < 5`).
    pub max_attempts: i32,
    /// The first retry waits this long; each further one twice as long.
    pub backoff_base: Duration,
    /// The longest wait between two attempts: the backoff doubles up to it (a relay waiting out
    /// a broker's restart retries at least this often).
    pub backoff_max: Duration,
    /// How long to sleep when nothing is due and nothing is waiting for a backoff.
    pub idle_poll: Duration,
    /// Draining gives up after this long (a bound, so a stuck run cannot hang the harness).
    pub deadline: Duration,
    /// Only this relay's share of the aggregates, when several relays split them.
    pub partition: Option<Partition>,
    /// Skip events whose aggregate has an earlier undelivered event.
    pub head_of_line_guard: bool,
    /// Lock design: send a fetched batch only once every streaming standby has flushed the
    /// WAL up to where the fetch saw it (so up to its rows' commits): a failover to a standby
    /// cannot take back an event already sent. Waits at most [`FENCE_PATIENCE`], then lets the
    /// batch go unsent (rolled back, fetched again). With no standby streaming it waits for
    /// none.
    #[serde(default)]
    pub fence_standby: bool,
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

pub(super) fn one_worker() -> u32 {
    1
}

/// How long a fenced relay waits for its standbys to confirm a batch before it lets the batch go
/// (and fetches it again): a standby that fell behind holds the relay back, not forever.
pub const FENCE_PATIENCE: Duration = Duration::from_secs(5);

/// The attempts after which a row is a dead letter, unless a relay is told otherwise.
pub const DEFAULT_MAX_ATTEMPTS: i32 = 5;

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            design: RelayDesign::Lock,
            lease: Duration::from_secs(30),
            lease_clock: LeaseClock::Database,
            batch: 100,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            backoff_base: Duration::from_millis(200),
            backoff_max: Duration::from_secs(3600),
            idle_poll: Duration::from_millis(10),
            deadline: Duration::from_secs(60),
            partition: None,
            head_of_line_guard: false,
            fence_standby: false,
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
