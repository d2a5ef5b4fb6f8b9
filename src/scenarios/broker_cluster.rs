//! broker-cluster (クラスタのリーダーが落ちたら): a 3-node JetStream cluster, an R3 stream, and
//! its leader killed with SIGKILL while a relay publishes a steady stream of events (and started
//! again a moment later). Two relays, each on its own database and stream: one marks an event
//! published once JetStream acked it (stored on a majority), the other once a core NATS publish
//! was written to the connection (fire-and-forget). Both are connected with every node's URL
//! and fail over to a live one.
//!
//! Counted after the run, from the outbox and the stream: an event is lost when the outbox says
//! published and no message in the stream carries its id (`Nats-Msg-Id`). The acked relay loses
//! none; fire-and-forget loses what it wrote while the stream had no leader to store it.
//!
//! The failover is measured apart from the relay, by a probe in this process: an acked publish
//! to the same stream every `probe_every_ms`, one at a time. `failover_ms` is the time from the
//! kill to the first ack of a probe sent after it: how long a client connected to the whole
//! cluster could not store anything in that stream. The killed node is started again
//! `down_ms` after that ack. The probe's latencies are summarised by phase: `before` the kill
//! (three nodes), the `failover` (kill to first ack), `during` (two nodes), `after` (the killed
//! node back).
//!
//! Here the parameters, the two cases and their tables; [`leader_killed`] runs one case,
//! [`probe`] times the failover, [`timeline`] counts the acked probes over a case and draws them.

mod leader_killed;
mod probe;
mod timeline;

use anyhow::{bail, Result};
use serde::Deserialize;

use super::{metric_names, Ctx, Experiment, Outcome, CHILD_TIMEOUT};
use crate::harness::nats_server::CLUSTER_NODES;
use crate::judge::latency;
use crate::report::plots::Plot;
use crate::report::{decimals, Report, Table};
use crate::stats::round_ms;
use probe::Probe;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// Orders written, one event each.
    pub orders: u32,
    /// The writer commits an order this often on average: the run lasts about
    /// `orders * interval_ms`.
    pub interval_ms: u64,
    /// The stream leader is killed once the outbox says this many events were published.
    pub kill_after: u32,
    /// The killed node is started again this long after the failover (the stream acked again).
    pub down_ms: u64,
    /// The probe publishes this often.
    pub probe_every_ms: u64,
}

/// The two relays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Case {
    /// Marks once JetStream acked the publish.
    Acked,
    /// Marks once a core NATS publish was written to the connection.
    FireAndForget,
}

impl Case {
    const ALL: [Case; 2] = [Case::Acked, Case::FireAndForget];

    fn name(self) -> &'static str {
        match self {
            Case::Acked => "acked",
            Case::FireAndForget => "fire_and_forget",
        }
    }
}

/// Each case's counts, as metrics `CASE.NAME`.
const COUNTS: [&str; 4] = ["published", "stream_events", "stream_duplicates", "lost"];
/// The probe's phases: before the kill, until the first ack after it, until the killed node is
/// back, after.
const PHASES: [&str; 4] = ["before", "failover", "during", "after"];
/// The summary table's title starts so (the plots find their markers there).
const SUMMARY: &str = "the stream leader killed mid-run";

impl Experiment for Params {
    fn metrics(&self) -> Vec<String> {
        let mut metrics = metric_names(Case::ALL.map(Case::name), &COUNTS);
        metrics.push("failover_ms".into());
        let latencies = ["publish_p50_ms", "publish_p99_ms"];
        metrics.extend(metric_names(["acked"], &latencies));
        let phases = PHASES.map(|phase| format!("acked.{phase}"));
        metrics.extend(metric_names(phases, &latencies));
        metrics
    }

    fn validate(&self) -> Result<()> {
        if self.kill_after == 0 || self.kill_after >= self.orders {
            bail!(
                "kill_after {} must be between 1 and orders - 1 ({}): the leader dies mid-run",
                self.kill_after,
                self.orders.saturating_sub(1)
            );
        }
        if self.interval_ms == 0 || self.probe_every_ms == 0 {
            bail!("interval_ms and probe_every_ms must be at least 1");
        }
        Ok(())
    }

    async fn run(&self, ctx: &Ctx<'_>) -> Result<Outcome> {
        run(ctx, self).await
    }

    fn plots(report: &Report) -> Result<Vec<Plot>> {
        timeline::timelines(report)
    }
}

pub async fn run(ctx: &Ctx<'_>, params: &Params) -> Result<Outcome> {
    let mut cluster = ctx.nats_cluster().await?;
    let mut outcome = Outcome::default();
    let mut summary = Table::new(
        format!("{SUMMARY} ({CLUSTER_NODES} nodes, R{CLUSTER_NODES} stream)"),
        &[
            "relay",
            "published",
            "stream_events",
            "stream_duplicates",
            "lost",
            "killed",
            "killed_ms",
            "restarted_ms",
            "failover_ms",
            "probe_failures",
        ],
    );
    let mut phases = Table::new(
        "probe publish latency (acked only), by phase",
        &[
            "relay", "phase", "nodes", "probes", "acked", "p50_ms", "p99_ms",
        ],
    );
    for case in Case::ALL {
        let measured = leader_killed::run_case(ctx, params, &mut cluster, case).await?;
        let name = case.name();
        let failover_ms = measured.failover_ms();
        let m = &mut outcome.metrics;
        m.set(format!("{name}.published"), measured.published);
        m.set(format!("{name}.stream_events"), measured.stream_events);
        m.set(
            format!("{name}.stream_duplicates"),
            measured.stream_duplicates,
        );
        m.set(format!("{name}.lost"), measured.lost);
        if case == Case::Acked {
            m.set("failover_ms", round_ms(failover_ms));
        }
        let failures = measured.probes.iter().filter(|p| !p.acked).count();
        summary.push(vec![
            name.into(),
            measured.published.to_string(),
            measured.stream_events.to_string(),
            measured.stream_duplicates.to_string(),
            measured.lost.to_string(),
            measured.leader.clone(),
            decimals(measured.killed_ms, 0),
            decimals(measured.restarted_ms, 0),
            decimals(failover_ms, 0),
            failures.to_string(),
        ]);
        let mut all = Vec::new();
        for (i, phase) in PHASES.iter().enumerate() {
            let in_phase: Vec<&Probe> = measured
                .probes
                .iter()
                .filter(|p| measured.phase(p) == i)
                .collect();
            let acked: Vec<(i64, f64)> = in_phase
                .iter()
                .filter(|p| p.acked)
                .map(|p| (0, p.took_ms))
                .collect();
            all.extend(acked.iter().copied());
            let (p50, p99) = match acked.is_empty() {
                true => (None, None),
                false => {
                    let summary = latency::summarise(acked.clone())?;
                    (Some(summary.p50_ms), Some(summary.p99_ms))
                }
            };
            if case == Case::Acked {
                if let (Some(p50), Some(p99)) = (p50, p99) {
                    m.set(format!("acked.{phase}.publish_p50_ms"), p50);
                    m.set(format!("acked.{phase}.publish_p99_ms"), p99);
                }
            }
            let shown = |v: Option<f64>| v.map(|v| decimals(v, 2)).unwrap_or("-".into());
            let nodes = match *phase {
                "before" | "after" => CLUSTER_NODES,
                _ => CLUSTER_NODES - 1,
            };
            phases.push(vec![
                name.into(),
                phase.to_string(),
                nodes.to_string(),
                in_phase.len().to_string(),
                acked.len().to_string(),
                shown(p50),
                shown(p99),
            ]);
        }
        if case == Case::Acked && !all.is_empty() {
            let summary = latency::summarise(all)?;
            m.set("acked.publish_p50_ms", summary.p50_ms);
            m.set("acked.publish_p99_ms", summary.p99_ms);
        }
        outcome
            .tables
            .push(timeline::acks_over_time(name, &measured));
    }
    outcome.tables.insert(0, phases);
    outcome.tables.insert(0, summary);
    outcome.notes.push(format!(
        "a private {CLUSTER_NODES}-node nats-server cluster (never --nats-url's server: its \
         nodes are killed); lost = marked published in the outbox, in no message of the stream \
         (Nats-Msg-Id); failover_ms = from the SIGKILL of the stream leader to the first ack of \
         a probe publish sent after it (the probe publishes to the same stream every {} ms, \
         one at a time, from a client connected to every node)",
        params.probe_every_ms
    ));
    Ok(outcome)
}
