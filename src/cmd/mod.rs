//! The command line: the clap [`Cli`], the argument groups the subcommands share, and the
//! dispatch to one file per subcommand. Exit statuses and the errors that choose them are in
//! [`crate::error`]; a run's server and its Ctrl-C handling in [`crate::harness::run`].
//!
//! Everything a command prints on stdout goes through [`outln!`]: a reader that stops early
//! (`outbox-lab list | head -1`) ends the command quietly with status 0 instead of a panic, and
//! no password is shown ([`crate::secrets::redact`]).

mod check;
mod child;
mod clean;
mod compare;
mod completions;
mod consumer;
mod crash_points;
mod explore;
mod list;
mod prune;
mod relay;
mod report;
mod requeue;
mod scenario;
mod verify;
mod zoo;

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand;
use clap::{Args, Parser, Subcommand, ValueEnum};
use clap_complete::Shell;

use crate::error::{self, exit};
use crate::harness::child::ChildArgs;
use crate::harness::db::ServerChoice;
use crate::report::plots::Plot;
use crate::report::Report;
use crate::scenarios::Scenario;

/// `println!` that returns its error instead of panicking: `outln!("{x}")?`. A closed stdout
/// (`| head`) is [`error::Error::StdoutClosed`], a quiet exit 0.
macro_rules! outln {
    () => {
        $crate::cmd::write_stdout(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::cmd::write_stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}
use outln;

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
  outbox-lab verify --relay-cmd 'python3 examples/relays/article.py' --relays 2
  outbox-lab zoo
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
  outbox-lab scenario dual-write,relay-crash --quick
  outbox-lab scenario all --keep        # leave the cluster running for psql
  outbox-lab scenario all --quiet 2>/dev/null > run.txt

The scenarios that time nothing (side_by_side in their file) run first, up to 4 at once; the
others then one at a time, the machine theirs alone.

Every run writes results/<run-id>/: <scenario>.json, a CSV per table, and report.html (the
page with every table, check and plot). Progress bars appear on stderr only when it is a
terminal, and never with --quiet or --format json.

Exit status: 0 every check passed, 1 a check failed, 2 bad input or environment, 3 the harness
failed mid-run.")]
    Scenario(scenario::ScenarioArgs),
    /// Every crash point against every design, judged by an invariant checker.
    #[command(after_help = explore::EXAMPLES)]
    Explore(explore::ExploreArgs),
    /// Your relay (any command, any language) under the same nemeses and checker.
    #[command(after_help = verify::examples())]
    Verify(verify::VerifyArgs),
    /// Outbox libraries nobody here wrote (examples/zoo), each under verify, side by side.
    #[command(after_help = zoo::EXAMPLES)]
    Zoo(zoo::ZooArgs),
    /// Print a saved run's tables again and rewrite its report.html, without rerunning anything;
    /// several runs make one page (in the first run's directory).
    #[command(after_help = "Examples:
  outbox-lab report results/20261202-153635-38f9
  xdg-open results/20261202-153635-38f9/report.html
  outbox-lab report results/<scenario all's run> results/<zoo's run>   # one page for both")]
    Report {
        /// Runs' directories, as written by `outbox-lab scenario`, `verify` or `zoo`
        /// (results/<run-id>).
        #[arg(required = true, num_args = 1..)]
        dirs: Vec<PathBuf>,
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
    /// Give dead letters their attempts back (the article's UPDATE outbox SET attempts = 0 ...),
    /// only rows at the attempt limit: rows under retry keep their backoff, rows a relay holds
    /// are skipped.
    #[command(after_help = "Example:
  outbox-lab requeue --database-url postgres://user@host/shop")]
    Requeue {
        /// The database whose `outbox` table to requeue.
        #[arg(long, env = "OUTBOX_LAB_DATABASE_URL", hide_env_values = true)]
        database_url: String,
        /// The relays' attempt limit: rows with this many attempts or more are dead letters.
        #[arg(long, default_value_t = crate::outbox::relay::DEFAULT_MAX_ATTEMPTS,
              value_parser = clap::value_parser!(i32).range(1..))]
        max_attempts: i32,
    },
    /// Detach and drop the daily partitions of a partitioned outbox older than a cutoff; a
    /// partition that still holds an unpublished row is kept and reported, never dropped.
    #[command(after_help = "Examples:
  outbox-lab prune --database-url postgres://user@host/shop --older-than 3d --dry-run
  outbox-lab prune --database-url postgres://user@host/shop --older-than 3d

A partition is pruned when its whole range ends at least that long ago (3d, 12h, 90m, 30s).
Each one is checked first (SELECT count(*) ... WHERE published_at IS NULL, under a lock);
exit status 0 even when one is kept: kept partitions are reported on stderr.")]
    Prune(prune::PruneArgs),
    /// Run a relay against your own database until SIGTERM or Ctrl-C (it finishes its batch).
    #[command(after_help = "Examples:
  outbox-lab relay --database-url postgres://user@host/shop --sink http://10.0.0.5:8080
  outbox-lab relay --database-url postgres://user@host/shop --sink redis://10.0.0.6:6379 \\
      --mode notify --partition 0/2 --metrics-listen 0.0.0.0:9187 --log-format json")]
    Relay(relay::RelayArgs),
    /// Judge a database that relays and consumers worked on: ghost, lost, duplicate and
    /// out-of-order shipments, with the offending ids (exit 1 if any).
    #[command(
        after_help = "Examples (after `outbox-lab relay` and `outbox-lab consumer` ran on it):
  outbox-lab check --database-url postgres://user@host/shop
  outbox-lab check --database-url postgres://user@db/shop \\
      --consumer-database-url postgres://user@db2/shipping"
    )]
    Check {
        /// The application's database: orders and the outbox (and the consumer's tables,
        /// unless --consumer-database-url says where they are).
        #[arg(long, env = "OUTBOX_LAB_DATABASE_URL", hide_env_values = true)]
        database_url: String,
        /// The consumer's database, when it is not the application's (several hosts): its
        /// consumer.* tables are judged against the application's orders and outbox.
        #[arg(long, env = "OUTBOX_LAB_CONSUMER_DATABASE_URL", hide_env_values = true)]
        consumer_database_url: Option<String>,
    },
    /// Run the HTTP consumer against your own database until SIGTERM or Ctrl-C.
    #[command(after_help = "Example:
  outbox-lab consumer --listen 0.0.0.0:8080 --database-url postgres://user@host/shipping \\
      --idempotent --create-schema")]
    Consumer(consumer::ConsumerArgs),
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
    #[arg(long, env = "OUTBOX_LAB_DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// Leave the throwaway cluster and the run's databases in place, and print how to reach them.
    #[arg(long)]
    pub keep: bool,
    /// Directory with initdb and postgres (default: PATH, then /usr/lib/postgresql/*/bin).
    #[arg(long, env = "OUTBOX_LAB_PG_BIN", value_parser = from_here)]
    pub pg_bin: Option<PathBuf>,
    /// Where each run writes `<run-id>/<name>.json`, its tables as CSV, and report.html.
    #[arg(long, default_value = "results", value_parser = from_here)]
    pub results_dir: PathBuf,
}

/// A path as given, made absolute against the directory outbox-lab was started in: the
/// servers it starts work elsewhere, and a relative path must still mean what the user meant.
fn from_here(path: &str) -> Result<PathBuf, String> {
    std::path::absolute(path).map_err(|e| format!("{path}: {e}"))
}

impl RunArgs {
    /// The server this run works on.
    fn server_choice(&self) -> ServerChoice<'_> {
        ServerChoice {
            database_url: self.database_url.as_deref(),
            pg_bin: self.pg_bin.as_deref(),
            keep: self.keep,
            commit_timestamps: false,
            fake_clock: false,
        }
    }
}

impl Cli {
    /// Child processes are one actor each: a single-threaded runtime wakes them without a hop
    /// between threads, which is most of a NOTIFY-woken relay's latency budget.
    fn wants_single_thread(&self) -> bool {
        matches!(self.command, Command::Child(_))
    }
}

/// The whole program: parses the command line, runs the command on its runtime and turns its
/// end into the exit status. It lives in the library, not in `main.rs`: an async call tree is
/// compiled where it is polled, and polled from the binary it was compiled a second time there
/// (49 s of a cold release build).
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // --help and --version (stdout, status 0), and the help shown for a bare `outbox-lab`.
        Err(e) if !e.use_stderr() || e.kind() == DisplayHelpOnMissingArgumentOrSubcommand => {
            e.exit()
        }
        Err(e) => {
            crate::errln!("outbox-lab: error: {}", error::clap_one_line(&e));
            return ExitCode::from(exit::USAGE);
        }
    };
    let mut builder = if cli.wants_single_thread() {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            crate::errln!("outbox-lab: error: cannot start the async runtime: {e}");
            return ExitCode::from(exit::USAGE);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(error) => {
            let status = error::exit_status(&error);
            // A reader that stopped early (`| head`) is no failure: nothing to say.
            if status != exit::OK {
                crate::errln!("outbox-lab: error: {}", error::one_line(&error));
            }
            ExitCode::from(status)
        }
    }
}

async fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::List => list::run(),
        Command::Scenario(args) => scenario::run(args).await,
        Command::Explore(args) => explore::run(args).await,
        Command::Verify(args) => verify::run(args).await,
        Command::Zoo(args) => zoo::run(args).await,
        Command::Check {
            database_url,
            consumer_database_url,
        } => check::run(&database_url, consumer_database_url.as_deref()).await,
        Command::Report { dirs } => report::run(&dirs),
        Command::Compare { a, b } => compare::run(&a, &b),
        Command::Completions { shell } => completions::run(shell),
        Command::CrashPoints => crash_points::run(),
        Command::Requeue {
            database_url,
            max_attempts,
        } => requeue::run(&database_url, max_attempts).await,
        Command::Prune(args) => prune::run(args).await,
        Command::Relay(args) => relay::run(args).await,
        Command::Consumer(args) => consumer::run(args).await,
        Command::Clean { database_url } => clean::run(database_url.as_deref()).await,
        Command::Child(args) => child::run(args).await,
    }
}

/// The end of a judged run (explore, verify): its files and page in `results_dir`, the report
/// on stdout (`render` for a terminal, JSON), and the exit status its checks decide.
fn finish_run(
    report: &Report,
    results_dir: &std::path::Path,
    format: Format,
    render: impl FnOnce(&Report) -> String,
) -> Result<ExitCode> {
    report.write_files(results_dir)?;
    crate::report::html::write(results_dir, std::slice::from_ref(report), plots)?;
    match format {
        Format::Json => outln!("{}", serde_json::to_string_pretty(report)?)?,
        Format::Text => {
            outln!("{}", render(report))?;
            crate::errln!(
                "results, histories and report.html written to {}",
                results_dir.display()
            );
        }
    }
    Ok(ExitCode::from(if report.passed() {
        error::exit::OK
    } else {
        error::exit::CHECK_FAILED
    }))
}

/// A result's plots on the report page, drawn by what made it: its scenario, or explore and
/// verify (the results that are no scenario's). The page only lays out what it is handed.
fn plots(report: &Report) -> Result<Vec<Plot>> {
    match Scenario::find(&report.scenario) {
        Some(scenario) => scenario.plots(report),
        None if report.scenario == "verify" => crate::verify::plots::for_report(report),
        None if report.scenario == "zoo" => Ok(Vec::new()),
        None => crate::explore::plots::for_report(report),
    }
}

/// Writes to stdout, as `print!` does, its secrets masked, but returns the error (see
/// [`outln!`]).
pub fn write_stdout(text: std::fmt::Arguments) -> Result<()> {
    let text = crate::secrets::redact(&text.to_string());
    error::stdout_write(std::io::stdout().lock().write_all(text.as_bytes()))
}
