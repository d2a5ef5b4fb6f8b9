//! The relay: reads undelivered outbox rows, delivers them, and marks them published.
//!
//! The article's relay ([`Relay`] with [`RelayDesign::Lock`]) holds the rows' locks in the
//! delivering transaction: a crash releases them at once, and the rows are simply fetched again.
//! The other common design ([`RelayDesign::Claim`]) writes a `claimed_at`/`claimed_by` lease and
//! commits it before delivering: no transaction stays open, but a crashed relay's rows wait for
//! the lease to expire (claim-vs-lock). A following relay wakes up by polling or by LISTEN/NOTIFY
//! ([`Wakeup`]). Two watermark relays ([`WatermarkRelay`], [`XidWatermarkRelay`]) remember how far
//! they got instead of marking rows; the first one loses events (watermark-gap), the second shows
//! how to make a watermark safe. For explore, two deliberately broken relays whose flaws its
//! checker must catch: [`RelayDesign::MarkBeforeSend`] and a stored watermark
//! ([`StoredWatermarkRelay`]).

pub mod cdc;
pub mod pgoutput;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use tokio_postgres::{Client, GenericClient, Row, Statement};
use tracing::info;

use tokio::sync::mpsc::UnboundedReceiver;
use tokio_postgres::types::ToSql;
use tokio_postgres::Notification;

use crate::harness::db;
use crate::outbox::crash::{self, CrashPoint};
use crate::outbox::event::Event;
use crate::outbox::schema;
use crate::outbox::sink::{HttpSink, Sink, DEFAULT_REQUEST_TIMEOUT};

/// The article's fetch: due, undelivered rows under the attempt limit, oldest first, locked so
/// that concurrent relays take different rows.
pub const FETCH_BATCH: &str = "
SELECT id, event_id, aggregate_type, aggregate_id, event_type, payload
  FROM outbox
 WHERE published_at IS NULL
   AND next_attempt_at <= clock_timestamp()
   AND attempts < $1
 ORDER BY id
 LIMIT $2
 FOR UPDATE SKIP LOCKED";

/// The article's partitioning, added to the fetch: relay $3 of $4 takes only its aggregates.
pub const PARTITION_FILTER: &str = "
   AND abs(hashtext(aggregate_id)) % $4 = $3";

/// The article's head-of-line guard, added to the fetch: no event overtakes an undelivered
/// earlier event of its aggregate (at the price of blocking the aggregate behind it).
pub const HEAD_OF_LINE_GUARD: &str = "
   AND NOT EXISTS (SELECT 1 FROM outbox o2
                    WHERE o2.aggregate_id = outbox.aggregate_id
                      AND o2.published_at IS NULL AND o2.id < outbox.id)";

/// The fetch of a relay: the article's statement with the filters its design adds before ORDER BY.
pub fn fetch_statement(partitioned: bool, guarded: bool) -> String {
    let (filters, order_and_lock) = FETCH_BATCH.split_at(
        FETCH_BATCH
            .find("\n ORDER BY")
            .expect("FETCH_BATCH has ORDER BY"),
    );
    let partition = if partitioned { PARTITION_FILTER } else { "" };
    let guard = if guarded { HEAD_OF_LINE_GUARD } else { "" };
    format!("{filters}{partition}{guard}{order_and_lock}")
}

/// One statement for the whole batch's deliveries.
pub const MARK_PUBLISHED: &str = "
UPDATE outbox
   SET published_at = clock_timestamp(), attempts = attempts + 1
 WHERE id = ANY($1)";

/// A failed delivery waits base * 2^(attempts so far): 200 ms, 400 ms, 800 ms, ...
pub const MARK_FAILED: &str = "
UPDATE outbox
   SET attempts = attempts + 1,
       last_error = $2,
       next_attempt_at = clock_timestamp() + $3::float8 * (2 ^ attempts) * interval '1 millisecond'
 WHERE id = $1";

/// Relay children name their sessions `outbox-lab relay NAME` (`application_name`).
pub const RELAY_APPLICATION_NAME: &str = "outbox-lab relay";

/// The claim design's fetch: due, undelivered rows that no live lease covers, claimed by this
/// relay in the same statement. It commits at once: no transaction stays open while delivering.
pub const CLAIM_BATCH: &str = "
UPDATE outbox
   SET claimed_at = clock_timestamp(), claimed_by = $3
 WHERE id IN (SELECT id
                FROM outbox
               WHERE published_at IS NULL
                 AND next_attempt_at <= clock_timestamp()
                 AND attempts < $1
                 AND (claimed_at IS NULL
                      OR claimed_at < clock_timestamp() - $4::float8 * interval '1 millisecond')
               ORDER BY id
               LIMIT $2
                 FOR UPDATE SKIP LOCKED)
RETURNING id, event_id, aggregate_type, aggregate_id, event_type, payload";

/// The claim design's mark: only the rows whose lease this relay still holds.
pub const MARK_CLAIMED_PUBLISHED: &str = "
UPDATE outbox
   SET published_at = clock_timestamp(), attempts = attempts + 1
 WHERE id = ANY($1) AND claimed_by = $2";

/// What is left to do: undelivered rows under the limit, and how long until the next is due.
pub const PENDING: &str = "
SELECT count(*),
       COALESCE(EXTRACT(EPOCH FROM min(next_attempt_at) - clock_timestamp()) * 1000, 0)::float8
  FROM outbox
 WHERE published_at IS NULL
   AND attempts < $1";

/// What `/metrics` reports from the table: dead letters, and the age of the oldest row still
/// to deliver (how far the relays lag behind).
pub const BACKLOG: &str = "
SELECT count(*) FILTER (WHERE attempts >= $1) AS dead_letters,
       COALESCE(EXTRACT(EPOCH FROM clock_timestamp()
                - min(created_at) FILTER (WHERE attempts < $1)), 0)::float8
         AS oldest_unpublished_age_s
  FROM outbox
 WHERE published_at IS NULL";

/// Rows that used up their attempts: no relay fetches them again until they are requeued.
pub const DEAD_LETTERS: &str = "
SELECT id, attempts, last_error
  FROM outbox
 WHERE published_at IS NULL
   AND attempts >= $1
 ORDER BY id";

/// The article's way back from the dead letter, once the cause is fixed.
pub const REQUEUE: &str = "
UPDATE outbox SET attempts = 0, next_attempt_at = clock_timestamp() WHERE published_at IS NULL";

/// Fetch "everything after the last id seen": the design that loses events.
pub const FETCH_AFTER_WATERMARK: &str = "
SELECT id, event_id, aggregate_type, aggregate_id, event_type, payload
  FROM outbox
 WHERE id > $1
 ORDER BY id";

/// A gap-safe watermark: only rows whose writing transaction is older than every transaction
/// still running, in (transaction, id) order, after the last (transaction, id) delivered.
pub const FETCH_AFTER_XID_WATERMARK: &str = "
SELECT id, event_id, aggregate_type, aggregate_id, event_type, payload, xid::text AS xid
  FROM outbox
 WHERE (xid, id) > ($1::text::xid8, $2)
   AND xid < pg_snapshot_xmin(pg_current_snapshot())
 ORDER BY xid, id";

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
    /// Broken on purpose (explore): mark the batch published and commit, then send.
    MarkBeforeSend,
}

impl RelayDesign {
    pub fn name(self) -> &'static str {
        match self {
            RelayDesign::Lock => "lock",
            RelayDesign::Claim => "claim",
            RelayDesign::MarkBeforeSend => "mark-before-send",
        }
    }
}

/// Relay `index` of `count` relays that split the aggregates between them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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

impl std::fmt::Display for Wakeup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Wakeup::Poll(every) => write!(f, "poll:{}", every.as_millis()),
            Wakeup::Notify { fallback } => write!(f, "notify:{}", fallback.as_millis()),
        }
    }
}

/// How the article's relay behaves.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
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
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            design: RelayDesign::Lock,
            lease: Duration::from_secs(30),
            batch: 100,
            max_attempts: 5,
            backoff_base: Duration::from_millis(200),
            idle_poll: Duration::from_millis(10),
            deadline: Duration::from_secs(60),
            partition: None,
            head_of_line_guard: false,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            log_attempts: false,
        }
    }
}

/// What one batch did.
#[derive(Debug, Default, Clone, Copy)]
pub struct BatchOutcome {
    pub fetched: usize,
    pub sent: usize,
    pub failed: usize,
}

/// The article's polling relay, with its row locks held while it delivers (or, in the claim
/// design, a committed lease).
pub struct Relay {
    db: tokio_postgres::Config,
    client: Client,
    /// Notifications of the listening connection, when the relay waits for NOTIFY.
    notifications: Option<UnboundedReceiver<Notification>>,
    sink: Sink,
    config: RelayConfig,
    /// The fetch and the mark of this relay's design, prepared once per connection: a
    /// statement prepared per query would cost a round trip on every batch.
    fetch: Statement,
    mark: Statement,
    /// Names the relay in its log lines (`[relay 0] ...`) and its leases.
    name: String,
    /// What it delivered, for `/metrics`.
    stats: Arc<RelayStats>,
    /// Claim design: the `claimed_by` of this relay's leases, unique to its process.
    claimant: String,
}

impl Relay {
    /// Connects; with `listen`, the connection also LISTENs for the NOTIFY trigger.
    pub async fn connect(
        db: &tokio_postgres::Config,
        sink: Sink,
        config: RelayConfig,
        name: &str,
        listen: bool,
    ) -> Result<Relay> {
        if config.design == RelayDesign::Claim
            && (config.partition.is_some() || config.head_of_line_guard)
        {
            bail!("the claim design takes no partition and no head-of-line guard");
        }
        if config.design == RelayDesign::MarkBeforeSend && config.partition.is_some() {
            bail!("the mark-before-send design takes no partition");
        }
        let (client, notifications) = open_connection(db, listen).await?;
        let (fetch, mark) = prepare(&client, &config).await?;
        let claimant = format!("relay {name}/pid {}", std::process::id());
        Ok(Relay {
            db: db.clone(),
            client,
            notifications,
            sink,
            config,
            fetch,
            mark,
            name: name.to_string(),
            stats: Arc::default(),
            claimant,
        })
    }

    /// Its counters, shared with a `/metrics` endpoint.
    pub fn stats(&self) -> Arc<RelayStats> {
        self.stats.clone()
    }

    /// Fetch, deliver and mark one batch, as the design says.
    pub async fn deliver_batch(&mut self) -> Result<BatchOutcome> {
        let outcome = match self.config.design {
            RelayDesign::Lock => self.deliver_locked_batch().await?,
            RelayDesign::Claim => self.deliver_claimed_batch().await?,
            RelayDesign::MarkBeforeSend => self.deliver_marked_first_batch().await?,
        };
        self.stats
            .delivered
            .fetch_add(outcome.sent as u64, Ordering::Relaxed);
        self.stats
            .failed
            .fetch_add(outcome.failed as u64, Ordering::Relaxed);
        Ok(outcome)
    }

    /// The article's: fetch, deliver and mark in one transaction that holds the row locks.
    async fn deliver_locked_batch(&mut self) -> Result<BatchOutcome> {
        let delivered = self.locked_batch().await;
        if delivered.is_err() {
            // The error ends this relay; leave the connection clean all the same.
            let _ = self.client.batch_execute("ROLLBACK").await;
        }
        delivered
    }

    /// BEGIN and the fetch go out together (one round trip, not two): on an idle relay woken by
    /// NOTIFY, every round trip is latency.
    async fn locked_batch(&mut self) -> Result<BatchOutcome> {
        let (index, count) = self
            .config
            .partition
            .map_or((0, 1), |p| (p.index as i32, p.count as i32));
        let all: [&(dyn ToSql + Sync); 4] = [
            &self.config.max_attempts,
            &self.config.batch,
            &index,
            &count,
        ];
        let params = if self.config.partition.is_some() {
            &all[..]
        } else {
            &all[..2]
        };
        let (_, rows) = tokio::try_join!(
            self.client.batch_execute("BEGIN"),
            self.client.query(&self.fetch, params),
        )?;
        let (outcome, delivered) =
            deliver_rows(&self.sink, &self.config, &self.name, &self.client, &rows).await?;
        if !delivered.is_empty() {
            self.client.execute(&self.mark, &[&delivered]).await?;
            crash::point(CrashPoint::RelayAfterMarkBeforeCommit);
        }
        self.client.batch_execute("COMMIT").await?;
        Ok(outcome)
    }

    /// Broken on purpose (mark-before-send): fetch, mark published and COMMIT, then send. A crash
    /// or a failed send after the commit loses the events: nothing sends them again. (An error
    /// before the COMMIT ends the relay, and its session, which rolls back.)
    async fn deliver_marked_first_batch(&mut self) -> Result<BatchOutcome> {
        let params: [&(dyn ToSql + Sync); 2] = [&self.config.max_attempts, &self.config.batch];
        let (_, rows) = tokio::try_join!(
            self.client.batch_execute("BEGIN"),
            self.client.query(&self.fetch, &params),
        )?;
        let ids: Vec<i64> = rows.iter().map(|r| r.get("id")).collect();
        if !ids.is_empty() {
            self.client.execute(&self.mark, &[&ids]).await?;
            crash::point(CrashPoint::RelayAfterMarkBeforeCommit);
        }
        self.client.batch_execute("COMMIT").await?;
        if !rows.is_empty() {
            crash::point(CrashPoint::RelayAfterMarkBeforeSend);
        }
        // A failed send is recorded (attempts, last_error) on a row already marked published.
        let (outcome, _) =
            deliver_rows(&self.sink, &self.config, &self.name, &self.client, &rows).await?;
        Ok(outcome)
    }

    /// Undelivered rows under the attempt limit, due or not.
    pub async fn pending(&self) -> Result<i64> {
        let row = self
            .client
            .query_one(PENDING, &[&self.config.max_attempts])
            .await?;
        Ok(row.get(0))
    }

    /// The lease: claim (committed), deliver outside any transaction, mark what was delivered.
    async fn deliver_claimed_batch(&mut self) -> Result<BatchOutcome> {
        let lease_ms = self.config.lease.as_secs_f64() * 1000.0;
        let params: [&(dyn ToSql + Sync); 4] = [
            &self.config.max_attempts,
            &self.config.batch,
            &self.claimant,
            &lease_ms,
        ];
        let mut rows = self.client.query(&self.fetch, &params).await?;
        // UPDATE ... RETURNING has no order; deliver oldest first, as the lock design does.
        rows.sort_by_key(|row| row.get::<_, i64>("id"));
        // A failed row keeps its claim: it is retried once both its backoff and the lease ran out.
        let (outcome, delivered) =
            deliver_rows(&self.sink, &self.config, &self.name, &self.client, &rows).await?;
        if !delivered.is_empty() {
            self.client
                .execute(&self.mark, &[&delivered, &self.claimant])
                .await?;
        }
        Ok(outcome)
    }

    /// Delivers until no undelivered row under the attempt limit is left; returns rows sent.
    pub async fn run_until_drained(&mut self) -> Result<u64> {
        let started = Instant::now();
        let mut sent_total = 0u64;
        loop {
            let outcome = self.deliver_batch().await?;
            sent_total += outcome.sent as u64;
            if outcome.fetched > 0 {
                continue;
            }
            let row = self
                .client
                .query_one(PENDING, &[&self.config.max_attempts])
                .await?;
            let (pending, due_in_ms): (i64, f64) = (row.get(0), row.get(1));
            if pending == 0 {
                info!(relay = %self.name, "exit. sent_total={sent_total}");
                return Ok(sent_total);
            }
            if started.elapsed() > self.config.deadline {
                bail!(
                    "relay gave up after {:?}: {pending} rows still undelivered",
                    self.config.deadline
                );
            }
            // Sleep until the next retry is due; rows still locked (by a relay that just died and
            // whose session the server has not ended yet) are polled again shortly.
            let wait = if due_in_ms > 0.0 {
                Duration::from_secs_f64(due_in_ms / 1000.0)
            } else {
                self.config.idle_poll
            };
            tokio::time::sleep(wait).await;
        }
    }

    /// Delivers what arrives, waking up as `wakeup` says, until `shutdown` resolves. A batch
    /// under way is always finished (sent, marked, committed) first: stopping loses nothing and
    /// sends nothing twice.
    pub async fn follow(
        &mut self,
        wakeup: Wakeup,
        shutdown: impl Future<Output = ()>,
    ) -> Result<()> {
        tokio::pin!(shutdown);
        loop {
            let outcome = self.deliver_batch().await?;
            let more_waiting = outcome.fetched as i64 >= self.config.batch;
            tokio::select! {
                biased;
                () = &mut shutdown => {
                    info!(relay = %self.name, "stopping after its last batch");
                    return Ok(());
                }
                waited = self.wait(wakeup, more_waiting) => waited?,
            }
        }
    }

    /// Until the next fetch: none if more rows are waiting, else as `wakeup` says.
    async fn wait(&mut self, wakeup: Wakeup, more_waiting: bool) -> Result<()> {
        match wakeup {
            _ if more_waiting => Ok(()),
            Wakeup::Poll(every) => {
                tokio::time::sleep(every).await;
                Ok(())
            }
            Wakeup::Notify { fallback } => self.wait_for_notify(fallback).await,
        }
    }

    /// Waits for a notification or the fallback; re-LISTENs if the connection was lost.
    async fn wait_for_notify(&mut self, fallback: Duration) -> Result<()> {
        let notifications = self.notifications.as_mut().expect("connected with listen");
        match tokio::time::timeout(fallback, notifications.recv()).await {
            Ok(Some(_)) => {
                // One fetch serves every notification that arrived meanwhile.
                while notifications.try_recv().is_ok() {}
            }
            Ok(None) => {
                info!(relay = %self.name, "connection lost, listening again");
                let (client, notifications) = open_connection(&self.db, true).await?;
                (self.fetch, self.mark) = prepare(&client, &self.config).await?;
                self.client = client;
                self.notifications = notifications;
            }
            Err(_) => {} // fallback poll
        }
        Ok(())
    }
}

/// The design's fetch and mark, prepared on `client`.
async fn prepare(client: &Client, config: &RelayConfig) -> Result<(Statement, Statement)> {
    let (fetch, mark) = match config.design {
        RelayDesign::Lock | RelayDesign::MarkBeforeSend => (
            fetch_statement(config.partition.is_some(), config.head_of_line_guard),
            MARK_PUBLISHED,
        ),
        RelayDesign::Claim => (CLAIM_BATCH.to_string(), MARK_CLAIMED_PUBLISHED),
    };
    Ok((client.prepare(&fetch).await?, client.prepare(mark).await?))
}

/// A connection, LISTENing when asked.
async fn open_connection(
    db: &tokio_postgres::Config,
    listen: bool,
) -> Result<(Client, Option<UnboundedReceiver<Notification>>)> {
    if !listen {
        return Ok((db::connect(db).await?, None));
    }
    let (client, notifications) = db::connect_listening(db).await?;
    client
        .batch_execute(&format!("LISTEN {}", schema::NOTIFY_CHANNEL))
        .await?;
    Ok((client, Some(notifications)))
}

/// Sends the fetched rows through the sink; a failure is recorded (with its backoff) through
/// `db`. Returns the ids delivered, for the mark. With `log_attempts`, every event is logged
/// `sending` before the batch goes out and `sent` as soon as it is known delivered: an event
/// left without an answer when the relay dies is one whose outcome it never learned.
async fn deliver_rows(
    sink: &Sink,
    config: &RelayConfig,
    name: &str,
    db: &impl GenericClient,
    rows: &[Row],
) -> Result<(BatchOutcome, Vec<i64>)> {
    let mut outcome = BatchOutcome {
        fetched: rows.len(),
        ..Default::default()
    };
    if rows.is_empty() {
        return Ok((outcome, Vec::new()));
    }
    crash::point(CrashPoint::RelayAfterFetchBeforeSend);
    let events: Vec<Event> = rows.iter().map(Event::from_outbox_row).collect();
    if config.log_attempts {
        for event in &events {
            let id = event.outbox_id.expect("outbox rows have ids");
            info!(relay = %name, "outbox id={id} sending");
        }
    }
    let results = sink
        .deliver(&events, |event| {
            if config.log_attempts {
                let id = event.outbox_id.expect("outbox rows have ids");
                info!(relay = %name, "outbox id={id} sent");
            }
            crash::point(CrashPoint::RelayAfterSendBeforeMark)
        })
        .await;
    let mut delivered: Vec<i64> = Vec::with_capacity(rows.len());
    for (event, result) in events.iter().zip(results) {
        let id = event.outbox_id.expect("outbox rows have ids");
        match result {
            Ok(()) => delivered.push(id),
            Err(e) => {
                let error = format!("{e:#}");
                info!(relay = %name, "outbox id={id} failed: {error}");
                let base_ms = config.backoff_base.as_secs_f64() * 1000.0;
                db.execute(MARK_FAILED, &[&id, &error, &base_ms]).await?;
                outcome.failed += 1;
            }
        }
    }
    outcome.sent = delivered.len();
    Ok((outcome, delivered))
}

/// A relay's counters since it started.
#[derive(Debug, Default)]
pub struct RelayStats {
    pub delivered: AtomicU64,
    pub failed: AtomicU64,
}

/// Delivers rows after the highest id it has seen, and never looks back.
#[derive(Default)]
pub struct WatermarkRelay {
    last_seen: i64,
}

impl WatermarkRelay {
    /// One pass; returns the outbox ids delivered.
    pub async fn deliver_new(&mut self, client: &Client, sink: &HttpSink) -> Result<Vec<i64>> {
        let mut delivered = Vec::new();
        for row in client
            .query(FETCH_AFTER_WATERMARK, &[&self.last_seen])
            .await?
        {
            let event = Event::from_outbox_row(&row);
            sink.send(&event).await?;
            let id = event.outbox_id.expect("outbox rows have ids");
            self.last_seen = self.last_seen.max(id);
            delivered.push(id);
        }
        Ok(delivered)
    }
}

/// A watermark over (writing transaction id, row id) that only advances past committed history.
pub struct XidWatermarkRelay {
    last_xid: String,
    last_id: i64,
}

impl Default for XidWatermarkRelay {
    fn default() -> Self {
        XidWatermarkRelay {
            last_xid: "0".into(),
            last_id: 0,
        }
    }
}

impl XidWatermarkRelay {
    /// One pass; returns the outbox ids delivered.
    pub async fn deliver_new(&mut self, client: &Client, sink: &HttpSink) -> Result<Vec<i64>> {
        let mut delivered = Vec::new();
        for row in client
            .query(FETCH_AFTER_XID_WATERMARK, &[&self.last_xid, &self.last_id])
            .await?
        {
            let event = Event::from_outbox_row(&row);
            sink.send(&event).await?;
            self.last_xid = row.get("xid");
            self.last_id = event.outbox_id.expect("outbox rows have ids");
            delivered.push(self.last_id);
        }
        Ok(delivered)
    }
}

/// Gives every undelivered row its attempts back (`outbox-lab requeue`); returns rows requeued.
pub async fn requeue(client: &Client) -> Result<u64> {
    Ok(client.execute(REQUEUE, &[]).await?)
}

/// Where the stored watermark relay resumes: the highest id it has delivered.
pub const LOAD_WATERMARK: &str =
    "SELECT COALESCE(max(last_seen), 0) FROM relay_watermark WHERE relay = $1";

pub const SAVE_WATERMARK: &str = "
INSERT INTO relay_watermark(relay, last_seen) VALUES ($1, $2)
ON CONFLICT (relay) DO UPDATE SET last_seen = EXCLUDED.last_seen";

/// What the stored watermark relay has still to deliver: rows above its watermark. Rows below it
/// that committed late are not counted; nothing will ever deliver them.
pub const WATERMARK_PENDING: &str = "
SELECT count(*) FROM outbox
 WHERE id > COALESCE((SELECT max(last_seen) FROM relay_watermark WHERE relay = $1), 0)";

/// A watermark relay as it is usually built for production: `id > last_seen`, with the
/// watermark stored (and saved after each delivery) so that a restart resumes where it stopped.
/// Crash-safe (a crash between send and save redelivers) but not gap-safe: a row whose
/// transaction commits after a later id was delivered is below the watermark, and lost.
pub struct StoredWatermarkRelay {
    client: Client,
    sink: HttpSink,
    /// The key of its row in `relay_watermark`, and its log name.
    name: String,
}

impl StoredWatermarkRelay {
    pub fn new(client: Client, sink: HttpSink, name: String) -> StoredWatermarkRelay {
        StoredWatermarkRelay { client, sink, name }
    }

    /// One pass; returns the rows delivered. A failed send ends the pass without moving the
    /// watermark, so the row is tried again on the next pass. Every try is logged (`sending`,
    /// then `sent` or `failed`), as the article's relay does with `log_attempts`.
    pub async fn deliver_new(&mut self) -> Result<usize> {
        let last_seen: i64 = self
            .client
            .query_one(LOAD_WATERMARK, &[&self.name])
            .await?
            .get(0);
        let rows = self
            .client
            .query(FETCH_AFTER_WATERMARK, &[&last_seen])
            .await?;
        let name = &self.name;
        let mut delivered = 0;
        for row in &rows {
            let event = Event::from_outbox_row(row);
            let id = event.outbox_id.expect("outbox rows have ids");
            crash::point(CrashPoint::RelayAfterFetchBeforeSend);
            info!(relay = %name, "outbox id={id} sending");
            if let Err(e) = self.sink.send(&event).await {
                info!(relay = %name, "outbox id={id} failed: {e:#}");
                break;
            }
            info!(relay = %name, "outbox id={id} sent");
            crash::point(CrashPoint::RelayAfterSendBeforeMark);
            self.client.execute(SAVE_WATERMARK, &[name, &id]).await?;
            delivered += 1;
        }
        Ok(delivered)
    }

    /// Rows above the watermark.
    pub async fn pending(&self) -> Result<i64> {
        Ok(self
            .client
            .query_one(WATERMARK_PENDING, &[&self.name])
            .await?
            .get(0))
    }
}
