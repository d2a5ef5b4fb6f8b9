//! A throwaway server process (PostgreSQL's postmaster, redis-server) in its run directory:
//! started in a process group of its own, as the server user, its output in our log file;
//! recorded in the directory's marker; ready within a bound or killed with everything it
//! started; stopped and its directory removed when dropped, unless kept.

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::{Pid, User};

use crate::harness::throwaway::{self, Marker, ProcessId, RunDir, ServerProcess};
use crate::wait;

#[derive(Debug)]
pub struct Server {
    run: RunDir,
    process: Option<Child>,
    /// What the marker records of the process, read once when it was spawned.
    recorded: Option<ServerProcess>,
    /// Left running when dropped (`--keep`).
    keep: bool,
    /// Its name in messages (`postgres`, `redis-server`).
    name: &'static str,
    /// How it is asked to stop: SIGINT is PostgreSQL's fast shutdown, SIGTERM Redis'.
    stop_signal: Signal,
    /// Its log, in our part of the run directory.
    log: &'static str,
}

impl Server {
    /// Its run directory (`<tmp>/outbox-lab-<kind>-…`, with `server/` for `user`); nothing
    /// runs yet. Directories left by killed runs are removed first.
    pub fn prepare(
        kind: &str,
        name: &'static str,
        stop_signal: Signal,
        log: &'static str,
        user: Option<&User>,
    ) -> Result<Server> {
        throwaway::remove_orphans();
        Ok(Server {
            run: RunDir::create(kind, user)?,
            process: None,
            recorded: None,
            keep: false,
            name,
            stop_signal,
            log,
        })
    }

    pub fn run_dir(&self) -> &RunDir {
        &self.run
    }

    /// Starts `cmd` (as `user`, its output in the log) and waits until `ready` says so, for at
    /// most `start_timeout(default_limit)`, looking every `every`. A server that exits, or is
    /// not ready in time, is killed with its whole process group: nothing is left running.
    /// Not retried: a private socket has no port to lose, and a start that timed out would only
    /// time out again.
    pub async fn start(
        &mut self,
        mut cmd: Command,
        user: Option<&User>,
        default_limit: Duration,
        every: Duration,
        mut ready: impl AsyncFnMut() -> Result<bool>,
    ) -> Result<()> {
        // Ours, in our directory: the server writes to it through the descriptor it inherits
        // (a restarted server goes on after its predecessor's lines).
        let log = self.run.append_file(self.log)?;
        cmd.current_dir(self.run.server_dir())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            // Its own process group: a Ctrl-C at the terminal reaches us, and we stop it in order.
            .process_group(0);
        if let Some(user) = user {
            cmd.uid(user.uid.as_raw())
                .gid(user.gid.as_raw())
                .env("HOME", &user.dir);
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start {}", self.name))?;
        self.recorded = Some(ServerProcess::spawned(&child)?);
        self.process = Some(child);
        self.write_marker()?;
        let limit = start_timeout(default_limit);
        let name = self.name;
        let process = &mut self.process;
        let answered = wait::up_to(limit, every, async || {
            let child = process.as_mut().expect("just spawned");
            if let Some(status) = child.try_wait()? {
                *process = None;
                bail!("{name} exited during start ({status})");
            }
            ready().await
        })
        .await;
        let failure = match answered {
            Ok(Some(())) => return Ok(()),
            Ok(None) => anyhow::anyhow!(
                "{name} did not become ready within {limit:?} (set OUTBOX_LAB_START_TIMEOUT_S \
                 on a slow machine)"
            ),
            Err(e) => e,
        };
        if let Some(mut child) = self.process.take() {
            let _ = killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
            let _ = child.wait();
        }
        let log = std::fs::read_to_string(self.run.path().join(self.log)).unwrap_or_default();
        match throwaway::last_line(&log) {
            line if line.is_empty() => Err(failure),
            line => Err(anyhow::anyhow!("{failure:#}: {line}")),
        }
    }

    /// Waits for the process that was stopped from outside (`pg_ctl stop`) to end, within
    /// `limit`: then [`Server::start`] can run it again in the same directory.
    pub async fn collect_stopped(&mut self, limit: Duration) -> Result<()> {
        let name = self.name;
        let process = &mut self.process;
        let ended = wait::up_to(limit, Duration::from_millis(5), async || {
            Ok(match process.as_mut() {
                Some(child) => child.try_wait()?.is_some(),
                None => true,
            })
        })
        .await?;
        if ended.is_none() {
            bail!("{name} did not stop within {limit:?}");
        }
        self.process = None;
        Ok(())
    }

    /// Kills the server with SIGKILL, as a crash would, and waits for its end: its directory
    /// stays, for [`Server::start`] to run it again.
    pub fn kill(&mut self) -> Result<()> {
        if let Some(mut child) = self.process.take() {
            child
                .kill()
                .with_context(|| format!("cannot kill {}", self.name))?;
            child.wait()?;
        }
        Ok(())
    }

    /// Whether dropping it leaves it running (`--keep`); the marker says so too, so that no
    /// later run's orphan sweep removes it.
    pub fn set_kept(&mut self, kept: bool) -> Result<()> {
        self.keep = kept;
        self.write_marker()
    }

    pub fn is_kept(&self) -> bool {
        self.keep
    }

    /// The server is still running (a kept server is only kept if so).
    pub fn is_running(&mut self) -> bool {
        matches!(self.process.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    fn write_marker(&self) -> Result<()> {
        self.run.write_marker(&Marker {
            owner: ProcessId::own(),
            kept: self.keep,
            server: self.recorded.clone(),
        })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        if let (Some(mut child), Some(recorded)) = (self.process.take(), &self.recorded) {
            recorded.process.stop(self.stop_signal);
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(self.run.path());
    }
}

/// How long a throwaway server may take to get ready: `OUTBOX_LAB_START_TIMEOUT_S` seconds
/// (for slow machines), else `default`.
fn start_timeout(default: Duration) -> Duration {
    std::env::var("OUTBOX_LAB_START_TIMEOUT_S")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| *s > 0.0)
        .map(Duration::from_secs_f64)
        .unwrap_or(default)
}
