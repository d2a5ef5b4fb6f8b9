//! The design's database: made once per design (the article's schema, and what our designs or
//! the user's `--schema` add), reset before every run, and the lab's own bounded session to it.

use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

use super::{Bounds, ForeignRelays, Lab, Relays, Workload, EXPLORE_BOUNDS};
use crate::error;
use crate::explore::designs::Design;
use crate::explore::nemeses;
use crate::explore::schedule::Role;
use crate::harness::db::{Database, PgServer};
use crate::harness::nemesis::format_duration;
use crate::harness::ports;
use crate::harness::replicated::{Replication, VirtualPrimary};
use crate::harness::roles::{self, ActorRoles};
use crate::harness::run_as::RunAs;
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
        let client = self.session_as(Role::Relay).await?;
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
        let client = self.session_as(Role::Writer).await?;
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
        let strangers = matches!(relays, Relays::Foreign(_));
        let (pair, db) = match replication {
            None => (None, server.create_database(design.name).await?),
            Some(replication) => {
                let pair = VirtualPrimary::start(&server.binaries()?, replication)
                    .await
                    .context("cannot start the primary and its standby")?;
                let db = pair
                    .create_database(&format!("outboxlab_{}", design.name))
                    .await?;
                (Some(pair), db)
            }
        };
        let client = db.connect_as(LAB_APPLICATION_NAME).await?;
        bound_session(&client, &bounds).await?;
        // Strangers' relays get roles of least privilege, where the server lets us make them
        // (on the user's server, with passwords of their own).
        let roles = match (strangers, &pair) {
            (false, _) => None,
            (true, None) => server.create_actor_roles(&db).await?,
            (true, Some(_)) => ActorRoles::create(&client, &db, false, None).await?,
        };
        // The consumer's database is apart where the application's is on the pair, or the
        // relays are strangers' (the judge keeps its record there too, and no relay may
        // connect to it): on the run's server, or on a private cluster where the relays have
        // the user's server's own role (no roles could be made), which could reach it there.
        let label = format!("{}_consumer", design.name);
        let (judge_server, consumer_db) = if !strangers && pair.is_none() {
            (None, db.clone())
        } else if strangers && pair.is_none() && roles.is_none() {
            let private = server.private_cluster(false).await?;
            let consumer_db = private.create_database(&label).await?;
            (Some(private), consumer_db)
        } else {
            (None, server.create_database(&label).await?)
        };
        if strangers {
            roles::keep_out(&consumer_db.connect().await?, &consumer_db).await?;
        }
        let identity = match &relays {
            Relays::Foreign(foreign) => foreign.template.run_as.as_ref().map(RunAs::claim),
            Relays::Ours => None,
        };
        let [port] = ports::free_ports()?;
        Ok(Lab {
            design,
            relays,
            bounds,
            server,
            pair,
            db,
            consumer_db,
            roles,
            _judge_server: judge_server,
            identity: identity.transpose()?,
            client: tokio::sync::Mutex::new(client),
            port,
            workload,
        })
    }

    /// `db` as `role`'s processes reach it (before their link): strangers' relays and the
    /// writer as their roles, where they have them; else as the server's own role.
    pub(super) fn database_of(&self, role: Role) -> Result<Database> {
        let login = match (&self.roles, role) {
            (Some(roles), Role::Relay) => &roles.relay,
            (Some(roles), Role::Writer) => &roles.writer,
            _ => return Ok(self.db.clone()),
        };
        login.database(&self.db)
    }

    /// Who the links admit, for strangers' relays: the relays' role and the writer's (the
    /// server's own role where no roles could be made); `None` for ours.
    pub(super) fn admitted(&self) -> Result<Option<(String, String)>> {
        if let Relays::Ours = self.relays {
            return Ok(None);
        }
        let user = |role: Role| -> Result<String> {
            let config = self.database_of(role)?.config()?;
            Ok(config.get_user().unwrap_or("postgres").to_string())
        };
        Ok(Some((user(Role::Relay)?, user(Role::Writer)?)))
    }

    /// A session of the lab's as `role` reaches the database (not through its link): for the
    /// user's SQL (`--schema` as the relays, `--pending-sql` as the relays, `--insert-sql` as
    /// the writer), which may call what a relay made, and must do so with its rights alone.
    pub(super) async fn session_as(&self, role: Role) -> Result<Client> {
        let client = self
            .database_of(role)?
            .connect_as(LAB_APPLICATION_NAME)
            .await?;
        bound_session(&client, &self.bounds).await?;
        Ok(client)
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
    /// tables, a stored position, start from nothing too); for strangers' relays, the
    /// consumer's and the judge's tables too, in their database apart.
    pub(super) async fn reset(&self) -> Result<()> {
        let client = self.client().await?;
        // A run cut short while a txn:prepared nemesis held its transaction left it prepared.
        nemeses::end_prepared(&client).await?;
        match &self.relays {
            Relays::Ours => {
                if self.pair.is_some() {
                    // The consumer's tables apart, on the run's server, made anew.
                    let consumer = self.consumer_db.connect().await?;
                    consumer.batch_execute(schema::RECREATE).await?;
                    schema::create(&consumer).await?;
                    consumer.batch_execute(schema::ADD_FENCING).await?;
                }
                client.batch_execute(schema::RESET).await?;
                client.batch_execute(schema::RESET_RELAY_WATERMARK).await?;
                client.batch_execute(schema::RESET_FENCES).await?;
            }
            Relays::Foreign(foreign) => {
                let consumer = self.consumer_db.connect().await?;
                consumer.batch_execute(schema::RECREATE).await?;
                consumer.batch_execute(schema::CREATE_CONSUMER).await?;
                consumer.batch_execute(record::JUDGE_TABLES).await?;
                client.batch_execute(schema::RECREATE).await?;
                client
                    .batch_execute(schema::CREATE_OUTBOX)
                    .await
                    .context("cannot create the outbox tables")?;
                client.batch_execute(schema::NOTIFY_TRIGGER).await?;
                if let Some(roles) = &self.roles {
                    roles.grant(&client).await?;
                }
                if let Some(ddl) = &foreign.schema {
                    // As the relays' role: what it makes is theirs, as a library's tables are.
                    self.session_as(Role::Relay)
                        .await?
                        .batch_execute(ddl)
                        .await
                        .map_err(|e| self.user_sql_failed("--schema does not apply", e))?;
                    if let Some(why) = record::broken_by_user_schema(&client).await {
                        return Err(error::Error::Usage(anyhow!(
                            "--schema breaks outbox-lab's tables ({why}): your DDL may add \
                             tables, indexes and triggers of its own, not drop or change the \
                             article's outbox and orders"
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
