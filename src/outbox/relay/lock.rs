//! The lock design (the article's): fetch, deliver and mark in one transaction that holds the
//! rows' locks (`FOR UPDATE SKIP LOCKED`); a crash releases them at once and the rows are simply
//! fetched again. Beside it, mark-before-send: the same fetch, broken on purpose (explore).
//!
//! One batch at a time, on purpose: a relay that fetched the next batch while delivering this
//! one would hold two batches' locks, and another relay could not take the rows after its batch
//! (claim-vs-lock's overtaking vanished), for no gain that could be measured here. A relay with
//! [`workers`](super::RelayConfig::workers) overlaps batches without that: each worker is this
//! loop on its own connection over its own partition of the aggregates, one batch at a time.

use std::time::{Duration, Instant};

use anyhow::Result;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Row, Statement};

use super::config::FENCE_PATIENCE;
use super::polling::Relay;
use super::sql::{FENCE_POSITION, MARK_FAILED, STANDBYS_CONFIRMED, UNMARK_FAILED};
use super::{BatchClock, Pass, RelayConfig};
use crate::outbox::crash::{self, CrashPoint};
use crate::outbox::phases::{self, RelayMoment};
use crate::wait;

impl Relay {
    /// The article's: fetch, deliver and mark in one transaction that holds the row locks.
    pub(super) async fn deliver_locked_batch(&mut self) -> Result<Pass> {
        let delivered = self.locked_batch().await;
        if delivered.is_err() {
            // The error ends this relay; leave the connection clean all the same.
            let _ = self.client.batch_execute("ROLLBACK").await;
        }
        delivered
    }

    /// The mark goes out beside the send, not after it: the UPDATE of every fetched row runs in
    /// the open transaction while the sink answers, a failed delivery is unmarked again
    /// ([`UNMARK_FAILED`]), and the COMMIT waits for both. What commits is what the article's
    /// order commits (a row published only once its delivery was acknowledged; a crash before
    /// the COMMIT rolls every mark back), and the mark's round trip and its row versions no
    /// longer follow the sink's. At batch 100 with 2 workers, Redis went from 0.76 of the
    /// database's ceiling to 0.80-0.83, NATS JetStream from 0.50 to 0.56 (batch-throughput).
    async fn locked_batch(&mut self) -> Result<Pass> {
        let started = Instant::now();
        let rows = begin_and_fetch(&self.client, &self.fetch, &self.config).await?;
        if self.config.fence_standby && !rows.is_empty() && !self.standbys_confirm().await? {
            self.client.batch_execute("ROLLBACK").await?;
            return Ok(Pass::default());
        }
        let fetched = Instant::now();
        if self.config.log_phases && !rows.is_empty() {
            phases::relay_moment(RelayMoment::Fetched, &[]);
        }
        let ids: Vec<i64> = rows.iter().map(|row| row.get("id")).collect();
        // The mark is polled first, so it reaches the connection before any failure's record.
        let mark = async {
            match ids.is_empty() {
                true => Ok(0),
                false => self.client.execute(&self.mark, &[&ids]).await,
            }
        };
        let send = async {
            let delivered = self.deliver(&rows, UNMARK_FAILED).await;
            (delivered, Instant::now())
        };
        let (marked, (delivered, sent)) = tokio::join!(mark, send);
        marked?;
        let (outcome, _) = delivered?;
        if outcome.sent > 0 {
            crash::point(CrashPoint::RelayAfterMarkBeforeCommit);
        }
        let marked = Instant::now();
        self.client.batch_execute("COMMIT").await?;
        let clock = BatchClock {
            started,
            fetched,
            sent,
            marked,
            committed: Instant::now(),
        };
        self.timer.record(rows.len(), &clock);
        Ok(outcome)
    }

    /// The fence: whether every streaming standby flushed the WAL up to where the fetch saw
    /// it, within [`FENCE_PATIENCE`].
    async fn standbys_confirm(&self) -> Result<bool> {
        let position: String = self.client.query_one(FENCE_POSITION, &[]).await?.get(0);
        let confirmed = wait::up_to(FENCE_PATIENCE, Duration::from_millis(5), async || {
            let row = self
                .client
                .query_one(STANDBYS_CONFIRMED, &[&position])
                .await?;
            Ok(row.get::<_, bool>(0))
        })
        .await?;
        Ok(confirmed.is_some())
    }

    /// Broken on purpose (mark-before-send): fetch, mark published and COMMIT, then send. A crash
    /// or a failed send after the commit loses the events: nothing sends them again. (An error
    /// before the COMMIT ends the relay, and its session, which rolls back.)
    pub(super) async fn deliver_marked_first_batch(&mut self) -> Result<Pass> {
        let rows = begin_and_fetch(&self.client, &self.fetch, &self.config).await?;
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
        let (outcome, _) = self.deliver(&rows, MARK_FAILED).await?;
        Ok(outcome)
    }
}

/// BEGIN and the fetch go out together (one round trip, not two): on an idle relay woken by
/// NOTIFY, every round trip is latency. The transaction stays open, holding the rows' locks.
async fn begin_and_fetch(
    client: &Client,
    fetch: &Statement,
    config: &RelayConfig,
) -> Result<Vec<Row>> {
    let (index, count) = config
        .partition
        .map_or((0, 1), |p| (p.index as i32, p.count as i32));
    let all: [&(dyn ToSql + Sync); 4] = [&config.max_attempts, &config.batch, &index, &count];
    let params = match config.partition {
        Some(_) => &all[..],
        None => &all[..2],
    };
    let (_, rows) = tokio::try_join!(client.batch_execute("BEGIN"), client.query(fetch, params))?;
    Ok(rows)
}
