//! verify's verdict: the runs judged against the relay's claims, and what is printed of them —
//! the [`Report`] (its checks, the runs, the offending ids with the smallest schedule that
//! reproduced them and the command line that replays it, the faults, latency and throughput,
//! the notes), an inconclusive run told as such, and a line per run while it goes.

use serde_json::json;

use super::plan::{Plan, DEFAULT_CLAIMS};
use super::run::{Figures, Verification, VerifyRun};
use crate::explore::designs::Invariant;
use crate::explore::history::{FaultOutcome, History};
use crate::explore::lab::STOPPED_ONCE_DRAINED;
use crate::explore::schedule::Nemesis;
use crate::explore::watchdog::LIVENESS_BOUND;
use crate::harness::nemesis::format_duration;
use crate::judge::expectations::CheckResult;
use crate::judge::record;
use crate::report::{Environment, Metrics, Report, Table};

/// The verification as a [`Report`] (`scenario: "verify"`).
pub fn report(plan: &Plan, verification: &Verification, environment: Environment) -> Report {
    let main = verification.main();
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
    // Of the lost, those the relays skipped (already past them when they committed).
    let lost = main.history.violations.get(Invariant::Lost.name());
    let skipped = lost.map_or(0, |ids| {
        ids.iter().filter(|id| id.contains(record::SKIPPED)).count()
    });
    metrics.set("verify.lost.skipped", skipped as i64);
    let not_reached = not_reached(&main.history).len();
    metrics.set(
        "verify.faults_fired",
        (main.history.faults.len() - not_reached) as i64,
    );
    metrics.set("verify.faults_not_reached", not_reached as i64);
    if plan.replication.is_some() {
        let lost = main.history.acknowledged_lost.len();
        metrics.set("verify.acknowledged_lost", lost as i64);
    }
    metrics.set("verify.latency.p50_ms", figures.latency_p50_ms);
    metrics.set("verify.latency.p99_ms", figures.latency_p99_ms);
    metrics.set("verify.latency.max_ms", figures.latency_max_ms);
    metrics.set("verify.held_ms", figures.held_ms);
    metrics.set("verify.events_per_s", figures.events_per_s);
    metrics.set("verify.runs", verification.runs.len() as i64);
    metrics.set(
        "verify.inconclusive",
        i64::from(verification.inconclusive().is_some()),
    );
    let mut timeline = Table::new(TIMELINE_TITLE, &["ms", "deliveries"]).detail();
    for (bucket, n) in &figures.timeline {
        timeline.push(vec![bucket.to_string(), n.to_string()]);
    }
    let mut tables = vec![
        runs_table(plan, verification),
        violations_table(plan, verification),
        faults_table(&main.history),
        latency_table(figures),
        timeline,
        in_flight_table(&main.history),
    ];
    if let Some(seed) = plan.search.as_ref().map(|search| search.seed) {
        let drawn = verification.searched.len() + 1;
        metrics.set("verify.search.seed", seed as i64);
        metrics.set("verify.search.drawn", drawn as i64);
        metrics.set(
            "verify.search.found",
            i64::from(
                plan.design
                    .claims
                    .iter()
                    .any(|c| main.history.violations.contains_key(c.name())),
            ),
        );
        tables.push(search_table(verification));
    }
    Report {
        scenario: "verify".into(),
        section: "beyond the article: your relay under the same faults and checker".into(),
        params: params(plan),
        metrics,
        tables,
        checks: checks(plan, verification),
        targets: Vec::new(),
        notes: notes(plan, verification),
        environment,
    }
}

/// `--search`: every schedule drawn, in the order run, and what it broke.
fn search_table(verification: &Verification) -> Table {
    let mut table = Table::new(
        "search: the schedules drawn, in order, until one broke a claim",
        &["draw", "schedule", "broke", "s"],
    );
    let drawn = verification
        .searched
        .iter()
        .chain(verification.runs.first());
    for (k, run) in drawn.enumerate() {
        table.push(vec![
            (k + 1).to_string(),
            run.history.schedule.clone(),
            verdict_line(&run.history),
            format!("{:.1}", run.history.elapsed_ms as f64 / 1000.0),
        ]);
    }
    table
}

/// A check per claim of the main run, and one that every nemesis fired.
fn checks(plan: &Plan, verification: &Verification) -> Vec<CheckResult> {
    let main = verification.main();
    let inconclusive = verification.inconclusive();
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
        let not_reached = not_reached(&main.history).len();
        checks.push(CheckResult {
            name: "every nemesis of the schedule fired".into(),
            metric: "verify.faults_not_reached".into(),
            expected: "0".into(),
            actual: not_reached.to_string(),
            article: None,
            pass: not_reached == 0,
        });
    }
    checks
}

/// The faults of a run that did not fire.
fn not_reached(history: &History) -> Vec<&str> {
    history
        .faults
        .iter()
        .filter(|f| !f.outcome.is_reached())
        .map(|f| f.fault.as_str())
        .collect()
}

/// A row per run: what was written and delivered, each invariant's violations (`*`: claimed),
/// the faults not reached.
fn runs_table(plan: &Plan, verification: &Verification) -> Table {
    // A column per invariant, in the order each row counts them.
    let columns: Vec<&str> = ["schedule", "written", "delivered", "deliveries"]
        .into_iter()
        .chain(Invariant::ALL.map(Invariant::name))
        .chain(plan.replication.map(|_| ACKNOWLEDGED_LOST))
        .chain(["not reached", "s"])
        .collect();
    let mut runs = Table::new("runs: what was written, delivered, and broken", &columns);
    for run in &verification.runs {
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
        if plan.replication.is_some() {
            row.push(run.history.acknowledged_lost.len().to_string());
        }
        let not_reached = not_reached(&run.history);
        row.push(match not_reached.is_empty() {
            true => "-".into(),
            false => not_reached.join(", "),
        });
        row.push(format!("{:.1}", run.history.elapsed_ms as f64 / 1000.0));
        runs.push(row);
    }
    runs
}

/// How many offending ids are shown in a table cell.
const SHOWN_IDS: usize = 10;

/// A row per invariant the main run broke: its offending ids, the smallest schedule that
/// reproduced it and the command line that replays that.
fn violations_table(plan: &Plan, verification: &Verification) -> Table {
    let main = verification.main();
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
        let schedule = smallest_schedule(verification, invariant).to_string();
        violations.push(vec![
            invariant.name().into(),
            if plan.design.claims(invariant) {
                "yes"
            } else {
                "no"
            }
            .into(),
            ids.len().to_string(),
            shown(ids),
            schedule.clone(),
            replay_line(plan, &schedule),
        ]);
    }
    let lost = &main.history.acknowledged_lost;
    if !lost.is_empty() {
        let schedule = &main.history.schedule;
        violations.push(vec![
            ACKNOWLEDGED_LOST.into(),
            "the database's".into(),
            lost.len().to_string(),
            shown(lost),
            schedule.clone(),
            replay_line(plan, schedule),
        ]);
    }
    violations
}

/// The first [`SHOWN_IDS`] of `ids` for a table cell, and how many more there are.
fn shown(ids: &[String]) -> String {
    let mut shown: Vec<String> = ids.iter().take(SHOWN_IDS).cloned().collect();
    if ids.len() > SHOWN_IDS {
        shown.push(format!("... {} more", ids.len() - SHOWN_IDS));
    }
    shown.join(", ")
}

/// The judge's word for an order the writer saw commit and the database lost (a failover):
/// the database's fault, not the relay's, and no claim of the relay's.
const ACKNOWLEDGED_LOST: &str = "acknowledged-lost";

/// The schedule to replay for `invariant`: of the runs that broke it with every fault fired,
/// fewest nemeses first; the main run's unless one nemesis alone reproduced it.
pub(crate) fn smallest_schedule(verification: &Verification, invariant: Invariant) -> &str {
    let broke = |run: &&VerifyRun| {
        run.history.violations.contains_key(invariant.name()) && !run.history.faults_not_reached()
    };
    let smallest = verification.shrunk().iter().find(broke);
    &smallest.unwrap_or(verification.main()).history.schedule
}

/// The command line that runs `schedule` again: every flag that shaped the run.
pub(crate) fn replay_line(plan: &Plan, schedule: &str) -> String {
    let quote = |text: &str| format!("'{}'", text.replace('\'', "'\\''"));
    let mut line = format!(
        "outbox-lab verify --relay-cmd {} --relays {} --events {} --consumer {} --sink {} \
         --time-limit {} --schedule \"{schedule}\"",
        quote(&plan.template.text),
        plan.design.relays,
        plan.events,
        plan.design.consumer.name(),
        plan.sink.name(),
        format_duration(plan.time_limit),
    );
    if plan.design.claims != DEFAULT_CLAIMS {
        let claims: Vec<&str> = plan.design.claims.iter().map(|c| c.name()).collect();
        line.push_str(&format!(" --claims {}", claims.join(",")));
    }
    if let Some((path, _)) = &plan.schema {
        line.push_str(&format!(" --schema {}", quote(path)));
    }
    if let Some(sql) = &plan.pending_sql {
        line.push_str(&format!(" --pending-sql {}", quote(sql)));
    }
    if let Some(sql) = &plan.insert_sql {
        line.push_str(&format!(" --insert-sql {}", quote(sql)));
    }
    if let Some(replication) = plan.replication {
        line.push_str(&format!(" --replication {}", replication.name()));
    }
    if let Some(name) = plan.template.run_as.as_ref().and_then(|r| r.named()) {
        line.push_str(&format!(" --run-as {name}"));
    }
    line
}

/// A row per fault of the run: fired (by whom, when) or not reached.
fn faults_table(history: &History) -> Table {
    let mut faults = Table::new(
        "faults: fired or not reached",
        &["fault", "outcome", "process", "at ms"],
    );
    for fault in &history.faults {
        let (outcome, process, at) = match &fault.outcome {
            FaultOutcome::Fired {
                process,
                at_ms,
                in_flight,
            } => {
                // A batch's ids would make the cell hundreds of characters wide: the first, and
                // how many more (every one in the in-flight table, in the files and the page).
                let process = match in_flight.as_slice() {
                    [] => process.clone(),
                    [id] => format!("{process}, delivering {id}"),
                    [id, more @ ..] => {
                        format!("{process}, delivering {id} and {} more", more.len())
                    }
                };
                ("fired", process, at_ms.to_string())
            }
            FaultOutcome::NotReached { why } => {
                let why = why.clone().unwrap_or_else(|| "-".into());
                ("NOT REACHED", why, "-".into())
            }
        };
        faults.push(vec![fault.fault.clone(), outcome.into(), process, at]);
    }
    faults
}

/// Every event in flight when a fault on a delivery struck, a row each: raw data, in the JSON,
/// the CSV and the page (the faults table shows the first).
fn in_flight_table(history: &History) -> Table {
    let mut in_flight = Table::new(
        "faults: the events in flight when each struck",
        &["fault", "event id"],
    )
    .detail();
    for fault in &history.faults {
        if let FaultOutcome::Fired { in_flight: ids, .. } = &fault.outcome {
            for id in ids {
                in_flight.push(vec![fault.fault.clone(), id.clone()]);
            }
        }
    }
    in_flight
}

/// The relay's latency percentiles and throughput, under every nemesis of the main run.
fn latency_table(figures: &Figures) -> Table {
    let mut latency = Table::new(
        "your relay's latency and throughput",
        &["from", "p50 ms", "p99 ms", "max ms", "events/s"],
    );
    latency.push(vec![
        figures.latency_from().into(),
        figures.latency_p50_ms.to_string(),
        figures.latency_p99_ms.to_string(),
        figures.latency_max_ms.to_string(),
        figures.events_per_s.to_string(),
    ]);
    latency
}

/// The title of the timeline table, which the report page plots.
pub const TIMELINE_TITLE: &str = "timeline: first receipts per 100 ms from the first insert";

/// What the tables do not say: the workload, what latency measures, the liveness bound, how
/// the user's relays ended, and why the verdict is inconclusive or the shrinking cut short.
fn notes(plan: &Plan, verification: &Verification) -> Vec<String> {
    let main = verification.main();
    let from = main.figures.latency_from();
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
            "latency: {from} -> the consumer's first receipt of the event, on the machine's \
             clock (the writer's and the consumer's: never the database server's, which a clock \
             nemesis may step), under every nemesis of the run (a pause or restart shows in p99 \
             and max), less the \
             time a proxy held a delivery on its way while a nemesis struck ({} ms in all: \
             harness time, not the relay's); events/s: distinct events delivered over the span \
             from the first {from} to the last first receipt, so bounded by the writer's pace",
            main.figures.held_ms
        ),
        format!(
            "liveness: the relays must drain within {} s of the writer's end and the last fault \
             (explore's own relays get {} s)",
            plan.bounds.liveness.as_secs(),
            LIVENESS_BOUND.as_secs()
        ),
    ];
    // How the relays ended, when not stopped once drained, and what they left running.
    for process in &main.history.processes {
        let relay = process.process.starts_with("relay");
        if relay && !process.end.starts_with(STOPPED_ONCE_DRAINED) {
            notes.push(format!("{}: {}", process.process, process.end));
        }
    }
    // The writer's sessions that someone or something ended, and it made again.
    for lost in &main.history.sessions_lost {
        notes.push(format!(
            "{} lost its database session ({}) and connected again",
            lost.process, lost.error
        ));
    }
    if let Some(replication) = plan.replication {
        notes.push(format!(
            "db-failover: the outbox's database on a primary with a streaming standby \
             ({} replication), reached by every actor through one address (a virtual IP); the \
             consumer's database apart on the run's server. {ACKNOWLEDGED_LOST}: orders whose \
             COMMIT the writer saw succeed and that the promoted standby does not have ({} in \
             the main run): the database's loss, not the relay's; a shipment of one is a ghost \
             marked \"lost in failover\" (a relay can avoid it only by sending what the \
             standby has confirmed); one whose id the promoted standby gave again to another \
             order (a sequence is WAL-logged 32 values ahead) is taken by the consumer for that \
             order: its shipments then count as the new order's duplicates",
            replication.name(),
            main.history.acknowledged_lost.len()
        ));
    }
    if let Some(why) = verification.inconclusive() {
        notes.insert(
            0,
            format!(
                "INCONCLUSIVE: the run was {why} (--time-limit {}), with {} of {} events \
                 written: liveness and the nemeses are not judged, only the safety invariants \
                 it broke; give a longer --time-limit or fewer --events",
                format_duration(plan.time_limit),
                main.figures.written,
                plan.events
            ),
        );
    }
    if let Some(search) = &plan.search {
        let only = match &search.only {
            Some(kinds) => format!(" --nemesis {}", kinds.join(",")),
            None => String::new(),
        };
        notes.push(format!(
            "search: seed {}, {} schedule(s) drawn and run; replay the search with \
             --search N --seed {}{only}, the finding alone with its --schedule line",
            search.seed,
            verification.searched.len() + 1,
            search.seed,
        ));
    }
    if verification.cut_short {
        notes.push(format!(
            "the search or the shrinking stopped at --time-limit {}: the schedule shown may not \
             be the smallest, and a search may not have run every schedule it drew",
            format_duration(plan.time_limit)
        ));
    }
    notes
}

/// The plan as the report's parameters.
fn params(plan: &Plan) -> serde_json::Value {
    json!({
        "relay_cmd": plan.template.text,
        "relays": plan.design.relays,
        "events": plan.workload.orders * plan.workload.events_per_order,
        "events_per_order": plan.workload.events_per_order,
        "consumer": plan.design.consumer.name(),
        "claims": plan.design.claims.iter().map(|c| c.name()).collect::<Vec<_>>(),
        "nemeses": plan.schedule.nemeses.iter().map(Nemesis::to_string).collect::<Vec<_>>(),
        "schedule": plan.schedule.to_string(),
        "search": plan.search.as_ref().map(|search| json!({
            "schedules": search.schedules.len(),
            "seed": search.seed,
            "nemeses": search.only,
        })),
        "time_limit_s": plan.time_limit.as_secs_f64(),
        "schema": plan.schema.as_ref().map(|(path, _)| path.clone()),
        "pending_sql": plan.pending_sql,
        "insert_sql": plan.insert_sql,
        "replication": plan.replication.map(|r| r.name()),
    })
}

/// A run's line while verify goes: its violations, or none.
pub(super) fn verdict_line(history: &History) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::explore::history::FaultRecord;

    /// A fault that struck a batch of 20 events names the first and the count in its cell; the
    /// in-flight table (files and page only) has every one.
    #[test]
    fn a_batch_in_flight_is_one_id_and_a_count_in_the_faults_table() {
        let ids: Vec<String> = (0..20).map(|k| format!("{k:08}-aaaa-bbbb-cccc")).collect();
        let history = History {
            faults: vec![FaultRecord::new(
                "kill:relay:on-delivery@4".into(),
                FaultOutcome::Fired {
                    process: "relay-0#1 (delivery 4)".into(),
                    at_ms: 12,
                    in_flight: ids.clone(),
                },
            )],
            ..History::default()
        };
        let faults = faults_table(&history);
        assert_eq!(
            faults.rows[0][2],
            format!("relay-0#1 (delivery 4), delivering {} and 19 more", ids[0])
        );
        let in_flight = in_flight_table(&history);
        assert!(in_flight.detail);
        assert_eq!(in_flight.rows.len(), 20);
        assert_eq!(in_flight.rows[19][1], ids[19]);
    }
}
