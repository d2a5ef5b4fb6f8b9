//! The design's database: made once per design (the article's schema, and what our designs or
//! the user's `--schema` add), reset before every run, and the lab's own bounded session to it.

use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

use super::{Bounds, ForeignRelays, Lab, Relays, Workload, EXPLORE_BOUNDS};
use crate::error;
use crate::explore::designs::Design;
use crate::harness::db::PgServer;
use crate::harness::nemesis::format_duration;
use crate::harness::ports;
use crate::harness::replicated::{Replication, VirtualPrimary};
use crate::judge::record;
use crate::outbox::schema;
use crate::outbox::writer;

/// The lab names its own sessions so (`application_name`).
const LAB_APPLICATION_NAME: &str = "outbox-lab supervisor";
/// The reset between runs waits this long at most for a killed child's session (which the
/// server ends a moment after the process) to release its locks.
const RESET_LOCK_TIMEOUT: Duration = Duration::from_secs(5);

impl<'s> Lab<'s> {
    /// Creates the design's database with the article's schema, the watermark table, and the
    /// claim designs' lease columns and fences; with `replication`, on a replicated pair of
    /// its own (for db:failover).
    pub async fn prepare(
        server: &'s PgServer,
        design: &'static Design,
        workload: Workload,
        replication: Option<Replication>,
    ) -> Result<Lab<'s>> {
        let lab = Lab::open(
            server,
            design,
            workload,
            Relays::Ours,
            EXPLORE_BOUNDS,
            replication,
        )
        .await?;
        {
            let client = lab.client().await?;
            schema::create(&client).await?;
            client.batch_execute(schema::ADD_RELAY_WATERMARK).await?;
            client.batch_execute(schema::ADD_CLAIM_COLUMNS).await?;
            client.batch_execute(schema::ADD_FENCING).await?;
        }
        Ok(lab)
    }

    /// A lab for the user's relays (`outbox-lab verify`): every run starts from a fresh schema,
    /// the article's tables and NOTIFY trigger then the user's DDL (made once here, so that a
    /// schema that does not apply is found before any run). With `replication`, the
    /// application's database is on a replicated pair of its own (for db:failover).
    pub async fn prepare_foreign(
        server: &'s PgServer,
        design: &'static Design,
        workload: Workload,
        foreign: ForeignRelays,
        bounds: Bounds,
        replication: Option<Replication>,
    ) -> Result<Lab<'s>> {
        let relays = Relays::Foreign(foreign);
        let lab = Lab::open(server, design, workload, relays, bounds, replication).await?;
        lab.reset().await?;
        lab.try_pending_sql().await?;
        lab.try_insert_sql().await?;
        Ok(lab)
    }

    /// Runs the user's relay's count of what is still owed once, on the fresh schema: a
    /// statement that cannot count is bad input, found before any run.
    pub(super) async fn try_pending_sql(&self) -> Result<()> {
        let Relays::Foreign(foreign) = &self.relays else {
            return Ok(());
        };
        let client = self.client().await?;
        let row = client
            .query_one(foreign.pending_sql.as_str(), &[])
            .await
            .map_err(|e| {
                self.user_sql_failed("--pending-sql does not run on the fresh schema", e)
            })?;
        row.try_get::<_, i64>(0).map_err(|_| {
            error::Error::Usage(anyhow!(
                "--pending-sql must return one bigint: the count still to be delivered"
            ))
        })?;
        Ok(())
    }

    /// Prepares the user's insert on the fresh schema: one that does not prepare is bad input,
    /// found before any run.
    async fn try_insert_sql(&self) -> Result<()> {
        let Relays::Foreign(ForeignRelays {
            insert_sql: Some(sql),
            ..
        }) = &self.relays
        else {
            return Ok(());
        };
        let client = self.client().await?;
        client
            .prepare_typed(sql, &writer::INSERT_SQL_TYPES)
            .await
            .map_err(|e| self.user_sql_failed("--insert-sql does not prepare on your schema", e))?;
        Ok(())
    }

    pub(super) async fn open(
        server: &'s PgServer,
        design: &'static Design,
        workload: Workload,
        relays: Relays,
        bounds: Bounds,
        replication: Option<Replication>,
    ) -> Result<Lab<'s>> {
        let (pair, db, consumer_db) = match replication {
            None => {
                let db = server.create_database(design.name).await?;
                (None, db.clone(), db)
            }
            Some(replication) => {
                let pair = VirtualPrimary::start(&server.binaries()?, replication)
                    .await
                    .context("cannot start the primary and its standby")?;
                let db = pair
                    .create_database(&format!("outboxlab_{}", design.name))
                    .await?;
                let consumer_db = server
                    .create_database(&format!("{}_consumer", design.name))
                    .await?;
                (Some(pair), db, consumer_db)
            }
        };
        let client = db.connect_as(LAB_APPLICATION_NAME).await?;
        bound_session(&client, &bounds).await?;
        let [port] = ports::free_ports()?;
        Ok(Lab {
            design,
            relays,
            bounds,
            server,
            pair,
            db,
            consumer_db,
            client: tokio::sync::Mutex::new(client),
            port,
            workload,
        })
    }

    /// The lab's own connection, made again if the database restarted under it.
    pub async fn client(&self) -> Result<tokio::sync::MutexGuard<'_, Client>> {
        let mut client = self.client.lock().await;
        if client.is_closed() {
            *client = crate::connect::patiently(crate::connect::RECONNECT_PATIENCE, async || {
                self.db.connect_as(LAB_APPLICATION_NAME).await
            })
            .await?;
            bound_session(&client, &self.bounds).await?;
        }
        Ok(client)
    }

    /// Empties the tables (our relays), or makes the schema anew (the user's: their own
    /// tables, a stored position, start from nothing too).
    pub(super) async fn reset(&self) -> Result<()> {
        if self.pair.is_some() {
            // The consumer's tables apart, on the run's server, made anew.
            let consumer = self.consumer_db.connect().await?;
            consumer.batch_execute(schema::RECREATE).await?;
            schema::create(&consumer).await?;
            if let Relays::Ours = self.relays {
                consumer.batch_execute(schema::ADD_FENCING).await?;
            }
        }
        let client = self.client().await?;
        match &self.relays {
            Relays::Ours => {
                client.batch_execute(schema::RESET).await?;
                client.batch_execute(schema::RESET_RELAY_WATERMARK).await?;
                client.batch_execute(schema::RESET_FENCES).await?;
            }
            Relays::Foreign(foreign) => {
                client.batch_execute(schema::RECREATE).await?;
                schema::create(&client).await?;
                client.batch_execute(schema::NOTIFY_TRIGGER).await?;
                // Before the user's DDL, so that the check below finds the record's tables.
                client.batch_execute(record::RECORD_WRITES).await?;
                if let Some(ddl) = &foreign.schema {
                    client
                        .batch_execute(ddl)
                        .await
                        .map_err(|e| self.user_sql_failed("--schema does not apply", e))?;
                    if let Some(why) = record::broken_by_user_schema(&client).await {
                        return Err(error::Error::Usage(anyhow!(
                            "--schema breaks outbox-lab's tables ({why}): your DDL may add \
                             tables, columns, indexes and triggers, not drop or change the \
                             article's outbox, orders and consumer tables"
                        ))
                        .into());
                    }
                }
            }
        }
        Ok(())
    }

    /// The user's SQL failed: bad input, which says what and, when it was too slow, the bound.
    pub(super) fn user_sql_failed(&self, what: &str, e: tokio_postgres::Error) -> anyhow::Error {
        let too_slow = e.code() == Some(&SqlState::QUERY_CANCELED);
        let why = anyhow::Error::from(e);
        let bound = match too_slow {
            true => format!(
                " (every statement is bounded by {} here, a quarter of --time-limit)",
                format_duration(self.bounds.statement)
            ),
            false => String::new(),
        };
        error::Error::Usage(anyhow!("{what}: {why:#}{bound}")).into()
    }
}

/// Bounds the lab's own session: a reset waits [`RESET_LOCK_TIMEOUT`] at most for a killed
/// child's locks, and no statement runs longer than the bounds say.
async fn bound_session(client: &Client, bounds: &Bounds) -> Result<()> {
    let sql = format!(
        "SET lock_timeout = {}; SET statement_timeout = {}",
        RESET_LOCK_TIMEOUT.as_millis(),
        bounds.statement.as_millis()
    );
    Ok(client.batch_execute(&sql).await?)
}
