//! `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)` of a query, read with serde: the figures the article
//! quotes from a plan (execution time, buffers, the scan node, rows removed by its filter) and
//! the plan's key lines, printed the way the article prints them.

use anyhow::{anyhow, Context, Result};
use serde::Deserialize;
use tokio_postgres::types::ToSql;
use tokio_postgres::Client;

/// Prefixed to the query: runs it for real and reports what it did, as JSON.
const EXPLAIN_ANALYZE: &str = "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)";

/// One plan node, with the fields the article reads (serde skips the others).
#[derive(Debug, Clone, Deserialize)]
pub struct Node {
    #[serde(rename = "Node Type")]
    pub node_type: String,
    #[serde(rename = "Index Name")]
    pub index_name: Option<String>,
    #[serde(rename = "Relation Name")]
    pub relation_name: Option<String>,
    #[serde(rename = "Actual Startup Time")]
    pub startup_ms: f64,
    #[serde(rename = "Actual Total Time")]
    pub total_ms: f64,
    #[serde(rename = "Actual Rows")]
    pub rows: f64,
    #[serde(rename = "Actual Loops")]
    pub loops: f64,
    #[serde(rename = "Shared Hit Blocks")]
    pub shared_hit_blocks: i64,
    #[serde(rename = "Shared Read Blocks")]
    pub shared_read_blocks: i64,
    #[serde(rename = "Rows Removed by Filter")]
    pub rows_removed_by_filter: Option<f64>,
    #[serde(rename = "Plans", default)]
    pub plans: Vec<Node>,
}

#[derive(Debug, Deserialize)]
struct Explained {
    #[serde(rename = "Plan")]
    plan: Node,
    #[serde(rename = "Execution Time")]
    execution_ms: f64,
}

/// An executed plan.
#[derive(Debug, Clone)]
pub struct Plan {
    pub root: Node,
    /// The article's "Execution Time".
    pub execution_ms: f64,
}

impl Plan {
    /// Buffers the whole query touched (shared hit + read), as psql's top `Buffers:` line.
    pub fn buffers(&self) -> i64 {
        self.root.shared_hit_blocks + self.root.shared_read_blocks
    }

    /// The node that reads the table: the plan's leaf (these plans have one chain of nodes).
    pub fn scan(&self) -> &Node {
        let mut node = &self.root;
        while let Some(child) = node.plans.first() {
            node = child;
        }
        node
    }

    /// The key lines, as the article prints them:
    /// `Limit (actual time=0.024..0.073 rows=50 loops=1)   Buffers: shared hit=60`.
    pub fn key_lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        let mut node = Some(&self.root);
        let mut depth = 0;
        while let Some(n) = node {
            // psql's layout: each child 6 columns further in, after `->  `.
            let indent = if depth == 0 {
                String::new()
            } else {
                format!("{}->  ", " ".repeat(6 * depth - 4))
            };
            let mut line = format!(
                "{indent}{} (actual time={:.3}..{:.3} rows={} loops={})   Buffers: shared hit={}",
                n.title(),
                n.startup_ms,
                n.total_ms,
                n.rows,
                n.loops,
                n.shared_hit_blocks
            );
            if n.shared_read_blocks > 0 {
                line.push_str(&format!(" read={}", n.shared_read_blocks));
            }
            if let Some(removed) = n.rows_removed_by_filter.filter(|r| *r > 0.0) {
                line.push_str(&format!("   Rows Removed by Filter: {removed}"));
            }
            lines.push(line);
            node = n.plans.first();
            depth += 1;
        }
        lines.push(format!("Execution Time: {:.3} ms", self.execution_ms));
        lines
    }
}

impl Node {
    /// `Index Scan using outbox_unpublished_idx on outbox`, `Seq Scan on outbox`, `Limit`.
    fn title(&self) -> String {
        let mut title = self.node_type.clone();
        if let Some(index) = &self.index_name {
            title.push_str(&format!(" using {index}"));
        }
        if let Some(relation) = &self.relation_name {
            title.push_str(&format!(" on {relation}"));
        }
        title
    }
}

/// Runs `sql` under EXPLAIN ANALYZE (it really executes: row locks are taken, as the relay's
/// fetch takes them) and reads the plan.
pub async fn explain_analyze(
    client: &Client,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Plan> {
    let row = client
        .query_one(&format!("{EXPLAIN_ANALYZE} {sql}"), params)
        .await
        .context("EXPLAIN ANALYZE failed")?;
    let json: serde_json::Value = row.get(0);
    let mut explained: Vec<Explained> =
        serde_json::from_value(json).context("unexpected EXPLAIN (FORMAT JSON) output")?;
    let explained = explained
        .pop()
        .ok_or_else(|| anyhow!("EXPLAIN returned no plan"))?;
    Ok(Plan {
        root: explained.plan,
        execution_ms: explained.execution_ms,
    })
}
