//! notify-latency's headline, commit -> receipt, and where it goes: the writer's COMMIT and the
//! relay's moments (this host's clock) set beside the consumer's receipts (the server's clock),
//! once the two clocks are known to agree.

use anyhow::{bail, Result};
use tokio_postgres::Client;

use crate::harness::child::ChildRun;
use crate::judge::counts;
use crate::judge::latency::{self, LatencySummary};
use crate::outbox::phases;

/// How far the server's clock may stand from this host's (beyond the round trip's
/// uncertainty) for the two to be compared.
const CLOCK_TOLERANCE_US: i64 = 200;

/// commit -> receipt, and the p50 of its phases (ms).
pub(super) struct Split {
    pub(super) commit_to_receipt: LatencySummary,
    pub(super) commit_to_woken_p50_ms: f64,
    pub(super) woken_to_fetched_p50_ms: f64,
    pub(super) fetched_to_sent_p50_ms: f64,
    pub(super) sent_to_received_p50_ms: f64,
}

/// Each event's commit -> receipt, and its phases: the writer's and the relay's lines set
/// beside the server's receipts.
pub(super) async fn split(client: &Client, writer: &ChildRun, relay: &ChildRun) -> Result<Split> {
    let committed = phases::read_committed(writer.log_lines());
    let relay_times = phases::read_relay(relay.log_lines());
    let ms = |from_us: i64, to_us: i64| (to_us - from_us) as f64 / 1000.0;
    let mut commit_to_receipt = Vec::new();
    let mut phase_ms: [Vec<(i64, f64)>; 4] = Default::default();
    for row in client.query(counts::RECEIPT_TIMES_US, &[]).await? {
        let seq: i64 = row.get("seq");
        let order: String = row.get("order_id");
        let received_us: i64 = row.get("received_us");
        let Some(&committed_us) = order.parse().ok().and_then(|o: i64| committed.get(&o)) else {
            continue;
        };
        commit_to_receipt.push((seq, ms(committed_us, received_us)));
        let Some(relay) = relay_times.get(&row.get::<_, i64>("outbox_id")) else {
            continue;
        };
        let moments = [
            committed_us,
            relay.woken_us,
            relay.fetched_us,
            relay.sending_us,
            received_us,
        ];
        for (phase, pair) in phase_ms.iter_mut().zip(moments.windows(2)) {
            phase.push((seq, ms(pair[0], pair[1])));
        }
    }
    if commit_to_receipt.is_empty() {
        bail!("no receipt matches a COMMIT the writer reported");
    }
    let [woken, fetched, sent, received] = phase_ms.map(latency::summarise);
    Ok(Split {
        commit_to_receipt: latency::summarise(commit_to_receipt)?,
        commit_to_woken_p50_ms: woken?.p50_ms,
        woken_to_fetched_p50_ms: fetched?.p50_ms,
        fetched_to_sent_p50_ms: sent?.p50_ms,
        sent_to_received_p50_ms: received?.p50_ms,
    })
}

/// The writer's and the relay's times are this host's clock, the receipts the server's: they
/// are compared only if the two clocks agree (one host).
pub(super) async fn same_clock_as_server(client: &Client) -> Result<()> {
    let before_us = phases::now_us();
    let server_us: i64 = client.query_one(counts::SERVER_CLOCK_US, &[]).await?.get(0);
    let after_us = phases::now_us();
    let offset_us = server_us - (before_us + after_us) / 2;
    if offset_us.abs() > (after_us - before_us) / 2 + CLOCK_TOLERANCE_US {
        bail!(
            "notify-latency sets this host's clock beside the server's, and they differ by {:.1} \
             ms: run it on the server's host (or without --database-url)",
            offset_us as f64 / 1000.0
        );
    }
    Ok(())
}
