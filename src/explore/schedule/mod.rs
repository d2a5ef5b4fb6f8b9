//! Schedules: which process dies at which crash point on which pass, and the [`Nemesis`]es
//! struck beside them. Parsed and printed
//! (`relay:after-send-before-mark@3,consumer:after-commit-before-reply@2,db:restart@60ms`),
//! enumerated exhaustively for a design, or drawn at random from a seed.
//!
//! The nemeses' grammar (AT and FOR are durations like `60ms` or `1.5s`, counted from the start
//! of the run: when the writer and relays start, the consumer listening; N counts passes or
//! requests, from 1):
//! - `pause:ROLE@AT+FOR`: SIGSTOP the role's process at AT, SIGCONT after FOR.
//! - `pause:ROLE:STEP@N+FOR`: the role's first process stops itself on the N-th pass of its
//!   crash point STEP (as in `relay:after-fetch@1`) and is held FOR: a pause at a known place.
//! - `kill:ROLE@AT`: SIGKILL the role's process at AT (a crash at a moment, not at a point).
//! - `db:restart@AT`: the throwaway PostgreSQL stopped with `pg_ctl stop -m immediate` at AT
//!   and started again.
//! - `db:kill-backend:ROLE@AT`: `pg_terminate_backend` of the relay's or consumer's sessions.
//! - `net:reset@N`, `net:reply-lost@N`, `net:delay@N+FOR`: the N-th request from the relays to
//!   the consumer, through the proxy.
//! - `kill:relay:on-delivery@N`, `pause:relay:on-delivery@N+FOR`,
//!   `db:kill-backend:relay:on-delivery@N`: the relay that sent the run's N-th delivery, struck
//!   as the proxy holds that delivery (pause: in flight; the others: applied, not answered).
//!
//! ROLE is writer, relay or consumer; `relay` is relay 0, as for crash points. Striking them
//! is [`super::nemeses`]'; their text form is [`nemesis`]'s.

mod nemesis;

pub use nemesis::{
    ClockTarget, DbNetFault, DeliveryStrike, Nemesis, TxnFault, FAILOVER_HOLD, KINDS,
};

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::harness::nemesis::parse_ordinal;
use crate::outbox::crash::{CrashPlan, CrashPoint};

/// The actors a fault can hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    Writer,
    Relay,
    Consumer,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Writer, Role::Relay, Role::Consumer];

    pub fn name(self) -> &'static str {
        match self {
            Role::Writer => "writer",
            Role::Relay => "relay",
            Role::Consumer => "consumer",
        }
    }

    /// The role whose code path a crash point sits in (its name starts with the role's); `None`
    /// for points of actors explore does not run (the Redis stream worker).
    pub fn of(point: CrashPoint) -> Option<Role> {
        Role::ALL
            .into_iter()
            .find(|r| point.name().starts_with(&format!("{}-", r.name())))
    }
}

/// One process death: the role's process dies at `plan`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    pub role: Role,
    pub plan: CrashPlan,
}

impl Fault {
    /// A fault on a point of the writer, a relay or the consumer (the points of a design).
    pub fn new(point: CrashPoint, on_pass: u32) -> Fault {
        Fault {
            role: Role::of(point).expect("a point of writer, relay or consumer"),
            plan: CrashPlan::new(point, on_pass),
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let role = self.role.name();
        let step = &self.plan.point.name()[role.len() + 1..];
        write!(f, "{role}:{step}@{}", self.plan.on_pass)
    }
}

impl FromStr for Fault {
    type Err = String;

    /// `ROLE:STEP[@PASS]`, STEP being the crash point's name without the role, or any unique
    /// start of it (`relay:after-send@3`); a full crash point name is accepted too.
    fn from_str(s: &str) -> Result<Fault, String> {
        let (spec, pass) = match s.split_once('@') {
            Some((spec, pass)) => (spec, Some(pass)),
            None => (s, None),
        };
        let on_pass = match pass {
            None => 1,
            Some(pass) => parse_ordinal(pass, s, "pass count")?,
        };
        let (role, step) = match spec.split_once(':') {
            Some((role, step)) => {
                let role = Role::ALL
                    .into_iter()
                    .find(|r| r.name() == role)
                    .ok_or_else(|| {
                        format!("unknown role '{role}' in '{s}' (writer, relay or consumer)")
                    })?;
                (role, step)
            }
            None => {
                let point: CrashPoint = spec.parse()?;
                if Role::of(point).is_none() {
                    return Err(format!(
                        "crash point {point} is not on a writer, relay or consumer path"
                    ));
                }
                return Ok(Fault::new(point, on_pass));
            }
        };
        let prefix = format!("{}-{step}", role.name());
        let candidates: Vec<CrashPoint> = CrashPoint::ALL
            .into_iter()
            .filter(|p| p.name().starts_with(&prefix))
            .collect();
        match candidates.as_slice() {
            [point] => Ok(Fault::new(*point, on_pass)),
            [] => Err(format!(
                "no {} crash point starts with '{step}' in '{s}' (see `outbox-lab crash-points`)",
                role.name()
            )),
            many => Err(format!(
                "'{step}' in '{s}' is ambiguous: {}",
                many.iter().map(|p| p.name()).collect::<Vec<_>>().join(", ")
            )),
        }
    }
}

/// The faults of one run, in the order they are armed; empty = the run without faults.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Schedule {
    pub faults: Vec<Fault>,
    /// Faults from outside: pauses, kills, the database, the network.
    pub nemeses: Vec<Nemesis>,
}

impl Schedule {
    /// When the last of its nemeses on the run's clock is over; `None` without such nemeses.
    pub fn clock_over_at(&self) -> Option<Duration> {
        self.nemeses.iter().filter_map(Nemesis::over_at).max()
    }

    /// Smaller is simpler to read: fewer faults, then earlier passes.
    pub fn size(&self) -> (usize, u32) {
        (
            self.faults.len() + self.nemeses.len(),
            self.faults.iter().map(|f| f.plan.on_pass).sum(),
        )
    }

    /// Every single fault on `points`, on passes 1 to `max_pass`, after the run without faults.
    pub fn exhaustive(points: &[CrashPoint], max_pass: u32) -> Vec<Schedule> {
        let mut all = vec![Schedule::default()];
        for &point in points {
            for pass in 1..=max_pass {
                all.push(Schedule {
                    faults: vec![Fault::new(point, pass)],
                    ..Schedule::default()
                });
            }
        }
        all
    }

    /// `count` schedules of 1 to 3 faults on `points` (passes 1 to `max_pass`), the same for the
    /// same `seed` and `stream` (explore gives each design its own stream).
    pub fn random(
        points: &[CrashPoint],
        max_pass: u32,
        count: u32,
        seed: u64,
        stream: u64,
    ) -> Vec<Schedule> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(stream);
        (0..count)
            .map(|_| {
                let faults = rng.random_range(1..=3);
                Schedule {
                    faults: (0..faults)
                        .map(|_| {
                            let point = points[rng.random_range(0..points.len())];
                            Fault::new(point, rng.random_range(1..=max_pass))
                        })
                        .collect(),
                    ..Schedule::default()
                }
            })
            .collect()
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.faults.is_empty() && self.nemeses.is_empty() {
            return f.write_str("none");
        }
        let faults: Vec<String> = self
            .faults
            .iter()
            .map(Fault::to_string)
            .chain(self.nemeses.iter().map(Nemesis::to_string))
            .collect();
        f.write_str(&faults.join(","))
    }
}

impl FromStr for Schedule {
    type Err = String;

    /// Faults separated by commas, or `none`.
    fn from_str(s: &str) -> Result<Schedule, String> {
        let s = s.trim();
        if s == "none" {
            return Ok(Schedule::default());
        }
        if s.is_empty() {
            return Err("empty schedule (give faults like relay:after-send@3, or none)".into());
        }
        let mut schedule = Schedule::default();
        for item in s.split(',').map(str::trim) {
            if Nemesis::written_as(item) {
                schedule.nemeses.push(item.parse()?);
            } else {
                schedule.faults.push(item.parse()?);
            }
        }
        Ok(schedule)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Short forms parse to the canonical one, which parses back to itself.
    #[test]
    fn schedules_round_trip() {
        let s: Schedule = "relay:after-send@3, consumer:after-commit@2"
            .parse()
            .unwrap();
        assert_eq!(
            s.to_string(),
            "relay:after-send-before-mark@3,consumer:after-commit-before-reply@2"
        );
        assert_eq!(s.to_string().parse::<Schedule>(), Ok(s));
        assert_eq!(
            "writer-after-insert-before-commit".parse::<Schedule>(),
            Ok(Schedule {
                faults: vec![Fault::new(CrashPoint::WriterAfterInsertBeforeCommit, 1)],
                ..Schedule::default()
            })
        );
        assert_eq!("none".parse::<Schedule>(), Ok(Schedule::default()));
    }

    /// Typos, ambiguity and pass 0 are errors that say what is wrong.
    #[test]
    fn bad_schedules_are_explained() {
        let err = |s: &str| s.parse::<Schedule>().unwrap_err();
        assert!(err("relay:after-mark@1").contains("ambiguous"));
        assert!(err("relay:after-effect").contains("no relay crash point"));
        assert!(err("broker:after-send").contains("unknown role"));
        assert!(err("relay:after-send@0").contains("pass count"));
        assert!(err("").contains("empty schedule"));
        assert!(err("stream-worker-after-apply-before-ack").contains("not on a writer"));
    }

    /// The same seed draws the same schedules; another stream draws others.
    #[test]
    fn random_schedules_reproduce() {
        let points: Vec<CrashPoint> = CrashPoint::ALL
            .into_iter()
            .filter(|p| Role::of(*p).is_some())
            .collect();
        let a = Schedule::random(&points, 3, 20, 7, 0);
        assert_eq!(a, Schedule::random(&points, 3, 20, 7, 0));
        assert_ne!(a, Schedule::random(&points, 3, 20, 7, 1));
        assert!(a.iter().all(|s| (1..=3).contains(&s.faults.len())));
    }
}
