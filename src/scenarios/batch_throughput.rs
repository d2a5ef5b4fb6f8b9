//! batch-throughput (バッチサイズと処理量): 10,000 events delivered by one relay to a Redis Stream
//! and to the HTTP consumer at batch sizes 1, 10, 100 and 1000. A batch of 1 pays a fetch, an
//! UPDATE and a COMMIT per event; throughput levels off around 100. Each cell is run several
//! times and the median reported (this machine is noisy); the same cells serve as the relay's
//! benchmark: run before and after a change.

use std::time::Instant;

use anyhow::{bail, Result};
use redis::AsyncCommands;
use serde::Deserialize;

use super::{Ctx, Experiment, Outcome, CHILD_TIMEOUT};
use crate::connect;
use crate::harness::child::ChildEnd;
use crate::judge::{counts, median};
use crate::outbox::consumer::{ConsumerKind, Faults};
use crate::outbox::relay::RelayConfig;
use crate::outbox::schema;
use crate::outbox::sink::RedisSink;
use crate::outbox::writer;
use crate::report::plots::{self, Axes, Plot};
use crate::report::{Report, Table};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub events: i64,
    pub batch_sizes: Vec<i64>,
    /// "redis" and/or "http".
    pub sinks: Vec<String>,
    /// Runs per cell; the median is reported.
    pub runs: u32,
    /// Aggregates the relay delivers to at once over HTTP (every event here is its own aggregate).
    pub http_in_flight: u32,
}

impl Experiment for Params {
    async fn run(&self, ctx: &Ctx<'_>) -> Result<Outcome> {
        run(ctx, self).await
    }

    fn plots(report: &Report) -> Result<Vec<Plot>> {
        throughput_by_batch(report)
    }
}

pub async fn run(ctx: &Ctx<'_>, params: &Params) -> Result<Outcome> {
    let mut outcome = Outcome::default();
    let mut table = Table::new(
        format!(
            "{} events, one relay, median of {} runs",
            params.events, params.runs
        ),
        &[
            "sink",
            "batch",
            "events_per_s",
            "elapsed_ms",
            "runs (events/s)",
        ],
    );
    let cells = params.sinks.len() * params.batch_sizes.len() * params.runs as usize;
    let bar = ctx.progress().bar(cells as u64, "batch-throughput cells");
    for sink in &params.sinks {
        let db = ctx.database(sink).await?;
        let client = db.connect().await?;
        // The HTTP consumer stays up across runs; Redis is the run's server.
        let (url, consumer, mut redis) = match sink.as_str() {
            "http" => {
                let consumer = ctx
                    .start_consumer(&db, ConsumerKind::Naive, &Faults::default())
                    .await?;
                (consumer.url.clone(), Some(consumer), None)
            }
            "redis" => {
                let url = ctx.redis_url().await?;
                let redis = connect::redis(&url).await?;
                (url, None, Some(redis))
            }
            other => bail!("unknown sink '{other}' in sinks (redis, http)"),
        };
        let stream = RedisSink::stream_name(ctx.redis_key_prefix(), "orders");
        for &batch in &params.batch_sizes {
            let mut rates = Vec::new();
            let mut elapsed = Vec::new();
            for run in 0..params.runs {
                bar.set_message(format!("{sink} batch {batch}, run {}", run + 1));
                client.batch_execute(schema::RESET).await?;
                if let Some(redis) = redis.as_mut() {
                    let _: i64 = redis.del(&stream).await?;
                }
                client
                    .execute(writer::LOAD_EVENTS, &[&params.events])
                    .await?;
                let config = RelayConfig {
                    batch,
                    ..RelayConfig::default()
                };
                let relay = ctx
                    .relay(&db, &url, &run.to_string(), &config)
                    .with(|relay| relay.sink.in_flight = params.http_in_flight as usize);
                let started = Instant::now();
                relay
                    .run(CHILD_TIMEOUT)
                    .await?
                    .expect(|e| *e == ChildEnd::Ok, "the relay")?;
                let seconds = started.elapsed().as_secs_f64();
                let delivered = match redis.as_mut() {
                    Some(redis) => redis.xlen(&stream).await?,
                    None => counts::count(&client, counts::RECEIVED).await?,
                };
                let published = counts::count(&client, counts::PUBLISHED).await?;
                if delivered != params.events || published != params.events {
                    bail!(
                        "{sink} batch {batch}: {delivered} delivered, {published} published of {}",
                        params.events
                    );
                }
                rates.push(params.events as f64 / seconds);
                elapsed.push(seconds * 1000.0);
                bar.inc(1);
            }
            let name = format!("{sink}.batch{batch}");
            let rate = median(&rates);
            let elapsed_ms = median(&elapsed);
            outcome
                .metrics
                .set(format!("{name}.events_per_s"), rate.round());
            outcome
                .metrics
                .set(format!("{name}.elapsed_ms"), elapsed_ms.round());
            let each: Vec<String> = rates.iter().map(|r| format!("{r:.0}")).collect();
            table.push(vec![
                sink.clone(),
                batch.to_string(),
                format!("{rate:.0}"),
                format!("{elapsed_ms:.0}"),
                each.join(" "),
            ]);
        }
        if let Some(consumer) = consumer {
            consumer.stop().await?;
        }
    }
    bar.finish_and_clear();
    outcome.tables.push(table);
    Ok(outcome)
}

/// Events per second against batch size, a line per sink, from the table of cells.
fn throughput_by_batch(report: &Report) -> Result<Vec<Plot>> {
    let Some(cells) = plots::table_with(report, &["sink", "batch", "events_per_s"]) else {
        return Ok(Vec::new());
    };
    let axes = Axes {
        x: "batch size (rows per fetch, log scale)",
        y: "events per second",
    };
    Ok(vec![Plot {
        id: "throughput-by-batch",
        title: "Throughput against batch size, per sink".into(),
        svg: plots::log_x_lines(cells, "sink", "batch", "events_per_s", axes)?,
    }])
}
