//! outbox-atomicity (outbox テーブルの設計と同一トランザクションでの書き込み): the order and its
//! outbox row are one transaction, so a ROLLBACK or a crash before COMMIT leaves neither.

use anyhow::Result;
use serde::Deserialize;

use super::{metric_names, Ctx, Experiment, Outcome};
use crate::judge::counts;
use crate::outbox::crash::{CrashPlan, CrashPoint};
use crate::outbox::writer::Ending;
use crate::report::Table;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {}

impl Experiment for Params {
    fn metrics(&self) -> Vec<String> {
        let steps = ["rollback", "crash", "commit"];
        let mut metrics = metric_names(steps, &["orders", "outbox", "writer"]);
        metrics.push("crash.crashed".into());
        metrics
    }

    async fn run(&self, ctx: &Ctx<'_>) -> Result<Outcome> {
        run(ctx, self).await
    }
}

pub async fn run(ctx: &Ctx<'_>, _params: &Params) -> Result<Outcome> {
    let db = ctx.database("writer").await?;
    let client = db.connect().await?;
    let crash_point = CrashPoint::WriterAfterInsertBeforeCommit;
    let crash_before_commit = Some(CrashPlan::new(crash_point, 1));
    // Counts are cumulative: each step starts from what the previous ones left.
    let steps = [
        ("rollback", Ending::Rollback, None),
        ("crash", Ending::Commit, crash_before_commit),
        ("commit", Ending::Commit, None),
    ];
    let mut outcome = Outcome::default();
    let mut table = Table::new(
        "orders and outbox after each step",
        &["step", "writer", "orders", "outbox"],
    );
    for (step, ending, crash) in steps {
        let run = ctx.run_writer(&db, 1, ending, crash).await?;
        let row = counts::one_row(&client, counts::ORDERS_AND_OUTBOX).await?;
        outcome.metrics.set_row(step, &row);
        outcome
            .metrics
            .set(format!("{step}.writer"), run.end.to_string());
        if crash.is_some() {
            // A writer that failed before its crash point leaves the same empty tables.
            outcome.metrics.set(
                format!("{step}.crashed"),
                i64::from(run.end.crashed_at(crash_point)),
            );
        }
        let (orders, outbox): (i64, i64) = (row.get(0), row.get(1));
        table.push(vec![
            step.into(),
            run.end.to_string(),
            orders.to_string(),
            outbox.to_string(),
        ]);
    }
    outcome.tables.push(table);
    Ok(outcome)
}
