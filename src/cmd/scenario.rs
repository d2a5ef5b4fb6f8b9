//! `outbox-lab scenario NAME|all`: the article's experiments, run and held against its figures.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{anyhow, Context, Result};
use clap::Args;
use futures_util::StreamExt;

use super::{outln, plots, Format, RunArgs};
use crate::connect;
use crate::error::{self, exit};
use crate::harness::brokers::{BrokerUrls, Brokers};
use crate::harness::db::PgServer;
use crate::harness::run::{new_run_id, on_server};
use crate::harness::throwaway;
use crate::report::html;
use crate::report::progress::Progress;
use crate::report::{self, Report, Spread};
use crate::scenarios::{self, Overrides, Prepared, Scenario};

#[derive(Debug, Args)]
pub struct ScenarioArgs {
    /// Scenario name (see `outbox-lab list`), several separated by commas, or `all`.
    name: String,
    #[command(flatten)]
    run: RunArgs,
    /// Use this Redis instead of a private redis-server; outbox-lab only touches keys named
    /// outboxlab:<run>:* there.
    #[arg(long, env = "OUTBOX_LAB_REDIS_URL", hide_env_values = true)]
    redis_url: Option<String>,
    /// Use this NATS server (JetStream enabled; nats://[TOKEN@|USER:PASSWORD@]HOST:PORT)
    /// instead of a private nats-server; outbox-lab only touches streams and consumers named
    /// outboxlab_<run>_* and subjects outboxlab.<run>.* there, and deletes its streams after.
    #[arg(long, env = "OUTBOX_LAB_NATS_URL", hide_env_values = true)]
    nats_url: Option<String>,
    /// Use this RabbitMQ (amqp://USER:PASSWORD@HOST:PORT/%2f) instead of a private
    /// rabbitmq-server; outbox-lab only touches queues named outboxlab_<run>_* there, and
    /// deletes them after. broker-confirms kills its broker, so it needs the private one.
    #[arg(long, env = "OUTBOX_LAB_AMQP_URL", hide_env_values = true)]
    amqp_url: Option<String>,
    /// Use this Kafka-protocol cluster (kafka://[USER:PASSWORD@]HOST:PORT, SASL PLAIN, no TLS)
    /// instead of a private tansu broker; outbox-lab only touches topics named
    /// outboxlab_<run>_* there, and deletes them after.
    #[arg(long, env = "OUTBOX_LAB_KAFKA_URL", hide_env_values = true)]
    kafka_url: Option<String>,
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
    /// Exit 1 when a speed target is missed, as when a check fails (for benchmarks; without it,
    /// targets are reported MET / MISSED and only the article's checks decide the exit status).
    #[arg(long)]
    strict_targets: bool,
    /// Run it this many times (each run on servers of its own) and print, per metric, min /
    /// median / max over the runs, and per check how many runs passed; exit 1 if any run failed.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    repeat: u32,
    /// relay-crash, broker-dedup: number of events.
    #[arg(long)]
    events: Option<u32>,
    /// relay-crash, broker-dedup: the first relay dies after this many deliveries.
    #[arg(long)]
    crash_after: Option<u32>,
}

pub async fn run(args: ScenarioArgs) -> Result<ExitCode> {
    let selected = match args.name.as_str() {
        "all" => Scenario::ALL.to_vec(),
        names => names
            .split(',')
            .map(Scenario::from_name)
            .collect::<Result<_>>()?,
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
    let prepared = scenarios::prepare_all(&selected, args.scenarios_dir.as_deref(), &overrides)?;
    can_write_under(&args.run.results_dir)?;
    if let Some(url) = &args.redis_url {
        connect::redis(url).await.context("--redis-url")?;
    }
    if let Some(url) = &args.nats_url {
        connect::nats(url).await.context("--nats-url")?;
    }
    if let Some(url) = &args.amqp_url {
        connect::amqp(url).await.context("--amqp-url")?;
    }
    if let Some(url) = &args.kafka_url {
        connect::kafka(url)
            .await
            .context("--kafka-url")?
            .list_topics()
            .await
            .map_err(|e| anyhow!("--kafka-url: {e}"))?;
    }

    let mut runs = Vec::new();
    for repetition in 1..=args.repeat {
        let run = run_once(&args, &prepared).await?;
        if args.repeat > 1 && args.run.format == Format::Text {
            for report in &run.reports {
                outln!(
                    "run {repetition} of {}: {}: {} ({} ms)",
                    args.repeat,
                    report.scenario,
                    report.verdict_line(),
                    report.environment.elapsed_ms
                )?;
            }
        }
        runs.push(run);
    }
    let reports = || runs.iter().flat_map(|run| &run.reports);
    let passed = reports().all(Report::passed);
    let targets_met = reports().all(Report::targets_met);
    if args.repeat > 1 {
        let spreads: Vec<Spread> = prepared
            .iter()
            .enumerate()
            .map(|(i, _)| Spread::over(runs.iter().map(|run| &run.reports[i])))
            .collect();
        match args.run.format {
            Format::Json => outln!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({
                    "run_ids": runs.iter().map(|run| &run.id).collect::<Vec<_>>(),
                    "repeat": args.repeat,
                    "passed": passed,
                    "targets_met": targets_met,
                    "scenarios": spreads,
                }))?
            )?,
            Format::Text => {
                for spread in &spreads {
                    outln!("{}", spread.render_text())?;
                }
            }
        }
    } else {
        let run = &runs[0];
        match args.run.format {
            Format::Json if run.reports.len() == 1 => {
                outln!("{}", serde_json::to_string_pretty(&run.reports[0])?)?
            }
            Format::Json => outln!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({
                    "run_id": run.id,
                    "passed": passed,
                    "targets_met": targets_met,
                    "scenarios": run.reports,
                }))?
            )?,
            Format::Text if run.reports.len() > 1 => outln!("{}", report::summary(&run.reports))?,
            Format::Text => {}
        }
    }
    Ok(ExitCode::from(
        if passed && (targets_met || !args.strict_targets) {
            exit::OK
        } else {
            exit::CHECK_FAILED
        },
    ))
}

/// How many scenarios that time nothing `scenario all` runs at once.
const SIDE_BY_SIDE: usize = 4;

/// One run of the selected scenarios: its id and its reports, in the order they ran.
struct Run {
    id: String,
    reports: Vec<Report>,
}

/// Runs the scenarios once, on servers of this run's own (a repetition is a run of its own:
/// its own id, cluster, databases and results directory). With one repetition each report is
/// printed in full as it ends; with more, [`run`] prints a line per report and the spread.
async fn run_once(args: &ScenarioArgs, prepared: &[Prepared]) -> Result<Run> {
    let run_id = new_run_id();
    // Redis starts only if a scenario asks for it; it is closed however the runs end.
    let urls = BrokerUrls {
        redis: args.redis_url.as_deref(),
        nats: args.nats_url.as_deref(),
        amqp: args.amqp_url.as_deref(),
        kafka: args.kafka_url.as_deref(),
    };
    let brokers = Brokers::new(urls, &run_id, args.run.keep);
    let results = args.run.results_dir.join(&run_id);
    let progress = Progress::on_stderr(args.run.format == Format::Text && !args.quiet);
    let print_each = args.run.format == Format::Text && args.repeat == 1;
    let outcome = on_server(
        &args.run.server_choice(),
        &run_id,
        async |server: &PgServer| {
            // The reports so far, in the order of `prepared`, and where each stands there.
            let (mut reports, mut positions): (Vec<Report>, Vec<usize>) = (vec![], vec![]);
            let bar = progress.bar(prepared.len() as u64, "scenarios");
            // What is left of report `i`: its files, its text, the page of the reports so far
            // (a run stopped halfway still leaves a page of what it has).
            let mut finish = |i: usize, report: Report| {
                report.write_files(&results)?;
                if print_each {
                    progress.suspend(|| outln!("{}", report.render_text()))?;
                }
                let at = positions.partition_point(|&j| j < i);
                positions.insert(at, i);
                reports.insert(at, report);
                html::write(&results, &reports, plots)?;
                bar.inc(1);
                anyhow::Ok(())
            };
            let (brokers, progress) = (&brokers, &progress);
            let run = |i: usize| {
                let p = &prepared[i];
                async move {
                    let report = scenarios::run(server, brokers, p, progress).await;
                    report.map(|report| (i, report)).map_err(error::harness)
                }
            };
            // First the scenarios that time nothing, side by side; then the others one by one,
            // the machine theirs alone.
            let (beside, alone): (Vec<usize>, Vec<usize>) =
                (0..prepared.len()).partition(|&i| prepared[i].side_by_side());
            bar.set_message(format!("{} side by side", beside.len()));
            let mut side_by_side = futures_util::stream::iter(beside.into_iter().map(run))
                .buffer_unordered(SIDE_BY_SIDE);
            while let Some(ended) = side_by_side.next().await {
                let (i, report) = ended?;
                finish(i, report)?;
            }
            for i in alone {
                bar.set_message(prepared[i].scenario().name());
                let (i, report) = run(i).await?;
                finish(i, report)?;
            }
            bar.finish_and_clear();
            Ok(reports)
        },
    )
    .await;
    let closed = brokers.close().await;
    let reports = outcome?;
    closed.map_err(error::harness)?;
    if args.run.format == Format::Text && !args.quiet {
        crate::errln!(
            "results written to {}; the page: {}",
            results.display(),
            results.join(html::PAGE_FILE).display()
        );
    }
    Ok(Run {
        id: run_id,
        reports,
    })
}

/// Fails unless files can be created in `dir`, or in the nearest existing folder above it (where
/// `dir` would be made), checked with a probe file that is removed again: an unwritable
/// `--results-dir` is found before any server starts, not after the run.
fn can_write_under(dir: &Path) -> Result<()> {
    let existing = dir
        .ancestors()
        .find(|d| d.as_os_str().is_empty() || d.is_dir())
        .map(|d| {
            if d.as_os_str().is_empty() {
                Path::new(".")
            } else {
                d
            }
        })
        .unwrap_or(Path::new("/"));
    let probe = existing.join(format!(".outbox-lab-probe-{}", std::process::id()));
    throwaway::create_new(&probe)
        .map(drop)
        .and_then(|()| Ok(std::fs::remove_file(&probe)?))
        .with_context(|| {
            format!(
                "cannot write results under {} (in {}): choose another --results-dir",
                dir.display(),
                existing.display()
            )
        })
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
