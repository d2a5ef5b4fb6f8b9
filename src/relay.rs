//! The relay: reads undelivered outbox rows, delivers them, and marks them published.
//!
//! The article's relay ([`Relay`]) holds the rows' locks in the delivering transaction: a crash
//! releases them at once, and the rows are simply fetched again. Two watermark relays
//! ([`WatermarkRelay`], [`XidWatermarkRelay`]) remember how far they got instead of marking rows;
//! the first one loses events (watermark-gap), the second shows how to make a watermark safe.
//! For explore: the head-of-line guard, and two deliberately broken relays (mark before send,
//! [`StoredWatermarkRelay`]) whose flaws the explorer must catch.

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use tokio_postgres::Client;

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

/// The fetch with the head-of-line guard: a row is due only when no older row of its aggregate is
/// still undelivered, so a failing event holds back the later events of its aggregate (and only
/// those) instead of letting them overtake it.
pub const FETCH_BATCH_GUARDED: &str = "
SELECT id, event_id, aggregate_type, aggregate_id, event_type, payload
  FROM outbox o
 WHERE published_at IS NULL
   AND next_attempt_at <= clock_timestamp()
   AND attempts < $1
   AND NOT EXISTS (SELECT 1 FROM outbox older
                    WHERE older.aggregate_type = o.aggregate_type
                      AND older.aggregate_id = o.aggregate_id
                      AND older.id < o.id
                      AND older.published_at IS NULL)
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

/// How the article's relay behaves.
#[derive(Debug, Clone)]
pub struct RelayConfig {
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
    /// Fetch with [`FETCH_BATCH_GUARDED`]: per-aggregate order survives failed deliveries.
    pub head_of_line_guard: bool,
    /// Also log every delivery attempt (`sending`, `sent`): the history explore audits.
    pub log_attempts: bool,
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            batch: 100,
            max_attempts: 5,
            backoff_base: Duration::from_millis(200),
            idle_poll: Duration::from_millis(10),
            deadline: Duration::from_secs(60),
            head_of_line_guard: false,
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

/// The article's polling relay, with its row locks held while it delivers.
pub struct Relay {
    client: Client,
    sink: HttpSink,
    config: RelayConfig,
    /// Prints the article's log lines (`[relay 0] ...`) to stdout when set; children do.
    log_name: Option<String>,
}

impl Relay {
    pub fn new(
        client: Client,
        sink: HttpSink,
        config: RelayConfig,
        log_name: Option<String>,
    ) -> Relay {
        Relay {
            client,
            sink,
            config,
            log_name,
        }
    }

    fn fetch(&self) -> &'static str {
        if self.config.head_of_line_guard {
            FETCH_BATCH_GUARDED
        } else {
            FETCH_BATCH
        }
    }

    /// Fetch, deliver and mark one batch in one transaction.
    pub async fn deliver_batch(&mut self) -> Result<BatchOutcome> {
        let fetch = self.fetch();
        let tx = self.client.transaction().await?;
        let rows = tx
            .query(fetch, &[&self.config.max_attempts, &self.config.batch])
            .await?;
        let mut outcome = BatchOutcome {
            fetched: rows.len(),
            ..Default::default()
        };
        let mut delivered: Vec<i64> = Vec::with_capacity(rows.len());
        for row in &rows {
            let event = Event::from_outbox_row(row);
            let id = event.outbox_id.expect("outbox rows have ids");
            crash::point(CrashPoint::RelayAfterFetchBeforeSend);
            let log_name = self.log_name.as_deref();
            match attempt(&self.sink, log_name, self.config.log_attempts, &event).await {
                Ok(()) => {
                    delivered.push(id);
                    outcome.sent += 1;
                    crash::point(CrashPoint::RelayAfterSendBeforeMark);
                }
                Err(error) => {
                    let base_ms = self.config.backoff_base.as_secs_f64() * 1000.0;
                    tx.execute(MARK_FAILED, &[&id, &error, &base_ms]).await?;
                    outcome.failed += 1;
                }
            }
        }
        if !delivered.is_empty() {
            tx.execute(MARK_PUBLISHED, &[&delivered]).await?;
        }
        crash::point(CrashPoint::RelayAfterMarkBeforeCommit);
        tx.commit().await?;
        Ok(outcome)
    }

    /// The broken order (mark-before-send): mark the batch published and commit, then send. A
    /// crash or a failed send after the commit loses the events: nothing sends them again.
    pub async fn deliver_batch_marked_first(&mut self) -> Result<BatchOutcome> {
        let fetch = self.fetch();
        let tx = self.client.transaction().await?;
        let rows = tx
            .query(fetch, &[&self.config.max_attempts, &self.config.batch])
            .await?;
        let ids: Vec<i64> = rows.iter().map(|r| r.get("id")).collect();
        if !ids.is_empty() {
            tx.execute(MARK_PUBLISHED, &[&ids]).await?;
        }
        crash::point(CrashPoint::RelayAfterMarkBeforeCommit);
        tx.commit().await?;
        let mut outcome = BatchOutcome {
            fetched: rows.len(),
            ..Default::default()
        };
        for row in &rows {
            crash::point(CrashPoint::RelayAfterMarkBeforeSend);
            let event = Event::from_outbox_row(row);
            let log_name = self.log_name.as_deref();
            match attempt(&self.sink, log_name, self.config.log_attempts, &event).await {
                Ok(()) => outcome.sent += 1,
                Err(_) => outcome.failed += 1,
            }
        }
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
            // whose session the server has not ended yet) are polled again shortly.
            let wait = if due_in_ms > 0.0 {
                Duration::from_secs_f64(due_in_ms / 1000.0)
            } else {
                self.config.idle_poll
            };
            tokio::time::sleep(wait).await;
        }
    }
}

/// One delivery; the error as text (it is stored in `last_error`). A named relay logs failures,
/// and with `log_attempts` every try (`sending`, then `sent` or `failed`): a `sending` without an
/// answer is a try whose outcome the relay never learned (it died).
async fn attempt(
    sink: &HttpSink,
    log_name: Option<&str>,
    log_attempts: bool,
    event: &Event,
) -> std::result::Result<(), String> {
    let id = event.outbox_id.expect("outbox rows have ids");
    let trace = log_name.filter(|_| log_attempts);
    log_line(trace, format_args!("outbox id={id} sending"));
    match sink.send(event).await {
        Ok(()) => {
            log_line(trace, format_args!("outbox id={id} sent"));
            Ok(())
        }
        Err(e) => {
            let error = format!("{e:#}");
            log_line(log_name, format_args!("outbox id={id} failed: {error}"));
            Err(error)
        }
    }
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
    /// watermark, so the row is tried again on the next pass.
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
        let mut delivered = 0;
        for row in &rows {
            let event = Event::from_outbox_row(row);
            crash::point(CrashPoint::RelayAfterFetchBeforeSend);
            if attempt(&self.sink, Some(&self.name), true, &event)
                .await
                .is_err()
            {
                break;
            }
            crash::point(CrashPoint::RelayAfterSendBeforeMark);
            let id = event.outbox_id.expect("outbox rows have ids");
            self.client
                .execute(SAVE_WATERMARK, &[&self.name, &id])
                .await?;
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
