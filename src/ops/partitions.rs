//! The article's daily-partitioned outbox (`outbox_p`) and its cleanup: find the partitions whose
//! whole day is older than a cutoff, check that none still holds an unpublished row (the guard),
//! then DETACH and DROP them. Used by the cleanup scenario and by `outbox-lab prune`, so the
//! experiment measures exactly what operators run.

use std::fmt;
use std::str::FromStr;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use chrono::NaiveDate;
use tokio_postgres::Client;

/// The article's partitioned outbox, statement for statement.
pub const CREATE_OUTBOX_P: &str = "
CREATE TABLE outbox_p (
  id bigint GENERATED ALWAYS AS IDENTITY, event_id uuid NOT NULL DEFAULT gen_random_uuid(),
  aggregate_type text NOT NULL, aggregate_id text NOT NULL, event_type text NOT NULL,
  payload jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
  published_at timestamptz,
  PRIMARY KEY (created_at, id)              -- the partition key must be part of the primary key
) PARTITION BY RANGE (created_at);
CREATE INDEX ON outbox_p (id) WHERE published_at IS NULL;";

/// What prune needs to know about the table it was given.
const DESCRIBE_TABLE: &str = "
SELECT c.relkind::text AS relkind,
       p.partstrat::text AS strategy,
       EXISTS (SELECT 1 FROM pg_attribute a
                WHERE a.attrelid = c.oid AND a.attname = 'published_at' AND NOT a.attisdropped)
         AS has_published_at
  FROM pg_class c
  LEFT JOIN pg_partitioned_table p ON p.partrelid = c.oid
 WHERE c.oid = to_regclass($1)";

/// The partitions of $1 whose range ends at or before now() - $2 seconds, oldest first. A RANGE
/// bound reads `FOR VALUES FROM ('...') TO ('...')`; the default partition and MAXVALUE bounds
/// have no such upper bound and are never chosen.
const PARTITIONS_OLDER_THAN: &str = "
SELECT format('%I.%I', n.nspname, c.relname) AS partition,
       b.upper_bound::text AS upper_bound,
       pg_size_pretty(pg_total_relation_size(c.oid)) AS size
  FROM pg_inherits i
  JOIN pg_class c ON c.oid = i.inhrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace
 CROSS JOIN LATERAL (
       SELECT substring(pg_get_expr(c.relpartbound, c.oid) FROM 'TO \\(''([^'']+)''\\)')::timestamptz
                AS upper_bound) b
 WHERE i.inhparent = to_regclass($1)
   AND b.upper_bound <= now() - make_interval(secs => $2)
 ORDER BY b.upper_bound";

/// The article's guard: 0 means the partition may be dropped.
const GUARD: &str = "SELECT count(*) FROM {partition} WHERE published_at IS NULL";

/// While the guard counts, no writer may add or change a row of the partition.
const LOCK_PARTITION: &str = "LOCK TABLE {partition} IN SHARE MODE";

pub const DETACH: &str = "ALTER TABLE {table} DETACH PARTITION {partition}";

pub const DROP: &str = "DROP TABLE {partition}";

/// One day's partition: `CREATE TABLE outbox_p_2026_11_03 PARTITION OF outbox_p FOR VALUES
/// FROM ('2026-11-03') TO ('2026-11-04')`, with the bounds in UTC.
pub fn create_daily_partition(day: NaiveDate) -> String {
    let next = day.succ_opt().expect("a day before the end of time");
    format!(
        "CREATE TABLE {} PARTITION OF outbox_p FOR VALUES FROM ('{day} 00:00+00') TO ('{next} 00:00+00')",
        daily_partition_name(day)
    )
}

/// `outbox_p_2026_11_03`.
pub fn daily_partition_name(day: NaiveDate) -> String {
    format!("outbox_p_{}", day.format("%Y_%m_%d"))
}

/// How old a partition's whole range must be to be pruned: `3d`, `12h`, `90m`, `30s`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Age {
    pub seconds: i64,
}

impl Age {
    pub fn days(days: i64) -> Age {
        Age {
            seconds: days * 86_400,
        }
    }
}

impl FromStr for Age {
    type Err = anyhow::Error;

    fn from_str(text: &str) -> Result<Age> {
        let invalid = || {
            anyhow!("invalid age '{text}': expected a whole number and a unit (d, h, m or s), e.g. 3d or 12h")
        };
        let split = text
            .find(|c: char| !c.is_ascii_digit())
            .ok_or_else(invalid)?;
        let (number, unit) = text.split_at(split);
        let number: i64 = number.parse().map_err(|_| invalid())?;
        let unit_seconds = match unit {
            "d" => 86_400,
            "h" => 3_600,
            "m" => 60,
            "s" => 1,
            _ => return Err(invalid()),
        };
        let seconds = number.checked_mul(unit_seconds).ok_or_else(invalid)?;
        Ok(Age { seconds })
    }
}

/// A partition old enough to go.
#[derive(Debug, Clone)]
pub struct OldPartition {
    /// Schema-qualified and quoted, ready for SQL.
    pub name: String,
    /// Where its range ends, as the server prints a timestamptz.
    pub upper_bound: String,
    /// Its size with its indexes, as `pg_size_pretty` prints it.
    pub size: String,
    /// What the guard counted.
    pub unpublished: i64,
}

/// What prune did (or, in a dry run, would do) with one old partition.
#[derive(Debug, Clone)]
pub enum Action {
    /// Detached and dropped; each statement timed (DETACH with its commit).
    Dropped { detach_ms: f64, drop_ms: f64 },
    /// Dry run: the guard passed, it would be dropped.
    WouldDrop,
    /// The guard found unpublished rows: kept, never dropped (dry run or not).
    Kept,
}

#[derive(Debug, Clone)]
pub struct Pruned {
    pub partition: OldPartition,
    pub action: Action,
}

impl fmt::Display for Pruned {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = &self.partition;
        match &self.action {
            Action::Dropped { detach_ms, drop_ms } => write!(
                f,
                "dropped {} (ended {}, {}): DETACH {detach_ms:.3} ms, DROP {drop_ms:.3} ms",
                p.name, p.upper_bound, p.size
            ),
            Action::WouldDrop => write!(
                f,
                "would drop {} (ended {}, {}; no unpublished row)",
                p.name, p.upper_bound, p.size
            ),
            Action::Kept => write!(
                f,
                "keeping {} (ended {}): {} unpublished row(s) still waiting for the relay, not dropped",
                p.name, p.upper_bound, p.unpublished
            ),
        }
    }
}

/// Drops every partition of `table` whose whole range is older than `older_than`, except those
/// that still hold an unpublished row: those are kept and reported. A dry run only looks.
pub async fn prune(
    client: &mut Client,
    table: &str,
    older_than: Age,
    dry_run: bool,
) -> Result<Vec<Pruned>> {
    check_partitioned(client, table).await?;
    let rows = client
        .query(
            PARTITIONS_OLDER_THAN,
            &[&table, &(older_than.seconds as f64)],
        )
        .await
        .context("cannot list the partitions")?;
    let mut pruned = Vec::with_capacity(rows.len());
    for row in rows {
        let partition = OldPartition {
            name: row.get("partition"),
            upper_bound: row.get("upper_bound"),
            size: row.get("size"),
            unpublished: 0,
        };
        pruned.push(if dry_run {
            look(client, partition).await?
        } else {
            guarded_drop(client, table, partition).await?
        });
    }
    Ok(pruned)
}

/// Clear errors for a table prune cannot work on.
async fn check_partitioned(client: &Client, table: &str) -> Result<()> {
    let Some(row) = client.query_opt(DESCRIBE_TABLE, &[&table]).await? else {
        bail!("no table named '{table}' in this database (see --table)");
    };
    let relkind: String = row.get("relkind");
    let strategy: Option<String> = row.get("strategy");
    if relkind != "p" {
        bail!("table '{table}' is not partitioned; prune drops the daily RANGE partitions of a partitioned outbox");
    }
    if strategy.as_deref() != Some("r") {
        bail!("table '{table}' is not partitioned by RANGE; prune drops daily RANGE partitions");
    }
    if !row.get::<_, bool>("has_published_at") {
        bail!("table '{table}' has no published_at column: the guard cannot tell unpublished rows");
    }
    Ok(())
}

fn sql(template: &str, table: &str, partition: &str) -> String {
    template
        .replace("{table}", table)
        .replace("{partition}", partition)
}

/// Dry run: the guard only.
async fn look(client: &Client, mut partition: OldPartition) -> Result<Pruned> {
    partition.unpublished = client
        .query_one(&sql(GUARD, "", &partition.name), &[])
        .await?
        .get(0);
    let action = if partition.unpublished > 0 {
        Action::Kept
    } else {
        Action::WouldDrop
    };
    Ok(Pruned { partition, action })
}

/// The guard under a lock, then DETACH (committed) and DROP, each timed.
async fn guarded_drop(
    client: &mut Client,
    table: &str,
    mut partition: OldPartition,
) -> Result<Pruned> {
    let name = partition.name.clone();
    let tx = client.transaction().await?;
    tx.batch_execute(&sql(LOCK_PARTITION, table, &name))
        .await
        .with_context(|| format!("cannot lock {name}"))?;
    partition.unpublished = tx.query_one(&sql(GUARD, table, &name), &[]).await?.get(0);
    if partition.unpublished > 0 {
        tx.rollback().await?;
        return Ok(Pruned {
            partition,
            action: Action::Kept,
        });
    }
    let detach_started = Instant::now();
    tx.batch_execute(&sql(DETACH, table, &name))
        .await
        .with_context(|| format!("cannot detach {name}"))?;
    tx.commit().await?;
    let detach_ms = elapsed_ms(detach_started);
    let drop_started = Instant::now();
    client
        .batch_execute(&sql(DROP, table, &name))
        .await
        .with_context(|| format!("cannot drop {name} (it is detached already)"))?;
    let drop_ms = elapsed_ms(drop_started);
    Ok(Pruned {
        partition,
        action: Action::Dropped { detach_ms, drop_ms },
    })
}

fn elapsed_ms(started: Instant) -> f64 {
    started.elapsed().as_secs_f64() * 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ages parse with their unit; anything else is an error that says what is expected.
    #[test]
    fn ages_parse_and_typos_are_rejected() {
        assert_eq!("3d".parse::<Age>().unwrap(), Age::days(3));
        assert_eq!("12h".parse::<Age>().unwrap().seconds, 43_200);
        assert_eq!("90m".parse::<Age>().unwrap().seconds, 5_400);
        assert_eq!("30s".parse::<Age>().unwrap().seconds, 30);
        for bad in ["3", "d", "3 d", "3days", "-3d", "", "3.5d"] {
            let error = bad.parse::<Age>().unwrap_err().to_string();
            assert!(error.contains("e.g. 3d or 12h"), "{bad}: {error}");
        }
    }
}
