//! Relays that remember how far they got instead of marking rows. The plain watermark
//! (`id > last_seen`) loses events (watermark-gap), and so does it with a safety lag, only
//! later; the gap watermarks advance over consecutive ids only, waiting for a missing one (for
//! ever, when it never commits) or skipping it once it is old (and losing a commit slower than
//! that); the xid8 watermark is gap-safe, and waits for every older transaction of the server;
//! the stored watermark is the plain one as production builds it (saved after each delivery,
//! crash-safe but not gap-safe), broken on purpose for explore's checker to catch. All but the
//! stored one keep their position in memory, and connect again when their database restarts.

use std::time::Duration;

use anyhow::Result;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Row};
use tracing::info;

use super::sql::{
    AFTER_WATERMARK, AFTER_XID_WATERMARK, FETCH_AFTER_LAGGED_WATERMARK, FETCH_AFTER_WATERMARK,
    FETCH_AFTER_WATERMARK_AGED, FETCH_AFTER_XID_WATERMARK, LOAD_WATERMARK, SAVE_WATERMARK,
    WATERMARK_PENDING,
};
use super::{OutboxRelay, Pass, Pending};
use crate::connect;
use crate::outbox::crash::{self, CrashPoint};
use crate::outbox::event::Event;
use crate::outbox::sink::HttpSink;

/// A watermark relay's connection. A lost one (the server crashed, restarted, or ended the
/// session) is not the relay's end: it connects again, waiting for the server for at most
/// [`connect::RECONNECT_PATIENCE`], as the table relay does; its position is its own, in memory.
struct Session {
    db: tokio_postgres::Config,
    client: Client,
}

impl Session {
    async fn open(db: &tokio_postgres::Config) -> Result<Session> {
        Ok(Session {
            db: db.clone(),
            client: connect::postgres(db).await?,
        })
    }

    /// The rows of a fetch; none when the connection was found lost (it is open again).
    async fn fetch(
        &mut self,
        relay: &str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>> {
        let error = match self.client.query(sql, params).await {
            Ok(rows) => return Ok(rows),
            Err(e) => anyhow::Error::from(e),
        };
        if !(self.client.is_closed() || connect::lost_connection(&error)) {
            return Err(error);
        }
        info!(relay = %relay, "connection lost ({error:#}), connecting again");
        let db = &self.db;
        self.client = connect::patiently(connect::RECONNECT_PATIENCE, async || {
            connect::postgres(db).await
        })
        .await?;
        Ok(Vec::new())
    }
}

/// Delivers rows after the highest id it has seen, and never looks back; with a safety lag,
/// only rows older than the lag.
pub struct WatermarkRelay {
    session: Session,
    sink: HttpSink,
    last_seen: i64,
    /// Reads only rows older than this, so that a transaction that took a smaller id has (it is
    /// hoped) committed by then.
    lag: Option<Duration>,
}

impl WatermarkRelay {
    pub async fn connect(db: &tokio_postgres::Config, sink: HttpSink) -> Result<WatermarkRelay> {
        Ok(WatermarkRelay {
            session: Session::open(db).await?,
            sink,
            last_seen: 0,
            lag: None,
        })
    }

    /// The same, reading only rows older than `lag`: the usual fix, which loses only the
    /// transactions slower than the lag.
    pub fn lagging(self, lag: Duration) -> WatermarkRelay {
        WatermarkRelay {
            lag: Some(lag),
            ..self
        }
    }
}

impl OutboxRelay for WatermarkRelay {
    fn name(&self) -> &str {
        match self.lag {
            None => "watermark",
            Some(_) => "lag_watermark",
        }
    }

    async fn pass(&mut self) -> Result<Pass> {
        let name = self.name().to_string();
        let rows = match self.lag {
            None => {
                let params: [&(dyn ToSql + Sync); 1] = [&self.last_seen];
                self.session
                    .fetch(&name, FETCH_AFTER_WATERMARK, &params)
                    .await?
            }
            Some(lag) => {
                let params: [&(dyn ToSql + Sync); 2] = [&self.last_seen, &millis(lag)];
                self.session
                    .fetch(&name, FETCH_AFTER_LAGGED_WATERMARK, &params)
                    .await?
            }
        };
        let mut pass = Pass::default();
        for row in &rows {
            let event = Event::from_outbox_row(row);
            self.sink.send(&event).await?;
            self.last_seen = self
                .last_seen
                .max(event.outbox_id.expect("outbox rows have ids"));
            pass.fetched += 1;
            pass.sent += 1;
        }
        Ok(pass)
    }

    /// Rows above the watermark, however young; one that committed below it is never counted
    /// again.
    async fn pending(&self) -> Result<Pending> {
        rows_left(&self.session.client, AFTER_WATERMARK, &[&self.last_seen]).await
    }
}

/// A watermark that advances over consecutive ids only. A missing id belongs to a transaction
/// that took it and has not committed, so it waits for it — for ever when it never commits (a
/// rollback, a sequence that jumped in a crash: marten#5108, marten#3865). With `skip_after`,
/// it skips a gap once a row after it is that old (Marten's `StaleSequenceThreshold`), and so
/// loses a commit slower than that (marten#3122).
pub struct GapWatermarkRelay {
    session: Session,
    sink: HttpSink,
    /// Every id up to this one was delivered or skipped.
    passed: i64,
    skip_after: Option<Duration>,
}

impl GapWatermarkRelay {
    pub async fn connect(
        db: &tokio_postgres::Config,
        sink: HttpSink,
        skip_after: Option<Duration>,
    ) -> Result<GapWatermarkRelay> {
        Ok(GapWatermarkRelay {
            session: Session::open(db).await?,
            sink,
            passed: 0,
            skip_after,
        })
    }
}

impl OutboxRelay for GapWatermarkRelay {
    fn name(&self) -> &str {
        match self.skip_after {
            None => "gap_wait",
            Some(_) => "gap_skip",
        }
    }

    /// Delivers the rows that follow on from the last id it got past, up to the first gap (or
    /// over it, once stale).
    async fn pass(&mut self) -> Result<Pass> {
        let name = self.name().to_string();
        let rows = match self.skip_after {
            None => {
                let params: [&(dyn ToSql + Sync); 1] = [&self.passed];
                self.session
                    .fetch(&name, FETCH_AFTER_WATERMARK, &params)
                    .await?
            }
            Some(after) => {
                let params: [&(dyn ToSql + Sync); 2] = [&self.passed, &millis(after)];
                self.session
                    .fetch(&name, FETCH_AFTER_WATERMARK_AGED, &params)
                    .await?
            }
        };
        let mut pass = Pass::default();
        for row in &rows {
            let id: i64 = row.get("id");
            if id != self.passed + 1 {
                let stale = self.skip_after.is_some() && row.get::<_, bool>("stale");
                if !stale {
                    break;
                }
                info!(relay = %name, "skipping ids {}..{id}: a gap older than its threshold", self.passed + 1);
            }
            self.sink.send(&Event::from_outbox_row(row)).await?;
            self.passed = id;
            pass.fetched += 1;
            pass.sent += 1;
        }
        Ok(pass)
    }

    /// Rows after the last id it got past, the gap's and those held behind it; a row that
    /// commits in a gap it skipped is never counted again.
    async fn pending(&self) -> Result<Pending> {
        rows_left(&self.session.client, AFTER_WATERMARK, &[&self.passed]).await
    }
}

/// A watermark over (writing transaction id, row id) that only advances past committed history.
pub struct XidWatermarkRelay {
    session: Session,
    sink: HttpSink,
    last_xid: String,
    last_id: i64,
}

impl XidWatermarkRelay {
    pub async fn connect(db: &tokio_postgres::Config, sink: HttpSink) -> Result<XidWatermarkRelay> {
        Ok(XidWatermarkRelay {
            session: Session::open(db).await?,
            sink,
            last_xid: "0".into(),
            last_id: 0,
        })
    }
}

impl OutboxRelay for XidWatermarkRelay {
    fn name(&self) -> &str {
        "xid8"
    }

    async fn pass(&mut self) -> Result<Pass> {
        let params: [&(dyn ToSql + Sync); 2] = [&self.last_xid, &self.last_id];
        let rows = self
            .session
            .fetch("xid8", FETCH_AFTER_XID_WATERMARK, &params)
            .await?;
        let mut pass = Pass::default();
        for row in &rows {
            let event = Event::from_outbox_row(row);
            self.sink.send(&event).await?;
            self.last_xid = row.get("xid");
            self.last_id = event.outbox_id.expect("outbox rows have ids");
            pass.fetched += 1;
            pass.sent += 1;
        }
        Ok(pass)
    }

    /// Rows after the watermark, whether their transactions are behind the horizon yet or not.
    async fn pending(&self) -> Result<Pending> {
        rows_left(
            &self.session.client,
            AFTER_XID_WATERMARK,
            &[&self.last_xid, &self.last_id],
        )
        .await
    }
}

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
}

impl OutboxRelay for StoredWatermarkRelay {
    fn name(&self) -> &str {
        &self.name
    }

    /// One pass; `fetched` counts the rows it got past. A failed send ends the pass without
    /// moving the watermark, so the row is tried again on the next pass. Every try is logged
    /// (`sending`, then `sent` or `failed`), as the article's relay does with `log_attempts`.
    async fn pass(&mut self) -> Result<Pass> {
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
        let mut pass = Pass::default();
        for row in &rows {
            let event = Event::from_outbox_row(row);
            let id = event.outbox_id.expect("outbox rows have ids");
            crash::point(CrashPoint::RelayAfterFetchBeforeSend);
            info!(relay = %name, "outbox id={id} sending");
            if let Err(e) = self.sink.send(&event).await {
                info!(relay = %name, "outbox id={id} failed: {e:#}");
                pass.failed += 1;
                break;
            }
            info!(relay = %name, "outbox id={id} sent");
            crash::point(CrashPoint::RelayAfterSendBeforeMark);
            self.client.execute(SAVE_WATERMARK, &[name, &id]).await?;
            pass.fetched += 1;
            pass.sent += 1;
        }
        Ok(pass)
    }

    /// Rows above the watermark.
    async fn pending(&self) -> Result<Pending> {
        rows_left(&self.client, WATERMARK_PENDING, &[&self.name]).await
    }
}

/// A watermark relay's pending rows: a count, every one of them due now.
async fn rows_left(
    client: &Client,
    count: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Pending> {
    Ok(Pending {
        rows: client.query_one(count, params).await?.get(0),
        next_due: None,
    })
}

/// A duration as the SQL's milliseconds.
fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}
