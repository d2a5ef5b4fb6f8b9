//! The lock design (the article's): fetch, deliver and mark in one transaction that holds the
//! rows' locks (`FOR UPDATE SKIP LOCKED`); a crash releases them at once and the rows are simply
//! fetched again. Beside it, mark-before-send: the same fetch, broken on purpose (explore).

use anyhow::Result;
use tokio_postgres::types::ToSql;

use super::polling::{deliver_rows, Relay};
use super::Pass;
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

    /// BEGIN and the fetch go out together (one round trip, not two): on an idle relay woken by
    /// NOTIFY, every round trip is latency.
    async fn locked_batch(&mut self) -> Result<Pass> {
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
        if self.config.log_phases && !rows.is_empty() {
            phases::relay_moment(RelayMoment::Fetched, &[]);
        }
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
    pub(super) async fn deliver_marked_first_batch(&mut self) -> Result<Pass> {
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
}
