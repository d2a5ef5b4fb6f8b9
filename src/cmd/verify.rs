//! `outbox-lab verify`: its arguments, the run's server, and what it prints; the engine (the
//! plan, the shrinking, the figures, the report) is [`crate::verify`].

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;

use super::{Format, RunArgs};
use crate::error;
use crate::explore::history;
use crate::harness::db::{PgServer, ServerChoice};
use crate::harness::foreign::PLACEHOLDERS;
use crate::harness::nemesis::parse_duration;
use crate::harness::replicated::Replication;
use crate::harness::run::{new_run_id, on_server};
use crate::harness::run_as::RunAs;
use crate::outbox::consumer::ConsumerKind;
use crate::report::{Environment, Report};
use crate::verify::plan::{Options, Plan, VerifySink};
use crate::verify::{self, verdict};

pub const EXAMPLES: &str = "\
Examples:
  outbox-lab verify --relay-cmd 'python3 examples/relays/article.py --batch 50' --relays 2
  outbox-lab verify --relay-cmd 'python3 my_relay.py' --nemesis kill,pause,db-restart \\
      --events 2000 --time-limit 60s
  outbox-lab verify --relay-cmd 'outbox-lab relay --database-url {database_url} \\
      --sink {sink_url} --mode notify --name {name}' --claims lost,duplicate,order
  outbox-lab verify --relay-cmd '...' --schedule 'kill:relay@250ms'   # replay one schedule
  outbox-lab verify --relay-cmd '...' --search 40 --seed 1   # 40 drawn schedules, to a finding
  outbox-lab verify --relay-cmd '...' --consumer naive --schedule 'kill:relay:on-delivery@10'
  outbox-lab verify --relay-cmd 'examples/relays/lease.py' --relays 2 --consumer naive \
      --schema examples/relays/lease_schema.sql --insert-sql 'INSERT INTO lease_outbox \
      (message_id, aggregate_id, aggregate_type, event_type, payload) VALUES ($1, $2, $3, $4, $5)' \
      --pending-sql 'SELECT count(*) FROM lease_outbox WHERE processed_at IS NULL' \
      --schedule 'pause:relay:on-delivery@3+2500ms'
  outbox-lab verify --database-url postgres://user@host/postgres --relay-cmd '...'
  outbox-lab verify --relay-cmd '...' --nemesis db-failover --replication async   # ghosts

The relay is started N times (--relays) from the command, with these placeholders filled in
(the same values are in its environment, and libpq's PGHOST, PGPORT, PGUSER, PGDATABASE), the
database as the relay's own link to it (a PostgreSQL wire proxy of outbox-lab's: the nemeses
find the relay's sessions there, whatever it names them, and cut, black-hole or lose a COMMIT's
answer on it):
{placeholders}
It reads the article's outbox table (id, event_id, aggregate_type, aggregate_id, event_type,
payload, created_at, published_at, attempts, next_attempt_at, last_error; NOTIFY outbox_new on
insert), delivers each event as an HTTP POST of a JSON object with at least event_id and
aggregate_id (id, event_type, payload... by their column names) to any path of {sink_url},
takes a 2xx answer as received, and sets published_at. It is killed, paused, cut off from the
database and the consumer (--nemesis), started again whenever it ends, and stopped with
SIGTERM once the outbox is drained. The consumer, the writer and the judge are outbox-lab's.
With --sink http, redis or kafka, a nemesis may strike on a delivery (kill:relay:on-delivery@N): the
relay that sent the run's N-th delivery, as outbox-lab holds it on its way (`outbox-lab explore
--list-nemeses`). A relay with a table of its own gets its events from --insert-sql.

Exit status: 0 every claimed invariant held and every nemesis fired; 1 one broke (the
offending ids and the smallest schedule that reproduced it are printed) or a nemesis was not
reached; 2 bad input (the command not found, a relay that exits at once or never connects to
the database, a --schema that does not apply or breaks outbox-lab's tables, --pending-sql that
does not count, --insert-sql that does not prepare, or either taking too long: every statement
is bounded by a quarter of --time-limit; a nemesis on a delivery with --sink nats or amqp);
3 the harness failed mid-run; 4 inconclusive: --time-limit cut the run short before the
relays drained, and no safety invariant broke meanwhile.";

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The command that starts your relay (split like a shell does, run without one).
    #[arg(long, value_name = "CMD")]
    relay_cmd: String,
    /// Run the relay as this unprivileged user (when outbox-lab runs as root it never runs a
    /// relay as root: by default as a uid of the run's own). Not root, not the servers' user,
    /// and one that runs nothing else: all its processes are ended when the run ends.
    #[arg(long, value_name = "USER")]
    run_as: Option<String>,
    /// Copies of the relay running at once.
    #[arg(long, default_value_t = 1, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=8))]
    relays: u32,
    /// The nemeses, comma-separated: kill, pause, db-restart, db-kill-backend, dbnet-reset,
    /// dbnet-partition, dbnet-commit-lost, net-reset, net-reply-lost, net-delay, those on a
    /// delivery (kill-on-delivery, pause-on-delivery, db-kill-backend-on-delivery), and the
    /// workload's transactions a relay must wait for (txn-slow-commit, txn-idle,
    /// txn-rollback); or all, or none. Named only, not in all: net-down, db-failover (the
    /// database on a primary with a streaming standby, promoted under the relays; see
    /// --replication), txn-prepared (two-phase commit: the server must allow it), and the
    /// clocks' steps (clock-step-relay, a minute ahead, clock-step-relay-back, a minute behind,
    /// clock-step-db, the throwaway cluster's, a minute ahead).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "all",
        value_name = "LIST"
    )]
    nemesis: Vec<String>,
    /// Run this one schedule instead (as printed by an earlier verify), e.g.
    /// "kill:relay@250ms,net:reset@5".
    #[arg(long, value_name = "FAULTS", conflicts_with = "nemesis")]
    schedule: Option<String>,
    /// Draw N schedules from the nemesis grammar (1-3 nemeses each, kinds, moments, delivery
    /// numbers and lengths at random, a sustained outage net:down among them; only the kinds
    /// --nemesis names, if it names some) and run them one after another until one breaks a
    /// claim, then shrink it.
    #[arg(long, value_name = "N", conflicts_with = "schedule",
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    search: Option<u32>,
    /// The search's seed: the same seed draws the same schedules (default: one drawn from the
    /// clock, printed with the results).
    #[arg(long, value_name = "S", requires = "search")]
    seed: Option<u64>,
    /// Events the writer commits (two per order).
    #[arg(long, default_value_t = 2000, value_name = "N", allow_negative_numbers = true,
          value_parser = clap::value_parser!(u32).range(10..=100_000))]
    events: u32,
    /// Stop shrinking after this long; no run lasts longer (e.g. 60s, 90s).
    #[arg(long, default_value = "120s", value_name = "DURATION", value_parser = parse_duration)]
    time_limit: Duration,
    /// The consumer the relay delivers to.
    #[arg(long, value_enum, default_value = "idempotent")]
    consumer: ConsumerKind,
    /// The invariants your relay claims, comma-separated (ghost, lost, duplicate, order,
    /// liveness); default all but order.
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    claims: Option<Vec<String>>,
    /// Where the relay delivers: our HTTP consumer, a private Redis (XADD to
    /// outbox.event.orders, read by a consumer group), a private NATS JetStream (publish to
    /// outbox.event.orders, read by a durable consumer) or a private RabbitMQ (publish to the
    /// durable queue outbox.event.orders, read with manual acks); no network nemeses but with
    /// http.
    #[arg(long, value_enum, default_value = "http")]
    sink: VerifySink,
    /// Your DDL, run after the article's tables in every run's fresh schema (your relay's own
    /// tables, columns, indexes).
    #[arg(long, value_name = "FILE")]
    schema: Option<PathBuf>,
    /// A statement counting the events still to be delivered, if your relay does not set
    /// published_at (default: outbox rows with published_at IS NULL).
    #[arg(long, value_name = "SQL")]
    pending_sql: Option<String>,
    /// The statement the writer runs in its business transaction instead of the article's
    /// outbox insert, for a relay with a table of its own (with --pending-sql): $1 the event
    /// id (uuid), $2 the aggregate id, $3 the aggregate type, $4 the event type (text), $5 the
    /// payload (jsonb), $6 the writer's wall clock (timestamptz: for a time your application
    /// stamps, not the database's now()).
    #[arg(long, value_name = "SQL", requires = "pending_sql")]
    insert_sql: Option<String>,
    /// How the primary of a db-failover replicates to its standby: async (PostgreSQL's
    /// default: a COMMIT the application saw succeed may be lost) or sync
    /// (synchronous_standby_names and synchronous_commit = on: none is).
    #[arg(long, value_enum, value_name = "MODE")]
    replication: Option<Replication>,
    #[command(flatten)]
    run: RunArgs,
}

/// The `{placeholder}` lines of the examples.
pub fn examples() -> String {
    let lines: Vec<String> = PLACEHOLDERS
        .iter()
        .map(|(name, var, what)| format!("  {{{name}}} ({var}): {what}"))
        .collect();
    EXAMPLES.replace("{placeholders}", &lines.join("\n"))
}

impl VerifyArgs {
    fn options(&self) -> Result<Options> {
        let schema = match &self.schema {
            Some(path) => {
                let ddl = std::fs::read_to_string(path)
                    .with_context(|| format!("--schema {}: cannot read it", path.display()))?;
                Some((path.display().to_string(), ddl))
            }
            None => None,
        };
        Ok(Options {
            label: "verify".into(),
            relay_cmd: self.relay_cmd.clone(),
            run_as: RunAs::resolve(self.run_as.as_deref())?,
            relays: self.relays,
            nemeses: self.nemesis.clone(),
            schedule: self.schedule.clone(),
            search: self.search.map(|count| {
                let seed = self.seed.unwrap_or_else(|| {
                    let nanos = chrono::Utc::now().timestamp_nanos_opt().unwrap_or_default();
                    nanos.unsigned_abs() % 1_000_000
                });
                (count, seed)
            }),
            events: self.events,
            time_limit: self.time_limit,
            consumer: self.consumer,
            claims: self.claims.clone(),
            schema,
            pending_sql: self.pending_sql.clone(),
            insert_sql: self.insert_sql.clone(),
            external_server: self.run.database_url.is_some(),
            sink: self.sink,
            replication: self.replication,
        })
    }
}

/// `outbox-lab verify`.
pub async fn run(args: VerifyArgs) -> Result<ExitCode> {
    // Everything is checked before a server is started: bad input leaves nothing behind.
    let plan = Plan::new(&args.options()?)?;
    let run_id = new_run_id();
    let results_dir = args.run.results_dir.join(&run_id);
    let started_at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let text = args.run.format == Format::Text;
    let choice = ServerChoice {
        commit_timestamps: true,
        fake_clock: plan.steps_the_databases_clock(),
        ..args.run.server_choice()
    };
    let (verification, version, kind) = on_server(&choice, &run_id, async |server: &PgServer| {
        let verification = verify::verify_with_sink(server, &plan, &run_id, args.run.keep, text)
            .await
            .map_err(|e| {
                // The relay's own fault (exits at once, never connects) stays bad input.
                match error::Error::find(&e) {
                    Some(_) => e,
                    None => error::harness(e),
                }
            })?;
        history::save(&results_dir, "verify", &verification.histories())?;
        Ok((verification, server.version.clone(), server.kind()))
    })
    .await?;
    if let Some(why) = verification.inconclusive() {
        crate::errln!("verify: inconclusive: the run was {why}: see the notes");
    }
    let report = verdict::report(
        &plan,
        &verification,
        Environment {
            postgres_version: version,
            outbox_lab_version: env!("CARGO_PKG_VERSION").to_string(),
            started_at,
            elapsed_ms: verification.elapsed.as_millis() as u64,
            server: kind.to_string(),
        },
    );
    let status = super::finish_run(&report, &results_dir, args.run.format, Report::render_text)?;
    Ok(
        match verification.inconclusive().is_some() && report.passed() {
            true => ExitCode::from(error::exit::INCONCLUSIVE),
            false => status,
        },
    )
}
