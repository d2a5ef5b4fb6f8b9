//! redis-stream (Redis Stream へ配送する): the relay XADDs to `outbox.event.orders`; in the
//! consumer group `shipping`, worker-1 reads two entries, applies them and dies before XACK;
//! they stay pending until worker-2 claims them with XAUTOCLAIM and applies them again. The
//! idempotent consumer ships nothing twice; a naive one, run the same way, does.

use anyhow::Result;
use redis::streams::{
    StreamAutoClaimOptions, StreamInfoGroupsReply, StreamPendingReply, StreamRangeReply,
};
use redis::AsyncCommands;
use serde::Deserialize;

use super::{metric_names, Ctx, Experiment, Outcome, CHILD_TIMEOUT};
use crate::connect;
use crate::harness::child::role::StreamWorkerRole;
use crate::harness::child::{ChildCommand, ChildEnd};
use crate::judge::counts;
use crate::outbox::consumer::ConsumerKind;
use crate::outbox::crash::{CrashPlan, CrashPoint};
use crate::outbox::relay::RelayConfig;
use crate::outbox::sink::RedisSink;
use crate::outbox::stream_consumer::GROUP;
use crate::outbox::writer::Ending;
use crate::report::Table;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub events: u32,
    /// Entries worker-1 reads (and leaves pending) before it dies.
    pub first_read: usize,
}

/// The idempotent run first: the article's figures (the stream, the group) are read from it.
const CONSUMERS: [ConsumerKind; 2] = [ConsumerKind::Idempotent, ConsumerKind::Naive];
/// The stream's and the group's figures, reported once (from the idempotent run).
const REDIS_FIGURES: [&str; 7] = [
    "xlen",
    "pending_after_crash",
    "autoclaimed",
    "pending_after_recovery",
    "group.consumers",
    "group.pending",
    "group.lag",
];

impl Experiment for Params {
    fn metrics(&self) -> Vec<String> {
        let mut metrics =
            metric_names(CONSUMERS.map(ConsumerKind::name), &counts::DELIVERY_FIGURES);
        metrics.extend(metric_names([""], &REDIS_FIGURES));
        metrics
    }

    async fn run(&self, ctx: &Ctx<'_>) -> Result<Outcome> {
        run(ctx, self).await
    }
}

/// worker-2 reads up to this many at a time: all there is.
const SECOND_READ: usize = 100;

pub async fn run(ctx: &Ctx<'_>, params: &Params) -> Result<Outcome> {
    let redis_url = ctx.redis_url().await?;
    let mut redis = connect::redis(&redis_url).await?;
    let stream = RedisSink::stream_name(ctx.redis_key_prefix(), "orders");
    let mut outcome = Outcome::default();
    let mut kinds = counts::ConsumerComparison::new(
        "the same crash, per consumer kind",
        &[],
        &[
            "received",
            "distinct_events",
            "shipments",
            "duplicate_shipments",
        ],
    )
    .heading("received", "deliveries applied");
    for kind in CONSUMERS {
        let name = kind.name();
        // Each kind starts from an empty stream of the article's name.
        let _: i64 = redis.del(&stream).await?;
        let db = ctx.database(name).await?;
        let client = db.connect().await?;
        ctx.run_writer(&db, params.events, Ending::Commit, None)
            .await?
            .expect(|e| *e == ChildEnd::Ok, "the writer")?;
        ctx.run_relay(&db, &redis_url, "0", &RelayConfig::default(), None)
            .await?
            .expect(|e| *e == ChildEnd::Ok, "the relay")?;
        let xlen: i64 = redis.xlen(&stream).await?;
        let _: () = redis.xgroup_create(&stream, GROUP, "0").await?;

        let worker = |name: &str, count: usize| {
            let role = StreamWorkerRole {
                redis_url: redis_url.clone(),
                stream: stream.clone(),
                worker: name.to_string(),
                kind,
                count,
                follow: false,
            };
            ChildCommand::new(&db, role)
        };
        let crash = CrashPlan::new(CrashPoint::StreamWorkerAfterApplyBeforeAck, 1);
        worker("worker-1", params.first_read)
            .crash_at(Some(crash))
            .run(CHILD_TIMEOUT)
            .await?
            .expect(|e| matches!(e, ChildEnd::Crashed { .. }), "worker-1")?;
        let pending: StreamPendingReply = redis.xpending(&stream, GROUP).await?;
        let claim = StreamAutoClaimOptions::default().count(SECOND_READ);
        let claimed: redis::streams::StreamAutoClaimReply = redis
            .xautoclaim_options(&stream, GROUP, "worker-2", 0, "0-0", claim)
            .await?;
        let info: StreamInfoGroupsReply = redis.xinfo_groups(&stream).await?;
        worker("worker-2", SECOND_READ)
            .run(CHILD_TIMEOUT)
            .await?
            .expect(|e| *e == ChildEnd::Ok, "worker-2")?;
        let pending_after: StreamPendingReply = redis.xpending(&stream, GROUP).await?;

        let deliveries = counts::one_row(&client, counts::DELIVERIES).await?;
        outcome.metrics.set_row(name, &deliveries);
        kinds.push(name, vec![], &deliveries);
        if kind != ConsumerKind::Idempotent {
            continue;
        }
        // The article's figures, from the idempotent run.
        outcome.metrics.set("xlen", xlen);
        outcome
            .metrics
            .set("pending_after_crash", pending.count() as i64);
        outcome
            .metrics
            .set("autoclaimed", claimed.claimed.len() as i64);
        outcome
            .metrics
            .set("pending_after_recovery", pending_after.count() as i64);
        let first: StreamRangeReply = redis.xrange_count(&stream, "-", "+", 1).await?;
        let mut entry = Table::new(format!("XRANGE {stream} - + COUNT 1"), &["field", "value"]);
        for id in &first.ids {
            entry.push(vec!["id".into(), id.id.clone()]);
            for field in [
                "event_id",
                "aggregate_id",
                "event_type",
                "payload",
                "outbox_id",
            ] {
                entry.push(vec![
                    field.into(),
                    id.get::<String>(field).unwrap_or_default(),
                ]);
            }
        }
        outcome.tables.push(entry);
        let mut groups = Table::new(
            format!("XINFO GROUPS {stream} (after XAUTOCLAIM)"),
            &["name", "consumers", "pending", "lag"],
        );
        for group in &info.groups {
            let lag = group.lag.map(|l| l as i64).unwrap_or(-1);
            outcome
                .metrics
                .set("group.consumers", group.consumers as i64);
            outcome.metrics.set("group.pending", group.pending as i64);
            outcome.metrics.set("group.lag", lag);
            groups.push(vec![
                group.name.clone(),
                group.consumers.to_string(),
                group.pending.to_string(),
                lag.to_string(),
            ]);
        }
        outcome.tables.push(groups);
    }
    outcome.tables.push(kinds.table());
    Ok(outcome)
}
