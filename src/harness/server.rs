//! A throwaway server process (PostgreSQL's postmaster, redis-server) in its run directory:
//! started in a process group of its own, as the server user with a minimal environment, its
//! output in our log file;
//! recorded in the directory's marker; ready within a bound or killed with everything it
//! started; stopped and its directory removed when dropped, unless kept. Also the files of
//! ours it is handed (its secrets: a configuration, a cookie).

use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use nix::sys::signal::Signal;
use nix::unistd::User;

use crate::harness::process::ProcessId;
use crate::harness::process_group;
use crate::harness::throwaway::{self, Marker, RunDir, ServerProcess};
use crate::wait;

/// A server's PATH when we have none (a server script runs other programs).
const DEFAULT_PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";

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
        cmd: Command,
        user: Option<&User>,
        default_limit: Duration,
        every: Duration,
        mut ready: impl AsyncFnMut() -> Result<bool>,
    ) -> Result<()> {
        self.spawn(cmd, user)?;
        let limit = start_timeout(default_limit);
        let name = self.name;
        let process = &mut self.process;
        let answered = wait::up_to(limit, every, async || {
            if let Some(status) = reap_if_ended(process)? {
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
        Err(self.failed(failure))
    }

    /// Runs `cmd` (as `user`, its output in the log, in the server's directory and a process
    /// group of its own, like a server) to its end, within `start_timeout(default_limit)`: a
    /// step before the server starts (initdb), killed with its group, as a server is, if the
    /// run ends meanwhile. An error with its last line unless it exited with 0.
    pub async fn run_to_end(
        &mut self,
        cmd: Command,
        user: Option<&User>,
        default_limit: Duration,
    ) -> Result<()> {
        let program = std::path::Path::new(cmd.get_program());
        let program = program
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        self.spawn(cmd, user)?;
        let limit = start_timeout(default_limit);
        let process = &mut self.process;
        let ended = wait::up_to(limit, Duration::from_millis(20), async || {
            reap_if_ended(process)
        })
        .await;
        let failure = match ended {
            Ok(Some(status)) if status.success() => return Ok(()),
            Ok(Some(status)) => anyhow::anyhow!("{program} failed ({status})"),
            Ok(None) => anyhow::anyhow!("{program} did not end within {limit:?}"),
            Err(e) => e,
        };
        Err(self.failed(failure))
    }

    /// Starts `cmd` as the server user in the server's directory, in a process group of its
    /// own, with a minimal environment, its output in the log; records it in the marker.
    fn spawn(&mut self, mut cmd: Command, user: Option<&User>) -> Result<()> {
        // Ours, in our directory: the server writes to it through the descriptor it inherits
        // (a restarted server goes on after its predecessor's lines).
        let log = self.run.append_file(self.log)?;
        cmd.current_dir(self.run.server_dir())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            // Its own process group: a Ctrl-C at the terminal reaches us, and we stop it in order.
            .process_group(0);
        as_server_user(&mut cmd, user);
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start {}", self.name))?;
        // A process that has already ended (an initdb with nothing to do) leaves nothing to
        // record: the wait that follows reads how it ended.
        self.recorded = ServerProcess::spawned(&child).ok();
        self.process = Some(child);
        self.write_marker()
    }

    /// Kills what runs (with its group) after `failure`, which gets the log's last line.
    fn failed(&mut self, failure: anyhow::Error) -> anyhow::Error {
        if let Some(mut child) = self.process.take() {
            process_group::kill_group_and_wait(child.id());
            let _ = child.wait();
        }
        let log = std::fs::read_to_string(self.run.path().join(self.log)).unwrap_or_default();
        match throwaway::last_line(&log) {
            line if line.is_empty() => failure,
            line => anyhow::anyhow!("{failure:#}: {line}"),
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

    /// Kills the server, its process group and its children at once with SIGKILL (a crash, not
    /// a stop: [`ProcessId::crash`]) and collects it within `limit`: then [`Server::start`] can
    /// run it again in the same directory. The process is our child, not yet waited for: its
    /// pid is still its own.
    pub async fn crash(&mut self, limit: Duration) -> Result<()> {
        if let Some(process) = self
            .process
            .as_ref()
            .and_then(|c| ProcessId::of(c.id() as i32))
        {
            process.crash();
        }
        self.collect_stopped(limit).await
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

    /// The running process' pid.
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(std::process::Child::id)
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
        if let Some(mut child) = self.process.take() {
            if let Some(recorded) = &self.recorded {
                recorded.process.stop(self.stop_signal);
            }
            // Ended, not yet reaped: what it left in its group goes too (initdb's own postgres
            // would go on writing in the directory about to be removed).
            process_group::kill_group_and_wait(child.id());
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(self.run.path());
    }
}

/// If the process has ended: what it left in its group killed first (until it is reaped its
/// pid names the group and nothing else), then reaped, and how it ended.
fn reap_if_ended(process: &mut Option<Child>) -> Result<Option<ExitStatus>> {
    let child = process.as_mut().expect("just spawned");
    if !process_group::has_ended(child.id())? {
        return Ok(None);
    }
    process_group::kill_group_and_wait(child.id());
    let status = child.wait()?;
    *process = None;
    Ok(Some(status))
}

/// A new file of ours in the run directory with `mode`, handed to the server user when it runs
/// as one (so that it alone can read it): a configuration with a token or password in it, a
/// cookie.
pub fn write_owned(
    run: &RunDir,
    name: &str,
    mode: u32,
    text: &str,
    user: Option<&User>,
) -> Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = run.path().join(name);
    let mut file = throwaway::create_new(&path)?;
    file.write_all(text.as_bytes())?;
    file.set_permissions(std::fs::Permissions::from_mode(mode))?;
    if let Some(user) = user {
        // Through the descriptor: the file we just created, whatever the path names now.
        nix::unistd::fchown(file.as_raw_fd(), Some(user.uid), Some(user.gid))
            .with_context(|| format!("cannot hand {} to the server user", path.display()))?;
    }
    Ok(path)
}

/// Runs `cmd` as `user` (when we are root), with a minimal environment: none of ours, whose
/// secrets the server user could read in /proc/PID/environ. It gets PATH, the locale (LANG,
/// LANGUAGE, LC_*, TZ) when set, HOME (the user's, or ours, unless `cmd` sets its own), and
/// what `cmd` sets itself.
pub fn as_server_user(cmd: &mut Command, user: Option<&User>) {
    let own: Vec<(OsString, Option<OsString>)> = cmd
        .get_envs()
        .map(|(name, value)| (name.to_owned(), value.map(OsStr::to_owned)))
        .collect();
    cmd.env_clear();
    let kept = |name: &OsStr| {
        let name = name.to_string_lossy();
        ["PATH", "LANG", "LANGUAGE", "TZ"].contains(&name.as_ref()) || name.starts_with("LC_")
    };
    cmd.env("PATH", DEFAULT_PATH)
        .envs(std::env::vars_os().filter(|(name, _)| kept(name)));
    let home = match user {
        Some(user) => Some(user.dir.clone().into_os_string()),
        None => std::env::var_os("HOME"),
    };
    if let Some(home) = home {
        cmd.env("HOME", home);
    }
    for (name, value) in own {
        match value {
            Some(value) => cmd.env(name, value),
            None => cmd.env_remove(name),
        };
    }
    if let Some(user) = user {
        cmd.uid(user.uid.as_raw()).gid(user.gid.as_raw());
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
