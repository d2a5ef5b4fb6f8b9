//! batch-throughput (バッチサイズと処理量): events delivered by one relay at batch sizes 1, 10,
//! 100 and 1000, about a second of work per cell (more events at larger batches:
//! `batches_per_cell` batches, at most `max_events`, fewer where the sink or a round trip per
//! event bounds the cell; scaled down on a machine slower than the one they are sized for,
//! [`Pace`]) — nowhere (`db_only`, the ceiling: the relay's database work alone), to a Redis
//! Stream (a pipeline per batch), to the HTTP consumer one event per request as the article's
//! relay posts them, or a batch per request (an array body the consumer applies in one
//! transaction), to NATS JetStream, to RabbitMQ and to Kafka (the batch's publishes in flight,
//! each acked or confirmed). A batch of 1 pays a fetch, an UPDATE and a COMMIT per event; throughput
//! levels off around 100.
//!
//! Honest figures: the relay times itself, from its first fetch to its last commit, phase by
//! phase ([`BatchTimings`]), so a figure leaves out the process's start and says where the time
//! went. Events in flight are an axis of their own: one-event-per-request HTTP is compared
//! across batch sizes at one concurrency (each `http_in_flight` value a series), never batch 1
//! one at a time against batch 100 sixteen at a time. Each cell runs `runs` times, the rounds
//! interleaved (a slow moment of a shared machine hits every cell alike), and the median is
//! reported with the spread; the same cells serve as the relay's benchmark: run before and after
//! a change.
//!
//! The ceiling: `db_only` cells run the same relay loop — the same fetch, the same mark, one
//! commit per batch — with a sink that takes every event at once and delivers it nowhere
//! ([`Sink::Discard`](crate::outbox::sink::Sink::Discard)): what this machine's PostgreSQL
//! allows the relay. Each sink's figure is also a fraction of the ceiling of its batch size and
//! workers (`of_ceiling`), the ceiling measured in the same rounds, just before that batch size's
//! and workers' sink cells, so that a busy moment of a shared machine weighs on both.
//!
//! Here the parameters, the rounds and one run of a cell; [`cells`] what is measured,
//! [`target`] where it is delivered and counted, [`tables`] what the runs come to.

mod cells;
mod tables;
mod target;

use std::collections::HashMap;

use anyhow::{bail, Result};
use serde::Deserialize;

use super::{metric_names, Ctx, Experiment, Outcome, CHILD_TIMEOUT};
use crate::harness::child::ChildEnd;
use crate::harness::link::postgres::PgProxy;
use crate::judge::counts;
use crate::outbox::relay::{BatchTimings, RelayConfig};
use crate::outbox::schema;
use crate::outbox::sink::HttpBody;
use crate::outbox::writer;
use crate::report::plots::Plot;
use crate::report::Report;
use crate::stats::round_to;
use cells::Cell;
use tables::Runs;
use target::Target;

/// Where the relay delivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SinkKind {
    /// Nowhere, every event taken at once: the relay's fetch, mark and commit alone, the
    /// ceiling the others are fractions of.
    DbOnly,
    /// XADD, a pipeline per batch: the whole batch is in flight at once.
    Redis,
    /// The consumer, one event per request (the article's relay), `http_in_flight` at once.
    Http,
    /// The consumer, a batch per request (an array body the consumer applies in one
    /// transaction): the whole batch is in flight at once.
    HttpArray,
    /// JetStream publishes with `Nats-Msg-Id`, the whole batch in flight, each publish acked.
    Nats,
    /// RabbitMQ: persistent messages to a durable queue, the whole batch in flight, each
    /// publisher-confirmed.
    Amqp,
    /// Kafka: records keyed by aggregate to a topic of 3 partitions, a Produce request per
    /// partition with the batch's records for it, all in flight at once, each acked by all
    /// in-sync replicas.
    Kafka,
}

impl SinkKind {
    fn name(self) -> &'static str {
        match self {
            SinkKind::DbOnly => "db_only",
            SinkKind::Redis => "redis",
            SinkKind::Http => "http",
            SinkKind::HttpArray => "http_array",
            SinkKind::Nats => "nats",
            SinkKind::Amqp => "amqp",
            SinkKind::Kafka => "kafka",
        }
    }

    /// Where it delivers: nowhere, Redis, or the HTTP consumer (one for both HTTP bodies).
    fn server(self) -> SinkKind {
        match self {
            SinkKind::HttpArray => SinkKind::Http,
            other => other,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// A cell's events are this many batches (at most `max_events`): about a second of the
    /// relay's work where the database bounds it, since larger batches go faster. A short cell
    /// measures its start more than its pace.
    pub batches_per_cell: i64,
    pub max_events: i64,
    /// At most this many events to these sinks, bounded by their server at a few thousand
    /// events per second: a second or more of their work all the same.
    #[serde(default)]
    pub max_events_by_sink: HashMap<SinkKind, i64>,
    /// At most this many events where one event is in flight at a time (HTTP one request at a
    /// time): each event is a round trip (and a commit of the consumer), so its cost per event
    /// is what the cell measures, and a whole cell of them would take most of the scenario's
    /// time.
    pub serial_events: i64,
    pub batch_sizes: Vec<i64>,
    pub sinks: Vec<SinkKind>,
    /// Runs per cell; the median is reported.
    pub runs: u32,
    /// Events one-event-per-request HTTP has in flight at once (every event here is its own
    /// aggregate, so the relay may send them side by side), each value a series of its own. A
    /// value above a batch size is left out at that size: a batch cannot have more in flight
    /// than it holds.
    pub http_in_flight: Vec<u32>,
    /// The delivery loops ([`RelayConfig::workers`]) of the relays whose whole batch is in
    /// flight (Redis, NATS, RabbitMQ, Kafka), each value a series of its own: 1 is the article's relay;
    /// N splits the aggregates between N loops of one process (partitioned, each its own
    /// database connection and one batch's locks at a time), so one delivers while another
    /// waits for its COMMIT or its broker.
    pub pipeline_workers: Vec<u32>,
    /// The relay reaches its database through a [database link](crate::harness::link::postgres)
    /// (as under `verify`), not straight: what the extra hop costs, cell by cell.
    #[serde(default)]
    pub database_link: bool,
    /// The ceiling (events per second at batch 100, one worker) the cells' events are sized
    /// for: where a probe before the rounds measures less, every cell's events are scaled by
    /// the probe over this (at least [`MIN_PACE`]), so that a cell takes about as long on a
    /// slower machine as here. 0: every cell's events as the parameters say.
    #[serde(default)]
    pub sized_for_ceiling: i64,
}

impl Params {
    /// Whether the cells are sized to this machine's pace (a probe runs before the rounds).
    fn paced(&self) -> bool {
        self.sized_for_ceiling > 0
    }
}

/// The smallest scale of a cell's events, however slow the probe: the slowest machine of this
/// kind measured 0.41, and the checks' margins were studied at 0.4 (docs/scenarios.md); a probe
/// slower still is a busy moment, not a machine's pace.
const MIN_PACE: f64 = 0.4;

/// The probe of this machine's pace: the ceiling at batch 100, one worker, its events as the
/// parameters say, run this many times (the best: a stall of a shared machine slows one).
const PACE_PROBES: usize = 2;

impl Experiment for Params {
    fn metrics(&self) -> Vec<String> {
        let cells = Cell::all(self);
        let mut metrics = metric_names(
            cells.iter().map(Cell::metric),
            &["events_per_s", "elapsed_ms"],
        );
        let fractions = cells.iter().filter(|cell| cell.ceiling(&cells).is_some());
        metrics.extend(metric_names(fractions.map(Cell::metric), &["of_ceiling"]));
        if self.paced() {
            metrics.extend(metric_names(["pace"], &["ceiling_events_per_s", "scale"]));
        }
        metrics
    }

    fn validate(&self) -> Result<()> {
        if self.sized_for_ceiling < 0 {
            bail!("sized_for_ceiling must be 0 (no scaling) or events per second");
        }
        let limits = [self.batches_per_cell, self.max_events, self.serial_events];
        if limits
            .iter()
            .chain(self.max_events_by_sink.values())
            .any(|&n| n < 1)
            || self.runs < 1
        {
            bail!(
                "batches_per_cell, max_events, max_events_by_sink, serial_events and runs must \
                 be at least 1"
            );
        }
        if self.batch_sizes.is_empty() || self.batch_sizes.iter().any(|&b| b < 1) {
            bail!("batch_sizes must be at least one size, each at least 1");
        }
        if self.sinks.is_empty() {
            bail!(
                "sinks must name at least one of db_only, redis, http, http_array, nats, amqp, \
                 kafka"
            );
        }
        if self.http_in_flight.is_empty() || self.http_in_flight.contains(&0) {
            bail!("http_in_flight must be at least one value, each at least 1");
        }
        if self.pipeline_workers.is_empty() || self.pipeline_workers.contains(&0) {
            bail!("pipeline_workers must be at least one value, each at least 1");
        }
        Ok(())
    }

    async fn run(&self, ctx: &Ctx<'_>) -> Result<Outcome> {
        run(ctx, self).await
    }

    fn plots(report: &Report) -> Result<Vec<Plot>> {
        tables::throughput_by_batch(report)
    }
}

pub async fn run(ctx: &Ctx<'_>, params: &Params) -> Result<Outcome> {
    let cells = Cell::all(params);
    let mut targets: Vec<(SinkKind, Target)> = Vec::new();
    let paced = params.paced();
    let servers = params.sinks.iter().map(|sink| sink.server());
    for server in servers.chain(paced.then_some(SinkKind::DbOnly)) {
        if targets.iter().all(|(started, _)| *started != server) {
            targets.push((server, Target::start(ctx, server).await?));
        }
    }
    let pace = match paced {
        true => Some(Pace::probe(ctx, params, target_of(&mut targets, SinkKind::DbOnly)).await?),
        false => None,
    };
    let scale = pace.as_ref().map_or(1.0, |pace| pace.scale);
    let mut runs: Vec<Runs> = vec![Runs::default(); cells.len()];
    let bar = ctx.progress().bar(
        (cells.len() * params.runs as usize) as u64,
        "batch-throughput cells",
    );
    // In every round each batch size's and worker count's ceiling runs just before its sinks'
    // cells: ceiling, sinks, ceiling, sinks, round after round.
    let mut order: Vec<usize> = (0..cells.len()).collect();
    order.sort_by_key(|&i| {
        let cell = &cells[i];
        (cell.batch, cell.workers, cell.sink != SinkKind::DbOnly)
    });
    for round in 1..=params.runs {
        for &i in &order {
            let cell = &cells[i];
            bar.set_message(format!("{}, round {round}", cell.metric()));
            let target = target_of(&mut targets, cell.sink);
            let events = cell.events(params, scale);
            runs[i]
                .0
                .push(measure(ctx, params, cell, events, target).await?);
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    for (_, target) in targets {
        target.stop().await?;
    }
    let mut outcome = tables::outcome(params, &cells, &runs);
    if let Some(pace) = pace {
        pace.record(params, &mut outcome);
    }
    Ok(outcome)
}

/// Where `sink`'s cells deliver, of the targets started.
fn target_of(targets: &mut [(SinkKind, Target)], sink: SinkKind) -> &mut Target {
    let at = targets
        .iter()
        .position(|(server, _)| *server == sink.server());
    at.map(|at| &mut targets[at].1).expect("a target per sink")
}

/// This machine's pace against the one the cells are sized for: the ceiling at batch 100 (one
/// worker), the best of [`PACE_PROBES`] runs, and the scale of every cell's events it gives.
struct Pace {
    ceiling: f64,
    scale: f64,
}

impl Pace {
    async fn probe(ctx: &Ctx<'_>, params: &Params, target: &mut Target) -> Result<Pace> {
        let cell = Cell {
            sink: SinkKind::DbOnly,
            batch: 100,
            in_flight: 100,
            workers: 1,
        };
        let mut ceiling: f64 = 0.0;
        for _ in 0..PACE_PROBES {
            let timings = measure(ctx, params, &cell, cell.events(params, 1.0), target).await?;
            ceiling = ceiling.max(timings.events as f64 / timings.busy.as_secs_f64());
        }
        let scale = Pace::scale(ceiling, params.sized_for_ceiling);
        Ok(Pace { ceiling, scale })
    }

    /// The scale of every cell's events where the probe measured `ceiling` against `sized_for`.
    fn scale(ceiling: f64, sized_for: i64) -> f64 {
        (ceiling / sized_for as f64).clamp(MIN_PACE, 1.0)
    }

    fn record(&self, params: &Params, outcome: &mut Outcome) {
        let metrics = &mut outcome.metrics;
        metrics.set("pace.ceiling_events_per_s", self.ceiling.round());
        metrics.set("pace.scale", round_to(self.scale, 100.0));
        outcome.notes.push(format!(
            "Cells sized for a ceiling of {} events/s at batch 100 (one worker); this machine's, \
             the best of {PACE_PROBES} probes before the rounds: {:.0}. {}",
            params.sized_for_ceiling,
            self.ceiling,
            match self.scale < 1.0 {
                true => format!(
                    "Every cell's events were scaled by {:.2} (at least {MIN_PACE}), so that a \
                     cell takes about as long as where the ceiling is met",
                    self.scale
                ),
                false => "Every cell's events as the parameters say".to_string(),
            }
        ));
    }
}

/// One run of a cell: a fresh outbox of `events` events, drained by a relay child, every event
/// counted delivered and published from the sink and the database; the relay's timings.
async fn measure(
    ctx: &Ctx<'_>,
    params: &Params,
    cell: &Cell,
    events: i64,
    target: &mut Target,
) -> Result<BatchTimings> {
    target.client.batch_execute(schema::RESET).await?;
    target.clear().await?;
    target
        .client
        .execute(writer::LOAD_EVENTS, &[&events])
        .await?;
    // The planner's statistics, as autovacuum keeps them on any table in use: a fresh table's
    // first fetches would otherwise read and sort every row loaded to find the oldest batch (a
    // plan from no statistics at all), a cost of a table created a moment ago, not of the relay.
    target.client.batch_execute("ANALYZE outbox").await?;
    let config = RelayConfig {
        batch: cell.batch,
        workers: cell.workers,
        ..RelayConfig::default()
    };
    let link = match params.database_link {
        true => Some(PgProxy::start(&target.db.config()?, 1, None).await?),
        false => None,
    };
    let db = match &link {
        Some(proxy) => proxy.link(0).database(&target.db)?,
        None => target.db.clone(),
    };
    let relay = ctx
        .relay(&db, &target.url, &cell.metric(), &config)
        .with(|relay| match cell.sink {
            SinkKind::Http => relay.sink.in_flight = cell.in_flight as usize,
            SinkKind::HttpArray => relay.sink.http_body = HttpBody::Array,
            SinkKind::DbOnly
            | SinkKind::Redis
            | SinkKind::Nats
            | SinkKind::Amqp
            | SinkKind::Kafka => {}
        })
        .run(CHILD_TIMEOUT)
        .await?
        .expect(|e| *e == ChildEnd::Ok, "the relay")?;
    drop(link);
    let timings: BatchTimings = relay.report()?;
    let delivered = target.delivered().await?;
    let published = counts::count(&target.client, counts::PUBLISHED).await?;
    if delivered != events
        || published != events
        || timings.events as i64 != events
        || timings.workers != cell.workers
    {
        bail!(
            "{}: {delivered} delivered, {published} published, {} timed by the relay ({} workers), \
             of {events}",
            cell.metric(),
            timings.events,
            timings.workers,
        );
    }
    Ok(timings)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A machine at the ceiling the cells are sized for runs them as the parameters say; a
    /// slower one scales them by its pace, never below [`MIN_PACE`].
    #[test]
    fn cells_are_scaled_by_the_machines_pace() {
        assert_eq!(Pace::scale(120_000.0, 100_000), 1.0);
        assert_eq!(Pace::scale(50_000.0, 100_000), 0.5);
        assert_eq!(Pace::scale(10_000.0, 100_000), MIN_PACE);
        let toml = include_str!("../../scenarios/batch-throughput.toml");
        let file: toml::Table = toml.parse().unwrap();
        let params: Params = file["params"].clone().try_into().unwrap();
        for cell in Cell::all(&params) {
            let events = cell.events(&params, 1.0);
            assert_eq!(
                cell.events(&params, 0.5),
                (events as f64 * 0.5).round() as i64
            );
        }
    }
}
