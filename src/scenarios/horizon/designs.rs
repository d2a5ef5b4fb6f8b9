//! horizon's designs: seven relays, each following a database of its own into a naive consumer
//! of its own (the log-tailing one through its slot), started afresh for each fault and stopped
//! after it, when each says what it still counts as pending.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use anyhow::{anyhow, Result};
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;
use tracing::info;

use super::Params;
use crate::connect;
use crate::harness::child::ConsumerProcess;
use crate::harness::db::Database;
use crate::judge::counts;
use crate::outbox::consumer::{ConsumerKind, Faults};
use crate::outbox::relay::cdc::{self, CdcConfig, CdcRelay};
use crate::outbox::relay::watermark::{GapWatermarkRelay, WatermarkRelay, XidWatermarkRelay};
use crate::outbox::relay::{drive, OutboxRelay, Relay, RelayConfig, Until, Wakeup};
use crate::outbox::schema;
use crate::outbox::sink::{HttpSink, Sink};
use crate::scenarios::Ctx;
use crate::wait;

/// How a relay knows what to deliver next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Design {
    /// `id > last_seen`.
    Watermark,
    /// `id > last_seen`, only rows older than `lag_ms`.
    LagWatermark,
    /// Over consecutive ids only, waiting for a missing one.
    GapWait,
    /// The same, skipping a gap once a row after it is `skip_gaps_after_ms` old.
    GapSkip,
    /// (writing transaction, id), only past the oldest transaction still running.
    Xid8,
    /// The article's: `published_at IS NULL`, `FOR UPDATE SKIP LOCKED`.
    Locking,
    /// The log-tailing relay: a logical replication slot, in commit order.
    Cdc,
}

impl Design {
    pub const ALL: [Design; 7] = [
        Design::Watermark,
        Design::LagWatermark,
        Design::GapWait,
        Design::GapSkip,
        Design::Xid8,
        Design::Locking,
        Design::Cdc,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Design::Watermark => "watermark",
            Design::LagWatermark => "lag_watermark",
            Design::GapWait => "gap_wait",
            Design::GapSkip => "gap_skip",
            Design::Xid8 => "xid8",
            Design::Locking => "locking",
            Design::Cdc => "cdc",
        }
    }
}

/// How often the log-tailing relay connects again within one fault when its stream ends (the
/// server's crash ends it once): a stream that keeps ending is an error.
const STREAM_RECONNECTS: u32 = 3;
/// Bounds the wait for every row to be delivered (before the crash) or confirmed (the slot).
const CATCH_UP_LIMIT: Duration = Duration::from_secs(20);
const CATCH_UP_POLL: Duration = Duration::from_millis(10);

/// A design's database, consumer and (log tailing) slot, for the whole scenario.
pub struct Bench {
    pub design: Design,
    pub db: Database,
    /// The scenario's own session on the database, to count; opened again after a crash.
    pub client: Client,
    consumer: ConsumerProcess,
    slot: String,
}

impl Bench {
    pub async fn new(ctx: &Ctx<'_>, design: Design) -> Result<Bench> {
        let db = ctx.database(design.name()).await?;
        let client = db.connect().await?;
        let slot = cdc::slot_name(&db.name);
        match design {
            Design::Xid8 => client.batch_execute(schema::ADD_WRITER_XID).await?,
            // Now, before any fault: a slot is made only once every transaction running at the
            // time has ended.
            Design::Cdc => cdc::create_slot(&client, &slot, false).await?,
            _ => {}
        }
        let consumer = ctx
            .start_consumer(&db, ConsumerKind::Naive, &Faults::default())
            .await?;
        Ok(Bench {
            design,
            db,
            client,
            consumer,
            slot,
        })
    }

    /// Empties the outbox and the consumer's tables, ids from 1 again: each fault starts afresh.
    pub async fn reset(&self) -> Result<()> {
        Ok(self.client.batch_execute(schema::RESET).await?)
    }

    /// Its session again, once the server is back from a crash.
    pub async fn reconnect(&mut self) -> Result<()> {
        let db = &self.db;
        self.client =
            connect::patiently(connect::RECONNECT_PATIENCE, async || db.connect().await).await?;
        Ok(())
    }

    /// Waits until the consumer has every outbox row (bounded).
    pub async fn wait_all_received(&self) -> Result<()> {
        let what = format!("the {} relay to deliver every row", self.design.name());
        wait::until(what, CATCH_UP_LIMIT, CATCH_UP_POLL, async || {
            Ok(self
                .client
                .query_one(counts::ALL_RECEIVED, &[])
                .await?
                .get::<_, bool>(0))
        })
        .await
    }

    /// The log-tailing relay has delivered every transaction committed so far (a mark written
    /// after them, confirmed); the others need nothing.
    pub async fn wait_log_caught_up(&self) -> Result<()> {
        match self.design {
            Design::Cdc => cdc::wait_caught_up(&self.client, &self.slot, CATCH_UP_LIMIT).await,
            _ => Ok(()),
        }
    }

    /// Its relay, connected (the log-tailing one streaming) when this returns, to follow the
    /// outbox until `stop`.
    pub async fn follow(&self, params: &Params, stop: &CancellationToken) -> Result<Follower> {
        let db = self.db.config()?;
        let sink = HttpSink::new(&self.consumer.url)?;
        let every = Duration::from_millis(params.poll_ms);
        let stop = stop.clone();
        let following: Following = match self.design {
            Design::Watermark => {
                let relay = WatermarkRelay::connect(&db, sink).await?;
                Box::pin(follow_polling(relay, every, stop))
            }
            Design::LagWatermark => {
                let lag = Duration::from_millis(params.lag_ms);
                let relay = WatermarkRelay::connect(&db, sink).await?.lagging(lag);
                Box::pin(follow_polling(relay, every, stop))
            }
            Design::GapWait => {
                let relay = GapWatermarkRelay::connect(&db, sink, None).await?;
                Box::pin(follow_polling(relay, every, stop))
            }
            Design::GapSkip => {
                let after = Duration::from_millis(params.skip_gaps_after_ms);
                let relay = GapWatermarkRelay::connect(&db, sink, Some(after)).await?;
                Box::pin(follow_polling(relay, every, stop))
            }
            Design::Xid8 => {
                let relay = XidWatermarkRelay::connect(&db, sink).await?;
                Box::pin(follow_polling(relay, every, stop))
            }
            Design::Locking => {
                let sink = Sink::Http(sink);
                let relay =
                    Relay::connect(&db, sink, RelayConfig::default(), "locking", false).await?;
                Box::pin(follow_polling(relay, every, stop))
            }
            Design::Cdc => {
                let log = LogRelay {
                    db,
                    sink,
                    config: CdcConfig {
                        slot: self.slot.clone(),
                        backoff_base: RelayConfig::default().backoff_base,
                        max_attempts: RelayConfig::default().max_attempts as u32,
                        heartbeat: true,
                    },
                };
                let relay = log.connect().await?;
                Box::pin(follow_log(relay, log, stop))
            }
        };
        Ok(Follower(following))
    }

    /// Stops what it started: the slot dropped, the consumer stopped.
    pub async fn close(self) -> Result<()> {
        if self.design == Design::Cdc {
            cdc::drop_slot(&self.client, &self.slot).await?;
        }
        self.consumer.stop().await
    }
}

/// What a relay does until stopped, then the rows it still counts as pending. Not a task of its
/// own: the relays' loop ([`drive`]) holds references a spawned task cannot take, so the round
/// polls its followers beside its own steps.
type Following = Pin<Box<dyn Future<Output = Result<i64>>>>;

/// A relay following its outbox, connected.
pub struct Follower(Following);

impl Follower {
    /// Follows until stopped: then the rows it still counts as pending (ahead of its position,
    /// not skipped).
    pub async fn pending(self) -> Result<i64> {
        self.0.await
    }
}

/// Polls every `every` until `stop`; then its pending rows.
async fn follow_polling<R: OutboxRelay>(
    mut relay: R,
    every: Duration,
    stop: CancellationToken,
) -> Result<i64> {
    drive(
        &mut relay,
        Until::Shutdown(Wakeup::Poll(every)),
        stop.cancelled(),
    )
    .await?;
    Ok(relay.pending().await?.rows)
}

/// What the log-tailing relay connects with, and again when its stream ended.
struct LogRelay {
    db: tokio_postgres::Config,
    sink: HttpSink,
    config: CdcConfig,
}

impl LogRelay {
    async fn connect(&self) -> Result<CdcRelay> {
        let sink = Sink::Http(self.sink.clone());
        CdcRelay::connect(&self.db, sink, self.config.clone(), None).await
    }
}

/// Follows the slot until `stop`, connecting again (as a supervisor would restart it) when the
/// stream ends: the server's crash ends it. Nothing pending once stopped: it is stopped only
/// after it confirmed a mark written after every commit ([`Bench::wait_log_caught_up`]).
async fn follow_log(mut relay: CdcRelay, log: LogRelay, stop: CancellationToken) -> Result<i64> {
    let mut ends = 0;
    loop {
        let ended = tokio::select! {
            () = stop.cancelled() => return Ok(0),
            ended = relay.follow() => ended,
        };
        let error = ended.err().unwrap_or_else(|| anyhow!("the stream ended"));
        ends += 1;
        if ends > STREAM_RECONNECTS {
            return Err(error.context(format!("the cdc relay's stream ended {ends} times")));
        }
        info!(relay = "cdc", "stream ended ({error:#}), connecting again");
        relay =
            connect::patiently(connect::RECONNECT_PATIENCE, async || log.connect().await).await?;
    }
}
