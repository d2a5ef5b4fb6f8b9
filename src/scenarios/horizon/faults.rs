//! horizon's faults, made for real: a slow commit, a session idle in transaction, a rollback and
//! a prepared transaction, each a session of its own on a design's database; and the server's
//! crash. Beside each, a session that goes on committing one event after another: the rows a
//! relay may deliver late, or never.

use std::time::Duration;

use anyhow::Result;
use serde_json::json;
use tokio::time::Instant;

use crate::harness::db::Database;
use crate::judge::counts;
use crate::outbox::writer::{event_type, insert_order_with_events, EventsTo, INSERT_OUTBOX};

/// What a relay must wait for, or must not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Takes its outbox ids (inserts an order and its events), commits `hold_ms` later.
    SlowCommit,
    /// A snapshot and a transaction id, nothing written, idle in transaction for `hold_ms`.
    Idle,
    /// Inserts an order and its events, and rolls back: ids that never commit.
    Rollback,
    /// Inserts an order and its events, `PREPARE TRANSACTION`, `COMMIT PREPARED` `hold_ms` later.
    Prepared,
    /// PostgreSQL crashes (`-m immediate`) and restarts: the outbox's sequence resumes past the
    /// values it had logged ahead, ids that never commit.
    CrashSeqJump,
}

impl Fault {
    pub const ALL: [Fault; 5] = [
        Fault::SlowCommit,
        Fault::Idle,
        Fault::Rollback,
        Fault::Prepared,
        Fault::CrashSeqJump,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fault::SlowCommit => "slow_commit",
            Fault::Idle => "idle",
            Fault::Rollback => "rollback",
            Fault::Prepared => "prepared",
            Fault::CrashSeqJump => "crash_seq_jump",
        }
    }

    /// How long its transaction stays open, `hold` for those that hold one.
    pub fn held(self, hold: Duration) -> Duration {
        match self {
            Fault::SlowCommit | Fault::Idle | Fault::Prepared => hold,
            Fault::Rollback | Fault::CrashSeqJump => Duration::ZERO,
        }
    }
}

/// The idle session's transaction: a snapshot of its own (repeatable read) and a transaction id,
/// as a long report or a forgotten session holds them; nothing written.
const IDLE_IN_TRANSACTION: &str =
    "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT pg_current_xact_id();";

/// Whether the server allows prepared transactions (PostgreSQL allows none by default).
pub const MAX_PREPARED_TRANSACTIONS: &str =
    "SELECT current_setting('max_prepared_transactions')::int";

/// The outbox's largest id (0 when empty): where the sequence stood before the crash.
pub const LAST_ID: &str = "SELECT COALESCE(max(id), 0) FROM outbox";

/// The first id above $1: where the sequence resumed after the crash.
pub const FIRST_ID_AFTER: &str = "SELECT min(id) FROM outbox WHERE id > $1";

/// The aggregate of the rows committed beside the fault.
pub const BESIDE: &str = "beside";

/// The fault's order: a customer of its own, apart from the rows beside.
const FAULT_CUSTOMER: i64 = 1;

/// One design's share of a session fault, on a session of its own, from `at`. Returns when it
/// began, on the server's clock (µs since the epoch), read on its session just before it takes
/// its ids: a row committed after one of them began later; and when its transaction ended. Run to
/// its end whatever happens beside it: a prepared transaction left behind would hold the
/// server's horizon until someone ends it.
pub async fn strike(
    fault: Fault,
    db: &Database,
    at: Instant,
    hold: Duration,
    events: u32,
) -> Result<(i64, Instant)> {
    let session = db.connect().await?;
    tokio::time::sleep_until(at).await;
    let began = counts::count(&session, counts::SERVER_CLOCK_US).await?;
    let take_ids = async {
        session.batch_execute("BEGIN").await?;
        insert_order_with_events(&session, FAULT_CUSTOMER, events, &EventsTo::Outbox).await
    };
    match fault {
        Fault::SlowCommit => {
            take_ids.await?;
            tokio::time::sleep(hold).await;
            session.batch_execute("COMMIT").await?;
        }
        Fault::Idle => {
            session.batch_execute(IDLE_IN_TRANSACTION).await?;
            tokio::time::sleep(hold).await;
            session.batch_execute("COMMIT").await?;
        }
        Fault::Rollback => {
            take_ids.await?;
            session.batch_execute("ROLLBACK").await?;
        }
        Fault::Prepared => {
            take_ids.await?;
            // Named after the database: unique on the server, and ours by its prefix.
            let gid = &db.name;
            session
                .batch_execute(&format!("PREPARE TRANSACTION '{gid}'"))
                .await?;
            tokio::time::sleep(hold).await;
            session
                .batch_execute(&format!("COMMIT PREPARED '{gid}'"))
                .await?;
        }
        Fault::CrashSeqJump => unreachable!("the crash is the server's, struck once by the round"),
    }
    Ok((began, Instant::now()))
}

/// The session beside the fault: an event committed every `every` from `from` until `until`,
/// each INSERT in autocommit, so that its `created_at` is its commit (within a millisecond).
pub async fn write_beside(
    db: &Database,
    from: Instant,
    until: Instant,
    every: Duration,
) -> Result<()> {
    let session = db.connect().await?;
    let payload = json!({ "beside": "the fault" });
    let mut next = from;
    while next < until {
        tokio::time::sleep_until(next).await;
        session
            .execute(INSERT_OUTBOX, &[&BESIDE, &event_type(1), &payload])
            .await?;
        next += every;
    }
    Ok(())
}
