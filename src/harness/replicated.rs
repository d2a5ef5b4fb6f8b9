//! A throwaway primary with a streaming standby: PostgreSQL's own physical replication
//! (`pg_basebackup -R`, a physical replication slot), asynchronous or synchronous, and its
//! failover: the primary's machine dies (SIGKILL to every process of it at once) and the
//! standby is promoted. Both are [`Cluster`]s, so a run that is killed leaves two directories
//! the next run reaps.
//!
//! Holding the replication back, to make the asynchronous loss certain rather than lucky, is
//! done on the primary's side: its walsender is stopped (SIGSTOP), so the primary acknowledges
//! commits whose WAL it never sends. (Stopping the standby's WAL receiver instead would not
//! do: what the walsender had already written stays in the socket's buffer, and the receiver
//! reads it once it runs again, before the promotion ends.)

use std::time::Duration;

use anyhow::{bail, Context, Result};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::sync::watch;
use tokio_postgres::Config;

use crate::connect;
use crate::harness::cluster::{Cluster, PgBinaries};
use crate::harness::db::Database;
use crate::harness::link::postgres::PgProxy;
use crate::wait;

/// The standby's name: its replication slot, and its `application_name` on the primary (what
/// `synchronous_standby_names` names).
const STANDBY: &str = "standby";
/// Bounds the waits for the standby: to stream, to be synchronous, to catch up.
const STANDBY_LIMIT: Duration = Duration::from_secs(30);

/// How the primary waits for its standby at COMMIT.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Replication {
    /// The primary answers COMMIT once its own WAL is flushed (PostgreSQL's default).
    Async,
    /// `synchronous_standby_names` names the standby and `synchronous_commit = on`: COMMIT is
    /// answered once the standby has flushed its WAL too.
    Sync,
}

impl Replication {
    pub fn name(self) -> &'static str {
        match self {
            Replication::Async => "async",
            Replication::Sync => "sync",
        }
    }
}

/// The replicated pair: the primary (until it fails) and its standby (the primary after).
pub struct Replicated {
    /// `None` once it failed over: its directory went with it.
    primary: Option<Cluster>,
    standby: Cluster,
    /// The primary's walsender, while it is stopped.
    held: Option<Pid>,
}

/// The standby's walsender on the primary, once it streams (and, for `sync`, is synchronous).
const SENDER: &str = "
SELECT pid FROM pg_stat_replication
 WHERE application_name = $1 AND state = 'streaming' AND ($2 = false OR sync_state = 'sync')";

/// A failover slot's copy on the standby, ready to take over at a promotion (PostgreSQL 17).
const SYNCED_SLOT: &str = "
SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND synced AND NOT temporary";

/// The standby has replayed everything the primary has written so far.
const CAUGHT_UP: &str = "
SELECT replay_lsn >= pg_current_wal_lsn() FROM pg_stat_replication WHERE application_name = $1";

impl Replicated {
    /// A fresh primary (the same server settings as the throwaway cluster; with
    /// `commit_timestamps`, `track_commit_timestamp` on) and its standby, streaming; with
    /// [`Replication::Sync`], COMMIT waits for the standby. With `failover_slots` (PostgreSQL
    /// 17 and later), the standby can take copies of the primary's failover slots
    /// ([`Replicated::sync_slots`]), and the primary sends a failover slot's changes to its
    /// reader only once the standby has them (`synchronized_standby_slots`).
    pub async fn start(
        bins: &PgBinaries,
        replication: Replication,
        failover_slots: bool,
        commit_timestamps: bool,
    ) -> Result<Replicated> {
        let primary = Cluster::start(bins, false, commit_timestamps).await?;
        let standby = primary
            .start_standby(STANDBY, failover_slots)
            .await
            .context("cannot start the streaming standby")?;
        let pair = Replicated {
            primary: Some(primary),
            standby,
            held: None,
        };
        pair.replicate(replication, failover_slots).await?;
        Ok(pair)
    }

    /// After a failover, the promoted standby becomes the primary of a new standby, copied
    /// from it as the first was (`pg_basebackup -R`), replicating as `replication` says: a
    /// pair again, ready for the next failover. Nothing to do before one.
    pub async fn renew(&mut self, replication: Replication) -> Result<()> {
        if self.primary.is_some() {
            return Ok(());
        }
        let standby = self
            .standby
            .start_standby(STANDBY, false)
            .await
            .context("cannot start a new streaming standby")?;
        self.primary = Some(std::mem::replace(&mut self.standby, standby));
        self.replicate(replication, false).await
    }

    /// The primary's settings for its standby (written with ALTER SYSTEM, which a base backup
    /// taken before does not carry), then waits until the standby streams (for `sync`, as
    /// the synchronous one).
    async fn replicate(&self, replication: Replication, failover_slots: bool) -> Result<()> {
        let client = self.primary_client().await?;
        let sync = replication == Replication::Sync;
        let mut settings = Vec::new();
        if sync {
            settings.push(format!(
                "ALTER SYSTEM SET synchronous_standby_names = '\"{STANDBY}\"'"
            ));
            settings.push("ALTER SYSTEM SET synchronous_commit = 'on'".into());
        }
        if failover_slots {
            settings.push(format!(
                "ALTER SYSTEM SET synchronized_standby_slots = '{STANDBY}'"
            ));
        }
        if !settings.is_empty() {
            settings.push("SELECT pg_reload_conf()".into());
        }
        // One statement each: ALTER SYSTEM refuses to run inside a transaction block.
        for statement in settings {
            client.batch_execute(&statement).await?;
        }
        wait::until(
            "the standby to stream",
            STANDBY_LIMIT,
            Duration::from_millis(20),
            async || {
                Ok(client
                    .query_opt(SENDER, &[&STANDBY, &sync])
                    .await?
                    .is_some())
            },
        )
        .await
    }

    /// The primary's superuser URL (the standby's once it failed over).
    pub fn url(&self) -> String {
        match &self.primary {
            Some(primary) => primary.url(),
            None => self.standby.url(),
        }
    }

    /// The standby's server, as a link is pointed at it.
    pub fn standby_config(&self) -> Result<Config> {
        connect::parse_url(&self.standby.url())
    }

    async fn primary_client(&self) -> Result<tokio_postgres::Client> {
        let Some(primary) = &self.primary else {
            bail!("the primary has failed over already");
        };
        connect::postgres(&connect::parse_url(&primary.url())?).await
    }

    /// Waits until the standby has replayed all the primary wrote.
    pub async fn caught_up(&self) -> Result<()> {
        let client = self.primary_client().await?;
        wait::until(
            "the standby to catch up",
            STANDBY_LIMIT,
            Duration::from_millis(10),
            async || {
                let row = client.query_opt(CAUGHT_UP, &[&STANDBY]).await?;
                Ok(row.is_some_and(|r| r.get::<_, Option<bool>>(0) == Some(true)))
            },
        )
        .await
    }

    /// The standby copies the primary's failover slots now (`pg_sync_replication_slots`, what
    /// its slot sync worker does every few seconds), and waits until `slot`'s copy is ready to
    /// take over.
    pub async fn sync_slots(&self, slot: &str) -> Result<()> {
        let standby = connect::postgres(&self.standby_config()?).await?;
        wait::until(
            format!("the standby's copy of slot {slot}"),
            STANDBY_LIMIT,
            Duration::from_millis(50),
            async || {
                standby
                    .batch_execute("SELECT pg_sync_replication_slots()")
                    .await?;
                let ready = standby.query_opt(SYNCED_SLOT, &[&slot]).await?;
                Ok(ready.is_some())
            },
        )
        .await
    }

    /// Stops the primary's walsender (SIGSTOP): from now on the standby receives nothing.
    /// Asynchronous, the primary goes on answering COMMITs; synchronous, they wait.
    /// A standby reconnecting (the primary restarted a moment ago) is waited for.
    pub async fn hold_replication(&mut self) -> Result<()> {
        let client = connect::patiently(connect::RECONNECT_PATIENCE, async || {
            self.primary_client().await
        })
        .await?;
        let mut sender = None;
        wait::until(
            "the standby to stream, to hold it",
            STANDBY_LIMIT,
            Duration::from_millis(10),
            async || {
                let row = client.query_opt(SENDER, &[&STANDBY, &false]).await?;
                sender = row.map(|r| r.get::<_, i32>(0));
                Ok(sender.is_some())
            },
        )
        .await?;
        let pid = sender.expect("waited for");
        // A backend of our own private primary, found by its own statistics.
        kill(Pid::from_raw(pid), Signal::SIGSTOP).context("cannot stop the walsender")?;
        self.held = Some(Pid::from_raw(pid));
        Ok(())
    }

    /// PostgreSQL's own crash and restart of the primary now (`pg_ctl stop -m immediate`): the
    /// first, its standby left streaming, or the promoted standby after a failover. db:restart
    /// where the database is on the pair.
    pub async fn restart_primary(&mut self) -> Result<()> {
        match &mut self.primary {
            Some(primary) => primary.restart_immediately().await,
            None => self.standby.restart_immediately().await,
        }
    }

    /// Lets the held walsender go on (SIGCONT): a failover that did not come (the run ended
    /// first) leaves nothing held.
    pub fn release_replication(&mut self) {
        if let Some(pid) = self.held.take() {
            let _ = kill(pid, Signal::SIGCONT);
        }
    }

    /// The failover: the primary dies at once, every process of it killed (nothing it held
    /// back is sent), and the standby is promoted. [`Replicated::url`] names it from now on.
    pub async fn fail_over(&mut self) -> Result<()> {
        if let Some(mut primary) = self.primary.take() {
            // The held walsender dies still stopped, with the primary's other processes: it
            // sends nothing it held back, and is not left stopped.
            self.held = None;
            primary.crash().await?;
        }
        self.standby.promote().await
    }
}

impl Drop for Replicated {
    fn drop(&mut self) {
        // A stopped walsender would hold the primary's shutdown back.
        self.release_replication();
    }
}

/// The pair behind one address, as a virtual IP is: whoever connects there reaches the
/// primary, and after [`VirtualPrimary::fail_over`] the promoted standby (verify's
/// `db:failover`). Everyone reaches the pair through its link (the lab, and each actor's own
/// link, which connects to this one), so the failover cuts every connection at once and a
/// client that connects again with the same URL finds the new primary.
pub struct VirtualPrimary {
    pair: tokio::sync::Mutex<Replicated>,
    replication: Replication,
    address: PgProxy,
}

impl VirtualPrimary {
    /// A fresh pair of the `bins` servers, replicating as `replication` says, behind an address
    /// of its own (a private socket).
    pub async fn start(bins: &PgBinaries, replication: Replication) -> Result<VirtualPrimary> {
        let pair = Replicated::start(bins, replication, false, true).await?;
        let address = PgProxy::start(&connect::parse_url(&pair.url())?, 1, None).await?;
        Ok(VirtualPrimary {
            pair: tokio::sync::Mutex::new(pair),
            replication,
            address,
        })
    }

    pub fn replication(&self) -> Replication {
        self.replication
    }

    /// Creates the database `name` on the pair (its own: no other run's is there), reached at
    /// the address.
    pub async fn create_database(&self, name: &str) -> Result<Database> {
        let url = self.pair.lock().await.url();
        let admin = connect::postgres(&connect::parse_url(&url)?).await?;
        admin
            .batch_execute(&format!("CREATE DATABASE \"{name}\""))
            .await?;
        let on_the_pair = Database {
            server_url: url,
            name: name.to_string(),
        };
        self.address.link(0).database(&on_the_pair)
    }

    /// db:restart: the primary now crashes and restarts ([`Replicated::restart_primary`]).
    pub async fn restart_immediately(&self) -> Result<()> {
        self.pair.lock().await.restart_primary().await
    }

    /// Before a run: a pair again if the last run failed it over (a new standby of the
    /// promoted one).
    pub async fn ready(&self) -> Result<()> {
        self.pair.lock().await.renew(self.replication).await
    }

    /// The failover's first part: the replication held (the primary's walsender stopped), so
    /// that the primary answers COMMITs its standby never receives (asynchronous; synchronous
    /// ones wait).
    pub async fn hold_replication(&self) -> Result<()> {
        self.pair.lock().await.hold_replication().await
    }

    /// The failover, `hold` after the replication was held: the primary's machine dies, the
    /// standby is promoted, and the address re-pointed at it. Nothing stays held when `over`
    /// comes first: false then, and no failover.
    pub async fn fail_over_after(
        &self,
        hold: Duration,
        mut over: watch::Receiver<bool>,
    ) -> Result<bool> {
        let due = tokio::select! {
            _ = tokio::time::sleep(hold) => true,
            _ = over.wait_for(|over| *over) => false,
        };
        let mut pair = self.pair.lock().await;
        if !due {
            pair.release_replication();
            return Ok(false);
        }
        pair.fail_over().await?;
        self.address.repoint(&pair.standby_config()?)?;
        Ok(true)
    }
}
