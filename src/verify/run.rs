//! One run of verify through the lab: the schedule struck while the user's relays deliver,
//! then what the run's database says besides the verdict (latency and throughput of the
//! relays, the timeline of deliveries), measured before the next run resets it.

use std::time::Duration;

use anyhow::{Context, Result};
use tokio_postgres::Client;

use crate::explore::history::{Held, History};
use crate::explore::lab::Lab;
use crate::explore::schedule::Schedule;
use crate::stats::round_to;

/// The width of a bucket of the delivery timeline.
const TIMELINE_BUCKET_MS: i64 = 100;

/// One run, with what was measured on its database before the next run reset it.
pub struct VerifyRun {
    pub history: History,
    pub figures: Figures,
}

/// What the run's database says besides the verdict.
#[derive(Debug, Clone, Default)]
pub struct Figures {
    pub written: i64,
    pub delivered_distinct: i64,
    pub deliveries: i64,
    pub latency_p50_ms: f64,
    pub latency_p99_ms: f64,
    pub latency_max_ms: f64,
    pub events_per_s: f64,
    /// Whether latency starts at the commit (PostgreSQL's commit timestamps) or at the insert.
    pub from_commit: bool,
    /// Deliveries (first receipts) per [`TIMELINE_BUCKET_MS`], from the first commit.
    pub timeline: Vec<(i64, i64)>,
    /// How long the proxies held deliveries on their way while a nemesis struck, in all:
    /// harness time, taken out of each held event's latency.
    pub held_ms: f64,
}

impl Figures {
    /// Where latency starts: `commit` or `insert`.
    pub fn latency_from(&self) -> &'static str {
        match self.from_commit {
            true => "commit",
            false => "insert",
        }
    }
}

/// Everything verify ran, in order: the plan's schedule, then each of its nemeses alone where
/// it broke a claim (never empty).
pub struct Verification {
    /// The main run, then each of its nemeses alone where it broke a claim.
    pub runs: Vec<VerifyRun>,
    /// `--search`: the drawn schedules run before the main one, none breaking a claim.
    pub searched: Vec<VerifyRun>,
    /// Shrinking stopped at the time limit.
    pub cut_short: bool,
    pub elapsed: Duration,
}

impl Verification {
    /// The run of the plan's schedule.
    pub fn main(&self) -> &VerifyRun {
        &self.runs[0]
    }

    /// The runs of one nemesis alone, shrinking the main run's schedule.
    pub fn shrunk(&self) -> &[VerifyRun] {
        &self.runs[1..]
    }

    /// Why the main run is inconclusive (cut short by `--time-limit` before it drained), if it
    /// is: nothing but the safety invariants it broke is judged of it.
    pub fn inconclusive(&self) -> Option<&str> {
        self.main().history.cut_short.as_deref()
    }

    /// Histories of every run, the search's first, for `history::save`.
    pub fn histories(&self) -> Vec<History> {
        let all = self.searched.iter().chain(&self.runs);
        all.map(|run| run.history.clone()).collect()
    }
}

/// Runs `schedule` through the lab and measures what its database says.
pub(super) async fn once(lab: &Lab<'_>, schedule: &Schedule) -> Result<VerifyRun> {
    let history = lab.run(schedule).await?;
    let client = lab.judge_client().await?;
    let figures = measure(&client, &history.held)
        .await
        .context("cannot measure the run's deliveries")?;
    Ok(VerifyRun { history, figures })
}

/// Each event's commit (or insert, without commit timestamps) -> its first receipt, less the
/// time a proxy held it while a nemesis struck (`$1` event ids, `$2` ms: harness time).
macro_rules! latencies {
    ($committed:literal) => {
        concat!(
            "
WITH held AS (
  SELECT event_id, sum(ms) AS ms
    FROM unnest($1::text[], $2::float8[]) AS h(event_id, ms)
   GROUP BY event_id),
first_receipt AS (
  SELECT event_id, min(received_at) AS received_at
    FROM consumer.receipts
   WHERE NOT injected_fault
   GROUP BY event_id),
delivered AS (
  SELECT ",
            $committed,
            " AS committed_at, f.received_at, coalesce(h.ms, 0) AS held_ms
    FROM outbox o
    JOIN first_receipt f USING (event_id)
    JOIN orders ord ON ord.id::text = o.aggregate_id
    LEFT JOIN held h ON h.event_id = o.event_id::text)
SELECT count(*) AS delivered,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY ms) AS p50,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY ms) AS p99,
       max(ms) AS max,
       extract(epoch FROM max(received_at) - min(committed_at))::float8 AS span_s
  FROM (SELECT *, extract(epoch FROM received_at - committed_at)::float8 * 1000 - held_ms AS ms
          FROM delivered) d"
        )
    };
}

/// The order's COMMIT, as the application's database stamped it (the judge copied it: see
/// [`record`](crate::judge::record)).
const LATENCY_FROM_COMMIT: &str = latencies!("ord.committed_at");
const LATENCY_FROM_INSERT: &str = latencies!("o.created_at");

/// Whether every committed order has its commit timestamp (the server tracked them).
const HAS_COMMIT_TIMESTAMPS: &str =
    "SELECT coalesce(bool_and(committed_at IS NOT NULL), false) FROM orders";

/// The outbox's events, the consumer's distinct and total deliveries.
const COUNTS: &str = "
SELECT (SELECT count(*) FROM outbox) AS written,
       (SELECT count(DISTINCT event_id) FROM consumer.receipts WHERE NOT injected_fault)
         AS delivered_distinct,
       (SELECT count(*) FROM consumer.receipts WHERE NOT injected_fault) AS deliveries";

/// First receipts per bucket of `$1` ms from the first commit (the machine's clock, as the
/// receipts').
const TIMELINE: &str = "
WITH first_receipt AS (
  SELECT event_id, min(received_at) AS received_at
    FROM consumer.receipts WHERE NOT injected_fault GROUP BY event_id),
origin AS (SELECT min(committed_at) AS t0 FROM orders)
SELECT (extract(epoch FROM f.received_at - origin.t0) * 1000)::bigint / $1 * $1 AS bucket_ms,
       count(*) AS deliveries
  FROM first_receipt f, origin
 WHERE origin.t0 IS NOT NULL
 GROUP BY 1 ORDER BY 1";

/// What the run's judge says (`client`, a session of the judge's: the committed orders and
/// events, the consumer's receipts): counts, latency (less the time `held` was held on its way:
/// harness time), throughput, the timeline.
pub async fn measure(client: &Client, held: &[Held]) -> Result<Figures> {
    let (held_ids, held_ms): (Vec<&str>, Vec<f64>) = held
        .iter()
        .flat_map(|h| h.event_ids.iter().map(|id| (id.as_str(), h.held_ms)))
        .unzip();
    let counts = client.query_one(COUNTS, &[]).await?;
    let from_commit: bool = client.query_one(HAS_COMMIT_TIMESTAMPS, &[]).await?.get(0);
    let latency = client
        .query_one(
            if from_commit {
                LATENCY_FROM_COMMIT
            } else {
                LATENCY_FROM_INSERT
            },
            &[&held_ids, &held_ms],
        )
        .await?;
    let delivered: i64 = latency.get("delivered");
    let span_s: Option<f64> = latency.get("span_s");
    let round = |v: Option<f64>| round_to(v.unwrap_or(0.0), 100.0);
    let timeline = client
        .query(TIMELINE, &[&TIMELINE_BUCKET_MS])
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    Ok(Figures {
        written: counts.get("written"),
        delivered_distinct: counts.get("delivered_distinct"),
        deliveries: counts.get("deliveries"),
        latency_p50_ms: round(latency.get("p50")),
        latency_p99_ms: round(latency.get("p99")),
        latency_max_ms: round(latency.get("max")),
        events_per_s: match span_s {
            Some(s) if s > 0.0 => (delivered as f64 / s).round(),
            _ => 0.0,
        },
        from_commit,
        timeline,
        // From 0.0, not the -0.0 an empty float sum starts from.
        held_ms: round_to(
            held.iter().map(|h| h.held_ms).fold(0.0, |a, b| a + b),
            100.0,
        ),
    })
}
