//! The command line: parsing (clap), and one function per subcommand.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum};
use clap_complete::Shell;
use tokio::signal::unix::{signal, SignalKind};

use crate::explore::checker;
use crate::explore::designs::Invariant;
use crate::explore::{self, ExploreArgs};
use crate::harness::child::{self, ChildArgs};
use crate::harness::db::{self, PgServer, ServerChoice};
use crate::harness::redis_server::Redis;
use crate::harness::throwaway;
use crate::judge::counts;
use crate::ops::logging::{self, LogFormat};
use crate::ops::partitions::{self, Action, Age};
use crate::ops::standalone::{self, RelayOptions};
use crate::outbox::consumer::ConsumerKind;
use crate::outbox::crash::CrashPoint;
use crate::outbox::relay;
use crate::outbox::relay::{Partition, RelayConfig, Wakeup};
use crate::outbox::schema;
use crate::report::compare;
use crate::report::html;
use crate::report::progress::Progress;
use crate::report::{self, Report, Table};
use crate::scenarios::{self, Overrides, Scenario};

/// Exit statuses, in one place.
pub mod exit {
    /// Every check passed.
    pub const OK: u8 = 0;
    /// The run worked and a check failed: the article's figure was not reproduced.
    pub const CHECK_FAILED: u8 = 1;
    /// Bad input or a broken environment: nothing was measured.
    pub const USAGE: u8 = 2;
    /// Stopped by Ctrl-C or SIGTERM (after cleaning up).
    pub const INTERRUPTED: u8 = 130;
}

const EXAMPLES: &str = "\
Examples:
  outbox-lab list
  outbox-lab scenario relay-crash
  outbox-lab scenario relay-crash --events 20 --crash-after 7 --format json
  outbox-lab scenario all
  outbox-lab scenario dual-write --database-url postgres://user@host/db
  outbox-lab report results/20261202-153635-38f9
  outbox-lab compare results/20261202-153635-38f9 results/20261203-091500-1a2b
  outbox-lab explore
  outbox-lab crash-points
  outbox-lab prune --database-url postgres://user@host/shop --older-than 3d --dry-run";

/// A laboratory for the Transactional Outbox pattern on PostgreSQL: runs the article's
/// experiments with real processes that really crash, and counts the damage with SQL.
#[derive(Debug, Parser)]
#[command(name = "outbox-lab", version, after_help = EXAMPLES)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List the scenarios, grouped by the article's sections.
    #[command(after_help = "Example:
  outbox-lab list")]
    List,
    /// Run a scenario (or all) and compare what it measures with the article.
    #[command(after_help = "Examples:
  outbox-lab scenario relay-crash
  outbox-lab scenario relay-crash --events 20 --crash-after 7 --format json
  outbox-lab scenario all --keep        # leave the cluster running for psql
  outbox-lab scenario all --quiet 2>/dev/null > run.txt

Every run writes results/<run-id>/: <scenario>.json, a CSV per table, and report.html (the
page with every table, check and plot). Progress bars appear on stderr only when it is a
terminal, and never with --quiet or --format json.

Exit status: 0 every check passed, 1 a check failed, 2 bad input or environment.")]
    Scenario(ScenarioArgs),
    /// Every crash point against every design, judged by an invariant checker.
    #[command(after_help = explore::EXAMPLES)]
    Explore(ExploreArgs),
    /// Print a saved run's tables again and rewrite its report.html, without rerunning anything.
    #[command(after_help = "Example:
  outbox-lab report results/20261202-153635-38f9
  xdg-open results/20261202-153635-38f9/report.html")]
    Report {
        /// A run's directory, as written by `outbox-lab scenario` (results/<run-id>).
        dir: PathBuf,
    },
    /// Show two saved runs side by side: per scenario, every metric in A and B and the change.
    #[command(after_help = "Example (before and after a relay change):
  outbox-lab scenario batch-throughput          # -> results/20261202-153635-38f9
  outbox-lab scenario batch-throughput          # -> results/20261203-091500-1a2b
  outbox-lab compare results/20261202-153635-38f9 results/20261203-091500-1a2b")]
    Compare {
        /// The first run's directory (results/<run-id>).
        a: PathBuf,
        /// The second run's directory, compared with the first.
        b: PathBuf,
    },
    /// Print a shell completion script.
    #[command(after_help = "Examples:
  outbox-lab completions bash > ~/.local/share/bash-completion/completions/outbox-lab
  outbox-lab completions zsh > ~/.zfunc/_outbox-lab
  outbox-lab completions fish > ~/.config/fish/completions/outbox-lab.fish")]
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: Shell,
    },
    /// List every named crash point and the code path it interrupts.
    #[command(after_help = "Example:
  outbox-lab crash-points")]
    CrashPoints,
    /// Give dead letters their attempts back (the article's UPDATE outbox SET attempts = 0 ...).
    #[command(after_help = "Example:
  outbox-lab requeue --database-url postgres://user@host/shop")]
    Requeue {
        /// The database whose `outbox` table to requeue.
        #[arg(long, env = "OUTBOX_LAB_DATABASE_URL")]
        database_url: String,
    },
    /// Detach and drop the daily partitions of a partitioned outbox older than a cutoff; a
    /// partition that still holds an unpublished row is kept and reported, never dropped.
    #[command(after_help = "Examples:
  outbox-lab prune --database-url postgres://user@host/shop --older-than 3d --dry-run
  outbox-lab prune --database-url postgres://user@host/shop --older-than 3d

A partition is pruned when its whole range ends at least that long ago (3d, 12h, 90m, 30s).
Each one is checked first (SELECT count(*) ... WHERE published_at IS NULL, under a lock);
exit status 0 even when one is kept: kept partitions are reported on stderr.")]
    Prune(PruneArgs),
    /// Run a relay against your own database until SIGTERM or Ctrl-C (it finishes its batch).
    #[command(after_help = "Examples:
  outbox-lab relay --database-url postgres://user@host/shop --sink http://10.0.0.5:8080
  outbox-lab relay --database-url postgres://user@host/shop --sink redis://10.0.0.6:6379 \\
      --mode notify --partition 0/2 --metrics-listen 0.0.0.0:9187 --log-format json")]
    Relay(RelayArgs),
    /// Judge a database that relays and consumers worked on: ghost, lost, duplicate and
    /// out-of-order shipments, with the offending ids (exit 1 if any).
    #[command(
        after_help = "Example (after `outbox-lab relay` and `outbox-lab consumer` ran on it):
  outbox-lab check --database-url postgres://user@host/shop"
    )]
    Check {
        /// A database with the outbox and the consumer's tables.
        #[arg(long, env = "OUTBOX_LAB_DATABASE_URL")]
        database_url: String,
    },
    /// Run the HTTP consumer against your own database until SIGTERM or Ctrl-C.
    #[command(after_help = "Example:
  outbox-lab consumer --listen 0.0.0.0:8080 --database-url postgres://user@host/shipping \\
      --idempotent --create-schema")]
    Consumer(ConsumerArgs),
    /// Stop and remove throwaway servers left behind (--keep, or a killed run); with
    /// --database-url, drop the outboxlab_ databases of runs that are no longer alive.
    #[command(
        after_help = "Only what outbox-lab made is touched: throwaway directories that this \
user owns and whose run has ended (their servers stopped only once proven to be theirs), and \
databases named outboxlab_* that neither their run nor anyone else is connected to.

Examples:
  outbox-lab clean
  OUTBOX_LAB_DATABASE_URL=postgres://user:secret@host/postgres outbox-lab clean --database-url"
    )]
    Clean {
        /// Also drop the outboxlab_ databases (and their replication slots) that killed runs
        /// left on this server. Prefer the environment variable for a URL with a password.
        #[arg(long, env = "OUTBOX_LAB_DATABASE_URL", hide_env_values = true)]
        database_url: Option<String>,
    },
    /// A component in a child process (used by the scenarios).
    #[command(hide = true)]
    Child(ChildArgs),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum RelayMode {
    /// Poll every --interval-ms.
    Poll,
    /// LISTEN for the outbox trigger's NOTIFY; poll every --interval-ms anyway (a fallback).
    Notify,
}

#[derive(Debug, Args)]
struct RelayArgs {
    /// The database with the outbox table.
    #[arg(long, env = "OUTBOX_LAB_DATABASE_URL")]
    database_url: String,
    /// http://HOST:PORT (an outbox-lab consumer, POST /events) or redis://HOST:PORT (streams
    /// outbox.event.<aggregate_type>).
    #[arg(long)]
    sink: String,
    #[arg(long, value_enum, default_value = "poll")]
    mode: RelayMode,
    /// The poll interval, or the fallback poll with --mode notify.
    #[arg(long, default_value_t = 1000)]
    interval_ms: u64,
    /// i/N: only aggregates with abs(hashtext(aggregate_id)) % N = i (N relays, one each).
    #[arg(long)]
    partition: Option<Partition>,
    /// Hold an aggregate's later events back while an earlier one is undelivered.
    #[arg(long)]
    guard: bool,
    /// Rows per fetch.
    #[arg(long, default_value_t = 100)]
    batch: i64,
    /// Aggregates delivered to at once over HTTP (per-aggregate order holds).
    #[arg(long, default_value_t = 1)]
    in_flight: usize,
    /// Names the relay in logs, metrics and pg_stat_activity.
    #[arg(long, default_value = "0")]
    name: String,
    /// Serve Prometheus metrics on ADDR/metrics.
    #[arg(long)]
    metrics_listen: Option<std::net::SocketAddr>,
    #[arg(long, value_enum, default_value = "text")]
    log_format: LogFormat,
}

#[derive(Debug, Args)]
struct ConsumerArgs {
    /// Where to serve POST /events (port 0: any free port, printed at start).
    #[arg(long)]
    listen: std::net::SocketAddr,
    /// The database with the consumer's tables (schema consumer).
    #[arg(long, env = "OUTBOX_LAB_DATABASE_URL")]
    database_url: String,
    /// Ship each event once, however often it arrives (dedup by event_id).
    #[arg(long)]
    idempotent: bool,
    /// Create the consumer's tables if they are missing.
    #[arg(long)]
    create_schema: bool,
    #[arg(long, value_enum, default_value = "text")]
    log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Text,
    Json,
}

/// Where a run happens and where its results go (`scenario` and `explore`).
#[derive(Debug, Args)]
pub struct RunArgs {
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,
    /// Use this PostgreSQL server instead of a throwaway cluster; outbox-lab creates and drops
    /// only databases named outboxlab_* there.
    #[arg(long, env = "OUTBOX_LAB_DATABASE_URL")]
    pub database_url: Option<String>,
    /// Leave the throwaway cluster and the run's databases in place, and print how to reach them.
    #[arg(long)]
    pub keep: bool,
    /// Directory with initdb and postgres (default: PATH, then /usr/lib/postgresql/*/bin).
    #[arg(long, env = "OUTBOX_LAB_PG_BIN")]
    pub pg_bin: Option<PathBuf>,
    /// Where each run writes `<run-id>/<name>.json`, its tables as CSV, and report.html.
    #[arg(long, default_value = "results")]
    pub results_dir: PathBuf,
}

#[derive(Debug, Args)]
struct ScenarioArgs {
    /// Scenario name (see `outbox-lab list`), or `all`.
    name: String,
    #[command(flatten)]
    run: RunArgs,
    /// Use this Redis instead of a private redis-server; outbox-lab only touches keys named
    /// outboxlab:<run>:* there.
    #[arg(long, env = "OUTBOX_LAB_REDIS_URL")]
    redis_url: Option<String>,
    /// Read scenario files from this directory instead of the built-in copies.
    #[arg(long)]
    scenarios_dir: Option<PathBuf>,
    /// No progress bars and no note on stderr where the results went; errors still show.
    #[arg(long, short)]
    quiet: bool,
    /// Set a scenario parameter (see its file in scenarios/), e.g. --set orders=10; repeatable.
    #[arg(long = "set", value_name = "NAME=VALUE", value_parser = parse_assignment)]
    set: Vec<(String, toml::Value)>,
    /// A shorter run with the scenario file's [quick] parameters.
    #[arg(long)]
    quick: bool,
    /// relay-crash: number of events.
    #[arg(long)]
    events: Option<u32>,
    /// relay-crash: the first relay dies after this many deliveries.
    #[arg(long)]
    crash_after: Option<u32>,
}

#[derive(Debug, Args)]
struct PruneArgs {
    /// The database of the partitioned outbox.
    #[arg(long, env = "OUTBOX_LAB_DATABASE_URL")]
    database_url: String,
    /// Prune partitions whose range ended at least this long ago: 3d, 12h, 90m, 30s.
    #[arg(long, value_name = "AGE")]
    older_than: String,
    /// The partitioned outbox (daily RANGE partitions on created_at, as the article's).
    #[arg(long, default_value = "outbox_p")]
    table: String,
    /// Say what would be dropped and kept; change nothing.
    #[arg(long)]
    dry_run: bool,
}

impl Cli {
    /// Child processes are one actor each: a single-threaded runtime wakes them without a hop
    /// between threads, which is most of a NOTIFY-woken relay's latency budget.
    pub fn wants_single_thread(&self) -> bool {
        matches!(self.command, Command::Child(_))
    }
}

/// An error that ends the run with its own exit status.
#[derive(Debug, thiserror::Error)]
#[error("interrupted by {0}; cleaned up")]
pub struct Interrupted(&'static str);

pub async fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::List => list(),
        Command::Scenario(args) => scenario(args).await,
        Command::Explore(args) => explore::command(args).await,
        Command::Check { database_url } => check(&database_url).await,
        Command::Report { dir } => report(&dir),
        Command::Compare { a, b } => compare(&a, &b),
        Command::Completions { shell } => completions(shell),
        Command::CrashPoints => crash_points(),
        Command::Requeue { database_url } => requeue(&database_url).await,
        Command::Prune(args) => prune(args).await,
        Command::Relay(args) => {
            logging::init(args.log_format);
            let interval = Duration::from_millis(args.interval_ms);
            let options = RelayOptions {
                database_url: args.database_url,
                sink: args.sink,
                name: args.name,
                wakeup: match args.mode {
                    RelayMode::Poll => Wakeup::Poll(interval),
                    RelayMode::Notify => Wakeup::Notify { fallback: interval },
                },
                config: RelayConfig {
                    batch: args.batch,
                    partition: args.partition,
                    head_of_line_guard: args.guard,
                    ..RelayConfig::default()
                },
                in_flight: args.in_flight,
                stream_prefix: String::new(),
                metrics_listen: args.metrics_listen,
            };
            standalone::run_relay(options, async {
                interrupted().await;
            })
            .await?;
            Ok(ExitCode::from(exit::OK))
        }
        Command::Consumer(args) => {
            logging::init(args.log_format);
            let kind = if args.idempotent {
                ConsumerKind::Idempotent
            } else {
                ConsumerKind::Naive
            };
            let shutdown = async {
                interrupted().await;
            };
            standalone::run_consumer(
                &args.database_url,
                args.listen,
                kind,
                args.create_schema,
                shutdown,
            )
            .await?;
            Ok(ExitCode::from(exit::OK))
        }
        Command::Clean { database_url } => clean(database_url.as_deref()).await,
        Command::Child(args) => {
            child::run_role(args).await?;
            Ok(ExitCode::from(exit::OK))
        }
    }
}

/// `outbox-lab clean`: what was removed, and what was left and why.
async fn clean(database_url: Option<&str>) -> Result<ExitCode> {
    for cleaned in throwaway::clean() {
        match cleaned {
            throwaway::Cleaned::Removed(dir) => println!("removed {}", dir.display()),
            throwaway::Cleaned::InUse(dir) => {
                println!("left {}: its run is still going", dir.display())
            }
            throwaway::Cleaned::Left(dir, why) => println!("left {}: {why}", dir.display()),
        }
    }
    if let Some(url) = database_url {
        for cleaned in db::clean_databases(url).await? {
            match cleaned {
                db::CleanedDatabase::Dropped(name) => println!("dropped database {name}"),
                db::CleanedDatabase::InUse(name) => {
                    println!("left database {name}: its run is still going, or it is in use")
                }
            }
        }
    }
    Ok(ExitCode::from(exit::OK))
}

/// The scenarios under the article's section headings, in the article's order.
fn list() -> Result<ExitCode> {
    let specs = Scenario::ALL
        .iter()
        .map(|s| s.spec(None))
        .collect::<Result<Vec<_>>>()?;
    let width = specs.iter().map(|s| s.name.len()).max().unwrap_or(0);
    let mut section = None;
    for spec in &specs {
        if section != Some(&spec.section) {
            if section.is_some() {
                println!();
            }
            println!("{}", spec.section);
            section = Some(&spec.section);
        }
        println!("  {:width$}  {}", spec.name, spec.summary);
    }
    println!("\nRun one with `outbox-lab scenario NAME`, or all with `outbox-lab scenario all`.");
    Ok(ExitCode::from(exit::OK))
}

/// The script goes through a buffer: clap_complete panics on a write error, and a reader that
/// stops early (`| head`) is not an error.
fn completions(shell: Shell) -> Result<ExitCode> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "outbox-lab", &mut script);
    match std::io::stdout().write_all(&script) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(anyhow::Error::new(e).context("cannot write the completion script"))
        }
        _ => Ok(ExitCode::from(exit::OK)),
    }
}

fn report(dir: &Path) -> Result<ExitCode> {
    let reports = report::read_run(dir)?;
    for report in &reports {
        println!("{}", report.render_text());
    }
    println!("{}", summary(&reports));
    let page = html::write(dir, &reports)?;
    eprintln!("page written to {}", page.display());
    Ok(ExitCode::from(exit::OK))
}

fn compare(a: &Path, b: &Path) -> Result<ExitCode> {
    let (runs_a, runs_b) = (report::read_run(a)?, report::read_run(b)?);
    println!("A = {}\nB = {}\n", a.display(), b.display());
    for table in compare::compare(&runs_a, &runs_b) {
        println!("{}\n{}\n", table.title, table.render());
    }
    Ok(ExitCode::from(exit::OK))
}

fn crash_points() -> Result<ExitCode> {
    let mut table = Table::new(
        "crash points",
        &["crash point", "in", "a crash there leaves"],
    );
    for point in CrashPoint::ALL {
        table.push(vec![
            point.name().into(),
            point.location().into(),
            point.meaning().into(),
        ]);
    }
    println!("{}", table.render());
    println!("\nA child dies there with _exit(1) when started with --crash-at NAME@N (N-th pass).");
    Ok(ExitCode::from(exit::OK))
}

async fn check(database_url: &str) -> Result<ExitCode> {
    let client = db::connect(&db::parse_url(database_url)?).await?;
    for table in ["outbox", "consumer.shipments"] {
        if !schema::has_table(&client, table).await? {
            bail!("this database has no {table} table: check judges a database with the outbox and the consumer's tables");
        }
    }
    let violations = checker::check_live(&client).await?;
    let pending = counts::count(&client, counts::UNPUBLISHED).await?;
    let mut table = Table::new(
        "invariants",
        &["invariant", "violations", "offending (first 10)"],
    );
    for invariant in Invariant::ALL
        .into_iter()
        .filter(|i| *i != Invariant::Liveness)
    {
        let ids = violations
            .get(&invariant)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let first: Vec<&str> = ids.iter().take(10).map(String::as_str).collect();
        table.push(vec![
            invariant.name().into(),
            ids.len().to_string(),
            first.join(", "),
        ]);
    }
    println!("{}", table.render());
    if pending > 0 {
        println!(
            "{pending} outbox rows are pending (not marked published): a relay still owes them, \
             so they are not counted as lost; check again once the relays have drained"
        );
    }
    Ok(ExitCode::from(if violations.is_empty() {
        println!("clean: no ghost, lost, duplicate or out-of-order shipment");
        exit::OK
    } else {
        exit::CHECK_FAILED
    }))
}

async fn requeue(database_url: &str) -> Result<ExitCode> {
    let client = db::connect(&db::parse_url(database_url)?).await?;
    let rows = relay::requeue(&client).await?;
    println!("requeued {rows} undelivered outbox rows");
    Ok(ExitCode::from(exit::OK))
}

async fn prune(args: PruneArgs) -> Result<ExitCode> {
    let older_than: Age = args
        .older_than
        .parse()
        .map_err(|e| anyhow::anyhow!("--older-than: {e}"))?;
    let mut client = db::connect(&db::parse_url(&args.database_url)?).await?;
    let pruned = partitions::prune(&mut client, &args.table, older_than, args.dry_run).await?;
    if pruned.is_empty() {
        println!(
            "nothing to prune: no partition of {} ended {} ago or earlier",
            args.table, args.older_than
        );
    }
    for p in &pruned {
        match p.action {
            Action::Kept => eprintln!("outbox-lab: warning: {p}"),
            _ => println!("{p}"),
        }
    }
    if args.dry_run {
        println!("dry run: nothing was changed");
    }
    Ok(ExitCode::from(exit::OK))
}

async fn scenario(args: ScenarioArgs) -> Result<ExitCode> {
    let selected = match args.name.as_str() {
        "all" => Scenario::ALL.to_vec(),
        name => vec![Scenario::from_name(name)?],
    };
    let mut overrides = Overrides {
        quick: args.quick,
        values: args.set.clone(),
        strict: selected.len() == 1,
    };
    if let Some(events) = args.events {
        overrides
            .values
            .push(("events".into(), toml::Value::Integer(events.into())));
    }
    if let Some(crash_after) = args.crash_after {
        overrides.values.push((
            "crash_after".into(),
            toml::Value::Integer(crash_after.into()),
        ));
    }
    // Everything is read and validated before a server is started: bad input leaves nothing.
    let prepared = selected
        .iter()
        .map(|s| scenarios::prepare(*s, args.scenarios_dir.as_deref(), &overrides))
        .collect::<Result<Vec<_>>>()?;

    let run_id = new_run_id();
    // Redis starts only if a scenario asks for it; it is closed however the runs end.
    let redis = Redis::new(args.redis_url.as_deref(), &run_id, args.run.keep);
    let results = args.run.results_dir.join(&run_id);
    let progress = Progress::on_stderr(args.run.format == Format::Text && !args.quiet);
    let outcome = on_server(&args.run, &run_id, async |server: &PgServer| {
        let mut reports = Vec::new();
        let bar = progress.bar(prepared.len() as u64, "scenarios");
        for p in &prepared {
            bar.set_message(p.scenario().name());
            let report = scenarios::run(server, &redis, p, &progress).await?;
            report.write_files(&results)?;
            if args.run.format == Format::Text {
                progress.suspend(|| println!("{}", report.render_text()));
            }
            reports.push(report);
            // After every scenario: a run stopped halfway still leaves a page of what it has.
            html::write(&results, &reports)?;
            bar.inc(1);
        }
        bar.finish_and_clear();
        Ok(reports)
    })
    .await;
    let closed = redis.close().await;
    let reports = outcome?;
    closed?;

    let passed = reports.iter().all(Report::passed);
    match args.run.format {
        Format::Json if reports.len() == 1 => {
            println!("{}", serde_json::to_string_pretty(&reports[0])?)
        }
        Format::Json => println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "run_id": run_id,
                "passed": passed,
                "scenarios": reports,
            }))?
        ),
        Format::Text => {
            if reports.len() > 1 {
                println!("{}", summary(&reports));
            }
            if !args.quiet {
                eprintln!(
                    "results written to {}; the page: {}",
                    results.display(),
                    results.join(html::PAGE_FILE).display()
                );
            }
        }
    }
    Ok(ExitCode::from(if passed {
        exit::OK
    } else {
        exit::CHECK_FAILED
    }))
}

/// A run's id: when it started (UTC) and which process ran it, e.g. `20261202-153635-38f9`.
pub fn new_run_id() -> String {
    format!(
        "{}-{:04x}",
        chrono::Utc::now().format("%Y%m%d-%H%M%S"),
        std::process::id() & 0xffff
    )
}

/// Opens the run's server, does `work` on it, and closes it (dropping what the run created),
/// also when Ctrl-C or SIGTERM ends the work.
pub async fn on_server<T>(
    run: &RunArgs,
    run_id: &str,
    work: impl AsyncFnOnce(&PgServer) -> Result<T>,
) -> Result<T> {
    let choice = ServerChoice {
        database_url: run.database_url.as_deref(),
        pg_bin: run.pg_bin.as_deref(),
        keep: run.keep,
    };
    let server = tokio::select! {
        server = PgServer::open(&choice, run_id) => server?,
        by = interrupted() => return Err(Interrupted(by).into()),
    };
    let outcome = tokio::select! {
        outcome = work(&server) => outcome,
        by = interrupted() => Err(Interrupted(by).into()),
    };
    let closed = server.close().await;
    let outcome = outcome?;
    closed?;
    Ok(outcome)
}

/// The run's summary table and its count of passed checks.
fn summary(reports: &[Report]) -> String {
    let checks: usize = reports.iter().map(|r| r.checks.len()).sum();
    let passed: usize = reports.iter().map(Report::passed_count).sum();
    let table = report::summary_table(reports);
    format!(
        "{}\n{}\n{passed} of {checks} checks pass in {} scenarios",
        table.title,
        table.render(),
        reports.len()
    )
}

/// `name=value`: the value as TOML (`10`, `0.5`, `true`, `[1, 2]`), else as a string.
fn parse_assignment(text: &str) -> Result<(String, toml::Value), String> {
    let (name, value) = text
        .split_once('=')
        .ok_or_else(|| format!("'{text}' is not NAME=VALUE"))?;
    let value = toml::from_str::<toml::Table>(&format!("v = {value}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(value.to_string()));
    Ok((name.trim().replace('-', "_"), value))
}

/// Resolves on Ctrl-C or SIGTERM, naming the signal.
async fn interrupted() -> &'static str {
    let mut term = match signal(SignalKind::terminate()) {
        Ok(term) => term,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => "SIGINT",
        _ = term.recv() => "SIGTERM",
    }
}

/// The message of an error, cause chain included, on one line.
pub fn one_line(error: &anyhow::Error) -> String {
    format!("{error:#}").replace('\n', " ")
}

/// Maps an error to its exit status.
pub fn exit_status(error: &anyhow::Error) -> u8 {
    if error.downcast_ref::<Interrupted>().is_some() {
        exit::INTERRUPTED
    } else {
        exit::USAGE
    }
}
