//! Child processes: the same binary re-executed in a hidden role (`outbox-lab child ROLE`), so
//! that a writer, relay or consumer can die for real at a crash point while the parent watches.
//!
//! The parent side builds the command line ([`ChildCommand`]), waits with a bound, and
//! classifies how the child ended ([`ChildEnd`], in Jepsen's terms: a crash is an `info`, the
//! parent does not know what the child got done). The child side ([`run_role`]) arms its crash
//! plan and runs one component.

use std::fmt;
use std::io::Write;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use uuid::Uuid;

use crate::explore::actors;
use crate::harness::db::Database;
use crate::harness::redis_server;
use crate::harness::throwaway;
use crate::ops::logging::{self, LogFormat};
use crate::outbox::consumer::{self, ConsumerKind, Faults};
use crate::outbox::crash::{self, CrashPlan};
use crate::outbox::relay::cdc::{CdcConfig, CdcRelay};
use crate::outbox::relay::{
    Partition, Relay, RelayConfig, RelayDesign, Wakeup, RELAY_APPLICATION_NAME,
};
use crate::outbox::sink::{HttpSink, Sink, DEFAULT_REQUEST_TIMEOUT};
use crate::outbox::stream_consumer::StreamWorker;
use crate::outbox::writer::{self, DualWriteOrder, Ending};

/// Exit status of a child that died at its crash point (`_exit(1)`).
const CRASH_EXIT_CODE: i32 = 1;
/// Arguments that may carry a password travel to a child in its environment, never on its
/// command line (`ps` shows every local user that): flag name, variable.
const SECRET_ARGS: [(&str, &str); 3] = [
    ("database-url", DATABASE_URL_ENV),
    ("sink", SINK_ENV),
    ("redis-url", REDIS_URL_ENV),
];
const DATABASE_URL_ENV: &str = "OUTBOX_LAB_CHILD_DATABASE_URL";
pub const SINK_ENV: &str = "OUTBOX_LAB_CHILD_SINK";
const REDIS_URL_ENV: &str = "OUTBOX_LAB_CHILD_REDIS_URL";
/// How long a consumer may take to say where it listens.
const CONSUMER_READY_TIMEOUT: Duration = Duration::from_secs(15);

// ---------------------------------------------------------------------------------------------
// Child side

#[derive(Debug, Args)]
pub struct ChildArgs {
    #[command(subcommand)]
    role: Role,
}

/// The database a child works in.
#[derive(Debug, Args)]
struct Target {
    #[arg(long, env = DATABASE_URL_ENV, hide_env_values = true)]
    database_url: String,
    #[arg(long)]
    dbname: String,
    /// Die at this crash point (NAME@PASS).
    #[arg(long)]
    crash_at: Option<CrashPlan>,
}

impl Target {
    async fn connect(&self) -> Result<tokio_postgres::Client> {
        self.database().connect().await
    }

    /// The connection of relay `name`, named so that a scenario can find its session in
    /// pg_stat_activity.
    fn relay_config(&self, name: &str) -> Result<tokio_postgres::Config> {
        let mut db = self.database().config()?;
        db.application_name(format!("{RELAY_APPLICATION_NAME} {name}"));
        Ok(db)
    }

    fn database(&self) -> Database {
        Database {
            server_url: self.database_url.clone(),
            name: self.dbname.clone(),
        }
    }
}

/// Where a relay child delivers.
#[derive(Debug, Args)]
struct SinkArgs {
    /// http://… (the consumer) or redis://… (a stream per aggregate type).
    #[arg(long, env = SINK_ENV, hide_env_values = true)]
    sink: String,
    /// An HTTP delivery unanswered for this long failed.
    #[arg(long, default_value_t = DEFAULT_REQUEST_TIMEOUT.as_millis() as u64)]
    request_timeout_ms: u64,
    #[arg(long, default_value = "")]
    stream_prefix: String,
}

impl SinkArgs {
    fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }

    async fn connect(&self, in_flight: usize) -> Result<Sink> {
        Sink::connect(
            &self.sink,
            in_flight,
            self.request_timeout(),
            &self.stream_prefix,
        )
        .await
    }
}

#[derive(Debug, Subcommand)]
enum Role {
    /// Creates orders, each with its outbox rows in the same transaction.
    Writer {
        #[command(flatten)]
        target: Target,
        #[arg(long, default_value_t = 1)]
        orders: u32,
        #[arg(long, default_value_t = 1)]
        events_per_order: u32,
        #[arg(long, value_enum, default_value = "commit")]
        ending: Ending,
        /// Pace the orders this far apart on average, each shifted by up to ±half of it.
        #[arg(long)]
        interval_ms: Option<u64>,
        /// Chooses the shifts; the same seed gives the same schedule.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Instead of --orders: write as fast as possible for this long.
        #[arg(long)]
        duration_ms: Option<u64>,
        /// Delete the outbox rows again in the same transaction (the Debezium-style outbox).
        #[arg(long)]
        delete_outbox: bool,
    },
    /// The naive app: INSERT the order and POST the event itself.
    NaiveApp {
        #[command(flatten)]
        target: Target,
        #[arg(long, env = SINK_ENV, hide_env_values = true)]
        sink: String,
        #[arg(long)]
        customer_id: i64,
        #[arg(long)]
        event_id: Uuid,
        #[arg(long, value_enum)]
        order: DualWriteOrder,
        #[arg(long, value_enum, default_value = "commit")]
        ending: Ending,
    },
    /// The article's relay: drains the outbox and exits, or follows it until killed.
    Relay {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        sink: SinkArgs,
        #[arg(long)]
        name: String,
        #[arg(long)]
        batch: i64,
        #[arg(long)]
        max_attempts: i32,
        #[arg(long)]
        backoff_ms: u64,
        #[arg(long)]
        deadline_ms: u64,
        #[arg(long, value_enum, default_value = "lock")]
        design: RelayDesign,
        #[arg(long, default_value_t = 30_000)]
        lease_ms: u64,
        /// i/N: only aggregates with abs(hashtext(aggregate_id)) % N = i.
        #[arg(long)]
        partition: Option<Partition>,
        /// The head-of-line guard (NOT EXISTS an earlier undelivered event of the aggregate).
        #[arg(long)]
        guard: bool,
        /// Keep delivering until killed, waking up by poll:MS or notify:MS.
        #[arg(long)]
        follow: Option<Wakeup>,
        /// Aggregates delivered to at once over HTTP.
        #[arg(long, default_value_t = 1)]
        in_flight: usize,
    },
    /// The log-tailing relay: streams the outbox's INSERTs from a replication slot until killed.
    CdcRelay {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        sink: SinkArgs,
        #[arg(long)]
        name: String,
        #[arg(long)]
        slot: String,
        #[arg(long)]
        max_attempts: u32,
        #[arg(long)]
        backoff_ms: u64,
    },
    /// A consumer-group worker on a Redis Stream: its pending entries, then new ones.
    StreamWorker {
        #[command(flatten)]
        target: Target,
        #[arg(long, env = REDIS_URL_ENV, hide_env_values = true)]
        redis_url: String,
        #[arg(long)]
        stream: String,
        #[arg(long)]
        worker: String,
        #[arg(long, value_enum)]
        kind: ConsumerKind,
        #[arg(long)]
        count: usize,
    },
    /// The HTTP consumer; prints `listening URL` and serves until killed.
    Consumer {
        #[command(flatten)]
        target: Target,
        #[arg(long, value_enum)]
        kind: ConsumerKind,
        /// Listen here (0: any free port); a restarted consumer takes its predecessor's port.
        #[arg(long, default_value_t = 0)]
        port: u16,
        #[arg(long, default_value_t = 0)]
        fail_next: u32,
        #[arg(long)]
        fail_first_delivery_of: Option<i64>,
        #[arg(long, default_value_t = 0)]
        delay_ms: u64,
    },
    /// explore's writer: the workload's orders, skipping those already committed.
    ExploreWriter {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        args: actors::WriterArgs,
    },
    /// explore's relay: one relay variant, until its outbox is drained and stdin is closed.
    ExploreRelay {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        args: actors::RelayArgs,
    },
}

impl Role {
    fn target(&self) -> &Target {
        match self {
            Role::Writer { target, .. }
            | Role::NaiveApp { target, .. }
            | Role::Relay { target, .. }
            | Role::CdcRelay { target, .. }
            | Role::StreamWorker { target, .. }
            | Role::Consumer { target, .. }
            | Role::ExploreWriter { target, .. }
            | Role::ExploreRelay { target, .. } => target,
        }
    }
}

pub async fn run_role(args: ChildArgs) -> Result<()> {
    // A child must not outlive the run that started it.
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)?;
    logging::init(LogFormat::Text);
    if let Some(plan) = args.role.target().crash_at {
        crash::arm(plan);
    }
    match args.role {
        Role::Writer {
            target,
            orders,
            events_per_order,
            ending,
            interval_ms,
            seed,
            duration_ms,
            delete_outbox,
        } => {
            let mut client = target.connect().await?;
            let started = Instant::now();
            let until = duration_ms.map(|ms| started + Duration::from_millis(ms));
            for customer_id in 1.. {
                let done = match until {
                    Some(until) => Instant::now() >= until,
                    None => customer_id > i64::from(orders),
                };
                if done {
                    break;
                }
                if let Some(interval_ms) = interval_ms {
                    let at = writer::paced_offset(customer_id as u64 - 1, interval_ms, seed);
                    tokio::time::sleep_until((started + at).into()).await;
                }
                writer::create_order_with_events(
                    &mut client,
                    customer_id,
                    events_per_order,
                    ending,
                    delete_outbox,
                )
                .await?;
            }
        }
        Role::NaiveApp {
            target,
            sink,
            customer_id,
            event_id,
            order,
            ending,
        } => {
            let mut client = target.connect().await?;
            let sink = HttpSink::new(&sink)?;
            writer::dual_write(&mut client, &sink, customer_id, event_id, order, ending).await?;
        }
        Role::Relay {
            target,
            sink,
            name,
            batch,
            max_attempts,
            backoff_ms,
            deadline_ms,
            design,
            lease_ms,
            partition,
            guard,
            follow,
            in_flight,
        } => {
            let config = RelayConfig {
                design,
                lease: Duration::from_millis(lease_ms),
                batch,
                max_attempts,
                backoff_base: Duration::from_millis(backoff_ms),
                deadline: Duration::from_millis(deadline_ms),
                partition,
                head_of_line_guard: guard,
                request_timeout: sink.request_timeout(),
                ..RelayConfig::default()
            };
            let db = target.relay_config(&name)?;
            let sink = sink.connect(in_flight).await?;
            let listen = matches!(follow, Some(Wakeup::Notify { .. }));
            let mut relay = Relay::connect(&db, sink, config, &name, listen).await?;
            match follow {
                // Runs until the parent kills it.
                Some(wakeup) => relay.follow(wakeup, std::future::pending()).await?,
                None => drop(relay.run_until_drained().await?),
            }
        }
        Role::CdcRelay {
            target,
            sink,
            name,
            slot,
            max_attempts,
            backoff_ms,
        } => {
            let config = CdcConfig {
                slot,
                backoff_base: Duration::from_millis(backoff_ms),
                max_attempts,
            };
            let db = target.relay_config(&name)?;
            let sink = sink.connect(1).await?;
            CdcRelay::connect(&db, sink, config, Some(name))
                .await?
                .follow()
                .await?;
        }
        Role::StreamWorker {
            target,
            redis_url,
            stream,
            worker,
            kind,
            count,
        } => {
            let mut worker = StreamWorker {
                redis: redis_server::connect(&redis_url).await?,
                db: consumer::pool(target.database().config()?, 1)?
                    .get()
                    .await?,
                stream,
                name: worker,
                kind,
            };
            let applied = worker.work(count).await?;
            println!("applied {applied}");
        }
        Role::Consumer {
            target,
            kind,
            port,
            fail_next,
            fail_first_delivery_of,
            delay_ms,
        } => {
            let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
            let faults = Faults {
                fail_next,
                fail_first_delivery_of,
                delay: Duration::from_millis(delay_ms),
            };
            let config = target.database().config()?;
            // Serves until the parent kills it.
            let until_killed = std::future::pending();
            consumer::serve(
                listener,
                config,
                kind,
                faults,
                announce_listening,
                until_killed,
            )
            .await?;
        }
        Role::ExploreWriter { target, args } => {
            actors::run_writer(&target.database(), args).await?
        }
        Role::ExploreRelay { target, args } => actors::run_relay(&target.database(), args).await?,
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Parent side

/// How a child ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChildEnd {
    /// Exit 0: it did all it was asked.
    Ok,
    /// It died at its crash point.
    Crashed { point: String },
    /// It stopped with an error (exit 2 and a message).
    Failed { error: String },
    /// Killed by a signal it did not choose.
    Killed { signal: i32 },
    /// It did not finish in time and was killed.
    TimedOut,
}

impl fmt::Display for ChildEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChildEnd::Ok => f.write_str("ok"),
            ChildEnd::Crashed { point } => write!(f, "crashed at {point}"),
            ChildEnd::Failed { error } => write!(f, "failed: {error}"),
            ChildEnd::Killed { signal } => write!(f, "killed by signal {signal}"),
            ChildEnd::TimedOut => f.write_str("timed out"),
        }
    }
}

/// A finished child: how it ended and what it printed.
#[derive(Debug)]
pub struct ChildRun {
    pub end: ChildEnd,
    pub stdout: String,
}

impl ChildRun {
    /// The child's own log lines (relays print the article's `[relay 0] ...` lines).
    pub fn log_lines(&self) -> impl Iterator<Item = &str> {
        self.stdout.lines()
    }

    /// Errors unless the child ended as expected: a scenario whose setup went wrong must not
    /// report figures as if it had worked.
    pub fn expect(self, expected: impl Fn(&ChildEnd) -> bool, what: &str) -> Result<ChildRun> {
        if !expected(&self.end) {
            bail!("{what} {}", self.end);
        }
        Ok(self)
    }
}

/// The command line of a child role.
pub struct ChildCommand {
    args: Vec<String>,
    /// The [`SECRET_ARGS`] given, as environment variables.
    secrets: Vec<(&'static str, String)>,
}

impl ChildCommand {
    pub fn new(role: &str, db: &Database) -> ChildCommand {
        ChildCommand {
            args: vec!["child".into(), role.into()],
            secrets: Vec::new(),
        }
        .arg("database-url", &db.server_url)
        .arg("dbname", &db.name)
    }

    pub fn arg(mut self, name: &str, value: impl fmt::Display) -> ChildCommand {
        match SECRET_ARGS.iter().find(|(secret, _)| *secret == name) {
            Some((_, var)) => self.secrets.push((var, value.to_string())),
            None => {
                self.args.push(format!("--{name}"));
                self.args.push(value.to_string());
            }
        }
        self
    }

    pub fn flag(mut self, name: &str) -> ChildCommand {
        self.args.push(format!("--{name}"));
        self
    }

    /// An option whose value is a clap enum, spelled as on the command line.
    pub fn arg_enum(self, name: &str, value: impl clap::ValueEnum) -> ChildCommand {
        let value = value.to_possible_value().expect("no variant is skipped");
        self.arg(name, value.get_name())
    }

    pub fn crash_at(self, plan: Option<CrashPlan>) -> ChildCommand {
        match plan {
            Some(plan) => self.arg("crash-at", plan),
            None => self,
        }
    }

    fn command(&self, stdin: Stdio) -> Result<Command> {
        let exe = std::env::current_exe().context("cannot find the outbox-lab binary")?;
        let mut cmd = Command::new(exe);
        for (_, var) in SECRET_ARGS {
            cmd.env_remove(var);
        }
        cmd.args(&self.args)
            .envs(self.secrets.iter().map(|(var, value)| (var, value)))
            .stdin(stdin)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        Ok(cmd)
    }

    /// Runs to the end (or kills it after `timeout`) and classifies how it ended.
    pub async fn run(self, timeout: Duration) -> Result<ChildRun> {
        self.spawn()?.finish(timeout).await
    }

    /// Starts it in the background: for children that run until stopped (following relays), or
    /// until they are done and their stdin is closed ([`RunningChild::close_stdin`]).
    pub fn spawn(self) -> Result<RunningChild> {
        let mut child = self
            .command(Stdio::piped())?
            .spawn()
            .context("cannot start a child process")?;
        // Held apart: tokio's `Child::wait` would close it.
        let stdin = child.stdin.take();
        Ok(RunningChild { child, stdin })
    }

    /// Starts a consumer and waits until it says where it listens.
    pub async fn spawn_consumer(self) -> Result<ConsumerProcess> {
        let mut child = self
            .command(Stdio::null())?
            .spawn()
            .context("cannot start the consumer")?;
        let stdout = child.stdout.take().expect("piped");
        let mut lines = BufReader::new(stdout).lines();
        let ready = tokio::time::timeout(CONSUMER_READY_TIMEOUT, lines.next_line()).await;
        match ready {
            Ok(Ok(Some(line))) if line.starts_with("listening ") => {
                let url = line["listening ".len()..].trim().to_string();
                Ok(ConsumerProcess {
                    process: RunningChild { child, stdin: None },
                    url,
                })
            }
            _ => {
                let _ = child.start_kill();
                let mut stderr = String::new();
                if let Some(mut err) = child.stderr.take() {
                    let _ = err.read_to_string(&mut stderr).await;
                }
                Err(anyhow!(
                    "the consumer did not start: {}",
                    throwaway::last_line(&stderr)
                ))
            }
        }
    }
}

/// A child running in the background.
pub struct RunningChild {
    child: Child,
    /// The write end of the child's stdin; dropping it is the "stop when done" signal.
    stdin: Option<ChildStdin>,
}

impl RunningChild {
    /// Resolves when the process has ended (cancel-safe: a `select!` may drop it).
    pub async fn exited(&mut self) {
        let _ = self.child.wait().await;
    }

    /// Closes the child's stdin: end of input, read by the child as "stop when done".
    pub fn close_stdin(&mut self) {
        drop(self.stdin.take());
    }

    /// Waits for its end (or kills it after `timeout`) and classifies how it ended.
    pub async fn finish(self, timeout: Duration) -> Result<ChildRun> {
        match tokio::time::timeout(timeout, self.child.wait_with_output()).await {
            Err(_) => Ok(ChildRun {
                end: ChildEnd::TimedOut,
                stdout: String::new(),
            }),
            Ok(output) => {
                let output = output?;
                let stderr = String::from_utf8_lossy(&output.stderr);
                Ok(ChildRun {
                    end: classify(output.status, &stderr),
                    stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
                })
            }
        }
    }

    /// Kills it and waits until it is gone.
    pub async fn stop(mut self) -> Result<()> {
        let _ = self.child.start_kill();
        self.child.wait().await?;
        Ok(())
    }
}

/// A running consumer child.
pub struct ConsumerProcess {
    process: RunningChild,
    /// Its base URL, e.g. `http://127.0.0.1:41234`.
    pub url: String,
}

impl ConsumerProcess {
    /// Waits until it ends by itself (a crash) and classifies how (cancel-safe).
    pub async fn ended(&mut self) -> Result<ChildEnd> {
        let child = &mut self.process.child;
        let status = child.wait().await?;
        let mut stderr = String::new();
        if let Some(mut err) = child.stderr.take() {
            err.read_to_string(&mut stderr).await?;
        }
        Ok(classify(status, &stderr))
    }

    /// Kills it and waits until it is gone.
    pub async fn stop(self) -> Result<()> {
        self.process.stop().await
    }
}

fn classify(status: std::process::ExitStatus, stderr: &str) -> ChildEnd {
    use std::os::unix::process::ExitStatusExt;
    let crash_line = stderr.lines().find_map(|l| l.strip_prefix("crash point "));
    match (status.code(), status.signal()) {
        (Some(0), _) => ChildEnd::Ok,
        (Some(CRASH_EXIT_CODE), _) if crash_line.is_some() => ChildEnd::Crashed {
            point: crash_line
                .unwrap_or_default()
                .split(' ')
                .next()
                .unwrap_or_default()
                .to_string(),
        },
        (Some(_), _) => ChildEnd::Failed {
            error: throwaway::last_line(stderr)
                .trim_start_matches("outbox-lab: error: ")
                .to_string(),
        },
        (None, Some(signal)) => ChildEnd::Killed { signal },
        (None, None) => ChildEnd::Failed {
            error: "ended without status".into(),
        },
    }
}

/// A consumer child prints `listening URL` once it serves; the parent reads that line.
fn announce_listening(addr: std::net::SocketAddr) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "listening http://{addr}");
    let _ = out.flush();
}
