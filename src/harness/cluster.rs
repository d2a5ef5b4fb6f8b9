//! The throwaway PostgreSQL cluster: find the server binaries, initdb into a temp dir, start on a
//! private socket, and stop and remove it again, whatever way the run ends.
//!
//! PostgreSQL refuses to run as root, so when outbox-lab runs as root the cluster belongs to the
//! unprivileged `postgres` system user. The directory and its owner marker are a [`throwaway`]
//! directory, so a cluster left by a killed run is removed by the next one. The cluster listens
//! on a Unix socket inside that directory only: no other local user can reach it.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use nix::sys::signal::Signal;
use nix::unistd::User;

use crate::connect;
use crate::harness::server::{self, Server};
use crate::harness::throwaway;

/// The superuser initdb creates; it connects through the private socket only, so no password.
pub const SUPERUSER: &str = "postgres";
/// The socket's name carries a port number; the socket being private, any number will do.
const PORT: u16 = 5432;
/// The server's log, in our part of the run directory.
const LOG: &str = "postgres.log";
/// Starting a fresh cluster takes ~1 s here; this bounds a wedged start.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// The PostgreSQL server programs to run.
#[derive(Debug, Clone)]
pub struct PgBinaries {
    pub initdb: PathBuf,
    pub postgres: PathBuf,
    /// Stops the server for the db-restart nemesis (`pg_ctl stop -m immediate`); only that
    /// needs it, so it is looked for then.
    pub pg_ctl: PathBuf,
    /// Copies a running cluster into a streaming standby (the failover scenario); looked for
    /// then, like `pg_ctl`.
    pub pg_basebackup: PathBuf,
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
        Ok(PgBinaries {
            initdb,
            postgres,
            pg_ctl: dir.join("pg_ctl"),
            pg_basebackup: dir.join("pg_basebackup"),
        })
    }
}

/// A running throwaway cluster. Dropping it stops the server and removes its directory, unless
/// it is kept.
///
/// It listens on no TCP port: its one socket lies in its server directory, which only we (and
/// the server user) can enter, so no other local user can connect to it.
#[derive(Debug)]
pub struct Cluster {
    server: Server,
    bins: PgBinaries,
    /// The server user (when we are root), who alone may run `pg_ctl` on its data directory.
    run_as: Option<User>,
    data_dir: PathBuf,
    /// `track_commit_timestamp` on: verify times a relay from each event's commit.
    commit_timestamps: bool,
    /// Server settings beside the throwaway cluster's own (`name=value`, for `-c`).
    settings: Vec<String>,
    /// What the server runs with for a wall clock of the run's (`clock:step:db`), if any.
    clock_env: Vec<(String, String)>,
}

impl Cluster {
    /// initdb + start. Anything half-made is removed again if this fails.
    pub async fn start(bins: &PgBinaries, keep: bool, commit_timestamps: bool) -> Result<Cluster> {
        Cluster::start_on_clock(bins, keep, commit_timestamps, Vec::new()).await
    }

    /// [`Cluster::start`], the server run with `clock_env` (a [`FakeClock`]'s, for its wall
    /// clock to be stepped), and again so after a restart.
    ///
    /// [`FakeClock`]: crate::harness::clock::FakeClock
    pub async fn start_on_clock(
        bins: &PgBinaries,
        keep: bool,
        commit_timestamps: bool,
        clock_env: Vec<(String, String)>,
    ) -> Result<Cluster> {
        let run_as = throwaway::server_user()?;
        // From here on, Drop cleans up whatever exists.
        let server = Server::prepare("pg", "postgres", Signal::SIGINT, LOG, run_as.as_ref())?;
        let data_dir = server.run_dir().server_dir().join("data");
        let mut cluster = Cluster {
            server,
            bins: bins.clone(),
            run_as,
            data_dir,
            commit_timestamps,
            settings: Vec::new(),
            clock_env,
        };
        cluster.initdb().await?;
        cluster.start_postgres(false).await?;
        cluster.server.set_kept(keep)?;
        Ok(cluster)
    }

    /// initdb, as the server user and like a server (killed with what it started if the run
    /// ends meanwhile: its own postgres would go on writing): trust on the socket only (it is
    /// in a directory no one else can enter), no TCP.
    async fn initdb(&mut self) -> Result<()> {
        let mut initdb = Command::new(&self.bins.initdb);
        initdb.arg("-D").arg(&self.data_dir).args([
            "-U",
            SUPERUSER,
            "--auth-local=trust",
            "--auth-host=reject",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
        ]);
        self.server
            .run_to_end(initdb, self.run_as.as_ref(), START_TIMEOUT)
            .await
    }

    /// Starts the postmaster on the cluster's data directory and socket, and waits until it is
    /// ready, or a standby ready for reads (`after_crash`: after crash recovery, when it was
    /// stopped with `-m immediate`).
    async fn start_postgres(&mut self, after_crash: bool) -> Result<()> {
        let mut postgres = Command::new(&self.bins.postgres);
        postgres.envs(self.clock_env.iter().map(|(k, v)| (k, v)));
        postgres
            .arg("-D")
            .arg(&self.data_dir)
            .arg("-p")
            .arg(PORT.to_string())
            .arg("-k")
            .arg(self.server.run_dir().server_dir())
            .args([
                "-c",
                "listen_addresses=",
                "-c",
                "unix_socket_permissions=0700",
                "-c",
                "max_connections=200",
                // The cdc scenario's relay reads the WAL through a logical replication slot.
                "-c",
                "wal_level=logical",
                "-c",
                "max_replication_slots=20",
                "-c",
                "max_wal_senders=20",
                // Prepared transactions hold the horizon across a restart (txn:prepared, the
                // horizon scenario); PostgreSQL allows none by default.
                "-c",
                "max_prepared_transactions=20",
            ]);
        if self.commit_timestamps {
            postgres.args(["-c", "track_commit_timestamp=on"]);
        }
        for setting in &self.settings {
            postgres.arg("-c").arg(setting);
        }
        if after_crash {
            // Crash recovery first flushes the data directory: one syncfs, not an fsync per
            // file (4 s here against under 1 s); nothing else changes.
            postgres.args(["-c", "recovery_init_sync_method=syncfs"]);
        }
        let pid_file = self.data_dir.join("postmaster.pid");
        let ready = async || {
            // The server user writes this file: read it without following a link.
            let pid_file = throwaway::read_no_follow(&pid_file);
            let status = pid_file.lines().nth(7).map(str::trim);
            Ok(matches!(status, Some("ready" | "standby")))
        };
        let every = Duration::from_millis(20);
        self.server
            .start(postgres, self.run_as.as_ref(), START_TIMEOUT, every, ready)
            .await
    }

    /// The db-restart nemesis: PostgreSQL's own crash (`pg_ctl stop -m immediate`: every
    /// backend killed, no checkpoint), then started again on the same socket and data directory,
    /// where crash recovery replays the WAL: what was committed must still be there.
    pub async fn restart_immediately(&mut self) -> Result<()> {
        if !self.bins.pg_ctl.is_file() {
            bail!(
                "no pg_ctl beside postgres: {} is missing",
                self.bins.pg_ctl.display()
            );
        }
        let mut pg_ctl = Command::new(&self.bins.pg_ctl);
        pg_ctl
            .arg("stop")
            .arg("-D")
            .arg(&self.data_dir)
            .args(["-m", "immediate", "-w", "-s"])
            .current_dir(self.server.run_dir().server_dir())
            .stdin(Stdio::null());
        server::as_server_user(&mut pg_ctl, self.run_as.as_ref());
        let out = tokio::process::Command::from(pg_ctl)
            .kill_on_drop(true)
            .output()
            .await
            .with_context(|| format!("cannot run {}", self.bins.pg_ctl.display()))?;
        if !out.status.success() {
            bail!(
                "pg_ctl stop -m immediate failed ({}): {}",
                out.status,
                throwaway::last_line(&String::from_utf8_lossy(&out.stderr))
            );
        }
        self.server.collect_stopped(START_TIMEOUT).await?;
        self.start_postgres(true).await
    }

    /// A streaming standby of this cluster, started: `pg_basebackup -R` through the primary's
    /// socket into a throwaway directory of its own, streaming from the physical replication
    /// slot `name` (made here), under `application_name` `name` (what
    /// `synchronous_standby_names` names). Read-only until [`Cluster::promote`]. With
    /// `slot_sync` (PostgreSQL 17 and later), it can copy the primary's failover slots
    /// (`pg_sync_replication_slots`: its connection names a database, and it sends
    /// `hot_standby_feedback`).
    pub async fn start_standby(&self, name: &str, slot_sync: bool) -> Result<Cluster> {
        if !self.bins.pg_basebackup.is_file() {
            bail!(
                "no pg_basebackup beside postgres: {} is missing (apt-get install postgresql)",
                self.bins.pg_basebackup.display()
            );
        }
        let primary = connect::postgres(&connect::parse_url(&self.url())?).await?;
        primary
            .execute(
                "SELECT pg_create_physical_replication_slot($1, true)",
                &[&name],
            )
            .await?;
        let server = Server::prepare(
            "pg-standby",
            "postgres",
            Signal::SIGINT,
            LOG,
            self.run_as.as_ref(),
        )?;
        let data_dir = server.run_dir().server_dir().join("data");
        let mut standby = Cluster {
            server,
            bins: self.bins.clone(),
            run_as: self.run_as.clone(),
            data_dir,
            commit_timestamps: self.commit_timestamps,
            // Streaming again within a moment of a primary's restart (db:restart), not 5 s.
            settings: match slot_sync {
                true => vec![
                    "hot_standby_feedback=on".into(),
                    "wal_retrieve_retry_interval=100ms".into(),
                ],
                false => vec!["wal_retrieve_retry_interval=100ms".into()],
            },
            clock_env: Vec::new(),
        };
        let primary_dir = self.server.run_dir().server_dir();
        let mut basebackup = Command::new(&self.bins.pg_basebackup);
        basebackup
            .arg("-D")
            .arg(&standby.data_dir)
            .args(["-R", "-S", name, "-X", "stream", "--no-sync", "-d"])
            .arg(format!(
                "host={} port={PORT} user={SUPERUSER} application_name={name}{}",
                primary_dir.display(),
                if slot_sync { " dbname=postgres" } else { "" }
            ));
        standby
            .server
            .run_to_end(basebackup, self.run_as.as_ref(), START_TIMEOUT)
            .await?;
        standby.start_postgres(false).await?;
        Ok(standby)
    }

    /// The machine under the server dies: the postmaster and every backend killed with SIGKILL
    /// at once (its process group), nothing flushed or sent after. Its directory stays until
    /// it is dropped.
    pub async fn crash(&mut self) -> Result<()> {
        self.server.crash(START_TIMEOUT).await
    }

    /// Promotes a standby to a primary, and waits until it takes writes.
    pub async fn promote(&self) -> Result<()> {
        let standby = connect::postgres(&connect::parse_url(&self.url())?).await?;
        let promoted: bool = standby
            .query_one(
                "SELECT pg_promote(true, $1)",
                &[&(START_TIMEOUT.as_secs() as i32)],
            )
            .await?
            .get(0);
        if !promoted {
            bail!("the standby was not promoted within {START_TIMEOUT:?}");
        }
        Ok(())
    }

    /// The superuser URL of the `postgres` maintenance database, through the socket (its
    /// directory percent-encoded as the host, as libpq and psql read it).
    pub fn url(&self) -> String {
        let socket_dir = self.server.run_dir().server_dir();
        let host = crate::connect::percent_encode(socket_dir.as_os_str().as_encoded_bytes());
        format!("postgresql://{SUPERUSER}@{host}:{PORT}/postgres")
    }

    pub fn dir(&self) -> &Path {
        self.server.run_dir().path()
    }

    /// The server is still running (a kept cluster is only kept if so).
    pub fn is_running(&mut self) -> bool {
        self.server.is_running()
    }

    /// Whether dropping it leaves it in place (`--keep`); a cluster that stopped is not kept.
    pub fn set_kept(&mut self, kept: bool) -> Result<()> {
        self.server.set_kept(kept)
    }
}
