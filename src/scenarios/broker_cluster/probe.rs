//! broker-cluster's probe: acked publishes to the case's stream, one at a time, from this
//! process, apart from the relay, so that the failover is timed by a client that waits for
//! nothing else.

use std::time::{Duration, Instant};

use async_nats::jetstream;
use tokio::sync::{oneshot, watch};

/// A probe publish unacknowledged after this failed.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// One probe publish.
pub(super) struct Probe {
    /// When it was sent, in ms since the case started.
    pub(super) sent_ms: f64,
    /// Until its ack, or its failure.
    pub(super) took_ms: f64,
    pub(super) acked: bool,
}

/// Publishes to `subject` every `every`, one publish at a time, each awaiting its ack for at
/// most [`PROBE_TIMEOUT`], until `stop`; `last_ack` tells when the last acked one was sent.
pub(super) async fn probe(
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
