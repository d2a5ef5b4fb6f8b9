//! reply-lost (beyond the article: the network between relay and consumer): the article's relay
//! delivers through a TCP proxy that adds latency, resets a connection, and loses replies after
//! the consumer acted on the request and committed. The relay's request timeout counts a lost
//! reply as a failure and delivers again: the naive consumer ships those orders twice, the
//! idempotent one does not, and every event still arrives.

use std::time::Duration;

use anyhow::{bail, Result};
use serde::Deserialize;

use super::{metric_names, Ctx, Experiment, Outcome};
use crate::harness::child::ChildEnd;
use crate::harness::link::faults::{FaultPlan, ProxyFaults};
use crate::harness::link::http::Proxy;
use crate::judge::counts;
use crate::outbox::consumer::{ConsumerKind, Faults};
use crate::outbox::relay::RelayConfig;
use crate::outbox::writer::Ending;
use crate::report::Table;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// Orders written, each with one event.
    pub events: u32,
    /// What the proxy does to which request (`reply-lost@2`, `reset@3`).
    pub faults: Vec<FaultPlan>,
    /// Every request waits this long in the proxy.
    pub latency_ms: u64,
    /// The relay's request timeout: how long it waits for a reply before it counts a failure.
    pub request_timeout_ms: u64,
}

/// Both consumers meet the same crash: the naive one ships twice, the idempotent one does not.
const CONSUMERS: [ConsumerKind; 2] = [ConsumerKind::Naive, ConsumerKind::Idempotent];

impl Experiment for Params {
    fn metrics(&self) -> Vec<String> {
        let proxied = ["requests", "replies_lost", "resets", "relay_failures"];
        let mut metrics =
            metric_names(CONSUMERS.map(ConsumerKind::name), &counts::DELIVERY_FIGURES);
        metrics.extend(metric_names(CONSUMERS.map(ConsumerKind::name), &proxied));
        metrics.push("lost".into());
        metrics
    }

    fn validate(&self) -> Result<()> {
        // A fault on a first delivery hits one event once: the damage it does is countable.
        if let Some(plan) = self.faults.iter().find(|p| p.on_request > self.events) {
            bail!(
                "fault {plan} must hit one of the first {} requests (the first deliveries)",
                self.events
            );
        }
        if self.latency_ms >= self.request_timeout_ms {
            bail!(
                "latency_ms {} must stay under request_timeout_ms {}, or every delivery fails",
                self.latency_ms,
                self.request_timeout_ms
            );
        }
        Ok(())
    }

    async fn run(&self, ctx: &Ctx<'_>) -> Result<Outcome> {
        run(ctx, self).await
    }
}

pub async fn run(ctx: &Ctx<'_>, params: &Params) -> Result<Outcome> {
    let mut outcome = Outcome::default();
    let mut summary = counts::ConsumerComparison::new(
        "naive vs idempotent behind the faulty network",
        &["requests", "replies_lost", "resets", "relay_failures"],
        &["received", "shipments", "duplicate_shipments", "lost"],
    );
    let faults = ProxyFaults {
        latency: Duration::from_millis(params.latency_ms),
        plans: params.faults.clone(),
        watch: None,
        down: Default::default(),
    };
    let config = RelayConfig {
        request_timeout: Duration::from_millis(params.request_timeout_ms),
        ..RelayConfig::default()
    };
    let mut lost_total = 0i64;
    for kind in CONSUMERS {
        let name = kind.name();
        let db = ctx.database(name).await?;
        let client = db.connect().await?;
        let consumer = ctx.start_consumer(&db, kind, &Faults::default()).await?;
        let proxy = Proxy::start(&consumer.url, faults.clone(), 0).await?;
        ctx.run_writer(&db, params.events, Ending::Commit, None)
            .await?
            .expect(|e| *e == ChildEnd::Ok, "the writer")?;
        let relay = ctx
            .run_relay(&db, &proxy.url, "0", &config, None)
            .await?
            .expect(|e| *e == ChildEnd::Ok, "the relay")?;
        outcome
            .notes
            .extend(relay.log_lines().map(|l| format!("[{name}] {l}")));
        let proxied = proxy.record().counts();
        drop(proxy);
        consumer.stop().await?;

        let tries = client.query(counts::TRIES, &[]).await?;
        outcome.tables.push(Table::from_rows(
            format!("what reached the {name} consumer"),
            &tries,
        ));
        let row = counts::one_row(&client, counts::DELIVERIES).await?;
        let failures = counts::count(&client, counts::RELAY_FAILURES).await?;
        let m = &mut outcome.metrics;
        m.set_row(name, &row);
        m.set(format!("{name}.requests"), proxied.requests);
        m.set(format!("{name}.replies_lost"), proxied.replies_lost);
        m.set(format!("{name}.resets"), proxied.resets);
        m.set(format!("{name}.relay_failures"), failures);
        lost_total += row.get::<_, i64>("lost");
        let own = vec![
            proxied.requests.to_string(),
            proxied.replies_lost.to_string(),
            proxied.resets.to_string(),
            failures.to_string(),
        ];
        summary.push(name, own, &row);
    }
    outcome.metrics.set("lost", lost_total);
    outcome.tables.insert(0, summary.table());
    Ok(outcome)
}
