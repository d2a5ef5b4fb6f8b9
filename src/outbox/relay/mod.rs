//! The relay: reads undelivered outbox rows, delivers them, and marks them published — or, for
//! the watermark designs, remembers how far it got.
//!
//! Every relay is an [`OutboxRelay`] (one pass: fetch, deliver, mark; what is pending; how to
//! wait for more), and every relay is driven by the one loop, [`drive`], with its stop
//! conditions ([`Until`]): drained (optionally only once told the writer is done), a deadline,
//! or a shutdown signal. The designs:
//! - [`Relay`] over the outbox table, with [`RelayDesign::Lock`] (the article's: row locks held
//!   by the delivering transaction, in [`lock`]), [`RelayDesign::Claim`] (a committed lease, in
//!   [`claim`]) and [`RelayDesign::MarkBeforeSend`] (broken on purpose, for explore); it wakes
//!   up by polling or LISTEN/NOTIFY ([`Wakeup`]).
//! - The [`watermark`] relays, which mark nothing: the plain one loses events (watermark-gap),
//!   with a safety lag too; the gap-waiting one stalls on a gap that never fills, the
//!   gap-skipping one loses a commit slower than its threshold; the xid8 one is gap-safe and
//!   waits for every older transaction (horizon); the stored one is the plain one as production
//!   builds it.
//! - The log-tailing [`cdc`] relay (a logical replication slot, [`pgoutput`] decoded): a stream,
//!   not passes, so it follows the slot on its own until stopped.
//!
//! Its SQL is in [`sql`], as the article writes it.

pub mod cdc;
mod claim;
mod config;
mod lock;
pub mod pgoutput;
mod polling;
pub mod sql;
mod timings;
pub mod watermark;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use tokio_postgres::Client;
use tracing::info;

pub use config::{
    LeaseClock, Partition, RelayConfig, RelayDesign, RelayOptions, Wakeup, DEFAULT_MAX_ATTEMPTS,
};
pub use polling::Relay;
pub(crate) use timings::{BatchClock, BatchTimer};
pub use timings::{BatchTimings, RelayStats};

/// Relay children name their sessions `outbox-lab relay NAME` (`application_name`).
pub const RELAY_APPLICATION_NAME: &str = "outbox-lab relay";

/// What one pass did.
#[derive(Debug, Default, Clone, Copy)]
pub struct Pass {
    /// Rows it dealt with: delivered, or set aside for a retry (0: nothing to do).
    pub fetched: usize,
    pub sent: usize,
    pub failed: usize,
    /// A whole batch came back: more rows are likely waiting, so a following relay fetches
    /// again at once instead of waiting.
    pub full: bool,
}

/// What a relay still has to deliver.
#[derive(Debug, Clone, Copy)]
pub struct Pending {
    pub rows: i64,
    /// How long until the earliest of them is due (a retry's backoff), when not due yet.
    pub next_due: Option<Duration>,
}

/// A relay design: one pass at a time, driven by [`drive`].
// Used through generics only (never `dyn`), so the futures' Send-ness follows the types.
#[allow(async_fn_in_trait)]
pub trait OutboxRelay {
    /// Its name in log lines (`[relay NAME] ...`).
    fn name(&self) -> &str;
    /// Fetch, deliver, mark: one batch.
    async fn pass(&mut self) -> Result<Pass>;
    /// What it has still to deliver.
    async fn pending(&self) -> Result<Pending>;
    /// Waits until there may be something new, as `wakeup` says (polling, unless it listens).
    async fn wait_for_work(&mut self, wakeup: Wakeup) -> Result<()> {
        tokio::time::sleep(wakeup.fallback()).await;
        Ok(())
    }
}

/// When [`drive`] stops.
pub enum Until<'a> {
    /// Nothing left to deliver — and, with `once`, only after that flag is set (explore's "the
    /// writer is done"); an empty pass sleeps `idle` (or until a retry is due). After
    /// `deadline` it gives up ([`Ended::GaveUp`]): a bound, so a stuck run cannot hang.
    Drained {
        idle: Duration,
        deadline: Duration,
        once: Option<&'a AtomicBool>,
    },
    /// Until the shutdown future resolves, waking up as [`Wakeup`] says. A batch under way is
    /// always finished (sent, marked, committed) first: stopping loses nothing and sends
    /// nothing twice.
    Shutdown(Wakeup),
}

/// How [`drive`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    Drained {
        sent: u64,
    },
    Shutdown {
        sent: u64,
    },
    /// The deadline passed with rows left.
    GaveUp {
        pending: i64,
        after: Duration,
    },
}

impl Ended {
    /// A relay that gave up is an error where draining was its job.
    pub fn or_gave_up(self, name: &str) -> Result<u64> {
        match self {
            Ended::Drained { sent } | Ended::Shutdown { sent } => Ok(sent),
            Ended::GaveUp { pending, after } => {
                bail!("relay {name} gave up after {after:?}: {pending} rows still undelivered")
            }
        }
    }
}

/// The one relay loop: passes until `until` says stop.
pub async fn drive<R: OutboxRelay>(
    relay: &mut R,
    until: Until<'_>,
    shutdown: impl Future<Output = ()>,
) -> Result<Ended> {
    tokio::pin!(shutdown);
    // Polled once up front: a signal handler the shutdown future installs is in place before the
    // first pass.
    if futures_util::FutureExt::now_or_never(shutdown.as_mut()).is_some() {
        return Ok(Ended::Shutdown { sent: 0 });
    }
    let started = Instant::now();
    let mut sent = 0u64;
    loop {
        let pass = relay.pass().await?;
        sent += pass.sent as u64;
        match &until {
            Until::Shutdown(wakeup) => {
                // Heard after every pass, a full one too.
                let wait = async {
                    if pass.full {
                        Ok(())
                    } else {
                        relay.wait_for_work(*wakeup).await
                    }
                };
                tokio::select! {
                    biased;
                    () = &mut shutdown => {
                        info!(relay = %relay.name(), "stopping after its last batch");
                        return Ok(Ended::Shutdown { sent });
                    }
                    waited = wait => waited?,
                }
            }
            Until::Drained {
                idle,
                deadline,
                once,
            } => {
                if pass.fetched > 0 {
                    continue;
                }
                // Read the flag before counting: once it is set (the writer is done), a count
                // taken after seeing it includes everything written.
                let may_stop = once.is_none_or(|flag| flag.load(Ordering::SeqCst));
                let pending = if may_stop {
                    Some(relay.pending().await?)
                } else {
                    None
                };
                if pending.is_some_and(|p| p.rows == 0) {
                    info!(relay = %relay.name(), "exit. sent_total={sent}");
                    return Ok(Ended::Drained { sent });
                }
                if started.elapsed() > *deadline {
                    let pending = match pending {
                        Some(p) => p.rows,
                        None => relay.pending().await?.rows,
                    };
                    return Ok(Ended::GaveUp {
                        pending,
                        after: *deadline,
                    });
                }
                let wait = pending.and_then(|p| p.next_due).unwrap_or(*idle);
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// Gives dead letters (undelivered rows with `max_attempts` attempts or more, the relays' limit)
/// their attempts back (`outbox-lab requeue`): a row still under retry keeps its backoff, and a
/// row a relay holds locked is skipped, not waited for. Returns rows requeued.
pub async fn requeue(client: &Client, max_attempts: i32) -> Result<u64> {
    Ok(client.execute(sql::REQUEUE, &[&max_attempts]).await?)
}
