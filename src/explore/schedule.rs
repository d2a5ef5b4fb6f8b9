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
//!
//! ROLE is writer, relay or consumer; `relay` is relay 0, as for crash points. Striking them
//! is [`super::nemeses`]'.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::harness::nemesis::{format_duration, parse_duration};
use crate::harness::proxy::{FaultPlan, NetworkFault};
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
            Some(pass) => pass
                .parse::<u32>()
                .ok()
                .filter(|n| *n >= 1)
                .ok_or_else(|| format!("'{pass}' in '{s}' is not a pass count of 1 or more"))?,
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

/// One nemesis of a schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nemesis {
    /// SIGSTOP the role's process `at` after the run started; SIGCONT after `hold`.
    Pause {
        role: Role,
        at: Duration,
        hold: Duration,
    },
    /// The role's first process stops itself at `fault`'s point and pass; held for `hold`.
    PauseAtPoint { fault: Fault, hold: Duration },
    /// SIGKILL the role's process `at` after the run started.
    Kill { role: Role, at: Duration },
    /// PostgreSQL's own crash (`-m immediate`) and restart, `at` after the run started.
    DbRestart { at: Duration },
    /// The role's database sessions terminated `at` after the run started.
    DbKillBackend { role: Role, at: Duration },
    /// A planned network fault on the relay-to-consumer traffic.
    Net(FaultPlan),
}

/// Every kind, as `--list-nemeses` shows it: name, form, what it does.
pub const KINDS: [(&str, &str, &str); 7] = [
    (
        "pause",
        "pause:ROLE@AT+FOR | pause:ROLE:STEP@N+FOR",
        "SIGSTOP the role's process at AT (or where it passes its crash point STEP the N-th \
         time), SIGCONT after FOR: a GC pause, a frozen VM",
    ),
    (
        "kill",
        "kill:ROLE@AT",
        "SIGKILL the role's process at AT, wherever it is",
    ),
    (
        "db-restart",
        "db:restart@AT",
        "pg_ctl stop -m immediate (PostgreSQL's own crash), then started again on the same \
         socket and data: committed rows must survive, every actor must reconnect",
    ),
    (
        "db-kill-backend",
        "db:kill-backend:ROLE@AT",
        "pg_terminate_backend of the relay's or the consumer's sessions (by application_name)",
    ),
    (
        "net-reset",
        "net:reset@N",
        "the N-th request from a relay to the consumer is reset before it arrives",
    ),
    (
        "net-reply-lost",
        "net:reply-lost@N",
        "the consumer acts on the N-th request and commits; its reply never comes back",
    ),
    (
        "net-delay",
        "net:delay@N+FOR",
        "the N-th request is held FOR before it is passed on (past the sender's timeout)",
    ),
];

impl Nemesis {
    /// Whether a schedule's item is a nemesis (else it is a crash fault).
    pub fn written_as(item: &str) -> bool {
        ["pause:", "kill:", "db:", "net:"]
            .iter()
            .any(|kind| item.starts_with(kind))
    }

    /// Its kind's name, as listed in [`KINDS`].
    pub fn kind(&self) -> &'static str {
        match self {
            Nemesis::Pause { .. } | Nemesis::PauseAtPoint { .. } => "pause",
            Nemesis::Kill { .. } => "kill",
            Nemesis::DbRestart { .. } => "db-restart",
            Nemesis::DbKillBackend { .. } => "db-kill-backend",
            Nemesis::Net(plan) => match plan.fault {
                NetworkFault::Reset => "net-reset",
                NetworkFault::ReplyLost => "net-reply-lost",
                NetworkFault::Delay(_) => "net-delay",
            },
        }
    }

    /// The crash point a pause at a point waits for: one the design must pass.
    pub fn crash_point(&self) -> Option<CrashPoint> {
        match self {
            Nemesis::PauseAtPoint { fault, .. } => Some(fault.plan.point),
            _ => None,
        }
    }

    /// When a nemesis on the run's clock is over (struck and, for a pause, let go); `None`
    /// for those triggered by a crash point or a request.
    pub fn over_at(&self) -> Option<Duration> {
        match *self {
            Nemesis::Pause { at, hold, .. } => Some(at + hold),
            Nemesis::Kill { at, .. }
            | Nemesis::DbRestart { at }
            | Nemesis::DbKillBackend { at, .. } => Some(at),
            Nemesis::PauseAtPoint { .. } | Nemesis::Net(_) => None,
        }
    }

    /// Only the throwaway cluster can be restarted.
    pub fn needs_throwaway_cluster(&self) -> bool {
        matches!(self, Nemesis::DbRestart { .. })
    }
}

impl fmt::Display for Nemesis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Nemesis::Pause { role, at, hold } => write!(
                f,
                "pause:{}@{}+{}",
                role.name(),
                format_duration(*at),
                format_duration(*hold)
            ),
            Nemesis::PauseAtPoint { fault, hold } => {
                write!(f, "pause:{fault}+{}", format_duration(*hold))
            }
            Nemesis::Kill { role, at } => {
                write!(f, "kill:{}@{}", role.name(), format_duration(*at))
            }
            Nemesis::DbRestart { at } => write!(f, "db:restart@{}", format_duration(*at)),
            Nemesis::DbKillBackend { role, at } => write!(
                f,
                "db:kill-backend:{}@{}",
                role.name(),
                format_duration(*at)
            ),
            Nemesis::Net(plan) => write!(f, "net:{plan}"),
        }
    }
}

fn role_named(name: &str, item: &str) -> Result<Role, String> {
    Role::ALL
        .into_iter()
        .find(|r| r.name() == name)
        .ok_or_else(|| format!("unknown role '{name}' in '{item}' (writer, relay or consumer)"))
}

/// `ROLE@AT` of a timed nemesis.
fn role_at(spec: &str, item: &str) -> Result<(Role, Duration), String> {
    let (role, at) = spec
        .split_once('@')
        .ok_or_else(|| format!("'{item}' needs a moment: ...ROLE@AT (e.g. relay@60ms)"))?;
    Ok((role_named(role, item)?, parse_duration(at)?))
}

impl FromStr for Nemesis {
    type Err = String;

    fn from_str(item: &str) -> Result<Nemesis, String> {
        let (kind, spec) = item.split_once(':').unwrap_or((item, ""));
        match kind {
            "pause" => {
                let (what, hold) = spec
                    .rsplit_once('+')
                    .ok_or_else(|| format!("'{item}' needs how long: pause:...+FOR"))?;
                let hold = parse_duration(hold)?;
                if hold.is_zero() {
                    return Err(format!(
                        "'{item}': a pause of 0 ms pauses nothing: give FOR above 0 (+500ms)"
                    ));
                }
                if what.contains(':') {
                    let fault: Fault = what.parse()?;
                    return Ok(Nemesis::PauseAtPoint { fault, hold });
                }
                let (role, at) = role_at(what, item)?;
                Ok(Nemesis::Pause { role, at, hold })
            }
            "kill" => {
                let (role, at) = role_at(spec, item)?;
                Ok(Nemesis::Kill { role, at })
            }
            "db" => {
                if let Some(at) = spec.strip_prefix("restart@") {
                    return Ok(Nemesis::DbRestart {
                        at: parse_duration(at)?,
                    });
                }
                let Some(target) = spec.strip_prefix("kill-backend:") else {
                    return Err(format!(
                        "unknown database nemesis '{item}' (db:restart@AT, db:kill-backend:ROLE@AT)"
                    ));
                };
                let (role, at) = role_at(target, item)?;
                if role == Role::Writer {
                    return Err(format!(
                        "'{item}': db:kill-backend hits the relay's or the consumer's sessions"
                    ));
                }
                Ok(Nemesis::DbKillBackend { role, at })
            }
            "net" => Ok(Nemesis::Net(spec.parse()?)),
            _ => Err(format!(
                "unknown nemesis '{item}' (see `outbox-lab explore --list-nemeses`)"
            )),
        }
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

    /// Typos and missing parts are errors that say what is wrong.
    #[test]
    fn bad_nemeses_are_explained() {
        let err = |s: &str| s.parse::<Nemesis>().unwrap_err();
        assert!(err("pause:relay@60ms").contains("needs how long"));
        assert!(err("pause:relay@60ms+0ms").contains("pauses nothing"));
        assert!(err("pause:relay:after-fetch@1+0s").contains("pauses nothing"));
        assert!(err("kill:relay").contains("needs a moment"));
        assert!(err("kill:broker@1s").contains("unknown role"));
        assert!(err("kill:relay@soon").contains("not a duration"));
        assert!(err("db:reboot@1s").contains("unknown database nemesis"));
        assert!(err("db:kill-backend:writer@1s").contains("relay's or the consumer's"));
        assert!(err("net:delay@2").contains("needs how long"));
        assert!(err("freeze:relay@1s").contains("unknown nemesis"));
    }
}
