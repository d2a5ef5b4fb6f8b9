//! What explore reports: each design's runs summed up per invariant (its verdict, the
//! schedule that reproduces each violation), the schedules with a fault not reached set apart,
//! the self-test (every design's flaw must be seen, or the checker is blind to it), the design x
//! invariant matrix as a [`Report`], and its terminal form.

use std::collections::BTreeMap;
use std::time::Duration;

use super::designs::{Design, Invariant};
use super::history::History;
use super::schedule::Schedule;
use super::Plan;
use crate::judge::expectations::CheckResult;
use crate::report::{Environment, Metrics, Report, Table};
use crate::stats::round_to;

/// One design's runs, summarised per invariant.
pub struct DesignResult {
    pub(super) design: &'static Design,
    pub runs: Vec<History>,
    /// The schedule to show for each violated invariant.
    pub(super) reproducers: BTreeMap<Invariant, Reproducer>,
}

/// The schedule shown for a violated invariant: the smallest that broke it again when run a
/// second time, or else the smallest (timing-dependent violations may not come back).
#[derive(Clone)]
pub(super) struct Reproducer {
    pub(super) schedule: String,
    /// The ids that broke it in the schedule's first run.
    pub(super) offending: Vec<String>,
    /// Whether the second run broke it again (`None`: not run twice, as with --schedule).
    pub(super) again: Option<bool>,
}

impl DesignResult {
    /// The schedules run (not the re-runs of the smallest ones).
    fn schedules(&self) -> impl Iterator<Item = &History> {
        self.runs.iter().filter(|r| r.rerun_of.is_none())
    }

    /// The schedules whose every fault fired: the only runs that count, for or against a claim.
    fn reached(&self) -> impl Iterator<Item = &History> {
        self.schedules().filter(|r| !r.faults_not_reached())
    }

    /// The schedules with a fault that was not reached: they ran without it, and are reported
    /// apart.
    fn not_reached(&self) -> usize {
        self.schedules().filter(|r| r.faults_not_reached()).count()
    }

    fn violating(&self, invariant: Invariant) -> Vec<&History> {
        self.reached()
            .filter(|r| r.violations.contains_key(invariant.name()))
            .collect()
    }

    /// The runs that broke `invariant`, simplest first: fewest faults, then earliest passes.
    pub(super) fn smallest_first(&self, invariant: Invariant) -> Vec<&History> {
        let mut runs = self.violating(invariant);
        runs.sort_by_cached_key(|r| {
            let schedule: Schedule = r.schedule.parse().expect("printed by Schedule");
            (schedule.size(), r.schedule.clone())
        });
        runs.dedup_by(|a, b| a.schedule == b.schedule);
        runs
    }

    fn broken_claims(&self) -> Vec<Invariant> {
        Invariant::ALL
            .into_iter()
            .filter(|i| self.design.claims(*i) && !self.violating(*i).is_empty())
            .collect()
    }

    fn verdict(&self) -> String {
        let broken = self.broken_claims();
        if !broken.is_empty() {
            return format!("VIOLATES its claims: {}", names(&broken));
        }
        if self.design.flaws.is_empty() {
            return "holds what it claims".into();
        }
        let (caught, missed): (Vec<Invariant>, Vec<Invariant>) = self
            .design
            .flaws
            .iter()
            .partition(|f| !self.violating(**f).is_empty());
        let mut verdict = "holds what it claims".to_string();
        if !caught.is_empty() {
            verdict.push_str(&format!("; flaw caught: {}", names(&caught)));
        }
        if !missed.is_empty() {
            verdict.push_str(&format!("; CHECKER BLIND to: {}", names(&missed)));
        }
        verdict
    }
}

fn names(invariants: &[Invariant]) -> String {
    invariants
        .iter()
        .map(|i| i.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// How the self-test's checks are named: `checker sees <invariant>: <design> breaks it`.
const SELF_TEST: &str = "checker sees ";

/// The run as a [`Report`]: the design x invariant matrix, the smallest reproducers, a check
/// per claim (over the schedules whose faults all fired) and one per flaw (the self-test).
pub fn report(
    plan: &Plan,
    results: &[DesignResult],
    elapsed: Duration,
    environment: Environment,
) -> Report {
    let mut metrics = Metrics::default();
    let mut checks = Vec::new();
    let mut matrix = Table::new(
        "design x invariant: schedules violating / schedules run with every fault fired (* = claimed \
         by the design)",
        &[
            "design",
            "ghost",
            "lost",
            "duplicate",
            "order",
            "liveness",
            "not reached",
            "verdict",
        ],
    );
    let mut smallest = Table::new(
        "smallest schedule reproducing each violation",
        &[
            "design",
            "invariant",
            "violating",
            "schedule",
            "offending",
            "again",
            "command",
        ],
    );
    let total: usize = results.iter().map(|r| r.schedules().count()).sum();
    let not_reached_total: usize = results.iter().map(|r| r.not_reached()).sum();
    for result in results {
        let design = result.design;
        let runs = result.reached().count();
        let not_reached = result.not_reached();
        metrics.set(
            format!("{}.schedules", design.name),
            result.schedules().count() as i64,
        );
        metrics.set(
            format!("{}.faults_not_reached", design.name),
            not_reached as i64,
        );
        let mut row = vec![design.name.to_string()];
        for invariant in Invariant::ALL {
            let violating = result.violating(invariant).len();
            let metric = format!("{}.{}.violating", design.name, invariant.name());
            metrics.set(metric.clone(), violating as i64);
            let claimed = design.claims(invariant);
            row.push(format!(
                "{violating}/{runs}{}",
                if claimed { "*" } else { "" }
            ));
            if claimed {
                // A claim no schedule tested (every one had a fault not reached) is not held.
                checks.push(CheckResult {
                    name: format!("{} claims: {}", design.name, invariant.meaning()),
                    metric,
                    expected: "0, over at least 1 schedule".into(),
                    actual: if runs == 0 {
                        "no schedule with its faults fired".into()
                    } else {
                        violating.to_string()
                    },
                    article: None,
                    pass: violating == 0 && runs > 0,
                });
            }
            if let Some(shown) = result.reproducers.get(&invariant) {
                let again = match shown.again {
                    Some(true) => "yes",
                    Some(false) => "no",
                    None => "-",
                };
                smallest.push(vec![
                    design.name.into(),
                    invariant.name().into(),
                    format!("{violating}/{runs}"),
                    shown.schedule.clone(),
                    shown.offending.join(", "),
                    again.into(),
                    plan.command_line(design, &shown.schedule),
                ]);
            }
        }
        for &flaw in design.flaws {
            // The self-test: a design built to break an invariant must be seen breaking it,
            // or the checker is blind to it and no verdict of this run can be trusted.
            let violating = result.violating(flaw).len();
            checks.push(CheckResult {
                name: format!("{SELF_TEST}{}: {} breaks it", flaw.name(), design.name),
                metric: format!("{}.{}.violating", design.name, flaw.name()),
                expected: "at least 1".into(),
                actual: violating.to_string(),
                article: None,
                pass: violating > 0,
            });
        }
        row.push(not_reached.to_string());
        row.push(result.verdict());
        matrix.push(row);
    }
    metrics.set("schedules", total as i64);
    // Every run counts for the rate, the second runs of the reproducers too.
    let runs_total: usize = results.iter().map(|r| r.runs.len()).sum();
    let per_s = runs_total as f64 / elapsed.as_secs_f64().max(0.001);
    metrics.set("schedules_per_s", round_to(per_s, 100.0));
    let mut notes = vec![format!(
        "{total} schedules and {} second runs in {:.1} s ({per_s:.2} schedules/s); workload: {} \
         orders x {} events, written by two overlapping sessions",
        runs_total - total,
        elapsed.as_secs_f64(),
        plan.workload.orders,
        plan.workload.events_per_order
    )];
    notes.push(format!(
        "not reached: {not_reached_total} schedules had a fault their process never reached (the \
         run went on without it); they are reported apart and not counted in violating / run"
    ));
    notes.push(
        "again: the schedule, run a second time, broke the invariant again; of the violating \
         schedules the smallest that does is shown (up to 3 tried); no: none did, the violation \
         depends on timing, as races do"
            .into(),
    );
    for result in results {
        let design = result.design;
        notes.push(format!("{} claims: {}", design.name, names(design.claims)));
    }
    Report {
        scenario: "explore".into(),
        section: "beyond the article: every crash point against every design".into(),
        params: plan.params(),
        metrics,
        tables: vec![matrix, smallest],
        checks,
        targets: Vec::new(),
        notes,
        environment,
    }
}

/// The terminal form: the matrix, the smallest reproducers, one closing line.
pub fn render_text(report: &Report) -> String {
    let mut out = String::new();
    for table in &report.tables {
        if table.rows.is_empty() {
            continue;
        }
        out.push_str(&format!("{}\n{}\n\n", table.title, table.render()));
    }
    for note in &report.notes {
        out.push_str(&format!("{note}\n"));
    }
    let (blind, broken): (Vec<&CheckResult>, Vec<&CheckResult>) = report
        .checks
        .iter()
        .filter(|c| !c.pass)
        .partition(|c| c.name.starts_with(SELF_TEST));
    if blind.is_empty() && broken.is_empty() {
        out.push_str("\nexplore: every design holds what it claims, and shows its flaw");
    }
    for check in blind {
        let (invariant, design) = check.name[SELF_TEST.len()..]
            .split_once(": ")
            .expect("named by report()");
        out.push_str(&format!(
            "\nexplore: checker blind to {invariant}: {design}, but no schedule showed it"
        ));
    }
    if !broken.is_empty() {
        let metrics: Vec<&str> = broken.iter().map(|c| c.metric.as_str()).collect();
        out.push_str(&format!(
            "\nexplore: claims violated or untested: {}",
            metrics.join(", ")
        ));
    }
    out
}
