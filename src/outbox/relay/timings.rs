//! How a relay spent its time, batch by batch (fetch, send, mark, commit), for the throughput
//! figures, and its counters for `/metrics`.

use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// How a draining relay spent its time on the batches that found rows, on its own clock: what a
/// throughput figure divides by. The phases are the steps of a batch as the relay waits on
/// them, added up over its workers; whatever is left of `busy` × `workers` went between
/// batches.
#[derive(Debug, Default, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BatchTimings {
    /// The relay's delivery loops ([`RelayConfig::workers`]), whose phases are added up here.
    #[serde(default = "super::config::one_worker")]
    pub workers: u32,
    /// Batches that found rows, and the rows they fetched.
    pub batches: u64,
    pub events: u64,
    /// From the start of the first fetch that found rows to the end of the last commit (of any
    /// worker): the process's start, its connections and the final empty fetch are outside it.
    pub busy: Duration,
    /// BEGIN and the fetch, until the rows are in hand.
    pub fetch: Duration,
    /// The sink's deliveries (and the record of any failure).
    pub send: Duration,
    /// The UPDATE that marks the rows published: what it took beyond the sink's answers (it
    /// runs beside the send).
    pub mark: Duration,
    pub commit: Duration,
}

/// When each step of one batch ended.
pub(crate) struct BatchClock {
    pub started: Instant,
    pub fetched: Instant,
    pub sent: Instant,
    pub marked: Instant,
    pub committed: Instant,
}

/// Adds up a relay's [`BatchTimings`], batch after batch.
#[derive(Debug, Default)]
pub(crate) struct BatchTimer {
    first_fetch: Option<Instant>,
    last_commit: Option<Instant>,
    timings: BatchTimings,
}

impl BatchTimer {
    /// Counts a batch of `rows` rows; an empty fetch is not a batch.
    pub fn record(&mut self, rows: usize, clock: &BatchClock) {
        if rows == 0 {
            return;
        }
        let first_fetch = *self.first_fetch.get_or_insert(clock.started);
        self.last_commit = Some(clock.committed);
        let timings = &mut self.timings;
        timings.batches += 1;
        timings.events += rows as u64;
        timings.busy = clock.committed - first_fetch;
        timings.fetch += clock.fetched - clock.started;
        timings.send += clock.sent - clock.fetched;
        timings.mark += clock.marked - clock.sent;
        timings.commit += clock.committed - clock.marked;
    }

    /// The timings of workers that ran side by side: their batches and phases added up, busy
    /// from the first fetch of any to the last commit of any.
    pub fn merged<'a>(timers: impl IntoIterator<Item = &'a BatchTimer>) -> BatchTimings {
        let mut merged = BatchTimings::default();
        let (mut first, mut last): (Option<Instant>, Option<Instant>) = (None, None);
        for timer in timers {
            merged.workers += 1;
            let t = &timer.timings;
            merged.batches += t.batches;
            merged.events += t.events;
            merged.fetch += t.fetch;
            merged.send += t.send;
            merged.mark += t.mark;
            merged.commit += t.commit;
            if let (Some(f), Some(l)) = (timer.first_fetch, timer.last_commit) {
                first = Some(first.map_or(f, |first| first.min(f)));
                last = Some(last.map_or(l, |last| last.max(l)));
            }
        }
        if let (Some(first), Some(last)) = (first, last) {
            merged.busy = last - first;
        }
        merged
    }
}

/// A relay's counters since it started.
#[derive(Debug, Default)]
pub struct RelayStats {
    pub delivered: AtomicU64,
    pub failed: AtomicU64,
}
