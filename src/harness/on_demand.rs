//! A server a run uses on demand (Redis, NATS, RabbitMQ): the user's, named by a URL
//! (`--redis-url`, …), or else a private one of ours, started when a scenario first asks for it
//! and stopped at the end; the run prefix of every name on an external server; and the run's
//! end on it. What differs between the servers is theirs: how a private one starts, its URL and
//! where a kept one runs ([`PrivateServer`]), and how this run's names are deleted (the
//! wrappers in [`redis_server`](super::redis_server), [`nats_server`](super::nats_server) and
//! [`rabbitmq_server`](super::rabbitmq_server)).
//!
//! The harness is a guest on an external server: it touches only the names with this run's
//! prefix, and never stops the server.

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{anyhow, Result};
use tokio::sync::OnceCell;

use crate::error::Error;

/// A private server of ours: what [`OnDemand`] needs to know of it.
pub trait PrivateServer: Sized + Send + Sync {
    /// Its name in messages (`Redis`).
    const NAME: &'static str;
    /// What a run names on it, in messages (`keys`).
    const NAMES: &'static str;
    /// Between the words of the run prefix on an external server (`:`: `outboxlab:<run>:`).
    const SEPARATOR: char;
    /// What to do when its program is missing: install it, or name a server of one's own.
    const SETUP: &'static str;

    /// Starts one, left running after the run with `keep`. (Not required `Send`: the compiler
    /// cannot prove the async closures of a readiness check so (E0477), and no caller spawns it.)
    fn start(keep: bool) -> impl Future<Output = Result<Self>>;

    /// What the run and its children connect with, credentials included.
    fn url(&self) -> String;

    /// Where a kept one runs and how to reach it, said at the end of the run (after "kept the
    /// private "); None unless kept.
    fn kept(&mut self) -> Option<String>;
}

/// The server of a run: external, or private and started when a scenario first needs it.
pub struct OnDemand<S> {
    external: Option<String>,
    private: OnceCell<S>,
    keep: bool,
    /// Before every name of this run on an external server (`outboxlab:<run>:`); empty on the
    /// private one, whose names are the article's.
    prefix: String,
    /// Whether a scenario asked for the server at all (only then is there anything to delete).
    used: AtomicBool,
}

impl<S: PrivateServer> OnDemand<S> {
    pub fn new(external: Option<&str>, run_id: &str, keep: bool) -> OnDemand<S> {
        OnDemand {
            external: external.map(str::to_string),
            private: OnceCell::new(),
            keep,
            prefix: run_prefix(external, run_id, S::SEPARATOR),
            used: AtomicBool::new(false),
        }
    }

    /// The server's URL, starting the private server on first use.
    pub async fn url(&self) -> Result<String> {
        self.used.store(true, Ordering::Relaxed);
        match &self.external {
            Some(url) => Ok(url.clone()),
            None => Ok(self.private().await?.url()),
        }
    }

    /// The private server, started on first use (also with an external URL: a caller that
    /// would kill it refuses one first).
    pub async fn private(&self) -> Result<&S> {
        // Found only once a scenario asks: still the environment's fault, not the harness's.
        self.private
            .get_or_try_init(|| S::start(self.keep))
            .await
            .map_err(|e| Error::Usage(e).into())
    }

    /// What every name of this run starts with.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn is_external(&self) -> bool {
        self.external.is_some()
    }

    pub fn keep(&self) -> bool {
        self.keep
    }

    /// Ends the run on the server. The private one stops as it is dropped here (a kept one is
    /// said where it runs). On an external one, `delete` gets its URL and the prefix and
    /// deletes this run's names — unless the run never asked for the server or `made_names`
    /// (what the caller knows) says there are none, or `--keep` keeps them (they are named).
    pub async fn close<F, Fut>(self, made_names: bool, delete: F) -> Result<()>
    where
        F: FnOnce(String, String) -> Fut,
        Fut: Future<Output = Result<()>>,
    {
        let Some(url) = self.external else {
            if let Some(kept) = self.private.into_inner().as_mut().and_then(S::kept) {
                crate::errln!("kept the private {kept}; remove it with `outbox-lab clean`");
            }
            return Ok(());
        };
        if !self.used.into_inner() || !made_names {
            return Ok(());
        }
        if self.keep {
            crate::errln!("kept {} {} {}*", S::NAME, S::NAMES, self.prefix);
            return Ok(());
        }
        delete(url, self.prefix).await
    }
}

/// `outboxlab<sep><run><sep>` on an external server, else nothing.
pub fn run_prefix(external: Option<&str>, run_id: &str, separator: char) -> String {
    match external {
        Some(_) => format!("outboxlab{separator}{run_id}{separator}"),
        None => String::new(),
    }
}

/// The program `name` on PATH, or else in `dirs` (where its package puts it, which PATH may
/// lack); missing, an error that says what to do (`setup`).
pub fn find_program(name: &str, dirs: &[&str], setup: &str) -> Result<PathBuf> {
    let on_path: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain(dirs.iter().map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
        .ok_or_else(|| {
            anyhow!(
                "{name} not found on PATH or in {}: {setup}",
                dirs.join(", ")
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_on_an_external_server_carry_the_run_and_on_a_private_one_nothing() {
        assert_eq!(
            run_prefix(Some("redis://x"), "run1", ':'),
            "outboxlab:run1:"
        );
        assert_eq!(run_prefix(Some("nats://x"), "run1", '.'), "outboxlab.run1.");
        assert_eq!(run_prefix(None, "run1", '_'), "");
    }

    #[test]
    fn a_missing_program_says_where_it_was_looked_for_and_what_to_do() {
        let e = find_program(
            "outbox-lab-no-such-program",
            &["/nonexistent"],
            "install it",
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "outbox-lab-no-such-program not found on PATH or in /nonexistent: install it"
        );
    }
}
