//! One relay mode of notify-latency timed: its receiver started (the HTTP consumer, or a Redis
//! stream and its worker), the relay following until it is ready, the writer paced, every order
//! delivered, then the relay left idle while its transactions are counted.

use std::time::Duration;

use anyhow::{bail, Result};
use redis::AsyncCommands;
use tokio::task::JoinHandle;
use tokio_postgres::Client;

use super::commit_to_receipt::{same_clock_as_server, split, Split};
use super::{Ctx, Mode, Params, SinkKind, CHILD_TIMEOUT};
use crate::connect;
use crate::harness::child::role::StreamWorkerRole;
use crate::harness::child::{ChildCommand, ChildEnd, ChildRun, RunningChild};
use crate::harness::db::Database;
use crate::judge::counts;
use crate::judge::latency::{self, LatencySummary};
use crate::outbox::consumer::{ConsumerKind, Faults};
use crate::outbox::relay::{RelayConfig, Wakeup, RELAY_APPLICATION_NAME};
use crate::outbox::schema;
use crate::outbox::sink::RedisSink;
use crate::outbox::stream_consumer::GROUP;
use crate::outbox::writer::Ending;
use crate::wait;

/// A following relay runs until the scenario stops it; this only bounds a hang.
const RELAY_LIFETIME: Duration = Duration::from_secs(600);
/// Time for ended sessions to report their statistics before idle transactions are counted.
const STATS_SETTLE: Duration = Duration::from_millis(1500);
/// Bounds the wait for a relay (or the stream worker) to be ready before the first order.
const STARTUP_LIMIT: Duration = Duration::from_secs(30);
/// How often the database is looked at while waiting for the relay or its deliveries.
const WAIT_POLL: Duration = Duration::from_millis(5);
/// The Redis stream worker reads this many entries at a time.
const STREAM_READ: usize = 100;

/// What one relay mode measured.
pub(super) struct Measured {
    pub(super) insert_to_receipt: LatencySummary,
    /// With phases: commit -> receipt and the p50 of each phase.
    pub(super) split: Option<Split>,
    pub(super) idle_xacts_10s: Option<i64>,
}

/// Where a mode's relay delivers: the HTTP consumer, or a Redis stream and its worker.
enum Receiver {
    Http(crate::harness::child::ConsumerProcess),
    Stream {
        worker: RunningChild,
        stream: String,
    },
}

impl Receiver {
    async fn start(ctx: &Ctx<'_>, db: &Database, sink: SinkKind) -> Result<(Receiver, String)> {
        match sink {
            SinkKind::Http => {
                let consumer = ctx
                    .start_consumer(db, ConsumerKind::Naive, &Faults::default())
                    .await?;
                let url = consumer.url.clone();
                Ok((Receiver::Http(consumer), url))
            }
            SinkKind::Redis => {
                let url = ctx.redis_url().await?;
                let stream = RedisSink::stream_name(ctx.redis_key_prefix(), "orders");
                let mut redis = connect::redis(&url).await?;
                let _: i64 = redis.del(&stream).await?;
                let _: () = redis.xgroup_create_mkstream(&stream, GROUP, "$").await?;
                let role = StreamWorkerRole {
                    redis_url: url.clone(),
                    stream: stream.clone(),
                    worker: "notify-latency".into(),
                    kind: ConsumerKind::Naive,
                    count: STREAM_READ,
                    follow: true,
                };
                let worker = ChildCommand::new(db, role).spawn()?;
                // Ready once it waits in XREADGROUP (the group lists it only once it got an
                // entry).
                let ready = wait::up_to(STARTUP_LIMIT, WAIT_POLL, async || {
                    let clients: String = redis::cmd("CLIENT")
                        .arg("LIST")
                        .query_async(&mut redis)
                        .await?;
                    Ok(clients.contains("cmd=xreadgroup"))
                })
                .await?;
                if ready.is_none() {
                    worker.stop().await?;
                    bail!("the Redis stream worker did not read within {STARTUP_LIMIT:?}");
                }
                Ok((Receiver::Stream { worker, stream }, url))
            }
        }
    }

    /// Stops it; a stream is deleted again.
    async fn stop(self, ctx: &Ctx<'_>) -> Result<()> {
        match self {
            Receiver::Http(consumer) => consumer.stop().await,
            Receiver::Stream { worker, stream } => {
                worker.stop().await?;
                let mut redis = connect::redis(&ctx.redis_url().await?).await?;
                let _: i64 = redis.del(&stream).await?;
                Ok(())
            }
        }
    }
}

/// One relay mode: latencies while orders arrive, then transactions while idle.
pub(super) async fn measure(ctx: &Ctx<'_>, params: &Params, mode: &Mode) -> Result<Measured> {
    let name = &mode.name;
    let db = ctx.database(name).await?;
    let client = db.connect().await?;
    if mode.phases {
        same_clock_as_server(&client).await?;
    }
    if matches!(mode.wakeup, Wakeup::Notify { .. }) {
        client.batch_execute(schema::NOTIFY_TRIGGER).await?;
    }
    let (receiver, sink_url) = Receiver::start(ctx, &db, mode.sink).await?;
    let config = RelayConfig {
        log_phases: mode.phases,
        ..RelayConfig::default()
    };
    let mut relay = ctx
        .relay(&db, &sink_url, "0", &config)
        .with(|relay| relay.follow = Some(mode.wakeup))
        .spawn()?;
    // Closing its stdin stops the relay; meanwhile its output is read as it comes.
    let stop_relay = relay.take_stdin();
    let relay = tokio::spawn(relay.finish(RELAY_LIFETIME));
    // Ready once its session waits after its first statement, the LISTEN for the NOTIFY relay.
    let session = format!("{RELAY_APPLICATION_NAME} 0");
    let ready = wait::up_to(STARTUP_LIMIT, WAIT_POLL, async || {
        if relay.is_finished() {
            return Ok(Some(false));
        }
        let ready: bool = client
            .query_one(counts::RELAY_READY, &[&session])
            .await?
            .get(0);
        Ok(ready.then_some(true))
    })
    .await?;
    if ready != Some(true) {
        bail!(
            "the {name} relay was not ready within {STARTUP_LIMIT:?}: {}",
            relay_end(relay).await
        );
    }

    let writer = ctx
        .writer(&db, mode.orders, 1, Ending::Commit)
        .with(|writer| {
            writer.interval = Some(Duration::from_millis(mode.interval_ms));
            writer.seed = params.seed;
            writer.report_commits = mode.phases;
        })
        .run(CHILD_TIMEOUT)
        .await?
        .expect(|e| *e == ChildEnd::Ok, "the writer")?;
    let delivered = wait::up_to(CHILD_TIMEOUT, WAIT_POLL, async || {
        if relay.is_finished() {
            return Ok(Some(false));
        }
        let received = counts::count(&client, counts::RECEIVED).await?;
        Ok((received >= i64::from(mode.orders)).then_some(true))
    })
    .await?;
    if delivered != Some(true) {
        bail!(
            "the {name} relay did not deliver every order: {}",
            relay_end(relay).await
        );
    }
    let insert_to_receipt = latency::measure(&client).await?;

    // Nothing arrives now: every transaction is the relay looking for work. A backend that
    // reported statistics less than a second ago holds the rest back for up to 10 s: stop the
    // receiver (its sessions report as they end) and let that settle before counting.
    receiver.stop(ctx).await?;
    let idle_xacts_10s = match mode.idle {
        true => Some(idle_transactions(&client, params.idle_ms).await?),
        false => None,
    };
    drop(stop_relay);
    let relay = relay.await??.expect(|e| *e == ChildEnd::Ok, "the relay")?;
    let split = match mode.phases {
        true => Some(split(&client, &writer, &relay).await?),
        false => None,
    };
    Ok(Measured {
        insert_to_receipt,
        split,
        idle_xacts_10s,
    })
}

/// Transactions the idle relay commits, per 10 s: its look-ups at the outbox, one per
/// transaction, as the database counts them. Counting every commit of the database instead
/// (pg_stat_database) let an autovacuum worker's visit in: 36 where the NOTIFY relay makes 10.
async fn idle_transactions(client: &Client, idle_ms: u64) -> Result<i64> {
    tokio::time::sleep(STATS_SETTLE).await;
    // This session's own look-ups (the latencies join the outbox) are reported as its next
    // transaction ends, a second after the last report: that is this one, not one in the window.
    counts::count(client, counts::OUTBOX_LOOKUPS).await?;
    let before = counts::count(client, counts::OUTBOX_LOOKUPS).await?;
    tokio::time::sleep(Duration::from_millis(idle_ms)).await;
    let after = counts::count(client, counts::OUTBOX_LOOKUPS).await?;
    Ok(((after - before) as f64 * 10_000.0 / idle_ms as f64).round() as i64)
}

/// How the relay's task ended, for an error; a relay still running is stopped.
async fn relay_end(relay: JoinHandle<Result<ChildRun>>) -> String {
    if !relay.is_finished() {
        relay.abort(); // drops the child, which kills it
        return "it was still running".into();
    }
    match relay.await {
        Ok(Ok(run)) => run.end.to_string(),
        Ok(Err(e)) => format!("{e:#}"),
        Err(e) => e.to_string(),
    }
}
