//! The checker: judges a run by the database it left behind, after recovery, with the one
//! definition of every invariant ([`crate::judge::invariants`]); each violation names the
//! offending ids, so a verdict says what broke and not only how often. It reads the final
//! state, never a process's own account of what it did: an attempt whose outcome is unknown
//! (`info` in the history) counts as delivered if, and only if, its effect is in the database.

use anyhow::Result;
use tokio_postgres::Client;

use crate::judge::invariants::{self, Moment};

pub use crate::judge::invariants::Violations;

/// Judges a drained run: every database invariant, and `stuck`, the supervisor's liveness
/// verdict.
pub async fn check(client: &Client, stuck: Option<&str>) -> Result<Violations> {
    invariants::judge(client, Moment::AfterRecovery, stuck).await
}

/// Judges a database the relays may still be working on (`outbox-lab check`): rows still owed
/// are pending, not lost, and liveness is not judged.
pub async fn check_live(client: &Client) -> Result<Violations> {
    invariants::judge(client, Moment::Live, None).await
}
