//! clock-skew (beyond the article: whose clock a lease or a retry is read from): two lease
//! designs that differ only in whose wall clock sets the lease, two retrying relays that differ
//! only in whose clock sets a retry's due time, each under a step of the relay's clock (ahead,
//! behind) and of the database server's (ahead). The steps are real: libfaketime under relay 0's
//! process ([`FakeClock`]) and under a throwaway cluster of the scenario's own (the run's server
//! may be the user's, whose clock is not ours to step).
//!
//! Step by step, every design's relays ([`designs`]) run at once, each into a naive consumer of
//! its own; relay 0 of each on a clock of the step's. The lease designs' three relays drain a
//! backlog, each a third of a batch behind the one before (so that their batches end apart);
//! the clock steps once every lease relay holds a lease on a row it is sending; the retrying
//! designs' relay is then given a poison event and one whose first delivery fails.
//! The retrying designs' relays are stopped `watch_ms` after the step, the lease designs' once
//! every event was received (at most [`designs::DRAIN_LIMIT`] after the step: a busy machine
//! only slows a backlog down, what a clock stalls waits a minute), and each database says:
//! - `duplicates`: shipments beyond each event's first (the naive consumer ships each receipt);
//! - `stalled`: events that could be delivered (all but the poison one) not received by then;
//! - `dead_letters`: events whose attempts ran out by then.

mod designs;

use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use futures_util::future::try_join_all;
use serde::Deserialize;

use super::{metric_names, Ctx, Experiment, Outcome};
use crate::harness::child::RunningChild;
use crate::harness::clock::FakeClock;
use crate::harness::db::PgServer;
use crate::judge::counts;
use crate::judge::invariants::lost;
use crate::outbox::relay::sql::DEAD_LETTERS;
use crate::report::plots::{outcome_grid, Category, Plot, BAD, GOOD, STUCK, WAITED};
use crate::report::{Report, Table};
use designs::{Bench, Design, POISON};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// Each step: the relay's clock this far ahead or behind, the server's this far ahead.
    pub step_ms: u64,
    /// The lease designs' lease.
    pub lease_ms: u64,
    /// Rows per claim.
    pub batch: i64,
    /// The lease designs' consumer takes this long over each event.
    pub send_ms: u64,
    /// Events waiting for the lease designs' relays when they start.
    pub backlog: u32,
    /// The retrying designs' first retry waits this long, each further one twice as long.
    pub backoff_base_ms: u64,
    /// Attempts after which an event is a dead letter.
    pub max_attempts: i32,
    /// After the step, the retrying designs' relays run this long (the lease designs' until
    /// every event was received once).
    pub watch_ms: u64,
    /// Every relay's polling interval.
    pub poll_ms: u64,
}

/// A step of a clock: whose, and which way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    RelayForward,
    RelayBack,
    DbForward,
}

impl Step {
    const ALL: [Step; 3] = [Step::RelayForward, Step::RelayBack, Step::DbForward];

    fn name(self) -> &'static str {
        match self {
            Step::RelayForward => "relay_step_forward",
            Step::RelayBack => "relay_step_back",
            Step::DbForward => "db_step_forward",
        }
    }

    /// The step, signed, in ms.
    fn offset_ms(self, step_ms: u64) -> i64 {
        match self {
            Step::RelayForward | Step::DbForward => step_ms as i64,
            Step::RelayBack => -(step_ms as i64),
        }
    }
}

/// What a cell of the outcome table says, and its colour on the page (Okabe–Ito).
const OUTCOMES: [Category; 4] = [
    Category {
        starts_with: "sent twice",
        label: "sent twice (a live lease taken)",
        colour: BAD,
    },
    Category {
        starts_with: "dead letter",
        label: "dead letter (retries fired at once)",
        colour: STUCK,
    },
    Category {
        starts_with: "stalled",
        label: "stalled (a retry waits for the step)",
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
        if self.batch < 1 || self.backlog == 0 || self.poll_ms == 0 || self.max_attempts < 2 {
            bail!("batch, backlog and poll_ms must be at least 1, max_attempts at least 2");
        }
        if self.step_ms <= self.lease_ms + self.watch_ms {
            bail!(
                "step_ms {} must exceed lease_ms + watch_ms: a step within them expires no \
                 lease and delays no retry past the watch",
                self.step_ms
            );
        }
        // Leases must be live at the step: every relay still has batches to send after its
        // first two.
        let relays = i64::from(Design::AppClockLease.relays());
        if i64::from(self.backlog) < 3 * relays * self.batch {
            bail!("backlog must be at least 3 * batch for each of the {relays} lease relays");
        }
        // On the server's clock the poison event is not yet a dead letter by the end of the
        // watch, and the retried one is delivered well within it.
        let retries_ms = self.backoff_base_ms * ((1 << (self.max_attempts - 1)) - 1);
        if retries_ms <= self.watch_ms || 2 * self.backoff_base_ms >= self.watch_ms {
            bail!(
                "backoff_base_ms {} must be under half of watch_ms, and the waits before the \
                 last attempt ({retries_ms} ms) longer than it",
                self.backoff_base_ms
            );
        }
        Ok(())
    }

    fn metrics(&self) -> Vec<String> {
        let cells = Design::ALL.iter().flat_map(|design| {
            Step::ALL
                .iter()
                .map(move |step| format!("{}.{}", design.name(), step.name()))
        });
        metric_names(cells, &["duplicates", "stalled", "dead_letters"])
    }

    async fn run(&self, ctx: &Ctx<'_>) -> Result<Outcome> {
        // The server's clock is stepped: a throwaway cluster of its own on a clock of the run's.
        ctx.server
            .on_private_cluster(true, async |server| run(ctx, server, self).await)
            .await
    }

    /// The outcome table as a grid, designs × steps, coloured by outcome.
    fn plots(report: &Report) -> Result<Vec<Plot>> {
        outcome_grid(
            "clock-skew-outcomes",
            report,
            "design",
            Step::ALL.map(Step::name),
            &OUTCOMES,
        )
    }
}

/// What one design made of one step, counted from its database.
struct Cell {
    duplicates: i64,
    stalled: i64,
    dead_letters: i64,
    received: i64,
}

impl Cell {
    /// The word of the outcome table: what a user of the design would see first.
    fn outcome(&self) -> String {
        match *self {
            Cell { duplicates, .. } if duplicates > 0 => format!("sent twice: {duplicates}"),
            Cell { dead_letters, .. } if dead_letters > 0 => {
                format!("dead letter: {dead_letters}")
            }
            Cell { stalled, .. } if stalled > 0 => format!("stalled: {stalled}"),
            _ => "fine".into(),
        }
    }
}

async fn run(ctx: &Ctx<'_>, server: &PgServer, params: &Params) -> Result<Outcome> {
    let server_clock = match server.clock() {
        Some(Ok(clock)) => clock,
        Some(Err(why)) => bail!("the cluster's clock cannot be stepped: {why}"),
        None => bail!("the cluster runs on no clock of the run's"),
    };
    let benches = try_join_all(Design::ALL.map(|d| Bench::new(ctx, server, d))).await?;
    let mut cells = Vec::new();
    for step in Step::ALL {
        cells.push(round(ctx, &benches, server_clock, step, params).await?);
    }
    let mut outcome = Outcome::default();
    report(params, &cells, &mut outcome);
    Ok(outcome)
}

/// One step: every design's relays started, the clock stepped once the lease designs' leases
/// are live, each design's relays stopped when its watch ends, and what each made of it.
async fn round(
    ctx: &Ctx<'_>,
    benches: &[Bench],
    server_clock: &FakeClock,
    step: Step,
    params: &Params,
) -> Result<Vec<Cell>> {
    // Relay 0's clock, true until the step (a new one each step: its offset starts at 0).
    let relay_clock = FakeClock::new(None)?;
    let consumers = try_join_all(benches.iter().map(|b| b.prepare(ctx, params))).await?;
    let mut relays: Vec<Vec<RunningChild>> = benches.iter().map(|_| Vec::new()).collect();
    let most = Design::ALL
        .map(Design::relays)
        .into_iter()
        .max()
        .unwrap_or(0);
    for index in 0..most {
        if index > 0 {
            // Each relay a share of a batch behind the one before: the lease relays' batches
            // end apart, so that one claims again while the others are still sending.
            let batch_ms = params.send_ms * params.batch as u64;
            tokio::time::sleep(Duration::from_millis(batch_ms / u64::from(most))).await;
        }
        for ((bench, consumer), relays) in benches.iter().zip(&consumers).zip(&mut relays) {
            if index < bench.design.relays() {
                relays.push(bench.spawn_relay(ctx, consumer, index, &relay_clock, params)?);
            }
        }
    }
    try_join_all(benches.iter().map(Bench::wait_every_relay_sending)).await?;
    let offset = step.offset_ms(params.step_ms);
    let stepped = match step {
        Step::DbForward => server_clock,
        Step::RelayForward | Step::RelayBack => &relay_clock,
    };
    stepped.step(offset)?;
    try_join_all(benches.iter().map(Bench::write_retried)).await?;
    let watched = benches
        .iter()
        .zip(relays)
        .map(|(bench, relays)| async move {
            bench.watch(params).await?;
            try_join_all(relays.into_iter().map(RunningChild::stop)).await
        });
    try_join_all(watched).await?;
    try_join_all(consumers.into_iter().map(|consumer| consumer.stop())).await?;
    // The next step starts from true clocks.
    stepped.step(-offset)?;
    try_join_all(benches.iter().map(|bench| count(bench, params))).await
}

/// Events that could be delivered (all but the poison one) and were not received.
const STALLED: &str = concat!(
    "SELECT count(*) FROM (",
    lost!(),
    ") lost WHERE order_id <> $1"
);

/// What the design's database says once its relays stopped.
async fn count(bench: &Bench, params: &Params) -> Result<Cell> {
    let deliveries = counts::one_row(&bench.client, counts::DELIVERIES).await?;
    let received: i64 = deliveries.get("received");
    if bench.design.leases() && received == 0 {
        return Err(anyhow!("{} delivered nothing", bench.design.name()));
    }
    let stalled = bench
        .client
        .query_one(STALLED, &[&POISON.aggregate])
        .await?;
    let dead = bench
        .client
        .query(DEAD_LETTERS, &[&params.max_attempts])
        .await?;
    Ok(Cell {
        duplicates: deliveries.get("duplicate_shipments"),
        stalled: stalled.get(0),
        dead_letters: dead.len() as i64,
        received,
    })
}

/// The outcome table (the page's grid), each cell's figures, and the notes.
fn report(params: &Params, cells: &[Vec<Cell>], outcome: &mut Outcome) {
    let steps = Step::ALL.map(Step::name);
    let columns: Vec<&str> = std::iter::once("design").chain(steps).collect();
    let mut outcomes = Table::new("what each design does when a clock steps", &columns);
    let mut figures = Table::new(
        "each design under each step, counted from its database",
        &[
            "design",
            "step",
            "duplicates",
            "stalled",
            "dead_letters",
            "received",
        ],
    );
    for (d, design) in Design::ALL.iter().enumerate() {
        let mut row = vec![design.name().to_string()];
        for (s, step) in Step::ALL.iter().enumerate() {
            let cell = &cells[s][d];
            row.push(cell.outcome());
            let name = format!("{}.{}", design.name(), step.name());
            let m = &mut outcome.metrics;
            m.set(format!("{name}.duplicates"), cell.duplicates);
            m.set(format!("{name}.stalled"), cell.stalled);
            m.set(format!("{name}.dead_letters"), cell.dead_letters);
            figures.push(vec![
                design.name().into(),
                step.name().into(),
                cell.duplicates.to_string(),
                cell.stalled.to_string(),
                cell.dead_letters.to_string(),
                cell.received.to_string(),
            ]);
        }
        outcomes.push(row);
    }
    outcome.tables.push(outcomes);
    outcome.tables.push(figures);
    outcome.notes.push(format!(
        "steps: relay 0's clock {s} ms ahead or behind, the server's {s} ms ahead, once every \
         lease relay holds a lease on a row it is sending; the relays then run {} ms. Lease \
         designs: three relays, a lease of {} ms, batches of {}, a consumer taking {} ms over each of {} \
         events. Retrying designs: one relay, retries {} ms apart doubling, {} attempts, a \
         poison event and one failed once, written after the step",
        params.watch_ms,
        params.lease_ms,
        params.batch,
        params.send_ms,
        params.backlog,
        params.backoff_base_ms,
        params.max_attempts,
        s = params.step_ms,
    ));
}
