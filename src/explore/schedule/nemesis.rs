//! A nemesis of a schedule: its kinds, and its text form (`kill:relay@1s`), parsed and printed.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use super::{Fault, Role};
use crate::harness::link::faults::{FaultPlan, NetworkFault};
use crate::harness::link::watch::DeliveryMoment;
use crate::harness::nemesis::{format_duration, parse_duration, parse_ordinal};
use crate::outbox::crash::CrashPoint;

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
    /// The replication held from `at` for [`FAILOVER_HOLD`], then the primary's machine dies
    /// and its streaming standby is promoted under the actors (verify on a replicated pair).
    DbFailover { at: Duration },
    /// The role's database sessions terminated `at` after the run started.
    DbKillBackend { role: Role, at: Duration },
    /// A planned network fault on the relay-to-consumer traffic.
    Net(FaultPlan),
    /// The sink down from `at` for `hold`: every connection and request to it reset, as a
    /// broker outage does.
    NetDown { at: Duration, hold: Duration },
    /// Struck on the relay that sent the N-th delivery of the run (from whichever relay), as
    /// the delivery passes the proxy.
    OnDelivery {
        strike: DeliveryStrike,
        on_delivery: u32,
    },
    /// A fault on the role's link to its database (relay 0's, or the writer's).
    DbNet { role: Role, fault: DbNetFault },
    /// A transaction of the workload's that the relays must wait for, or must not.
    Txn(TxnFault),
    /// A wall clock stepped by `by_ms` (signed) at `at`, until the run ends (relay 0's, every
    /// process of it; or the throwaway cluster's server's); monotonic clocks stay true.
    ClockStep {
        target: ClockTarget,
        at: Duration,
        by_ms: i64,
    },
}

/// Whose wall clock a clock nemesis steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClockTarget {
    /// Relay 0's (every process of it, started again or not).
    Relay,
    /// The database server's (the throwaway cluster's).
    Db,
}

impl ClockTarget {
    pub fn name(self) -> &'static str {
        match self {
            ClockTarget::Relay => "relay",
            ClockTarget::Db => "db",
        }
    }
}

/// A transaction of the workload's (the writer's role, beside the writer's own sessions) that
/// holds the horizon: what a relay reading by id must wait for, and a relay waiting for every
/// older transaction must not wait for forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnFault {
    /// Takes its outbox ids (an order and its events) at `at` and commits `hold` later, and not
    /// before an event of a larger id was delivered, while the writer goes on committing larger
    /// ids: a relay that reads past the largest id it delivered is past it when it commits.
    SlowCommit { at: Duration, hold: Duration },
    /// Opens a transaction at `at`, takes a snapshot and an xid, writes nothing to the outbox,
    /// and sits idle in it for `hold`.
    Idle { at: Duration, hold: Duration },
    /// Inserts an order and its events at `at` and rolls back: ids that never commit, a gap
    /// that never fills.
    Rollback { at: Duration },
    /// Inserts an order and its events at `at`, is PREPAREd (two-phase commit) and committed
    /// `hold` later; it survives a restart of the server in between.
    Prepared { at: Duration, hold: Duration },
}

impl TxnFault {
    /// When it starts.
    pub fn at(self) -> Duration {
        match self {
            TxnFault::SlowCommit { at, .. }
            | TxnFault::Idle { at, .. }
            | TxnFault::Rollback { at }
            | TxnFault::Prepared { at, .. } => at,
        }
    }

    /// How long its transaction stays open.
    pub fn hold(self) -> Duration {
        match self {
            TxnFault::SlowCommit { hold, .. }
            | TxnFault::Idle { hold, .. }
            | TxnFault::Prepared { hold, .. } => hold,
            TxnFault::Rollback { .. } => Duration::ZERO,
        }
    }
}

/// What a nemesis does to an actor's database link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DbNetFault {
    /// Every connection of the link cut `at` after the run started.
    Reset { at: Duration },
    /// The link black-holed from `at` for `hold`: open connections stall, new ones hang.
    Partition { at: Duration, hold: Duration },
    /// The link's N-th committing answer (a COMMIT's, or the end of a write in autocommit): the
    /// server has committed; the answer is dropped and the connection cut: the actor cannot
    /// know whether it committed.
    CommitLost { on_commit: u32 },
}

/// What a nemesis does to the relay whose delivery it watched for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryStrike {
    /// SIGKILL once the consumer has applied and committed the delivery, before its answer
    /// reaches the relay: sent, not marked.
    Kill,
    /// SIGSTOP while the delivery is in flight, SIGCONT after this long.
    Pause(Duration),
    /// Its database sessions terminated once the delivery is applied, before the answer
    /// reaches it (its open transaction rolls back).
    DbKillBackend,
}

impl DeliveryStrike {
    /// When in the delivery's passage it strikes.
    pub fn moment(self) -> DeliveryMoment {
        match self {
            DeliveryStrike::Pause(_) => DeliveryMoment::Sent,
            DeliveryStrike::Kill | DeliveryStrike::DbKillBackend => DeliveryMoment::Answered,
        }
    }
}

/// How long `db:failover` holds the replication back before the primary dies: the primary
/// answers the COMMITs of this window (asynchronous) that its standby never receives, or
/// makes them wait (synchronous). Long enough for a writer to commit several orders and a
/// relay polling every 100 ms to read them.
pub const FAILOVER_HOLD: Duration = Duration::from_millis(500);

/// Every kind, as `--list-nemeses` shows it: name, form, what it does.
pub const KINDS: [(&str, &str, &str); 22] = [
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
        "db-failover",
        "db:failover@AT",
        "the database on a primary with a streaming standby (--replication async|sync): the \
         replication held from AT for 500ms, then the primary's machine dies (SIGKILL), the \
         standby is promoted and every actor's address re-pointed at it",
    ),
    (
        "db-kill-backend",
        "db:kill-backend:ROLE@AT",
        "pg_terminate_backend of the relay's sessions (the backends its database link serves, \
         whatever it names them) or the consumer's",
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
    (
        "net-refuse",
        "net:refuse@N",
        "the N-th request is answered with a refusal to retry and never passed on: HTTP 503, \
         a Kafka Produce NOT_LEADER_OR_FOLLOWER (a partition's leadership moved); by \
         --schedule only",
    ),
    (
        "net-down",
        "net:down@AT+FOR",
        "the sink down from AT for FOR: every connection and request to the consumer reset, \
         a sustained outage (not in verify's all: the search draws it)",
    ),
    (
        "kill-on-delivery",
        "kill:relay:on-delivery@N",
        "SIGKILL the relay that sent the run's N-th delivery, once the consumer has applied \
         and committed it and before its answer reaches the relay: sent, not marked",
    ),
    (
        "pause-on-delivery",
        "pause:relay:on-delivery@N+FOR",
        "SIGSTOP the relay that sent the N-th delivery while it is in flight, SIGCONT after \
         FOR: a relay that outlives its lease mid-batch",
    ),
    (
        "db-kill-backend-on-delivery",
        "db:kill-backend:relay:on-delivery@N",
        "pg_terminate_backend of the sessions of the relay that sent the N-th delivery, once \
         it is applied and before the answer reaches the relay",
    ),
    (
        "dbnet-reset",
        "dbnet:reset:ROLE@AT",
        "the relay's (relay 0) or the writer's database connections cut at AT, on the wire \
         (its proxy closes them; the server sees its client gone)",
    ),
    (
        "dbnet-partition",
        "dbnet:partition:ROLE@AT+FOR",
        "the relay's or the writer's database link black-holed from AT for FOR: open \
         connections stall both ways, new ones hang; then what was held goes on",
    ),
    (
        "dbnet-commit-lost",
        "dbnet:commit-lost:ROLE@N",
        "the N-th committing answer (a COMMIT, or the end of a write in autocommit) on the \
         relay's or the writer's database link: the server has committed; the answer is \
         dropped and the connection cut: the client cannot know it committed",
    ),
    (
        "txn-slow-commit",
        "txn:slow-commit@AT+FOR",
        "a transaction of the workload takes its outbox ids (an order and its events) at AT \
         and commits FOR later (and not before a larger id is delivered, within 15 s), while \
         the writer goes on committing larger ids: a relay that reads past the largest id it \
         delivered skips it",
    ),
    (
        "txn-idle",
        "txn:idle@AT+FOR",
        "a session opens a transaction at AT, takes a snapshot and an xid, writes nothing, and \
         sits idle in it for FOR: a relay that waits for every older transaction waits",
    ),
    (
        "txn-rollback",
        "txn:rollback@AT",
        "a transaction inserts an order and its events at AT and rolls back: ids that never \
         commit, a gap that never fills",
    ),
    (
        "txn-prepared",
        "txn:prepared@AT+FOR",
        "a transaction inserts an order and its events at AT, is PREPAREd (two-phase commit) \
         and committed FOR later, surviving a restart of the server in between (needs \
         max_prepared_transactions: the throwaway cluster has it)",
    ),
    (
        "clock-step-relay",
        "clock:step:relay@AT+OFFSET | clock:step:relay@AT-OFFSET",
        "relay 0's wall clock steps by OFFSET (whole seconds) at AT, every process of it, until \
         the run ends (libfaketime; its monotonic clock stays true): a lease or a retry time \
         taken from one clock and compared with another",
    ),
    (
        "clock-step-db",
        "clock:step:db@AT+OFFSET | clock:step:db@AT-OFFSET",
        "the database server's wall clock (now(), clock_timestamp()) steps by OFFSET at AT: \
         leases and due times kept with the server's clock; the throwaway cluster only",
    ),
];

/// How a nemesis on a delivery is written, after its kind: `relay:on-delivery@N`.
const ON_DELIVERY: &str = "relay:on-delivery@";

impl Nemesis {
    /// Whether a schedule's item is a nemesis (else it is a crash fault).
    pub fn written_as(item: &str) -> bool {
        ["pause:", "kill:", "db:", "net:", "dbnet:", "txn:", "clock:"]
            .iter()
            .any(|kind| item.starts_with(kind))
    }

    /// Its kind's name, as listed in [`KINDS`].
    pub fn kind(&self) -> &'static str {
        match self {
            Nemesis::Pause { .. } | Nemesis::PauseAtPoint { .. } => "pause",
            Nemesis::Kill { .. } => "kill",
            Nemesis::DbRestart { .. } => "db-restart",
            Nemesis::DbFailover { .. } => "db-failover",
            Nemesis::DbKillBackend { .. } => "db-kill-backend",
            Nemesis::Net(plan) => match plan.fault {
                NetworkFault::Reset => "net-reset",
                NetworkFault::ReplyLost => "net-reply-lost",
                NetworkFault::Delay(_) => "net-delay",
                NetworkFault::Refuse => "net-refuse",
            },
            Nemesis::NetDown { .. } => "net-down",
            Nemesis::OnDelivery { strike, .. } => match strike {
                DeliveryStrike::Kill => "kill-on-delivery",
                DeliveryStrike::Pause(_) => "pause-on-delivery",
                DeliveryStrike::DbKillBackend => "db-kill-backend-on-delivery",
            },
            Nemesis::DbNet { fault, .. } => match fault {
                DbNetFault::Reset { .. } => "dbnet-reset",
                DbNetFault::Partition { .. } => "dbnet-partition",
                DbNetFault::CommitLost { .. } => "dbnet-commit-lost",
            },
            Nemesis::Txn(fault) => match fault {
                TxnFault::SlowCommit { .. } => "txn-slow-commit",
                TxnFault::Idle { .. } => "txn-idle",
                TxnFault::Rollback { .. } => "txn-rollback",
                TxnFault::Prepared { .. } => "txn-prepared",
            },
            Nemesis::ClockStep { target, .. } => match target {
                ClockTarget::Relay => "clock-step-relay",
                ClockTarget::Db => "clock-step-db",
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
            Nemesis::Pause { at, hold, .. }
            | Nemesis::NetDown { at, hold }
            | Nemesis::DbNet {
                fault: DbNetFault::Partition { at, hold },
                ..
            } => Some(at + hold),
            Nemesis::DbFailover { at } => Some(at + FAILOVER_HOLD),
            Nemesis::Txn(fault) => Some(fault.at() + fault.hold()),
            Nemesis::ClockStep { at, .. } => Some(at),
            Nemesis::Kill { at, .. }
            | Nemesis::DbRestart { at }
            | Nemesis::DbKillBackend { at, .. }
            | Nemesis::DbNet {
                fault: DbNetFault::Reset { at },
                ..
            } => Some(at),
            Nemesis::PauseAtPoint { .. }
            | Nemesis::Net(_)
            | Nemesis::OnDelivery { .. }
            | Nemesis::DbNet {
                fault: DbNetFault::CommitLost { .. },
                ..
            } => None,
        }
    }

    /// Only the throwaway cluster can be restarted, or have its clock stepped.
    pub fn needs_throwaway_cluster(&self) -> bool {
        matches!(
            self,
            Nemesis::DbRestart { .. }
                | Nemesis::ClockStep {
                    target: ClockTarget::Db,
                    ..
                }
        )
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
            Nemesis::DbFailover { at } => write!(f, "db:failover@{}", format_duration(*at)),
            Nemesis::DbKillBackend { role, at } => write!(
                f,
                "db:kill-backend:{}@{}",
                role.name(),
                format_duration(*at)
            ),
            Nemesis::Net(plan) => write!(f, "net:{plan}"),
            Nemesis::NetDown { at, hold } => write!(
                f,
                "net:down@{}+{}",
                format_duration(*at),
                format_duration(*hold)
            ),
            Nemesis::OnDelivery {
                strike,
                on_delivery,
            } => match strike {
                DeliveryStrike::Kill => write!(f, "kill:{ON_DELIVERY}{on_delivery}"),
                DeliveryStrike::Pause(hold) => write!(
                    f,
                    "pause:{ON_DELIVERY}{on_delivery}+{}",
                    format_duration(*hold)
                ),
                DeliveryStrike::DbKillBackend => {
                    write!(f, "db:kill-backend:{ON_DELIVERY}{on_delivery}")
                }
            },
            Nemesis::DbNet { role, fault } => {
                let role = role.name();
                match fault {
                    DbNetFault::Reset { at } => {
                        write!(f, "dbnet:reset:{role}@{}", format_duration(*at))
                    }
                    DbNetFault::Partition { at, hold } => write!(
                        f,
                        "dbnet:partition:{role}@{}+{}",
                        format_duration(*at),
                        format_duration(*hold)
                    ),
                    DbNetFault::CommitLost { on_commit } => {
                        write!(f, "dbnet:commit-lost:{role}@{on_commit}")
                    }
                }
            }
            Nemesis::Txn(fault) => {
                let (at, hold) = (format_duration(fault.at()), format_duration(fault.hold()));
                match fault {
                    TxnFault::SlowCommit { .. } => write!(f, "txn:slow-commit@{at}+{hold}"),
                    TxnFault::Idle { .. } => write!(f, "txn:idle@{at}+{hold}"),
                    TxnFault::Rollback { .. } => write!(f, "txn:rollback@{at}"),
                    TxnFault::Prepared { .. } => write!(f, "txn:prepared@{at}+{hold}"),
                }
            }
            Nemesis::ClockStep { target, at, by_ms } => {
                let sign = if *by_ms < 0 { '-' } else { '+' };
                let by = Duration::from_millis(by_ms.unsigned_abs());
                write!(
                    f,
                    "clock:step:{}@{}{sign}{}",
                    target.name(),
                    format_duration(*at),
                    format_duration(by)
                )
            }
        }
    }
}

/// `clock:step:TARGET@AT(+|-)OFFSET`, what follows `clock:`.
fn clock(spec: &str, item: &str) -> Result<Nemesis, String> {
    let form = "clock:step:relay@AT+OFFSET or clock:step:db@AT-OFFSET (whole seconds)";
    let target = spec
        .strip_prefix("step:")
        .ok_or_else(|| format!("unknown clock nemesis '{item}' ({form})"))?;
    let (target, window) = target
        .split_once('@')
        .ok_or_else(|| format!("'{item}' needs a moment and an offset: {form}"))?;
    let target = match target {
        "relay" => ClockTarget::Relay,
        "db" => ClockTarget::Db,
        other => {
            return Err(format!(
                "'{item}': a clock of '{other}'? the relay's (relay) or the database's (db)"
            ))
        }
    };
    let split = window
        .find(['+', '-'])
        .ok_or_else(|| format!("'{item}' needs an offset: {form}"))?;
    let (at, offset) = window.split_at(split);
    let at = parse_duration(at)?;
    let magnitude = parse_duration(&offset[1..])?;
    if magnitude.is_zero() || magnitude.subsec_millis() != 0 {
        return Err(format!(
            "'{item}': a clock steps by whole seconds, and by more than none ({form})"
        ));
    }
    let magnitude =
        i64::try_from(magnitude.as_millis()).map_err(|_| format!("'{item}': too far"))?;
    let by_ms = if offset.starts_with('-') {
        -magnitude
    } else {
        magnitude
    };
    Ok(Nemesis::ClockStep { target, at, by_ms })
}

/// `txn:KIND@AT[+FOR]`, what follows `txn:`.
fn txn(spec: &str, item: &str) -> Result<Nemesis, String> {
    let (kind, window) = spec.split_once('@').ok_or_else(|| {
        format!("'{item}' needs a moment: txn:KIND@AT (slow-commit, idle and prepared +FOR)")
    })?;
    let held = |window: &str| -> Result<(Duration, Duration), String> {
        let (at, hold) = window
            .split_once('+')
            .ok_or_else(|| format!("'{item}' needs how long: txn:{kind}@AT+FOR"))?;
        let (at, hold) = (parse_duration(at)?, parse_duration(hold)?);
        if hold.is_zero() {
            return Err(format!("'{item}': a transaction held 0 ms holds nothing"));
        }
        Ok((at, hold))
    };
    let fault = match kind {
        "slow-commit" => {
            let (at, hold) = held(window)?;
            TxnFault::SlowCommit { at, hold }
        }
        "idle" => {
            let (at, hold) = held(window)?;
            TxnFault::Idle { at, hold }
        }
        "prepared" => {
            let (at, hold) = held(window)?;
            TxnFault::Prepared { at, hold }
        }
        "rollback" => TxnFault::Rollback {
            at: parse_duration(window)?,
        },
        _ => {
            return Err(format!(
                "unknown transaction nemesis '{item}' (txn:slow-commit@AT+FOR, txn:idle@AT+FOR, \
                 txn:rollback@AT, txn:prepared@AT+FOR)"
            ))
        }
    };
    Ok(Nemesis::Txn(fault))
}

fn role_named(name: &str, item: &str) -> Result<Role, String> {
    Role::ALL
        .into_iter()
        .find(|r| r.name() == name)
        .ok_or_else(|| format!("unknown role '{name}' in '{item}' (writer, relay or consumer)"))
}

/// `N` of `...:relay:on-delivery@N`, when `spec` (what follows the kind) is written so; an
/// `on-delivery` of another role is an error.
fn on_delivery(spec: &str, item: &str) -> Result<Option<u32>, String> {
    if let Some(number) = spec.strip_prefix(ON_DELIVERY) {
        return parse_ordinal(number, item, "delivery number").map(Some);
    }
    match spec.contains(":on-delivery") {
        true => Err(format!(
            "'{item}': on-delivery strikes the relay that sent the delivery ({ON_DELIVERY}N)"
        )),
        false => Ok(None),
    }
}

/// `ROLE@AT` of a timed nemesis.
fn role_at(spec: &str, item: &str) -> Result<(Role, Duration), String> {
    let (role, at) = spec
        .split_once('@')
        .ok_or_else(|| format!("'{item}' needs a moment: ...ROLE@AT (e.g. relay@60ms)"))?;
    Ok((role_named(role, item)?, parse_duration(at)?))
}

/// `dbnet:KIND:ROLE@...`, what follows `dbnet:`.
fn db_net(spec: &str, item: &str) -> Result<Nemesis, String> {
    let (kind, target) = spec.split_once(':').unwrap_or((spec, ""));
    let linked = |role: Role| match role {
        Role::Consumer => Err(format!(
            "'{item}': dbnet strikes the database link of the relay or the writer (the \
             consumer's is outbox-lab's own)"
        )),
        role => Ok(role),
    };
    let (role, fault) = match kind {
        "reset" => {
            let (role, at) = role_at(target, item)?;
            (role, DbNetFault::Reset { at })
        }
        "partition" => {
            let (what, hold) = target
                .rsplit_once('+')
                .ok_or_else(|| format!("'{item}' needs how long: dbnet:partition:ROLE@AT+FOR"))?;
            let (role, at) = role_at(what, item)?;
            let hold = parse_duration(hold)?;
            if hold.is_zero() {
                return Err(format!("'{item}': a partition of 0 ms cuts nothing"));
            }
            (role, DbNetFault::Partition { at, hold })
        }
        "commit-lost" => {
            let (role, number) = target.split_once('@').ok_or_else(|| {
                format!("'{item}' needs a committing answer's number: dbnet:commit-lost:ROLE@N")
            })?;
            let on_commit = parse_ordinal(number, item, "committing answer's number")?;
            (
                role_named(role, item)?,
                DbNetFault::CommitLost { on_commit },
            )
        }
        _ => {
            return Err(format!(
                "unknown database link nemesis '{item}' (dbnet:reset:ROLE@AT, \
                 dbnet:partition:ROLE@AT+FOR, dbnet:commit-lost:ROLE@N)"
            ))
        }
    };
    Ok(Nemesis::DbNet {
        role: linked(role)?,
        fault,
    })
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
                if let Some(on_delivery) = on_delivery(what, item)? {
                    return Ok(Nemesis::OnDelivery {
                        strike: DeliveryStrike::Pause(hold),
                        on_delivery,
                    });
                }
                if what.contains(':') {
                    let fault: Fault = what.parse()?;
                    return Ok(Nemesis::PauseAtPoint { fault, hold });
                }
                let (role, at) = role_at(what, item)?;
                Ok(Nemesis::Pause { role, at, hold })
            }
            "kill" => {
                if let Some(on_delivery) = on_delivery(spec, item)? {
                    let strike = DeliveryStrike::Kill;
                    return Ok(Nemesis::OnDelivery {
                        strike,
                        on_delivery,
                    });
                }
                let (role, at) = role_at(spec, item)?;
                Ok(Nemesis::Kill { role, at })
            }
            "db" => {
                if let Some(at) = spec.strip_prefix("restart@") {
                    return Ok(Nemesis::DbRestart {
                        at: parse_duration(at)?,
                    });
                }
                if let Some(at) = spec.strip_prefix("failover@") {
                    return Ok(Nemesis::DbFailover {
                        at: parse_duration(at)?,
                    });
                }
                let Some(target) = spec.strip_prefix("kill-backend:") else {
                    return Err(format!(
                        "unknown database nemesis '{item}' (db:restart@AT, db:failover@AT, \
                         db:kill-backend:ROLE@AT)"
                    ));
                };
                if let Some(on_delivery) = on_delivery(target, item)? {
                    let strike = DeliveryStrike::DbKillBackend;
                    return Ok(Nemesis::OnDelivery {
                        strike,
                        on_delivery,
                    });
                }
                let (role, at) = role_at(target, item)?;
                if role == Role::Writer {
                    return Err(format!(
                        "'{item}': db:kill-backend hits the relay's or the consumer's sessions"
                    ));
                }
                Ok(Nemesis::DbKillBackend { role, at })
            }
            "net" => match spec.strip_prefix("down@") {
                Some(window) => {
                    let (at, hold) = window
                        .split_once('+')
                        .ok_or_else(|| format!("'{item}' needs how long: net:down@AT+FOR"))?;
                    let (at, hold) = (parse_duration(at)?, parse_duration(hold)?);
                    if hold.is_zero() {
                        return Err(format!("'{item}': an outage of 0 ms is none"));
                    }
                    Ok(Nemesis::NetDown { at, hold })
                }
                None => Ok(Nemesis::Net(spec.parse()?)),
            },
            "dbnet" => db_net(spec, item),
            "txn" => txn(spec, item),
            "clock" => clock(spec, item),
            _ => Err(format!(
                "unknown nemesis '{item}' (see `outbox-lab explore --list-nemeses`)"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(err("kill:relay:on-delivery@0").contains("delivery number"));
        assert!(err("kill:consumer:on-delivery@2").contains("relay that sent"));
        assert!(err("pause:relay:on-delivery@2").contains("needs how long"));
        assert!(err("db:kill-backend:writer:on-delivery@2").contains("relay that sent"));
        assert!(err("dbnet:reset:consumer@1s").contains("outbox-lab's own"));
        assert!(err("dbnet:partition:relay@1s").contains("needs how long"));
        assert!(err("dbnet:partition:relay@1s+0ms").contains("cuts nothing"));
        assert!(err("dbnet:commit-lost:writer@0").contains("committing answer's number of 1"));
        assert!(err("dbnet:commit-lost:writer").contains("needs a committing answer's number"));
        assert!(err("dbnet:drop:relay@1s").contains("unknown database link nemesis"));
        assert!(err("net:down@1s").contains("needs how long"));
        assert!(err("net:down@1s+0ms").contains("none"));
        assert!(err("txn:slow-commit@1s").contains("needs how long"));
        assert!(err("txn:idle@1s+0ms").contains("holds nothing"));
        assert!(err("txn:rollback").contains("needs a moment"));
        assert!(err("txn:hang@1s").contains("unknown transaction nemesis"));
        assert!(err("clock:step:relay@1s").contains("needs an offset"));
        assert!(err("clock:step:relay@1s+1500ms").contains("whole seconds"));
        assert!(err("clock:step:writer@1s+60s").contains("the relay's (relay) or"));
        assert!(err("clock:drift:relay@1s+60s").contains("unknown clock nemesis"));
    }

    /// A clock's step prints back to itself, forward and back.
    #[test]
    fn clock_steps_round_trip() {
        for text in ["clock:step:relay@250ms+60s", "clock:step:db@1s-10s"] {
            let nemesis: Nemesis = text.parse().unwrap();
            assert_eq!(nemesis.to_string(), text);
        }
        let minutes: Nemesis = "clock:step:relay@1s-10m".parse().unwrap();
        assert_eq!(minutes.to_string(), "clock:step:relay@1s-600s");
        let back: Nemesis = "clock:step:relay@1s-60s".parse().unwrap();
        assert_eq!(
            back,
            Nemesis::ClockStep {
                target: ClockTarget::Relay,
                at: Duration::from_secs(1),
                by_ms: -60_000
            }
        );
        assert!(back.to_string().parse::<Nemesis>().is_ok());
    }

    /// The transactions' nemeses print back to themselves, and say when they are over.
    #[test]
    fn transactions_round_trip() {
        for text in [
            "txn:slow-commit@1s+2500ms",
            "txn:idle@250ms+1s",
            "txn:rollback@2s",
            "txn:prepared@1500ms+1s",
        ] {
            let nemesis: Nemesis = text.parse().unwrap();
            assert_eq!(nemesis.to_string(), text);
        }
        let slow: Nemesis = "txn:slow-commit@1s+2500ms".parse().unwrap();
        assert_eq!(slow.over_at(), Some(Duration::from_millis(3500)));
        assert_eq!(slow.kind(), "txn-slow-commit");
    }

    /// A number past u32's most is said to be too large, not to be no number.
    #[test]
    fn too_large_numbers_are_said_to_be() {
        let err = |s: &str| s.parse::<Nemesis>().unwrap_err();
        for (item, what) in [
            (
                "dbnet:commit-lost:relay@99999999999",
                "committing answer's number",
            ),
            ("kill:relay:on-delivery@99999999999", "delivery number"),
            ("net:reset@4294967296", "request number"),
            ("pause:relay:after-fetch@99999999999+1s", "pass count"),
        ] {
            let said = err(item);
            assert!(said.contains("is too large"), "{item}: {said}");
            assert!(
                said.contains(&format!("{what} (at most 4294967295)")),
                "{said}"
            );
        }
        let most = "dbnet:commit-lost:relay@4294967295".parse::<Nemesis>();
        assert_eq!(
            most.map(|n| n.to_string()),
            Ok("dbnet:commit-lost:relay@4294967295".to_string())
        );
    }

    /// A partition is held as long as asked: the schedule says so, the link does so.
    #[test]
    fn a_long_partition_is_held_as_asked() {
        let nemesis: Nemesis = "dbnet:partition:relay@1s+90s".parse().unwrap();
        let hold = Duration::from_secs(90);
        let fault = DbNetFault::Partition {
            at: Duration::from_secs(1),
            hold,
        };
        assert_eq!(
            nemesis,
            Nemesis::DbNet {
                role: Role::Relay,
                fault
            }
        );
        assert_eq!(nemesis.over_at(), Some(Duration::from_secs(91)));
        assert_eq!(nemesis.to_string(), "dbnet:partition:relay@1s+90s");
    }
}
