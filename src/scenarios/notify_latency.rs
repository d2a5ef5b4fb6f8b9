//! notify-latency (配送遅延とスループットの実測): orders written every 200 ms (on average), and
//! the delay from the outbox row's created_at to the consumer's received_at, for a relay polling
//! every 1000 ms and every 100 ms. Then the relay woken by LISTEN/NOTIFY (statement trigger,
//! 1 s fallback poll), timed over enough events that its p99 is not its maximum, to the HTTP
//! consumer and to a Redis stream, with each delivery's time split into phases. Then what each
//! relay costs the database while nothing happens (transactions in idle seconds), and what the
//! NOTIFY trigger costs writers (notifying commits queue up). The worst case is judged on the
//! windowed p95
//! ([`LatencySummary::windowed_p95_ms`](crate::judge::latency::LatencySummary::windowed_p95_ms)):
//! a stall of the whole machine delays the few deliveries waiting meanwhile, not the relay's way
//! of waking up.
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
//!
//! Here the parameters, the relay modes and their tables; [`mode`] times one mode,
//! [`commit_to_receipt`] splits the NOTIFY relay's deliveries into phases, [`trigger_cost`]
//! measures what the trigger costs writers.

mod commit_to_receipt;
mod mode;
mod trigger_cost;

use std::time::Duration;

use anyhow::{bail, Result};
use serde::Deserialize;

use super::{metric_names, Ctx, Experiment, Outcome, CHILD_TIMEOUT};
use crate::outbox::relay::Wakeup;
use crate::report::plots::{self, Axes, Plot};
use crate::report::{Report, Table};
use mode::Measured;

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
        let measured = mode::measure(ctx, params, mode).await?;
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
    trigger_cost::writer_throughput(ctx, params, &mut outcome).await?;
    bar.finish_and_clear();
    outcome.tables.push(samples);
    Ok(outcome)
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
