//! cleanup (outbox の掃除): DELETE of 200,000 published rows leaves the table as large as before
//! and 200,000 dead tuples; VACUUM frees the space inside the file but cannot shrink it while
//! newer unpublished rows sit at its end; VACUUM FULL shrinks it. With daily RANGE partitions
//! (`outbox_p`) the same rows go with DETACH + DROP in milliseconds and leave no dead tuple, and
//! the guard keeps a partition that still holds an unpublished row: the very code of
//! `outbox-lab prune`.

use std::time::Instant;

use anyhow::{anyhow, bail, Result};
use chrono::{NaiveTime, TimeDelta, Utc};
use serde::Deserialize;

use super::{metric_names, Ctx, Experiment, Outcome};
use crate::harness::load::{self, OutboxRows};
use crate::judge::counts;
use crate::ops::partitions::{self, Action, Age};
use crate::outbox::schema;
use crate::report::plots::{self, Bar, Plot};
use crate::report::{Report, Table};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// Published rows to clean up (the article's 200,000).
    pub published: i64,
    /// Newer rows still waiting for the relay, at the end of the table.
    pub unpublished: i64,
    /// Payload padding, sizing the rows like the article's (~62 MB for 200,000 rows).
    pub payload_padding: usize,
    /// Partitions whose whole day is older than this many days are pruned.
    pub retention_days: i64,
}

impl Experiment for Params {
    fn metrics(&self) -> Vec<String> {
        let stages = [
            "before",
            "after_delete",
            "after_vacuum",
            "after_vacuum_full",
        ];
        let mut metrics = Vec::new();
        for stage in stages {
            metrics.extend([
                format!("size_{stage}_bytes"),
                format!("total_size_{stage}_bytes"),
                format!("dead_tuples_{stage}"),
                format!("{stage}_ms"),
            ]);
        }
        let partitions = [
            "partition_bytes",
            "detach_ms",
            "drop_ms",
            "partitions_dropped",
            "guard_refused",
            "partitions_left",
            "partitions_before",
            "dead_tuples_after_drop",
            "old_unpublished_kept",
        ];
        metrics.extend(metric_names([""], &partitions));
        metrics
    }

    async fn run(&self, ctx: &Ctx<'_>) -> Result<Outcome> {
        run(ctx, self).await
    }

    fn plots(report: &Report) -> Result<Vec<Plot>> {
        table_size(report)
    }
}

/// The article's cleanup statement.
const DELETE_PUBLISHED: &str = "DELETE FROM outbox WHERE published_at IS NOT NULL";

/// Unpublished rows left in partitions older than $1 seconds, counted after prune.
const OLD_UNPUBLISHED: &str = "
SELECT count(*) FROM outbox_p
 WHERE published_at IS NULL AND created_at < now() - make_interval(secs => $1)";

const PARTITION_COUNT: &str =
    "SELECT count(*) FROM pg_inherits WHERE inhparent = to_regclass('outbox_p')";

pub async fn run(ctx: &Ctx<'_>, params: &Params) -> Result<Outcome> {
    let mut outcome = Outcome::default();
    delete_and_vacuum(ctx, params, &mut outcome).await?;
    drop_partitions(ctx, params, &mut outcome).await?;
    Ok(outcome)
}

async fn delete_and_vacuum(ctx: &Ctx<'_>, params: &Params, outcome: &mut Outcome) -> Result<()> {
    let db = ctx.database("delete").await?;
    let client = db.connect().await?;
    client.batch_execute(schema::NO_AUTOVACUUM).await?;
    let published = OutboxRows {
        count: params.published,
        first_order_id: 1,
        payload_padding: params.payload_padding,
        created_from: Utc::now() - TimeDelta::days(1),
        published: true,
    };
    load::copy_rows(&client, "outbox", &published, ctx.progress()).await?;
    // Written last, so they sit in the last blocks of the file.
    let waiting = OutboxRows {
        count: params.unpublished,
        first_order_id: params.published + 1,
        created_from: Utc::now(),
        published: false,
        ..published
    };
    load::copy_rows(&client, "outbox", &waiting, ctx.progress()).await?;

    let mut table = Table::new(
        "outbox on disk, step by step",
        &[
            "after",
            "table size",
            "with indexes",
            "n_live_tup",
            "n_dead_tup",
            "statement ms",
        ],
    );
    let steps = [
        ("load", "before", None),
        (
            "DELETE published rows",
            "after_delete",
            Some(DELETE_PUBLISHED),
        ),
        ("VACUUM", "after_vacuum", Some("VACUUM outbox")),
        (
            "VACUUM FULL",
            "after_vacuum_full",
            Some("VACUUM FULL outbox"),
        ),
    ];
    for (label, stage, statement) in steps {
        let statement_ms = match statement {
            Some(sql) => {
                let started = Instant::now();
                client.batch_execute(sql).await?;
                Some(started.elapsed().as_secs_f64() * 1000.0)
            }
            None => None,
        };
        let row = counts::table_storage(&client, "outbox").await?;
        let m = &mut outcome.metrics;
        m.set(
            format!("size_{stage}_bytes"),
            row.get::<_, i64>("relation_bytes"),
        );
        m.set(
            format!("total_size_{stage}_bytes"),
            row.get::<_, i64>("total_bytes"),
        );
        m.set(
            format!("dead_tuples_{stage}"),
            row.get::<_, i64>("n_dead_tup"),
        );
        if let Some(ms) = statement_ms {
            m.set(format!("{stage}_ms"), ms);
        }
        table.push(vec![
            label.into(),
            row.get("relation_size"),
            row.get("total_size"),
            row.get::<_, i64>("n_live_tup").to_string(),
            row.get::<_, i64>("n_dead_tup").to_string(),
            statement_ms
                .map(|ms| format!("{ms:.3}"))
                .unwrap_or_default(),
        ]);
    }
    outcome.tables.push(table);
    Ok(())
}

async fn drop_partitions(ctx: &Ctx<'_>, params: &Params, outcome: &mut Outcome) -> Result<()> {
    let db = ctx.database("partitions").await?;
    let mut client = db.connect().await?;
    client.batch_execute(partitions::CREATE_OUTBOX_P).await?;
    let today = Utc::now().date_naive();
    // Two days past retention: all published. One day past: one row still unpublished.
    let all_published_day = today - TimeDelta::days(params.retention_days + 2);
    let one_waiting_day = today - TimeDelta::days(params.retention_days + 1);
    for day in [all_published_day, one_waiting_day, today] {
        // As for `outbox`: nothing may vacuum (and lock) the partitions behind our back.
        let ddl = partitions::create_daily_partition(day);
        client
            .batch_execute(&format!("{ddl} WITH (autovacuum_enabled = off)"))
            .await?;
    }
    let start_of = |day: chrono::NaiveDate| day.and_time(NaiveTime::MIN).and_utc();
    let old = OutboxRows {
        count: params.published,
        first_order_id: 1,
        payload_padding: params.payload_padding,
        created_from: start_of(all_published_day),
        published: true,
    };
    load::copy_rows(&client, "outbox_p", &old, ctx.progress()).await?;
    let waiting = OutboxRows {
        count: 1,
        first_order_id: params.published + 1,
        created_from: start_of(one_waiting_day),
        published: false,
        ..old
    };
    load::copy_rows(&client, "outbox_p", &waiting, ctx.progress()).await?;
    let current = OutboxRows {
        count: params.unpublished,
        first_order_id: params.published + 2,
        created_from: Utc::now(),
        ..waiting
    };
    load::copy_rows(&client, "outbox_p", &current, ctx.progress()).await?;
    let partitions_before: i64 = client.query_one(PARTITION_COUNT, &[]).await?.get(0);
    // The article's "20万行（52MB）のパーティション": the table file alone, as for `outbox`.
    let partition_bytes: i64 = client
        .query_one(
            counts::RELATION_BYTES,
            &[&partitions::daily_partition_name(all_published_day)],
        )
        .await?
        .get(0);
    outcome.metrics.set("partition_bytes", partition_bytes);

    let retention = Age::days(params.retention_days);
    let pruned = partitions::prune(&mut client, "outbox_p", retention, false).await?;
    let mut table = Table::new(
        format!(
            "prune --older-than {}d: partitions of outbox_p",
            params.retention_days
        ),
        &[
            "partition",
            "ended",
            "size",
            "unpublished",
            "action",
            "detach ms",
            "drop ms",
        ],
    );
    let (mut dropped, mut kept) = (0, 0);
    for p in &pruned {
        let (action, detach, drop) = match p.action {
            Action::Dropped { detach_ms, drop_ms } => {
                dropped += 1;
                let m = &mut outcome.metrics;
                m.set("detach_ms", detach_ms);
                m.set("drop_ms", drop_ms);
                (
                    "DETACH + DROP",
                    format!("{detach_ms:.3}"),
                    format!("{drop_ms:.3}"),
                )
            }
            Action::Kept => {
                kept += 1;
                ("kept by the guard", String::new(), String::new())
            }
            Action::WouldDrop => bail!("prune ran as a dry run"),
        };
        table.push(vec![
            p.partition.name.clone(),
            p.partition.upper_bound.clone(),
            p.partition.size.clone(),
            p.partition.unpublished.to_string(),
            action.into(),
            detach,
            drop,
        ]);
    }
    outcome.tables.push(table);
    outcome.notes.extend(pruned.iter().map(ToString::to_string));

    client.batch_execute(counts::FLUSH_OWN_STATS).await?;
    let dead: i64 = client
        .query_one(counts::PARTITION_DEAD_TUPLES, &[&"outbox_p"])
        .await?
        .get(0);
    let left: i64 = client.query_one(PARTITION_COUNT, &[]).await?.get(0);
    let old_unpublished: i64 = client
        .query_one(OLD_UNPUBLISHED, &[&(retention.seconds as f64)])
        .await?
        .get(0);
    let m = &mut outcome.metrics;
    m.set("partitions_dropped", dropped);
    m.set("guard_refused", kept);
    m.set("partitions_left", left);
    m.set("partitions_before", partitions_before);
    m.set("dead_tuples_after_drop", dead);
    m.set("old_unpublished_kept", old_unpublished);
    Ok(())
}

/// The outbox table's file size after each step (before, after DELETE, after VACUUM, after
/// VACUUM FULL), from the metrics `size_<step>_bytes`.
fn table_size(report: &Report) -> Result<Vec<Plot>> {
    let steps = [
        ("after loading", "size_before_bytes"),
        ("after DELETE", "size_after_delete_bytes"),
        ("after VACUUM", "size_after_vacuum_bytes"),
        ("after VACUUM FULL", "size_after_vacuum_full_bytes"),
    ];
    let bars = steps
        .iter()
        .map(|(label, metric)| {
            let bytes = report
                .metrics
                .get(metric)
                .and_then(serde_json::Value::as_f64)
                .ok_or_else(|| anyhow!("metric {metric} missing"))?;
            let mb = bytes / 1_048_576.0;
            let text = if mb < 1.0 {
                format!("{:.0} kB", bytes / 1024.0)
            } else {
                format!("{mb:.1} MB")
            };
            Ok(Bar {
                label: label.to_string(),
                value: mb,
                text,
                colour: plots::SERIES_COLOURS[0],
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(vec![Plot {
        id: "cleanup-table-size",
        title: "Size of the outbox table's file through the cleanup steps".into(),
        svg: plots::horizontal_bars(&bars, "table file size (MB)")?,
    }])
}
