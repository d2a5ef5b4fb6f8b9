//! The database links of a run's actors: a [`PgProxy`] link of its own for each relay and
//! the writer, through which the nemeses find an actor's sessions (whatever it names them) and
//! fault its link.

use anyhow::Result;
use nix::unistd::User;

use crate::explore::schedule::{DbNetFault, Nemesis, Role, Schedule};
use crate::harness::db::Database;
use crate::harness::link::postgres::{PgLink, PgProxy};

/// The database links of a run's actors, one per relay then the writer's: every one of them
/// reaches its database through a [`PgProxy`] of its own, so that a nemesis finds a relay's
/// sessions by the backends its link serves, whatever the relay names them, and can fault the
/// link itself.
pub struct DbLinks {
    proxy: PgProxy,
    relays: u32,
}

impl DbLinks {
    /// The links of `relays` relays and the writer to `db`, with the schedule's lost committing
    /// answers planned; `relay_user` (strangers' relays run as it) may connect to the relays'
    /// links, not the writer's. With `admitted` (the relays' role, the writer's), each link
    /// admits only its actor's role, to `db` alone.
    pub async fn start(
        db: &Database,
        relays: u32,
        schedule: &Schedule,
        relay_user: Option<&User>,
        admitted: Option<(&str, &str)>,
    ) -> Result<DbLinks> {
        let proxy = PgProxy::start(&db.config()?, relays as usize + 1, relay_user).await?;
        let links = DbLinks { proxy, relays };
        let writer = relays as usize;
        if relay_user.is_some() {
            links.proxy.ours_alone(writer)?;
        }
        if let Some((relay_role, writer_role)) = admitted {
            for i in 0..relays {
                links.relay(i).admit_only(relay_role, &db.name);
            }
            links.proxy.link(writer).admit_only(writer_role, &db.name);
        }
        for nemesis in &schedule.nemeses {
            if let Nemesis::DbNet {
                role,
                fault: DbNetFault::CommitLost { on_commit },
            } = *nemesis
            {
                links.of(role).lose_commit(on_commit);
            }
        }
        Ok(links)
    }

    /// Relay `index`'s link.
    pub fn relay(&self, index: u32) -> &PgLink {
        self.proxy.link(index as usize)
    }

    /// The link a nemesis on `role` strikes: relay 0's, or the writer's (the consumer's
    /// database is reached directly: it is the judge's side).
    pub fn of(&self, role: Role) -> &PgLink {
        match role {
            Role::Relay => self.relay(0),
            _ => self.proxy.link(self.relays as usize),
        }
    }

    /// `db` as `role`'s process `index` reaches it: through its link.
    pub fn database(&self, db: &Database, role: Role, index: u32) -> Result<Database> {
        let link = match role {
            Role::Relay => self.relay(index),
            _ => self.of(role),
        };
        link.database(db)
    }

    /// The relays' sessions open now.
    pub fn relay_sessions(&self) -> usize {
        (0..self.relays)
            .map(|i| self.relay(i).backends().len())
            .sum()
    }

    /// Whether a link has lost a committing answer yet (a fault the run's log hears of only at
    /// its end).
    pub fn lost_a_commit(&self) -> bool {
        let links = (0..self.relays).map(|i| self.relay(i));
        links
            .chain([self.of(Role::Writer)])
            .any(|link| link.commits_lost() > 0)
    }

    /// Whether a relay ever had a session.
    pub fn relay_connected(&self) -> bool {
        (0..self.relays).any(|i| self.relay(i).ever_connected())
    }
}
