//! The log-tailing relay (the way Debezium reads PostgreSQL): outbox INSERTs read from the WAL
//! through a logical replication slot, instead of polled from the table.
//!
//! Route: the streaming replication protocol with the built-in `pgoutput` plugin, through the
//! `pgwire-replication` crate (tokio; tokio-postgres 0.7 itself cannot speak the replication
//! protocol). That crate decodes the transaction boundaries (Begin, Commit) and hands the other
//! messages over raw; [`pgoutput`] decodes the two the relay needs (Relation, Insert).
//!
//! What this module owns: the publication and the slot (created per database, dropped by the
//! scenario, and by [`crate::harness::db`] for any database it drops), the relay itself, and the SQL that
//! reads the slot's state. The relay
//! - delivers in commit order, one transaction at a time, each event retried with backoff until
//!   delivered (no dead letter: an undeliverable event stops the stream, as in Debezium);
//! - confirms a transaction's end to the server only after all its events were delivered, and
//!   waits until the slot shows it (`confirmed_flush_lsn`) before taking the next: a crash
//!   between the two re-delivers exactly the transaction in flight, and loses nothing;
//! - with its heartbeat on, also confirms the stream's position while no outbox transaction is
//!   in flight (the server's keepalives, transactions without outbox rows): without it, a
//!   database busy with other tables and a quiet outbox makes the slot retain all the WAL
//!   written meanwhile (the problem Debezium's heartbeats exist for);
//! - sees rows that are deleted right after insert, even in the same transaction (the
//!   Debezium-style outbox): the WAL carries the INSERT whatever happens to the row later.
//!
//! Messages go out as the other relays send them: key = aggregate id, Redis stream
//! `outbox.event.<aggregate_type>` (Debezium's Outbox Event Router names its topics that way).

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use pgwire_replication::{Lsn, ReplicationClient, ReplicationConfig, ReplicationEvent, TlsConfig};
use tokio_postgres::config::Host;
use tokio_postgres::Client;

use crate::connect;
use crate::outbox::crash::{self, CrashPoint};
use crate::outbox::event::Event;
use crate::outbox::relay::pgoutput::{self, Change, Relation};
use crate::outbox::sink::Sink;
use crate::wait;

/// The publication the slot streams: only the outbox, only its INSERTs.
pub const PUBLICATION: &str = "outboxlab_outbox";

pub const CREATE_PUBLICATION: &str =
    "CREATE PUBLICATION outboxlab_outbox FOR TABLE outbox WITH (publish = 'insert')";

pub const WAL_LEVEL: &str = "SELECT current_setting('wal_level')";

/// The slot remembers from where to stream (and retains the WAL from there) until dropped.
pub const CREATE_SLOT: &str = "SELECT pg_create_logical_replication_slot($1, 'pgoutput')";

/// The same, as a failover slot (PostgreSQL 17): a standby may copy it, and its copy takes over
/// at a promotion (not temporary, no two-phase, failover).
pub const CREATE_FAILOVER_SLOT: &str =
    "SELECT pg_create_logical_replication_slot($1, 'pgoutput', false, false, true)";

pub const DROP_SLOT: &str = "SELECT pg_drop_replication_slot($1)";

/// Whether a walsender is streaming from the slot (a stopped relay's may take a moment to go).
pub const SLOT_ACTIVE: &str = "SELECT active FROM pg_replication_slots WHERE slot_name = $1";

/// Whether the server has taken the relay's confirmation of everything up to $2 (the current
/// end of the WAL when $2 is NULL).
pub const CONFIRMED_AT_LEAST: &str = "
SELECT confirmed_flush_lsn >= COALESCE($2::text::pg_lsn, pg_current_wal_lsn())
  FROM pg_replication_slots WHERE slot_name = $1";

/// A mark in the WAL, after every transaction committed so far: once the relay confirms it, it
/// has delivered them all (and the slot may release the WAL before it).
pub const EMIT_MARK: &str = "SELECT pg_logical_emit_message(false, $1, 'caught-up')::text";

/// What a slot holds back: the WAL kept for it (from `restart_lsn`, where decoding would start
/// again) and the part its relay has not confirmed yet.
pub const SLOT_RETAINED: &str = "
SELECT (pg_current_wal_lsn() - restart_lsn)::bigint AS retained_bytes,
       (pg_current_wal_lsn() - confirmed_flush_lsn)::bigint AS unconfirmed_bytes
  FROM pg_replication_slots
 WHERE slot_name = $1";

pub const CURRENT_WAL_LSN: &str = "SELECT pg_current_wal_lsn()::text";

/// WAL written since $1.
pub const WAL_SINCE: &str = "SELECT (pg_current_wal_lsn() - $1::text::pg_lsn)::bigint";

/// A slot's `restart_lsn` only moves on at a running-transactions record in the WAL: the
/// background writer logs one every 15 s, a checkpoint logs one at once.
pub const CHECKPOINT: &str = "CHECKPOINT";

/// Slots on the server, ours or not (a leftover slot retains WAL forever).
pub const SLOTS_OF_DATABASE: &str = "SELECT count(*) FROM pg_replication_slots WHERE database = $1";

/// The prefix of [`EMIT_MARK`]'s messages; the relay confirms them.
pub const MARK_PREFIX: &str = "outbox-lab";

/// How often the relay's feedback reaches the server (the crate's default is 10 s).
const FEEDBACK_INTERVAL: Duration = Duration::from_millis(5);
/// How often the slot is looked at while waiting for it.
const SLOT_POLL: Duration = Duration::from_millis(2);
/// Bounds on waiting for the slot: to be confirmed, to be released by a stopped relay.
const SLOT_WAIT_LIMIT: Duration = Duration::from_secs(10);

/// A slot of ours is named after its database (unique on the server, and ours by its prefix).
pub fn slot_name(database: &str) -> String {
    database.to_string()
}

/// The publication and the slot (a failover slot with `failover`); the slot streams what is
/// committed from now on.
pub async fn create_slot(client: &Client, slot: &str, failover: bool) -> Result<()> {
    let wal_level: String = client.query_one(WAL_LEVEL, &[]).await?.get(0);
    if wal_level != "logical" {
        bail!(
            "the CDC relay needs wal_level=logical (the server has {wal_level}): set it in \
             postgresql.conf and restart the server, or run without --database-url"
        );
    }
    client.batch_execute(CREATE_PUBLICATION).await?;
    let create = if failover {
        CREATE_FAILOVER_SLOT
    } else {
        CREATE_SLOT
    };
    client
        .execute(create, &[&slot])
        .await
        .with_context(|| format!("cannot create replication slot {slot}"))?;
    Ok(())
}

/// Drops the slot once no relay streams from it any more.
pub async fn drop_slot(client: &Client, slot: &str) -> Result<()> {
    wait_until_released(client, slot).await?;
    client
        .execute(DROP_SLOT, &[&slot])
        .await
        .with_context(|| format!("cannot drop replication slot {slot}"))?;
    Ok(())
}

/// Waits until no walsender holds the slot: a relay just stopped leaves it a moment later.
async fn wait_until_released(client: &Client, slot: &str) -> Result<()> {
    let what = format!("replication slot {slot} to be released");
    wait::until(what, SLOT_WAIT_LIMIT, SLOT_POLL, async || {
        match client.query_opt(SLOT_ACTIVE, &[&slot]).await? {
            None => bail!("replication slot {slot} does not exist"),
            Some(row) => Ok(!row.get::<_, bool>(0)),
        }
    })
    .await
}

/// Writes a mark into the WAL and waits until the relay has confirmed it: by then every
/// transaction committed before has been delivered.
pub async fn wait_caught_up(client: &Client, slot: &str, limit: Duration) -> Result<()> {
    let mark: String = client.query_one(EMIT_MARK, &[&MARK_PREFIX]).await?.get(0);
    let what = format!("the CDC relay to confirm {mark}");
    wait::until(what, limit, SLOT_POLL, async || {
        confirmed_at_least(client, slot, &mark).await
    })
    .await
}

/// Waits up to `limit` until the relay has confirmed the current end of the WAL, by itself
/// (no mark is written, unlike [`wait_caught_up`]): whether it did.
pub async fn wait_confirmed_by_itself(
    client: &Client,
    slot: &str,
    limit: Duration,
) -> Result<bool> {
    let now: String = client.query_one(CURRENT_WAL_LSN, &[]).await?.get(0);
    let confirmed = wait::up_to(limit, SLOT_POLL, async || {
        confirmed_at_least(client, slot, &now).await
    })
    .await?;
    Ok(confirmed.is_some())
}

async fn confirmed_at_least(client: &Client, slot: &str, lsn: &str) -> Result<bool> {
    let row = client.query_opt(CONFIRMED_AT_LEAST, &[&slot, &lsn]).await?;
    let row = row.ok_or_else(|| anyhow!("replication slot {slot} does not exist"))?;
    Ok(row.get::<_, Option<bool>>(0).unwrap_or(false))
}

/// How the CDC relay retries a delivery.
#[derive(Debug, Clone)]
pub struct CdcConfig {
    pub slot: String,
    /// The first retry waits this long; each further one twice as long.
    pub backoff_base: Duration,
    /// After this many failed tries of one event the relay stops (unconfirmed: nothing lost).
    pub max_attempts: u32,
    /// Confirm the stream's position while no outbox transaction is in flight (see the module).
    pub heartbeat: bool,
}

/// The log-tailing relay: one replication connection streaming the slot, one ordinary
/// connection to see what the slot has confirmed.
pub struct CdcRelay {
    stream: ReplicationClient,
    db: Client,
    sink: Sink,
    config: CdcConfig,
    /// Tables by OID, as the stream described them (a Relation message precedes their rows).
    relations: HashMap<u32, Relation>,
    /// Prints `[relay NAME] ...` lines to stdout when set; children do.
    log_name: Option<String>,
}

impl CdcRelay {
    /// Waits for the slot to be free (a relay just stopped may still hold it), then starts
    /// streaming from where the slot's confirmed position stands.
    pub async fn connect(
        db_config: &tokio_postgres::Config,
        sink: Sink,
        config: CdcConfig,
        log_name: Option<String>,
    ) -> Result<CdcRelay> {
        let db = connect::postgres(db_config).await?;
        wait_until_released(&db, &config.slot).await?;
        let replication = replication_config(db_config, &config.slot)?;
        let mut stream = ReplicationClient::connect(replication)
            .await
            .map_err(|e| anyhow!("cannot stream replication slot {}: {e}", config.slot))?;
        stream
            .wait_started()
            .await
            .map_err(|e| anyhow!("cannot stream replication slot {}: {e}", config.slot))?;
        Ok(CdcRelay {
            stream,
            db,
            sink,
            config,
            relations: HashMap::new(),
            log_name,
        })
    }

    /// Delivers each committed transaction's outbox rows, in commit order, until the process is
    /// stopped (or an event cannot be delivered).
    pub async fn follow(&mut self) -> Result<()> {
        let mut transaction: Vec<Event> = Vec::new();
        // Between Begin and Commit: a position seen then may be past rows not delivered yet.
        let mut in_transaction = false;
        loop {
            let event = self
                .stream
                .recv()
                .await
                .map_err(|e| anyhow!("replication stream: {e}"))?
                .ok_or_else(|| anyhow!("the replication stream ended"))?;
            match event {
                ReplicationEvent::Begin { .. } => {
                    transaction.clear();
                    in_transaction = true;
                }
                ReplicationEvent::XLogData { data, .. } => {
                    if let Some(event) = self.decode(&data)? {
                        transaction.push(event);
                    }
                }
                ReplicationEvent::Commit { end_lsn, .. } if !transaction.is_empty() => {
                    in_transaction = false;
                    for event in std::mem::take(&mut transaction) {
                        self.deliver(&event).await?;
                    }
                    self.confirm(end_lsn).await?;
                }
                // Nothing to deliver up to here: confirmed without waiting for the slot (were
                // the confirmation lost, the stretch would only be streamed again, empty).
                ReplicationEvent::Commit { end_lsn, .. } => {
                    in_transaction = false;
                    if self.config.heartbeat {
                        self.stream.update_applied_lsn(end_lsn);
                    }
                }
                ReplicationEvent::KeepAlive { wal_end, .. }
                    if self.config.heartbeat && !in_transaction =>
                {
                    self.stream.update_applied_lsn(wal_end);
                }
                ReplicationEvent::Message { prefix, lsn, .. } if prefix == MARK_PREFIX => {
                    self.confirm(lsn).await?;
                }
                _ => {}
            }
        }
    }

    fn decode(&mut self, data: &[u8]) -> Result<Option<Event>> {
        match pgoutput::decode(data)? {
            Change::Relation { oid, relation } => {
                self.relations.insert(oid, relation);
                Ok(None)
            }
            Change::Insert { oid, values } => {
                let relation = self
                    .relations
                    .get(&oid)
                    .ok_or_else(|| anyhow!("a row of relation {oid} before its description"))?;
                Ok(Some(event_from_insert(relation, &values)?))
            }
            Change::Other => Ok(None),
        }
    }

    /// One event, tried until delivered: a later event never overtakes it.
    async fn deliver(&self, event: &Event) -> Result<()> {
        for attempt in 1..=self.config.max_attempts {
            let result = self
                .sink
                .deliver(std::slice::from_ref(event), |_| {
                    crash::point(CrashPoint::CdcRelayAfterSendBeforeConfirm)
                })
                .await
                .pop()
                .expect("one result per event");
            match result {
                Ok(()) => return Ok(()),
                Err(e) if attempt < self.config.max_attempts => {
                    let id = event.outbox_id.unwrap_or_default();
                    self.log(format_args!("outbox id={id} failed: {e:#}"));
                    let backoff = self.config.backoff_base * 2u32.pow(attempt - 1);
                    tokio::time::sleep(backoff).await;
                }
                Err(e) => {
                    return Err(e.context(format!(
                        "outbox id={} undelivered after {attempt} attempts; its position stays \
                         unconfirmed",
                        event.outbox_id.unwrap_or_default()
                    )))
                }
            }
        }
        unreachable!("the last attempt returns")
    }

    /// Confirms everything up to `lsn` and waits until the slot shows it.
    async fn confirm(&self, lsn: Lsn) -> Result<()> {
        self.stream.update_applied_lsn(lsn);
        let lsn = lsn.to_pg_string();
        let what = format!("the server to take the confirmation of {lsn}");
        wait::until(what, SLOT_WAIT_LIMIT, SLOT_POLL, async || {
            confirmed_at_least(&self.db, &self.config.slot, &lsn).await
        })
        .await
    }

    /// A log line, its secrets masked (a failure may quote the sink's URL).
    fn log(&self, line: std::fmt::Arguments<'_>) {
        if let Some(name) = &self.log_name {
            println!(
                "[relay {name}] {}",
                crate::secrets::redact(&line.to_string())
            );
        }
    }
}

/// The event of an inserted outbox row.
fn event_from_insert(relation: &Relation, values: &[Option<String>]) -> Result<Event> {
    let row = pgoutput::row_by_name(relation, values);
    let column = |name: &str| {
        row.get(name)
            .copied()
            .flatten()
            .ok_or_else(|| anyhow!("{} row without {name}", relation.name))
    };
    Ok(Event {
        outbox_id: Some(column("id")?.parse().context("outbox id")?),
        event_id: column("event_id")?.parse().context("outbox event_id")?,
        aggregate_type: column("aggregate_type")?.to_string(),
        aggregate_id: column("aggregate_id")?.to_string(),
        event_type: column("event_type")?.to_string(),
        payload: serde_json::from_str(column("payload")?).context("outbox payload")?,
        fence: None,
    })
}

/// The replication connection to the same database as `db`.
fn replication_config(db: &tokio_postgres::Config, slot: &str) -> Result<ReplicationConfig> {
    let user = db.get_user().unwrap_or("postgres");
    let password = db
        .get_password()
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .unwrap_or_default();
    let dbname = db
        .get_dbname()
        .ok_or_else(|| anyhow!("no database to stream"))?;
    let port = db.get_ports().first().copied().unwrap_or(5432);
    let config = match db.get_hosts().first() {
        Some(Host::Unix(dir)) => ReplicationConfig::unix(
            dir.display().to_string(),
            port,
            user,
            password,
            dbname,
            slot,
            PUBLICATION,
        ),
        Some(Host::Tcp(host)) => {
            ReplicationConfig::new(host, user, password, dbname, slot, PUBLICATION).with_port(port)
        }
        None => ReplicationConfig::new("localhost", user, password, dbname, slot, PUBLICATION)
            .with_port(port),
    };
    let name = db.get_application_name().unwrap_or("outbox-lab cdc relay");
    Ok(config
        .with_tls(TlsConfig::disabled())
        .with_status_interval(FEEDBACK_INTERVAL)
        .with_application_name(name))
}
