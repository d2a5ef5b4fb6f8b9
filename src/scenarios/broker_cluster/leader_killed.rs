//! One case of broker-cluster, one relay's run with the stream leader killed: its stream
//! created on the cluster, the relay following, the writer paced, the leader killed once enough
//! is published and restarted after the failover, the relay drained; then the outbox held
//! against what the stream holds.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use async_nats::jetstream::{self, stream};
use tokio::sync::{oneshot, watch};
use tokio_postgres::Client;

use super::probe::{probe, Probe};
use super::{Case, Ctx, Params, CHILD_TIMEOUT};
use crate::connect;
use crate::harness::child::ChildEnd;
use crate::harness::nats_server::{NatsCluster, CLUSTER_NODES};
use crate::judge::counts;
use crate::outbox::relay::{RelayConfig, Wakeup, RELAY_APPLICATION_NAME};
use crate::outbox::sink::NatsSink;
use crate::outbox::writer::Ending;
use crate::wait;

/// The first ack after the kill comes within this, or the run fails.
const FAILOVER_LIMIT: Duration = Duration::from_secs(60);
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

/// What one case measured.
pub(super) struct Measured {
    pub(super) published: i64,
    pub(super) stream_events: i64,
    pub(super) stream_duplicates: i64,
    pub(super) lost: i64,
    pub(super) leader: String,
    pub(super) killed_ms: f64,
    /// The first ack of a probe sent after the kill.
    failover_end_ms: f64,
    pub(super) restarted_ms: f64,
    pub(super) probes: Vec<Probe>,
}

impl Measured {
    pub(super) fn failover_ms(&self) -> f64 {
        self.failover_end_ms - self.killed_ms
    }

    /// The phase a probe was sent in (an index into [`PHASES`](super::PHASES)).
    pub(super) fn phase(&self, probe: &Probe) -> usize {
        match probe.sent_ms {
            ms if ms < self.killed_ms => 0,
            ms if ms < self.failover_end_ms => 1,
            ms if ms < self.restarted_ms => 2,
            _ => 3,
        }
    }
}

/// One relay's run: the stream created, the relay following, the writer paced, the leader
/// killed mid-run and restarted, the relay drained; then the outbox against the stream.
pub(super) async fn run_case(
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
        // The stream may lose its leader again while it is read (the restarted node catching up
        // under load answered 503, "JetStream system temporarily unavailable"): a read is tried
        // again for as long as a failover may take.
        let mut failed = String::new();
        let message = wait::up_to(
            FAILOVER_LIMIT,
            Duration::from_millis(100),
            async || match stream.get_raw_message(seq).await {
                Ok(message) => Ok(Some(message)),
                Err(e) => {
                    failed = e.to_string();
                    Ok(None)
                }
            },
        )
        .await?
        .ok_or_else(|| anyhow!("cannot read message {seq} of the stream: {failed}"))?;
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
