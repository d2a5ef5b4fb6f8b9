//! The throwaway PostgreSQL cluster: find the server binaries, initdb into a temp dir, start on a
//! free 127.0.0.1 port, and stop and remove it again, whatever way the run ends.
//!
//! PostgreSQL refuses to run as root, so when outbox-lab runs as root the cluster belongs to the
//! unprivileged `postgres` system user. The directory and its owner marker are a [`throwaway`]
//! directory, so a cluster left by a killed run is removed by the next one.

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use nix::sys::signal::Signal;
use nix::unistd::{chown, Pid, User};

use crate::throwaway;

/// The superuser initdb creates; the cluster trusts local connections, so no password.
pub const SUPERUSER: &str = "postgres";
/// Starting a fresh cluster takes ~1 s here; this bounds a wedged start.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// The PostgreSQL server programs to run.
#[derive(Debug, Clone)]
pub struct PgBinaries {
    pub initdb: PathBuf,
    pub postgres: PathBuf,
}

impl PgBinaries {
    /// `explicit` (from `--pg-bin`), else `initdb` on PATH, else the newest
    /// `/usr/lib/postgresql/*/bin` (Debian installs the server there, off PATH).
    pub fn find(explicit: Option<&Path>) -> Result<PgBinaries> {
        if let Some(dir) = explicit {
            return PgBinaries::in_dir(dir).map_err(|_| {
                anyhow!(
                    "no PostgreSQL server binaries (initdb, postgres) in {}: point --pg-bin at \
                     the server's bin directory, or run scripts/setup (apt-get install postgresql)",
                    dir.display()
                )
            });
        }
        let on_path = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
            .unwrap_or_default();
        for dir in on_path {
            if dir.join("initdb").is_file() {
                // Debian links initdb into PATH; postgres lives beside the link's target.
                let real = fs::canonicalize(dir.join("initdb")).unwrap_or(dir.join("initdb"));
                if let Some(found) = real.parent().and_then(|d| PgBinaries::in_dir(d).ok()) {
                    return Ok(found);
                }
            }
        }
        let mut versions: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let version = e.file_name().to_str()?.parse::<u32>().ok()?;
                Some((version, e.path().join("bin")))
            })
            .collect();
        versions.sort();
        if let Some(found) = versions
            .iter()
            .rev()
            .find_map(|(_, d)| PgBinaries::in_dir(d).ok())
        {
            return Ok(found);
        }
        bail!(
            "PostgreSQL server binaries (initdb, postgres) not found on PATH or in \
             /usr/lib/postgresql/*/bin: run scripts/setup (apt-get install postgresql), \
             pass --pg-bin DIR, or use --database-url"
        )
    }

    fn in_dir(dir: &Path) -> Result<PgBinaries> {
        let initdb = dir.join("initdb");
        let postgres = dir.join("postgres");
        if !initdb.is_file() || !postgres.is_file() {
            bail!("missing initdb or postgres");
        }
        Ok(PgBinaries { initdb, postgres })
    }
}

/// A running throwaway cluster. Dropping it stops the server and removes its directory, unless
/// it is kept.
#[derive(Debug)]
pub struct Cluster {
    dir: PathBuf,
    port: u16,
    postmaster: Option<Child>,
    keep: bool,
}

impl Cluster {
    /// initdb + start. Anything half-made is removed again if this fails.
    pub async fn start(bins: &PgBinaries, keep: bool) -> Result<Cluster> {
        throwaway::remove_orphans();
        let run_as = unprivileged_user()?;
        // From here on, Drop cleans up whatever exists.
        let mut cluster = Cluster {
            dir: throwaway::create_dir("pg")?,
            port: 0,
            postmaster: None,
            keep: false,
        };
        if let Some(user) = &run_as {
            chown(&cluster.dir, Some(user.uid), Some(user.gid)).with_context(|| {
                format!("cannot hand {} to user postgres", cluster.dir.display())
            })?;
        }
        cluster.initdb(bins, run_as.as_ref()).await?;
        // Another process may grab the port between our probe and postgres' bind: retry.
        let mut last_error = None;
        for _ in 0..5 {
            match cluster.launch(bins, run_as.as_ref()).await {
                Ok(()) => {
                    cluster.keep = keep;
                    cluster.write_marker()?;
                    return Ok(cluster);
                }
                Err(e) => last_error = Some(e),
            }
        }
        Err(last_error.expect("at least one attempt"))
    }

    /// The superuser connection string of the `postgres` maintenance database.
    pub fn url(&self) -> String {
        format!("postgres://{SUPERUSER}@127.0.0.1:{}/postgres", self.port)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    async fn initdb(&self, bins: &PgBinaries, run_as: Option<&User>) -> Result<()> {
        let mut cmd = Command::new(&bins.initdb);
        cmd.arg("-D")
            .arg(self.dir.join("data"))
            .args([
                "-U",
                SUPERUSER,
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            ])
            .current_dir(&self.dir)
            .stdin(Stdio::null());
        as_user(&mut cmd, run_as);
        let out = tokio::process::Command::from(cmd)
            .kill_on_drop(true)
            .output()
            .await
            .with_context(|| format!("cannot run {}", bins.initdb.display()))?;
        if !out.status.success() {
            bail!(
                "initdb failed ({}): {}",
                out.status,
                throwaway::last_line(&String::from_utf8_lossy(&out.stderr))
            );
        }
        Ok(())
    }

    async fn launch(&mut self, bins: &PgBinaries, run_as: Option<&User>) -> Result<()> {
        self.port = throwaway::free_port()?;
        let log = fs::File::create(self.dir.join("postgres.log"))?;
        if let Some(user) = run_as {
            chown(
                &self.dir.join("postgres.log"),
                Some(user.uid),
                Some(user.gid),
            )?;
        }
        let mut cmd = Command::new(&bins.postgres);
        cmd.arg("-D")
            .arg(self.dir.join("data"))
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-k")
            .arg(&self.dir)
            .args([
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "max_connections=200",
                // The cdc scenario's relay reads the WAL through a logical replication slot.
                "-c",
                "wal_level=logical",
                "-c",
                "max_replication_slots=20",
                "-c",
                "max_wal_senders=20",
                // notify-latency splits each delivery's latency at its commit time.
                "-c",
                "track_commit_timestamp=on",
            ])
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            // Its own process group: a Ctrl-C at the terminal reaches us, and we stop it in order.
            .process_group(0);
        as_user(&mut cmd, run_as);
        self.postmaster = Some(
            cmd.spawn()
                .with_context(|| format!("cannot start {}", bins.postgres.display()))?,
        );
        self.write_marker()?;
        let started = Instant::now();
        loop {
            let child = self.postmaster.as_mut().expect("just spawned");
            if let Some(status) = child.try_wait()? {
                self.postmaster = None;
                bail!(
                    "postgres exited during start ({status}): {}",
                    throwaway::last_line(
                        &fs::read_to_string(self.dir.join("postgres.log")).unwrap_or_default()
                    )
                );
            }
            let pid_file =
                fs::read_to_string(self.dir.join("data/postmaster.pid")).unwrap_or_default();
            if pid_file.lines().nth(7).map(str::trim) == Some("ready") {
                return Ok(());
            }
            if started.elapsed() > START_TIMEOUT {
                bail!("postgres did not become ready within {START_TIMEOUT:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn write_marker(&self) -> Result<()> {
        let marker = throwaway::Marker {
            owner_pid: std::process::id() as i32,
            kept: self.keep,
            server_pid: self.postmaster.as_ref().map(|c| c.id() as i32),
            port: self.port,
        };
        throwaway::write_marker(&self.dir, &marker)
    }

    /// Stops the server (fast shutdown, then kill) and removes the directory.
    fn stop_and_remove(&mut self) {
        if let Some(mut child) = self.postmaster.take() {
            throwaway::stop(Pid::from_raw(child.id() as i32), Signal::SIGINT);
            let _ = child.wait();
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if !self.keep {
            self.stop_and_remove();
        }
    }
}

/// The user that owns the cluster: none (ourselves) unless we are root.
fn unprivileged_user() -> Result<Option<User>> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(None);
    }
    match User::from_name(SUPERUSER)? {
        Some(user) => Ok(Some(user)),
        None => bail!(
            "running as root, and PostgreSQL refuses root: create the system user 'postgres' \
             (apt-get install postgresql does) or run as an unprivileged user"
        ),
    }
}

fn as_user(cmd: &mut Command, user: Option<&User>) {
    if let Some(user) = user {
        cmd.uid(user.uid.as_raw())
            .gid(user.gid.as_raw())
            .env("HOME", &user.dir);
    }
}
