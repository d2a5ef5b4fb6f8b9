//! One bounded wait: look every `every` until a probe answers, for at most `limit`.
//!
//! A probe answers `Ok(true)` or `Ok(Some(value))` when what it waits for has happened,
//! `Ok(false)` or `Ok(None)` when not yet; an error ends the wait at once. [`until`] makes a
//! timeout an error naming what was waited for; [`up_to`] returns `None` instead, for a caller
//! to whom running out of time is a result (what a relay missed counts as lost) or who must
//! clean up first. [`blocking_up_to`] is the same for code without a runtime.

use std::fmt::Display;
use std::time::Duration;

use anyhow::{anyhow, Result};
use tokio::time::Instant;

/// What a probe says: done (with a value), or not yet.
pub trait Answer {
    type Value;
    fn done(self) -> Option<Self::Value>;
}

impl Answer for bool {
    type Value = ();
    fn done(self) -> Option<()> {
        self.then_some(())
    }
}

impl<T> Answer for Option<T> {
    type Value = T;
    fn done(self) -> Option<T> {
        self
    }
}

/// Probes until it answers, for at most `limit`: the answer, or `None` when the time ran out.
/// The probe is tried at once, then every `every`, and always to its end (it may act, as a
/// relay's pass does): each probe must be bounded itself, as a query or a PING is.
pub async fn up_to<A: Answer>(
    limit: Duration,
    every: Duration,
    mut probe: impl AsyncFnMut() -> Result<A>,
) -> Result<Option<A::Value>> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = probe().await?.done() {
            return Ok(Some(value));
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(None);
        }
        tokio::time::sleep(every.min(deadline - now)).await;
    }
}

/// Probes until it answers; after `limit`, an error: "gave up waiting for WHAT after LIMIT".
pub async fn until<A: Answer>(
    what: impl Display,
    limit: Duration,
    every: Duration,
    probe: impl AsyncFnMut() -> Result<A>,
) -> Result<A::Value> {
    up_to(limit, every, probe)
        .await?
        .ok_or_else(|| anyhow!("gave up waiting for {what} after {limit:?}"))
}

/// [`up_to`] without a runtime: the thread sleeps between probes.
pub fn blocking_up_to<A: Answer>(
    limit: Duration,
    every: Duration,
    mut probe: impl FnMut() -> A,
) -> Option<A::Value> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(value) = probe().done() {
            return Some(value);
        }
        let now = std::time::Instant::now();
        if now >= deadline {
            return None;
        }
        std::thread::sleep(every.min(deadline - now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[tokio::test]
    async fn returns_the_first_answer() {
        let mut tries = 0;
        let value = until("the third try", 100 * MS, 10 * MS, async || {
            tries += 1;
            Ok((tries == 3).then_some(tries * 10))
        })
        .await
        .unwrap();
        assert_eq!((value, tries), (30, 3));
    }

    #[tokio::test]
    async fn a_timeout_names_what_was_waited_for() {
        let started = Instant::now();
        let error = until("the relay's session", 50 * MS, 10 * MS, async || Ok(false))
            .await
            .unwrap_err();
        let gave_up_after = started.elapsed();
        assert_eq!(
            error.to_string(),
            "gave up waiting for the relay's session after 50ms"
        );
        // It gives up at its limit, not before, and not long after: 20 runs of the lib's tests
        // beside `yes`, other scenarios and a build (load 7-8) gave up 50.2 to 55.3 ms in; a
        // wait 250 ms late fails, 45 times the latest seen.
        assert!(gave_up_after >= 50 * MS, "early: {gave_up_after:?}");
        assert!(
            gave_up_after < 50 * MS + 250 * MS,
            "late: {gave_up_after:?}"
        );
    }

    #[tokio::test]
    async fn a_probe_error_ends_the_wait() {
        let error = up_to(50 * MS, 10 * MS, async || -> Result<bool> {
            Err(anyhow!("no database"))
        })
        .await
        .unwrap_err();
        assert_eq!(error.to_string(), "no database");
    }

    #[test]
    fn blocking_wait_gives_up_at_the_limit() {
        let mut tries = 0;
        assert_eq!(
            blocking_up_to(5 * MS, MS, || {
                tries += 1;
                false
            }),
            None
        );
        assert!(tries > 1);
        assert_eq!(blocking_up_to(5 * MS, MS, || Some(7)), Some(7));
    }
}
