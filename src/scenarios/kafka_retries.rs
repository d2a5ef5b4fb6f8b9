//! kafka-retries (beyond the article: what a Kafka producer's retries do to order and to
//! duplicates). The outbox, `events_per_order` events an order, relayed to a topic of one
//! partition in Produce requests of `records_per_request` records (a small `batch.size`), one
//! of them — the `refused`-th — answered NOT_LEADER_OR_FOLLOWER by outbox-lab's Kafka proxy, as
//! when a partition's leadership moves, and retried by the producer. With one request in flight
//! per partition the retry goes before the requests behind it: every order's events in the
//! partition in the order they were written. With several in flight (Kafka's default
//! `max.in.flight.requests.per.connection` is 5) and no idempotent producer, the requests
//! behind it are written first: an order's later event before its earlier one, and a consumer
//! reading the partition applies them in that order. Counted from the partition itself.
//!
//! Then a relay killed between Kafka's ack and its mark (its crash point after sending, before
//! marking): its successor produces those records again, which the naive consumer ships twice
//! and the idempotent one once. Run once per consumer kind, as relay-crash is.

use std::collections::{BTreeMap, HashMap};

use anyhow::{bail, Result};
use serde::Deserialize;

use super::{metric_names, Ctx, Experiment, Outcome, CHILD_TIMEOUT};
use crate::connect;
use crate::harness::child::role::KafkaWorkerRole;
use crate::harness::child::{ChildCommand, ChildEnd};
use crate::harness::link::faults::{FaultPlan, NetworkFault, ProxyFaults};
use crate::harness::link::kafka_proxy::KafkaProxy;
use crate::judge::counts;
use crate::outbox::consumer::ConsumerKind;
use crate::outbox::crash::{CrashPlan, CrashPoint};
use crate::outbox::event::Event;
use crate::outbox::relay::RelayConfig;
use crate::outbox::sink::{KafkaSink, PARTITIONS};
use crate::outbox::writer::Ending;
use crate::report::plots::{self, Bar, Plot};
use crate::report::{Report, Table};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// Orders written for the order cases...
    pub orders: u32,
    /// ... each with this many events, written together (consecutive outbox ids).
    pub events_per_order: u32,
    /// The relay's batch.
    pub batch: i64,
    /// Records per Produce request: not a multiple of `events_per_order`, so that some order's
    /// events travel in two requests.
    pub records_per_request: usize,
    /// Produce requests in flight at once per partition, a case each.
    pub in_flight: Vec<usize>,
    /// The Produce request refused (counted over the run's case, from 1).
    pub refused: u32,
    /// The crash case: orders written, one event each...
    pub events: u32,
    /// ... and the first relay dies after producing this many, before marking them.
    pub crash_after: u32,
}

/// The order cases' figures, counted from the partition.
const ORDER_FIGURES: [&str; 5] = [
    "refused",
    "records",
    "distinct_events",
    "lost",
    "orders_out_of_order",
];
/// Both consumers meet the same crash.
const CONSUMERS: [ConsumerKind; 2] = [ConsumerKind::Naive, ConsumerKind::Idempotent];
/// The topic's aggregate type, as the writer writes it.
const ORDERS: &str = "orders";
/// Records the Kafka worker reads and applies at a time.
const WORKER_BATCH: usize = 100;

impl Params {
    fn case(in_flight: usize) -> String {
        format!("in_flight{in_flight}")
    }
}

impl Experiment for Params {
    fn metrics(&self) -> Vec<String> {
        let cases = self.in_flight.iter().map(|&n| Params::case(n));
        let mut metrics = metric_names(cases, &ORDER_FIGURES);
        let consumers = CONSUMERS.map(|kind| format!("crash.{}", kind.name()));
        metrics.extend(metric_names(consumers, &counts::DELIVERY_FIGURES));
        metrics
    }

    fn validate(&self) -> Result<()> {
        super::check_crash_after(self.events, self.crash_after)?;
        if self.orders == 0 || self.events_per_order < 2 {
            bail!("orders must be at least 1, events_per_order at least 2 (an order to keep)");
        }
        let per_order = self.events_per_order as usize;
        if self.records_per_request == 0 || self.records_per_request.is_multiple_of(per_order) {
            bail!(
                "records_per_request must be at least 1 and not a multiple of \
                 events_per_order ({per_order}): else no order's events travel in two requests"
            );
        }
        if self.batch < 1 || self.in_flight.is_empty() || self.in_flight.contains(&0) {
            bail!("batch must be at least 1, in_flight at least one value, each at least 1");
        }
        let events = (self.orders * self.events_per_order) as usize;
        let requests = events.div_ceil(self.records_per_request);
        if self.refused == 0 || self.refused as usize >= requests {
            bail!(
                "refused must be between 1 and {} (the Produce requests but the last)",
                requests - 1
            );
        }
        Ok(())
    }

    async fn run(&self, ctx: &Ctx<'_>) -> Result<Outcome> {
        run(ctx, self).await
    }

    fn plots(report: &Report) -> Result<Vec<Plot>> {
        orders_broken(report)
    }
}

/// The orders each case broke: out of order in the partition per requests in flight, shipped
/// twice per consumer after the crash; none where the result lacks a figure.
fn orders_broken(report: &Report) -> Result<Vec<Plot>> {
    let in_flight: Vec<usize> = report
        .params
        .get("in_flight")
        .and_then(|v| serde_json::from_value(v.clone()).ok())
        .unwrap_or_default();
    let mut rows: Vec<(String, String)> = in_flight
        .iter()
        .map(|n| {
            let label = format!("{n} in flight: orders out of order");
            (label, format!("{}.orders_out_of_order", Params::case(*n)))
        })
        .collect();
    for kind in CONSUMERS {
        let label = format!(
            "killed after the ack, {}: orders shipped twice",
            kind.name()
        );
        rows.push((label, format!("crash.{}.orders_shipped_twice", kind.name())));
    }
    let mut bars = Vec::new();
    for (label, metric) in rows {
        let Some(value) = report.metrics.get(&metric).and_then(|v| v.as_f64()) else {
            return Ok(Vec::new());
        };
        bars.push(Bar {
            label,
            value,
            text: format!("{value:.0}"),
            colour: if value > 0.0 { plots::BAD } else { plots::GOOD },
        });
    }
    Ok(vec![Plot {
        id: "kafka-retries",
        title: "Kafka: orders a retried Produce put out of order, and a crash shipped twice".into(),
        svg: plots::horizontal_bars(&bars, "orders")?,
    }])
}

pub async fn run(ctx: &Ctx<'_>, params: &Params) -> Result<Outcome> {
    let mut outcome = Outcome::default();
    let mut summary = Table::new(
        "a Produce refused and retried, per requests in flight (one partition)",
        &[
            "in flight",
            "requests refused",
            "records",
            "distinct events",
            "lost",
            "orders out of order",
        ],
    );
    for &in_flight in &params.in_flight {
        let case = Params::case(in_flight);
        let (figures, out_of_order) = retried(ctx, params, in_flight).await?;
        let mut row = vec![in_flight.to_string()];
        for (name, value) in ORDER_FIGURES.iter().zip(figures) {
            outcome.metrics.set(format!("{case}.{name}"), value);
            row.push(value.to_string());
        }
        summary.push(row);
        let mut table = Table::new(
            format!("orders out of order ({in_flight} in flight): their outbox ids as the partition holds them"),
            &["order", "outbox ids"],
        );
        for (order, ids) in &out_of_order {
            let ids: Vec<String> = ids.iter().map(i64::to_string).collect();
            table.push(vec![order.clone(), ids.join(", ")]);
        }
        if !out_of_order.is_empty() {
            outcome.tables.push(table);
        }
    }
    outcome.tables.insert(0, summary);

    let mut crashes = counts::ConsumerComparison::new(
        "a relay killed between Kafka's ack and its mark: naive vs idempotent",
        &["records"],
        &[
            "received",
            "distinct_events",
            "shipments",
            "orders_shipped_twice",
        ],
    )
    .heading("received", "records applied");
    for kind in CONSUMERS {
        let (records, row) = crashed(ctx, params, kind).await?;
        outcome
            .metrics
            .set_row(&format!("crash.{}", kind.name()), &row);
        crashes.push(kind.name(), vec![records.to_string()], &row);
    }
    outcome.tables.push(crashes.table());
    outcome.notes.push(format!(
        "the order cases: {} orders of {} events, a batch of {}, {} records a Produce, the \
         Produce {} refused (NOT_LEADER_OR_FOLLOWER) through outbox-lab's Kafka proxy; the crash: \
         {} orders, the first relay killed after producing {}, before marking them",
        params.orders,
        params.events_per_order,
        params.batch,
        params.records_per_request,
        params.refused,
        params.events,
        params.crash_after
    ));
    Ok(outcome)
}

/// One order case: the outbox written, relayed with `in_flight` requests in flight through a
/// proxy that refuses one, and the partition read back. Its figures (in [`ORDER_FIGURES`]'
/// order), and each order found out of order with its outbox ids as the partition holds them.
async fn retried(
    ctx: &Ctx<'_>,
    params: &Params,
    in_flight: usize,
) -> Result<([i64; 5], BTreeMap<String, Vec<i64>>)> {
    let db = ctx.database(&Params::case(in_flight)).await?;
    let topic = ctx
        .kafka()
        .create_topic(&KafkaSink::topic_name("", ORDERS), 1)
        .await?;
    ctx.writer(&db, params.orders, params.events_per_order, Ending::Commit)
        .run(CHILD_TIMEOUT)
        .await?
        .expect(|e| *e == ChildEnd::Ok, "the writer")?;
    let url = ctx.kafka().url().await?;
    let refuse = FaultPlan {
        fault: NetworkFault::Refuse,
        on_request: params.refused,
    };
    let faults = ProxyFaults {
        plans: vec![refuse],
        ..ProxyFaults::default()
    };
    let proxy = KafkaProxy::start(&url, faults, 1).await?;
    let config = RelayConfig {
        batch: params.batch,
        ..RelayConfig::default()
    };
    ctx.relay(&db, proxy.relay_url(0), "0", &config)
        .with(|relay| {
            relay.sink.in_flight = in_flight;
            relay.sink.records_per_request = params.records_per_request;
        })
        .run(CHILD_TIMEOUT)
        .await?
        .expect(|e| *e == ChildEnd::Ok, "the relay")?;
    let refused = i64::from(proxy.record().struck_at(params.refused).is_some());
    drop(proxy);

    // Each order's outbox ids in the partition's order, and the distinct events.
    let mut held: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    let mut records = 0;
    let mut distinct = std::collections::HashSet::new();
    let client = connect::kafka(&url).await?;
    let partitions = KafkaSink::partition_clients(&client, &topic).await?;
    KafkaSink::read_past(&partitions, &HashMap::new(), |_, record| {
        records += 1;
        let value = record.value.as_deref().unwrap_or_default();
        if let Ok(event) = serde_json::from_slice::<Event>(value) {
            distinct.insert(event.event_id);
            let id = event.outbox_id.unwrap_or_default();
            held.entry(event.aggregate_id).or_default().push(id);
        }
    })
    .await?;
    held.retain(|_, ids| ids.windows(2).any(|pair| pair[1] < pair[0]));
    let written = counts::count(&db.connect().await?, counts::OUTBOX_ROWS).await?;
    let distinct = distinct.len() as i64;
    let figures = [
        refused,
        records,
        distinct,
        written - distinct,
        held.len() as i64,
    ];
    Ok((figures, held))
}

/// The crash case for one consumer kind: `events` orders, the first relay killed after producing
/// `crash_after` before marking them, a second relay producing all again, and a Kafka worker of
/// `kind` applying the topic. The records the topic holds, and the consumer's figures.
async fn crashed(
    ctx: &Ctx<'_>,
    params: &Params,
    kind: ConsumerKind,
) -> Result<(i64, tokio_postgres::Row)> {
    let db = ctx.database(&format!("crash_{}", kind.name())).await?;
    let topic = ctx
        .kafka()
        .create_topic(&KafkaSink::topic_name("", ORDERS), PARTITIONS)
        .await?;
    ctx.run_writer(&db, params.events, Ending::Commit, None)
        .await?
        .expect(|e| *e == ChildEnd::Ok, "the writer")?;
    let url = ctx.kafka().url().await?;
    // The first relay's batch is what it produces before it dies: nothing else in flight.
    let first = RelayConfig {
        batch: i64::from(params.crash_after),
        ..RelayConfig::default()
    };
    let crash = CrashPlan::new(CrashPoint::RelayAfterSendBeforeMark, params.crash_after);
    ctx.run_relay(&db, &url, "0", &first, Some(crash))
        .await?
        .expect(|e| matches!(e, ChildEnd::Crashed { .. }), "the first relay")?;
    ctx.run_relay(&db, &url, "1", &RelayConfig::default(), None)
        .await?
        .expect(|e| *e == ChildEnd::Ok, "the restarted relay")?;
    let client = connect::kafka(&url).await?;
    let partitions = KafkaSink::partition_clients(&client, &topic).await?;
    let records = KafkaSink::records_past(&partitions, &HashMap::new()).await?;
    let worker = KafkaWorkerRole {
        kafka_url: url,
        topic,
        kind,
        batch: WORKER_BATCH,
        follow: false,
    };
    ChildCommand::new(&db, worker)
        .run(CHILD_TIMEOUT)
        .await?
        .expect(|e| *e == ChildEnd::Ok, "the Kafka worker")?;
    let row = counts::one_row(&db.connect().await?, counts::DELIVERIES).await?;
    Ok((records, row))
}
