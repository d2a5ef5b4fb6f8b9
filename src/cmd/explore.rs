//! `outbox-lab explore`: its arguments, the run's server, and what it prints; the engine (plan,
//! designs, schedules, checker, the matrix) is [`crate::explore`].

use std::process::ExitCode;
use std::time::Instant;

use anyhow::Result;
use clap::Args;

use super::{outln, Format, RunArgs};
use crate::error::{self, exit};
use crate::explore::{self, history, schedule, Options, Plan};
use crate::harness::db::{PgServer, ServerChoice};
use crate::harness::run::{new_run_id, on_server};
use crate::report::{Environment, Table};

pub const EXAMPLES: &str = "\
Examples:
  outbox-lab explore                                    # all designs, every single crash
  outbox-lab explore --design outbox-idempotent --random 500 --seed 7
  outbox-lab explore --design outbox-idempotent \\
      --schedule \"relay:after-send@3,consumer:after-commit@2\"
  outbox-lab explore --design watermark-relay --format json

A schedule lists faults ROLE:STEP@PASS (roles writer, relay, consumer; STEP a crash point
without its role, or a unique start of it, see `outbox-lab crash-points`; PASS from 1).
Faults of one role fire in order, one per process: after a crash the restarted process gets
the next. In designs with several relays, relay faults hit the first. A schedule may also
hold nemeses (pause:relay@60ms+300ms, db:restart@60ms, net:reply-lost@2, ...: see
`outbox-lab explore --list-nemeses`).

Designs: dual-write-commit-first, dual-write-send-first, outbox-naive, outbox-idempotent,
outbox-idempotent-ordered, claim-lease-fenced, and the deliberately broken watermark-relay,
mark-before-send, multi-relay-unpartitioned, claim-lease, guarded-no-dead-letter.

A schedule whose fault is never reached (its process never passes the point that often) is
reported apart and counts for no claim.

Exit status: 0 every design holds what it claims and shows its flaw, 1 a design violated or
never tested a claim, or did not show its flaw (the checker would be blind to it), 2 bad input,
3 the harness failed mid-run.";

#[derive(Debug, Args)]
pub struct ExploreArgs {
    /// A design to explore (repeat for several; default: all).
    #[arg(long = "design", value_name = "NAME")]
    designs: Vec<String>,
    /// Draw N random schedules of 1 to 3 faults per design instead of every single fault.
    #[arg(long, value_name = "N")]
    random: Option<u32>,
    /// Seed of --random (the same seed draws the same schedules).
    #[arg(long, value_name = "S")]
    seed: Option<u64>,
    /// Run this one schedule, e.g. "relay:after-send@3,consumer:after-commit@2" (or none).
    #[arg(long, value_name = "FAULTS")]
    schedule: Option<String>,
    /// Faults name passes 1 to this.
    #[arg(long, default_value_t = 3, value_name = "N")]
    max_pass: u32,
    /// Orders the writer creates in every run.
    #[arg(long, default_value_t = explore::DEFAULT_ORDERS, value_name = "N")]
    orders: u32,
    /// Events per order (OrderCreated, OrderUpdated2, ...), in the order's transaction.
    #[arg(long, default_value_t = explore::DEFAULT_EVENTS_PER_ORDER, value_name = "N")]
    events_per_order: u32,
    /// List the nemeses a schedule may hold, with their forms, and exit.
    #[arg(long)]
    list_nemeses: bool,
    #[command(flatten)]
    run: RunArgs,
}

impl ExploreArgs {
    fn options(&self) -> Options {
        Options {
            designs: self.designs.clone(),
            random: self.random,
            seed: self.seed,
            schedule: self.schedule.clone(),
            max_pass: self.max_pass,
            orders: self.orders,
            events_per_order: self.events_per_order,
            external_server: self.run.database_url.is_some(),
        }
    }
}

/// `outbox-lab explore`.
pub async fn run(args: ExploreArgs) -> Result<ExitCode> {
    if args.list_nemeses {
        return list_nemeses();
    }
    // Everything is checked before a server is started: bad input leaves nothing behind.
    let plan = Plan::new(&args.options())?;
    let run_id = new_run_id();
    let results_dir = args.run.results_dir.join(&run_id);
    let started_at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let text = args.run.format == Format::Text;
    let choice = ServerChoice {
        fake_clock: plan.steps_the_databases_clock(),
        ..args.run.server_choice()
    };
    let (results, version, kind, elapsed) =
        on_server(&choice, &run_id, async |server: &PgServer| {
            let clock = Instant::now();
            let mut results = Vec::new();
            for design in &plan.designs {
                let result = explore::explore_design(server, &plan, design, text)
                    .await
                    .map_err(error::harness)?;
                history::save(&results_dir, design.name, &result.runs)?;
                results.push(result);
            }
            Ok((
                results,
                server.version.clone(),
                server.kind(),
                clock.elapsed(),
            ))
        })
        .await?;
    let report = explore::report(
        &plan,
        &results,
        elapsed,
        Environment {
            postgres_version: version,
            outbox_lab_version: env!("CARGO_PKG_VERSION").to_string(),
            started_at,
            elapsed_ms: elapsed.as_millis() as u64,
            server: kind.to_string(),
        },
    );
    super::finish_run(&report, &results_dir, args.run.format, explore::render_text)
}

/// `outbox-lab explore --list-nemeses`: every nemesis, its form, what it does.
fn list_nemeses() -> Result<ExitCode> {
    let mut table = Table::new("nemeses", &["nemesis", "in a schedule", "what it does"]);
    for (name, form, what) in schedule::KINDS {
        table.push(vec![name.into(), form.into(), what.into()]);
    }
    outln!("{}", table.render())?;
    outln!(
        "\nAT and FOR are durations (60ms, 1.5s) from the start of the run; N counts passes of a \
         crash point or requests through the proxy. ROLE is writer, relay (relay 0) or consumer. \
         A nemesis that fires is recorded with its process and moment, else as not reached."
    )?;
    Ok(ExitCode::from(exit::OK))
}
