//! What the NOTIFY trigger costs writers: writers committing as fast as they can on a database
//! with the trigger and on one without, and how often a commit waits behind a notifying one.

use std::time::Duration;

use anyhow::Result;

use super::{Ctx, Outcome, Params, CHILD_TIMEOUT};
use crate::harness::child::ChildEnd;
use crate::judge::counts;
use crate::outbox::schema;
use crate::outbox::writer::Ending;
use crate::report::Table;
use crate::stats::median;

/// How often the writers' sessions are looked at for a commit queued behind a notifying one.
const QUEUE_SAMPLE_EVERY: Duration = Duration::from_millis(5);

/// Writers committing as fast as they can, with and without the NOTIFY trigger, in rounds that
/// alternate which goes first, so that the machine's drift (other work on it) falls on both
/// alike; each figure is the median of its rounds.
pub(super) async fn writer_throughput(
    ctx: &Ctx<'_>,
    params: &Params,
    outcome: &mut Outcome,
) -> Result<()> {
    let designs = [("without_trigger", false), ("with_trigger", true)];
    let mut clients = Vec::new();
    for (name, trigger) in designs {
        let db = ctx.database(&format!("tps_{name}")).await?;
        let client = db.connect().await?;
        if trigger {
            client.batch_execute(schema::NOTIFY_TRIGGER).await?;
        }
        clients.push((db, client));
    }
    let mut rounds: [Vec<f64>; 2] = Default::default();
    let (mut looks, mut queued) = ([0u32; 2], [0u32; 2]);
    for round in 0..params.tps_rounds {
        let first = (round % 2) as usize;
        for design in [first, 1 - first] {
            let (db, client) = &clients[design];
            client.batch_execute(schema::RESET).await?;
            let mut writers = tokio::task::JoinSet::new();
            for _ in 0..params.tps_writers {
                let writer = ctx.writer(db, 0, 1, Ending::Commit).with(|writer| {
                    writer.duration = Some(Duration::from_millis(params.tps_duration_ms))
                });
                writers.spawn(writer.run(CHILD_TIMEOUT));
            }
            // Meanwhile, how often a writer is seen queued behind another's notifying COMMIT.
            while !writers.is_empty() {
                tokio::select! {
                    ended = writers.join_next() => {
                        if let Some(ended) = ended {
                            ended??.expect(|e| *e == ChildEnd::Ok, "a writer")?;
                        }
                    }
                    () = tokio::time::sleep(QUEUE_SAMPLE_EVERY) => {
                        let waiting = counts::count(client, counts::WAITING_TO_NOTIFY).await?;
                        looks[design] += 1;
                        queued[design] += u32::from(waiting > 0);
                    }
                }
            }
            let per_s: f64 = client.query_one(counts::ORDERS_PER_S, &[]).await?.get(0);
            rounds[design].push(per_s);
        }
    }
    let mut table = Table::new(
        format!(
            "{} writers for {} ms, {} rounds (synchronous_commit on)",
            params.tps_writers, params.tps_duration_ms, params.tps_rounds
        ),
        &[
            "outbox",
            "orders_per_s (median)",
            "each round",
            "looks with a commit queued",
        ],
    );
    let medians = rounds.each_ref().map(|each| median(each));
    for (design, (name, _)) in designs.iter().enumerate() {
        let per_s = medians[design];
        let queued_share = f64::from(queued[design]) / f64::from(looks[design].max(1));
        let m = &mut outcome.metrics;
        m.set(format!("writer_tps.{name}"), per_s.round());
        m.set(
            format!("commit_queue.{name}"),
            (queued_share * 1000.0).round() / 1000.0,
        );
        m.set(format!("queued_looks.{name}"), queued[design]);
        let each: Vec<String> = rounds[design].iter().map(|r| format!("{r:.0}")).collect();
        table.push(vec![
            name.replace('_', " "),
            format!("{per_s:.0}"),
            each.join(", "),
            format!("{} of {}", queued[design], looks[design]),
        ]);
    }
    let ratio = medians[1] / medians[0].max(1.0);
    outcome.metrics.set(
        "writer_tps.with_to_without",
        (ratio * 1000.0).round() / 1000.0,
    );
    outcome.tables.push(table);
    Ok(())
}
