//! batch-throughput (バッチサイズと処理量): events delivered by one relay at batch sizes 1, 10,
//! 100 and 1000, about a second of work per cell (more events at larger batches: `batches_per_cell`
//! batches, at most `max_events`, fewer where the sink or a round trip per event bounds the
//! cell) — nowhere (`db_only`, the ceiling: the relay's database work alone), to a Redis Stream (a pipeline per batch), to the HTTP consumer one event per request as
//! the article's relay posts them, or a batch per request (an array body the consumer applies
//! in one transaction), to NATS JetStream and to RabbitMQ (the batch's publishes in flight,
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

use std::collections::HashMap;

use anyhow::{anyhow, bail, Result};
use lapin::options::QueuePurgeOptions;
use redis::AsyncCommands;
use serde::Deserialize;
use tokio_postgres::Client;

use super::{metric_names, Ctx, Experiment, Outcome, CHILD_TIMEOUT};
use crate::connect;
use crate::harness::child::{ChildEnd, ConsumerProcess};
use crate::harness::db::Database;
use crate::judge::{counts, median};
use crate::outbox::consumer::{ConsumerKind, Faults};
use crate::outbox::relay::{BatchTimings, RelayConfig};
use crate::outbox::schema;
use crate::outbox::sink::{AmqpSink, HttpBody, NatsSink, RedisSink, DISCARD_URL};
use crate::outbox::writer;
use crate::report::plots::{self, Axes, Plot};
use crate::report::{Report, Table};

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
    /// flight (Redis, NATS, RabbitMQ), each value a series of its own: 1 is the article's relay;
    /// N splits the aggregates between N loops of one process (partitioned, each its own
    /// database connection and one batch's locks at a time), so one delivers while another
    /// waits for its COMMIT or its broker.
    pub pipeline_workers: Vec<u32>,
}

impl Experiment for Params {
    fn metrics(&self) -> Vec<String> {
        let cells = Cell::all(self);
        let mut metrics = metric_names(
            cells.iter().map(Cell::metric),
            &["events_per_s", "elapsed_ms"],
        );
        let fractions = cells.iter().filter(|cell| cell.ceiling(&cells).is_some());
        metrics.extend(metric_names(fractions.map(Cell::metric), &["of_ceiling"]));
        metrics
    }

    fn validate(&self) -> Result<()> {
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
            bail!("sinks must name at least one of db_only, redis, http, http_array, nats, amqp");
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
        throughput_by_batch(report)
    }
}

/// One configuration measured: a sink, a batch size, (HTTP) the events in flight and (the
/// ceiling, Redis and the brokers) the relay's workers.
#[derive(Debug, Clone, Copy)]
struct Cell {
    sink: SinkKind,
    batch: i64,
    /// Events sent and not yet acknowledged at once by one worker: the batch's pipeline for
    /// Redis.
    in_flight: i64,
    /// The relay's delivery loops, each its partition of the aggregates.
    workers: u32,
}

impl Cell {
    /// Every cell of the parameters, in table order.
    fn all(params: &Params) -> Vec<Cell> {
        let mut cells = Vec::new();
        for &sink in &params.sinks {
            for &batch in &params.batch_sizes {
                match sink {
                    // An array of one is one event per request: the http cell measures it.
                    SinkKind::HttpArray if batch == 1 => {}
                    SinkKind::DbOnly | SinkKind::Redis | SinkKind::Nats | SinkKind::Amqp => cells
                        .extend(params.pipeline_workers.iter().map(|&workers| Cell {
                            sink,
                            batch,
                            in_flight: batch,
                            workers,
                        })),
                    SinkKind::HttpArray => cells.push(Cell {
                        sink,
                        batch,
                        in_flight: batch,
                        workers: 1,
                    }),
                    SinkKind::Http => cells.extend(
                        params
                            .http_in_flight
                            .iter()
                            .map(|&n| i64::from(n))
                            .filter(|&n| n <= batch)
                            .map(|in_flight| Cell {
                                sink,
                                batch,
                                in_flight,
                                workers: 1,
                            }),
                    ),
                }
            }
        }
        cells
    }

    /// How many events it delivers.
    fn events(&self, params: &Params) -> i64 {
        let sink_bound = params.max_events_by_sink.get(&self.sink).copied();
        let serial = (self.in_flight == 1).then_some(params.serial_events);
        [sink_bound, serial].into_iter().flatten().fold(
            (self.batch * params.batches_per_cell).min(params.max_events),
            i64::min,
        )
    }

    /// The ceiling cell of its batch size and workers, where `cells` has one (and it is not
    /// one itself).
    fn ceiling(&self, cells: &[Cell]) -> Option<usize> {
        if self.sink == SinkKind::DbOnly {
            return None;
        }
        cells.iter().position(|other| {
            other.sink == SinkKind::DbOnly
                && other.batch == self.batch
                && other.workers == self.workers
        })
    }

    /// The prefix of its metrics: `redis.batch100` (one worker, as the article's relay),
    /// `db_only.batch100` (its ceiling),
    /// `redis.batch100.workers2`, `http.batch100` (one request at a time, as the article's relay
    /// sends them), `http.batch100.in_flight16`.
    fn metric(&self) -> String {
        let name = format!("{}.batch{}", self.sink.name(), self.batch);
        match self.sink {
            SinkKind::Http if self.in_flight > 1 => format!("{name}.in_flight{}", self.in_flight),
            _ if self.workers > 1 => format!("{name}.workers{}", self.workers),
            _ => name,
        }
    }
}

/// Where the cells of one sink deliver: its database (reset before every run), its URL and
/// what counts the deliveries.
struct Target {
    db: Database,
    client: Client,
    url: String,
    receiver: Receiver,
}

/// What receives a sink's events, and counts them after a run.
enum Receiver {
    /// Nothing (the ceiling): every event the relay marked published is one the sink took.
    Nowhere,
    /// The HTTP consumer, up for every run; it counts in the target's database.
    Consumer(ConsumerProcess),
    /// A Redis Stream, cleared before every run.
    Redis {
        connection: redis::aio::MultiplexedConnection,
        stream: String,
    },
    /// A JetStream stream capturing the run's subjects, purged before every run and deleted
    /// at the end.
    Nats {
        jetstream: async_nats::jetstream::Context,
        stream: String,
    },
    /// A durable RabbitMQ queue, purged before every run.
    Amqp {
        channel: lapin::Channel,
        queue: String,
    },
}

impl Target {
    /// The database and the server behind `sink`'s cells (and those of its [`SinkKind::server`]).
    async fn start(ctx: &Ctx<'_>, sink: SinkKind) -> Result<Target> {
        let db = ctx.database(sink.server().name()).await?;
        let client = db.connect().await?;
        let (url, receiver) = match sink.server() {
            SinkKind::DbOnly => (DISCARD_URL.to_string(), Receiver::Nowhere),
            SinkKind::Redis => {
                let url = ctx.redis_url().await?;
                let connection = connect::redis(&url).await?;
                let stream = RedisSink::stream_name(ctx.redis_key_prefix(), "orders");
                (url, Receiver::Redis { connection, stream })
            }
            SinkKind::Nats => {
                let url = ctx.nats_url().await?;
                let jetstream = async_nats::jetstream::new(connect::nats(&url).await?);
                let stream = format!("{}outbox_throughput", ctx.nats_name_prefix());
                let config = NatsSink::stream_config(&stream, ctx.nats_subject_prefix());
                NatsSink::create_fresh_stream(&jetstream, config).await?;
                (url, Receiver::Nats { jetstream, stream })
            }
            SinkKind::Amqp => {
                let url = ctx.amqp().url().await?;
                let queue = ctx
                    .amqp()
                    .declare_queue(&AmqpSink::queue_name("", "orders"))
                    .await?;
                let channel = connect::amqp(&url).await?.create_channel().await?;
                (url, Receiver::Amqp { channel, queue })
            }
            SinkKind::Http | SinkKind::HttpArray => {
                let consumer = ctx
                    .start_consumer(&db, ConsumerKind::Naive, &Faults::default())
                    .await?;
                (consumer.url.clone(), Receiver::Consumer(consumer))
            }
        };
        Ok(Target {
            db,
            client,
            url,
            receiver,
        })
    }

    /// Nothing received yet: the stream emptied (the consumer's tables go with the schema).
    async fn clear(&mut self) -> Result<()> {
        match &mut self.receiver {
            Receiver::Nowhere | Receiver::Consumer(_) => {}
            Receiver::Redis { connection, stream } => {
                let _: i64 = connection.del(&*stream).await?;
            }
            Receiver::Nats { jetstream, stream } => {
                jetstream
                    .get_stream(&*stream)
                    .await
                    .map_err(|e| anyhow!("JetStream stream {stream}: {e}"))?
                    .purge()
                    .await
                    .map_err(|e| anyhow!("cannot purge JetStream stream {stream}: {e}"))?;
            }
            Receiver::Amqp { channel, queue } => {
                channel
                    .queue_purge(queue.as_str().into(), QueuePurgeOptions::default())
                    .await
                    .map_err(|e| anyhow!("cannot purge queue {queue}: {e}"))?;
            }
        }
        Ok(())
    }

    /// What the sink received since [`Target::clear`].
    async fn delivered(&mut self) -> Result<i64> {
        Ok(match &mut self.receiver {
            Receiver::Nowhere => counts::count(&self.client, counts::PUBLISHED).await?,
            Receiver::Consumer(_) => counts::count(&self.client, counts::RECEIVED).await?,
            Receiver::Redis { connection, stream } => connection.xlen(&*stream).await?,
            Receiver::Nats { jetstream, stream } => {
                let info = jetstream
                    .get_stream(&*stream)
                    .await
                    .map_err(|e| anyhow!("JetStream stream {stream}: {e}"))?
                    .info()
                    .await
                    .map_err(|e| anyhow!("cannot read JetStream stream {stream}: {e}"))?
                    .clone();
                info.state.messages as i64
            }
            Receiver::Amqp { channel, queue } => AmqpSink::ready_messages(channel, queue).await?,
        })
    }

    async fn stop(self) -> Result<()> {
        match self.receiver {
            Receiver::Consumer(consumer) => consumer.stop().await,
            // The queue is the run's (deleted with an external broker's at the end).
            Receiver::Nowhere | Receiver::Redis { .. } | Receiver::Amqp { .. } => Ok(()),
            Receiver::Nats { jetstream, stream } => {
                jetstream
                    .delete_stream(&stream)
                    .await
                    .map_err(|e| anyhow!("cannot delete JetStream stream {stream}: {e}"))?;
                Ok(())
            }
        }
    }
}

/// A cell's runs, round after round.
#[derive(Clone, Default)]
struct Runs(Vec<BatchTimings>);

impl Runs {
    fn rate(timings: &BatchTimings) -> f64 {
        timings.events as f64 / timings.busy.as_secs_f64()
    }

    /// Events per second, round after round.
    fn rates(&self) -> Vec<f64> {
        self.0.iter().map(Runs::rate).collect()
    }

    /// The run of the median rate, whose phases the table shows.
    fn middle(&self) -> &BatchTimings {
        let mut by_rate: Vec<&BatchTimings> = self.0.iter().collect();
        by_rate.sort_by(|a, b| Runs::rate(a).total_cmp(&Runs::rate(b)));
        by_rate[by_rate.len() / 2]
    }
}

/// The smallest and the largest of `values`, as `min-max` with `decimals`.
fn spread(values: &[f64], decimals: usize) -> String {
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{min:.decimals$}-{max:.decimals$}")
}

pub async fn run(ctx: &Ctx<'_>, params: &Params) -> Result<Outcome> {
    let cells = Cell::all(params);
    let mut targets: Vec<(SinkKind, Target)> = Vec::new();
    for server in params.sinks.iter().map(|sink| sink.server()) {
        if targets.iter().all(|(started, _)| *started != server) {
            targets.push((server, Target::start(ctx, server).await?));
        }
    }
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
            let (_, target) = targets
                .iter_mut()
                .find(|(server, _)| *server == cell.sink.server())
                .expect("a target per sink");
            runs[i].0.push(measure(ctx, params, cell, target).await?);
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    for (_, target) in targets {
        target.stop().await?;
    }

    let mut outcome = Outcome::default();
    let mut figures = Table::new(
        format!(
            "one relay, median of {} runs and their min-max (timed by the relay: first fetch to \
             last commit); of_ceiling: of db_only's at the same batch size and workers",
            params.runs
        ),
        &[
            "sink",
            "batch",
            "in_flight",
            "workers",
            "events",
            "events_per_s",
            "min-max",
            "of_ceiling",
            "of_ceiling min-max",
            "elapsed_ms",
        ],
    );
    let mut phases = Table::new(
        "where the time goes: the middle run of each cell, per batch and as a share of its time \
         (with workers, of the time of all its workers together)",
        &[
            "sink",
            "batch",
            "in_flight",
            "workers",
            "batches",
            "ms_per_batch",
            "fetch_pct",
            "send_pct",
            "mark_pct",
            "commit_pct",
            "between_pct",
        ],
    );
    let mut ceiling_and_redis_phases: Vec<String> = Vec::new();
    let rates_by_cell: Vec<Vec<f64>> = runs.iter().map(Runs::rates).collect();
    for ((cell, runs), rates) in cells.iter().zip(&runs).zip(&rates_by_cell) {
        if matches!(cell.sink, SinkKind::DbOnly | SinkKind::Redis) && cell.batch >= 100 {
            ceiling_and_redis_phases.push(where_the_time_goes(cell, runs.middle()));
        }
        let rate = median(rates);
        let elapsed: Vec<f64> = runs.0.iter().map(|t| t.busy.as_secs_f64() * 1e3).collect();
        let elapsed_ms = median(&elapsed);
        let name = cell.metric();
        outcome
            .metrics
            .set(format!("{name}.events_per_s"), rate.round());
        outcome
            .metrics
            .set(format!("{name}.elapsed_ms"), elapsed_ms.round());
        // The median of the sink's runs over the median of the ceiling's; the spread, round by
        // round (each round's sink run over that round's ceiling run).
        let (of_ceiling, of_ceiling_spread) = match cell.ceiling(&cells) {
            Some(ceiling) => {
                let ceiling_rates = &rates_by_cell[ceiling];
                let fraction = rate / median(ceiling_rates);
                let fraction = (fraction * 100.0).round() / 100.0;
                outcome.metrics.set(format!("{name}.of_ceiling"), fraction);
                let by_round: Vec<f64> = rates
                    .iter()
                    .zip(ceiling_rates)
                    .map(|(sink, ceiling)| sink / ceiling)
                    .collect();
                (format!("{fraction:.2}"), spread(&by_round, 2))
            }
            None => ("-".to_string(), "-".to_string()),
        };
        let columns = [
            cell.sink.name().to_string(),
            cell.batch.to_string(),
            cell.in_flight.to_string(),
            match cell.workers {
                1 => "1".to_string(),
                n => format!("{n}, partitioned"),
            },
        ];
        figures.push(
            columns
                .iter()
                .cloned()
                .chain([
                    cell.events(params).to_string(),
                    format!("{rate:.0}"),
                    spread(rates, 0),
                    of_ceiling,
                    of_ceiling_spread,
                    format!("{elapsed_ms:.0}"),
                ])
                .collect(),
        );
        phases.push(
            columns
                .into_iter()
                .chain(phase_split(runs.middle()))
                .collect(),
        );
    }
    outcome.tables.push(figures);
    outcome.tables.push(phases);
    outcome.notes.push(
        "Each figure is events / the relay's own time from its first fetch to its last commit: \
         the child's start, its connections and the final empty fetch are outside it. \
         in_flight: events sent and not yet acknowledged at once (Redis: the batch's pipeline; \
         http_array: the batch in one request, applied by the consumer in one transaction). \
         db_only is the ceiling: the same relay, fetch, mark and one commit per batch, its sink \
         taking every event at once and delivering it nowhere — what this machine's PostgreSQL \
         allows. of_ceiling: a cell's median over the ceiling's median at its batch size and \
         workers, each ceiling run just before those cells in the same round; its min-max, round \
         by round."
            .into(),
    );
    if !ceiling_and_redis_phases.is_empty() {
        outcome.notes.push(format!(
            "Where the ceiling's and the Redis relay's time goes (the middle run; with workers, \
             shares of all their time): {}. fetch: BEGIN and the SELECT ... FOR UPDATE SKIP \
             LOCKED, which locks each row (a partitioned worker also reads and skips the other \
             partitions' rows); send: the events built and (Redis) the pipeline of XADDs \
             answered; mark: the UPDATE \
             of published_at, a new row version and a primary-key entry per row (never a HOT \
             update: published_at is in the partial index's predicate); commit: the WAL flush. \
             With one worker the phases follow one another and the relay waits on PostgreSQL \
             or Redis in each; with workers one worker's flush and round trips overlap \
             another's work, and the figure is then bounded by the CPU that PostgreSQL (fetch \
             and mark), Redis and the relay share on this machine.",
            ceiling_and_redis_phases.join("; ")
        ));
    }
    Ok(outcome)
}

/// A cell's phases in a few words: `redis batch 100, 1 worker: 3.7 ms per batch, fetch 19%,
/// send 24%, mark 31%, commit 25%`.
fn where_the_time_goes(cell: &Cell, timings: &BatchTimings) -> String {
    let [_, ms_per_batch, fetch, send, mark, commit, _] = phase_split(timings);
    let workers = match cell.workers {
        1 => "1 worker".to_string(),
        n => format!("{n} workers"),
    };
    format!(
        "{} batch {}, {workers}: {ms_per_batch} ms per batch, fetch {fetch}%, send {send}%, \
         mark {mark}%, commit {commit}%",
        cell.sink.name(),
        cell.batch
    )
}

/// One run of a cell: a fresh outbox of the cell's events, drained by a relay child, every event
/// counted delivered and published from the sink and the database; the relay's timings.
async fn measure(
    ctx: &Ctx<'_>,
    params: &Params,
    cell: &Cell,
    target: &mut Target,
) -> Result<BatchTimings> {
    target.client.batch_execute(schema::RESET).await?;
    target.clear().await?;
    let events = cell.events(params);
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
    let relay = ctx
        .relay(&target.db, &target.url, &cell.metric(), &config)
        .with(|relay| match cell.sink {
            SinkKind::Http => relay.sink.in_flight = cell.in_flight as usize,
            SinkKind::HttpArray => relay.sink.http_body = HttpBody::Array,
            SinkKind::DbOnly | SinkKind::Redis | SinkKind::Nats | SinkKind::Amqp => {}
        })
        .run(CHILD_TIMEOUT)
        .await?
        .expect(|e| *e == ChildEnd::Ok, "the relay")?;
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

/// A run's batches, and each phase's share of its time (what is left went between batches): with
/// workers, of their time together (busy × workers), and ms_per_batch is a worker's.
fn phase_split(timings: &BatchTimings) -> [String; 7] {
    let busy = timings.busy.as_secs_f64() * f64::from(timings.workers.max(1));
    let pct = |phase: std::time::Duration| phase.as_secs_f64() / busy * 100.0;
    let phases = [timings.fetch, timings.send, timings.mark, timings.commit];
    let between = 100.0 - phases.iter().map(|&p| pct(p)).sum::<f64>();
    [
        timings.batches.to_string(),
        format!("{:.3}", busy * 1e3 / timings.batches as f64),
        format!("{:.0}", pct(timings.fetch)),
        format!("{:.0}", pct(timings.send)),
        format!("{:.0}", pct(timings.mark)),
        format!("{:.0}", pct(timings.commit)),
        format!("{:.0}", between.max(0.0)),
    ]
}

/// Events per second against batch size, a line per sink and (one-event-per-request HTTP)
/// events in flight, from the table of cells.
fn throughput_by_batch(report: &Report) -> Result<Vec<Plot>> {
    let columns = ["sink", "batch", "in_flight", "events_per_s"];
    let Some(cells) = plots::table_with(report, &columns) else {
        return Ok(Vec::new());
    };
    let [sink, batch, in_flight, rate] = columns.map(|c| cells.column(c).expect("found above"));
    // Reports saved before the relay had workers have no such column: one worker.
    let workers = cells.column("workers");
    let mut lines = Table::new(cells.title.clone(), &["series", "batch", "events_per_s"]);
    for row in &cells.rows {
        // Redis and the brokers have their whole batch in flight: a line per number of workers.
        let series = match (row[sink].as_str(), workers.map(|w| row[w].as_str())) {
            ("http", _) => format!("http, {} in flight", row[in_flight]),
            (pipelined, Some(workers)) if workers != "1" => {
                format!(
                    "{pipelined}, {} workers",
                    workers.trim_end_matches(", partitioned")
                )
            }
            (other, _) => other.to_string(),
        };
        lines.push(vec![series, row[batch].clone(), row[rate].clone()]);
    }
    let axes = Axes {
        x: "batch size (rows per fetch, log scale)",
        y: "events per second",
    };
    Ok(vec![Plot {
        id: "throughput-by-batch",
        title: "Throughput against batch size, per sink and events in flight".into(),
        svg: plots::log_x_lines(&lines, "series", "batch", "events_per_s", axes)?,
    }])
}
