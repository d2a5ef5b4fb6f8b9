//! `outbox-lab zoo`: its arguments, the run's server, and what it prints; the entries, their
//! runs and the table are [`crate::zoo`].

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::Args;

use super::{outln, Format, RunArgs};
use crate::explore::history;
use crate::harness::db::{PgServer, ServerChoice};
use crate::harness::nemesis::parse_duration;
use crate::harness::run::{new_run_id, on_server};
use crate::harness::run_as::RunAs;
use crate::report::Environment;
use crate::zoo::entry::{ClockStep, Entry, ZooRun, OUTSIDE_SUFFIX, ZOO_DIR};
use crate::zoo::{self, table, Outcome, Settings};

pub const EXAMPLES: &str = "\
Examples:
  scripts/setup --zoo && outbox-lab zoo          # every entry of examples/zoo
  outbox-lab zoo txoutbox pg_boss                # two of them
  outbox-lab zoo --documented                    # each entry's documented run only (short)
  outbox-lab zoo distributed_outbox --clocks     # also under its clocks stepped a minute
  outbox-lab zoo --list
  outbox-lab zoo --citations                     # each entry's citations, in its installed package
  outbox-lab zoo --format json > zoo.json
  outbox-lab zoo --markdown > table.md           # the README's table

Each entry (examples/zoo/<name>/zoo.toml) runs its library's own relay loop, unmodified, through
`outbox-lab verify`: its documented run (one schedule, the verdict its entry wrote down), every
nemesis its sink allows with the naive consumer and with the idempotent one (a violation is run
again under each nemesis alone, for the smallest schedule), and one run without faults for
latency and throughput. The table counts, per invariant, the faulted runs that broke it; *
marks what the library promises (no ghost, none lost, liveness; order where its documentation
says so). A duplicate is the consumer's to absorb: it shows with the naive consumer.

Exit status: 0 every entry that is installed ran and its documented verdict was reproduced
(findings about a library are the table, not a failure); 1 an entry could not run, or its
documented run broke something else; 2 bad input (an unknown entry, a malformed zoo.toml), or
no entry is installed (scripts/setup --zoo); 3 the harness failed mid-run.";

#[derive(Debug, Args)]
pub struct ZooArgs {
    /// The entries to run (folder names under examples/zoo); all when none is given.
    #[arg(value_name = "NAME")]
    names: Vec<String>,
    /// Run each entry's documented run only: its one schedule, its verdict held against the
    /// one its entry wrote down.
    #[arg(long)]
    documented: bool,
    /// List the entries (library, version, registry, installed or not) and exit.
    #[arg(long)]
    list: bool,
    /// Check each entry's citations of its library's source against the installed package
    /// (each `[[cite]]`'s quote on its lines, every citation of its prose declared) and exit:
    /// 1 when one does not hold.
    #[arg(long, conflicts_with = "list")]
    citations: bool,
    /// Print the zoo table as the README shows it (markdown: an entry a row, its counts, its
    /// verdict, its latency without faults) instead of the text tables.
    #[arg(long, conflicts_with_all = ["list", "citations"])]
    markdown: bool,
    /// Events of each faulted and fault-free run (two per order).
    #[arg(long, default_value_t = 400, value_name = "N",
          value_parser = clap::value_parser!(u32).range(10..=100_000))]
    events: u32,
    /// How many times each faulted run is made (naive and idempotent consumer): each cell of
    /// the table is then k of 2 × N runs.
    #[arg(long, default_value_t = 1, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=20))]
    runs: u32,
    /// The bound of each of an entry's verifications, shrinking included.
    #[arg(long, default_value = "90s", value_name = "DURATION", value_parser = parse_duration)]
    time_limit: Duration,
    /// Also search each entry: draw N schedules from the nemesis grammar (naive consumer) and
    /// run them until one breaks a promise of its library, shrunk, with its replay.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1000))]
    search: Option<u32>,
    /// Also fail each entry's database over: a primary with a synchronous streaming standby,
    /// the primary's machine killed and the standby promoted under the library's relay
    /// (db:failover@250ms, the idempotent consumer): the failover table.
    #[arg(long)]
    failover: bool,
    /// Also step each entry's clocks, one run a step, nothing else (naive consumer): relay 0's
    /// wall clock a minute ahead, a minute behind, and the database server's a minute ahead
    /// (not with --database-url): the clocks table. A step breaks a promise in the verdict
    /// only where it broke it in each of its --runs.
    #[arg(long)]
    clocks: bool,
    /// The search's seed: the same seed draws the same schedules.
    #[arg(long, default_value_t = 1, value_name = "S", requires = "search")]
    seed: u64,
    /// How many entries run side by side, each on a throwaway cluster of its own (with
    /// --database-url, one at a time).
    #[arg(long, default_value_t = 2, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=8))]
    jobs: u32,
    /// Where the entries are.
    #[arg(long, default_value = ZOO_DIR, value_name = "DIR")]
    zoo_dir: PathBuf,
    /// Run the libraries' relays as this unprivileged user, one entry at a time (when
    /// outbox-lab runs as root they never run as root: by default each run's relays as a uid
    /// of their own). Not root, not the servers' user, and one that runs nothing else.
    #[arg(long, value_name = "USER")]
    run_as: Option<String>,
    #[command(flatten)]
    run: RunArgs,
}

/// `zoo --citations`: each entry's citations that do not hold, one a line, and how many do.
fn check_citations(entries: &[Entry]) -> Result<ExitCode> {
    let mut wrong = 0;
    // An `_outside` row shares its entry's folder and citations.
    for entry in entries.iter().filter(|e| !e.name.ends_with(OUTSIDE_SUFFIX)) {
        let problems = entry.citation_problems()?;
        for problem in &problems {
            outln!("{}: {problem}", entry.name)?;
        }
        let upstream = entry
            .citations
            .iter()
            .filter(|c| c.upstream.is_some())
            .count();
        outln!(
            "{}: {} citations ({upstream} upstream, read by hand), {} problems",
            entry.name,
            entry.citations.len(),
            problems.len()
        )?;
        wrong += problems.len();
    }
    Ok(match wrong {
        0 => ExitCode::SUCCESS,
        _ => ExitCode::from(1),
    })
}

/// `outbox-lab zoo`.
pub async fn run(args: ZooArgs) -> Result<ExitCode> {
    let entries = Entry::find(&args.zoo_dir, &args.names)?;
    if args.list {
        for entry in &entries {
            outln!(
                "{:<26} {} {} ({}{}, {}){}",
                entry.name,
                entry.library,
                entry.version,
                entry.registry,
                match entry.outside_rules {
                    Some(_) => ", OUTSIDE ITS DOCUMENTED RULES",
                    None => "",
                },
                entry.promise,
                match entry.is_installed() {
                    true => "",
                    false => "  [not installed: scripts/setup --zoo]",
                }
            )?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    if args.citations {
        return check_citations(&entries);
    }
    if entries.is_empty() {
        bail!("no zoo entry in {}", args.zoo_dir.display());
    }
    if !entries.iter().any(Entry::is_installed) {
        bail!("no zoo entry is installed here: run scripts/setup --zoo, then again");
    }
    let mut runs = match args.documented {
        true => vec![ZooRun::Documented],
        false => ZooRun::ALL.to_vec(),
    };
    if args.search.is_some() {
        runs.push(ZooRun::Search);
    }
    if args.failover {
        runs.push(ZooRun::Failover);
    }
    if args.clocks {
        let steps = ClockStep::available(args.run.database_url.is_some());
        runs.extend(steps.into_iter().map(ZooRun::Clock));
    }
    let settings = Settings {
        events: args.events,
        time_limit: args.time_limit,
        external_server: args.run.database_url.is_some(),
        runs: args.runs,
        search: args.search.map(|count| (count, args.seed)),
    };
    // Every entry's runs are planned before a server starts: bad input leaves nothing behind.
    let run_as = RunAs::resolve(args.run_as.as_deref())?;
    let planned = zoo::plan(entries, &runs, settings, run_as.as_ref())?;
    let run_id = new_run_id();
    let results_dir = args.run.results_dir.join(&run_id);
    let started_at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let clock = std::time::Instant::now();
    let choice = ServerChoice {
        commit_timestamps: true,
        ..args.run.server_choice()
    };
    let progress = args.run.format == Format::Text;
    // A lane per server: on the throwaway cluster, entries run side by side on clusters of
    // their own; on the user's server, one after another; as a --run-as user too (its relays'
    // processes are all ended when a run ends, so one run at a time is its).
    let lanes = match (&args.run.database_url, &run_as) {
        (Some(_), _) | (_, Some(RunAs::Named(_))) => 1,
        _ => args.jobs as usize,
    };
    let lanes = zoo::deal(planned, lanes).into_iter().map(|lane| {
        let (choice, run_id, results_dir) = (&choice, &run_id, &results_dir);
        on_server(choice, run_id, async move |server: &PgServer| {
            let (places, planned): (Vec<usize>, Vec<_>) = lane.into_iter().unzip();
            let results = zoo::run(server, run_id, planned, progress).await?;
            for result in &results {
                if let Outcome::Ran(judged) = &result.outcome {
                    for judged in judged {
                        let run = judged.run;
                        let name = format!(
                            "zoo-{}-{}{}",
                            result.entry.name,
                            run.label(),
                            run.take_label(judged.take)
                        );
                        history::save(results_dir, &name, &judged.verification.histories())?;
                    }
                }
            }
            let placed: Vec<_> = places.into_iter().zip(results).collect();
            Ok((placed, server.version.clone(), server.kind()))
        })
    });
    // Every lane ends (its server closed) before an error of one ends the zoo.
    let mut placed = Vec::new();
    let mut server = None;
    for lane in futures_util::future::join_all(lanes).await {
        let (results, version, kind) = lane?;
        placed.extend(results);
        server.get_or_insert((version, kind));
    }
    placed.sort_by_key(|(place, _)| *place);
    let results: Vec<_> = placed.into_iter().map(|(_, result)| result).collect();
    let (version, kind) = server.expect("at least one lane");
    let report = table::report(
        &results,
        settings,
        Environment {
            postgres_version: version,
            outbox_lab_version: env!("CARGO_PKG_VERSION").to_string(),
            started_at,
            elapsed_ms: clock.elapsed().as_millis() as u64,
            server: kind.to_string(),
        },
    );
    // The README's table is pasted from this.
    let markdown = match args.markdown {
        true => Some(table::markdown(&report)?),
        false => None,
    };
    super::finish_run(&report, &results_dir, args.run.format, |report| {
        markdown.unwrap_or_else(|| report.render_text())
    })
}
