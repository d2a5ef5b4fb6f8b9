//! Redis for the stream scenarios: `--redis-url`, or else a private `redis-server` on a Unix
//! socket in a [`throwaway`] directory (no TCP port: no other local user can reach it), started
//! on first use and stopped at the end.
//!
//! On a private server the streams carry the article's names (`outbox.event.orders`). On an
//! external one every key is prefixed with `outboxlab:<run>:` and those keys alone are deleted at
//! the end, so nothing of the user's is touched.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use nix::sys::signal::Signal;
use nix::unistd::User;
use tokio::sync::OnceCell;

use crate::connect;
use crate::harness::throwaway::{self, ProcessId, RunDir, ServerProcess};
use crate::harness::wait;

/// redis-server answers PING within milliseconds of starting; this bounds a wedged start.
const START_TIMEOUT: Duration = Duration::from_secs(15);
/// The server's log, in our part of the run directory.
const LOG: &str = "redis.log";

/// A private redis-server on a Unix socket in its run directory (no TCP port), run as the
/// unprivileged server user when we are root; dropping it stops it and removes its directory,
/// unless kept.
struct RedisServer {
    run: RunDir,
    process: Option<Child>,
    keep: bool,
}

impl RedisServer {
    async fn start(keep: bool) -> Result<RedisServer> {
        let binary = find_redis_server()?;
        throwaway::remove_orphans();
        let run_as = throwaway::server_user()?;
        let mut server = RedisServer {
            run: RunDir::create("redis", run_as.as_ref())?,
            process: None,
            keep: false,
        };
        // No retry: a private socket has no port to lose.
        server.launch(&binary, run_as.as_ref()).await?;
        server.keep = keep;
        server.write_marker()?;
        Ok(server)
    }

    fn socket(&self) -> PathBuf {
        self.run.server_dir().join("redis.sock")
    }

    async fn launch(&mut self, binary: &Path, run_as: Option<&User>) -> Result<()> {
        let log = self.run.create_file(LOG)?;
        let mut cmd = Command::new(binary);
        cmd.args(["--port", "0", "--unixsocketperm", "700"])
            .arg("--unixsocket")
            .arg(self.socket())
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            // An empty logfile is standard output: our log file, through the inherited descriptor.
            .args(["--logfile", ""])
            .arg("--dir")
            .arg(self.run.server_dir())
            .current_dir(self.run.server_dir())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            // Its own process group: a Ctrl-C at the terminal reaches us, and we stop it in order.
            .process_group(0);
        if let Some(user) = run_as {
            cmd.uid(user.uid.as_raw()).gid(user.gid.as_raw());
        }
        self.process = Some(
            cmd.spawn()
                .with_context(|| format!("cannot start {}", binary.display()))?,
        );
        self.write_marker()?;
        let limit = throwaway::start_timeout(START_TIMEOUT);
        let url = self.url();
        let answered = wait::up_to(limit, Duration::from_millis(10), async || {
            let process = self.process.as_mut().expect("just spawned");
            if let Some(status) = process.try_wait()? {
                self.process = None;
                let log = std::fs::read_to_string(self.run.path().join(LOG)).unwrap_or_default();
                bail!(
                    "redis-server exited during start ({status}): {}",
                    throwaway::last_line(&log)
                );
            }
            Ok(ping(&url).await.is_ok())
        })
        .await?;
        if answered.is_none() {
            if let Some(mut process) = self.process.take() {
                throwaway::kill_group(&mut process);
            }
            bail!(
                "redis-server did not answer PING within {limit:?} (set \
                 OUTBOX_LAB_START_TIMEOUT_S on a slow machine)"
            );
        }
        Ok(())
    }

    fn url(&self) -> String {
        format!("redis+unix://{}", self.socket().display())
    }

    fn write_marker(&self) -> Result<()> {
        let marker = throwaway::Marker {
            owner: ProcessId::own(),
            kept: self.keep,
            server: self
                .process
                .as_ref()
                .map(ServerProcess::spawned)
                .transpose()?,
        };
        self.run.write_marker(&marker)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if !self.keep {
            self.run.remove(self.process.take(), Signal::SIGTERM);
        }
    }
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
                "redis-server not found on PATH: run scripts/setup (apt-get install redis-server) \
                 or pass --redis-url"
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
        Ok(self
            .private
            .get_or_try_init(|| RedisServer::start(self.keep))
            .await?
            .url())
    }

    /// What every key of this run starts with.
    pub fn key_prefix(&self) -> &str {
        &self.key_prefix
    }

    /// Deletes this run's keys from an external server (the private one goes away whole).
    pub async fn close(self) -> Result<()> {
        let Some(url) = &self.external else {
            if let Some(server) = self.private.get() {
                if server.keep {
                    eprintln!(
                        "kept the private Redis server running in {}: redis-cli -s {}; remove it \
                         with `outbox-lab clean`",
                        server.run.path().display(),
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
            eprintln!("kept Redis keys {}*", self.key_prefix);
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
