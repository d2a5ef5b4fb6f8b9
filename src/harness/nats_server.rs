//! NATS JetStream for the broker scenarios: `--nats-url`, or else a private `nats-server -js`
//! in a [`throwaway`] directory, started on first use and stopped at the end.
//!
//! nats-server has no Unix socket: the private one listens on 127.0.0.1, on a port it picks
//! itself (`port: -1`, told back in its ports file), and requires a random token that only its
//! 0600 configuration file and our children's environment hold. Any local user can reach the
//! port; none gets in without the token.
//!
//! On a private server the subjects carry the article's names (`outbox.event.orders`). On an
//! external one every stream and consumer is named `outboxlab_<run>_…` and every subject starts
//! with `outboxlab.<run>.`; those streams alone (their consumers with them) are deleted at the
//! end, so nothing of the user's is touched.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use futures_util::TryStreamExt;
use nix::sys::signal::Signal;
use nix::unistd::User;
use tokio::sync::OnceCell;

use crate::connect;
use crate::error::Error;
use crate::harness::server::Server;
use crate::harness::throwaway::{self, RunDir};

/// nats-server with JetStream listens within a second of starting; this bounds a wedged start.
const START_TIMEOUT: Duration = Duration::from_secs(15);
/// The server's log, in our part of the run directory.
const LOG: &str = "nats.log";
/// Its configuration (the token in it), in our part of the run directory.
const CONFIG: &str = "nats.conf";
/// JetStream's store, in the server's part.
const STORE_DIR: &str = "jetstream";

/// A private nats-server with JetStream, on 127.0.0.1 behind a token, run as the unprivileged
/// server user when we are root; dropping it stops it and removes its directory, unless kept.
struct NatsServer {
    server: Server,
    /// `nats://TOKEN@127.0.0.1:PORT`: what the run and its children connect with.
    url: String,
}

impl NatsServer {
    async fn start(keep: bool) -> Result<NatsServer> {
        let binary = find_nats_server()?;
        let run_as = throwaway::server_user()?;
        let mut server =
            Server::prepare("nats", "nats-server", Signal::SIGTERM, LOG, run_as.as_ref())?;
        let token = throwaway::random_secret();
        let config = write_config(server.run_dir(), &token, run_as.as_ref())?;
        let mut cmd = Command::new(&binary);
        cmd.arg("-c").arg(&config);
        let ports_dir = server.run_dir().server_dir();
        let mut url = None;
        let every = Duration::from_millis(10);
        let found = &mut url;
        let ready = async || {
            // The ports file appears once the server listens; then JetStream must answer.
            let Some(port) = listening_port(&ports_dir) else {
                return Ok(false);
            };
            let candidate = format!("nats://{token}@127.0.0.1:{port}");
            let answered = jetstream_answers(&candidate).await.is_ok();
            if answered {
                *found = Some(candidate);
            }
            Ok(answered)
        };
        server
            .start(cmd, run_as.as_ref(), START_TIMEOUT, every, ready)
            .await?;
        server.set_kept(keep)?;
        let url = url.context("nats-server was ready without a port")?;
        Ok(NatsServer { server, url })
    }
}

/// The server's configuration, a new 0600 file in our part of the run directory (owned by the
/// server user when it runs as one, so that it alone can read the token): 127.0.0.1 only, a
/// port of its choosing told in a ports file, the token required, JetStream stored in its own
/// directory.
fn write_config(run: &RunDir, token: &str, user: Option<&User>) -> Result<PathBuf> {
    let server_dir = run.server_dir();
    let text = format!(
        "host: \"127.0.0.1\"\n\
         port: -1\n\
         ports_file_dir: \"{ports}\"\n\
         authorization {{\n  token: \"{token}\"\n}}\n\
         jetstream {{\n  store_dir: \"{store}\"\n  max_memory_store: 64MB\n  max_file_store: 1GB\n}}\n",
        ports = server_dir.display(),
        store = server_dir.join(STORE_DIR).display(),
    );
    let path = run.path().join(CONFIG);
    let mut file = throwaway::create_new(&path)?;
    file.write_all(text.as_bytes())?;
    if let Some(user) = user {
        // Through the descriptor: the file we just created, whatever the path names now.
        nix::unistd::fchown(file.as_raw_fd(), Some(user.uid), Some(user.gid))
            .with_context(|| format!("cannot hand {} to the server user", path.display()))?;
    }
    Ok(path)
}

/// The client port from the server's ports file (`nats-server_<pid>.ports`), once written.
fn listening_port(dir: &Path) -> Option<u16> {
    let entries = std::fs::read_dir(dir).ok()?;
    let ports_file = entries
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "ports"))?;
    let ports: serde_json::Value =
        serde_json::from_str(&throwaway::read_no_follow(&ports_file)).ok()?;
    let client = ports["nats"].as_array()?.first()?.as_str()?;
    client.rsplit(':').next()?.parse().ok()
}

fn find_nats_server() -> Result<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
        .map(|dir| dir.join("nats-server"))
        .find(|path| path.is_file())
        .ok_or_else(|| {
            anyhow!(
                "nats-server not found on PATH or in /usr/sbin: run scripts/setup \
                 (apt-get install nats-server) or pass --nats-url"
            )
        })
}

/// Connects with the token: the server is up, lets us in, and says JetStream is on (it
/// listens only once JetStream has started).
async fn jetstream_answers(url: &str) -> Result<()> {
    let client = connect::nats(url).await?;
    if !client.server_info().jetstream {
        bail!("nats-server runs without JetStream");
    }
    Ok(())
}

/// The NATS of a run: external, or private and started when a scenario first needs it.
pub struct Nats {
    external: Option<String>,
    private: OnceCell<NatsServer>,
    keep: bool,
    /// Before every stream and consumer name on an external server (`outboxlab_<run>_`);
    /// empty on the private one.
    name_prefix: String,
    /// Before every subject on an external server (`outboxlab.<run>.`); empty on the private
    /// one.
    subject_prefix: String,
    /// Whether a scenario asked for NATS at all (only then is there anything to delete).
    used: AtomicBool,
}

impl Nats {
    pub fn new(external: Option<&str>, run_id: &str, keep: bool) -> Nats {
        let (name_prefix, subject_prefix) = match external {
            Some(_) => (
                format!("outboxlab_{run_id}_"),
                format!("outboxlab.{run_id}."),
            ),
            None => (String::new(), String::new()),
        };
        Nats {
            external: external.map(str::to_string),
            private: OnceCell::new(),
            keep,
            name_prefix,
            subject_prefix,
            used: AtomicBool::new(false),
        }
    }

    /// The server's URL (the private one's carries its token), starting the private server on
    /// first use.
    pub async fn url(&self) -> Result<String> {
        self.used.store(true, Ordering::Relaxed);
        if let Some(url) = &self.external {
            return Ok(url.clone());
        }
        // Found only once a scenario asks: still the environment's fault, not the harness's.
        let server = self
            .private
            .get_or_try_init(|| NatsServer::start(self.keep))
            .await
            .map_err(|e| anyhow::Error::from(Error::Usage(e)))?;
        Ok(server.url.clone())
    }

    /// What every stream and consumer name of this run starts with.
    pub fn name_prefix(&self) -> &str {
        &self.name_prefix
    }

    /// What every subject of this run starts with.
    pub fn subject_prefix(&self) -> &str {
        &self.subject_prefix
    }

    /// Deletes this run's streams (and so their consumers) from an external server; the
    /// private one goes away whole.
    pub async fn close(self) -> Result<()> {
        let Some(url) = &self.external else {
            if let Some(server) = self.private.get() {
                if server.server.is_kept() {
                    let dir = server.server.run_dir().path();
                    eprintln!(
                        "kept the private NATS server running in {}: {}, its token in {}; remove \
                         it with `outbox-lab clean`",
                        dir.display(),
                        connect::without_credentials(&server.url),
                        dir.join(CONFIG).display()
                    );
                }
            }
            return Ok(());
        };
        if !self.used.load(Ordering::Relaxed) {
            return Ok(());
        }
        if self.keep {
            eprintln!("kept NATS streams {}*", self.name_prefix);
            return Ok(());
        }
        let jetstream = async_nats::jetstream::new(connect::nats(url).await?);
        let names: Vec<String> = jetstream
            .stream_names()
            .try_collect()
            .await
            .map_err(|e| anyhow!("cannot list the NATS streams: {e}"))?;
        for name in names.iter().filter(|n| n.starts_with(&self.name_prefix)) {
            jetstream
                .delete_stream(name)
                .await
                .map_err(|e| anyhow!("cannot delete NATS stream {name}: {e}"))?;
        }
        Ok(())
    }
}
