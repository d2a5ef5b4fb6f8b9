//! A run's life: its id, its server opened and closed around the work, and Ctrl-C or SIGTERM
//! ending it cleanly (`outbox-lab scenario` and `explore`; the signals also stop `relay` and
//! `consumer`).

use anyhow::Result;
use tokio::signal::unix::{signal, SignalKind};

use crate::error::{self, Error};
use crate::harness::db::{PgServer, ServerChoice};

/// A run's id: when it started (UTC) and which process ran it, e.g. `20261202-153635-38f9`.
pub fn new_run_id() -> String {
    format!(
        "{}-{:04x}",
        chrono::Utc::now().format("%Y%m%d-%H%M%S"),
        std::process::id() & 0xffff
    )
}

/// Opens the run's server, does `work` on it, and closes it (dropping what the run created),
/// also when Ctrl-C or SIGTERM ends the work. A server that cannot be closed is a harness
/// failure: it worked when the run began.
pub async fn on_server<T>(
    choice: &ServerChoice<'_>,
    run_id: &str,
    work: impl AsyncFnOnce(&PgServer) -> Result<T>,
) -> Result<T> {
    let server = tokio::select! {
        server = PgServer::open(choice, run_id) => server?,
        by = interrupted() => return Err(Error::Interrupted(by).into()),
    };
    let outcome = tokio::select! {
        outcome = work(&server) => outcome,
        by = interrupted() => Err(Error::Interrupted(by).into()),
    };
    let closed = server.close().await;
    let outcome = outcome?;
    closed.map_err(error::harness)?;
    Ok(outcome)
}

/// Resolves on Ctrl-C or SIGTERM, naming the signal.
pub async fn interrupted() -> &'static str {
    let mut term = match signal(SignalKind::terminate()) {
        Ok(term) => term,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => "SIGINT",
        _ = term.recv() => "SIGTERM",
    }
}
