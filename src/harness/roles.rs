//! The database roles of a lab whose relays are strangers' (`verify`, the zoo): the relay's role
//! has the least privilege a relay needs, the writer's what the application needs, and neither
//! is a superuser, creates roles or databases, replicates (unless asked), or may signal another
//! role's backend. The judge's records are in another database, which neither may connect to.
//!
//! What the relay's role may do in the application's database (`GRANTS`): connect, create
//! schemas and trusted extensions, and temporary tables; create in `public` (a library makes
//! its tables at start); select, update and delete the outbox's rows (not insert them), read its
//! sequence; LISTEN. Whatever it creates is its own (`--schema` runs as it too). Nothing of the
//! orders: only the writer writes them. The writer's role is a member of the relay's (it writes
//! into a library's tables through `--insert-sql`) and may insert the orders and the outbox's
//! rows; its search path is `public` alone, so that a schema a relay names after it shadows
//! nothing.
//!
//! Made on the throwaway cluster (and a failover's pair) always; on the user's server
//! (`--database-url`) where its role may create roles, with prefixed names and passwords of their
//! own, dropped with the run. Where it may not, the relay gets the URL's role, and the judge
//! keeps its records on a private cluster instead (see the lab).

use anyhow::{Context, Result};
use tokio_postgres::Client;

use crate::harness::db::{prefixed_name, Database};
use crate::harness::throwaway::random_secret;

/// Whether the session's role may create roles.
const MAY_CREATE_ROLES: &str =
    "SELECT rolsuper OR rolcreaterole FROM pg_catalog.pg_roles WHERE rolname = current_user";

/// The privileges of the relay's and the writer's roles on a fresh schema (`{relay}`,
/// `{writer}`: their quoted names): run again after every reset, which makes the schema anew.
const GRANTS: &str = "
GRANT USAGE, CREATE ON SCHEMA public TO {relay};
GRANT SELECT, UPDATE, DELETE ON public.outbox TO {relay};
GRANT USAGE, SELECT ON SEQUENCE public.outbox_id_seq TO {relay};
GRANT SELECT, INSERT, DELETE ON public.outbox, public.orders TO {writer};
GRANT USAGE ON SEQUENCE public.outbox_id_seq, public.orders_id_seq TO {writer};";

/// A role that logs in, as the actors are given it.
#[derive(Debug, Clone)]
pub struct RoleLogin {
    pub name: String,
    /// Where the server asks for one (the user's server); none on our own, reached by socket.
    password: Option<String>,
}

impl RoleLogin {
    /// `db` as this role reaches it.
    pub fn database(&self, db: &Database) -> Result<Database> {
        db.as_login(&self.name, self.password.as_deref())
    }
}

/// The relay's and the writer's roles in one application database.
#[derive(Debug, Clone)]
pub struct ActorRoles {
    pub relay: RoleLogin,
    pub writer: RoleLogin,
}

impl ActorRoles {
    /// Makes the roles for `db` (through `admin`, a session of the server's own role), with
    /// passwords where the server is the user's (`with_passwords`) and `comment` on them (the
    /// run they belong to); `None` when that role may not create roles, or the server does not
    /// let the new roles in (its pg_hba.conf).
    pub async fn create(
        admin: &Client,
        db: &Database,
        with_passwords: bool,
        comment: Option<&str>,
    ) -> Result<Option<ActorRoles>> {
        let may: Option<bool> = admin
            .query_opt(MAY_CREATE_ROLES, &[])
            .await?
            .map(|row| row.get(0));
        if may != Some(true) {
            return Ok(None);
        }
        let login = |suffix: &str| RoleLogin {
            name: prefixed_name(&db.name, suffix),
            password: with_passwords.then(random_secret),
        };
        let roles = ActorRoles {
            relay: login("_relay"),
            writer: login("_writer"),
        };
        let password = |role: &RoleLogin| match &role.password {
            Some(p) => format!(" PASSWORD {}", literal(p)),
            None => String::new(),
        };
        let (relay, writer) = (ident(&roles.relay.name), ident(&roles.writer.name));
        let plain = "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS";
        admin
            .batch_execute(&format!(
                "CREATE ROLE {relay} {plain}{};
                 CREATE ROLE {writer} {plain} IN ROLE {relay}{};
                 ALTER ROLE {writer} SET search_path = public;
                 REVOKE ALL ON DATABASE {db} FROM PUBLIC;
                 GRANT CONNECT, TEMPORARY, CREATE ON DATABASE {db} TO {relay};
                 GRANT {relay} TO CURRENT_USER;",
                password(&roles.relay),
                password(&roles.writer),
                db = ident(&db.name),
            ))
            .await
            .with_context(|| format!("cannot create the relay's role for {}", db.name))?;
        // The server's own role is a member of the relay's (not the other way round): it may
        // drop whatever a relay made, between runs.
        if let Some(comment) = comment {
            for role in [&relay, &writer] {
                let comment = literal(comment);
                admin
                    .batch_execute(&format!("COMMENT ON ROLE {role} IS {comment}"))
                    .await?;
            }
        }
        // The user's server may not let them in (its pg_hba.conf names its users).
        if with_passwords && roles.relay.database(db)?.connect().await.is_err() {
            roles.drop_from(admin).await?;
            return Ok(None);
        }
        Ok(Some(roles))
    }

    /// Gives the roles their privileges on the schema just made (every reset makes it anew).
    pub async fn grant(&self, client: &Client) -> Result<()> {
        let grants = GRANTS
            .replace("{relay}", &ident(&self.relay.name))
            .replace("{writer}", &ident(&self.writer.name));
        client
            .batch_execute(&grants)
            .await
            .context("cannot grant the relay's and the writer's privileges")
    }

    /// Both roles' names, the writer's first (it is a member of the relay's).
    pub fn names(&self) -> [&str; 2] {
        [&self.writer.name, &self.relay.name]
    }

    /// Drops both roles (once their database is gone, they own nothing).
    pub async fn drop_from(&self, admin: &Client) -> Result<()> {
        for name in self.names() {
            drop_role(admin, name).await?;
        }
        Ok(())
    }
}

/// Keeps every role but the server's own out of `db` (a database of the judge's).
pub async fn keep_out(admin: &Client, db: &Database) -> Result<()> {
    admin
        .batch_execute(&format!(
            "REVOKE ALL ON DATABASE {} FROM PUBLIC",
            ident(&db.name)
        ))
        .await
        .with_context(|| format!("cannot revoke CONNECT on {}", db.name))
}

/// Drops the role `name`, if it exists.
pub async fn drop_role(admin: &Client, name: &str) -> Result<()> {
    admin
        .batch_execute(&format!("DROP ROLE IF EXISTS {}", ident(name)))
        .await
        .with_context(|| format!("cannot drop the role {name}"))
}

/// `name` as a quoted identifier.
fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `text` as a quoted literal.
fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}
