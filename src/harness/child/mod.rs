//! Child processes: the same binary re-executed in a role (`outbox-lab child ROLE`), so that a
//! writer, relay or consumer can die for real at a crash point while the parent watches.
//!
//! The parent fills the role's type ([`role`]: one type per role, shared with the child) and
//! starts it with [`ChildCommand`], waits with a bound, and classifies how the child ended
//! ([`ChildEnd`], in Jepsen's terms: a crash is an `info`, the parent does not know what the
//! child got done). A crash is recognised by its exit status alone
//! ([`exit::CRASHED`]), and its point is the one the parent planned.
//!
//! Each child leads a process group of its own ([`GroupLeader`]): stopping it, killing it or
//! dropping it reaches whatever it started, and a Ctrl-C at the terminal reaches the parent
//! alone, which stops its children in order.

pub mod role;
mod run;

use std::fmt;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, BufReader};
use tokio::process::{ChildStdin, Command};

use crate::error::exit;
use crate::harness::db::Database;
use crate::harness::process_group::GroupLeader;
use crate::harness::throwaway;
use crate::outbox::crash::{CrashPlan, CrashPoint};
pub use role::{ChildArgs, Role};
pub use run::run_role;

/// Starts the line on which a child gives the parent its account (JSON of a type both sides
/// share, e.g. a relay's [`BatchTimings`](crate::outbox::relay::BatchTimings)).
pub const REPORT_PREFIX: &str = "report ";

/// How long a consumer may take to say where it listens.
const CONSUMER_READY_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a child being stopped has after SIGTERM before SIGKILL (ours handle no SIGTERM:
/// they end at once).
const STOP_GRACE: Duration = Duration::from_secs(5);

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

impl ChildEnd {
    /// Whether it died at `point`: a crash scenario checks that its crash happened, since a
    /// child that failed before its crash point can leave the same counts.
    pub fn crashed_at(&self, point: CrashPoint) -> bool {
        matches!(self, ChildEnd::Crashed { point: at } if *at == point.name())
    }
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
        self.stdout
            .lines()
            .filter(|line| !line.starts_with(REPORT_PREFIX))
    }

    /// The account the child gave on its [`REPORT_PREFIX`] line.
    pub fn report<T: serde::de::DeserializeOwned>(&self) -> Result<T> {
        let line = self
            .stdout
            .lines()
            .find_map(|line| line.strip_prefix(REPORT_PREFIX))
            .ok_or_else(|| anyhow!("the child gave no report"))?;
        serde_json::from_str(line).context("the child's report is unreadable")
    }

    /// Errors unless the child ended as expected: a scenario whose setup went wrong must not
    /// report figures as if it had worked.
    pub fn expect(self, expected: impl Fn(&ChildEnd) -> bool, what: &str) -> Result<ChildRun> {
        if !expected(&self.end) {
            // Its last words say where it was (a child that timed out, above all).
            let lines: Vec<&str> = self.log_lines().collect();
            let last = lines[lines.len().saturating_sub(3)..].join(" | ");
            match last.is_empty() {
                true => bail!("{what} {}", self.end),
                false => bail!("{what} {} (its last lines: {last})", self.end),
            }
        }
        Ok(self)
    }
}

/// A child to start: its role (of type `R`, changeable until it starts), its database, its
/// crash plan.
pub struct ChildCommand<R> {
    database: Database,
    crash_at: Option<CrashPlan>,
    pause_at: Option<CrashPlan>,
    /// The claims of its crash and pause, where other processes are armed with them too.
    claims: (Option<PathBuf>, Option<PathBuf>),
    /// What it runs with beside its spec (a wall clock of the run's).
    env: Vec<(String, String)>,
    pub role: R,
}

impl<R: Into<Role> + Clone> ChildCommand<R> {
    pub fn new(database: &Database, role: R) -> ChildCommand<R> {
        ChildCommand {
            database: database.clone(),
            crash_at: None,
            pause_at: None,
            claims: (None, None),
            env: Vec::new(),
            role,
        }
    }

    /// The same child, its role's type forgotten (for a choice among roles).
    pub fn any_role(self) -> ChildCommand<Role> {
        ChildCommand {
            database: self.database,
            crash_at: self.crash_at,
            pause_at: self.pause_at,
            claims: self.claims,
            env: self.env,
            role: self.role.into(),
        }
    }

    /// Changes the role before it starts.
    pub fn with(mut self, change: impl FnOnce(&mut R)) -> ChildCommand<R> {
        change(&mut self.role);
        self
    }

    pub fn crash_at(mut self, plan: Option<CrashPlan>) -> ChildCommand<R> {
        self.crash_at = plan;
        self
    }

    /// Where it stops itself for a pause nemesis (the parent sends SIGCONT).
    pub fn pause_at(mut self, plan: Option<CrashPlan>) -> ChildCommand<R> {
        self.pause_at = plan;
        self
    }

    /// Runs it with `env` beside its spec (a wall clock of the run's: [`FakeClock::env`]).
    ///
    /// [`FakeClock::env`]: crate::harness::clock::FakeClock::env
    pub fn env(mut self, env: Vec<(String, String)>) -> ChildCommand<R> {
        self.env = env;
        self
    }

    /// Its crash and its pause are other processes' too: only the first to reach one, which
    /// creates its claim (a file at that path), fires it.
    pub fn first_to_reach(
        mut self,
        crash: Option<PathBuf>,
        pause: Option<PathBuf>,
    ) -> ChildCommand<R> {
        self.claims = (crash, pause);
        self
    }

    fn command(&self, stdin: Stdio) -> Result<Command> {
        let spec = role::ChildSpec {
            database: self.database.clone(),
            crash_at: self.crash_at,
            pause_at: self.pause_at,
            crash_claim: self.claims.0.clone(),
            pause_claim: self.claims.1.clone(),
            role: self.role.clone().into(),
        };
        let exe = std::env::current_exe().context("cannot find the outbox-lab binary")?;
        let mut cmd = Command::new(exe);
        cmd.args(["child", spec.role.name()])
            .env(role::SPEC_ENV, serde_json::to_string(&spec)?)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(stdin)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let parent = std::process::id();
        // Armed before exec, not by the child once it runs: a parent that dies in between
        // would leave it running for good. (If the parent is already gone, it ends here.)
        // SAFETY: prctl and getppid are async-signal-safe; nothing else runs before exec.
        unsafe {
            cmd.pre_exec(move || {
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)?;
                if nix::unistd::getppid().as_raw() as u32 != parent {
                    return Err(std::io::Error::other(
                        "outbox-lab ended before its child started",
                    ));
                }
                Ok(())
            });
        }
        Ok(cmd)
    }

    /// Runs to the end (or kills it after `timeout`) and classifies how it ended.
    pub async fn run(self, timeout: Duration) -> Result<ChildRun> {
        self.spawn()?.finish(timeout).await
    }

    /// Starts it in the background: for children that run until stopped (following relays), or
    /// until they are done and their stdin is closed ([`RunningChild::close_stdin`]).
    pub fn spawn(self) -> Result<RunningChild> {
        let mut process = GroupLeader::spawn(&mut self.command(Stdio::piped())?)
            .context("cannot start a child process")?;
        // Held apart: tokio's `Child::wait` would close it.
        let stdin = process.child_mut().stdin.take();
        Ok(RunningChild {
            process,
            stdin,
            crash_at: self.crash_at,
        })
    }

    /// Starts a consumer and waits until it says where it listens.
    pub async fn spawn_consumer(self) -> Result<ConsumerProcess> {
        // The consumer is outbox-lab's own: a failure to start it (its binary replaced by a
        // build mid-run) is the harness's, never the relay's under test.
        let mut process = GroupLeader::spawn(&mut self.command(Stdio::null())?)
            .context("cannot start the consumer")
            .map_err(crate::error::harness)?;
        let stdout = process.child_mut().stdout.take().expect("piped");
        let mut lines = BufReader::new(stdout).lines();
        let ready = tokio::time::timeout(CONSUMER_READY_TIMEOUT, lines.next_line()).await;
        match ready {
            Ok(Ok(Some(line))) if line.starts_with("listening ") => {
                let url = line["listening ".len()..].trim().to_string();
                Ok(ConsumerProcess {
                    process: RunningChild {
                        process,
                        stdin: None,
                        crash_at: self.crash_at,
                    },
                    url,
                })
            }
            _ => {
                process.signal_group(nix::sys::signal::Signal::SIGKILL);
                let stderr = read_all(process.child_mut().stderr.take()).await;
                let stderr = String::from_utf8_lossy(&stderr);
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
    /// The child, leading the group of whatever it starts.
    process: GroupLeader,
    /// The write end of the child's stdin; dropping it is the "stop when done" signal.
    stdin: Option<ChildStdin>,
    /// Where it was told to die: the point of a crash it ends with.
    crash_at: Option<CrashPlan>,
}

impl RunningChild {
    /// Its pid while it has not been waited for (a nemesis proves it is ours before signalling).
    pub fn pid(&self) -> Option<u32> {
        self.process.id()
    }

    /// Resolves when the process has ended, and whatever it started with it (cancel-safe: a
    /// `select!` may drop it).
    pub async fn exited(&mut self) {
        let _ = self.process.wait().await;
    }

    /// Closes the child's stdin: end of input, read by the child as "stop when done".
    pub fn close_stdin(&mut self) {
        drop(self.stdin.take());
    }

    /// The write end of its stdin, held apart: [`RunningChild::finish`] then reads its output
    /// while it runs, and dropping this tells it to stop (a following relay).
    pub fn take_stdin(&mut self) -> Option<ChildStdin> {
        self.stdin.take()
    }

    /// Waits for its end (or kills it, its group with it, after `timeout`) and classifies how
    /// it ended.
    pub async fn finish(mut self, timeout: Duration) -> Result<ChildRun> {
        // Read beside the wait: a child that timed out still says what it printed until then.
        let stdout = tokio::spawn(read_all(self.process.child_mut().stdout.take()));
        let stderr = tokio::spawn(read_all(self.process.child_mut().stderr.take()));
        let status = tokio::time::timeout(timeout, self.process.wait()).await;
        if status.is_err() {
            self.process.signal_group(nix::sys::signal::Signal::SIGKILL);
            self.process.wait().await?;
        }
        let stdout = String::from_utf8_lossy(&stdout.await.unwrap_or_default()).into_owned();
        let stderr = stderr.await.unwrap_or_default();
        let end = match status {
            Err(_) => ChildEnd::TimedOut,
            Ok(status) => classify(status?, &String::from_utf8_lossy(&stderr), self.crash_at),
        };
        Ok(ChildRun { end, stdout })
    }

    /// [`RunningChild::finish`], each line of its output told to `line` as it comes: what it
    /// said before a run that drops this is cut short is not lost with it.
    pub async fn finish_telling(
        mut self,
        timeout: Duration,
        line: &mut (dyn FnMut(&str) + Send),
    ) -> Result<ChildRun> {
        let stderr = tokio::spawn(read_all(self.process.child_mut().stderr.take()));
        let pipe = self.process.child_mut().stdout.take();
        let mut stdout = String::new();
        let read_then_wait = async {
            if let Some(pipe) = pipe {
                let mut lines = BufReader::new(pipe).lines();
                while let Ok(Some(text)) = lines.next_line().await {
                    line(&text);
                    stdout.push_str(&text);
                    stdout.push('\n');
                }
            }
            self.process.wait().await
        };
        let status = tokio::time::timeout(timeout, read_then_wait).await;
        if status.is_err() {
            self.process.signal_group(nix::sys::signal::Signal::SIGKILL);
            self.process.wait().await?;
        }
        let stderr = stderr.await.unwrap_or_default();
        let end = match status {
            Err(_) => ChildEnd::TimedOut,
            Ok(status) => classify(status?, &String::from_utf8_lossy(&stderr), self.crash_at),
        };
        Ok(ChildRun { end, stdout })
    }

    /// SIGTERM to its group, SIGKILL after [`STOP_GRACE`]; waits until it is gone.
    pub async fn stop(mut self) -> Result<()> {
        self.process.stop(STOP_GRACE).await?;
        Ok(())
    }
}

/// Everything `pipe` gives until its end (nothing if there is no pipe or it fails).
async fn read_all(pipe: Option<impl AsyncRead + Unpin>) -> Vec<u8> {
    let mut bytes = Vec::new();
    if let Some(mut pipe) = pipe {
        let _ = pipe.read_to_end(&mut bytes).await;
    }
    bytes
}

/// A running consumer child.
pub struct ConsumerProcess {
    process: RunningChild,
    /// Its base URL, e.g. `http://127.0.0.1:41234`.
    pub url: String,
}

impl ConsumerProcess {
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// Waits until it ends by itself (a crash) and classifies how (cancel-safe).
    pub async fn ended(&mut self) -> Result<ChildEnd> {
        let process = &mut self.process.process;
        let status = process.wait().await?;
        let stderr = read_all(process.child_mut().stderr.take()).await;
        let stderr = String::from_utf8_lossy(&stderr);
        Ok(classify(status, &stderr, self.process.crash_at))
    }

    /// Stops it ([`RunningChild::stop`]) and waits until it is gone.
    pub async fn stop(self) -> Result<()> {
        self.process.stop().await
    }
}

fn classify(status: std::process::ExitStatus, stderr: &str, plan: Option<CrashPlan>) -> ChildEnd {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(0), _) => ChildEnd::Ok,
        (Some(code), _) if code == i32::from(exit::CRASHED) => ChildEnd::Crashed {
            point: plan.map_or_else(
                || "an unplanned crash point".into(),
                |p| p.point.to_string(),
            ),
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
