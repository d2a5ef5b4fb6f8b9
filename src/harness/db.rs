//! Which PostgreSQL server a run uses, and the databases outbox-lab creates on it.
//!
//! Either the throwaway cluster (default) or an external server (`--database-url`). On either,
//! outbox-lab only ever creates databases named `outboxlab_…` and drops only the ones it created
//! in this run: the database named in the URL is used for CREATE/DROP DATABASE and nothing else.

use std::sync::Mutex;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio_postgres::config::Host;
use tokio_postgres::{Client, Config};

use crate::connect;
use crate::harness::clock::FakeClock;
use crate::harness::cluster::{Cluster, PgBinaries};
use crate::harness::roles::{self, ActorRoles};
use crate::harness::throwaway;
use crate::wait;

/// Every database outbox-lab creates starts with this.
pub const DATABASE_PREFIX: &str = "outboxlab_";
/// A run holds a connection named `outbox-lab run <id>` while it lives, and comments its
/// databases with the same words: how `clean` tells a live run's databases from a dead one's.
const RUN_TAG_PREFIX: &str = "outbox-lab run ";
/// PostgreSQL truncates identifiers to 63 bytes; we stay under it so names stay ours.
const MAX_NAME_LEN: usize = 63;
/// Bounds the wait for a stopped relay's walsender to let go of its slot.
const SLOT_RELEASE_LIMIT: Duration = Duration::from_secs(10);

/// `outboxlab_<run>_<label>`, within PostgreSQL's 63 bytes ([`shorten`]).
fn database_name(run_id: &str, label: &str) -> String {
    shorten(format!(
        "{DATABASE_PREFIX}{run_id}_{}",
        label.replace('-', "_")
    ))
}

/// `base` (a name of ours) and `suffix`, within PostgreSQL's 63 bytes ([`shorten`]): a role of
/// a database's (`<database>_relay`).
pub fn prefixed_name(base: &str, suffix: &str) -> String {
    shorten(format!("{base}{suffix}"))
}

/// `name`, or past PostgreSQL's 63 bytes its start and a digest of the whole, so that two long
/// names differing only at their end (a zoo entry's runs) stay two names.
fn shorten(name: String) -> String {
    if name.len() <= MAX_NAME_LEN {
        return name;
    }
    let mut hasher = std::hash::DefaultHasher::new();
    std::hash::Hash::hash(&name, &mut hasher);
    let digest = format!("_{:08x}", std::hash::Hasher::finish(&hasher) as u32);
    let mut cut = MAX_NAME_LEN - digest.len();
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}{digest}", &name[..cut])
}

/// A replication slot (the CDC relay's) keeps its database from being dropped and retains WAL
/// for as long as it exists: before a database of ours goes, its slots go, their walsenders
/// (of a relay killed mid-run) ended first.
const END_SLOT_WALSENDERS: &str = "
SELECT count(pg_terminate_backend(active_pid))
  FROM pg_replication_slots WHERE database = $1 AND active";

const DROP_RELEASED_SLOTS: &str = "
SELECT count(pg_drop_replication_slot(slot_name))
  FROM pg_replication_slots WHERE database = $1 AND NOT active";

/// Our databases, and whether each is in use: a session connected to it, or its run (named in
/// the database's comment) still holding its connection.
const OUR_DATABASES: &str = "
SELECT d.datname,
       EXISTS (SELECT 1 FROM pg_stat_activity a
                WHERE a.datname = d.datname
                   OR a.application_name = shobj_description(d.oid, 'pg_database')
                      AND a.application_name LIKE $1 || '%') AS in_use
  FROM pg_database d
 WHERE d.datname LIKE 'outboxlab\\_%'
 ORDER BY d.datname";

const SLOTS_LEFT: &str = "SELECT count(*) FROM pg_replication_slots WHERE database = $1";

/// A database of ours: how to reach it, from this process and from a child.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Database {
    /// The server URL as given (or the cluster's); children get it with `--dbname`.
    pub server_url: String,
    pub name: String,
}

impl Database {
    pub fn config(&self) -> Result<Config> {
        let mut config = connect::parse_url(&self.server_url)?;
        config.dbname(&self.name);
        Ok(config)
    }

    pub async fn connect(&self) -> Result<Client> {
        connect::postgres(&self.config()?).await
    }

    /// A connection whose session is named `application_name` (in `pg_stat_activity`): an actor
    /// of ours, told apart from a relay of the user's.
    pub async fn connect_as(&self, application_name: &str) -> Result<Client> {
        let mut config = self.config()?;
        config.application_name(application_name);
        connect::postgres(&config).await
    }

    /// The same database reached at `host` (a socket directory, or a name) and `port`
    /// instead: through an actor's [database link](crate::harness::link::postgres). The user
    /// and password are kept; the server's other options are not (the link talks in the clear).
    pub fn through(&self, host: &str, port: u16) -> Result<Database> {
        let config = self.config()?;
        let user = config.get_user().unwrap_or("postgres");
        let password = config.get_password().map(<[u8]>::to_vec);
        Ok(self.at(host, port, user, password.as_deref()))
    }

    /// The same database as another role (`user`, with its `password` where the server asks
    /// for one), at the same host and port.
    pub fn as_login(&self, user: &str, password: Option<&str>) -> Result<Database> {
        let config = self.config()?;
        let (host, port) = match (config.get_hosts().first(), config.get_ports().first()) {
            (Some(Host::Unix(dir)), port) => (dir.to_string_lossy().into_owned(), port),
            (Some(Host::Tcp(name)), port) => (name.clone(), port),
            (None, port) => ("localhost".to_string(), port),
        };
        let port = port.copied().unwrap_or(5432);
        Ok(self.at(&host, port, user, password.map(str::as_bytes)))
    }

    /// This database's name at `host` and `port`, as `user`.
    fn at(&self, host: &str, port: u16, user: &str, password: Option<&[u8]>) -> Database {
        let encode = |bytes: &[u8]| connect::percent_encode(bytes);
        let user = encode(user.as_bytes());
        let credentials = match password {
            Some(password) => format!("{user}:{}", encode(password)),
            None => user,
        };
        Database {
            server_url: format!(
                "postgresql://{credentials}@{}:{port}/{}",
                encode(host.as_bytes()),
                encode(self.name.as_bytes())
            ),
            name: self.name.clone(),
        }
    }

    /// A `psql`-ready URL, for `--keep`. Only meaningful for URL-form server addresses.
    pub fn url(&self) -> String {
        match self.server_url.rsplit_once('/') {
            Some((base, _)) if self.server_url.contains("://") => format!("{base}/{}", self.name),
            _ => format!("{} dbname={}", self.server_url, self.name),
        }
    }
}

/// The server of a run and the databases this run created on it.
pub struct PgServer {
    /// The maintenance connection string: the cluster's, or `--database-url`.
    url: String,
    /// The throwaway cluster, when there is one; dropping it stops and removes it. Behind a
    /// lock: the db-restart nemesis restarts it in the middle of a run.
    cluster: Option<tokio::sync::Mutex<Cluster>>,
    /// The cluster's wall clock, where it runs on one of the run's (`clock:step:db`).
    db_clock: Option<Result<FakeClock, String>>,
    /// Held open, named after the run, for as long as the run lives.
    _holder: Client,
    /// Names created in this run; dropped at close unless kept.
    created: Mutex<Vec<String>>,
    /// Roles created in this run (the actors' of a database: see [`roles`]); dropped at close,
    /// after the databases, unless kept.
    created_roles: Mutex<Vec<String>>,
    keep: bool,
    /// Distinguishes this run's databases from another run's on a shared server.
    run_id: String,
    pub version: String,
    /// `--pg-bin`: where a run's own servers beside this one (the failover scenario's pair)
    /// come from.
    pg_bin: Option<std::path::PathBuf>,
}

/// How to get a server, from the command line.
pub struct ServerChoice<'a> {
    pub database_url: Option<&'a str>,
    pub pg_bin: Option<&'a std::path::Path>,
    pub keep: bool,
    /// Start the throwaway cluster with `track_commit_timestamp` (verify's latency); only the
    /// command that reads them pays for them.
    pub commit_timestamps: bool,
    /// Start the throwaway cluster on a wall clock of the run's, which `clock:step:db` steps.
    pub fake_clock: bool,
}

impl PgServer {
    pub async fn open(choice: &ServerChoice<'_>, run_id: &str) -> Result<PgServer> {
        let (url, cluster) = match choice.database_url {
            Some(url) => {
                connect::parse_url(url)?;
                (url.to_string(), None)
            }
            None => {
                let bins = PgBinaries::find(choice.pg_bin)?;
                let clock = match choice.fake_clock {
                    true => Some(FakeClock::new(throwaway::server_user()?.as_ref())?),
                    false => None,
                };
                let clock_env = clock.as_ref().map(FakeClock::env).unwrap_or_default();
                let keep = choice.keep;
                let cluster =
                    Cluster::start_on_clock(&bins, keep, choice.commit_timestamps, clock_env)
                        .await?;
                (
                    cluster.url(),
                    Some((tokio::sync::Mutex::new(cluster), clock)),
                )
            }
        };
        let (cluster, db_clock) = match cluster {
            Some((cluster, clock)) => (Some(cluster), clock.map(Ok)),
            None => (None, None),
        };
        let run_id = run_id
            .to_lowercase()
            .replace(|c: char| !c.is_ascii_alphanumeric(), "_");
        let mut config = connect::parse_url(&url)?;
        config.application_name(run_tag(&run_id));
        let holder = connect::postgres(&config).await?;
        let version: String = holder.query_one("SHOW server_version", &[]).await?.get(0);
        Ok(PgServer {
            url,
            cluster,
            db_clock,
            _holder: holder,
            created: Mutex::new(Vec::new()),
            created_roles: Mutex::new(Vec::new()),
            keep: choice.keep,
            run_id,
            version,
            pg_bin: choice.pg_bin.map(std::path::Path::to_path_buf),
        })
    }

    /// The PostgreSQL server binaries for the run's own servers (`--pg-bin`, else found as for
    /// the throwaway cluster), whichever server the run's databases are on.
    pub fn binaries(&self) -> Result<PgBinaries> {
        PgBinaries::find(self.pg_bin.as_deref())
    }

    /// The server's wall clock, where it runs on one of the run's (`clock:step:db`).
    pub fn clock(&self) -> Option<&Result<FakeClock, String>> {
        self.db_clock.as_ref()
    }

    /// Whether the server is the user's (`--database-url`).
    pub fn is_external(&self) -> bool {
        self.cluster.is_none()
    }

    /// A throwaway cluster of this run's own beside this server (the same binaries): where a
    /// lab keeps what no relay on the user's server may reach, or where a scenario steps the
    /// server's clock (`fake_clock`: see [`ServerChoice::fake_clock`]).
    pub async fn private_cluster(&self, fake_clock: bool) -> Result<PgServer> {
        let choice = ServerChoice {
            database_url: None,
            pg_bin: self.pg_bin.as_deref(),
            keep: false,
            commit_timestamps: false,
            fake_clock,
        };
        PgServer::open(&choice, &self.run_id)
            .await
            .context("cannot start a private cluster for the judge's records")
    }

    /// `work` on a [private cluster](Self::private_cluster) of its own, closed however `work`
    /// ends (`work`'s error first, then the close's).
    pub async fn on_private_cluster<T>(
        &self,
        fake_clock: bool,
        work: impl AsyncFnOnce(&PgServer) -> Result<T>,
    ) -> Result<T> {
        let private = self.private_cluster(fake_clock).await?;
        let outcome = work(&private).await;
        let closed = private.close().await;
        let outcome = outcome?;
        closed?;
        Ok(outcome)
    }

    /// "throwaway cluster" or "external server", for the report.
    pub fn kind(&self) -> &'static str {
        if self.cluster.is_some() {
            "throwaway cluster"
        } else {
            "external server"
        }
    }

    /// The db-restart nemesis: the throwaway cluster stopped with `pg_ctl stop -m immediate`
    /// and started again (see [`Cluster::restart_immediately`]); an external server is never
    /// restarted. The run's own held connection does not survive it, and need not: it only
    /// names the run's databases on external servers.
    pub async fn restart_immediately(&self) -> Result<()> {
        let Some(cluster) = &self.cluster else {
            bail!("db:restart needs the throwaway cluster, not an external server");
        };
        cluster.lock().await.restart_immediately().await
    }

    /// Creates `outboxlab_<run>_<label>`, empty, labelled with this run.
    pub async fn create_database(&self, label: &str) -> Result<Database> {
        let name = database_name(&self.run_id, label);
        if self.created.lock().expect("not poisoned").contains(&name) {
            bail!("database {name} was already created in this run");
        }
        let admin = connect::postgres(&connect::parse_url(&self.url)?).await?;
        admin
            .batch_execute(&format!("CREATE DATABASE \"{name}\""))
            .await
            .with_context(|| {
                format!("cannot create database {name} (does the user have CREATEDB?)")
            })?;
        self.created
            .lock()
            .expect("not poisoned")
            .push(name.clone());
        // Whose it is, for `outbox-lab clean --database-url` (the run id is [a-z0-9_]).
        admin
            .batch_execute(&format!(
                "COMMENT ON DATABASE \"{name}\" IS '{}'",
                run_tag(&self.run_id)
            ))
            .await?;
        Ok(Database {
            server_url: self.url.clone(),
            name,
        })
    }

    /// The least-privilege roles of `db`'s actors (strangers' relays, the writer), made on
    /// this server where its role may make them ([`ActorRoles::create`]), named after the run,
    /// and dropped with it.
    pub async fn create_actor_roles(&self, db: &Database) -> Result<Option<ActorRoles>> {
        let admin = connect::postgres(&connect::parse_url(&self.url)?).await?;
        let tag = run_tag(&self.run_id);
        let roles = ActorRoles::create(&admin, db, self.is_external(), Some(&tag)).await?;
        if let Some(roles) = &roles {
            let mut created = self.created_roles.lock().expect("not poisoned");
            created.extend(roles.names().map(str::to_string));
        }
        Ok(roles)
    }

    /// Drops every database this run created (unless kept) and stops the throwaway cluster.
    pub async fn close(mut self) -> Result<()> {
        if self.keep {
            if let Some(mut cluster) = self.cluster.take().map(tokio::sync::Mutex::into_inner) {
                if cluster.is_running() {
                    crate::errln!(
                        "kept the throwaway cluster running in {}: psql {}; remove it with \
                         `outbox-lab clean`",
                        cluster.dir().display(),
                        cluster.url()
                    );
                } else {
                    // Dropped unkept: its directory goes.
                    cluster.set_kept(false)?;
                    crate::errln!("the throwaway cluster stopped during the run: nothing was kept");
                    return Ok(());
                }
            }
            for name in self.created.lock().expect("not poisoned").iter() {
                crate::errln!("kept database {name}");
            }
            for name in self.created_roles.lock().expect("not poisoned").iter() {
                crate::errln!("kept role {name}");
            }
            return Ok(());
        }
        if self.cluster.take().is_some() {
            // Dropping the cluster removes its databases with it.
            return Ok(());
        }
        let names = std::mem::take(&mut *self.created.lock().expect("not poisoned"));
        let role_names = std::mem::take(&mut *self.created_roles.lock().expect("not poisoned"));
        if names.is_empty() && role_names.is_empty() {
            return Ok(());
        }
        let admin = connect::postgres(&connect::parse_url(&self.url)?).await?;
        for name in names {
            debug_assert!(name.starts_with(DATABASE_PREFIX));
            drop_slots_of(&admin, &name).await?;
            admin
                .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                .await
                .with_context(|| format!("cannot drop database {name}"))?;
        }
        // Their databases gone, the roles own nothing.
        for name in role_names {
            debug_assert!(name.starts_with(DATABASE_PREFIX));
            roles::drop_role(&admin, &name).await?;
        }
        Ok(())
    }
}

/// The application name of a run's held connection, and the comment on its databases.
fn run_tag(run_id: &str) -> String {
    format!("{RUN_TAG_PREFIX}{run_id}")
}

/// What `outbox-lab clean --database-url` did with one `outboxlab_` database or role.
pub enum CleanedDatabase {
    Dropped(String),
    /// Its run is alive, or something is connected to it: never touched.
    InUse(String),
    /// A role of a dead run: dropped.
    DroppedRole(String),
    /// A role whose run is alive, or that is logged in: never touched.
    RoleInUse(String),
    /// A role of a dead run that still owns something, or is logged in: left, and why.
    LeftRole(String, String),
}

/// Our roles (named and commented after their run, [`PgServer::create_actor_roles`]), and
/// whether their run still holds its connection, or one of them is logged in.
const OUR_ROLES: &str = "
SELECT r.rolname,
       EXISTS (SELECT 1 FROM pg_stat_activity a
                WHERE a.usename = r.rolname
                   OR a.application_name = shobj_description(r.oid, 'pg_authid')) AS in_use
  FROM pg_roles r
 WHERE r.rolname LIKE 'outboxlab\\_%'
   AND shobj_description(r.oid, 'pg_authid') LIKE $1 || '%'
 ORDER BY r.rolname LIKE '%\\_writer' DESC, r.rolname";

/// Drops the `outboxlab_` databases (and their replication slots) of runs that are no longer
/// alive: neither the run that made one holds its connection, nor is anyone connected to it.
pub async fn clean_databases(url: &str) -> Result<Vec<CleanedDatabase>> {
    let admin = connect::postgres(&connect::parse_url(url)?).await?;
    let mut cleaned = Vec::new();
    for row in admin.query(OUR_DATABASES, &[&RUN_TAG_PREFIX]).await? {
        let name: String = row.get("datname");
        if row.get::<_, bool>("in_use") {
            cleaned.push(CleanedDatabase::InUse(name));
            continue;
        }
        debug_assert!(name.starts_with(DATABASE_PREFIX));
        drop_slots_of(&admin, &name).await?;
        // No FORCE: should anyone connect in the meantime, the drop fails instead.
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\""))
            .await
            .with_context(|| format!("cannot drop database {name}"))?;
        cleaned.push(CleanedDatabase::Dropped(name));
    }
    // Their databases gone, the roles of dead runs (the writers' first: members of the relays').
    for row in admin.query(OUR_ROLES, &[&RUN_TAG_PREFIX]).await? {
        let name: String = row.get("rolname");
        if row.get::<_, bool>("in_use") {
            cleaned.push(CleanedDatabase::RoleInUse(name));
            continue;
        }
        match roles::drop_role(&admin, &name).await {
            Ok(()) => cleaned.push(CleanedDatabase::DroppedRole(name)),
            Err(e) => cleaned.push(CleanedDatabase::LeftRole(name, format!("{e:#}"))),
        }
    }
    Ok(cleaned)
}

/// Drops every replication slot of database `name`, ending the walsenders that hold them.
async fn drop_slots_of(admin: &Client, name: &str) -> Result<()> {
    let mut left = 0;
    let dropped = wait::up_to(SLOT_RELEASE_LIMIT, Duration::from_millis(20), async || {
        admin.query_one(END_SLOT_WALSENDERS, &[&name]).await?;
        admin
            .query_one(DROP_RELEASED_SLOTS, &[&name])
            .await
            .with_context(|| format!("cannot drop the replication slots of {name}"))?;
        left = admin
            .query_one(SLOTS_LEFT, &[&name])
            .await?
            .get::<_, i64>(0);
        Ok(left == 0)
    })
    .await?;
    if dropped.is_none() {
        bail!("{left} replication slots of {name} still in use after {SLOT_RELEASE_LIMIT:?}: drop them with pg_drop_replication_slot");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Long labels that differ only at their end name two databases, each within 63 bytes.
    #[test]
    fn long_database_names_stay_apart() {
        let run = "20261205-122106-7a11";
        let naive = database_name(run, "zoo2_pg_transactional_outbox_outside_naive");
        let idempotent = database_name(run, "zoo2_pg_transactional_outbox_outside_idempotent");
        assert_ne!(naive, idempotent);
        assert!(naive.len() <= MAX_NAME_LEN && idempotent.len() <= MAX_NAME_LEN);
        assert_eq!(
            database_name(run, "verify"),
            "outboxlab_20261205-122106-7a11_verify"
        );
    }
}
