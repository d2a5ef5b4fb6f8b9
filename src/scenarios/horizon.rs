//! horizon (beyond the article: the transactions a relay must wait for): seven relay designs
//! under five faults, one table. A relay that remembers "the largest id I delivered" never sees
//! a transaction that took a smaller id and commits later (the gap: marten#3122, marten#2370,
//! watermill-sql #311); a relay that waits for every older transaction is stalled by one that
//! does not end, or an id that never commits (marten#5108, marten#3865).
//!
//! Fault by fault, every design's database gets the fault at once ([`faults`]: a session of its
//! own each; the crash, once for the server) while a session beside it goes on committing one
//! event after another, and each design's relay ([`designs`]) follows its outbox into a naive
//! consumer of its own. Then, per design and fault, from the database:
//! - `skipped`: outbox rows committed, never delivered, and behind the relay's position (it will
//!   never deliver them);
//! - `stalled_ms`: the longest a row committed beside the fault after it began waited, from its
//!   commit to its first receipt (server clock); a row not received by the end of the watch
//!   (`watch_ms` after the fault's transaction ended, or the server was back) waited until then;
//! - `recovered`: whether every one of those rows was received within the watch.

mod designs;
mod faults;

use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use futures_util::future::{join_all, try_join_all};
use serde::Deserialize;
use tokio::time::Instant;
use tokio_postgres::types::ToSql;
use tokio_util::sync::CancellationToken;

use super::{metric_names, Ctx, Experiment, Outcome};
use crate::judge::counts;
use crate::report::plots::{outcome_grid, Category, Plot, BAD, GOOD, STUCK, WAITED};
use crate::report::{Report, Table};
use crate::stats::round_ms;
use crate::wait;
use designs::{Bench, Design, Follower};
use faults::Fault;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// How long the slow commit, the idle transaction and the prepared transaction stay open.
    pub hold_ms: u64,
    /// lag_watermark reads only rows older than this.
    pub lag_ms: u64,
    /// gap_skip skips a gap once a row after it is this old.
    pub skip_gaps_after_ms: u64,
    /// After a fault ended, how long the designs have to deliver every row committed beside it.
    pub watch_ms: u64,
    /// The session beside the fault commits an event this often.
    pub write_every_ms: u64,
    /// Events of the order a slow commit, a rollback or a prepared transaction inserts.
    pub fault_events: u32,
    /// Every polling relay's interval.
    pub poll_ms: u64,
    /// A wait this much longer than the quickest design's under the same fault is called a
    /// stall in the table (not a check).
    pub stalled_after_ms: u64,
}

/// Rows committed beside the fault before it strikes.
const LEAD: Duration = Duration::from_millis(300);
/// ... and after its transaction ended (the crash: after the server is back).
const TAIL: Duration = Duration::from_millis(300);
/// How often the consumers are looked at during the watch.
const WATCH_POLL: Duration = Duration::from_millis(20);
/// The sequence logs this many values ahead of the last one it handed out (PostgreSQL's
/// `SEQ_LOG_VALS`): a crash resumes it past them, unless every one was used.
const SEQUENCE_LOGGED_AHEAD: u64 = 32;

/// What a cell of the outcome table says, and its colour on the page (Okabe–Ito).
const OUTCOMES: [Category; 4] = [
    Category {
        starts_with: "skipped",
        label: "skipped (events lost)",
        colour: BAD,
    },
    Category {
        starts_with: "stalled for good",
        label: "stalled for good",
        colour: STUCK,
    },
    Category {
        starts_with: "stalled",
        label: "stalled, recovered",
        colour: WAITED,
    },
    Category {
        starts_with: "fine",
        label: "fine",
        colour: GOOD,
    },
];

impl Experiment for Params {
    fn validate(&self) -> Result<()> {
        if self.fault_events == 0 || self.write_every_ms == 0 || self.poll_ms == 0 {
            bail!("fault_events, write_every_ms and poll_ms must be at least 1");
        }
        // Before the crash, the session beside writes these ids; one sequence value must be
        // left of those logged ahead, or the crash shows no jump.
        let before_crash = LEAD.as_millis() as u64 / self.write_every_ms + 1;
        if before_crash >= SEQUENCE_LOGGED_AHEAD {
            bail!(
                "write_every_ms {} writes {before_crash} rows before the crash: fewer than \
                 {SEQUENCE_LOGGED_AHEAD} (the values a sequence logs ahead) are needed to see it \
                 jump",
                self.write_every_ms
            );
        }
        Ok(())
    }

    fn metrics(&self) -> Vec<String> {
        let cells = Design::ALL.iter().flat_map(|design| {
            Fault::ALL
                .iter()
                .map(move |fault| format!("{}.{}", design.name(), fault.name()))
        });
        let mut metrics = metric_names(cells, &["skipped", "stalled_ms", "recovered"]);
        metrics.push("sequence_jump".into());
        metrics
    }

    async fn run(&self, ctx: &Ctx<'_>) -> Result<Outcome> {
        run(ctx, self).await
    }

    /// The outcome table as a grid, designs × faults, coloured by outcome.
    fn plots(report: &Report) -> Result<Vec<Plot>> {
        outcome_grid(
            "horizon-outcomes",
            report,
            "design",
            Fault::ALL.map(Fault::name),
            &OUTCOMES,
        )
    }
}

/// What one design made of one fault.
enum Cell {
    Measured {
        skipped: i64,
        stalled_ms: f64,
        recovered: bool,
        /// Rows committed beside the fault from its start on.
        beside: i64,
    },
    /// Not struck on this server (the notes say why).
    NotRun,
}

impl Cell {
    /// The word of the outcome table: what a user of the design would see. A stall is a wait
    /// `stalled_after_ms` longer than the quickest design's under the same fault: what the
    /// machine adds to every design at once (a busy disk after the crash) is no design's.
    fn outcome(&self, stalled_after_ms: f64, quickest_ms: f64) -> String {
        match *self {
            Cell::NotRun => "n/a".into(),
            Cell::Measured { skipped, .. } if skipped > 0 => format!("skipped {skipped}"),
            Cell::Measured {
                recovered: false, ..
            } => "stalled for good".into(),
            Cell::Measured { stalled_ms, .. } if stalled_ms - quickest_ms >= stalled_after_ms => {
                format!("stalled {stalled_ms:.0} ms")
            }
            Cell::Measured { .. } => "fine".into(),
        }
    }
}

/// How a fault was struck: per design, from when rows beside it count (µs since the epoch,
/// server clock); when its transactions ended (the crash: when the server was back); and for the
/// crash where each design's sequence stood before it.
struct Struck {
    from_us: Vec<i64>,
    ended: Instant,
    last_ids: Option<Vec<i64>>,
}

pub async fn run(ctx: &Ctx<'_>, params: &Params) -> Result<Outcome> {
    let mut benches = try_join_all(Design::ALL.map(|design| Bench::new(ctx, design))).await?;
    let mut outcome = Outcome::default();
    let prepared_allowed: i32 = benches[0]
        .client
        .query_one(faults::MAX_PREPARED_TRANSACTIONS, &[])
        .await?
        .get(0);
    let mut cells: Vec<Vec<Cell>> = Vec::new();
    let mut jumps = Table::new(
        "the outbox's sequence across the crash",
        &[
            "design",
            "last id before",
            "first id after",
            "ids never used",
        ],
    );
    for fault in Fault::ALL {
        let not_run = match fault {
            Fault::Prepared if prepared_allowed == 0 => {
                Some("the server allows no prepared transactions (max_prepared_transactions = 0)")
            }
            Fault::CrashSeqJump if ctx.server.is_external() => {
                Some("it crashes the server: only the throwaway cluster, not --database-url")
            }
            _ => None,
        };
        if let Some(why) = not_run {
            outcome
                .notes
                .push(format!("{}: not run: {why}", fault.name()));
            cells.push(Design::ALL.iter().map(|_| Cell::NotRun).collect());
            continue;
        }
        cells.push(round(ctx, &mut benches, fault, params, &mut jumps).await?);
    }
    for bench in benches {
        bench.close().await?;
    }
    report(params, &cells, jumps, &mut outcome);
    Ok(outcome)
}

/// One fault, struck on every design's database at once (the crash: on the server, once), and
/// what each design made of it.
async fn round(
    ctx: &Ctx<'_>,
    benches: &mut [Bench],
    fault: Fault,
    params: &Params,
    jumps: &mut Table,
) -> Result<Vec<Cell>> {
    try_join_all(benches.iter().map(Bench::reset)).await?;
    if fault == Fault::CrashSeqJump {
        // No checkpoint may fall between the last id taken and the crash: it would write the
        // sequence without the values it logged ahead, and the crash would show no jump. One
        // now puts the next timed one minutes away (and leaves recovery little to replay).
        benches[0].client.batch_execute("CHECKPOINT").await?;
    }
    let stop = CancellationToken::new();
    let followers = try_join_all(benches.iter().map(|b| b.follow(params, &stop))).await?;
    let following = try_join_all(followers.into_iter().map(Follower::pending));
    let struck_and_watched = async {
        let struck = match fault {
            Fault::CrashSeqJump => crash(ctx, benches, params).await?,
            _ => strike_each(benches, fault, params).await?,
        };
        let watch_ended_us = watch(benches, &struck, params).await?;
        try_join_all(benches.iter().map(Bench::wait_log_caught_up)).await?;
        anyhow::Ok((struck, watch_ended_us))
    };
    // The relays follow beside the round's steps until it ends, however it ends.
    let (pending, watched) = tokio::join!(following, async {
        let watched = struck_and_watched.await;
        stop.cancel();
        watched
    });
    let (struck, watch_ended_us) = watched?;
    let pending = pending?;
    let benches = &*benches;
    let mut measured = Vec::new();
    for ((bench, pending), from_us) in benches.iter().zip(pending).zip(&struck.from_us) {
        let undelivered = counts::ids(&bench.client, counts::LOST_IDS, &[])
            .await?
            .len() as i64;
        let watched: [&(dyn ToSql + Sync); 3] = [from_us, &watch_ended_us, &faults::BESIDE];
        let waits = bench.client.query_one(BESIDE_WAITS, &watched).await?;
        let beside: i64 = waits.get("rows");
        if beside == 0 {
            bail!("no row was committed beside {}", fault.name());
        }
        measured.push(Cell::Measured {
            skipped: undelivered - pending,
            stalled_ms: waits.get("longest_wait_ms"),
            recovered: waits.get::<_, i64>("received") == beside,
            beside,
        });
    }
    if let Some(last_ids) = struck.last_ids {
        for (bench, last) in benches.iter().zip(last_ids) {
            let first: Option<i64> = bench
                .client
                .query_one(faults::FIRST_ID_AFTER, &[&last])
                .await?
                .get(0);
            let first = first.ok_or_else(|| anyhow!("no id taken after the crash"))?;
            jumps.push(vec![
                bench.design.name().into(),
                last.to_string(),
                first.to_string(),
                (first - last - 1).to_string(),
            ]);
        }
    }
    Ok(measured)
}

/// Until every design has received every row committed beside the fault, or `watch_ms` after it
/// ended: when the watch ended, on the server's clock (µs since the epoch).
async fn watch(benches: &[Bench], struck: &Struck, params: &Params) -> Result<i64> {
    let caught_up = async || {
        let received = benches
            .iter()
            .zip(&struck.from_us)
            .map(|(b, from_us)| async move {
                let row = b
                    .client
                    .query_one(BESIDE_RECEIVED, &[from_us, &faults::BESIDE])
                    .await?;
                anyhow::Ok(row.get::<_, bool>(0))
            });
        Ok(try_join_all(received).await?.into_iter().all(|all| all))
    };
    let until = struck.ended + Duration::from_millis(params.watch_ms);
    let left = until.saturating_duration_since(Instant::now());
    wait::up_to(left, WATCH_POLL, caught_up).await?;
    counts::count(&benches[0].client, counts::SERVER_CLOCK_US).await
}

/// A session fault on every design's database at once, rows committed beside each from before
/// it until after it ended.
async fn strike_each(benches: &[Bench], fault: Fault, params: &Params) -> Result<Struck> {
    let started = Instant::now();
    let at = started + LEAD;
    let hold = Duration::from_millis(params.hold_ms);
    let every = Duration::from_millis(params.write_every_ms);
    let until = at + fault.held(hold) + TAIL;
    let each = benches.iter().map(|bench| async move {
        let (written, ended) = tokio::join!(
            faults::write_beside(&bench.db, started, until, every),
            faults::strike(fault, &bench.db, at, hold, params.fault_events),
        );
        written.and(ended)
    });
    // Every session runs to its end, whatever happens to another (join_all, not try_join_all):
    // a prepared transaction left behind would hold the server's horizon.
    let struck = join_all(each)
        .await
        .into_iter()
        .collect::<Result<Vec<_>>>()?;
    let (from_us, ends): (Vec<i64>, Vec<Instant>) = struck.into_iter().unzip();
    Ok(Struck {
        from_us,
        ended: ends.into_iter().max().expect("a design at least"),
        last_ids: None,
    })
}

/// Rows beside, every one delivered, then the server crashed and restarted; rows beside again.
async fn crash(ctx: &Ctx<'_>, benches: &mut [Bench], params: &Params) -> Result<Struck> {
    let every = Duration::from_millis(params.write_every_ms);
    let started = Instant::now();
    let at = started + LEAD;
    try_join_all(
        benches
            .iter()
            .map(|b| faults::write_beside(&b.db, started, at, every)),
    )
    .await?;
    // Nothing is being delivered when the server goes: the relays and consumers only lose their
    // sessions.
    try_join_all(benches.iter().map(Bench::wait_all_received)).await?;
    let last_ids = try_join_all(
        benches
            .iter()
            .map(|b| async { anyhow::Ok(b.client.query_one(faults::LAST_ID, &[]).await?.get(0)) }),
    )
    .await?;
    let from_us = counts::count(&benches[0].client, counts::SERVER_CLOCK_US).await?;
    ctx.server.restart_immediately().await?;
    try_join_all(benches.iter_mut().map(Bench::reconnect)).await?;
    // Back: it takes connections again (the rows beside resume, the watch starts).
    let ended = Instant::now();
    try_join_all(
        benches
            .iter()
            .map(|b| faults::write_beside(&b.db, ended, ended + TAIL, every)),
    )
    .await?;
    Ok(Struck {
        from_us: vec![from_us; benches.len()],
        ended,
        last_ids: Some(last_ids),
    })
}

/// Whether the consumer has received every row committed beside the fault ($2) from $1 (µs
/// since the epoch, server clock).
const BESIDE_RECEIVED: &str = "
SELECT NOT EXISTS (
  SELECT 1 FROM outbox o
   WHERE o.aggregate_id = $2
     AND o.created_at >= to_timestamp($1::bigint / 1000000.0)
     AND NOT EXISTS (SELECT 1 FROM consumer.receipts r
                      WHERE r.event_id = o.event_id AND NOT r.injected_fault))";

/// The rows committed beside the fault ($3) from $1 to the end of the watch ($2; both µs since
/// the epoch, server clock): how many, how many the consumer received within the watch, and the
/// longest wait, from a row's commit (its INSERT's, in autocommit) to its first receipt, or to
/// the end of the watch for a row not received by then. Receipts are matched by event id: the
/// log-tailing relay sends rows of earlier faults again after the crash.
const BESIDE_WAITS: &str = "
WITH beside AS (
  SELECT o.created_at,
         (SELECT min(r.received_at) FROM consumer.receipts r
           WHERE r.event_id = o.event_id AND NOT r.injected_fault) AS received_at
    FROM outbox o
   WHERE o.aggregate_id = $3
     AND o.created_at >= to_timestamp($1::bigint / 1000000.0)),
watch AS (SELECT to_timestamp($2::bigint / 1000000.0) AS ended)
SELECT count(*) AS rows,
       count(*) FILTER (WHERE received_at <= ended) AS received,
       COALESCE(max(EXTRACT(EPOCH FROM LEAST(received_at, ended) - created_at) * 1000), 0)::float8
         AS longest_wait_ms
  FROM beside, watch";

/// The outcome table (the page's grid), each cell's figures, the sequence's jump, and the notes.
fn report(params: &Params, cells: &[Vec<Cell>], jumps: Table, outcome: &mut Outcome) {
    let faults = Fault::ALL.map(Fault::name);
    let columns: Vec<&str> = std::iter::once("design").chain(faults).collect();
    let mut outcomes = Table::new("what each design does under each fault", &columns);
    let mut figures = Table::new(
        "each design under each fault, measured",
        &[
            "design",
            "fault",
            "skipped",
            "stalled_ms",
            "recovered",
            "rows beside",
        ],
    );
    let stalled_after = params.stalled_after_ms as f64;
    let quickest: Vec<f64> = cells
        .iter()
        .map(|fault| {
            let waits = fault.iter().filter_map(|cell| match *cell {
                Cell::Measured { stalled_ms, .. } => Some(stalled_ms),
                Cell::NotRun => None,
            });
            waits.fold(f64::INFINITY, f64::min)
        })
        .collect();
    for (d, design) in Design::ALL.iter().enumerate() {
        let mut row = vec![design.name().to_string()];
        for (f, fault) in Fault::ALL.iter().enumerate() {
            let cell = &cells[f][d];
            row.push(cell.outcome(stalled_after, quickest[f]));
            let Cell::Measured {
                skipped,
                stalled_ms,
                recovered,
                beside,
            } = *cell
            else {
                continue;
            };
            let name = format!("{}.{}", design.name(), fault.name());
            let stalled_ms = round_ms(stalled_ms);
            let m = &mut outcome.metrics;
            m.set(format!("{name}.skipped"), skipped);
            m.set(format!("{name}.stalled_ms"), stalled_ms);
            m.set(format!("{name}.recovered"), i64::from(recovered));
            figures.push(vec![
                design.name().into(),
                fault.name().into(),
                skipped.to_string(),
                format!("{stalled_ms:.0}"),
                recovered.to_string(),
                beside.to_string(),
            ]);
        }
        outcomes.push(row);
    }
    let jump_column = jumps.column("ids never used").expect("its own column");
    let smallest_jump = jumps
        .rows
        .iter()
        .filter_map(|row| row[jump_column].parse::<i64>().ok())
        .min();
    if let Some(jump) = smallest_jump {
        outcome.metrics.set("sequence_jump", jump);
    }
    outcome.tables.push(outcomes);
    outcome.tables.push(figures);
    if !jumps.rows.is_empty() {
        outcome.tables.push(jumps);
    }
    outcome.notes.push(format!(
        "faults: the slow commit, the idle and the prepared transaction stay open {} ms; the \
         slow commit, the rollback and the prepared transaction insert an order of {} events; \
         a session beside commits an event every {} ms. lag_watermark reads rows older than {} \
         ms; gap_skip skips a gap once a row after it is {} ms old; the relays poll every {} ms",
        params.hold_ms,
        params.fault_events,
        params.write_every_ms,
        params.lag_ms,
        params.skip_gaps_after_ms,
        params.poll_ms
    ));
    outcome.notes.push(format!(
        "skipped: rows committed, never delivered, behind the relay's position. stalled_ms: the \
         longest a row committed beside the fault (after it began) waited, commit to receipt; \
         stalled: {} ms longer than the quickest design under the same fault; for good: a row \
         was still waiting {} ms after the fault's transaction ended (the crash: after the \
         server was back)",
        params.stalled_after_ms, params.watch_ms
    ));
}
