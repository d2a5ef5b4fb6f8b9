//! The zoo's runs as one [`Report`] (`scenario: "zoo"`): library × invariant under every
//! nemesis, the findings with the smallest schedule and its replay line, latency and
//! throughput without faults, and a check per entry that its documented verdict was reproduced.

use anyhow::{Context, Result};
use serde_json::json;

use super::entry::{Entry, ZooRun};
use super::{EntryResult, Judged, Outcome, Settings};
use crate::explore::lab::STOPPED_ONCE_DRAINED;
use crate::harness::nemesis::format_duration;
use crate::judge::invariants::Invariant;
use crate::report::{CheckResult, Environment, Metrics, Report, Table};
use crate::verify::plan::FOREIGN_LIVENESS;
use crate::verify::verdict;

/// How much of the reason an entry could not run the zoo table shows.
const WHY_IN_TABLE: usize = 80;

/// The runs under faults that the zoo table counts.
const FAULTED: [ZooRun; 2] = [ZooRun::Naive, ZooRun::Idempotent];

/// The zoo table's title: how [`markdown`] finds it in a report.
const ZOO_TITLE: &str =
    "the zoo: runs under every nemesis that broke each invariant (*: the library promises it)";
/// The zoo table's columns: an entry's names, then what broke, then its verdict.
const ZOO_COLUMNS: [&str; 10] = [
    "entry",
    "library",
    "version",
    "registry",
    "ghost",
    "lost",
    "duplicate",
    "order",
    "liveness",
    "verdict",
];

/// The clocks table's title (`--clocks`): how [`markdown`] finds it in a report.
const CLOCKS_TITLE: &str = "clocks: relay 0's wall clock stepped a minute ahead or behind, or the \
     database server's a minute ahead, 250 ms into the run and for the rest of it, nothing else \
     (naive consumer; monotonic clocks true): what broke, in events (*: the library promises it)";

/// The table of the runs without faults' title: how [`markdown`] finds it in a report.
const QUIET_TITLE: &str = "without faults: latency from commit to delivery, and throughput";

pub fn report(results: &[EntryResult], settings: Settings, environment: Environment) -> Report {
    let mut metrics = Metrics::default();
    let mut zoo = Table::new(ZOO_TITLE, &ZOO_COLUMNS);
    let mut quiet = Table::new(
        QUIET_TITLE,
        &["entry", "p50 ms", "p99 ms", "events/s", "delivered", "s"],
    );
    let mut findings = Table::new(
        "findings: what broke, the smallest schedule that broke it, and its replay; in how many \
         runs it broke, and in how many it broke again under that schedule alone",
        &[
            "entry",
            "invariant",
            "promised",
            "consumer",
            "schedule",
            "replay",
            "runs",
            "reproduced",
        ],
    );
    let mut searches = Table::new(
        "search: schedules drawn from the nemesis grammar (naive consumer) until one broke a \
         promise, its smallest schedule and replay",
        &["entry", "seed", "drawn", "broke", "schedule", "replay"],
    );
    let mut failovers = Table::new(
        "failover: the database on a primary with a synchronous standby, failed over under the \
         library (db:failover@250ms, idempotent consumer); the database loses nothing \
         acknowledged, so what breaks is the library's (*: it promises it)",
        &[
            "entry",
            "ghost",
            "lost",
            "duplicate",
            "order",
            "liveness",
            "acknowledged-lost",
            "relay exits",
            "verdict",
        ],
    );
    let mut clocks = Table::new(CLOCKS_TITLE, &["entry", "step", "broke", "fired", "replay"]);
    let mut designs = Table::new(
        "what each library promises, and how its loop works",
        &["entry", "promise", "design", "home"],
    )
    .detail();
    let mut checks = Vec::new();
    let mut notes = Vec::new();
    for EntryResult { entry, outcome } in results {
        designs.push(vec![
            entry.name.clone(),
            entry.promise.clone(),
            entry.design.clone(),
            entry.home.clone(),
        ]);
        let mut row = vec![
            entry.name.clone(),
            entry.library.clone(),
            entry.version.clone(),
            entry.registry.clone(),
        ];
        let judged = match outcome {
            Outcome::Ran(judged) => judged.as_slice(),
            _ => &[],
        };
        let faulted: Vec<&Judged> = judged.iter().filter(|j| FAULTED.contains(&j.run)).collect();
        for invariant in Invariant::ALL {
            let broke = faulted
                .iter()
                .filter(|j| j.broken().contains(&invariant))
                .count();
            let late = match (&entry.recovery, broke > 0 && is_late(entry, invariant)) {
                (Some(recovery), true) => format!(" late (documented: {})", recovery.label),
                _ => String::new(),
            };
            row.push(match faulted.is_empty() {
                true => "-".into(),
                false => format!(
                    "{broke}/{}{}{late}",
                    faulted.len(),
                    promised_mark(entry, invariant)
                ),
            });
            if !faulted.is_empty() {
                let reproduced = faulted.iter().filter(|j| j.reproduced(invariant)).count();
                let metric = format!("zoo.{}.{}", entry.name, invariant.name());
                metrics.set(format!("{metric}.broken_runs"), broke as i64);
                metrics.set(format!("{metric}.reproduced_runs"), reproduced as i64);
            }
        }
        row.push(verdict(entry, outcome));
        zoo.push(row);
        // One finding per invariant and consumer: the first run's smallest schedule (a
        // reproduced one first), and how often it broke.
        for run in FAULTED {
            let of_run: Vec<&Judged> = faulted.iter().copied().filter(|j| j.run == run).collect();
            for invariant in Invariant::ALL {
                let broke: Vec<&Judged> = of_run
                    .iter()
                    .copied()
                    .filter(|j| j.broken().contains(&invariant))
                    .collect();
                let reproduced = broke.iter().filter(|j| j.reproduced(invariant)).count();
                let first_reproduced = broke.iter().copied().find(|j| j.reproduced(invariant));
                let Some(judged) = first_reproduced.or(broke.first().copied()) else {
                    continue;
                };
                let schedule = verdict::smallest_schedule(&judged.verification, invariant);
                findings.push(vec![
                    entry.name.clone(),
                    invariant.name().into(),
                    yes_no(entry.promises.contains(&invariant)),
                    run.consumer(entry).name().into(),
                    schedule.to_string(),
                    verdict::replay_line(&judged.plan, schedule),
                    format!("{}/{}", broke.len(), of_run.len()),
                    format!("{reproduced}/{}", broke.len()),
                ]);
            }
        }
        if let Some(judged) = judged.iter().find(|j| j.run == ZooRun::Search) {
            searches.push(search_row(entry, judged, &mut metrics));
        }
        if let Some(judged) = judged.iter().find(|j| j.run == ZooRun::Failover) {
            failovers.push(failover_row(entry, judged, &mut metrics));
        }
        for judged in judged.iter().filter(|j| matches!(j.run, ZooRun::Clock(_))) {
            clocks.push(clock_row(entry, judged, &mut metrics));
        }
        if let Some(judged) = judged.iter().find(|j| j.run == ZooRun::NoFaults) {
            let figures = &judged.verification.main().figures;
            let prefix = format!("zoo.{}.no_faults", entry.name);
            metrics.set(format!("{prefix}.latency.p50_ms"), figures.latency_p50_ms);
            metrics.set(format!("{prefix}.latency.p99_ms"), figures.latency_p99_ms);
            metrics.set(format!("{prefix}.events_per_s"), figures.events_per_s);
            quiet.push(vec![
                entry.name.clone(),
                format!("{:.1}", figures.latency_p50_ms),
                format!("{:.1}", figures.latency_p99_ms),
                format!("{:.0}", figures.events_per_s),
                format!("{}/{}", figures.delivered_distinct, figures.written),
                format!(
                    "{:.1}",
                    judged.verification.main().history.elapsed_ms as f64 / 1000.0
                ),
            ]);
        }
        match outcome {
            Outcome::NotInstalled => notes.push(format!(
                "{}: not installed here ({} {}): scripts/setup --zoo",
                entry.name, entry.library, entry.version
            )),
            Outcome::Failed { run, why } => {
                checks.push(CheckResult {
                    name: format!("{}: runs under verify", entry.name),
                    metric: format!("zoo.{}.ran", entry.name),
                    expected: "every run".into(),
                    actual: format!("its {} run could not: {why}", run.label()),
                    article: None,
                    pass: false,
                });
            }
            Outcome::Ran(judged) => {
                if let Some(documented) = judged.iter().find(|j| j.run == ZooRun::Documented) {
                    checks.push(documented_check(entry, documented, &mut metrics));
                }
            }
        }
    }
    Report {
        scenario: "zoo".into(),
        section: "beyond the article: outbox libraries nobody here wrote, judged side by side"
            .into(),
        params: json!({
            "entries": results.iter().map(|r| &r.entry.name).collect::<Vec<_>>(),
            "events": settings.events,
            "runs": settings.runs,
            "time_limit": format_duration(settings.time_limit),
        }),
        metrics,
        tables: {
            let mut tables = vec![zoo, findings];
            if settings.search.is_some() {
                tables.push(searches);
            }
            if !failovers.rows.is_empty() {
                tables.push(failovers);
            }
            if !clocks.rows.is_empty() {
                if settings.external_server {
                    notes.push(
                        "clocks: the database server's clock is not stepped on a server of \
                         yours (--database-url): relay 0's only"
                            .into(),
                    );
                }
                tables.push(clocks);
            }
            tables.extend([quiet, designs]);
            tables
        },
        checks,
        targets: Vec::new(),
        notes,
        environment,
    }
}

/// The zoo report's table as the README shows it (`zoo --markdown`): one row per entry, its
/// counts and verdict as the zoo table has them, its latency from the run without faults.
pub fn markdown(report: &Report) -> Result<String> {
    let find = |title: &str| {
        report
            .tables
            .iter()
            .find(|t| t.title == title)
            .with_context(|| format!("no table '{title}' in the report"))
    };
    let (zoo, quiet) = (find(ZOO_TITLE)?, find(QUIET_TITLE)?);
    let cell = |table: &Table, row: &[String], column: &str| -> Result<String> {
        let at = table
            .column(column)
            .with_context(|| format!("no column '{column}' in '{}'", table.title))?;
        // A '|' in a cell would end it.
        Ok(row[at].replace('|', "\\|"))
    };
    let counted = ["ghost", "lost", "duplicate", "order", "liveness"];
    // With --clocks, what each step broke, in a column of its own.
    let clocks = report.tables.iter().find(|t| t.title == CLOCKS_TITLE);
    let mut text = format!(
        "| entry | library | registry | {} | verdict | p50 / p99 ms, no faults |{}\n|---|---|---|{}---|---|{}\n",
        counted.join(" | "),
        if clocks.is_some() { " clocks stepped |" } else { "" },
        "---|".repeat(counted.len()),
        if clocks.is_some() { "---|" } else { "" },
    );
    for row in &zoo.rows {
        let entry = cell(zoo, row, "entry")?;
        let latency = match quiet.rows.iter().find(|q| q[0] == row[0]) {
            Some(q) => format!(
                "{} / {}",
                cell(quiet, q, "p50 ms")?,
                cell(quiet, q, "p99 ms")?
            ),
            None => "-".into(),
        };
        let counts = counted
            .iter()
            .map(|c| cell(zoo, row, c))
            .collect::<Result<Vec<_>>>()?;
        let steps = match clocks {
            Some(clocks) => {
                let steps = clocks
                    .rows
                    .iter()
                    .filter(|c| c[0] == row[0])
                    .map(|c| {
                        let fired = cell(clocks, c, "fired")?;
                        let broke = match fired.as_str() {
                            "yes" => cell(clocks, c, "broke")?,
                            _ => fired,
                        };
                        Ok(format!("{}: {broke}", cell(clocks, c, "step")?))
                    })
                    .collect::<Result<Vec<_>>>()?;
                match steps.is_empty() {
                    true => " - |".to_string(),
                    false => format!(" {} |", steps.join("; ")),
                }
            }
            None => String::new(),
        };
        text.push_str(&format!(
            "| {entry} | {} {} | {} | {} | {} | {latency} |{steps}\n",
            cell(zoo, row, "library")?,
            cell(zoo, row, "version")?,
            cell(zoo, row, "registry")?,
            counts.join(" | "),
            cell(zoo, row, "verdict")?,
        ));
    }
    Ok(text)
}

/// The entry's documented run held against the verdict it documents: every invariant it
/// documents broken, no other one but those timing decides (`may_break`), every nemesis fired.
fn documented_check(entry: &Entry, judged: &Judged, metrics: &mut Metrics) -> CheckResult {
    let documented = &entry.documented;
    let broken = judged.broken();
    let reproduced = documented.broken.iter().all(|i| broken.contains(i))
        && broken
            .iter()
            .all(|i| documented.broken.contains(i) || documented.may_break.contains(i))
        && judged.all_fired();
    metrics.set(
        format!("zoo.{}.documented.reproduced", entry.name),
        i64::from(reproduced),
    );
    let mut actual = names(&broken);
    if !judged.all_fired() {
        actual.push_str(" (a nemesis did not fire)");
    }
    CheckResult {
        name: format!(
            "{}: {} consumer under {} breaks what its entry documents ({})",
            entry.name,
            documented.consumer.name(),
            documented.schedule,
            documented.why
        ),
        metric: format!("zoo.{}.documented.broken", entry.name),
        expected: match documented.may_break.as_slice() {
            [] => names(&documented.broken),
            may_break => format!(
                "{} ({} may break too)",
                names(&documented.broken),
                names(may_break)
            ),
        },
        actual,
        article: None,
        pass: reproduced,
    }
}

/// An entry's search: how many schedules it drew before one broke a promise, and that
/// promise's smallest schedule with its replay (`-` where none broke one).
fn search_row(entry: &Entry, judged: &Judged, metrics: &mut Metrics) -> Vec<String> {
    let verification = &judged.verification;
    let drawn = verification.searched.len() + 1;
    let broken: Vec<Invariant> = judged
        .broken()
        .into_iter()
        .filter(|i| entry.promises.contains(i))
        .collect();
    let (seed, budget) = judged
        .plan
        .search_budget()
        .expect("a search run was planned with its search");
    let prefix = format!("zoo.{}.search", entry.name);
    metrics.set(format!("{prefix}.drawn"), drawn as i64);
    metrics.set(format!("{prefix}.found"), i64::from(!broken.is_empty()));
    let (schedule, replay) = match broken.first() {
        Some(invariant) => {
            let schedule = verdict::smallest_schedule(verification, *invariant);
            (
                schedule.to_string(),
                verdict::replay_line(&judged.plan, schedule),
            )
        }
        None => ("-".into(), "-".into()),
    };
    vec![
        entry.name.clone(),
        seed.to_string(),
        format!("{drawn} of {budget}"),
        match broken.is_empty() {
            true => "nothing promised".into(),
            false => names(&broken),
        },
        schedule,
        replay,
    ]
}

/// One line of an entry's verdict: the promises its runs broke (faulted, documented, search),
/// each with the schedule that broke it; what came late within its documented recovery; where
/// its promise comes from; and, where its settings lie outside the library's documented
/// constraints, which: a verdict on settings its authors warn against is not one on the
/// library as documented.
pub fn verdict(entry: &Entry, outcome: &Outcome) -> String {
    let judged = match outcome {
        Outcome::NotInstalled => return "not installed: scripts/setup --zoo".into(),
        Outcome::Failed { run, why } => {
            // The whole reason is in the entry's check; the table keeps its start.
            let mut why = why.clone();
            if let Some((cut, _)) = why.char_indices().nth(WHY_IN_TABLE) {
                why.truncate(cut);
                why.push_str("...");
            }
            return format!("could not run ({}): {why}", run.label());
        }
        Outcome::Ran(judged) => judged,
    };
    let Promises {
        broken,
        late,
        unconfirmed,
    } = promises(entry, judged);
    let mut verdict = match broken.is_empty() {
        true => "keeps its promises".to_string(),
        false => {
            // One group per schedule, in the order found: "(net:down 3s): lost".
            let mut groups: Vec<(String, Vec<Invariant>)> = Vec::new();
            for Broken {
                invariant,
                schedule,
            } in broken
            {
                match groups.iter_mut().find(|(s, _)| *s == schedule) {
                    Some((_, invariants)) => invariants.push(invariant),
                    None => groups.push((schedule, vec![invariant])),
                }
            }
            let groups: Vec<String> = groups
                .into_iter()
                .map(|(schedule, invariants)| format!("({schedule}): {}", names(&invariants)))
                .collect();
            format!("BREAKS ITS PROMISE {}", groups.join("; "))
        }
    };
    if let (Some(recovery), false) = (&entry.recovery, late.is_empty()) {
        verdict.push_str(&format!(
            "; late within its documented recovery ({}): {}",
            recovery.label,
            names(&late)
        ));
    }
    if !unconfirmed.is_empty() {
        verdict.push_str(&format!(
            " (broken once, not reproduced alone: {})",
            names(&unconfirmed)
        ));
    }
    match &entry.promise_inferred {
        None => verdict.push_str(" (promise quoted)"),
        Some(from) => verdict.push_str(&format!(" (promise inferred from {from})")),
    }
    if let Some(outside) = &entry.outside_rules {
        verdict.push_str(&format!(" [OUTSIDE ITS DOCUMENTED RULES: {outside}]"));
    }
    verdict
}

/// What an entry's runs did to its promises.
struct Promises {
    /// Broken: in a faulted run and again under its smallest schedule alone, in its
    /// documented run, or by its search.
    broken: Vec<Broken>,
    /// Lost or liveness where its documented recovery outlasts the run: late, not lost.
    late: Vec<Invariant>,
    /// Broken in a faulted run once, and not again alone: perhaps the machine's noise.
    unconfirmed: Vec<Invariant>,
}

/// A promise broken, and the smallest schedule that broke it (`documented: ...`, `search:
/// ...` where that run found it).
struct Broken {
    invariant: Invariant,
    schedule: String,
}

fn promises(entry: &Entry, judged: &[Judged]) -> Promises {
    let mut found = Promises {
        broken: Vec::new(),
        late: Vec::new(),
        unconfirmed: Vec::new(),
    };
    // What broke unpromised is in the cells: timing decides whether a kill lands mid-batch, and
    // a verdict is about promises, so that it does not flip on noise.
    for invariant in entry.promises.iter().copied() {
        let broke: Vec<&Judged> = judged
            .iter()
            .filter(|j| j.broken().contains(&invariant))
            .collect();
        if broke.is_empty() {
            continue;
        }
        if is_late(entry, invariant) {
            found.late.push(invariant);
            continue;
        }
        // A faulted run's violation counts where it broke again under the smallest schedule
        // alone; the documented run's schedule is already one, held five times of five; the
        // search's is shrunk.
        let counted = broke.iter().find(|j| match j.run {
            ZooRun::Naive | ZooRun::Idempotent => j.reproduced(invariant),
            ZooRun::Documented | ZooRun::Search => true,
            // One nemesis already: broken in each time it was made (`--runs`), so that a
            // verdict does not flip on noise.
            ZooRun::Clock(_) => judged
                .iter()
                .filter(|k| k.run == j.run)
                .all(|k| k.broken().contains(&invariant) && k.all_fired()),
            ZooRun::NoFaults | ZooRun::Failover => false,
        });
        match counted {
            Some(j) => {
                let schedule = verdict::smallest_schedule(&j.verification, invariant);
                found.broken.push(Broken {
                    invariant,
                    schedule: match j.run {
                        ZooRun::Documented | ZooRun::Search => {
                            format!("{}: {schedule}", j.run.label())
                        }
                        _ => schedule.to_string(),
                    },
                });
            }
            None if broke
                .iter()
                .any(|j| FAULTED.contains(&j.run) || matches!(j.run, ZooRun::Clock(_))) =>
            {
                found.unconfirmed.push(invariant)
            }
            None => {}
        }
    }
    found
}

/// Whether `invariant` broken is an event late within the entry's documented recovery: lost or
/// liveness, the recovery longer than verify's bound to drain.
fn is_late(entry: &Entry, invariant: Invariant) -> bool {
    matches!(invariant, Invariant::Lost | Invariant::Liveness)
        && entry
            .recovery
            .as_ref()
            .is_some_and(|r| r.after > FOREIGN_LIVENESS)
}

fn names(invariants: &[Invariant]) -> String {
    match invariants {
        [] => "none".into(),
        _ => invariants
            .iter()
            .map(|i| i.name())
            .collect::<Vec<_>>()
            .join(", "),
    }
}

fn yes_no(yes: bool) -> String {
    match yes {
        true => "yes".into(),
        false => "no".into(),
    }
}

/// An entry's failover run: each invariant's violations (`*`: promised), the orders the
/// database lost, how often the library's relay ended by itself (and was started again), and
/// what broke of the library's promises (`survived`: none, every fault
/// fired).
fn failover_row(entry: &Entry, judged: &Judged, metrics: &mut Metrics) -> Vec<String> {
    let history = &judged.verification.main().history;
    let mut row = vec![entry.name.clone()];
    for (_, n, promised) in violations(entry, judged, "failover", metrics) {
        row.push(format!("{n}{promised}"));
    }
    let lost = history.acknowledged_lost.len();
    metrics.set(
        format!("zoo.{}.failover.acknowledged_lost", entry.name),
        lost as i64,
    );
    row.push(lost.to_string());
    // A relay that ends at the cut and is started again, against one that reconnects itself.
    let exits = history
        .processes
        .iter()
        .filter(|p| p.process.starts_with("relay-") && !p.end.starts_with(STOPPED_ONCE_DRAINED))
        .count();
    metrics.set(
        format!("zoo.{}.failover.relay_exits", entry.name),
        exits as i64,
    );
    row.push(exits.to_string());
    let broken: Vec<&str> = judged
        .broken()
        .into_iter()
        .filter(|i| entry.promises.contains(i))
        .map(Invariant::name)
        .collect();
    row.push(match (judged.all_fired(), broken.is_empty()) {
        (false, _) => "the failover did not fire".into(),
        (true, true) => "survived".into(),
        (true, false) => format!("broke its promise: {}", broken.join(", ")),
    });
    row
}

/// Each invariant's violations in `judged`'s main run, set as the metric
/// `zoo.<entry>.<run>.<invariant>`, with `*` where the entry promises it.
fn violations(
    entry: &Entry,
    judged: &Judged,
    run: &str,
    metrics: &mut Metrics,
) -> Vec<(Invariant, usize, &'static str)> {
    let history = &judged.verification.main().history;
    Invariant::ALL
        .into_iter()
        .map(|invariant| {
            let n = history.violations.get(invariant.name()).map_or(0, Vec::len);
            metrics.set(
                format!("zoo.{}.{run}.{}", entry.name, invariant.name()),
                n as i64,
            );
            (invariant, n, promised_mark(entry, invariant))
        })
        .collect()
}

/// `*` where the entry promises `invariant` (the tables' mark), else nothing.
fn promised_mark(entry: &Entry, invariant: Invariant) -> &'static str {
    match entry.promises.contains(&invariant) {
        true => "*",
        false => "",
    }
}

/// An entry's run under one clock step: what broke (each invariant with its events, `*` where
/// promised), whether the step reached the relay (or the server), and the replay.
fn clock_row(entry: &Entry, judged: &Judged, metrics: &mut Metrics) -> Vec<String> {
    let ZooRun::Clock(step) = judged.run else {
        unreachable!("a clock row is made of a clock run");
    };
    let history = &judged.verification.main().history;
    let run = format!("{}{}", step.label(), judged.run.take_label(judged.take));
    let broke: Vec<String> = violations(entry, judged, &run, metrics)
        .into_iter()
        .filter(|&(_, n, _)| n > 0)
        .map(|(invariant, n, promised)| format!("{}{promised} {n}", invariant.name()))
        .collect();
    vec![
        entry.name.clone(),
        format!("{}{}", step.describe(), judged.run.take_label(judged.take)),
        match broke.is_empty() {
            true => "nothing".into(),
            false => broke.join(", "),
        },
        match judged.all_fired() {
            true => "yes".into(),
            false => "NOT REACHED".into(),
        },
        verdict::replay_line(&judged.plan, &history.schedule),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(cells: &[&str]) -> Vec<String> {
        cells.iter().map(|c| c.to_string()).collect()
    }

    /// Two entries, one without its run without faults (it could not run): each a row, its
    /// counts and verdict as the zoo table has them, a '|' of a verdict escaped.
    #[test]
    fn the_markdown_table_is_the_zoo_tables_rows() {
        let mut zoo = Table::new(ZOO_TITLE, &ZOO_COLUMNS);
        zoo.push(strings(&[
            "pg_boss",
            "pg-boss",
            "10.4.2",
            "npm",
            "0/2*",
            "0/2*",
            "1/2",
            "2/2",
            "0/2*",
            "keeps its promises",
        ]));
        zoo.push(strings(&[
            "sqlxmq",
            "sqlxmq",
            "0.6.0",
            "crates.io",
            "-",
            "-",
            "-",
            "-",
            "-",
            "could not run (naive): a|b",
        ]));
        let mut quiet = Table::new(QUIET_TITLE, &["entry", "p50 ms", "p99 ms", "events/s"]);
        quiet.push(strings(&["pg_boss", "411.0", "844.5", "380"]));
        let report = Report {
            scenario: "zoo".into(),
            section: String::new(),
            params: json!({}),
            metrics: Metrics::default(),
            tables: vec![zoo, quiet],
            checks: Vec::new(),
            targets: Vec::new(),
            notes: Vec::new(),
            environment: Environment {
                postgres_version: String::new(),
                outbox_lab_version: String::new(),
                started_at: String::new(),
                elapsed_ms: 0,
                server: String::new(),
            },
        };
        assert_eq!(
            markdown(&report).unwrap(),
            "| entry | library | registry | ghost | lost | duplicate | order | liveness | verdict \
             | p50 / p99 ms, no faults |\n\
             |---|---|---|---|---|---|---|---|---|---|\n\
             | pg_boss | pg-boss 10.4.2 | npm | 0/2* | 0/2* | 1/2 | 2/2 | 0/2* | keeps its \
             promises | 411.0 / 844.5 |\n\
             | sqlxmq | sqlxmq 0.6.0 | crates.io | - | - | - | - | - | could not run (naive): \
             a\\|b | - |\n"
        );
        // With --clocks, a column of what each step broke (or that it did not reach).
        let mut report = report;
        let mut clocks = Table::new(CLOCKS_TITLE, &["entry", "step", "broke", "fired", "replay"]);
        clocks.push(strings(&[
            "pg_boss",
            "relay +60s",
            "duplicate 3",
            "yes",
            "r",
        ]));
        clocks.push(strings(&[
            "pg_boss",
            "db +60s",
            "nothing",
            "NOT REACHED",
            "r",
        ]));
        report.tables.push(clocks);
        let text = markdown(&report).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].ends_with("| p50 / p99 ms, no faults | clocks stepped |"));
        assert_eq!(lines[1].matches("---").count(), 11);
        assert!(
            lines[2].ends_with("| 411.0 / 844.5 | relay +60s: duplicate 3; db +60s: NOT REACHED |")
        );
        assert!(lines[3].ends_with("| - | - |"));
    }
}
