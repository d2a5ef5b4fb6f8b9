//! The lock design (the article's): fetch, deliver and mark in one transaction that holds the
//! rows' locks (`FOR UPDATE SKIP LOCKED`); a crash releases them at once and the rows are simply
//! fetched again. Beside it, mark-before-send: the same fetch, broken on purpose (explore).
//!
//! While a full batch is delivered, a second connection fetches the next one in a transaction of
//! its own (this batch's rows are locked, so it takes the rows after them); the two connections
//! swap roles each batch. What stays true: nothing of the next batch is sent before this batch
//! was acknowledged, marked and committed, so an aggregate's events go out in order, and no row
//! is marked published before its delivery was acknowledged. The rows fetched ahead are only
//! locked, never marked: a relay that stops or dies there releases them unsent.

use std::time::Instant;

use anyhow::Result;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Row, Statement};

use super::polling::{deliver_rows, open_connection, prepare, Ahead, Relay};
use super::{BatchClock, Pass, RelayConfig};
use crate::outbox::crash::{self, CrashPoint};
use crate::outbox::phases::{self, RelayMoment};

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

    async fn locked_batch(&mut self) -> Result<Pass> {
        let started = Instant::now();
        let rows = match self.take_fetched_ahead() {
            Some(rows) => rows,
            None => begin_and_fetch(&self.client, &self.fetch, &self.config).await?,
        };
        let fetched = Instant::now();
        if self.config.log_phases && !rows.is_empty() {
            phases::relay_moment(RelayMoment::Fetched, &[]);
        }
        let full = rows.len() as i64 >= self.config.batch;
        let Relay {
            db,
            client,
            sink,
            config,
            mark,
            name,
            ahead,
            ..
        } = self;
        let this_batch = async {
            let (outcome, delivered) = deliver_rows(sink, config, name, client, &rows).await?;
            let sent = Instant::now();
            if !delivered.is_empty() {
                client.execute(&*mark, &[&delivered]).await?;
                crash::point(CrashPoint::RelayAfterMarkBeforeCommit);
            }
            let marked = Instant::now();
            client.batch_execute("COMMIT").await?;
            anyhow::Ok((outcome, sent, marked, Instant::now()))
        };
        // Only after a full batch: a short one says the outbox is drained for now.
        let next_batch = async {
            match full {
                true => fetch_ahead(ahead, db, config).await,
                false => Ok(()),
            }
        };
        let (this_batch, next_batch) = tokio::join!(this_batch, next_batch);
        let (outcome, sent, marked, committed) = this_batch?;
        next_batch?;
        let clock = BatchClock {
            started,
            fetched,
            sent,
            marked,
            committed,
        };
        self.timer.record(rows.len(), &clock);
        Ok(outcome)
    }

    /// The rows the other connection fetched ahead, with that connection (and its open
    /// transaction) now this relay's own.
    fn take_fetched_ahead(&mut self) -> Option<Vec<Row>> {
        let ahead = self.ahead.as_mut()?;
        let rows = ahead.rows.take()?;
        std::mem::swap(&mut self.client, &mut ahead.client);
        std::mem::swap(&mut self.fetch, &mut ahead.fetch);
        std::mem::swap(&mut self.mark, &mut ahead.mark);
        Some(rows)
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
        let (outcome, _) =
            deliver_rows(&self.sink, &self.config, &self.name, &self.client, &rows).await?;
        Ok(outcome)
    }
}

/// Fetches the next batch on the second connection (opened the first time), leaving its
/// transaction open with the rows locked.
async fn fetch_ahead(
    ahead: &mut Option<Ahead>,
    db: &tokio_postgres::Config,
    config: &RelayConfig,
) -> Result<()> {
    let ahead = match ahead {
        Some(ahead) => ahead,
        None => {
            let (client, _) = open_connection(db, false).await?;
            let (fetch, mark) = prepare(&client, config).await?;
            ahead.insert(Ahead {
                client,
                fetch,
                mark,
                rows: None,
            })
        }
    };
    ahead.rows = Some(begin_and_fetch(&ahead.client, &ahead.fetch, config).await?);
    Ok(())
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
