//! multi-relay-ordering (順序保証とパーティション): 300 orders x 3 events, delivered by 1, 2 and 4
//! concurrent relays, each unpartitioned and partitioned by `(hashtext(aggregate_id) & 2147483647) % N`.
//! SKIP LOCKED hands different rows to different relays, so an order's events can overtake each
//! other; partitioning keeps an aggregate on one relay and its order intact.

use std::time::Instant;

use anyhow::{bail, Result};
use serde::Deserialize;

use super::{metric_names, Ctx, Experiment, Outcome, CHILD_TIMEOUT};
use crate::harness::child::ChildEnd;
use crate::judge::counts;
use crate::outbox::consumer::{ConsumerKind, Faults};
use crate::outbox::relay::{Partition, RelayConfig};
use crate::outbox::writer::Ending;
use crate::report::plots::{self, Bar, Plot};
use crate::report::{Report, Table};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub orders: u32,
    pub events_per_order: u32,
    /// Relay counts to try.
    pub relays: Vec<u32>,
    /// Rows per fetch: an order split across two batches is what two relays can reorder.
    pub batch: i64,
}

impl Experiment for Params {
    fn metrics(&self) -> Vec<String> {
        let runs = self
            .relays
            .iter()
            .flat_map(|n| ["partitioned", "unpartitioned"].map(|kind| format!("relays{n}.{kind}")));
        let figures = ["reversals", "orders_out_of_order", "received", "elapsed_ms"];
        metric_names(runs, &figures)
    }

    async fn run(&self, ctx: &Ctx<'_>) -> Result<Outcome> {
        run(ctx, self).await
    }

    fn plots(report: &Report) -> Result<Vec<Plot>> {
        ordering_violations(report)
    }
}

pub async fn run(ctx: &Ctx<'_>, params: &Params) -> Result<Outcome> {
    let mut outcome = Outcome::default();
    let mut table = Table::new(
        "ordering per relay configuration",
        &[
            "relays",
            "partitioned",
            "received",
            "reversals",
            "orders_out_of_order",
            "elapsed_ms",
        ],
    );
    for &relays in &params.relays {
        if relays == 0 {
            bail!("relays must be at least 1");
        }
        for partitioned in [false, true] {
            let layout = if partitioned {
                "partitioned"
            } else {
                "unpartitioned"
            };
            let name = format!("relays{relays}.{layout}");
            let db = ctx.database(&format!("relays{relays}_{layout}")).await?;
            let client = db.connect().await?;
            let consumer = ctx
                .start_consumer(&db, ConsumerKind::Naive, &Faults::default())
                .await?;
            ctx.writer(&db, params.orders, params.events_per_order, Ending::Commit)
                .run(CHILD_TIMEOUT)
                .await?
                .expect(|e| *e == ChildEnd::Ok, "the writer")?;

            let started = Instant::now();
            let mut running = tokio::task::JoinSet::new();
            for index in 0..relays {
                let partition = partitioned.then_some(Partition {
                    index,
                    count: relays,
                });
                let config = RelayConfig {
                    batch: params.batch,
                    partition,
                    ..RelayConfig::default()
                };
                let relay = ctx.relay(&db, &consumer.url, &index.to_string(), &config);
                running.spawn(relay.run(CHILD_TIMEOUT));
            }
            while let Some(ended) = running.join_next().await {
                ended??.expect(|e| *e == ChildEnd::Ok, "a relay")?;
            }
            let elapsed_ms = started.elapsed().as_millis() as i64;
            consumer.stop().await?;

            let received = counts::count(&client, counts::RECEIVED).await?;
            let reversals = counts::one_row(&client, counts::REVERSALS).await?;
            outcome.metrics.set_row(&name, &reversals);
            outcome.metrics.set(format!("{name}.received"), received);
            outcome
                .metrics
                .set(format!("{name}.elapsed_ms"), elapsed_ms);
            table.push(vec![
                relays.to_string(),
                partitioned.to_string(),
                received.to_string(),
                reversals.get::<_, i64>("reversals").to_string(),
                reversals.get::<_, i64>("orders_out_of_order").to_string(),
                elapsed_ms.to_string(),
            ]);
        }
    }
    outcome.tables.push(table);
    Ok(outcome)
}

/// Orders delivered out of order per relay configuration, a bar each (reversals beside), from
/// the table of configurations.
fn ordering_violations(report: &Report) -> Result<Vec<Plot>> {
    let columns = ["relays", "partitioned", "orders_out_of_order"];
    let Some(configurations) = plots::table_with(report, &columns) else {
        return Ok(Vec::new());
    };
    let relays = plots::column(configurations, "relays")?;
    let partitioned = plots::column(configurations, "partitioned")?;
    let out_of_order = plots::column(configurations, "orders_out_of_order")?;
    let reversals = configurations.column("reversals");
    let mut bars = Vec::new();
    for row in &configurations.rows {
        let count = plots::number(&row[out_of_order])?;
        let layout = match row[partitioned].as_str() {
            "true" | "t" => "partitioned",
            _ => "unpartitioned",
        };
        let plural = if row[relays] == "1" {
            "relay"
        } else {
            "relays"
        };
        let mut value = format!("{count:.0} orders");
        if let Some(reversals) = reversals {
            value.push_str(&format!(" ({} reversals)", row[reversals]));
        }
        bars.push(Bar {
            label: format!("{} {plural}, {layout}", row[relays]),
            value: count,
            text: value,
            colour: if count > 0.0 { plots::BAD } else { plots::GOOD },
        });
    }
    Ok(vec![Plot {
        id: "ordering-violations",
        title: "Orders whose events arrived out of order, per relay configuration".into(),
        svg: plots::horizontal_bars(&bars, "orders with an event overtaken by a later one")?,
    }])
}
