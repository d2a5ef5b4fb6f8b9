//! dual-write (二重書き込み問題を再現する): the naive app INSERTs the order and POSTs the event
//! itself, in five paths, each in its own child process; the damage is counted from the database.

use anyhow::Result;
use serde::Deserialize;
use uuid::Uuid;

use super::{metric_names, Ctx, Experiment, Outcome, CHILD_TIMEOUT};
use crate::harness::child::role::NaiveAppRole;
use crate::harness::child::ChildCommand;
use crate::harness::ports;
use crate::judge::counts;
use crate::outbox::consumer::{ConsumerKind, Faults};
use crate::outbox::crash::{CrashPlan, CrashPoint};
use crate::outbox::writer::{DualWriteOrder, Ending};
use crate::report::Table;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {}

impl Experiment for Params {
    fn metrics(&self) -> Vec<String> {
        let names = PATHS.iter().map(|path| path.name);
        let mut metrics = metric_names(names, &["order_committed", "shipment_created", "ended"]);
        let crashing = PATHS.iter().filter(|path| path.crash.is_some());
        metrics.extend(metric_names(crashing.map(|path| path.name), &["crashed"]));
        let totals = [
            "orders",
            "shipments",
            "ghost_shipments",
            "orders_without_shipment",
        ];
        metrics.extend(metric_names([""], &totals));
        metrics
    }

    async fn run(&self, ctx: &Ctx<'_>) -> Result<Outcome> {
        run(ctx, self).await
    }
}

/// One way the naive app can run.
struct Path {
    name: &'static str,
    order: DualWriteOrder,
    ending: Ending,
    crash: Option<CrashPoint>,
    /// Whether anything listens where the app sends (consumer-down: nothing does).
    consumer_up: bool,
}

const PATHS: [Path; 5] = [
    Path {
        name: "commit-then-send",
        order: DualWriteOrder::CommitFirst,
        ending: Ending::Commit,
        crash: None,
        consumer_up: true,
    },
    Path {
        name: "crash-after-commit",
        order: DualWriteOrder::CommitFirst,
        ending: Ending::Commit,
        crash: Some(CrashPoint::WriterAfterCommitBeforeSend),
        consumer_up: true,
    },
    Path {
        name: "consumer-down",
        order: DualWriteOrder::CommitFirst,
        ending: Ending::Commit,
        crash: None,
        consumer_up: false,
    },
    Path {
        name: "send-then-crash",
        order: DualWriteOrder::SendFirst,
        ending: Ending::Commit,
        crash: Some(CrashPoint::WriterAfterSendBeforeCommit),
        consumer_up: true,
    },
    Path {
        name: "send-then-rollback",
        order: DualWriteOrder::SendFirst,
        ending: Ending::Rollback,
        crash: None,
        consumer_up: true,
    },
];

pub async fn run(ctx: &Ctx<'_>, _params: &Params) -> Result<Outcome> {
    let db = ctx.database("app").await?;
    let client = db.connect().await?;
    let consumer = ctx
        .start_consumer(&db, ConsumerKind::Naive, &Faults::default())
        .await?;
    // An address where nothing listens: a port bound a moment ago, then let go.
    let [closed] = ports::free_ports()?;
    let nobody_listens = format!("http://127.0.0.1:{closed}");
    let mut outcome = Outcome::default();
    let mut per_path = Table::new(
        "per path",
        &["path", "order committed", "shipment created", "outcome"],
    );
    for (n, path) in PATHS.iter().enumerate() {
        // The customer id finds the path's order, the event id its shipment.
        let customer_id = n as i64 + 1;
        let event_id = Uuid::new_v4();
        let sink = if path.consumer_up {
            &consumer.url
        } else {
            &nobody_listens
        };
        let role = NaiveAppRole {
            sink: sink.to_string(),
            customer_id,
            event_id,
            order: path.order,
            ending: path.ending,
        };
        let run = ChildCommand::new(&db, role)
            .crash_at(path.crash.map(|p| CrashPlan::new(p, 1)))
            .run(CHILD_TIMEOUT)
            .await?;
        let row = client
            .query_one(counts::DUAL_WRITE_PATH, &[&customer_id, &event_id])
            .await?;
        let (committed, shipped): (bool, bool) = (row.get(0), row.get(1));
        outcome.metrics.set_row(path.name, &row);
        outcome
            .metrics
            .set(format!("{}.ended", path.name), run.end.to_string());
        if let Some(point) = path.crash {
            // A child that failed before its crash point leaves the same counts as one that
            // died there: only its end tells them apart.
            outcome.metrics.set(
                format!("{}.crashed", path.name),
                i64::from(run.end.crashed_at(point)),
            );
        }
        per_path.push(vec![
            path.name.into(),
            yes_no(committed),
            yes_no(shipped),
            run.end.to_string(),
        ]);
    }
    consumer.stop().await?;
    let totals = counts::one_row(&client, counts::DUAL_WRITE).await?;
    outcome.metrics.set_row("", &totals);
    outcome
        .tables
        .push(Table::from_rows("orders vs shipments", &[totals]));
    outcome.tables.push(per_path);
    Ok(outcome)
}

fn yes_no(b: bool) -> String {
    if b { "yes" } else { "no" }.into()
}
