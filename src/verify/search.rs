//! `--search N --seed S`: the schedules a search runs, drawn from the nemesis grammar before
//! anything starts (the kinds the sink and the server allow, or those `--nemesis` names; their
//! moments, numbers and lengths), the same seed drawing the same schedules.

use std::time::Duration;

use anyhow::{bail, Result};

use super::plan::{VerifySink, FAILOVER, NEMESES};
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
const DRAWN_NEMESES: u32 = 3;
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

/// Schedule `k` of the search seeded `seed`: 1 to [`DRAWN_NEMESES`] nemeses of the kinds the
/// sink and the server allow (`net-down` among them), `only` those if given, their moments,
/// numbers and lengths drawn too. The same seed and `k` draw the same schedule.
pub fn draw(
    seed: u64,
    k: u32,
    external_server: bool,
    sink: VerifySink,
    only: Option<&[String]>,
) -> Result<Schedule> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(u64::from(k));
    let kinds: Vec<&str> = NEMESES
        .iter()
        .map(|(kind, _)| *kind)
        .filter(|kind| {
            !(external_server && *kind == "db-restart"
                || !sink.behind_the_proxy() && kind.starts_with("net-")
                || !sink.sees_deliveries() && kind.ends_with("-on-delivery")
                || *kind == FAILOVER && only.is_none())
                && only.is_none_or(|only| only.iter().any(|o| o == kind))
        })
        .collect();
    if kinds.is_empty() {
        bail!(
            "--search: no nemesis of --nemesis {} can strike here (with --sink {}{})",
            only.unwrap_or_default().join(","),
            sink.name(),
            if external_server {
                ", on your server"
            } else {
                ""
            }
        );
    }
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
            other => unreachable!("a nemesis of NEMESES not drawn: {other}"),
        };
        let nemesis: Nemesis = text.parse().expect("drawn nemeses parse");
        // Two nemeses on one delivery, request or COMMIT: the second would wait for the next.
        if !nemeses.contains(&nemesis) {
            nemeses.push(nemesis);
        }
    }
    Ok(Schedule {
        faults: Vec::new(),
        nemeses,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::plan::check_schedule;

    /// The same seed and draw give the same schedule, another draw another; every drawn
    /// schedule prints back to itself, and holds only what its sink and server allow.
    #[test]
    fn drawn_schedules_reproduce_and_fit_their_sink() {
        assert_eq!(
            draw(7, 3, false, VerifySink::Http, None).unwrap(),
            draw(7, 3, false, VerifySink::Http, None).unwrap()
        );
        let http: Vec<Schedule> = (0..200)
            .map(|k| draw(7, k, false, VerifySink::Http, None).unwrap())
            .collect();
        assert!(http.windows(2).any(|w| w[0] != w[1]));
        for schedule in &http {
            assert!((1..=DRAWN_NEMESES as usize).contains(&schedule.nemeses.len()));
            assert_eq!(
                schedule.to_string().parse::<Schedule>().as_ref(),
                Ok(schedule)
            );
            check_schedule(schedule, false, VerifySink::Http).unwrap();
        }
        // Every kind comes up in 200 draws, the sustained outage among them; the failover only
        // where it is named.
        for (kind, _) in NEMESES.iter().filter(|(kind, _)| *kind != FAILOVER) {
            assert!(
                http.iter()
                    .flat_map(|s| &s.nemeses)
                    .any(|n| n.kind() == *kind),
                "{kind} never drawn"
            );
        }
        for k in 0..200 {
            let nats = draw(7, k, true, VerifySink::Nats, None).unwrap();
            check_schedule(&nats, true, VerifySink::Nats).unwrap();
            let redis = draw(7, k, false, VerifySink::Redis, None).unwrap();
            check_schedule(&redis, false, VerifySink::Redis).unwrap();
        }
    }

    /// `--nemesis` narrows what a search draws (a search without a crash); a list of which
    /// nothing can strike here is refused.
    #[test]
    fn a_search_draws_only_the_kinds_named() {
        let only = ["pause".to_string(), "pause-on-delivery".to_string()];
        for k in 0..100 {
            let drawn = draw(7, k, false, VerifySink::Http, Some(&only)).unwrap();
            assert!(drawn
                .nemeses
                .iter()
                .all(|n| only.contains(&n.kind().to_string())));
        }
        let on_delivery = ["pause-on-delivery".to_string()];
        let err = draw(7, 0, false, VerifySink::Nats, Some(&on_delivery)).unwrap_err();
        assert!(err.to_string().contains("can strike"), "{err}");
    }
}
