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

use std::collections::HashSet;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use async_nats::jetstream::{self, stream};
use serde::Deserialize;
use tokio::sync::{oneshot, watch};
use tokio_postgres::Client;

use super::{metric_names, Ctx, Experiment, Outcome, CHILD_TIMEOUT};
use crate::connect;
use crate::harness::child::ChildEnd;
use crate::harness::nats_server::{NatsCluster, CLUSTER_NODES};
use crate::judge::counts;
use crate::judge::latency;
use crate::outbox::relay::{RelayConfig, Wakeup, RELAY_APPLICATION_NAME};
use crate::outbox::sink::NatsSink;
use crate::outbox::writer::Ending;
use crate::report::plots::{self, column, number, Axes, Marker, Plot};
use crate::report::{decimals, Report, Table};
use crate::wait;

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
/// The first ack after the kill comes within this, or the run fails.
const FAILOVER_LIMIT: Duration = Duration::from_secs(60);
/// The summary table's title starts so (the plots find their markers there).
const SUMMARY: &str = "the stream leader killed mid-run";
/// A timeline's table title starts so; the case follows.
const TIMELINE: &str = "acked probe publishes per 100 ms";
/// The timeline's buckets.
const BUCKET_MS: f64 = 100.0;
/// A probe publish unacknowledged after this failed.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);
/// The relay tries an event again after 10 ms, then twice as long each time: it keeps up with
/// a failover of seconds, and it never gives up on one (30 tries).
const RELAY_BACKOFF: Duration = Duration::from_millis(10);
const RELAY_MAX_ATTEMPTS: i32 = 30;
/// A publish that has no ack after this failed (and is retried): the leader may be gone.
const RELAY_REQUEST_TIMEOUT: Duration = Duration::from_secs(1);
/// The relay looks for new rows this often.
const RELAY_POLL: Duration = Duration::from_millis(10);
/// Every event is published within this after the writer is done, or the run fails.
const DRAIN_LIMIT: Duration = Duration::from_secs(60);
/// The relay runs for the whole case; this only bounds a hang.
const RELAY_LIFETIME: Duration = Duration::from_secs(300);
/// How often the outbox is looked at while waiting.
const WAIT_POLL: Duration = Duration::from_millis(5);

/// Events marked published whose id no message of the stream carries ($1: the ids it holds).
const PUBLISHED_NOT_IN_STREAM: &str = "
SELECT count(*) FROM outbox WHERE published_at IS NOT NULL AND event_id <> ALL($1)";

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
        timelines(report)
    }
}

/// One probe publish.
struct Probe {
    /// When it was sent, in ms since the case started.
    sent_ms: f64,
    /// Until its ack, or its failure.
    took_ms: f64,
    acked: bool,
}

/// What one case measured.
struct Measured {
    published: i64,
    stream_events: i64,
    stream_duplicates: i64,
    lost: i64,
    leader: String,
    killed_ms: f64,
    /// The first ack of a probe sent after the kill.
    failover_end_ms: f64,
    restarted_ms: f64,
    probes: Vec<Probe>,
}

impl Measured {
    fn failover_ms(&self) -> f64 {
        self.failover_end_ms - self.killed_ms
    }

    /// The phase a probe was sent in (an index into [`PHASES`]).
    fn phase(&self, probe: &Probe) -> usize {
        match probe.sent_ms {
            ms if ms < self.killed_ms => 0,
            ms if ms < self.failover_end_ms => 1,
            ms if ms < self.restarted_ms => 2,
            _ => 3,
        }
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
        let measured = run_case(ctx, params, &mut cluster, case).await?;
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
            m.set("failover_ms", round(failover_ms));
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
        outcome.tables.push(acks_over_time(name, &measured));
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

/// One relay's run: the stream created, the relay following, the writer paced, the leader
/// killed mid-run and restarted, the relay drained; then the outbox against the stream.
async fn run_case(
    ctx: &Ctx<'_>,
    params: &Params,
    cluster: &mut NatsCluster,
    case: Case,
) -> Result<Measured> {
    let name = case.name();
    let url = cluster.url();
    let db = ctx.database(name).await?;
    let client = db.connect().await?;
    let jetstream = jetstream::new(connect::nats(&url).await?);
    let stream_name = format!("{}outbox_cluster_{name}", ctx.nats_name_prefix());
    let prefix = ctx.nats_subject_prefix();
    let probe_subject = format!("{prefix}outbox.probe");
    let mut config = NatsSink::stream_config(&stream_name, prefix);
    config.subjects.push(probe_subject.clone());
    config.num_replicas = CLUSTER_NODES;
    let mut stream = jetstream
        .create_stream(config)
        .await
        .map_err(|e| anyhow!("cannot create JetStream stream {stream_name}: {e}"))?;

    let config = RelayConfig {
        max_attempts: RELAY_MAX_ATTEMPTS,
        backoff_base: RELAY_BACKOFF,
        request_timeout: RELAY_REQUEST_TIMEOUT,
        ..RelayConfig::default()
    };
    let mut relay = ctx
        .relay(&db, &url, "0", &config)
        .with(|relay| {
            relay.follow = Some(Wakeup::Poll(RELAY_POLL));
            relay.sink.publish_acks = case == Case::Acked;
        })
        .spawn()?;
    // Closing its stdin stops the relay; meanwhile its output is read as it comes.
    let stop_relay = relay.take_stdin();
    let relay = tokio::spawn(relay.finish(RELAY_LIFETIME));
    let session = format!("{RELAY_APPLICATION_NAME} 0");
    let ready = wait::up_to(CHILD_TIMEOUT, WAIT_POLL, async || {
        Ok(relay.is_finished()
            || client
                .query_one(counts::RELAY_READY, &[&session])
                .await?
                .get::<_, bool>(0))
    })
    .await?;
    if ready.is_none() || relay.is_finished() {
        bail!("[{name}] the relay did not start: {}", relay.await??.end);
    }

    let started = Instant::now();
    let (stop_probe, probe_stopped) = oneshot::channel();
    let (last_ack, mut acked) = watch::channel(0.0);
    let probe = tokio::spawn(probe(
        jetstream.clone(),
        probe_subject.clone(),
        started,
        Duration::from_millis(params.probe_every_ms),
        probe_stopped,
        last_ack,
    ));
    let writer = ctx
        .writer(&db, params.orders, 1, Ending::Commit)
        .with(|writer| writer.interval = Some(Duration::from_millis(params.interval_ms)))
        .spawn()?;
    let writer = tokio::spawn(writer.finish(CHILD_TIMEOUT));

    let enough = wait::up_to(CHILD_TIMEOUT, WAIT_POLL, async || {
        Ok(counts::count(&client, counts::PUBLISHED).await? >= i64::from(params.kill_after))
    })
    .await?;
    if enough.is_none() {
        bail!(
            "[{name}] the relay did not publish {} events",
            params.kill_after
        );
    }
    let leader = stream
        .info()
        .await
        .map_err(|e| anyhow!("cannot read JetStream stream {stream_name}: {e}"))?
        .cluster
        .as_ref()
        .and_then(|c| c.leader.clone())
        .with_context(|| format!("JetStream stream {stream_name} has no leader"))?;
    cluster.kill(&leader).await?;
    let killed_ms = ms_since(started);
    // Sent after the kill and acked: the stream has a leader again.
    // The value it returns is a lock on the channel: dropped at once.
    let failover = tokio::time::timeout(FAILOVER_LIMIT, async {
        acked
            .wait_for(|&sent_ms| sent_ms > killed_ms)
            .await
            .map(drop)
    })
    .await;
    if !matches!(failover, Ok(Ok(()))) {
        bail!(
            "[{name}] the stream took no publish within {FAILOVER_LIMIT:?} of its leader's death"
        );
    }
    tokio::time::sleep(Duration::from_millis(params.down_ms)).await;
    cluster.restart(&leader).await?;
    let restarted_ms = ms_since(started);

    writer
        .await??
        .expect(|e| *e == ChildEnd::Ok, "the writer")?;
    let drained = wait::up_to(DRAIN_LIMIT, WAIT_POLL, async || {
        Ok(client
            .query_one(counts::ALL_PUBLISHED, &[])
            .await?
            .get::<_, bool>(0))
    })
    .await?;
    // The probe goes on a while with the killed node back, then stops.
    let after = Duration::from_millis(params.down_ms).saturating_sub(since(started, restarted_ms));
    tokio::time::sleep(after).await;
    let _ = stop_probe.send(());
    let probes = probe.await?;
    let failover_end_ms = probes
        .iter()
        .find(|p| p.acked && p.sent_ms > killed_ms)
        .map(|p| p.sent_ms + p.took_ms)
        .context("the probe saw no failover")?;
    drop(stop_relay);
    let relay = relay.await??.expect(|e| *e == ChildEnd::Ok, "the relay")?;
    if drained.is_none() {
        bail!(
            "[{name}] the relay left events unpublished {DRAIN_LIMIT:?} after the writer was \
             done: {}",
            relay.end
        );
    }

    // The stream may still be electing a leader (the fire-and-forget relay is done sooner).
    let answers = wait::up_to(FAILOVER_LIMIT, Duration::from_millis(100), async || {
        Ok(stream.get_info().await.is_ok())
    })
    .await?;
    if answers.is_none() {
        bail!("[{name}] JetStream stream {stream_name} does not answer");
    }
    let ids = event_ids(&stream, &probe_subject).await?;
    let distinct: HashSet<uuid::Uuid> = ids.iter().copied().collect();
    let held: Vec<uuid::Uuid> = distinct.into_iter().collect();
    let measured = Measured {
        published: counts::count(&client, counts::PUBLISHED).await?,
        stream_events: held.len() as i64,
        stream_duplicates: (ids.len() - held.len()) as i64,
        lost: lost(&client, &held).await?,
        leader,
        killed_ms,
        failover_end_ms,
        restarted_ms,
        probes,
    };
    jetstream
        .delete_stream(&stream_name)
        .await
        .map_err(|e| anyhow!("cannot delete JetStream stream {stream_name}: {e}"))?;
    Ok(measured)
}

/// Publishes to `subject` every `every`, one publish at a time, each awaiting its ack for at
/// most [`PROBE_TIMEOUT`], until `stop`; `last_ack` tells when the last acked one was sent.
async fn probe(
    jetstream: jetstream::Context,
    subject: String,
    started: Instant,
    every: Duration,
    mut stop: oneshot::Receiver<()>,
    last_ack: watch::Sender<f64>,
) -> Vec<Probe> {
    let mut probes = Vec::new();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = &mut stop => return probes,
            _ = tick.tick() => {}
        }
        let sent = Instant::now();
        let acked = tokio::time::timeout(PROBE_TIMEOUT, async {
            jetstream
                .publish(subject.clone(), bytes::Bytes::new())
                .await?
                .await
        })
        .await;
        let probe = Probe {
            sent_ms: (sent - started).as_secs_f64() * 1000.0,
            took_ms: sent.elapsed().as_secs_f64() * 1000.0,
            acked: matches!(acked, Ok(Ok(_))),
        };
        if probe.acked {
            last_ack.send_replace(probe.sent_ms);
        }
        probes.push(probe);
    }
}

/// The `Nats-Msg-Id` of every event message the stream holds (probes left out), repeats
/// included.
async fn event_ids(stream: &stream::Stream, probe_subject: &str) -> Result<Vec<uuid::Uuid>> {
    let state = stream
        .get_info()
        .await
        .map_err(|e| anyhow!("cannot read the stream: {e}"))?
        .state;
    let mut ids = Vec::new();
    if state.messages == 0 {
        return Ok(ids);
    }
    for seq in state.first_sequence..=state.last_sequence {
        let message = stream
            .get_raw_message(seq)
            .await
            .map_err(|e| anyhow!("cannot read message {seq} of the stream: {e}"))?;
        if message.subject.as_str() == probe_subject {
            continue;
        }
        let id = message
            .headers
            .get(async_nats::header::NATS_MESSAGE_ID)
            .with_context(|| format!("message {seq} of the stream has no Nats-Msg-Id"))?;
        ids.push(id.as_str().parse()?);
    }
    Ok(ids)
}

/// Events the outbox marked published that the stream does not hold.
async fn lost(client: &Client, held: &[uuid::Uuid]) -> Result<i64> {
    Ok(client
        .query_one(PUBLISHED_NOT_IN_STREAM, &[&held])
        .await?
        .get(0))
}

fn ms_since(started: Instant) -> f64 {
    started.elapsed().as_secs_f64() * 1000.0
}

/// How long ago `ms` after `started` was.
fn since(started: Instant, ms: f64) -> Duration {
    started
        .elapsed()
        .saturating_sub(Duration::from_secs_f64(ms / 1000.0))
}

fn round(ms: f64) -> f64 {
    (ms * 10.0).round() / 10.0
}

/// The acked probes per [`BUCKET_MS`] over the case (by the moment of their ack), for the
/// plot: a run of empty buckets is the failover.
fn acks_over_time(case: &str, measured: &Measured) -> Table {
    let acks: Vec<f64> = measured
        .probes
        .iter()
        .filter(|p| p.acked)
        .map(|p| p.sent_ms + p.took_ms)
        .collect();
    let end = measured
        .probes
        .iter()
        .map(|p| p.sent_ms + p.took_ms)
        .fold(0.0, f64::max);
    let buckets = (end / BUCKET_MS).ceil() as usize;
    let mut counts = vec![0u32; buckets.max(1)];
    for at in acks {
        let i = ((at / BUCKET_MS) as usize).min(counts.len() - 1);
        counts[i] += 1;
    }
    let mut table = Table::new(format!("{TIMELINE} ({case})"), &["ms", "acked"]).detail();
    for (i, count) in counts.iter().enumerate() {
        table.push(vec![decimals(i as f64 * BUCKET_MS, 0), count.to_string()]);
    }
    table
}

/// Each case's timeline: acked probes over the run, the kill and the restart marked.
fn timelines(report: &Report) -> Result<Vec<Plot>> {
    let Some(summary) = report.tables.iter().find(|t| t.title.starts_with(SUMMARY)) else {
        return Ok(Vec::new());
    };
    let (relay, killed, restarted, leader) = (
        column(summary, "relay")?,
        column(summary, "killed_ms")?,
        column(summary, "restarted_ms")?,
        column(summary, "killed")?,
    );
    let mut plots_out = Vec::new();
    for row in &summary.rows {
        let case = &row[relay];
        let title = format!("{TIMELINE} ({case})");
        let Some(points) = report.tables.iter().find(|t| t.title == title) else {
            continue;
        };
        let markers = [
            Marker {
                at: number(&row[killed])?,
                label: format!("SIGKILL {} (leader)", row[leader]),
            },
            Marker {
                at: number(&row[restarted])?,
                label: format!("{} back", row[leader]),
            },
        ];
        let axes = Axes {
            x: "ms from the start of the writer",
            y: "acked probe publishes per 100 ms",
        };
        let svg = plots::timeline(points, "ms", "acked", &markers, axes)
            .with_context(|| format!("cannot plot the timeline of broker-cluster ({case})"))?;
        plots_out.push(Plot {
            id: match case.as_str() {
                "acked" => "broker-cluster-acked",
                _ => "broker-cluster-fire-and-forget",
            },
            title: format!(
                "The stream leader killed and restarted: what the stream acked over the run \
                 ({case} relay)"
            ),
            svg,
        });
    }
    Ok(plots_out)
}
