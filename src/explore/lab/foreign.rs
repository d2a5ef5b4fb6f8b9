//! The user's relays (`outbox-lab verify`): what they are told (the database as a URL, as
//! libpq keywords and variables; where to deliver), when they count as drained, and the input
//! errors that end a run before any verdict (a relay that exits at once, one that never
//! connects).

use std::time::{Duration, Instant};

use anyhow::Result;
use nix::unistd::User;
use tokio_postgres::config::Host;
use tokio_postgres::error::SqlState;

use super::delivery::{Backlog, Delivery};
use super::{Lab, Relays, Stage};
use crate::error;
use crate::explore::checker::{self, Violations};
use crate::explore::history::History;
use crate::explore::schedule::Role;
use crate::harness::db::Database;
use crate::harness::foreign::{relay_name, Endpoints, RelayTemplate};
use crate::harness::run_as::RelayIdentity;
use crate::judge::invariants::pending;
use crate::judge::invariants::Invariant;
use crate::judge::record;

/// A relay of the user's must have connected to the database within this time of the start,
/// or by the liveness bound if that comes first. Generous: a Python relay importing its framework (faststream-outbox with aiokafka) took
/// over 10 s to connect on a 2-core machine at load 9, killed once at 250 ms on the way.
const CONNECT_BOUND: Duration = Duration::from_secs(30);
/// Drained: nothing pending, and the consumer received nothing new for this long (a relay that
/// marks before it sends is still sending).
const DRAIN_SETTLE: Duration = Duration::from_millis(300);
/// How often the drain is looked at.
const DRAIN_POLL: Duration = Duration::from_millis(25);
/// Deliveries the consumer has received.
const COUNT_RECEIPTS: &str = "SELECT count(*) FROM consumer.receipts";
/// Counts the outbox rows a relay still owes (the judge's backlog).
pub const COUNT_PENDING: &str = concat!("SELECT count(*) FROM (", pending!(), ") owed");

/// The user's relay and what it needs.
pub struct ForeignRelays {
    pub template: RelayTemplate,
    /// Where it delivers.
    pub delivery: Delivery,
    /// Counts what is still to be delivered (by default, the outbox rows not marked published).
    pub pending_sql: String,
    /// The user's DDL, run after the article's tables in every run's fresh schema.
    pub schema: Option<String>,
    /// The user's insert of an event, run by the writer instead of the article's (see
    /// [`writer::INSERT_SQL_TYPES`](crate::outbox::writer::INSERT_SQL_TYPES)).
    pub insert_sql: Option<String>,
}

/// A run of the user's relay ended before it could be judged, for a reason that is the input's
/// (the command, the relay), not the relay's verdict.
#[derive(Debug, thiserror::Error)]
pub enum ForeignRelayError {
    #[error(
        "{name} exited by itself {after_ms} ms after it started ({status}), {when}: is \
         --relay-cmd right? its last lines: {tail}"
    )]
    ExitsAtOnce {
        name: String,
        /// Why no fault explains it: none had struck, or no relay ever connected.
        when: &'static str,
        status: String,
        after_ms: u128,
        tail: String,
    },
    #[error(
        "no relay connected to the database within {} s: does it read the URL it is given \
         ({{database_url}}, {{dsn}} or PGHOST...)? relay-0's last lines: {tail}",
        CONNECT_BOUND.as_secs()
    )]
    NeverConnects { tail: String },
}

impl Lab<'_> {
    /// The user strangers' relays run as, when not as ourselves (the lab's claimed identity):
    /// the sockets they are given let it in.
    pub(super) fn relay_user(&self) -> Option<&User> {
        self.identity.as_ref().map(RelayIdentity::user)
    }

    /// The user's relays never connected to the database: bad input (the command, the URL it
    /// reads), not a verdict. None for ours, or once one has.
    pub(super) fn never_connected(&self, stage: &Stage<'_>) -> Option<anyhow::Error> {
        if !matches!(self.relays, Relays::Foreign(_)) || stage.links.relay_connected() {
            return None;
        }
        let tail = stage.relay_tail.lock().expect("not poisoned").lines();
        let tail = tail.join(" | ");
        Some(error::Error::Usage(ForeignRelayError::NeverConnects { tail }.into()).into())
    }

    /// For the user's relays: fails the run if none connects within [`CONNECT_BOUND`]; once
    /// the writer is done, says when the outbox is drained (nothing pending, nothing left for
    /// our consumer at the broker, nothing new at the consumer for [`DRAIN_SETTLE`]), and
    /// waits for the rest of the run. Nothing to do for ours, which drain themselves. Returns
    /// only to fail.
    pub(super) async fn watch_foreign(&self, stage: &Stage<'_>) -> anyhow::Error {
        let Relays::Foreign(foreign) = &self.relays else {
            return std::future::pending().await;
        };
        let started = Instant::now();
        let mut connected = false;
        let mut settled: Option<(i64, Instant)> = None;
        let mut broker = Backlog::new(&foreign.delivery);
        // The user's count of what is owed runs as the relays (it may call what a relay made);
        // the consumer's receipts are read in its own database. Each session is made again
        // after a database restart (a nemesis): meanwhile, look again later.
        let mut owed: Option<tokio_postgres::Client> = None;
        let mut consumer: Option<tokio_postgres::Client> = None;
        loop {
            tokio::time::sleep(DRAIN_POLL).await;
            if !connected {
                connected = stage.links.relay_connected();
                stage.relay_connected.send_replace(connected);
                if started.elapsed() > CONNECT_BOUND {
                    if let Some(never) = self.never_connected(stage) {
                        return never;
                    }
                }
            }
            if !*stage.writer_done.borrow() || !*stage.nemeses_done.borrow() {
                continue;
            }
            if owed.as_ref().is_none_or(|c| c.is_closed()) {
                owed = self.session_as(Role::Relay).await.ok();
            }
            if consumer.as_ref().is_none_or(|c| c.is_closed()) {
                consumer = self.consumer_db.connect().await.ok();
            }
            let (Some(owed), Some(receipts)) = (&owed, &consumer) else {
                continue;
            };
            let pending = match owed.query_one(&foreign.pending_sql, &[]).await {
                Ok(row) => row.get::<_, i64>(0),
                Err(e) if e.code() == Some(&SqlState::QUERY_CANCELED) => {
                    return self.user_sql_failed("--pending-sql took too long during the run", e);
                }
                Err(_) => continue,
            };
            let counts = async {
                let received: i64 = receipts.query_one(COUNT_RECEIPTS, &[]).await?.get(0);
                let pending = pending + broker.count(receipts).await?;
                anyhow::Ok((pending, received))
            };
            let Ok((pending, received)) = counts.await else {
                continue;
            };
            settled = match settled {
                _ if pending > 0 => None,
                Some((seen, since)) if seen == received => {
                    if since.elapsed() >= DRAIN_SETTLE {
                        stage.drained.send_replace(true);
                        return std::future::pending().await;
                    }
                    Some((seen, since))
                }
                _ => Some((received, Instant::now())),
            };
        }
    }

    /// What the user's relay `index` is told: the database at `database` (its link), as a URL,
    /// as libpq keywords, as libpq's variables, and where to deliver. Its sessions are named
    /// `relay-N` in all three, for the user's eyes: the nemeses find them by their link.
    pub(super) fn endpoints(
        &self,
        database: &Database,
        sink: &str,
        index: u32,
    ) -> Result<Endpoints> {
        let config = database.config()?;
        let host = match config.get_hosts().first() {
            Some(Host::Unix(dir)) => dir.to_string_lossy().into_owned(),
            Some(Host::Tcp(name)) => name.clone(),
            None => "localhost".into(),
        };
        let port = config
            .get_ports()
            .first()
            .copied()
            .unwrap_or(5432)
            .to_string();
        let user = config.get_user().unwrap_or("postgres").to_string();
        let dbname = database.name.clone();
        let password = config
            .get_password()
            .map(|p| String::from_utf8_lossy(p).into_owned());
        let encode = |text: &str| crate::connect::percent_encode(text.as_bytes());
        let credentials = match &password {
            Some(p) => format!("{}:{}", encode(&user), encode(p)),
            None => encode(&user),
        };
        let application_name = relay_name(index);
        let database_url = format!(
            "postgresql://{credentials}@{}:{port}/{}?application_name={application_name}",
            encode(&host),
            encode(&dbname)
        );
        let quote = |v: &str| format!("'{}'", v.replace('\\', "\\\\").replace('\'', "\\'"));
        let mut dsn = format!(
            "host={} port={port} user={} dbname={} application_name={application_name}",
            quote(&host),
            quote(&user),
            quote(&dbname)
        );
        let mut libpq_env = vec![
            ("PGHOST".to_string(), host),
            ("PGPORT".to_string(), port),
            ("PGUSER".to_string(), user),
            ("PGDATABASE".to_string(), dbname),
            ("PGAPPNAME".to_string(), application_name),
        ];
        if let Some(p) = password {
            dsn.push_str(&format!(" password={}", quote(&p)));
            libpq_env.push(("PGPASSWORD".to_string(), p));
        }
        let none = String::new;
        let mut urls = [none(), none(), none(), none(), none()];
        let which = match self.delivery() {
            Delivery::Http => 0,
            // `sink`: the broker's, or the proxy's in front of it.
            Delivery::Redis { .. } => 1,
            Delivery::Nats { .. } => 2,
            Delivery::Amqp { .. } => 3,
            Delivery::Kafka { .. } => 4,
        };
        urls[which] = sink.to_string();
        let [http_url, redis_url, nats_url, amqp_url, kafka_url] = urls;
        Ok(Endpoints {
            database_url,
            dsn,
            libpq_env,
            sink_url: sink.to_string(),
            http_url,
            redis_url,
            nats_url,
            amqp_url,
            kafka_url,
        })
    }
}

/// The judge names its sessions so (`application_name`).
const JUDGE_APPLICATION_NAME: &str = "outbox-lab judge";

impl Lab<'_> {
    /// A session of the judge's: the consumer's database, the judge's tables first on its path
    /// (strangers' relays: see [`record`]).
    pub async fn judge_client(&self) -> Result<tokio_postgres::Client> {
        let client = self.consumer_db.connect_as(JUDGE_APPLICATION_NAME).await?;
        client.batch_execute(record::JUDGE_SEARCH_PATH).await?;
        Ok(client)
    }

    /// Judges a run of strangers' relays on the judge's own record ([`record`]), where no relay
    /// reaches: the violations (`cut_short`: not drained, so what is owed is pending, not lost,
    /// and liveness is not judged; `stuck`: the liveness bound the run hit), and the orders the
    /// writer was told committed that the database no longer has.
    pub(super) async fn judge_strangers(
        &self,
        history: &History,
        failed_over: bool,
        cut_short: bool,
        stuck: Option<&str>,
    ) -> Result<(Violations, Vec<String>)> {
        let judge = self.judge_client().await?;
        {
            let application = self.client().await?;
            record::judge_from_record(&application, &judge, &history.written, failed_over).await?;
        }
        let mut violations = match cut_short {
            true => checker::check_live(&judge).await?,
            false => checker::check(&judge, stuck).await?,
        };
        let tampering = record::tampering(&judge).await?;
        for (invariant, found) in [
            (Invariant::Lost, tampering.rewritten),
            (Invariant::Ghost, tampering.ghosts),
        ] {
            if !found.is_empty() {
                let ids = violations.entry(invariant).or_default();
                ids.extend(found);
                ids.sort();
                ids.dedup();
            }
        }
        // A lost event the relays were already past when it committed says so.
        if let Some(lost) = violations.get_mut(&Invariant::Lost) {
            for (id, said) in record::skipped(&judge).await? {
                if let Some(found) = lost.iter_mut().find(|found| **found == id) {
                    *found = said;
                }
            }
        }
        let acknowledged_lost = record::acknowledged_lost(&judge).await?;
        Ok((violations, acknowledged_lost))
    }
}
