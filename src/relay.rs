//! The relay: reads undelivered outbox rows, delivers them, and marks them published.
//!
//! The article's relay ([`Relay`] with [`RelayDesign::Lock`]) holds the rows' locks in the
//! delivering transaction: a crash releases them at once, and the rows are simply fetched again.
//! The other common design ([`RelayDesign::Claim`]) writes a `claimed_at`/`claimed_by` lease and
//! commits it before delivering: no transaction stays open, but a crashed relay's rows wait for
//! the lease to expire (claim-vs-lock). Two watermark relays
//! ([`WatermarkRelay`], [`XidWatermarkRelay`]) remember how far they got instead of marking rows;
//! the first one loses events (watermark-gap), the second shows how to make a watermark safe.

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use tokio_postgres::{Client, GenericClient, Row};

use crate::crash::{self, CrashPoint};
use crate::event::Event;
use crate::sink::HttpSink;

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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum RelayDesign {
    /// The article's: row locks held by the delivering transaction (`FOR UPDATE SKIP LOCKED`).
    #[default]
    Lock,
    /// A lease: `claimed_at`/`claimed_by` written and committed before delivering.
    Claim,
}

impl RelayDesign {
    pub fn name(self) -> &'static str {
        match self {
            RelayDesign::Lock => "lock",
            RelayDesign::Claim => "claim",
        }
    }
}

/// How the article's relay behaves.
#[derive(Debug, Clone)]
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
    client: Client,
    sink: HttpSink,
    config: RelayConfig,
    /// Prints the article's log lines (`[relay 0] ...`) to stdout when set; children do.
    log_name: Option<String>,
    /// Claim design: the `claimed_by` of this relay's leases, unique to its process.
    claimant: String,
}

impl Relay {
    pub fn new(
        client: Client,
        sink: HttpSink,
        config: RelayConfig,
        log_name: Option<String>,
    ) -> Relay {
        let claimant = format!(
            "relay {}/pid {}",
            log_name.as_deref().unwrap_or("-"),
            std::process::id()
        );
        Relay {
            client,
            sink,
            config,
            log_name,
            claimant,
        }
    }

    /// Fetch, deliver and mark one batch, as the design says.
    pub async fn deliver_batch(&mut self) -> Result<BatchOutcome> {
        match self.config.design {
            RelayDesign::Lock => self.deliver_locked_batch().await,
            RelayDesign::Claim => self.deliver_claimed_batch().await,
        }
    }

    /// The article's: fetch, deliver and mark in one transaction that holds the row locks.
    async fn deliver_locked_batch(&mut self) -> Result<BatchOutcome> {
        let tx = self.client.transaction().await?;
        let rows = tx
            .query(
                FETCH_BATCH,
                &[&self.config.max_attempts, &self.config.batch],
            )
            .await?;
        let (outcome, delivered) = deliver_rows(
            &self.sink,
            &self.config,
            self.log_name.as_deref(),
            &tx,
            &rows,
        )
        .await?;
        if !delivered.is_empty() {
            tx.execute(MARK_PUBLISHED, &[&delivered]).await?;
        }
        crash::point(CrashPoint::RelayAfterMarkBeforeCommit);
        tx.commit().await?;
        Ok(outcome)
    }

    /// The lease: claim (committed), deliver outside any transaction, mark what was delivered.
    async fn deliver_claimed_batch(&mut self) -> Result<BatchOutcome> {
        let lease_ms = self.config.lease.as_secs_f64() * 1000.0;
        let mut rows = self
            .client
            .query(
                CLAIM_BATCH,
                &[
                    &self.config.max_attempts,
                    &self.config.batch,
                    &self.claimant,
                    &lease_ms,
                ],
            )
            .await?;
        // UPDATE ... RETURNING has no order; deliver oldest first, as the lock design does.
        rows.sort_by_key(|row| row.get::<_, i64>("id"));
        // A failed row keeps its claim: it is retried once both its backoff and the lease ran out.
        let (outcome, delivered) = deliver_rows(
            &self.sink,
            &self.config,
            self.log_name.as_deref(),
            &self.client,
            &rows,
        )
        .await?;
        if !delivered.is_empty() {
            self.client
                .execute(MARK_CLAIMED_PUBLISHED, &[&delivered, &self.claimant])
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
                log_line(
                    self.log_name.as_deref(),
                    format_args!("exit. sent_total={sent_total}"),
                );
                return Ok(sent_total);
            }
            if started.elapsed() > self.config.deadline {
                bail!(
                    "relay gave up after {:?}: {pending} rows still undelivered",
                    self.config.deadline
                );
            }
            // Sleep until the next retry is due; rows still locked (by a relay that just died and
            // whose session the server has not ended yet) or under another relay's lease are
            // polled again shortly.
            let wait = if due_in_ms > 0.0 {
                Duration::from_secs_f64(due_in_ms / 1000.0)
            } else {
                self.config.idle_poll
            };
            tokio::time::sleep(wait).await;
        }
    }
}

/// Sends each fetched row; a failure is recorded (with its backoff) through `db`. Returns
/// the ids delivered, for the mark.
async fn deliver_rows(
    sink: &HttpSink,
    config: &RelayConfig,
    log_name: Option<&str>,
    db: &impl GenericClient,
    rows: &[Row],
) -> Result<(BatchOutcome, Vec<i64>)> {
    let mut outcome = BatchOutcome {
        fetched: rows.len(),
        ..Default::default()
    };
    let mut delivered: Vec<i64> = Vec::with_capacity(rows.len());
    for row in rows {
        let event = Event::from_outbox_row(row);
        let id = event.outbox_id.expect("outbox rows have ids");
        crash::point(CrashPoint::RelayAfterFetchBeforeSend);
        match sink.send(&event).await {
            Ok(()) => {
                delivered.push(id);
                outcome.sent += 1;
                crash::point(CrashPoint::RelayAfterSendBeforeMark);
            }
            Err(e) => {
                let error = format!("{e:#}");
                log_line(log_name, format_args!("outbox id={id} failed: {error}"));
                let base_ms = config.backoff_base.as_secs_f64() * 1000.0;
                db.execute(MARK_FAILED, &[&id, &error, &base_ms]).await?;
                outcome.failed += 1;
            }
        }
    }
    Ok((outcome, delivered))
}

/// The article's relay log line (`[relay 0] ...`), for relays that have a name.
fn log_line(name: Option<&str>, line: std::fmt::Arguments<'_>) {
    if let Some(name) = name {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "[relay {name}] {line}");
        let _ = out.flush();
    }
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
