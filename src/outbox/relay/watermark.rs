//! Relays that remember how far they got instead of marking rows. The plain watermark
//! (`id > last_seen`) loses events (watermark-gap); the xid8 watermark shows how to make one
//! safe; the stored watermark is the plain one as production builds it (saved after each
//! delivery, crash-safe but not gap-safe), broken on purpose for explore's checker to catch.

use anyhow::Result;
use tokio_postgres::types::ToSql;
use tokio_postgres::Client;
use tracing::info;

use super::sql::{
    AFTER_WATERMARK, AFTER_XID_WATERMARK, FETCH_AFTER_WATERMARK, FETCH_AFTER_XID_WATERMARK,
    LOAD_WATERMARK, SAVE_WATERMARK, WATERMARK_PENDING,
};
use super::{OutboxRelay, Pass, Pending};
use crate::outbox::crash::{self, CrashPoint};
use crate::outbox::event::Event;
use crate::outbox::sink::HttpSink;

/// Delivers rows after the highest id it has seen, and never looks back.
pub struct WatermarkRelay {
    client: Client,
    sink: HttpSink,
    last_seen: i64,
}

impl WatermarkRelay {
    pub fn new(client: Client, sink: HttpSink) -> WatermarkRelay {
        WatermarkRelay {
            client,
            sink,
            last_seen: 0,
        }
    }
}

impl OutboxRelay for WatermarkRelay {
    fn name(&self) -> &str {
        "watermark"
    }

    async fn pass(&mut self) -> Result<Pass> {
        let mut pass = Pass::default();
        for row in self
            .client
            .query(FETCH_AFTER_WATERMARK, &[&self.last_seen])
            .await?
        {
            let event = Event::from_outbox_row(&row);
            self.sink.send(&event).await?;
            self.last_seen = self
                .last_seen
                .max(event.outbox_id.expect("outbox rows have ids"));
            pass.fetched += 1;
            pass.sent += 1;
        }
        Ok(pass)
    }

    /// Rows above the watermark; one that committed below it is never counted again.
    async fn pending(&self) -> Result<Pending> {
        rows_left(&self.client, AFTER_WATERMARK, &[&self.last_seen]).await
    }
}

/// A watermark over (writing transaction id, row id) that only advances past committed history.
pub struct XidWatermarkRelay {
    client: Client,
    sink: HttpSink,
    last_xid: String,
    last_id: i64,
}

impl XidWatermarkRelay {
    pub fn new(client: Client, sink: HttpSink) -> XidWatermarkRelay {
        XidWatermarkRelay {
            client,
            sink,
            last_xid: "0".into(),
            last_id: 0,
        }
    }
}

impl OutboxRelay for XidWatermarkRelay {
    fn name(&self) -> &str {
        "xid8"
    }

    async fn pass(&mut self) -> Result<Pass> {
        let mut pass = Pass::default();
        for row in self
            .client
            .query(FETCH_AFTER_XID_WATERMARK, &[&self.last_xid, &self.last_id])
            .await?
        {
            let event = Event::from_outbox_row(&row);
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
            &self.client,
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
