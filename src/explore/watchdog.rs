//! The liveness watchdog: once the writer is done, the relays must drain within a bound of the
//! last fault (a fault that fires later starts the wait again; one the harness takes time to
//! do, a restart or a failover, from when it is done), or the run is stuck — a verdict, not a
//! hang.

use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::faults::FaultLog;

/// Liveness, as a bound: every committed event is delivered within this time after the faults
/// end (the writer finished and the last fault fired), or the run is stuck. A drain takes tens
/// of milliseconds here; the rest is margin for a loaded machine. Every run of a stuck design
/// lasts this long, so it is short.
pub const LIVENESS_BOUND: Duration = Duration::from_secs(3);

/// Resolves only when the bound is missed, with the verdict's words.
pub async fn liveness_watchdog(
    faults: &FaultLog,
    writer_done: &watch::Sender<bool>,
    bound: Duration,
) -> String {
    let mut done = writer_done.subscribe();
    // The sender outlives this future: it lives in the supervision that polls it.
    let _ = done.wait_for(|done| *done).await;
    let writer_done_at = Instant::now();
    loop {
        let faults_ended = faults
            .faults_over()
            .map_or(writer_done_at, |at| at.max(writer_done_at));
        let deadline = faults_ended + bound;
        if Instant::now() >= deadline {
            return format!(
                "not drained within {} s after the writer finished and the last fault fired",
                bound.as_secs()
            );
        }
        tokio::time::sleep_until(deadline.into()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::explore::schedule::Schedule;

    /// A fault the harness takes time to do (a restart, a failover) starts the bound when it
    /// is done, not when it fired: fired at once, done 150 ms later, a 250 ms bound is missed
    /// no sooner than 400 ms in, and less than a bound later (650 ms): a watchdog that waits
    /// the bound twice fails, one that never fires fails at 5 s instead of hanging the test.
    /// 40 runs of the lib's tests beside `yes`, two scenarios and other builds (load 7), at the
    /// 100 ms bound this test had: missed 2.1 to 13.7 ms after its due time (median 3.3), so
    /// the 250 ms allowed is 18 times the latest.
    #[tokio::test]
    async fn the_bound_starts_when_the_harness_is_done_with_a_fault() {
        let schedule: Schedule = "db:restart@0ms".parse().unwrap();
        let faults = FaultLog::new(&schedule);
        let started = Instant::now();
        faults.struck(0, "postgres".into(), started);
        let (writer_done, _) = watch::channel(true);
        let (harness_time, bound) = (Duration::from_millis(150), Duration::from_millis(250));
        let harness = async {
            let doing = faults.harness_doing();
            tokio::time::sleep(harness_time).await;
            drop(doing);
            std::future::pending::<String>().await
        };
        let watched = tokio::time::timeout(Duration::from_secs(5), async {
            tokio::select! {
                why = liveness_watchdog(&faults, &writer_done, bound) => why,
                _ = harness => unreachable!("the harness never ends"),
            }
        })
        .await;
        let missed_after = started.elapsed();
        let why = watched.unwrap_or_else(|_| panic!("the watchdog never fired: {missed_after:?}"));
        assert!(why.starts_with("not drained within"), "{why}");
        let due = harness_time + bound;
        assert!(missed_after >= due, "early: {missed_after:?}");
        assert!(missed_after < due + bound, "late: {missed_after:?}");
    }
}
