//! What batch-throughput's rounds come to: each cell's median rate and its spread, its fraction
//! of the ceiling, where its time went (the relay's phases), the notes that say how to read
//! them, and the plot drawn from the table of cells.

use anyhow::Result;

use super::cells::Cell;
use super::{Outcome, Params, SinkKind};
use crate::outbox::relay::BatchTimings;
use crate::report::plots::{self, Axes, Plot};
use crate::report::{Report, Table};
use crate::stats::{median, min_max, round_to};

/// A cell's runs, round after round.
#[derive(Clone, Default)]
pub(super) struct Runs(pub(super) Vec<BatchTimings>);

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
    let (min, max) = min_max(values);
    format!("{min:.decimals$}-{max:.decimals$}")
}

/// The metrics, the two tables and the notes of the cells' runs (`runs[i]` is `cells[i]`'s).
pub(super) fn outcome(params: &Params, cells: &[Cell], runs: &[Runs]) -> Outcome {
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
    for ((cell, runs), rates) in cells.iter().zip(runs).zip(&rates_by_cell) {
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
        let (of_ceiling, of_ceiling_spread) = match cell.ceiling(cells) {
            Some(ceiling) => {
                let ceiling_rates = &rates_by_cell[ceiling];
                let fraction = rate / median(ceiling_rates);
                let fraction = round_to(fraction, 100.0);
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
                    runs.middle().events.to_string(),
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
             answered; mark: what the UPDATE of published_at took beyond the send, beside \
             which it runs (a new row version and a primary-key entry per row, never a HOT \
             update: published_at is in the partial index's predicate); commit: the WAL flush. \
             With one worker the relay waits on PostgreSQL or Redis in each phase; with workers one worker's flush and round trips overlap \
             another's work, and the figure is then bounded by the CPU that PostgreSQL (fetch \
             and mark), Redis and the relay share on this machine.",
            ceiling_and_redis_phases.join("; ")
        ));
    }
    outcome
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
pub(super) fn throughput_by_batch(report: &Report) -> Result<Vec<Plot>> {
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
