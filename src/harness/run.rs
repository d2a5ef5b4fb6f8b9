//! A run's life: its id, its server opened and closed around the work, and Ctrl-C or SIGTERM
//! ending it cleanly (`outbox-lab scenario` and `explore`; the signals also stop `relay` and
//! `consumer`).

use anyhow::{Context, Result};
use tokio::signal::unix::{signal, Signal, SignalKind};

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
    // Watched before anything is created: from here on an interrupt is one we clean up after
    // (before, one that came as the cluster's directory was made killed us outright).
    let mut interrupts = Interrupts::watch()
        .context("cannot watch for Ctrl-C and SIGTERM")
        .map_err(error::harness)?;
    let server = tokio::select! {
        server = PgServer::open(choice, run_id) => server?,
        by = interrupts.next() => return Err(Error::Interrupted(by).into()),
    };
    let outcome = tokio::select! {
        outcome = work(&server) => outcome,
        by = interrupts.next() => Err(Error::Interrupted(by).into()),
    };
    let closed = server.close().await;
    let outcome = outcome?;
    closed.map_err(error::harness)?;
    Ok(outcome)
}

/// Ctrl-C and SIGTERM, watched from the moment this is made.
struct Interrupts {
    int: Signal,
    term: Signal,
}

impl Interrupts {
    fn watch() -> std::io::Result<Interrupts> {
        Ok(Interrupts {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
        })
    }

    /// The next one, by name (cancel-safe).
    async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.int.recv() => "SIGINT",
            _ = self.term.recv() => "SIGTERM",
        }
    }
}

/// Resolves on Ctrl-C or SIGTERM, naming the signal.
pub async fn interrupted() -> &'static str {
    match Interrupts::watch() {
        Ok(mut interrupts) => interrupts.next().await,
        Err(_) => std::future::pending().await,
    }
}
