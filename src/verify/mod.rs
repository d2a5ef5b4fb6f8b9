//! `outbox-lab verify`: the user's relay — any command, any language — put through the
//! nemeses and judged by the same checker as explore's designs.
//!
//! The parts are explore's: the [`Lab`] runs a schedule (the writer and the consumer are ours,
//! the relays the user's command, restarted whenever they end), the nemeses strike on a clock
//! (a foreign process has no crash points), and the checker reads the database it left. verify
//! goes plan, run, verdict:
//! - [`plan`]: the options checked up front and turned into what will run (the relay
//!   template, the schedule the chosen nemeses make, the workload, the bounds, the sink);
//! - [`run`]: one schedule through the lab, and what its database says besides the verdict
//!   (latency and throughput of the relay, the timeline of deliveries);
//! - [`verdict`]: the runs judged and printed: the [`Report`](crate::report::Report), the
//!   replay line, an inconclusive run;
//! - [`plots`]: the timeline of deliveries and faults on the report page.
//! - [`search`]: `--search`'s schedules, drawn from the nemesis grammar before anything runs.
//!
//! [`verify_with_sink`] here ties them, on the sink's private broker: the plan's schedule is
//! run, and a violation found under every nemesis is run again under each one alone
//! (shrinking), to name the smallest schedule that reproduces it, until every claim it broke
//! broke again alone. The command (arguments, server, output) is cmd/verify.rs.

pub mod plan;
pub mod plots;
pub mod run;
pub mod search;
pub mod verdict;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::explore::lab::Lab;
use crate::explore::schedule::Schedule;
use crate::harness::brokers::{BrokerUrls, Brokers};
use crate::harness::db::PgServer;
use plan::{Plan, VerifySink};
use run::{Verification, VerifyRun};

/// Runs the plan on `server` with a private Redis, NATS, RabbitMQ or Kafka, started only for its
/// sink and gone with the verification (`keep`: left running, as `--keep` says).
pub async fn verify_with_sink(
    server: &PgServer,
    plan: &Plan,
    run_id: &str,
    keep: bool,
    progress: bool,
) -> Result<Verification> {
    let brokers = Brokers::new(BrokerUrls::default(), run_id, keep);
    let broker_url = match plan.sink {
        VerifySink::Redis => brokers.redis.url().await.map(Some),
        VerifySink::Nats => brokers.nats.url().await.map(Some),
        VerifySink::Amqp => brokers.amqp.url().await.map(Some),
        VerifySink::Kafka => brokers.kafka.url().await.map(Some),
        VerifySink::Http => Ok(None),
    };
    let verified = match broker_url {
        Ok(url) => verify(server, plan, url, progress).await,
        Err(e) => Err(e),
    };
    brokers.close().await?;
    verified
}

/// Runs the plan on `server`; the relays deliver to our HTTP consumer, or to the broker at
/// `broker_url` (Redis, NATS, RabbitMQ or Kafka, as `--sink` says).
async fn verify(
    server: &PgServer,
    plan: &Plan,
    broker_url: Option<String>,
    progress: bool,
) -> Result<Verification> {
    let clock = Instant::now();
    let relays = plan.relays(broker_url);
    let lab = Lab::prepare_foreign(
        server,
        plan.design,
        plan.workload,
        relays,
        plan.bounds,
        plan.replication,
    )
    .await?;
    let broke_a_claim = |run: &VerifyRun| {
        let mut claims = plan.design.claims.iter();
        claims.any(|claim| run.history.violations.contains_key(claim.name()))
    };
    // The next run, likely as long as `last`, must end within the limit.
    let no_time_after = |last: &VerifyRun| {
        clock.elapsed() + Duration::from_millis(last.history.elapsed_ms) > plan.time_limit
    };
    // The main run: the plan's schedule, or (`--search`) the first drawn schedule that breaks a
    // claim (the last drawn when none does); the drawn ones before it are the search's.
    let drawn = match &plan.search {
        Some(search) => search.schedules.as_slice(),
        None => std::slice::from_ref(&plan.schedule),
    };
    let mut searched: Vec<VerifyRun> = Vec::new();
    let mut main = None;
    let mut cut_short = false;
    for (k, schedule) in drawn.iter().enumerate() {
        if searched.last().is_some_and(no_time_after) {
            cut_short = true;
            break;
        }
        let run = run::once(&lab, schedule).await?;
        if progress {
            let judged = verdict::verdict_line(&run.history);
            let draw = match plan.search {
                Some(_) => format!(" (draw {} of {})", k + 1, drawn.len()),
                None => String::new(),
            };
            crate::errln!(
                "verify: {schedule}{draw}: {judged} in {:.1} s",
                run.history.elapsed_ms as f64 / 1000.0
            );
        }
        if broke_a_claim(&run) || k + 1 == drawn.len() {
            main = Some(run);
            break;
        }
        searched.push(run);
    }
    let main = match main {
        Some(main) => main,
        // The time limit ended the search: its last run stands for it.
        None => searched
            .pop()
            .expect("the search ran a schedule before the limit"),
    };
    // Shrinking: each nemesis of the main run alone, where it broke a claim.
    let mut schedules = VecDeque::new();
    let schedule: Schedule = main
        .history
        .schedule
        .parse()
        .expect("a run's schedule parses");
    if !plan.replay && broke_a_claim(&main) && schedule.nemeses.len() > 1 {
        schedules.extend(schedule.nemeses.iter().map(|&nemesis| Schedule {
            faults: Vec::new(),
            nemeses: vec![nemesis],
        }));
    }
    // The claims the main run broke: shrinking stops once each broke again under one nemesis
    // alone (its smallest schedule is found; the rest would only say so again).
    let mut unreproduced: Vec<&str> = plan
        .design
        .claims
        .iter()
        .map(|claim| claim.name())
        .filter(|claim| main.history.violations.contains_key(*claim))
        .collect();
    let mut runs = vec![main];
    while let Some(schedule) = schedules.pop_front() {
        if unreproduced.is_empty() {
            break;
        }
        if no_time_after(&runs[0]) {
            cut_short = true;
            break;
        }
        let run = run::once(&lab, &schedule).await?;
        if progress {
            let judged = verdict::verdict_line(&run.history);
            crate::errln!("verify: {schedule} alone: {judged}");
        }
        unreproduced.retain(|claim| !run.history.violations.contains_key(*claim));
        runs.push(run);
    }
    Ok(Verification {
        runs,
        searched,
        cut_short,
        elapsed: clock.elapsed(),
    })
}
