//! partial-index (部分インデックスの効き目): 200,000 published rows and 50 unpublished ones;
//! EXPLAIN ANALYZE of the relay's own fetch (`relay::sql::FETCH_BATCH`) with the partial index, then
//! with it dropped. Beyond the article, the "churned" case: right after 200,000 rows were
//! published by UPDATE the partial index still holds their dead entries, and only VACUUM makes
//! the fetch cheap again.

use anyhow::Result;
use chrono::{TimeDelta, Utc};
use serde::Deserialize;
use tokio_postgres::Client;

use super::{metric_names, Ctx, Experiment, Outcome};
use crate::harness::load::{self, OutboxRows};
use crate::judge::counts;
use crate::judge::explain::{self, Plan};
use crate::outbox::relay::sql::{FETCH_BATCH, MARK_PUBLISHED};
use crate::outbox::relay::RelayConfig;
use crate::outbox::schema;
use crate::report::{Metrics, Table};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// Rows already published (the article's 200,000).
    pub published: i64,
    /// Rows waiting for the relay (the article's 50).
    pub unpublished: i64,
    /// Payload padding, sizing the table like the article's (~62 MB for 200,000 rows).
    pub payload_padding: usize,
}

impl Experiment for Params {
    fn metrics(&self) -> Vec<String> {
        let plans = [
            "without_index",
            "with_index",
            "churned_first",
            "churned_second",
            "churned_after_vacuum",
        ];
        let figures = [
            "ms",
            "buffers",
            "node",
            "index_name",
            "rows",
            "rows_removed_by_filter",
            "shared_hit",
            "shared_read",
        ];
        let mut metrics = metric_names(plans, &figures);
        metrics.extend(metric_names(
            [""],
            &["table_bytes", "table_blocks", "index_bytes"],
        ));
        metrics
    }

    async fn run(&self, ctx: &Ctx<'_>) -> Result<Outcome> {
        run(ctx, self).await
    }
}

/// The article's partial index, as `schema::CREATE_OUTBOX` names it.
const PARTIAL_INDEX: &str = "outbox_unpublished_idx";

const DROP_PARTIAL_INDEX: &str = "DROP INDEX outbox_unpublished_idx";

/// All published rows at once, with the relay's own mark: their partial-index entries go dead.
const ALL_IDS: &str = "SELECT id FROM outbox ORDER BY id";

pub async fn run(ctx: &Ctx<'_>, params: &Params) -> Result<Outcome> {
    let mut outcome = Outcome::default();
    let (with_index, without_index) = clean(ctx, params, &mut outcome).await?;
    outcome
        .tables
        .insert(0, article_vs_measured(ctx, &outcome.metrics));
    outcome.tables.push(plan_table(
        "EXPLAIN (ANALYZE, BUFFERS) of the relay's fetch, with the partial index",
        &with_index,
    ));
    outcome.tables.push(plan_table(
        "EXPLAIN (ANALYZE, BUFFERS) of the relay's fetch, partial index dropped",
        &without_index,
    ));
    churned(ctx, params, &mut outcome).await?;
    Ok(outcome)
}

/// The article's case: published rows that were never unpublished in this table.
async fn clean(ctx: &Ctx<'_>, params: &Params, outcome: &mut Outcome) -> Result<(Plan, Plan)> {
    let db = ctx.database("clean").await?;
    let client = db.connect().await?;
    client.batch_execute(schema::NO_AUTOVACUUM).await?;
    copy_first_rows(ctx, &client, params, true).await?;
    load_unpublished(ctx, &client, params).await?;
    client.batch_execute("ANALYZE outbox").await?;
    let table_bytes: i64 = client
        .query_one(counts::RELATION_BYTES, &[&"outbox"])
        .await?
        .get(0);
    let index_bytes: i64 = client
        .query_one(counts::RELATION_BYTES, &[&PARTIAL_INDEX])
        .await?
        .get(0);
    let m = &mut outcome.metrics;
    m.set("table_bytes", table_bytes);
    m.set("table_blocks", table_bytes / 8192);
    m.set("index_bytes", index_bytes);

    let with_index = fetch_plan(&client).await?;
    record(m, "with_index", &with_index);
    client.batch_execute(DROP_PARTIAL_INDEX).await?;
    let without_index = fetch_plan(&client).await?;
    record(m, "without_index", &without_index);
    Ok((with_index, without_index))
}

/// Beyond the article: the same rows written unpublished, then published by the relay's own
/// UPDATE (in one statement), then the unpublished ones.
async fn churned(ctx: &Ctx<'_>, params: &Params, outcome: &mut Outcome) -> Result<()> {
    let db = ctx.database("churned").await?;
    let client = db.connect().await?;
    client.batch_execute(schema::NO_AUTOVACUUM).await?;
    copy_first_rows(ctx, &client, params, false).await?;
    let ids = counts::ids(&client, ALL_IDS, &[]).await?;
    client.execute(MARK_PUBLISHED, &[&ids]).await?;
    load_unpublished(ctx, &client, params).await?;
    client.batch_execute("ANALYZE outbox").await?;

    let mut table = Table::new(
        "the fetch after 200,000 rows were published by UPDATE (beyond the article)",
        &["when", "node", "execution ms", "buffers"],
    );
    let mut step = |name: &str, when: &str, plan: &Plan, outcome: &mut Outcome| {
        record(&mut outcome.metrics, name, plan);
        table.push(vec![
            when.into(),
            plan.scan().node_type.clone(),
            format!("{:.3}", plan.execution_ms),
            plan.buffers().to_string(),
        ]);
    };
    let first = fetch_plan(&client).await?;
    step(
        "churned_first",
        "first fetch (dead index entries)",
        &first,
        outcome,
    );
    let second = fetch_plan(&client).await?;
    step(
        "churned_second",
        "second fetch (entries hinted dead)",
        &second,
        outcome,
    );
    client.batch_execute("VACUUM outbox").await?;
    let vacuumed = fetch_plan(&client).await?;
    step("churned_after_vacuum", "after VACUUM", &vacuumed, outcome);
    outcome.tables.push(table);
    Ok(())
}

/// The `published` rows (created a day ago), published already or not yet.
async fn copy_first_rows(
    ctx: &Ctx<'_>,
    client: &Client,
    params: &Params,
    published: bool,
) -> Result<()> {
    let rows = OutboxRows {
        count: params.published,
        first_order_id: 1,
        payload_padding: params.payload_padding,
        created_from: Utc::now() - TimeDelta::days(1),
        published,
    };
    load::copy_rows(client, "outbox", &rows, ctx.progress()).await?;
    Ok(())
}

/// The rows waiting for the relay, younger than every other.
async fn load_unpublished(ctx: &Ctx<'_>, client: &Client, params: &Params) -> Result<()> {
    let rows = OutboxRows {
        count: params.unpublished,
        first_order_id: params.published + 1,
        payload_padding: params.payload_padding,
        created_from: Utc::now(),
        published: false,
    };
    load::copy_rows(client, "outbox", &rows, ctx.progress()).await?;
    Ok(())
}

/// The relay's fetch, with the relay's own parameters (attempts < 5, LIMIT 100).
async fn fetch_plan(client: &Client) -> Result<Plan> {
    let config = RelayConfig::default();
    explain::explain_analyze(client, FETCH_BATCH, &[&config.max_attempts, &config.batch]).await
}

fn record(metrics: &mut Metrics, prefix: &str, plan: &Plan) {
    let scan = plan.scan();
    metrics.set(format!("{prefix}.ms"), plan.execution_ms);
    metrics.set(format!("{prefix}.buffers"), plan.buffers());
    metrics.set(format!("{prefix}.node"), scan.node_type.clone());
    if let Some(index) = &scan.index_name {
        metrics.set(format!("{prefix}.index_name"), index.clone());
    }
    metrics.set(format!("{prefix}.rows"), plan.root.rows as i64);
    if let Some(removed) = scan.rows_removed_by_filter {
        metrics.set(format!("{prefix}.rows_removed_by_filter"), removed as i64);
    }
    metrics.set(format!("{prefix}.shared_hit"), plan.root.shared_hit_blocks);
    metrics.set(
        format!("{prefix}.shared_read"),
        plan.root.shared_read_blocks,
    );
}

fn plan_table(title: &str, plan: &Plan) -> Table {
    let mut table = Table::new(title, &["QUERY PLAN (key lines)"]);
    for line in plan.key_lines() {
        table.push(vec![line]);
    }
    table
}

/// The article's figures (from the scenario file) beside this run's.
fn article_vs_measured(ctx: &Ctx<'_>, metrics: &Metrics) -> Table {
    let mut table = Table::new(
        "article vs measured",
        &[
            "",
            "with index (article)",
            "with index (measured)",
            "without index (article)",
            "without index (measured)",
        ],
    );
    let measured = |metric: &str| match metrics.get(metric) {
        Some(serde_json::Value::String(text)) => text.clone(),
        Some(serde_json::Value::Number(n)) if n.is_f64() => {
            format!("{:.3}", n.as_f64().unwrap_or_default())
        }
        Some(value) => value.to_string(),
        None => String::new(),
    };
    for (what, metric) in [
        ("execution time (ms)", "ms"),
        ("buffers", "buffers"),
        ("scan node", "node"),
    ] {
        let with = format!("with_index.{metric}");
        let without = format!("without_index.{metric}");
        table.push(vec![
            what.into(),
            ctx.article(&with),
            measured(&with),
            ctx.article(&without),
            measured(&without),
        ]);
    }
    table.push(vec![
        "partial index size (bytes)".into(),
        ctx.article("index_bytes"),
        measured("index_bytes"),
        String::new(),
        String::new(),
    ]);
    table
}
