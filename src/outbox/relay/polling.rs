//! The article's relay over the outbox table: fetch a batch, deliver it through a sink, mark it
//! published. Its designs keep other relays off the rows it delivers: row locks held by the
//! delivering transaction ([`lock`](super::lock), with the broken mark-before-send beside it)
//! or a committed lease ([`claim`](super::claim)). It wakes up by polling or LISTEN/NOTIFY.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_postgres::{Client, GenericClient, Notification, Row, Statement};
use tracing::info;

use super::sql::{
    fetch_statement, CLAIM_BATCH, CLAIM_BATCH_FENCED, MARK_CLAIMED_PUBLISHED,
    MARK_FENCED_PUBLISHED, MARK_PUBLISHED, PENDING, PENDING_GUARDED,
};
use super::{
    BatchTimer, BatchTimings, OutboxRelay, Partition, Pass, Pending, RelayConfig, RelayDesign,
    RelayStats, Wakeup,
};
use crate::connect;
use crate::outbox::crash::{self, CrashPoint};
use crate::outbox::event::Event;
use crate::outbox::phases::{self, RelayMoment};
use crate::outbox::schema;
use crate::outbox::sink::Sink;

/// The article's polling relay, with its row locks held while it delivers (or, in the claim
/// design, a committed lease).
pub struct Relay {
    pub(super) db: tokio_postgres::Config,
    pub(super) client: Client,
    /// Notifications of the listening connection, when the relay waits for NOTIFY.
    pub(super) notifications: Option<UnboundedReceiver<Notification>>,
    pub(super) sink: Sink,
    pub(super) config: RelayConfig,
    /// The fetch and the mark of this relay's design, prepared once per connection: a
    /// statement prepared per query would cost a round trip on every batch.
    pub(super) fetch: Statement,
    pub(super) mark: Statement,
    /// Names the relay in its log lines (`[relay 0] ...`) and its leases.
    pub(super) name: String,
    /// What it delivered, for `/metrics`.
    pub(super) stats: Arc<RelayStats>,
    /// Claim design: the `claimed_by` of this relay's leases, unique to its process.
    pub(super) claimant: String,
    /// Lock design: how its batches spent their time.
    pub(super) timer: BatchTimer,
    /// With [`RelayConfig::workers`] > 1, the other delivery loops (this one is worker 0): each
    /// its own connection and partition, running beside this one in [`Relay::pass`].
    workers: Vec<Relay>,
    /// Polling: when the next pass is due. Passes start one interval apart, not an interval
    /// after the last one ended, so the worst latency is the interval, as the article says.
    next_poll: Option<Instant>,
}

/// With workers, a pass lets each worker go on fetching while its batches come back full, for
/// at most this long, so that none waits for the others after each batch; then they meet, and
/// the relay's loop ([`super::drive`]) hears a shutdown. Every batch is finished first.
const WORKER_SLICE: Duration = Duration::from_millis(200);

impl Relay {
    /// Connects; with `listen`, the connection also LISTENs for the NOTIFY trigger.
    pub async fn connect(
        db: &tokio_postgres::Config,
        sink: Sink,
        config: RelayConfig,
        name: &str,
        listen: bool,
    ) -> Result<Relay> {
        if matches!(config.design, RelayDesign::Claim | RelayDesign::FencedClaim)
            && (config.partition.is_some() || config.head_of_line_guard)
        {
            bail!("the claim design takes no partition and no head-of-line guard");
        }
        if config.design == RelayDesign::MarkBeforeSend && config.partition.is_some() {
            bail!("the mark-before-send design takes no partition");
        }
        match config.workers {
            0 => bail!("a relay has at least 1 worker"),
            1 => {}
            n if config.design != RelayDesign::Lock || config.partition.is_some() => bail!(
                "{n} workers split the aggregates between them: only the lock design, \
                 and no partition of its own"
            ),
            n => {
                // Worker i of n delivers partition i/n.
                let partition = |index| Some(Partition { index, count: n });
                let mut relay = Box::pin(Relay::connect(
                    db,
                    sink.clone(),
                    RelayConfig {
                        workers: 1,
                        partition: partition(0),
                        ..config.clone()
                    },
                    name,
                    listen,
                ))
                .await?;
                for index in 1..n {
                    let mut worker = Box::pin(Relay::connect(
                        db,
                        sink.clone(),
                        RelayConfig {
                            workers: 1,
                            partition: partition(index),
                            ..config.clone()
                        },
                        name,
                        false,
                    ))
                    .await?;
                    worker.stats = relay.stats.clone();
                    relay.workers.push(worker);
                }
                return Ok(relay);
            }
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
            timer: BatchTimer::default(),
            workers: Vec::new(),
            next_poll: None,
        })
    }

    /// Its counters, shared with a `/metrics` endpoint.
    pub fn stats(&self) -> Arc<RelayStats> {
        self.stats.clone()
    }

    /// How its batches spent their time so far, its workers' added up (lock design; zero for
    /// the others).
    pub fn timings(&self) -> BatchTimings {
        BatchTimer::merged(
            std::iter::once(&self.timer).chain(self.workers.iter().map(|w| &w.timer)),
        )
    }

    /// Fetch, deliver and mark one batch, as the design says.
    async fn deliver_batch(&mut self) -> Result<Pass> {
        let mut outcome = match self.config.design {
            RelayDesign::Lock => self.deliver_locked_batch().await?,
            RelayDesign::Claim | RelayDesign::FencedClaim => self.deliver_claimed_batch().await?,
            RelayDesign::MarkBeforeSend => self.deliver_marked_first_batch().await?,
        };
        outcome.full = outcome.fetched as i64 >= self.config.batch;
        self.stats
            .delivered
            .fetch_add(outcome.sent as u64, Ordering::Relaxed);
        self.stats
            .failed
            .fetch_add(outcome.failed as u64, Ordering::Relaxed);
        Ok(outcome)
    }
}

impl OutboxRelay for Relay {
    fn name(&self) -> &str {
        &self.name
    }

    /// One batch; with workers, each worker's batches side by side, for as long as they come
    /// back full (at most [`WORKER_SLICE`]).
    async fn pass(&mut self) -> Result<Pass> {
        if self.workers.is_empty() {
            return self.one_batch().await;
        }
        let mut workers = std::mem::take(&mut self.workers);
        let slices = std::iter::once(&mut *self)
            .chain(workers.iter_mut())
            .map(|worker| worker.slice());
        // Every worker finishes its batch, whatever another's ended in.
        let slices = futures_util::future::join_all(slices).await;
        self.workers = workers;
        let mut pass = Pass::default();
        for slice in slices {
            let slice = slice?;
            pass.fetched += slice.fetched;
            pass.sent += slice.sent;
            pass.failed += slice.failed;
            pass.full |= slice.full;
        }
        Ok(pass)
    }

    /// Undelivered rows under the attempt limit, due or not.
    async fn pending(&self) -> Result<Pending> {
        let row = self
            .client
            .query_one(
                match self.config.head_of_line_guard {
                    true => PENDING_GUARDED,
                    false => PENDING,
                },
                &[&self.config.max_attempts],
            )
            .await?;
        let (rows, due_in_ms): (i64, f64) = (row.get(0), row.get(1));
        Ok(Pending {
            rows,
            // Rows still locked (by a relay that just died and whose session the server has not
            // ended yet) are due now, and polled again shortly.
            next_due: (due_in_ms > 0.0).then(|| Duration::from_secs_f64(due_in_ms / 1000.0)),
        })
    }

    async fn wait_for_work(&mut self, wakeup: Wakeup) -> Result<()> {
        match wakeup {
            Wakeup::Poll(every) => {
                // A pass that overran its interval is followed by the next one at once.
                let now = Instant::now();
                let due = self.next_poll.unwrap_or(now + every).max(now);
                tokio::time::sleep_until(due.into()).await;
                self.next_poll = Some(due + every);
                Ok(())
            }
            Wakeup::Notify { fallback } => self.wait_for_notify(fallback).await,
        }
    }
}

impl Relay {
    /// A lost connection (the database restarted, the session was terminated) is not the
    /// relay's end: it connects again and goes on; what the lost batch left unmarked is
    /// delivered again, as after any crash.
    async fn one_batch(&mut self) -> Result<Pass> {
        match self.deliver_batch().await {
            Err(e) if self.client.is_closed() || connect::lost_connection(&e) => {
                info!(relay = %self.name, "connection lost ({e:#}), connecting again");
                self.reconnect().await?;
                Ok(Pass::default())
            }
            passed => passed,
        }
    }

    /// A worker's share of a pass: batch after batch while they come back full, for at most
    /// [`WORKER_SLICE`].
    async fn slice(&mut self) -> Result<Pass> {
        let started = Instant::now();
        let mut slice = Pass::default();
        loop {
            let pass = self.one_batch().await?;
            slice.fetched += pass.fetched;
            slice.sent += pass.sent;
            slice.failed += pass.failed;
            slice.full = pass.full;
            if !pass.full || started.elapsed() >= WORKER_SLICE {
                return Ok(slice);
            }
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
                self.reconnect().await?;
            }
            Err(_) => {} // fallback poll
        }
        if self.config.log_phases {
            phases::relay_moment(RelayMoment::Woken, &[]);
        }
        Ok(())
    }

    /// A new connection (LISTENing again if it listened), its statements prepared, waiting
    /// for the database to come back for at most [`connect::RECONNECT_PATIENCE`].
    async fn reconnect(&mut self) -> Result<()> {
        let listen = self.notifications.is_some();
        let (db, config) = (&self.db, &self.config);
        let (client, notifications, (fetch, mark)) =
            connect::patiently(connect::RECONNECT_PATIENCE, async || {
                let (client, notifications) = open_connection(db, listen).await?;
                let statements = prepare(&client, config).await?;
                Ok((client, notifications, statements))
            })
            .await?;
        self.client = client;
        self.notifications = notifications;
        (self.fetch, self.mark) = (fetch, mark);
        Ok(())
    }
}

/// The design's fetch and mark, prepared on `client`.
pub(super) async fn prepare(
    client: &Client,
    config: &RelayConfig,
) -> Result<(Statement, Statement)> {
    let (fetch, mark) = match config.design {
        RelayDesign::Lock | RelayDesign::MarkBeforeSend => (
            fetch_statement(config.partition.is_some(), config.head_of_line_guard),
            MARK_PUBLISHED,
        ),
        RelayDesign::Claim => (CLAIM_BATCH.to_string(), MARK_CLAIMED_PUBLISHED),
        RelayDesign::FencedClaim => (CLAIM_BATCH_FENCED.to_string(), MARK_FENCED_PUBLISHED),
    };
    Ok((client.prepare(&fetch).await?, client.prepare(mark).await?))
}

/// A connection, LISTENing when asked.
pub(super) async fn open_connection(
    db: &tokio_postgres::Config,
    listen: bool,
) -> Result<(Client, Option<UnboundedReceiver<Notification>>)> {
    if !listen {
        return Ok((connect::postgres(db).await?, None));
    }
    let (client, notifications) = connect::postgres_listening(db).await?;
    client
        .batch_execute(&format!("LISTEN {}", schema::NOTIFY_CHANNEL))
        .await?;
    Ok((client, Some(notifications)))
}

impl Relay {
    /// [`deliver_rows`] through this relay's sink, on its connection.
    pub(super) async fn deliver(
        &self,
        rows: &[Row],
        record_failure: &str,
    ) -> Result<(Pass, Vec<i64>)> {
        let (sink, config, name) = (&self.sink, &self.config, &self.name);
        deliver_rows(sink, config, name, &self.client, rows, record_failure).await
    }
}

/// Sends the fetched rows through the sink; a failure is recorded (with its backoff) through
/// `db` by `record_failure` ([`MARK_FAILED`](super::sql::MARK_FAILED), or
/// [`UNMARK_FAILED`](super::sql::UNMARK_FAILED) for rows already marked in the open transaction). Returns the ids delivered, for the mark. With `log_attempts`, every event is logged
/// `sending` before the batch goes out and `sent` as soon as it is known delivered: an event
/// left without an answer when the relay dies is one whose outcome it never learned.
async fn deliver_rows(
    sink: &Sink,
    config: &RelayConfig,
    name: &str,
    db: &impl GenericClient,
    rows: &[Row],
    record_failure: &str,
) -> Result<(Pass, Vec<i64>)> {
    let mut outcome = Pass {
        fetched: rows.len(),
        ..Default::default()
    };
    if rows.is_empty() {
        return Ok((outcome, Vec::new()));
    }
    crash::point(CrashPoint::RelayAfterFetchBeforeSend);
    let events: Vec<Event> = rows.iter().map(Event::from_outbox_row).collect();
    if config.log_phases {
        let ids: Vec<i64> = events.iter().filter_map(|e| e.outbox_id).collect();
        phases::relay_moment(RelayMoment::Sending, &ids);
    }
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
                let max_ms = config.backoff_max.as_secs_f64() * 1000.0;
                let now = config.lease_clock.now();
                db.execute(record_failure, &[&id, &error, &base_ms, &max_ms, &now])
                    .await?;
                outcome.failed += 1;
            }
        }
    }
    outcome.sent = delivered.len();
    Ok((outcome, delivered))
}
