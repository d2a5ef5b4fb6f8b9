//! The relay zoo: outbox libraries nobody here wrote (`examples/zoo/<name>/`), each run
//! through [`verify`](crate::verify) unmodified under the same workload and nemeses, judged side
//! by side.
//!
//! - [`entry`]: an entry's `zoo.toml` (the library, its promise and design, how verify runs it,
//!   the short run whose verdict it documents) and the runs the zoo makes of it;
//! - [`table`]: the runs as one [`Report`](crate::report::Report): library × invariant, the
//!   findings with their replay lines, the figures without faults, and a check per documented
//!   verdict;
//! - [`cite`]: an entry's citations of its library's source, checked against the installed
//!   package.
//!
//! Here: each entry's runs, one after another on the run's server, each with its own database
//! and private broker. The command (arguments, output) is cmd/zoo.rs.

pub mod cite;
pub mod entry;
pub mod table;

use std::time::Duration;

use anyhow::Result;

use crate::error::{self, Error};
use crate::harness::db::PgServer;
use crate::harness::run_as::RunAs;
use crate::verify;
use crate::verify::plan::Plan;
use crate::verify::run::Verification;
use entry::{Entry, ZooRun};

/// How big and how long each of an entry's runs is, and on whose server.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Events of the faulted and fault-free runs (the documented run has its own).
    pub events: u32,
    pub time_limit: Duration,
    /// The server is the user's: never restarted.
    pub external_server: bool,
    /// How many times each faulted run is made (`--runs`): a cell is k of 2 × runs.
    pub runs: u32,
    /// `--search N --seed S`: N schedules drawn per entry from seed S.
    pub search: Option<(u32, u64)>,
}

/// What the zoo found of one entry.
pub struct EntryResult {
    pub entry: Entry,
    pub outcome: Outcome,
}

pub enum Outcome {
    /// `scripts/setup --zoo` has not installed its library here.
    NotInstalled,
    /// verify refused or could not run it (its relay exits at once, its schema does not apply).
    Failed {
        run: ZooRun,
        why: String,
    },
    Ran(Vec<Judged>),
}

/// One of an entry's runs, as verify planned and ran it.
pub struct Judged {
    pub run: ZooRun,
    /// Which time this run was made (1, 2, ... of `--runs`).
    pub take: u32,
    pub plan: Plan,
    pub verification: Verification,
}

impl Judged {
    /// The invariants its main run broke, with every nemesis fired.
    pub fn broken(&self) -> Vec<crate::judge::invariants::Invariant> {
        let main = &self.verification.main().history;
        crate::judge::invariants::Invariant::ALL
            .into_iter()
            .filter(|i| main.violations.contains_key(i.name()))
            .collect()
    }

    /// Whether `invariant`, broken in its main run, broke again in a run of the shrinking (the
    /// schedule cut down to one nemesis): a violation seen once is not yet a finding.
    pub fn reproduced(&self, invariant: crate::judge::invariants::Invariant) -> bool {
        let mut shrunk = self.verification.shrunk().iter();
        shrunk.any(|run| run.history.violations.contains_key(invariant.name()))
    }

    /// Whether every nemesis of its main run fired (a fault that did not fire tested nothing).
    pub fn all_fired(&self) -> bool {
        !self.verification.main().history.faults_not_reached()
    }
}

/// An entry and the plans of its runs (each with which time it is made); `None` when its
/// library is not installed here.
pub struct Planned {
    pub entry: Entry,
    pub runs: Option<Vec<(ZooRun, u32, Plan)>>,
}

/// Plans `runs` of each installed entry, before any server starts: an entry's bad input (a
/// relay command, a schedule) ends the zoo with nothing left behind.
pub fn plan(
    entries: Vec<Entry>,
    runs: &[ZooRun],
    settings: Settings,
    run_as: Option<&RunAs>,
) -> Result<Vec<Planned>> {
    entries
        .into_iter()
        .map(|entry| {
            let runs = match entry.is_installed() {
                false => None,
                true => Some(
                    runs.iter()
                        .flat_map(|&run| (1..=run.takes(settings)).map(move |take| (run, take)))
                        .map(|(run, take)| {
                            let plan = Plan::new(&entry.options(run, take, settings, run_as))
                                .map_err(|e| e.context(format!("zoo entry {}", entry.name)))?;
                            Ok((run, take, plan))
                        })
                        .collect::<Result<Vec<_>>>()?,
                ),
            };
            Ok(Planned { entry, runs })
        })
        .collect()
}

/// Deals the planned entries into `lanes` lanes in turn, each entry with its place in the
/// table: a lane runs on a server of its own, beside the others (a db:restart in one lane
/// never strikes another's relays).
pub fn deal(planned: Vec<Planned>, lanes: usize) -> Vec<Vec<(usize, Planned)>> {
    let lanes = lanes.clamp(1, planned.len().max(1));
    let mut dealt: Vec<Vec<(usize, Planned)>> = (0..lanes).map(|_| Vec::new()).collect();
    for (place, planned) in planned.into_iter().enumerate() {
        dealt[place % lanes].push((place, planned));
    }
    dealt
}

/// Runs each entry's planned runs on `server`, one after another.
pub async fn run(
    server: &PgServer,
    run_id: &str,
    planned: Vec<Planned>,
    progress: bool,
) -> Result<Vec<EntryResult>> {
    let mut results = Vec::new();
    for Planned { entry, runs } in planned {
        let outcome = match runs {
            None => Outcome::NotInstalled,
            Some(runs) => run_entry(server, run_id, &entry, runs, progress).await?,
        };
        if progress {
            crate::errln!("zoo: {}: {}", entry.name, table::verdict(&entry, &outcome));
        }
        results.push(EntryResult { entry, outcome });
    }
    Ok(results)
}

async fn run_entry(
    server: &PgServer,
    run_id: &str,
    entry: &Entry,
    runs: Vec<(ZooRun, u32, Plan)>,
    progress: bool,
) -> Result<Outcome> {
    let mut judged = Vec::new();
    for (run, take, plan) in runs {
        if progress {
            crate::errln!(
                "zoo: {} ({}): {} run{}",
                entry.name,
                entry.library,
                run.label(),
                run.take_label(take)
            );
        }
        let verified = match plan.steps_the_databases_clock() {
            // A step of the server's clock would outlast the run on the lane's cluster, under
            // the next entry's relays: a cluster of the run's own, on a clock of its own.
            true => on_private_clock(server, &plan, run_id, progress).await,
            false => verify::verify_with_sink(server, &plan, run_id, false, progress).await,
        };
        match verified {
            Ok(verification) => judged.push(Judged {
                run,
                take,
                plan,
                verification,
            }),
            // Ctrl-C, and the harness's own failures, end the zoo; the entry's own (a relay
            // that exits at once, a schema that does not apply) end its row.
            Err(e) => match Error::find(&e) {
                Some(Error::Interrupted(_) | Error::Harness(_)) => return Err(e),
                _ => return Ok(failed(run, &e)),
            },
        }
    }
    Ok(Outcome::Ran(judged))
}

/// Verifies `plan` on a throwaway cluster of its own beside `server`, started on a wall clock of
/// the run's, and stops it: the cluster's failures are the harness's, the verification's its own.
async fn on_private_clock(
    server: &PgServer,
    plan: &Plan,
    run_id: &str,
    progress: bool,
) -> Result<Verification> {
    server
        .on_private_cluster(true, async |private| {
            Ok(verify::verify_with_sink(private, plan, run_id, false, progress).await)
        })
        .await
        .map_err(error::harness)?
}

fn failed(run: ZooRun, e: &anyhow::Error) -> Outcome {
    Outcome::Failed {
        run,
        why: error::one_line(e),
    }
}
