//! `--search N --seed S`: the schedules a search runs, drawn from the nemesis grammar before
//! anything starts (of the kinds the plan allows: their moments, numbers and lengths), the
//! same seed drawing the same schedules. Which kinds the sink and the server allow is the
//! plan's.

use std::time::Duration;

use anyhow::{bail, Result};

use crate::explore::schedule::{Nemesis, Schedule};
use crate::harness::nemesis::format_duration;

/// `--search`'s schedules, drawn before anything runs.
pub struct Search {
    pub(super) seed: u64,
    /// The kinds drawn from, where `--nemesis` named some (e.g. no crash: pause, net-delay).
    pub(super) only: Option<Vec<String>>,
    pub(super) schedules: Vec<Schedule>,
}

/// The kinds a search draws from: those `--nemesis` names, or every kind (`all`, the default).
pub(super) fn drawn_only(kinds: &[String]) -> Result<Option<Vec<String>>> {
    let kinds: Vec<String> = kinds.iter().map(|k| k.trim().to_string()).collect();
    match kinds.as_slice() {
        [] => Ok(None),
        [one] if one == "all" => Ok(None),
        [one] if one == "none" => bail!("--search with --nemesis none draws nothing"),
        _ => Ok(Some(kinds)),
    }
}

/// Nemeses in a drawn schedule: one to this many.
pub(super) const DRAWN_NEMESES: u32 = 3;
/// A drawn moment on the clock: within the writer's first seconds, in steps of 50 ms.
const DRAWN_AT_MS: std::ops::RangeInclusive<u64> = 2..=40;
/// A drawn pause, partition or outage: 200 ms to 4 s, in steps of 100 ms (past a lease of 1 or
/// 2 s, and past a relay's retries).
const DRAWN_FOR_MS: std::ops::RangeInclusive<u64> = 2..=40;
/// A drawn outage of the sink: 500 ms to 10 s (a broker down long enough for a relay's retries
/// to run out: pg-transactional-outbox abandons a message after 5 attempts a lease apart).
const DRAWN_OUTAGE_MS: std::ops::RangeInclusive<u64> = 5..=100;
/// A drawn request, delivery or COMMIT number.
const DRAWN_NUMBER: std::ops::RangeInclusive<u32> = 1..=30;

/// Schedule `k` of the search seeded `seed`: 1 to [`DRAWN_NEMESES`] nemeses of `kinds` (names of
/// `--nemesis`, never empty), their moments, numbers and lengths drawn too. The same seed, `k`
/// and kinds draw the same schedule.
pub fn draw(seed: u64, k: u32, kinds: &[&str]) -> Schedule {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(u64::from(k));
    let count = rng.random_range(1..=DRAWN_NEMESES);
    let mut nemeses = Vec::new();
    for _ in 0..count {
        let at = Duration::from_millis(50 * rng.random_range(DRAWN_AT_MS));
        let hold = Duration::from_millis(100 * rng.random_range(DRAWN_FOR_MS));
        let outage = Duration::from_millis(100 * rng.random_range(DRAWN_OUTAGE_MS));
        let n = rng.random_range(DRAWN_NUMBER);
        let (at, hold, outage) = (
            format_duration(at),
            format_duration(hold),
            format_duration(outage),
        );
        let text = match kinds[rng.random_range(0..kinds.len())] {
            "kill" => format!("kill:relay@{at}"),
            "pause" => format!("pause:relay@{at}+{hold}"),
            "db-kill-backend" => format!("db:kill-backend:relay@{at}"),
            "dbnet-reset" => format!("dbnet:reset:relay@{at}"),
            "dbnet-partition" => format!("dbnet:partition:relay@{at}+{hold}"),
            "db-restart" => format!("db:restart@{at}"),
            "db-failover" => format!("db:failover@{at}"),
            "dbnet-commit-lost" => format!("dbnet:commit-lost:relay@{n}"),
            "net-reset" => format!("net:reset@{n}"),
            "net-reply-lost" => format!("net:reply-lost@{n}"),
            "net-delay" => format!("net:delay@{n}+{hold}"),
            "net-down" => format!("net:down@{at}+{outage}"),
            "db-kill-backend-on-delivery" => format!("db:kill-backend:relay:on-delivery@{n}"),
            "pause-on-delivery" => format!("pause:relay:on-delivery@{n}+{hold}"),
            "kill-on-delivery" => format!("kill:relay:on-delivery@{n}"),
            "txn-slow-commit" => format!("txn:slow-commit@{at}+{hold}"),
            "txn-idle" => format!("txn:idle@{at}+{hold}"),
            "txn-rollback" => format!("txn:rollback@{at}"),
            "txn-prepared" => format!("txn:prepared@{at}+{hold}"),
            "clock-step-relay" => format!("clock:step:relay@{at}+{}s", n * 5),
            "clock-step-relay-back" => format!("clock:step:relay@{at}-{}s", n * 5),
            "clock-step-db" => format!("clock:step:db@{at}+{}s", n * 5),
            other => unreachable!("a nemesis kind that is not drawn: {other}"),
        };
        let nemesis: Nemesis = text.parse().expect("drawn nemeses parse");
        // Two nemeses on one delivery, request or COMMIT: the second would wait for the next.
        if !nemeses.contains(&nemesis) {
            nemeses.push(nemesis);
        }
    }
    Schedule {
        faults: Vec::new(),
        nemeses,
    }
}
