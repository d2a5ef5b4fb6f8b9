//! `outbox-lab verify`: the user's relay — any command, any language — put through the
//! nemeses and judged by the same checker as explore's designs.
//!
//! The parts are explore's: the [`Lab`] runs a schedule (the writer and the consumer are ours,
//! the relays the user's command, restarted whenever they end), the nemeses strike on a clock
//! (a foreign process has no crash points), and the checker reads the database it left. This
//! module owns the plan (the options checked up front, the schedule the chosen nemeses make),
//! the shrinking (a violation found under every nemesis is run again under each one alone, to
//! name the smallest schedule that reproduces it), what is measured besides the verdict
//! (latency and throughput of the relay, the timeline of deliveries and faults) and the
//! [`Report`]. The command (arguments, server, output) is cmd/verify.rs.

pub mod plots;

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::json;
use tokio_postgres::Client;

use crate::explore::designs::{Design, Invariant, Writer};
use crate::explore::history::{FaultOutcome, History};
use crate::explore::lab::{Bounds, Delivery, ForeignRelays, Lab, Workload, COUNT_PENDING};
use crate::explore::schedule::Nemesis;
use crate::explore::schedule::Schedule;
use crate::explore::watchdog::LIVENESS_BOUND;
use crate::harness::db::PgServer;
use crate::harness::foreign::RelayTemplate;
use crate::harness::nemesis::format_duration;
use crate::judge::expectations::CheckResult;
use crate::outbox::consumer::ConsumerKind;
use crate::outbox::sink::{AmqpSink, RedisSink};
use crate::report::{Environment, Metrics, Report, Table};

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
const FOREIGN_LIVENESS: Duration = Duration::from_secs(10);
/// The width of a bucket of the delivery timeline.
const TIMELINE_BUCKET_MS: i64 = 100;

/// The nemeses `--nemesis` names, and the schedule item each one makes (`{at}`: its moment).
/// In this order on the clock: a database restart last, so that the sessions the nemesis
/// before it ends are there to end.
const NEMESES: [(&str, &str); 7] = [
    ("kill", "kill:relay@{at}"),
    ("pause", "pause:relay@{at}+500ms"),
    ("db-kill-backend", "db:kill-backend:relay@{at}"),
    ("db-restart", "db:restart@{at}"),
    ("net-reset", "net:reset@5"),
    ("net-reply-lost", "net:reply-lost@10"),
    ("net-delay", "net:delay@15+700ms"),
];

/// The claims made when `--claims` is not given: order only holds for some relay designs
/// (one relay, or relays partitioned by aggregate), so it is asked for, not assumed.
const DEFAULT_CLAIMS: [Invariant; 4] = [
    Invariant::Ghost,
    Invariant::Lost,
    Invariant::Duplicate,
    Invariant::Liveness,
];

/// `outbox-lab verify`'s options, as given.
#[derive(Debug)]
pub struct Options {
    pub relay_cmd: String,
    pub relays: u32,
    /// `--nemesis`: kinds by name (`all`, `none`).
    pub nemeses: Vec<String>,
    /// `--schedule`: this one schedule instead.
    pub schedule: Option<String>,
    pub events: u32,
    pub time_limit: Duration,
    pub consumer: ConsumerKind,
    pub claims: Option<Vec<String>>,
    /// `--schema FILE`'s path and text.
    pub schema: Option<(String, String)>,
    /// `--pending-sql`'s statement.
    pub pending_sql: Option<String>,
    /// The server is the user's: it is never restarted.
    pub external_server: bool,
    /// Where deliveries go.
    pub sink: VerifySink,
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
}

impl VerifySink {
    /// The network nemeses stand between a relay and the HTTP consumer only.
    fn behind_the_proxy(self) -> bool {
        self == VerifySink::Http
    }

    fn name(self) -> &'static str {
        match self {
            VerifySink::Http => "http",
            VerifySink::Redis => "redis",
            VerifySink::Nats => "nats",
            VerifySink::Amqp => "amqp",
        }
    }
}

/// The checked options: what verify runs.
pub struct Plan {
    template: RelayTemplate,
    design: &'static Design,
    schedule: Schedule,
    /// Whether the schedule was given (`--schedule`): run as it is, not shrunk.
    replay: bool,
    workload: Workload,
    time_limit: Duration,
    schema: Option<(String, String)>,
    pending_sql: Option<String>,
    events: u32,
    pub sink: VerifySink,
}

impl Plan {
    pub fn new(options: &Options) -> Result<Plan> {
        // --relays and --events are checked by their parsers.
        let template = RelayTemplate::parse(&options.relay_cmd)?;
        if options.time_limit < Duration::from_secs(5) {
            bail!("--time-limit must be at least 5s (a run needs time to drain)");
        }
        let claims = match &options.claims {
            None => DEFAULT_CLAIMS.to_vec(),
            Some(names) => names
                .iter()
                .map(|name| {
                    Invariant::ALL
                        .into_iter()
                        .find(|i| i.name() == name.trim())
                        .ok_or_else(|| {
                            anyhow!(
                                "--claims: unknown invariant '{name}' (ghost, lost, duplicate, \
                                 order, liveness)"
                            )
                        })
                })
                .collect::<Result<Vec<_>>>()?,
        };
        let (schedule, replay) = match &options.schedule {
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
        let design: &'static Design = Box::leak(Box::new(Design {
            name: "verify",
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
            workload: Workload {
                orders: options.events.div_ceil(EVENTS_PER_ORDER),
                events_per_order: EVENTS_PER_ORDER,
                overlap: WRITER_OVERLAP,
            },
            time_limit: options.time_limit,
            schema: options.schema.clone(),
            pending_sql: options.pending_sql.clone(),
            sink: options.sink,
            events: options.events,
        })
    }

    /// The command line that runs `schedule` again: every flag that shaped the run.
    fn command_line(&self, schedule: &str) -> String {
        let quote = |text: &str| format!("'{}'", text.replace('\'', "'\\''"));
        let mut line = format!(
            "outbox-lab verify --relay-cmd {} --relays {} --events {} --consumer {} --sink {} \
             --time-limit {} --schedule \"{schedule}\"",
            quote(&self.template.text),
            self.design.relays,
            self.events,
            self.design.consumer.name(),
            self.sink.name(),
            format_duration(self.time_limit),
        );
        if self.design.claims != DEFAULT_CLAIMS {
            let claims: Vec<&str> = self.design.claims.iter().map(|c| c.name()).collect();
            line.push_str(&format!(" --claims {}", claims.join(",")));
        }
        if let Some((path, _)) = &self.schema {
            line.push_str(&format!(" --schema {}", quote(path)));
        }
        if let Some(sql) = &self.pending_sql {
            line.push_str(&format!(" --pending-sql {}", quote(sql)));
        }
        line
    }

    fn params(&self) -> serde_json::Value {
        json!({
            "relay_cmd": self.template.text,
            "relays": self.design.relays,
            "events": self.workload.orders * self.workload.events_per_order,
            "events_per_order": self.workload.events_per_order,
            "consumer": self.design.consumer.name(),
            "claims": self.design.claims.iter().map(|c| c.name()).collect::<Vec<_>>(),
            "nemeses": self.schedule.nemeses.iter().map(Nemesis::to_string).collect::<Vec<_>>(),
            "schedule": self.schedule.to_string(),
            "time_limit_s": self.time_limit.as_secs_f64(),
            "schema": self.schema.as_ref().map(|(path, _)| path.clone()),
            "pending_sql": self.pending_sql,
        })
    }
}

/// The schedule `--nemesis` asks for: each kind once, in [`NEMESES`]' order, the timed ones
/// [`NEMESIS_SPACING`] apart; `all` on the user's server is all but the database restart
/// (only a throwaway cluster is restarted).
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
            !(external_server && *kind == "db-restart"
                || !sink.behind_the_proxy() && kind.starts_with("net-"))
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
                "'{nemesis}': the network nemeses stand between a relay and the HTTP consumer; \
                 with --sink {}, use kill, pause, db-kill-backend and db-restart",
                sink.name()
            );
        }
        if external_server && nemesis.needs_throwaway_cluster() {
            bail!("db:restart restarts the throwaway cluster only: run it without --database-url");
        }
    }
    Ok(())
}

/// One run, with what was measured on its database before the next run reset it.
pub struct VerifyRun {
    pub history: History,
    pub figures: Figures,
}

/// What the run's database says besides the verdict.
#[derive(Debug, Clone, Default)]
pub struct Figures {
    pub written: i64,
    pub delivered_distinct: i64,
    pub deliveries: i64,
    pub latency_p50_ms: f64,
    pub latency_p99_ms: f64,
    pub latency_max_ms: f64,
    pub events_per_s: f64,
    /// Whether latency starts at the commit (PostgreSQL's commit timestamps) or at the insert.
    pub from_commit: bool,
    /// Deliveries (first receipts) per [`TIMELINE_BUCKET_MS`], from the first commit.
    pub timeline: Vec<(i64, i64)>,
}

/// Everything verify ran: the main schedule, then each nemesis alone where something broke.
pub struct Verification {
    pub main: VerifyRun,
    pub shrunk: Vec<VerifyRun>,
    /// Shrinking stopped at the time limit.
    pub cut_short: bool,
    pub elapsed: Duration,
}

impl Verification {
    /// Why the main run is inconclusive (cut short by `--time-limit` before it drained), if it
    /// is: nothing but the safety invariants it broke is judged of it.
    pub fn inconclusive(&self) -> Option<&str> {
        self.main.history.cut_short.as_deref()
    }
}

/// Runs the plan on `server`; the relays deliver to our HTTP consumer, or to the broker at
/// `broker_url` (Redis, NATS or RabbitMQ, as `--sink` says).
pub async fn verify(
    server: &PgServer,
    plan: &Plan,
    broker_url: Option<String>,
    progress: bool,
) -> Result<Verification> {
    let clock = Instant::now();
    let foreign = ForeignRelays {
        template: plan.template.clone(),
        delivery: match (plan.sink, broker_url) {
            (VerifySink::Redis, Some(url)) => Delivery::Redis {
                url,
                stream: RedisSink::stream_name("", ORDERS),
            },
            (VerifySink::Nats, Some(url)) => Delivery::Nats { url },
            (VerifySink::Amqp, Some(url)) => Delivery::Amqp {
                url,
                queue: AmqpSink::queue_name("", ORDERS),
            },
            _ => Delivery::Http,
        },
        pending_sql: plan
            .pending_sql
            .clone()
            .unwrap_or_else(|| COUNT_PENDING.to_string()),
        schema: plan.schema.as_ref().map(|(_, ddl)| ddl.clone()),
    };
    let bounds = Bounds {
        liveness: FOREIGN_LIVENESS,
        run: plan.time_limit,
        child: plan.time_limit,
        statement: plan.time_limit / 4,
    };
    let lab = Lab::prepare_foreign(server, plan.design, plan.workload, foreign, bounds).await?;
    let say = |text: String| {
        if progress {
            crate::errln!("verify: {text}");
        }
    };
    let main = run_once(&lab, &plan.schedule).await?;
    say(format!(
        "{}: {} in {:.1} s",
        plan.schedule,
        verdict_line(&main.history),
        main.history.elapsed_ms as f64 / 1000.0
    ));
    let mut shrunk = Vec::new();
    let mut cut_short = false;
    let broke_a_claim = plan
        .design
        .claims
        .iter()
        .any(|claim| main.history.violations.contains_key(claim.name()));
    if !plan.replay && broke_a_claim && plan.schedule.nemeses.len() > 1 {
        for nemesis in &plan.schedule.nemeses {
            let spent = clock.elapsed() + Duration::from_millis(main.history.elapsed_ms);
            if spent > plan.time_limit {
                cut_short = true;
                break;
            }
            let alone = Schedule {
                faults: Vec::new(),
                nemeses: vec![*nemesis],
            };
            let run = run_once(&lab, &alone).await?;
            say(format!("{alone} alone: {}", verdict_line(&run.history)));
            shrunk.push(run);
        }
    }
    Ok(Verification {
        main,
        shrunk,
        cut_short,
        elapsed: clock.elapsed(),
    })
}

async fn run_once(lab: &Lab<'_>, schedule: &Schedule) -> Result<VerifyRun> {
    let history = lab.run(schedule).await?;
    let client = lab.client().await?;
    let figures = measure(&client)
        .await
        .context("cannot measure the run's deliveries")?;
    Ok(VerifyRun { history, figures })
}

fn verdict_line(history: &History) -> String {
    match history.violations.is_empty() {
        true => "no violation".into(),
        false => {
            let broken: Vec<String> = history
                .violations
                .iter()
                .map(|(invariant, ids)| format!("{invariant} ({})", ids.len()))
                .collect();
            format!("violated: {}", broken.join(", "))
        }
    }
}

/// Each event's commit (or insert, without commit timestamps) -> its first receipt.
macro_rules! latencies {
    ($committed:literal) => {
        concat!(
            "
WITH first_receipt AS (
  SELECT event_id, min(received_at) AS received_at
    FROM consumer.receipts
   WHERE NOT injected_fault
   GROUP BY event_id),
delivered AS (
  SELECT ",
            $committed,
            " AS committed_at, f.received_at
    FROM outbox o
    JOIN first_receipt f USING (event_id)
    JOIN orders ord ON ord.id::text = o.aggregate_id)
SELECT count(*) AS delivered,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY ms) AS p50,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY ms) AS p99,
       max(ms) AS max,
       extract(epoch FROM max(received_at) - min(committed_at))::float8 AS span_s
  FROM (SELECT *, extract(epoch FROM received_at - committed_at)::float8 * 1000 AS ms
          FROM delivered) d"
        )
    };
}

/// The order's row version is the writer's (a relay updates the outbox row, making its own).
const LATENCY_FROM_COMMIT: &str = latencies!("pg_xact_commit_timestamp(ord.xmin)");
const LATENCY_FROM_INSERT: &str = latencies!("o.created_at");

/// The outbox's events, the consumer's distinct and total deliveries.
const COUNTS: &str = "
SELECT (SELECT count(*) FROM outbox) AS written,
       (SELECT count(DISTINCT event_id) FROM consumer.receipts WHERE NOT injected_fault)
         AS delivered_distinct,
       (SELECT count(*) FROM consumer.receipts WHERE NOT injected_fault) AS deliveries";

/// First receipts per bucket of `$1` ms from the first insert.
const TIMELINE: &str = "
WITH first_receipt AS (
  SELECT event_id, min(received_at) AS received_at
    FROM consumer.receipts WHERE NOT injected_fault GROUP BY event_id),
origin AS (SELECT min(created_at) AS t0 FROM outbox)
SELECT (extract(epoch FROM f.received_at - origin.t0) * 1000)::bigint / $1 * $1 AS bucket_ms,
       count(*) AS deliveries
  FROM first_receipt f, origin
 WHERE origin.t0 IS NOT NULL
 GROUP BY 1 ORDER BY 1";

async fn measure(client: &Client) -> Result<Figures> {
    let counts = client.query_one(COUNTS, &[]).await?;
    let from_commit: String = client
        .query_one("SHOW track_commit_timestamp", &[])
        .await?
        .get(0);
    let from_commit = from_commit == "on";
    let latency = client
        .query_one(
            if from_commit {
                LATENCY_FROM_COMMIT
            } else {
                LATENCY_FROM_INSERT
            },
            &[],
        )
        .await?;
    let delivered: i64 = latency.get("delivered");
    let span_s: Option<f64> = latency.get("span_s");
    let round = |v: Option<f64>| (v.unwrap_or(0.0) * 100.0).round() / 100.0;
    let timeline = client
        .query(TIMELINE, &[&TIMELINE_BUCKET_MS])
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    Ok(Figures {
        written: counts.get("written"),
        delivered_distinct: counts.get("delivered_distinct"),
        deliveries: counts.get("deliveries"),
        latency_p50_ms: round(latency.get("p50")),
        latency_p99_ms: round(latency.get("p99")),
        latency_max_ms: round(latency.get("max")),
        events_per_s: match span_s {
            Some(s) if s > 0.0 => (delivered as f64 / s).round(),
            _ => 0.0,
        },
        from_commit,
        timeline,
    })
}

/// The runs that broke `invariant`, with every fault fired, fewest nemeses first: the main
/// run's schedule is shown unless one nemesis alone reproduced it.
fn smallest(verification: &Verification, invariant: Invariant) -> Option<&VerifyRun> {
    let broke = |run: &&VerifyRun| {
        run.history.violations.contains_key(invariant.name()) && !run.history.faults_not_reached()
    };
    verification
        .shrunk
        .iter()
        .find(broke)
        .or(Some(&verification.main).filter(broke))
}

/// How many offending ids are shown in a table cell.
const SHOWN_IDS: usize = 10;

/// The verification as a [`Report`] (`scenario: "verify"`).
pub fn report(plan: &Plan, verification: &Verification, environment: Environment) -> Report {
    let main = &verification.main;
    let figures = &main.figures;
    let mut metrics = Metrics::default();
    metrics.set("verify.written", figures.written);
    metrics.set("verify.delivered_distinct", figures.delivered_distinct);
    metrics.set("verify.deliveries", figures.deliveries);
    for invariant in Invariant::ALL {
        let ids = main.history.violations.get(invariant.name());
        metrics.set(
            format!("verify.{}.violating", invariant.name()),
            ids.map_or(0, Vec::len) as i64,
        );
    }
    let fired = main
        .history
        .faults
        .iter()
        .filter(|f| matches!(f.outcome, FaultOutcome::Fired { .. }))
        .count();
    metrics.set("verify.faults_fired", fired as i64);
    metrics.set(
        "verify.faults_not_reached",
        (main.history.faults.len() - fired) as i64,
    );
    metrics.set("verify.latency.p50_ms", figures.latency_p50_ms);
    metrics.set("verify.latency.p99_ms", figures.latency_p99_ms);
    metrics.set("verify.latency.max_ms", figures.latency_max_ms);
    metrics.set("verify.events_per_s", figures.events_per_s);
    metrics.set("verify.runs", 1 + verification.shrunk.len() as i64);

    let inconclusive = verification.inconclusive();
    metrics.set("verify.inconclusive", i64::from(inconclusive.is_some()));
    let mut checks = Vec::new();
    for &invariant in plan.design.claims {
        if inconclusive.is_some() && invariant == Invariant::Liveness {
            // A run cut short did not drain: that is the limit's doing, not the relay's.
            continue;
        }
        let violating = main.history.violations.get(invariant.name());
        checks.push(CheckResult {
            name: format!("your relay: {}", invariant.meaning()),
            metric: format!("verify.{}.violating", invariant.name()),
            expected: "0".into(),
            actual: violating.map_or(0, Vec::len).to_string(),
            article: None,
            pass: violating.is_none(),
        });
    }
    // A fault that did not fire tested nothing: the run does not pass on it. (A run cut
    // short is inconclusive as a whole instead.)
    if inconclusive.is_none() {
        checks.push(CheckResult {
            name: "every nemesis of the schedule fired".into(),
            metric: "verify.faults_not_reached".into(),
            expected: "0".into(),
            actual: (main.history.faults.len() - fired).to_string(),
            article: None,
            pass: fired == main.history.faults.len(),
        });
    }

    let mut runs = Table::new(
        "runs: what was written, delivered, and broken",
        &[
            "schedule",
            "written",
            "delivered",
            "deliveries",
            "ghost",
            "lost",
            "duplicate",
            "order",
            "liveness",
            "not reached",
            "s",
        ],
    );
    for run in std::iter::once(main).chain(&verification.shrunk) {
        let mut row = vec![
            run.history.schedule.clone(),
            run.figures.written.to_string(),
            run.figures.delivered_distinct.to_string(),
            run.figures.deliveries.to_string(),
        ];
        for invariant in Invariant::ALL {
            let n = run
                .history
                .violations
                .get(invariant.name())
                .map_or(0, Vec::len);
            let claimed = if plan.design.claims(invariant) {
                "*"
            } else {
                ""
            };
            row.push(format!("{n}{claimed}"));
        }
        let not_reached: Vec<&str> = run
            .history
            .faults
            .iter()
            .filter(|f| f.outcome == FaultOutcome::NotReached)
            .map(|f| f.fault.as_str())
            .collect();
        row.push(match not_reached.is_empty() {
            true => "-".into(),
            false => not_reached.join(", "),
        });
        row.push(format!("{:.1}", run.history.elapsed_ms as f64 / 1000.0));
        runs.push(row);
    }

    let mut violations = Table::new(
        "violations: offending ids and the smallest schedule that reproduced them",
        &[
            "invariant",
            "claimed",
            "count",
            "offending",
            "schedule",
            "replay",
        ],
    );
    for invariant in Invariant::ALL {
        let Some(ids) = main.history.violations.get(invariant.name()) else {
            continue;
        };
        let mut shown: Vec<String> = ids.iter().take(SHOWN_IDS).cloned().collect();
        if ids.len() > SHOWN_IDS {
            shown.push(format!("... {} more", ids.len() - SHOWN_IDS));
        }
        let schedule = smallest(verification, invariant).map_or_else(
            || main.history.schedule.clone(),
            |r| r.history.schedule.clone(),
        );
        violations.push(vec![
            invariant.name().into(),
            if plan.design.claims(invariant) {
                "yes"
            } else {
                "no"
            }
            .into(),
            ids.len().to_string(),
            shown.join(", "),
            schedule.clone(),
            plan.command_line(&schedule),
        ]);
    }

    let mut faults = Table::new(
        "faults: fired or not reached",
        &["fault", "outcome", "process", "at ms"],
    );
    for fault in &main.history.faults {
        let (outcome, process, at) = match &fault.outcome {
            FaultOutcome::Fired { process, at_ms } => ("fired", process.clone(), at_ms.to_string()),
            FaultOutcome::NotReached => ("NOT REACHED", "-".into(), "-".into()),
        };
        faults.push(vec![fault.fault.clone(), outcome.into(), process, at]);
    }
    let mut latency = Table::new(
        "your relay's latency and throughput",
        &["from", "p50 ms", "p99 ms", "max ms", "events/s"],
    );
    latency.push(vec![
        if figures.from_commit {
            "commit"
        } else {
            "insert"
        }
        .into(),
        figures.latency_p50_ms.to_string(),
        figures.latency_p99_ms.to_string(),
        figures.latency_max_ms.to_string(),
        figures.events_per_s.to_string(),
    ]);
    let mut timeline = Table::new(TIMELINE_TITLE, &["ms", "deliveries"]).detail();
    for (bucket, n) in &figures.timeline {
        timeline.push(vec![bucket.to_string(), n.to_string()]);
    }

    let mut notes = vec![
        format!(
            "workload: {} orders x {} events, written by two overlapping sessions; {} relay(s) \
             of `{}`, started again whenever one ended; consumer: {}",
            plan.workload.orders,
            plan.workload.events_per_order,
            plan.design.relays,
            plan.template.text,
            plan.design.consumer.name()
        ),
        format!(
            "latency: {} -> the consumer's first receipt of the event, on PostgreSQL's clock, \
             under every nemesis of the run (a pause or restart shows in p99 and max); events/s: \
             distinct events delivered over the span from the first {} to the last first \
             receipt, so bounded by the writer's pace",
            if figures.from_commit {
                "commit"
            } else {
                "insert"
            },
            if figures.from_commit {
                "commit"
            } else {
                "insert"
            },
        ),
        format!(
            "liveness: the relays must drain within {} s of the writer's end and the last fault \
             (explore's own relays get {} s)",
            FOREIGN_LIVENESS.as_secs(),
            LIVENESS_BOUND.as_secs()
        ),
    ];
    for process in &main.history.processes {
        if process.process.starts_with("relay-") && !process.end.starts_with("stopped with SIGTERM")
        {
            notes.push(format!("{}: {}", process.process, process.end));
        }
    }
    if let Some(why) = inconclusive {
        notes.insert(
            0,
            format!(
                "INCONCLUSIVE: the run was {why} (--time-limit {}), with {} of {} events \
                 written: liveness and the nemeses are not judged, only the safety invariants \
                 it broke; give a longer --time-limit or fewer --events",
                format_duration(plan.time_limit),
                figures.written,
                plan.events
            ),
        );
    }
    if verification.cut_short {
        notes.push(format!(
            "shrinking stopped at --time-limit {}: the schedule shown may not be the smallest",
            format_duration(plan.time_limit)
        ));
    }
    Report {
        scenario: "verify".into(),
        section: "beyond the article: your relay under the same faults and checker".into(),
        params: plan.params(),
        metrics,
        tables: vec![runs, violations, faults, latency, timeline],
        checks,
        targets: Vec::new(),
        notes,
        environment,
    }
}

/// The title of the timeline table, which the report page plots.
pub const TIMELINE_TITLE: &str = "timeline: first receipts per 100 ms from the first insert";

/// Histories of every run, keyed for `history::save`.
pub fn histories(verification: &Verification) -> Vec<History> {
    std::iter::once(&verification.main)
        .chain(&verification.shrunk)
        .map(|run| run.history.clone())
        .collect()
}
