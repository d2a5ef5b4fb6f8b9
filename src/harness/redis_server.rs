//! Redis for the stream scenarios: `--redis-url`, or else a private `redis-server` on a Unix
//! socket in a [`throwaway`] directory (no TCP port: no other local user can reach it), started
//! on first use and stopped at the end.
//!
//! On a private server the streams carry the article's names (`outbox.event.orders`). On an
//! external one every key is prefixed with `outboxlab:<run>:` and those keys alone are deleted at
//! the end, so nothing of the user's is touched.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{anyhow, Result};
use nix::sys::signal::Signal;
use tokio::sync::OnceCell;

use crate::connect;
use crate::error::Error;
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

impl RedisServer {
    async fn start(keep: bool) -> Result<RedisServer> {
        let binary = find_redis_server()?;
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

    fn socket(&self) -> PathBuf {
        socket_in(self.server.run_dir())
    }

    fn url(&self) -> String {
        url_of(&self.socket())
    }
}

fn socket_in(run: &RunDir) -> PathBuf {
    run.server_dir().join("redis.sock")
}

fn url_of(socket: &Path) -> String {
    format!("redis+unix://{}", socket.display())
}

fn find_redis_server() -> Result<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/local/bin")])
        .map(|dir| dir.join("redis-server"))
        .find(|path| path.is_file())
        .ok_or_else(|| {
            anyhow!(
                "redis-server not found on PATH: install it with scripts/setup (apt-get install \
                 redis-server); `scenario` can use a server of yours instead (--redis-url)"
            )
        })
}

async fn ping(url: &str) -> Result<()> {
    let mut con = connect::redis(url).await?;
    redis::cmd("PING").query_async::<String>(&mut con).await?;
    Ok(())
}

/// The Redis of a run: external, or private and started when a scenario first needs it.
pub struct Redis {
    external: Option<String>,
    private: OnceCell<RedisServer>,
    keep: bool,
    /// Prefix of every key on an external server; empty on the private one.
    key_prefix: String,
    /// Whether a scenario asked for Redis at all (only then is there anything to delete).
    used: AtomicBool,
}

impl Redis {
    pub fn new(external: Option<&str>, run_id: &str, keep: bool) -> Redis {
        Redis {
            external: external.map(str::to_string),
            private: OnceCell::new(),
            keep,
            key_prefix: match external {
                Some(_) => format!("outboxlab:{run_id}:"),
                None => String::new(),
            },
            used: AtomicBool::new(false),
        }
    }

    /// The server's URL, starting the private server on first use.
    pub async fn url(&self) -> Result<String> {
        self.used.store(true, Ordering::Relaxed);
        if let Some(url) = &self.external {
            return Ok(url.clone());
        }
        // Found only once a scenario asks: still the environment's fault, not the harness's.
        let server = self
            .private
            .get_or_try_init(|| RedisServer::start(self.keep))
            .await
            .map_err(|e| anyhow::Error::from(Error::Usage(e)))?;
        Ok(server.url())
    }

    /// What every key of this run starts with.
    pub fn key_prefix(&self) -> &str {
        &self.key_prefix
    }

    /// Deletes this run's keys from an external server (the private one goes away whole).
    pub async fn close(self) -> Result<()> {
        let Some(url) = &self.external else {
            if let Some(server) = self.private.get() {
                if server.server.is_kept() {
                    crate::errln!(
                        "kept the private Redis server running in {}: redis-cli -s {}; remove it \
                         with `outbox-lab clean`",
                        server.server.run_dir().path().display(),
                        server.socket().display()
                    );
                }
            }
            return Ok(());
        };
        if !self.used.load(Ordering::Relaxed) {
            return Ok(());
        }
        if self.keep {
            crate::errln!("kept Redis keys {}*", self.key_prefix);
            return Ok(());
        }
        let mut con = connect::redis(url).await?;
        let pattern = format!("{}*", self.key_prefix);
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
}
