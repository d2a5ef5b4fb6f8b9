//! `outbox-lab explore`: every crash point against every design, with an invariant checker.
//!
//! The parts, in Jepsen's words: the [`designs`] (what runs, what it claims), the generator of
//! [`schedule`]s (exhaustive or seeded random), the [`lab`] that runs a schedule with real
//! processes dying at crash points and restarts them (the clients: their roles are
//! `explore-writer` and `explore-relay` in [`crate::harness::child`]) while the [`nemeses`]
//! strike, the [`faults`] log recording each fault as fired or not reached, the [`watchdog`]
//! that calls a run that does not drain stuck, the [`checker`] that judges the database left behind, and the
//! [`history`] of every run, saved for audit. This file is the engine: checking the options into
//! a [`Plan`], running a design's schedules, and the matrix it reports. The command that drives
//! it (its arguments, the run's server, the output) is `outbox-lab explore` in cmd/explore.rs.

pub mod checker;
pub mod designs;
pub mod faults;
pub mod history;
pub mod lab;
mod matrix;
pub mod nemeses;
pub mod plots;
pub mod schedule;
pub mod watchdog;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use serde_json::json;

use crate::harness::db::PgServer;
use crate::harness::replicated::Replication;
use designs::{Design, Invariant, DESIGNS};
use lab::{Lab, Workload};
use schedule::Schedule;
use schedule::{ClockTarget, Nemesis};

use matrix::Reproducer;
pub use matrix::{render_text, report, DesignResult};

/// The overlap of the two writer sessions: long enough that a relay polling every 5 ms sees
/// the later order before the earlier one commits.
const WRITER_OVERLAP: Duration = Duration::from_millis(40);
/// The default workload: small enough for a quick run, two events per order for `order`.
pub const DEFAULT_ORDERS: u32 = 4;
pub const DEFAULT_EVENTS_PER_ORDER: u32 = 2;

/// What to explore, as given on the command line (`outbox-lab explore`'s options): checked
/// into a [`Plan`] by [`Plan::new`].
#[derive(Debug)]
pub struct Options {
    /// Designs by name (empty: all).
    pub designs: Vec<String>,
    /// Draw this many random schedules per design instead of every single fault.
    pub random: Option<u32>,
    /// Seed of `random`.
    pub seed: Option<u64>,
    /// This one schedule, as text.
    pub schedule: Option<String>,
    /// Faults name passes 1 to this.
    pub max_pass: u32,
    /// Orders the writer creates in every run.
    pub orders: u32,
    /// Events per order.
    pub events_per_order: u32,
    /// The server is the user's (`--database-url`), not the throwaway cluster: it is never
    /// restarted.
    pub external_server: bool,
}

/// How the schedules are generated.
#[derive(Debug, Clone)]
enum Mode {
    Exhaustive,
    Random { count: u32, seed: u64 },
    One(Schedule),
}

/// The checked arguments: what to run.
pub struct Plan {
    pub designs: Vec<&'static Design>,
    mode: Mode,
    max_pass: u32,
    workload: Workload,
    /// Whether the database may be restarted (db:restart): only the throwaway cluster.
    restartable: bool,
}

impl Plan {
    /// Whether its schedule steps the database server's wall clock: the throwaway cluster then
    /// starts on a clock of the run's.
    pub fn steps_the_databases_clock(&self) -> bool {
        let Mode::One(schedule) = &self.mode else {
            return false;
        };
        schedule.nemeses.iter().any(|n| {
            matches!(
                n,
                Nemesis::ClockStep {
                    target: ClockTarget::Db,
                    ..
                }
            )
        })
    }

    pub fn new(args: &Options) -> Result<Plan> {
        let explicit = !args.designs.is_empty();
        let mut designs = if explicit {
            args.designs
                .iter()
                .map(|name| Design::find(name).map_err(|e| anyhow!(e)))
                .collect::<Result<Vec<_>>>()?
        } else {
            DESIGNS.iter().collect()
        };
        if !(1..=10).contains(&args.max_pass) {
            bail!("--max-pass {} must be between 1 and 10", args.max_pass);
        }
        if !(1..=50).contains(&args.orders) {
            bail!("--orders {} must be between 1 and 50", args.orders);
        }
        if !(1..=9).contains(&args.events_per_order) {
            bail!(
                "--events-per-order {} must be between 1 and 9",
                args.events_per_order
            );
        }
        let mode = match (&args.schedule, args.random, args.seed) {
            (Some(_), Some(_), _) => bail!("--schedule and --random exclude each other"),
            (_, None, Some(_)) => bail!("--seed only applies to --random"),
            (Some(text), None, None) => {
                let schedule: Schedule = text
                    .parse()
                    .map_err(|e| anyhow!("invalid --schedule: {e}"))?;
                let throwaway_only = schedule
                    .nemeses
                    .iter()
                    .find(|n| n.needs_throwaway_cluster());
                if let (true, Some(nemesis)) = (args.external_server, throwaway_only) {
                    bail!(
                        "'{nemesis}' strikes the throwaway cluster only (outbox-lab restarts no \
                         server of yours, nor sets its clock): run it without --database-url"
                    );
                }
                let fits = |d: &&Design| {
                    let points = d.crash_points();
                    let pauses = schedule.nemeses.iter().filter_map(Nemesis::crash_point);
                    schedule
                        .faults
                        .iter()
                        .map(|f| f.plan.point)
                        .chain(pauses)
                        .all(|point| points.contains(&point))
                };
                if explicit {
                    if let Some(d) = designs.iter().find(|d| !fits(d)) {
                        let points: Vec<&str> = d.crash_points().iter().map(|p| p.name()).collect();
                        let points = match points.is_empty() {
                            true => "it runs only without faults".to_string(),
                            false => format!("its points: {}", points.join(", ")),
                        };
                        bail!(
                            "invalid --schedule: design {} never passes a crash point it names \
                             ({points})",
                            d.name,
                        );
                    }
                }
                designs.retain(fits);
                if designs.is_empty() {
                    bail!("invalid --schedule: no design passes all its crash points");
                }
                Mode::One(schedule)
            }
            (None, Some(0), _) => bail!("--random needs at least 1 schedule"),
            (None, Some(count), seed) => Mode::Random {
                count,
                seed: seed.unwrap_or(1),
            },
            (None, None, None) => Mode::Exhaustive,
        };
        Ok(Plan {
            designs,
            mode,
            max_pass: args.max_pass,
            restartable: !args.external_server,
            workload: Workload {
                orders: args.orders,
                events_per_order: args.events_per_order,
                overlap: WRITER_OVERLAP,
            },
        })
    }

    fn schedules(&self, design: &Design) -> Vec<Schedule> {
        let points = design.crash_points();
        match &self.mode {
            Mode::Exhaustive | Mode::Random { .. } if points.is_empty() => {
                vec![Schedule::default()]
            }
            Mode::Exhaustive => {
                let mut all = Schedule::exhaustive(&points, self.max_pass);
                all.extend(nemeses::default_schedules(design, self.restartable));
                all
            }
            Mode::Random { count, seed } => {
                Schedule::random(&points, self.max_pass, *count, *seed, design.index())
            }
            Mode::One(schedule) => vec![schedule.clone()],
        }
    }

    fn params(&self) -> serde_json::Value {
        let designs: Vec<&str> = self.designs.iter().map(|d| d.name).collect();
        let nemeses: BTreeMap<&str, Vec<String>> = self
            .designs
            .iter()
            .map(|d| {
                let schedules = self.schedules(d);
                let struck = schedules.iter().flat_map(|s| &s.nemeses);
                (d.name, struck.map(Nemesis::to_string).collect::<Vec<_>>())
            })
            .filter(|(_, struck)| !struck.is_empty())
            .collect();
        let mut params = json!({
            "designs": designs,
            "nemeses": nemeses,
            "max_pass": self.max_pass,
            "orders": self.workload.orders,
            "events_per_order": self.workload.events_per_order,
            "writer_overlap_ms": self.workload.overlap.as_millis() as u64,
        });
        match &self.mode {
            Mode::Exhaustive => params["mode"] = "exhaustive".into(),
            Mode::Random { count, seed } => {
                params["mode"] = "random".into();
                params["random"] = (*count).into();
                params["seed"] = (*seed).into();
            }
            Mode::One(schedule) => {
                params["mode"] = "schedule".into();
                params["schedule"] = schedule.to_string().into();
            }
        }
        params
    }

    /// The command line that runs `schedule` on `design` with this workload.
    fn command_line(&self, design: &Design, schedule: &str) -> String {
        let mut line = format!(
            "outbox-lab explore --design {} --schedule \"{schedule}\"",
            design.name
        );
        if self.workload.orders != DEFAULT_ORDERS {
            line.push_str(&format!(" --orders {}", self.workload.orders));
        }
        if self.workload.events_per_order != DEFAULT_EVENTS_PER_ORDER {
            line.push_str(&format!(
                " --events-per-order {}",
                self.workload.events_per_order
            ));
        }
        line
    }
}

/// Violating schedules run a second time, smallest first, until one breaks the invariant again.
const RERUN_CANDIDATES: usize = 3;

/// Runs every schedule of `design` on `server`, then runs the smallest violating ones a
/// second time.
pub async fn explore_design(
    server: &PgServer,
    plan: &Plan,
    design: &'static Design,
    progress: bool,
) -> Result<DesignResult> {
    let clock = Instant::now();
    let schedules = plan.schedules(design);
    // A failover needs the design's database on a replicated pair (asynchronous: what loses).
    let fails_over = schedules
        .iter()
        .flat_map(|s| &s.nemeses)
        .any(|n| matches!(n, Nemesis::DbFailover { .. }));
    let replication = fails_over.then_some(Replication::Async);
    let lab = Lab::prepare(server, design, plan.workload, replication).await?;
    let mut runs = Vec::with_capacity(schedules.len());
    for schedule in &schedules {
        runs.push(lab.run(schedule).await?);
    }
    let mut result = DesignResult {
        design,
        runs,
        reproducers: BTreeMap::new(),
    };
    let run_twice = !matches!(plan.mode, Mode::One(_));
    let mut reruns = Vec::new();
    for invariant in Invariant::ALL {
        let candidates: Vec<Reproducer> = result
            .smallest_first(invariant)
            .into_iter()
            .map(|run| Reproducer {
                schedule: run.schedule.clone(),
                offending: run.violations[invariant.name()].clone(),
                again: None,
            })
            .collect();
        let mut shown = None;
        if run_twice {
            for candidate in candidates.iter().take(RERUN_CANDIDATES) {
                let schedule: Schedule = candidate.schedule.parse().expect("printed by Schedule");
                let mut rerun = lab.run(&schedule).await?;
                rerun.rerun_of = Some(invariant.name().to_string());
                let again = rerun.violations.contains_key(invariant.name());
                reruns.push(rerun);
                if again {
                    shown = Some(Reproducer {
                        again: Some(true),
                        ..candidate.clone()
                    });
                    break;
                }
            }
        }
        let shown = shown.or_else(|| {
            candidates.first().map(|first| Reproducer {
                again: run_twice.then_some(false),
                ..first.clone()
            })
        });
        if let Some(shown) = shown {
            result.reproducers.insert(invariant, shown);
        }
    }
    result.runs.extend(reruns);
    if progress {
        crate::errln!(
            "explore: {} ran {} schedules in {:.1} s",
            design.name,
            schedules.len(),
            clock.elapsed().as_secs_f64()
        );
    }
    Ok(result)
}
