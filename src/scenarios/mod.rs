//! The article's experiments, one file each, and what they share: loading a scenario's file and
//! parameters, the per-scenario databases and child processes, and turning an outcome into a
//! [`Report`] with its checks.

pub mod batch_throughput;
pub mod cdc;
pub mod claim_vs_lock;
pub mod cleanup;
mod ctx;
pub mod dual_write;
pub mod multi_relay_ordering;
pub mod notify_latency;
pub mod ordering_on_failure;
pub mod outbox_atomicity;
pub mod partial_index;
pub mod redis_stream;
pub mod relay_crash;
pub mod reply_lost;
pub mod retry_backoff;
pub mod spec;
pub mod watermark_gap;

pub use ctx::{Ctx, Outcome};

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};

use crate::harness::db::PgServer;
use crate::harness::redis_server::Redis;
use crate::judge::expectations;
use crate::report::progress::Progress;
use crate::report::{Environment, Report};
use crate::scenarios::spec::Spec;

/// No child of these scenarios needs more than a few seconds; this bounds a hang.
pub const CHILD_TIMEOUT: Duration = Duration::from_secs(60);

/// The scenarios outbox-lab implements, in the article's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    DualWrite,
    OutboxAtomicity,
    PartialIndex,
    RetryBackoff,
    RelayCrash,
    MultiRelayOrdering,
    OrderingOnFailure,
    NotifyLatency,
    BatchThroughput,
    RedisStream,
    WatermarkGap,
    ClaimVsLock,
    Cleanup,
    Cdc,
    ReplyLost,
}

impl Scenario {
    /// In the article's order.
    pub const ALL: &[Scenario] = &[
        Scenario::DualWrite,
        Scenario::OutboxAtomicity,
        Scenario::PartialIndex,
        Scenario::RetryBackoff,
        Scenario::RelayCrash,
        Scenario::MultiRelayOrdering,
        Scenario::OrderingOnFailure,
        Scenario::NotifyLatency,
        Scenario::BatchThroughput,
        Scenario::RedisStream,
        Scenario::WatermarkGap,
        Scenario::ClaimVsLock,
        Scenario::Cleanup,
        Scenario::Cdc,
        Scenario::ReplyLost,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Scenario::DualWrite => "dual-write",
            Scenario::OutboxAtomicity => "outbox-atomicity",
            Scenario::RetryBackoff => "retry-backoff",
            Scenario::RelayCrash => "relay-crash",
            Scenario::WatermarkGap => "watermark-gap",
            Scenario::OrderingOnFailure => "ordering-on-failure",
            Scenario::RedisStream => "redis-stream",
            Scenario::NotifyLatency => "notify-latency",
            Scenario::BatchThroughput => "batch-throughput",
            Scenario::MultiRelayOrdering => "multi-relay-ordering",
            Scenario::PartialIndex => "partial-index",
            Scenario::Cleanup => "cleanup",
            Scenario::ClaimVsLock => "claim-vs-lock",
            Scenario::Cdc => "cdc",
            Scenario::ReplyLost => "reply-lost",
        }
    }

    /// The scenario file in the repository, built into the binary.
    fn builtin_spec(self) -> &'static str {
        match self {
            Scenario::DualWrite => include_str!("../../scenarios/dual-write.toml"),
            Scenario::OutboxAtomicity => include_str!("../../scenarios/outbox-atomicity.toml"),
            Scenario::RetryBackoff => include_str!("../../scenarios/retry-backoff.toml"),
            Scenario::RelayCrash => include_str!("../../scenarios/relay-crash.toml"),
            Scenario::WatermarkGap => include_str!("../../scenarios/watermark-gap.toml"),
            Scenario::OrderingOnFailure => include_str!("../../scenarios/ordering-on-failure.toml"),
            Scenario::RedisStream => include_str!("../../scenarios/redis-stream.toml"),
            Scenario::NotifyLatency => include_str!("../../scenarios/notify-latency.toml"),
            Scenario::BatchThroughput => include_str!("../../scenarios/batch-throughput.toml"),
            Scenario::MultiRelayOrdering => {
                include_str!("../../scenarios/multi-relay-ordering.toml")
            }
            Scenario::PartialIndex => include_str!("../../scenarios/partial-index.toml"),
            Scenario::Cleanup => include_str!("../../scenarios/cleanup.toml"),
            Scenario::ClaimVsLock => include_str!("../../scenarios/claim-vs-lock.toml"),
            Scenario::Cdc => include_str!("../../scenarios/cdc.toml"),
            Scenario::ReplyLost => include_str!("../../scenarios/reply-lost.toml"),
        }
    }

    pub fn from_name(name: &str) -> Result<Scenario> {
        if let Some(found) = Scenario::ALL.iter().find(|s| s.name() == name) {
            return Ok(*found);
        }
        let known: Vec<&str> = Scenario::ALL.iter().map(|s| s.name()).collect();
        let known = known.join(", ");
        bail!("unknown scenario '{name}'; known: {known} (or all)")
    }

    pub fn spec(self, dir: Option<&Path>) -> Result<Spec> {
        Spec::load(self.name(), self.builtin_spec(), dir)
    }
}

/// Parameters given on the command line, over the scenario file's defaults.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    /// `--quick`: apply the scenario file's `[quick]` table (a shorter run, for tests).
    pub quick: bool,
    /// `--set name=value`, `--events N`, ...
    pub values: Vec<(String, toml::Value)>,
    /// With `scenario all`, a value applies to the scenarios that have the parameter; alone, a
    /// scenario without it is an error.
    pub strict: bool,
}

/// A scenario with its file read and its parameters checked, ready to run.
pub struct Prepared {
    scenario: Scenario,
    spec: Spec,
    params: toml::Table,
    typed: Params,
}

enum Params {
    DualWrite(dual_write::Params),
    OutboxAtomicity(outbox_atomicity::Params),
    RetryBackoff(retry_backoff::Params),
    RelayCrash(relay_crash::Params),
    MultiRelayOrdering(multi_relay_ordering::Params),
    OrderingOnFailure(ordering_on_failure::Params),
    BatchThroughput(batch_throughput::Params),
    RedisStream(redis_stream::Params),
    NotifyLatency(notify_latency::Params),
    WatermarkGap(watermark_gap::Params),
    PartialIndex(partial_index::Params),
    Cleanup(cleanup::Params),
    ClaimVsLock(claim_vs_lock::Params),
    Cdc(cdc::Params),
    ReplyLost(reply_lost::Params),
}

/// Reads the file and validates the parameters before anything is started.
pub fn prepare(scenario: Scenario, dir: Option<&Path>, overrides: &Overrides) -> Result<Prepared> {
    let spec = scenario.spec(dir)?;
    let mut params = spec.params.clone();
    if overrides.quick {
        params.extend(spec.quick.clone());
    }
    for (key, value) in &overrides.values {
        match params.get_mut(key) {
            Some(slot) => *slot = value.clone(),
            None if overrides.strict => {
                let known: Vec<&String> = spec.params.keys().collect();
                bail!(
                    "scenario {} has no parameter {key} (its parameters: {known:?})",
                    scenario.name()
                )
            }
            None => {}
        }
    }
    let typed = match scenario {
        Scenario::DualWrite => Params::DualWrite(spec.params(&params)?),
        Scenario::OutboxAtomicity => Params::OutboxAtomicity(spec.params(&params)?),
        Scenario::RetryBackoff => Params::RetryBackoff(spec.params(&params)?),
        Scenario::RelayCrash => Params::RelayCrash(validated(
            spec.params(&params)?,
            relay_crash::Params::validate,
        )?),
        Scenario::WatermarkGap => Params::WatermarkGap(spec.params(&params)?),
        Scenario::OrderingOnFailure => Params::OrderingOnFailure(spec.params(&params)?),
        Scenario::RedisStream => Params::RedisStream(spec.params(&params)?),
        Scenario::NotifyLatency => Params::NotifyLatency(spec.params(&params)?),
        Scenario::BatchThroughput => Params::BatchThroughput(spec.params(&params)?),
        Scenario::MultiRelayOrdering => Params::MultiRelayOrdering(spec.params(&params)?),
        Scenario::PartialIndex => Params::PartialIndex(spec.params(&params)?),
        Scenario::Cleanup => Params::Cleanup(spec.params(&params)?),
        Scenario::ClaimVsLock => Params::ClaimVsLock(validated(
            spec.params(&params)?,
            claim_vs_lock::Params::validate,
        )?),
        Scenario::Cdc => Params::Cdc(validated(spec.params(&params)?, cdc::Params::validate)?),
        Scenario::ReplyLost => Params::ReplyLost(validated(
            spec.params(&params)?,
            reply_lost::Params::validate,
        )?),
    };
    Ok(Prepared {
        scenario,
        spec,
        params,
        typed,
    })
}

/// Parameters whose relations (not only types) need checking before anything starts.
fn validated<P>(params: P, validate: impl Fn(&P) -> Result<()>) -> Result<P> {
    validate(&params)?;
    Ok(params)
}

impl Prepared {
    pub fn scenario(&self) -> Scenario {
        self.scenario
    }
}

/// Runs one prepared scenario on `server` and judges it.
pub async fn run(
    server: &PgServer,
    redis: &Redis,
    prepared: &Prepared,
    progress: &Progress,
) -> Result<Report> {
    let started_at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let clock = Instant::now();
    let ctx = Ctx {
        server,
        redis,
        scenario: prepared.scenario,
        spec: &prepared.spec,
        progress,
    };
    let outcome = match &prepared.typed {
        Params::DualWrite(p) => dual_write::run(&ctx, p).await,
        Params::OutboxAtomicity(p) => outbox_atomicity::run(&ctx, p).await,
        Params::RetryBackoff(p) => retry_backoff::run(&ctx, p).await,
        Params::RelayCrash(p) => relay_crash::run(&ctx, p).await,
        Params::WatermarkGap(p) => watermark_gap::run(&ctx, p).await,
        Params::OrderingOnFailure(p) => ordering_on_failure::run(&ctx, p).await,
        Params::RedisStream(p) => redis_stream::run(&ctx, p).await,
        Params::NotifyLatency(p) => notify_latency::run(&ctx, p).await,
        Params::BatchThroughput(p) => batch_throughput::run(&ctx, p).await,
        Params::MultiRelayOrdering(p) => multi_relay_ordering::run(&ctx, p).await,
        Params::PartialIndex(p) => partial_index::run(&ctx, p).await,
        Params::Cleanup(p) => cleanup::run(&ctx, p).await,
        Params::ClaimVsLock(p) => claim_vs_lock::run(&ctx, p).await,
        Params::Cdc(p) => cdc::run(&ctx, p).await,
        Params::ReplyLost(p) => reply_lost::run(&ctx, p).await,
    }
    .map_err(|e| anyhow!("scenario {} did not run: {e:#}", prepared.scenario.name()))?;
    let checks = expectations::evaluate(&prepared.spec.checks, &prepared.params, &outcome.metrics)?;
    Ok(Report {
        scenario: prepared.scenario.name().to_string(),
        section: prepared.spec.section.clone(),
        params: serde_json::to_value(&prepared.params)?,
        metrics: outcome.metrics,
        tables: outcome.tables,
        checks,
        notes: outcome.notes,
        environment: Environment {
            postgres_version: server.version.clone(),
            outbox_lab_version: env!("CARGO_PKG_VERSION").to_string(),
            started_at,
            elapsed_ms: clock.elapsed().as_millis() as u64,
            server: server.kind().to_string(),
        },
    })
}
