//! The article's experiments, one file each, and what they share: the registry below (from
//! which the list of scenarios, their names, their built-in scenario files, preparing, running
//! and plotting derive), loading a scenario's file and parameters ([`spec`]), what a scenario
//! gets to work with ([`Ctx`]), and turning an outcome into a [`Report`] with its checks.
//!
//! A scenario is its file here, `src/scenarios/MODULE.rs` (MODULE: NAME with underscores),
//! whose `Params` implement [`Experiment`]; its scenario file, `scenarios/NAME.toml`; and its
//! line in `registry!` below, with its `pub mod` beside the others (declared outside the macro,
//! where rustfmt sees it; a test finds a file missing from the registry).

pub mod batch_throughput;
pub mod broker_cluster;
pub mod broker_confirms;
pub mod broker_dedup;
pub mod cdc;
pub mod claim_vs_lock;
pub mod cleanup;
pub mod clock_skew;
pub mod commit_unknown;
mod ctx;
pub mod dual_write;
pub mod failover;
pub mod horizon;
pub mod kafka_retries;
pub mod multi_relay_ordering;
pub mod notify_latency;
pub mod ordering_on_failure;
pub mod outbox_atomicity;
pub mod partial_index;
mod prepare;
pub mod redis_stream;
pub mod relay_crash;
pub mod reply_lost;
pub mod retry_backoff;
pub mod spec;
pub mod watermark_gap;

pub use ctx::{Ctx, Outcome};
use prepare::{fits_as, prepare_as, Ready};
pub use prepare::{prepare, prepare_all, Overrides, Prepared};

use std::fmt;
use std::future::Future;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::de::DeserializeOwned;

use crate::harness::brokers::Brokers;
use crate::harness::db::PgServer;
use crate::judge::expectations;
use crate::report::plots::Plot;
use crate::report::progress::Progress;
use crate::report::{Environment, Report};
use crate::scenarios::spec::Spec;

// Every scenario, in the article's order: its module (`src/scenarios/MODULE.rs`), and its name
// (that of its scenario file, `scenarios/NAME.toml`).
registry! {
    dual_write => "dual-write",
    outbox_atomicity => "outbox-atomicity",
    partial_index => "partial-index",
    retry_backoff => "retry-backoff",
    relay_crash => "relay-crash",
    multi_relay_ordering => "multi-relay-ordering",
    ordering_on_failure => "ordering-on-failure",
    notify_latency => "notify-latency",
    batch_throughput => "batch-throughput",
    redis_stream => "redis-stream",
    watermark_gap => "watermark-gap",
    claim_vs_lock => "claim-vs-lock",
    cleanup => "cleanup",
    cdc => "cdc",
    reply_lost => "reply-lost",
    commit_unknown => "commit-unknown",
    failover => "failover",
    broker_dedup => "broker-dedup",
    broker_confirms => "broker-confirms",
    broker_cluster => "broker-cluster",
    kafka_retries => "kafka-retries",
    horizon => "horizon",
    clock_skew => "clock-skew",
}

/// No child of these scenarios needs more than a few seconds; this bounds a hang.
pub const CHILD_TIMEOUT: Duration = Duration::from_secs(60);

/// What a scenario's file implements, on its `Params` (read from its scenario file and the
/// command line): the experiment, ready to run once its parameters are.
pub trait Experiment: DeserializeOwned + 'static {
    /// Relations between the parameters (not only their types), checked before anything starts.
    fn validate(&self) -> Result<()> {
        Ok(())
    }

    /// Every metric this run reports, by name, known before it starts: a check naming another
    /// is refused before anything runs, and a run that reports a metric missing here fails (a
    /// bug), so the list cannot drift from the code. Build it with [`metric_names`].
    fn metrics(&self) -> Vec<String>;

    /// Runs the experiment: what it measured (the checks are judged afterwards, from its file).
    fn run(&self, ctx: &Ctx<'_>) -> impl Future<Output = Result<Outcome>>;

    /// Its plots on the report page, drawn from the result's tables and metrics with the helpers
    /// of [`crate::report::plots`]; none where the result lacks them (saved by an older
    /// outbox-lab).
    fn plots(_report: &Report) -> Result<Vec<Plot>> {
        Ok(Vec::new())
    }
}

/// Builds [`Scenario::ALL`] from the table: each line's scenario file built in, and its module's
/// `Params` (which must implement [`Experiment`]) read, validated, run and asked for plots.
macro_rules! registry {
    ($($module:ident => $name:literal,)*) => {
        impl Scenario {
            /// Every scenario, in the article's order.
            pub const ALL: &[Scenario] = &[$(Scenario(&Entry {
                name: $name,
                builtin_spec: include_str!(concat!("../../scenarios/", $name, ".toml")),
                prepare: prepare_as::<$module::Params>,
                fits: fits_as::<$module::Params>,
                plots: <$module::Params as Experiment>::plots,
            }),)*];
        }
    };
}
// Lets the table at the top of this file use the macro defined below it.
use registry;

/// A scenario of the registry.
#[derive(Clone, Copy)]
pub struct Scenario(&'static Entry);

/// A line of the registry.
struct Entry {
    name: &'static str,
    /// The scenario file in the repository, built into the binary.
    builtin_spec: &'static str,
    /// Reads the parameters into the scenario's `Params` and validates them.
    prepare: fn(&Spec, &toml::Table) -> Result<Box<dyn Ready>>,
    /// Whether the parameters have the types of the scenario's `Params` (else: serde's message).
    fits: fn(&toml::Table) -> Result<(), String>,
    plots: fn(&Report) -> Result<Vec<Plot>>,
}

impl Scenario {
    pub fn name(self) -> &'static str {
        self.0.name
    }

    /// The scenario of this name, if there is one.
    pub fn find(name: &str) -> Option<Scenario> {
        Scenario::ALL.iter().copied().find(|s| s.name() == name)
    }

    pub fn from_name(name: &str) -> Result<Scenario> {
        if let Some(found) = Scenario::find(name) {
            return Ok(found);
        }
        let known: Vec<&str> = Scenario::ALL.iter().map(|s| s.name()).collect();
        let known = known.join(", ");
        bail!("unknown scenario '{name}'; known: {known} (or all)")
    }

    pub fn spec(self, dir: Option<&Path>) -> Result<Spec> {
        Spec::load(self.name(), self.0.builtin_spec, dir)
    }

    /// The plots of one of its results, for the report page.
    pub fn plots(self, report: &Report) -> Result<Vec<Plot>> {
        (self.0.plots)(report)
            .with_context(|| format!("cannot plot the results of {}", self.name()))
    }
}

impl PartialEq for Scenario {
    fn eq(&self, other: &Scenario) -> bool {
        self.name() == other.name()
    }
}

impl Eq for Scenario {}

impl fmt::Debug for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Scenario").field(&self.name()).finish()
    }
}

/// `--events` and `--crash-after` of a scenario whose relay dies after sending some of them:
/// at least one event, and the crash after one of them.
pub fn check_crash_after(events: u32, crash_after: u32) -> Result<()> {
    if events == 0 {
        bail!("--events must be at least 1");
    }
    if crash_after == 0 || crash_after > events {
        bail!("--crash-after {crash_after} must be between 1 and --events ({events})");
    }
    Ok(())
}

/// `prefix.name` for every prefix and name: the metrics of a row of figures reported once per
/// consumer, design or path (an empty prefix gives the bare names).
pub fn metric_names<P: fmt::Display, N: fmt::Display>(
    prefixes: impl IntoIterator<Item = P>,
    names: &[N],
) -> Vec<String> {
    let mut metrics = Vec::new();
    for prefix in prefixes {
        let prefix = prefix.to_string();
        for name in names {
            metrics.push(match prefix.as_str() {
                "" => name.to_string(),
                _ => format!("{prefix}.{name}"),
            });
        }
    }
    metrics
}

/// Runs one prepared scenario on `server` and judges it.
pub async fn run(
    server: &PgServer,
    brokers: &Brokers,
    prepared: &Prepared,
    progress: &Progress,
) -> Result<Report> {
    let started_at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let clock = Instant::now();
    let ctx = Ctx {
        server,
        brokers,
        scenario: prepared.scenario,
        spec: &prepared.spec,
        progress,
    };
    let outcome = prepared
        .typed
        .start(&ctx)
        .await
        .with_context(|| format!("scenario {} did not run", prepared.scenario.name()))?;
    let declared = prepared.typed.metrics();
    if let Some((name, _)) = outcome.metrics.iter().find(|(m, _)| !declared.contains(m)) {
        bail!(
            "scenario {} reported the metric {name}, which its metrics() does not list",
            prepared.scenario.name()
        );
    }
    let judge = |specs| expectations::evaluate(specs, &prepared.params, &outcome.metrics);
    let checks = judge(&prepared.spec.checks)?;
    let targets = judge(&prepared.spec.targets)?;
    Ok(Report {
        scenario: prepared.scenario.name().to_string(),
        section: prepared.spec.section.clone(),
        params: serde_json::to_value(&prepared.params)?,
        metrics: outcome.metrics,
        tables: outcome.tables,
        checks,
        targets,
        notes: [outcome.notes, prepared.left_out.clone()].concat(),
        environment: Environment {
            postgres_version: server.version.clone(),
            outbox_lab_version: env!("CARGO_PKG_VERSION").to_string(),
            started_at,
            elapsed_ms: clock.elapsed().as_millis() as u64,
            server: server.kind().to_string(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every scenario file and every scenario module is in the registry: the compiler checks
    /// only that what the registry names exists.
    #[test]
    fn every_scenario_file_is_registered() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let stems = |dir: &str, extension: &str| -> Vec<String> {
            let entries = std::fs::read_dir(root.join(dir)).unwrap();
            let paths = entries.map(|entry| entry.unwrap().path());
            paths
                .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == extension))
                .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
                .collect()
        };
        let registered = |name: &str| Scenario::find(name).is_some();
        for name in stems("scenarios", "toml") {
            assert!(
                registered(&name),
                "scenarios/{name}.toml is not in the registry"
            );
        }
        for module in stems("src/scenarios", "rs") {
            if ["mod", "ctx", "prepare", "spec"].contains(&module.as_str()) {
                continue;
            }
            assert!(
                registered(&module.replace('_', "-")),
                "src/scenarios/{module}.rs is not in the registry"
            );
        }
    }
}
