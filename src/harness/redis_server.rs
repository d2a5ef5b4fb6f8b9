//! Redis for the stream scenarios: `--redis-url`, or else a private `redis-server` on a Unix
//! socket in a [`throwaway`] directory (no TCP port: no other local user can reach it), started
//! on first use and stopped at the end ([`OnDemand`]); here what is Redis' own: starting it,
//! and deleting this run's keys from an external server.
//!
//! On a private server the streams carry the article's names (`outbox.event.orders`). On an
//! external one every key is prefixed with `outboxlab:<run>:` and those keys alone are deleted at
//! the end, so nothing of the user's is touched.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::Result;
use nix::sys::signal::Signal;

use crate::connect;
use crate::harness::on_demand::{find_program, OnDemand, PrivateServer};
use crate::harness::server::Server;
use crate::harness::throwaway::{self, RunDir};

/// redis-server answers PING within milliseconds of starting; this bounds a wedged start.
const START_TIMEOUT: Duration = Duration::from_secs(15);
/// The server's log, in our part of the run directory.
const LOG: &str = "redis.log";

/// A private redis-server on a Unix socket in its run directory (no TCP port), run as the
/// unprivileged server user when we are root; dropping it stops it and removes its directory,
/// unless kept.
struct RedisServer {
    server: Server,
}

impl PrivateServer for RedisServer {
    const NAME: &'static str = "Redis";
    const NAMES: &'static str = "keys";
    const SEPARATOR: char = ':';
    const SETUP: &'static str = "install it with scripts/setup (apt-get install redis-server); \
                                 `scenario` can use a server of yours instead (--redis-url)";

    async fn start(keep: bool) -> Result<RedisServer> {
        let binary = find_program("redis-server", &["/usr/bin", "/usr/local/bin"], Self::SETUP)?;
        let run_as = throwaway::server_user()?;
        let mut server = Server::prepare(
            "redis",
            "redis-server",
            Signal::SIGTERM,
            LOG,
            run_as.as_ref(),
        )?;
        let socket = socket_in(server.run_dir());
        let mut cmd = Command::new(&binary);
        cmd.args(["--port", "0", "--unixsocketperm", "700"])
            .arg("--unixsocket")
            .arg(&socket)
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            // An empty logfile is standard output: our log file, through the inherited descriptor.
            .args(["--logfile", ""])
            .arg("--dir")
            .arg(server.run_dir().server_dir());
        let url = url_of(&socket);
        let every = Duration::from_millis(10);
        let ready = async || Ok(ping(&url).await.is_ok());
        server
            .start(cmd, run_as.as_ref(), START_TIMEOUT, every, ready)
            .await?;
        server.set_kept(keep)?;
        Ok(RedisServer { server })
    }

    fn url(&self) -> String {
        url_of(&self.socket())
    }

    fn kept(&mut self) -> Option<String> {
        self.server.is_kept().then(|| {
            format!(
                "Redis server running in {}: redis-cli -s {}",
                self.server.run_dir().path().display(),
                self.socket().display()
            )
        })
    }
}

impl RedisServer {
    fn socket(&self) -> PathBuf {
        socket_in(self.server.run_dir())
    }
}

fn socket_in(run: &RunDir) -> PathBuf {
    run.server_dir().join("redis.sock")
}

fn url_of(socket: &Path) -> String {
    format!("redis+unix://{}", socket.display())
}

async fn ping(url: &str) -> Result<()> {
    let mut con = connect::redis(url).await?;
    redis::cmd("PING").query_async::<String>(&mut con).await?;
    Ok(())
}

/// The Redis of a run (see [`OnDemand`]).
pub struct Redis(OnDemand<RedisServer>);

impl Redis {
    pub fn new(external: Option<&str>, run_id: &str, keep: bool) -> Redis {
        Redis(OnDemand::new(external, run_id, keep))
    }

    /// The server's URL, starting the private server on first use.
    pub async fn url(&self) -> Result<String> {
        self.0.url().await
    }

    /// What every key of this run starts with.
    pub fn key_prefix(&self) -> &str {
        self.0.prefix()
    }

    /// Deletes this run's keys from an external server (the private one goes away whole).
    pub async fn close(self) -> Result<()> {
        self.0.close(true, delete_keys).await
    }
}

/// Deletes the keys that start with `prefix` from the server at `url`.
async fn delete_keys(url: String, prefix: String) -> Result<()> {
    let mut con = connect::redis(&url).await?;
    let pattern = format!("{prefix}*");
    let mut keys: Vec<String> = Vec::new();
    let mut cursor = 0u64;
    // SCAN, not KEYS: an external server may be large and busy.
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut con)
            .await?;
        keys.extend(batch);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    if !keys.is_empty() {
        redis::cmd("DEL")
            .arg(&keys)
            .query_async::<i64>(&mut con)
            .await?;
    }
    Ok(())
}
