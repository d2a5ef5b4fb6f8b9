//! verify's plan: the command's options checked and turned into what will run — the relay
//! template, the design the checker holds it to, the schedule (the nemeses chosen, or the one
//! `--schedule` gives), the workload, the bounds and where the relays deliver. Everything here
//! is decided before a server starts, so bad input leaves nothing behind.

use std::time::Duration;

use anyhow::{anyhow, bail, Result};

use super::search::{draw, drawn_only, Search};
use crate::explore::designs::{Design, Invariant, Writer};
use crate::explore::lab::{Bounds, Delivery, ForeignRelays, Workload, COUNT_PENDING};
use crate::explore::schedule::{ClockTarget, Nemesis, Schedule};
use crate::harness::foreign::RelayTemplate;
use crate::harness::nemesis::format_duration;
use crate::harness::replicated::Replication;
use crate::harness::run_as::RunAs;
use crate::outbox::consumer::ConsumerKind;
use crate::outbox::sink::{AmqpSink, KafkaSink, RedisSink};

/// The writer's aggregate type: the relays' Redis stream is `outbox.event.orders`.
const ORDERS: &str = "orders";
/// Events per order: OrderCreated then OrderUpdated2, so that order has a meaning.
const EVENTS_PER_ORDER: u32 = 2;
/// The two writer sessions commit their orders this far apart (ids become visible out of
/// order, as on a busy server), briefly: the workload is written within seconds.
const WRITER_OVERLAP: Duration = Duration::from_millis(1);
/// The timed nemeses strike one after another, this far apart, from the run's start.
const NEMESIS_SPACING: Duration = Duration::from_millis(250);
/// A relay of the user's may poll slowly and back off after a database restart: it has this
/// long to drain after the last fault.
pub const FOREIGN_LIVENESS: Duration = Duration::from_secs(10);

/// The nemeses `--nemesis` names, and the schedule item each one makes (`{at}`: its moment).
/// In this order on the clock: relay 0's database link reset, then partitioned for a second,
/// after its sessions are ended; a database restart, so that the sessions and links the
/// nemeses before it strike are there to strike; then the workload's transactions that hold
/// the horizon, after the restart, which would end them: a slow commit of 2.5 s (past the
/// safety lags of a few hundred ms that relays reading by id use, and Marten's 3 s stale
/// sequence threshold less a poll), a session idle in transaction for a second (a relay
/// waiting for every older transaction waits, and must then catch up), a rollback (ids that
/// never commit), a prepared transaction for a second (the same, held by two-phase commit). Relay 0's third COMMIT loses its answer.
/// `net-down`, a sustained outage of the sink, is named only: not in `all` (the search draws
/// it). Those on a delivery take the first ones, before the
/// requests the network nemeses take: they come within the run's first moments however few
/// deliveries a relay makes (a batch per request), and before the database restart, while the
/// relay is connected (a relay sending a batch fetched before the restart has no session to
/// end): db-kill-backend first, since a relay whose session a nemesis on the clock has just
/// ended has none to end until it is answered; the kill last, since a relay that sends a batch
/// at once (a pipeline of XADDs) may make all three deliveries in one go, and once killed it is
/// no target for the others (a paused one is).
const NEMESES: [(&str, &str); 22] = [
    ("kill", "kill:relay@{at}"),
    ("pause", "pause:relay@{at}+500ms"),
    ("db-kill-backend", "db:kill-backend:relay@{at}"),
    ("dbnet-reset", "dbnet:reset:relay@{at}"),
    ("dbnet-partition", "dbnet:partition:relay@{at}+1s"),
    ("db-restart", "db:restart@{at}"),
    ("db-failover", "db:failover@{at}"),
    ("txn-slow-commit", "txn:slow-commit@{at}+2500ms"),
    ("txn-idle", "txn:idle@{at}+1s"),
    ("txn-rollback", "txn:rollback@{at}"),
    ("txn-prepared", "txn:prepared@{at}+1s"),
    ("clock-step-relay", "clock:step:relay@{at}+60s"),
    ("clock-step-relay-back", "clock:step:relay@{at}-60s"),
    ("clock-step-db", "clock:step:db@{at}+60s"),
    ("dbnet-commit-lost", "dbnet:commit-lost:relay@3"),
    ("net-reset", "net:reset@5"),
    ("net-reply-lost", "net:reply-lost@10"),
    ("net-delay", "net:delay@15+700ms"),
    ("net-down", "net:down@{at}+1s"),
    (
        "db-kill-backend-on-delivery",
        "db:kill-backend:relay:on-delivery@2",
    ),
    ("pause-on-delivery", "pause:relay:on-delivery@3+500ms"),
    ("kill-on-delivery", "kill:relay:on-delivery@4"),
];

/// The nemeses `all` leaves out: a sustained outage is an experiment of its own (the search
/// draws it), not one more fault of the default run; a failover moves the database onto a
/// replicated pair (started for it, renewed after each run), so it is asked for by name; a
/// prepared transaction needs a server that allows them (PostgreSQL's default does not) and a
/// schema whose triggers do not NOTIFY (PostgreSQL cannot prepare a transaction that did, as
/// txoutbox's and faststream-outbox's do), and two-phase commit is rare among writers: by name;
/// the clocks' steps, a minute each way, are experiments of their own (their effects last the
/// rest of the run, and two of them would cancel out): by name.
const NOT_IN_ALL: [&str; 6] = [
    "net-down",
    FAILOVER,
    PREPARED,
    "clock-step-relay",
    "clock-step-relay-back",
    "clock-step-db",
];

/// The nemeses a search draws only where `--nemesis` names them: the failover (a pair of its
/// own), and the workload's transactions (added after the other kinds: drawing them by default
/// would change every schedule an existing seed draws, and the replays written down with it).
const DRAWN_WHEN_NAMED: [&str; 8] = [
    FAILOVER,
    "txn-slow-commit",
    "txn-idle",
    "txn-rollback",
    "txn-prepared",
    "clock-step-relay",
    "clock-step-relay-back",
    "clock-step-db",
];

/// Needs the server to allow prepared transactions: the throwaway cluster does; a server of
/// the user's, by PostgreSQL's default, does not (a search leaves it out there).
const PREPARED: &str = "txn-prepared";

/// What only the throwaway cluster takes: a restart, its clock stepped; and prepared
/// transactions, which a server of the user's allows none of by default.
const THROWAWAY_ONLY: [&str; 3] = ["db-restart", "clock-step-db", PREPARED];

/// The failover's kind: only where it is named is the database on a replicated pair.
const FAILOVER: &str = "db-failover";

/// The claims made when `--claims` is not given: order only holds for some relay designs
/// (one relay, or relays partitioned by aggregate), so it is asked for, not assumed.
pub(super) const DEFAULT_CLAIMS: [Invariant; 4] = [
    Invariant::Ghost,
    Invariant::Lost,
    Invariant::Duplicate,
    Invariant::Liveness,
];

/// `outbox-lab verify`'s options, as given.
#[derive(Debug)]
pub struct Options {
    /// What the run's database is named after (`verify`; the zoo names its entry's runs).
    pub label: String,
    pub relay_cmd: String,
    /// Who the relay runs as (`--run-as`, resolved): when outbox-lab is root, never root.
    pub run_as: Option<RunAs>,
    pub relays: u32,
    /// `--nemesis`: kinds by name (`all`, `none`).
    pub nemeses: Vec<String>,
    /// `--schedule`: this one schedule instead.
    pub schedule: Option<String>,
    /// `--search N --seed S`: N schedules drawn from the nemesis grammar instead.
    pub search: Option<(u32, u64)>,
    pub events: u32,
    pub time_limit: Duration,
    pub consumer: ConsumerKind,
    pub claims: Option<Vec<String>>,
    /// `--schema FILE`'s path and text.
    pub schema: Option<(String, String)>,
    /// `--pending-sql`'s statement.
    pub pending_sql: Option<String>,
    /// `--insert-sql`'s statement.
    pub insert_sql: Option<String>,
    /// The server is the user's: it is never restarted.
    pub external_server: bool,
    /// Where deliveries go.
    pub sink: VerifySink,
    /// `--replication`: how the pair of a db-failover replicates (async when not given).
    pub replication: Option<Replication>,
}

/// Where the user's relay delivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum VerifySink {
    /// Our HTTP consumer, behind the fault proxy.
    Http,
    /// A private Redis: XADD to outbox.event.orders, read by a consumer group.
    Redis,
    /// A private NATS JetStream: publish to outbox.event.orders, read by a durable consumer.
    Nats,
    /// A private RabbitMQ: publish to the durable queue outbox.event.orders, read with manual
    /// acks.
    Amqp,
    /// A private Kafka-protocol broker (tansu): produce to the topic outbox.event.orders (3
    /// partitions, keyed by aggregate), read by a consumer of ours that records its offsets
    /// after each batch.
    Kafka,
}

impl VerifySink {
    /// The network nemeses stand between a relay and the HTTP consumer, or Kafka.
    pub(super) fn behind_the_proxy(self) -> bool {
        matches!(self, VerifySink::Http | VerifySink::Kafka)
    }

    /// Where outbox-lab sees each delivery exactly as it passes (the proxy holds it), so that
    /// a nemesis can strike on it: HTTP's, Redis' and Kafka's proxies.
    pub(super) fn sees_deliveries(self) -> bool {
        matches!(
            self,
            VerifySink::Http | VerifySink::Redis | VerifySink::Kafka
        )
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            VerifySink::Http => "http",
            VerifySink::Redis => "redis",
            VerifySink::Nats => "nats",
            VerifySink::Amqp => "amqp",
            VerifySink::Kafka => "kafka",
        }
    }
}

/// The checked options: what verify runs.
pub struct Plan {
    pub(super) template: RelayTemplate,
    pub(super) design: &'static Design,
    pub(super) schedule: Schedule,
    /// Whether the schedule was given (`--schedule`): run as it is, not shrunk.
    pub(super) replay: bool,
    /// `--search`: the schedules drawn, run one after another until one breaks a claim, and
    /// the seed that drew them.
    pub(super) search: Option<Search>,
    pub(super) workload: Workload,
    /// What the lab holds every run to: `--time-limit`, and [`FOREIGN_LIVENESS`] to drain.
    pub(super) bounds: Bounds,
    pub(super) time_limit: Duration,
    pub(super) schema: Option<(String, String)>,
    pub(super) pending_sql: Option<String>,
    pub(super) insert_sql: Option<String>,
    pub(super) events: u32,
    pub(super) sink: VerifySink,
    /// The application's database is on a replicated pair, replicating so: a schedule fails
    /// it over.
    pub(super) replication: Option<Replication>,
}

impl Plan {
    /// Whether a schedule it may run steps the database server's wall clock: the throwaway
    /// cluster then starts on a clock of the run's.
    pub fn steps_the_databases_clock(&self) -> bool {
        let drawn = self.search.iter().flat_map(|search| &search.schedules);
        std::iter::once(&self.schedule)
            .chain(drawn)
            .any(|schedule| {
                schedule.nemeses.iter().any(|n| {
                    matches!(
                        n,
                        Nemesis::ClockStep {
                            target: ClockTarget::Db,
                            ..
                        }
                    )
                })
            })
    }

    /// `--search`'s seed and how many schedules it draws.
    pub fn search_budget(&self) -> Option<(u64, usize)> {
        self.search
            .as_ref()
            .map(|search| (search.seed, search.schedules.len()))
    }

    pub fn new(options: &Options) -> Result<Plan> {
        // --relays and --events are checked by their parsers.
        let template = RelayTemplate::parse(&options.relay_cmd, options.run_as.clone())?;
        if options.time_limit < Duration::from_secs(5) {
            bail!("--time-limit must be at least 5s (a run needs time to drain)");
        }
        let claims = match &options.claims {
            None => DEFAULT_CLAIMS.to_vec(),
            Some(names) => names
                .iter()
                .map(|name| {
                    Invariant::named(name.trim()).ok_or_else(|| {
                        anyhow!(
                            "--claims: unknown invariant '{name}' (ghost, lost, duplicate, \
                                 order, liveness)"
                        )
                    })
                })
                .collect::<Result<Vec<_>>>()?,
        };
        let (schedule, replay) = match &options.schedule {
            // explore's hint names crash points, which a relay of yours has none of.
            Some(text) if text.trim().is_empty() => bail!(
                "invalid --schedule: empty schedule (give nemeses like \
                 kill:relay@250ms,net:reset@5, or none)"
            ),
            Some(text) => (
                text.parse()
                    .map_err(|e| anyhow!("invalid --schedule: {e}"))?,
                true,
            ),
            None => (
                schedule_of(&options.nemeses, options.external_server, options.sink)?,
                false,
            ),
        };
        check_schedule(&schedule, options.external_server, options.sink)?;
        let search = match options.search {
            Some((count, seed)) => {
                let only = drawn_only(&options.nemeses)?;
                let mut schedules = Vec::new();
                for k in 0..count {
                    schedules.push(drawn(
                        seed,
                        k,
                        options.external_server,
                        options.sink,
                        only.as_deref(),
                    )?);
                }
                Some(Search {
                    seed,
                    only,
                    schedules,
                })
            }
            None => None,
        };
        let fails_over = |schedule: &Schedule| {
            let mut nemeses = schedule.nemeses.iter();
            nemeses.any(|n| matches!(n, Nemesis::DbFailover { .. }))
        };
        let drawn = search.iter().flat_map(|search| &search.schedules);
        let replication = match (
            fails_over(&schedule) || drawn.clone().any(fails_over),
            options.replication,
        ) {
            (true, chosen) => Some(chosen.unwrap_or(Replication::Async)),
            (false, None) => None,
            (false, Some(_)) => bail!(
                "--replication says how the database of a db-failover replicates: add \
                 --nemesis db-failover (or db:failover@AT to --schedule)"
            ),
        };
        let design: &'static Design = Box::leak(Box::new(Design {
            name: Box::leak(options.label.clone().into_boxed_str()),
            summary: "the user's relay",
            writer: Writer::Outbox,
            relay: None,
            relays: options.relays,
            batch: 0,
            consumer: options.consumer,
            claims: Box::leak(claims.into_boxed_slice()),
            flaws: &[],
            poison_without_dead_letter: None,
        }));
        Ok(Plan {
            template,
            design,
            schedule,
            replay,
            search,
            workload: Workload {
                orders: options.events.div_ceil(EVENTS_PER_ORDER),
                events_per_order: EVENTS_PER_ORDER,
                overlap: WRITER_OVERLAP,
            },
            bounds: Bounds {
                liveness: FOREIGN_LIVENESS,
                run: options.time_limit,
                child: options.time_limit,
                statement: options.time_limit / 4,
            },
            time_limit: options.time_limit,
            schema: options.schema.clone(),
            pending_sql: options.pending_sql.clone(),
            insert_sql: options.insert_sql.clone(),
            sink: options.sink,
            events: options.events,
            replication,
        })
    }

    /// The user's relays, delivering to our HTTP consumer, or to the broker at `broker_url`
    /// (Redis, NATS, RabbitMQ or Kafka, as `--sink` says: known once the run's server is up).
    pub(super) fn relays(&self, broker_url: Option<String>) -> ForeignRelays {
        ForeignRelays {
            template: self.template.clone(),
            delivery: match (self.sink, broker_url) {
                (VerifySink::Redis, Some(url)) => Delivery::Redis {
                    url,
                    stream: RedisSink::stream_name("", ORDERS),
                },
                (VerifySink::Nats, Some(url)) => Delivery::Nats { url },
                (VerifySink::Amqp, Some(url)) => Delivery::Amqp {
                    url,
                    queue: AmqpSink::queue_name("", ORDERS),
                },
                (VerifySink::Kafka, Some(url)) => Delivery::Kafka {
                    url,
                    topic: KafkaSink::topic_name("", ORDERS),
                },
                _ => Delivery::Http,
            },
            pending_sql: self
                .pending_sql
                .clone()
                .unwrap_or_else(|| COUNT_PENDING.to_string()),
            schema: self.schema.as_ref().map(|(_, ddl)| ddl.clone()),
            insert_sql: self.insert_sql.clone(),
        }
    }
}

/// Schedule `k` of the search seeded `seed` ([`draw`]), of the kinds the sink and the server
/// allow (`net-down` among them; the failover only where it is named), `only` those if given.
fn drawn(
    seed: u64,
    k: u32,
    external_server: bool,
    sink: VerifySink,
    only: Option<&[String]>,
) -> Result<Schedule> {
    let kinds: Vec<&str> = NEMESES
        .iter()
        .map(|(kind, _)| *kind)
        .filter(|kind| {
            !(external_server && THROWAWAY_ONLY.contains(kind)
                || !sink.behind_the_proxy() && kind.starts_with("net-")
                || !sink.sees_deliveries() && kind.ends_with("-on-delivery")
                || DRAWN_WHEN_NAMED.contains(kind) && only.is_none())
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
    Ok(draw(seed, k, &kinds))
}

/// The schedule `--nemesis` asks for: each kind once, in [`NEMESES`]' order, the timed ones
/// [`NEMESIS_SPACING`] apart; `all` on the
/// user's server is all but the database restart (only a throwaway cluster is restarted), and
/// with a broker all but those that need the proxy.
fn schedule_of(kinds: &[String], external_server: bool, sink: VerifySink) -> Result<Schedule> {
    let everything = matches!(kinds, []) || matches!(kinds, [one] if one == "all");
    let nothing = matches!(kinds, [one] if one == "none");
    if let Some(unknown) = kinds
        .iter()
        .map(|k| k.trim())
        .find(|k| !NEMESES.iter().any(|(kind, _)| kind == k) && !everything && !nothing)
    {
        let known: Vec<&str> = NEMESES.iter().map(|(kind, _)| *kind).collect();
        bail!(
            "--nemesis: unknown nemesis '{unknown}' ({}, or all, or none)",
            known.join(", ")
        );
    }
    let chosen = NEMESES.iter().filter(|(kind, _)| match everything {
        true => {
            !(external_server && THROWAWAY_ONLY.contains(kind)
                || NOT_IN_ALL.contains(kind)
                || !sink.behind_the_proxy() && kind.starts_with("net-")
                || !sink.sees_deliveries() && kind.ends_with("-on-delivery"))
        }
        false => kinds.iter().any(|k| k.trim() == *kind),
    });
    let mut items = Vec::new();
    for (n, (_, item)) in chosen.enumerate() {
        let at = NEMESIS_SPACING * (n as u32 + 1);
        items.push(item.replace("{at}", &format_duration(at)));
    }
    match items.is_empty() {
        true => Ok(Schedule::default()),
        false => items.join(",").parse().map_err(|e: String| anyhow!("{e}")),
    }
}

/// A foreign relay has no crash points: only nemeses on a clock (or on a request).
fn check_schedule(schedule: &Schedule, external_server: bool, sink: VerifySink) -> Result<()> {
    if let Some(fault) = schedule.faults.first() {
        bail!(
            "invalid --schedule: '{fault}' is a crash point of outbox-lab's own relays; a relay \
             of yours is struck by nemeses only (kill:relay@1s, pause:relay@1s+500ms, \
             db:restart@1s, net:reset@5, ...)"
        );
    }
    for nemesis in &schedule.nemeses {
        if nemesis.crash_point().is_some() {
            bail!(
                "invalid --schedule: '{nemesis}' pauses at a crash point; a relay of yours is \
                 paused on a clock (pause:relay@AT+FOR)"
            );
        }
        if !sink.behind_the_proxy() && matches!(nemesis, Nemesis::Net(_)) {
            bail!(
                "'{nemesis}': the network nemeses stand between a relay and the HTTP consumer \
                 or Kafka; with --sink {}, use kill, pause, db-kill-backend and db-restart",
                sink.name()
            );
        }
        if !sink.sees_deliveries() && matches!(nemesis, Nemesis::OnDelivery { .. }) {
            bail!(
                "'{nemesis}': outbox-lab sees each delivery exactly only through its HTTP, Redis \
                 and Kafka proxies; with --sink {}, strike on a clock (kill:relay@AT, \
                 pause:relay@AT+FOR)",
                sink.name()
            );
        }
        if external_server && nemesis.needs_throwaway_cluster() {
            bail!(
                "'{nemesis}' strikes the throwaway cluster only (outbox-lab restarts no server \
                 of yours, nor sets its clock): run it without --database-url"
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::search::DRAWN_NEMESES;

    /// The same seed and draw give the same schedule, another draw another; every drawn
    /// schedule prints back to itself, and holds only what its sink and server allow.
    #[test]
    fn drawn_schedules_reproduce_and_fit_their_sink() {
        assert_eq!(
            drawn(7, 3, false, VerifySink::Http, None).unwrap(),
            drawn(7, 3, false, VerifySink::Http, None).unwrap()
        );
        let http: Vec<Schedule> = (0..200)
            .map(|k| drawn(7, k, false, VerifySink::Http, None).unwrap())
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
        // Every kind comes up in 200 draws, the sustained outage among them; the failover and
        // the workload's transactions only where they are named.
        let drawn_kinds = NEMESES
            .iter()
            .filter(|(kind, _)| !DRAWN_WHEN_NAMED.contains(kind));
        for (kind, _) in drawn_kinds {
            assert!(
                http.iter()
                    .flat_map(|s| &s.nemeses)
                    .any(|n| n.kind() == *kind),
                "{kind} never drawn"
            );
        }
        for k in 0..200 {
            let nats = drawn(7, k, true, VerifySink::Nats, None).unwrap();
            check_schedule(&nats, true, VerifySink::Nats).unwrap();
            let redis = drawn(7, k, false, VerifySink::Redis, None).unwrap();
            check_schedule(&redis, false, VerifySink::Redis).unwrap();
        }
    }

    /// `--nemesis` narrows what a search draws (a search without a crash); a list of which
    /// nothing can strike here is refused.
    #[test]
    fn a_search_draws_only_the_kinds_named() {
        let only = ["pause".to_string(), "pause-on-delivery".to_string()];
        for k in 0..100 {
            let drawn = drawn(7, k, false, VerifySink::Http, Some(&only)).unwrap();
            assert!(drawn
                .nemeses
                .iter()
                .all(|n| only.contains(&n.kind().to_string())));
        }
        let on_delivery = ["pause-on-delivery".to_string()];
        let err = drawn(7, 0, false, VerifySink::Nats, Some(&on_delivery)).unwrap_err();
        assert!(err.to_string().contains("can strike"), "{err}");
    }
}
