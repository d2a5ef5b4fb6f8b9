//! notify-latency (配送遅延とスループットの実測): orders written every 200 ms (on average), and
//! the delay from the outbox row's created_at to the consumer's received_at, for a relay polling
//! every 1000 ms and every 100 ms. Then the relay woken by LISTEN/NOTIFY (statement trigger,
//! 1 s fallback poll), timed over enough events that its p99 is not its maximum, to the HTTP
//! consumer and to a Redis stream, with each delivery's time split into phases. Then what each
//! relay costs the database while nothing happens (transactions in idle seconds), and what the
//! NOTIFY trigger costs writers (notifying commits queue up). The worst case is judged on the
//! windowed p95 ([`LatencySummary::windowed_p95_ms`]): a stall of the whole machine delays the
//! few deliveries waiting meanwhile, not the relay's way of waking up.
//!
//! The NOTIFY relay's headline is commit -> receipt: from the moment the writer's COMMIT
//! returned (the writer prints it, on this host's clock) to the consumer's receipt (its
//! `received_at`, the server's clock). Not PostgreSQL's commit timestamp
//! (`track_commit_timestamp`): that is taken when the commit record is written, before its WAL
//! flush, and no relay can see the row before the flush ends (an fdatasync takes about 1 ms on
//! this kind of machine), so it would count the writer's durability as the relay's latency; and
//! it would need a server setting. The two clocks are one on the server's host: a server whose
//! clock differs from this host's is refused. INSERT -> receipt (the article's figure) stands
//! beside it, and the phases in between come from the relay's own lines (woken, fetched,
//! sending: [`crate::outbox::phases`]).

use std::time::Duration;

use anyhow::{bail, Result};
use redis::AsyncCommands;
use serde::Deserialize;
use tokio::task::JoinHandle;
use tokio_postgres::Client;

use super::{metric_names, Ctx, Experiment, Outcome, CHILD_TIMEOUT};
use crate::connect;
use crate::harness::child::role::StreamWorkerRole;
use crate::harness::child::{ChildCommand, ChildEnd, ChildRun, RunningChild};
use crate::harness::db::Database;
use crate::judge::latency::{self, LatencySummary};
use crate::judge::{counts, median};
use crate::outbox::consumer::{ConsumerKind, Faults};
use crate::outbox::phases;
use crate::outbox::relay::{RelayConfig, Wakeup, RELAY_APPLICATION_NAME};
use crate::outbox::schema;
use crate::outbox::sink::RedisSink;
use crate::outbox::stream_consumer::GROUP;
use crate::outbox::writer::Ending;
use crate::report::plots::{self, Axes, Plot};
use crate::report::{Report, Table};
use crate::wait;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// Orders timed for each polling relay: a few per window (`latency::WINDOWS`).
    pub orders: u32,
    /// Average gap between those orders.
    pub interval_ms: u64,
    /// Chooses the (reproducible) shifts of the write times around the average gap.
    pub seed: u64,
    pub poll_intervals_ms: Vec<u64>,
    pub notify_fallback_ms: u64,
    /// Events timed for the NOTIFY relay, per sink: with 400 the p99 is the fifth-slowest, not
    /// the slowest.
    pub notify_events: u32,
    /// Their average gap: the relay is idle between two of them.
    pub notify_interval_ms: u64,
    /// Where the timed NOTIFY relay delivers.
    pub sink: SinkChoice,
    /// How long each relay is watched with nothing to do.
    pub idle_ms: u64,
    /// Concurrent writers for the trigger's cost, how long they write, and how many rounds
    /// (each design once per round, alternating which goes first).
    pub tps_writers: u32,
    pub tps_duration_ms: u64,
    pub tps_rounds: u32,
}

/// The sinks the NOTIFY relay is timed with (`--set sink=redis`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SinkChoice {
    /// The HTTP consumer: metrics `notify.*`.
    Http,
    /// A Redis stream read by a consumer-group worker: metrics `notify_redis.*`.
    Redis,
    Both,
}

impl SinkChoice {
    fn sinks(self) -> &'static [SinkKind] {
        match self {
            SinkChoice::Http => &[SinkKind::Http],
            SinkChoice::Redis => &[SinkKind::Redis],
            SinkChoice::Both => &[SinkKind::Http, SinkKind::Redis],
        }
    }
}

impl Experiment for Params {
    fn metrics(&self) -> Vec<String> {
        let polls = self.poll_intervals_ms.iter().map(|ms| format!("poll{ms}"));
        let every_mode = [
            "p50_ms",
            "p95_ms",
            "p99_ms",
            "max_ms",
            "windowed_p95_ms",
            "samples",
            "idle_xacts_10s",
        ];
        let mut metrics = metric_names(polls, &every_mode);
        let notify = self.sink.sinks().iter().map(|sink| sink.notify_mode());
        let split = [
            "commit_to_receipt_p50_ms",
            "commit_to_receipt_p99_ms",
            "commit_to_receipt_max_ms",
            "commit_to_woken_p50_ms",
            "woken_to_fetched_p50_ms",
            "fetched_to_sent_p50_ms",
            "sent_to_received_p50_ms",
        ];
        metrics.extend(metric_names(notify, &[&every_mode[..], &split].concat()));
        let trigger = ["with_trigger", "without_trigger"];
        let queue = ["writer_tps", "commit_queue", "queued_looks"];
        metrics.extend(metric_names(queue, &trigger));
        metrics.push("writer_tps.with_to_without".into());
        metrics
    }

    fn validate(&self) -> Result<()> {
        if self.orders == 0 || self.notify_events == 0 || self.tps_rounds == 0 {
            bail!("orders, notify_events and tps_rounds must be at least 1");
        }
        Ok(())
    }

    async fn run(&self, ctx: &Ctx<'_>) -> Result<Outcome> {
        run(ctx, self).await
    }

    fn plots(report: &Report) -> Result<Vec<Plot>> {
        latency_cdf(report)
    }
}

/// A following relay runs until the scenario stops it; this only bounds a hang.
const RELAY_LIFETIME: Duration = Duration::from_secs(600);
/// Time for ended sessions to report their statistics before idle transactions are counted.
const STATS_SETTLE: Duration = Duration::from_millis(1500);
/// Bounds the wait for a relay (or the stream worker) to be ready before the first order.
const STARTUP_LIMIT: Duration = Duration::from_secs(30);
/// How often the database is looked at while waiting for the relay or its deliveries.
const WAIT_POLL: Duration = Duration::from_millis(5);
/// How far the server's clock may stand from this host's (beyond the round trip's
/// uncertainty) for the two to be compared.
const CLOCK_TOLERANCE_US: i64 = 200;
/// How often the writers' sessions are looked at for a commit queued behind a notifying one.
const QUEUE_SAMPLE_EVERY: Duration = Duration::from_millis(5);
/// The Redis stream worker reads this many entries at a time.
const STREAM_READ: usize = 100;

/// Where a timed relay delivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SinkKind {
    Http,
    Redis,
}

impl SinkKind {
    /// The name of the NOTIFY relay delivering to it: the prefix of its metrics.
    fn notify_mode(self) -> &'static str {
        match self {
            SinkKind::Http => "notify",
            SinkKind::Redis => "notify_redis",
        }
    }
}

/// One relay to time: its wake-up, its sink, its orders, and whether its phases and idle cost
/// are measured.
struct Mode {
    name: String,
    wakeup: Wakeup,
    sink: SinkKind,
    orders: u32,
    interval_ms: u64,
    /// The writer and the relay print their moments: commit -> receipt and its phases.
    phases: bool,
    /// Count its transactions while idle.
    idle: bool,
}

pub async fn run(ctx: &Ctx<'_>, params: &Params) -> Result<Outcome> {
    let mut outcome = Outcome::default();
    let mut modes: Vec<Mode> = params
        .poll_intervals_ms
        .iter()
        .map(|&ms| Mode {
            name: format!("poll{ms}"),
            wakeup: Wakeup::Poll(Duration::from_millis(ms)),
            sink: SinkKind::Http,
            orders: params.orders,
            interval_ms: params.interval_ms,
            phases: false,
            idle: true,
        })
        .collect();
    let fallback = Duration::from_millis(params.notify_fallback_ms);
    for &sink in params.sink.sinks() {
        modes.push(Mode {
            name: sink.notify_mode().into(),
            wakeup: Wakeup::Notify { fallback },
            sink,
            orders: params.notify_events,
            interval_ms: params.notify_interval_ms,
            phases: true,
            idle: sink == SinkKind::Http,
        });
    }
    let mut latencies = Table::new(
        "latency (created_at -> received_at) and idle cost per relay",
        &[
            "relay",
            "sink",
            "orders",
            "~ms apart",
            "p50_ms",
            "p95_ms",
            "p99_ms",
            "max_ms",
            "windowed p95_ms",
            "idle transactions per 10 s",
        ],
    );
    let mut split = Table::new(
        "NOTIFY: commit -> receipt and where it goes (p50 of each phase, ms)",
        &[
            "relay",
            "commit->woken",
            "woken->fetched",
            "fetched->sent",
            "sent->received",
            "commit->receipt p50",
            "p99",
            "max",
            "samples",
        ],
    );
    // Every sample, behind the percentiles: the page plots their distribution per mode.
    let mut samples = Table::new("latency of every event", &["mode", "seq", "latency_ms"]).detail();
    let bar = ctx.progress().bar(modes.len() as u64 + 1, "notify-latency");
    for mode in &modes {
        bar.set_message(format!("relay {}", mode.name));
        let measured = measure_mode(ctx, params, mode).await?;
        record(mode, &measured, &mut outcome, &mut latencies, &mut split);
        for (seq, latency_ms) in &measured.insert_to_receipt.each_ms {
            samples.push(vec![
                mode.name.clone(),
                seq.to_string(),
                format!("{latency_ms:.3}"),
            ]);
        }
        bar.inc(1);
    }
    outcome.tables.push(latencies);
    if !split.rows.is_empty() {
        outcome.tables.push(split);
        outcome.notes.push(
            "commit = the writer's COMMIT returned (this host's clock); woken, fetched, sent = \
             the relay's own lines; received = the consumer's receipt (the server's clock). \
             commit->woken reads 0 when the relay woke before the writer heard its COMMIT."
                .into(),
        );
    }
    bar.set_message("writers with and without trigger");
    writer_throughput(ctx, params, &mut outcome).await?;
    bar.finish_and_clear();
    outcome.tables.push(samples);
    Ok(outcome)
}

/// What one relay mode measured.
struct Measured {
    insert_to_receipt: LatencySummary,
    /// With phases: commit -> receipt and the p50 of each phase.
    split: Option<Split>,
    idle_xacts_10s: Option<i64>,
}

/// commit -> receipt, and the p50 of its phases (ms).
struct Split {
    commit_to_receipt: LatencySummary,
    commit_to_woken_p50_ms: f64,
    woken_to_fetched_p50_ms: f64,
    fetched_to_sent_p50_ms: f64,
    sent_to_received_p50_ms: f64,
}

/// The metrics and table rows of one mode.
fn record(
    mode: &Mode,
    measured: &Measured,
    outcome: &mut Outcome,
    latencies: &mut Table,
    split_table: &mut Table,
) {
    let name = &mode.name;
    let m = &mut outcome.metrics;
    let latency = &measured.insert_to_receipt;
    m.set(format!("{name}.p50_ms"), latency.p50_ms);
    m.set(format!("{name}.p95_ms"), latency.p95_ms);
    m.set(format!("{name}.p99_ms"), latency.p99_ms);
    m.set(format!("{name}.max_ms"), latency.max_ms);
    m.set(format!("{name}.windowed_p95_ms"), latency.windowed_p95_ms);
    if let Some(idle) = measured.idle_xacts_10s {
        m.set(format!("{name}.idle_xacts_10s"), idle);
    }
    latencies.push(vec![
        name.clone(),
        match mode.sink {
            SinkKind::Http => "http".into(),
            SinkKind::Redis => "redis".into(),
        },
        mode.orders.to_string(),
        mode.interval_ms.to_string(),
        format!("{:.2}", latency.p50_ms),
        format!("{:.2}", latency.p95_ms),
        format!("{:.2}", latency.p99_ms),
        format!("{:.2}", latency.max_ms),
        format!("{:.2}", latency.windowed_p95_ms),
        measured
            .idle_xacts_10s
            .map_or_else(String::new, |n| n.to_string()),
    ]);
    let Some(split) = &measured.split else {
        m.set(format!("{name}.samples"), latency.samples as i64);
        return;
    };
    let headline = &split.commit_to_receipt;
    m.set(format!("{name}.samples"), headline.samples as i64);
    m.set(format!("{name}.commit_to_receipt_p50_ms"), headline.p50_ms);
    m.set(format!("{name}.commit_to_receipt_p99_ms"), headline.p99_ms);
    m.set(format!("{name}.commit_to_receipt_max_ms"), headline.max_ms);
    let phases = [
        ("commit_to_woken", split.commit_to_woken_p50_ms),
        ("woken_to_fetched", split.woken_to_fetched_p50_ms),
        ("fetched_to_sent", split.fetched_to_sent_p50_ms),
        ("sent_to_received", split.sent_to_received_p50_ms),
    ];
    let mut row = vec![name.clone()];
    for (phase, p50) in phases {
        m.set(format!("{name}.{phase}_p50_ms"), p50);
        row.push(format!("{p50:.3}"));
    }
    row.extend([
        format!("{:.3}", headline.p50_ms),
        format!("{:.3}", headline.p99_ms),
        format!("{:.3}", headline.max_ms),
        headline.samples.to_string(),
    ]);
    split_table.push(row);
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
async fn measure_mode(ctx: &Ctx<'_>, params: &Params, mode: &Mode) -> Result<Measured> {
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

/// Transactions the idle relay commits, per 10 s.
async fn idle_transactions(client: &Client, idle_ms: u64) -> Result<i64> {
    tokio::time::sleep(STATS_SETTLE).await;
    let before = counts::count(client, counts::XACT_COMMIT).await?;
    tokio::time::sleep(Duration::from_millis(idle_ms)).await;
    let after = counts::count(client, counts::XACT_COMMIT).await?;
    Ok(((after - before) as f64 * 10_000.0 / idle_ms as f64).round() as i64)
}

/// Each event's commit -> receipt, and its phases: the writer's and the relay's lines set
/// beside the server's receipts.
async fn split(client: &Client, writer: &ChildRun, relay: &ChildRun) -> Result<Split> {
    let committed = phases::read_committed(writer.log_lines());
    let relay_times = phases::read_relay(relay.log_lines());
    let ms = |from_us: i64, to_us: i64| (to_us - from_us) as f64 / 1000.0;
    let mut commit_to_receipt = Vec::new();
    let mut phase_ms: [Vec<(i64, f64)>; 4] = Default::default();
    for row in client.query(counts::RECEIPT_TIMES_US, &[]).await? {
        let seq: i64 = row.get("seq");
        let order: String = row.get("order_id");
        let received_us: i64 = row.get("received_us");
        let Some(&committed_us) = order.parse().ok().and_then(|o: i64| committed.get(&o)) else {
            continue;
        };
        commit_to_receipt.push((seq, ms(committed_us, received_us)));
        let Some(relay) = relay_times.get(&row.get::<_, i64>("outbox_id")) else {
            continue;
        };
        let moments = [
            committed_us,
            relay.woken_us,
            relay.fetched_us,
            relay.sending_us,
            received_us,
        ];
        for (phase, pair) in phase_ms.iter_mut().zip(moments.windows(2)) {
            phase.push((seq, ms(pair[0], pair[1])));
        }
    }
    if commit_to_receipt.is_empty() {
        bail!("no receipt matches a COMMIT the writer reported");
    }
    let [woken, fetched, sent, received] = phase_ms.map(latency::summarise);
    Ok(Split {
        commit_to_receipt: latency::summarise(commit_to_receipt)?,
        commit_to_woken_p50_ms: woken?.p50_ms,
        woken_to_fetched_p50_ms: fetched?.p50_ms,
        fetched_to_sent_p50_ms: sent?.p50_ms,
        sent_to_received_p50_ms: received?.p50_ms,
    })
}

/// The writer's and the relay's times are this host's clock, the receipts the server's: they
/// are compared only if the two clocks agree (one host).
async fn same_clock_as_server(client: &Client) -> Result<()> {
    let before_us = phases::now_us();
    let server_us: i64 = client.query_one(counts::SERVER_CLOCK_US, &[]).await?.get(0);
    let after_us = phases::now_us();
    let offset_us = server_us - (before_us + after_us) / 2;
    if offset_us.abs() > (after_us - before_us) / 2 + CLOCK_TOLERANCE_US {
        bail!(
            "notify-latency sets this host's clock beside the server's, and they differ by {:.1} \
             ms: run it on the server's host (or without --database-url)",
            offset_us as f64 / 1000.0
        );
    }
    Ok(())
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

/// Writers committing as fast as they can, with and without the NOTIFY trigger, in rounds that
/// alternate which goes first, so that the machine's drift (other work on it) falls on both
/// alike; each figure is the median of its rounds.
async fn writer_throughput(ctx: &Ctx<'_>, params: &Params, outcome: &mut Outcome) -> Result<()> {
    let designs = [("without_trigger", false), ("with_trigger", true)];
    let mut clients = Vec::new();
    for (name, trigger) in designs {
        let db = ctx.database(&format!("tps_{name}")).await?;
        let client = db.connect().await?;
        if trigger {
            client.batch_execute(schema::NOTIFY_TRIGGER).await?;
        }
        clients.push((db, client));
    }
    let mut rounds: [Vec<f64>; 2] = Default::default();
    let (mut looks, mut queued) = ([0u32; 2], [0u32; 2]);
    for round in 0..params.tps_rounds {
        let first = (round % 2) as usize;
        for design in [first, 1 - first] {
            let (db, client) = &clients[design];
            client.batch_execute(schema::RESET).await?;
            let mut writers = tokio::task::JoinSet::new();
            for _ in 0..params.tps_writers {
                let writer = ctx.writer(db, 0, 1, Ending::Commit).with(|writer| {
                    writer.duration = Some(Duration::from_millis(params.tps_duration_ms))
                });
                writers.spawn(writer.run(CHILD_TIMEOUT));
            }
            // Meanwhile, how often a writer is seen queued behind another's notifying COMMIT.
            while !writers.is_empty() {
                tokio::select! {
                    ended = writers.join_next() => {
                        if let Some(ended) = ended {
                            ended??.expect(|e| *e == ChildEnd::Ok, "a writer")?;
                        }
                    }
                    () = tokio::time::sleep(QUEUE_SAMPLE_EVERY) => {
                        let waiting = counts::count(client, counts::WAITING_TO_NOTIFY).await?;
                        looks[design] += 1;
                        queued[design] += u32::from(waiting > 0);
                    }
                }
            }
            let per_s: f64 = client.query_one(counts::ORDERS_PER_S, &[]).await?.get(0);
            rounds[design].push(per_s);
        }
    }
    let mut table = Table::new(
        format!(
            "{} writers for {} ms, {} rounds (synchronous_commit on)",
            params.tps_writers, params.tps_duration_ms, params.tps_rounds
        ),
        &[
            "outbox",
            "orders_per_s (median)",
            "each round",
            "looks with a commit queued",
        ],
    );
    let medians = rounds.each_ref().map(|each| median(each));
    for (design, (name, _)) in designs.iter().enumerate() {
        let per_s = medians[design];
        let queued_share = f64::from(queued[design]) / f64::from(looks[design].max(1));
        let m = &mut outcome.metrics;
        m.set(format!("writer_tps.{name}"), per_s.round());
        m.set(
            format!("commit_queue.{name}"),
            (queued_share * 1000.0).round() / 1000.0,
        );
        m.set(format!("queued_looks.{name}"), queued[design]);
        let each: Vec<String> = rounds[design].iter().map(|r| format!("{r:.0}")).collect();
        table.push(vec![
            name.replace('_', " "),
            format!("{per_s:.0}"),
            each.join(", "),
            format!("{} of {}", queued[design], looks[design]),
        ]);
    }
    let ratio = medians[1] / medians[0].max(1.0);
    outcome.metrics.set(
        "writer_tps.with_to_without",
        (ratio * 1000.0).round() / 1000.0,
    );
    outcome.tables.push(table);
    Ok(())
}

/// The distribution of every event's latency, one line per relay mode, from the detail table.
fn latency_cdf(report: &Report) -> Result<Vec<Plot>> {
    let Some(samples) = plots::table_with(report, &["mode", "latency_ms"]) else {
        return Ok(Vec::new());
    };
    let axes = Axes {
        x: "latency, created_at to received_at (ms, log scale)",
        y: "share of events",
    };
    Ok(vec![Plot {
        id: "latency-cdf",
        title: "Latency distribution per relay mode (cumulative)".into(),
        svg: plots::cdf(samples, "mode", "latency_ms", axes, "events")?,
    }])
}
