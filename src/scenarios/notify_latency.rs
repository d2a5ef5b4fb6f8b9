//! notify-latency (配送遅延とスループットの実測): orders written every 200 ms (on average), and
//! the delay from the outbox row's created_at to the consumer's received_at, for a relay polling
//! every 1000 ms, every 100 ms, and one woken by LISTEN/NOTIFY (statement trigger, 1 s fallback
//! poll). Then what each costs the database while nothing happens (transactions in idle
//! seconds), and what the NOTIFY trigger costs writers (notifying commits queue up).

use std::time::Duration;

use anyhow::{bail, Result};
use serde::Deserialize;
use tokio::task::JoinHandle;

use super::{metric_names, Ctx, Experiment, Outcome, CHILD_TIMEOUT};
use crate::harness::child::{ChildEnd, ChildRun};
use crate::judge::counts;
use crate::judge::latency;
use crate::outbox::consumer::{ConsumerKind, Faults};
use crate::outbox::relay::{RelayConfig, Wakeup, RELAY_APPLICATION_NAME};
use crate::outbox::schema;
use crate::outbox::writer::Ending;
use crate::report::plots::{self, Axes, Plot};
use crate::report::{Report, Table};
use crate::wait;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub orders: u32,
    /// Average gap between orders.
    pub interval_ms: u64,
    /// Chooses the (reproducible) shifts of the write times around the average gap.
    pub seed: u64,
    pub poll_intervals_ms: Vec<u64>,
    pub notify_fallback_ms: u64,
    /// How long each relay is watched with nothing to do.
    pub idle_ms: u64,
    /// Concurrent writers for the trigger's cost, and how long they write.
    pub tps_writers: u32,
    pub tps_duration_ms: u64,
}

impl Experiment for Params {
    fn metrics(&self) -> Vec<String> {
        let mut modes: Vec<String> = self
            .poll_intervals_ms
            .iter()
            .map(|ms| format!("poll{ms}"))
            .collect();
        modes.push("notify".into());
        let figures = [
            "p50_ms",
            "p99_ms",
            "max_ms",
            "samples",
            "idle_xacts_10s",
            "insert_to_commit_p50_ms",
            "commit_to_receipt_p50_ms",
        ];
        let mut metrics = metric_names(modes, &figures);
        metrics.extend(metric_names(
            ["writer_tps"],
            &["with_trigger", "without_trigger"],
        ));
        metrics
    }

    async fn run(&self, ctx: &Ctx<'_>) -> Result<Outcome> {
        run(ctx, self).await
    }

    fn plots(report: &Report) -> Result<Vec<Plot>> {
        latency_cdf(report)
    }
}

/// A follow-mode relay runs until the scenario stops it; this only bounds a hang.
const RELAY_LIFETIME: Duration = Duration::from_secs(600);
/// Time for ended sessions to report their statistics before idle transactions are counted.
const STATS_SETTLE: Duration = Duration::from_millis(1500);
/// Bounds the wait for a relay to connect (and LISTEN) before the first order is written.
const RELAY_STARTUP_LIMIT: Duration = Duration::from_secs(30);
/// How often the database is looked at while waiting for the relay or its deliveries.
const WAIT_POLL: Duration = Duration::from_millis(5);

pub async fn run(ctx: &Ctx<'_>, params: &Params) -> Result<Outcome> {
    let mut outcome = Outcome::default();
    let mut table = Table::new(
        format!(
            "latency of {} orders, ~{} ms apart (created_at -> received_at)",
            params.orders, params.interval_ms
        ),
        &[
            "relay",
            "p50_ms",
            "p99_ms",
            "max_ms",
            "idle transactions per 10 s",
        ],
    );
    let mut modes: Vec<(String, Wakeup)> = params
        .poll_intervals_ms
        .iter()
        .map(|&ms| (format!("poll{ms}"), Wakeup::Poll(Duration::from_millis(ms))))
        .collect();
    let fallback = Duration::from_millis(params.notify_fallback_ms);
    modes.push(("notify".into(), Wakeup::Notify { fallback }));
    // Every sample, behind the percentiles: the page plots their distribution per mode.
    let mut samples = Table::new("latency of every event", &["mode", "seq", "latency_ms"]).detail();
    let bar = ctx.progress().bar(modes.len() as u64 + 1, "notify-latency");
    for (name, wakeup) in modes {
        bar.set_message(format!("relay {name}"));
        let row = measure_mode(ctx, params, &name, wakeup, &mut samples, &mut outcome).await?;
        table.push(row);
        bar.inc(1);
    }
    outcome.tables.push(table);
    bar.set_message("writers with and without trigger");
    writer_throughput(ctx, params, &mut outcome).await?;
    bar.finish_and_clear();
    outcome.tables.push(samples);
    Ok(outcome)
}

/// One relay mode: latencies while orders arrive, then transactions while idle.
async fn measure_mode(
    ctx: &Ctx<'_>,
    params: &Params,
    name: &str,
    wakeup: Wakeup,
    samples: &mut Table,
    outcome: &mut Outcome,
) -> Result<Vec<String>> {
    let db = ctx.database(name).await?;
    let client = db.connect().await?;
    if matches!(wakeup, Wakeup::Notify { .. }) {
        client.batch_execute(schema::NOTIFY_TRIGGER).await?;
    }
    let consumer = ctx
        .start_consumer(&db, ConsumerKind::Naive, &Faults::default())
        .await?;
    let relay = ctx
        .relay(&db, &consumer.url, "0", &RelayConfig::default())
        .with(|relay| relay.follow = Some(wakeup));
    let relay = tokio::spawn(relay.run(RELAY_LIFETIME));
    // Ready once its session waits after its first statement, the LISTEN for the NOTIFY relay.
    let session = format!("{RELAY_APPLICATION_NAME} 0");
    let ready = wait::up_to(RELAY_STARTUP_LIMIT, WAIT_POLL, async || {
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
            "the {name} relay was not ready within {RELAY_STARTUP_LIMIT:?}: {}",
            relay_end(relay).await
        );
    }

    ctx.writer(&db, params.orders, 1, Ending::Commit)
        .with(|writer| {
            writer.interval = Some(Duration::from_millis(params.interval_ms));
            writer.seed = params.seed;
        })
        .run(CHILD_TIMEOUT)
        .await?
        .expect(|e| *e == ChildEnd::Ok, "the writer")?;
    let delivered = wait::up_to(CHILD_TIMEOUT, WAIT_POLL, async || {
        if relay.is_finished() {
            return Ok(Some(false));
        }
        let received = counts::count(&client, counts::RECEIVED).await?;
        Ok((received >= i64::from(params.orders)).then_some(true))
    })
    .await?;
    if delivered != Some(true) {
        bail!(
            "the {name} relay did not deliver every order: {}",
            relay_end(relay).await
        );
    }

    let latency = latency::measure(&client).await?;
    let (p50, p99, max) = (latency.p50_ms, latency.p99_ms, latency.max_ms);
    // The floor under the latency: how much of it is the writer's own COMMIT.
    let breakdown = counts::one_row(&client, counts::LATENCY_BREAKDOWN_MS).await?;
    outcome.metrics.set_row(name, &breakdown);
    for (seq, latency_ms) in &latency.each_ms {
        samples.push(vec![
            name.to_string(),
            seq.to_string(),
            format!("{latency_ms:.3}"),
        ]);
    }

    // Nothing arrives now: every transaction is the relay looking for work. A backend that
    // reported statistics less than a second ago holds the rest back for up to 10 s: stop the
    // consumer (its sessions report as they end) and let that settle before counting.
    consumer.stop().await?;
    tokio::time::sleep(STATS_SETTLE).await;
    let before = counts::count(&client, counts::XACT_COMMIT).await?;
    tokio::time::sleep(Duration::from_millis(params.idle_ms)).await;
    let after = counts::count(&client, counts::XACT_COMMIT).await?;
    let idle_xacts_10s =
        ((after - before) as f64 * 10_000.0 / params.idle_ms as f64).round() as i64;
    relay.abort(); // drops the child, which kills it
    let _ = relay.await;

    outcome.metrics.set(format!("{name}.p50_ms"), p50);
    outcome.metrics.set(format!("{name}.p99_ms"), p99);
    outcome.metrics.set(format!("{name}.max_ms"), max);
    outcome
        .metrics
        .set(format!("{name}.samples"), latency.samples as i64);
    outcome
        .metrics
        .set(format!("{name}.idle_xacts_10s"), idle_xacts_10s);
    Ok(vec![
        name.to_string(),
        format!("{p50:.2}"),
        format!("{p99:.2}"),
        format!("{max:.2}"),
        idle_xacts_10s.to_string(),
    ])
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

/// Writers committing as fast as they can, with and without the NOTIFY trigger.
async fn writer_throughput(ctx: &Ctx<'_>, params: &Params, outcome: &mut Outcome) -> Result<()> {
    let mut table = Table::new(
        format!(
            "{} writers for {} ms (synchronous_commit on)",
            params.tps_writers, params.tps_duration_ms
        ),
        &["outbox", "orders_per_s"],
    );
    for (name, trigger) in [("without_trigger", false), ("with_trigger", true)] {
        let db = ctx.database(&format!("tps_{name}")).await?;
        let client = db.connect().await?;
        if trigger {
            client.batch_execute(schema::NOTIFY_TRIGGER).await?;
        }
        let mut writers = tokio::task::JoinSet::new();
        for _ in 0..params.tps_writers {
            let writer = ctx.writer(&db, 0, 1, Ending::Commit).with(|writer| {
                writer.duration = Some(Duration::from_millis(params.tps_duration_ms))
            });
            writers.spawn(writer.run(CHILD_TIMEOUT));
        }
        while let Some(ended) = writers.join_next().await {
            ended??.expect(|e| *e == ChildEnd::Ok, "a writer")?;
        }
        let per_s: f64 = client.query_one(counts::ORDERS_PER_S, &[]).await?.get(0);
        outcome
            .metrics
            .set(format!("writer_tps.{name}"), per_s.round());
        table.push(vec![name.replace('_', " "), format!("{per_s:.0}")]);
    }
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
