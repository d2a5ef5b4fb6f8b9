//! Redis for the stream scenarios: `--redis-url`, or else a private `redis-server` on a free
//! 127.0.0.1 port in a [`throwaway`] directory, started on first use and stopped at the end.
//!
//! On a private server the streams carry the article's names (`outbox.event.orders`). On an
//! external one every key is prefixed with `outboxlab:<run>:` and those keys alone are deleted at
//! the end, so nothing of the user's is touched.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::sync::OnceCell;

use crate::throwaway;

/// redis-server answers PING within milliseconds of starting; this bounds a wedged start.
const START_TIMEOUT: Duration = Duration::from_secs(15);

/// A private redis-server; dropping it stops it and removes its directory, unless kept.
struct RedisServer {
    dir: PathBuf,
    port: u16,
    process: Option<Child>,
    keep: bool,
}

impl RedisServer {
    async fn start(keep: bool) -> Result<RedisServer> {
        let binary = find_redis_server()?;
        throwaway::remove_orphans();
        let mut server = RedisServer {
            dir: throwaway::create_dir("redis")?,
            port: 0,
            process: None,
            keep: false,
        };
        let mut last_error = None;
        // Another process may take the port between our probe and redis' bind: retry.
        for _ in 0..5 {
            match server.launch(&binary).await {
                Ok(()) => {
                    server.keep = keep;
                    server.write_marker()?;
                    return Ok(server);
                }
                Err(e) => last_error = Some(e),
            }
        }
        Err(last_error.expect("at least one attempt"))
    }

    async fn launch(&mut self, binary: &std::path::Path) -> Result<()> {
        self.port = throwaway::free_port()?;
        let mut cmd = Command::new(binary);
        cmd.args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(self.dir.join("redis.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Its own process group: a Ctrl-C at the terminal reaches us, and we stop it in order.
            .process_group(0);
        self.process = Some(
            cmd.spawn()
                .with_context(|| format!("cannot start {}", binary.display()))?,
        );
        self.write_marker()?;
        let started = Instant::now();
        loop {
            let process = self.process.as_mut().expect("just spawned");
            if let Some(status) = process.try_wait()? {
                self.process = None;
                let log = std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
                bail!(
                    "redis-server exited during start ({status}): {}",
                    throwaway::last_line(&log)
                );
            }
            if ping(&self.url()).await.is_ok() {
                return Ok(());
            }
            if started.elapsed() > START_TIMEOUT {
                bail!("redis-server did not answer PING within {START_TIMEOUT:?}");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn write_marker(&self) -> Result<()> {
        let marker = throwaway::Marker {
            owner_pid: std::process::id() as i32,
            kept: self.keep,
            server_pid: self.process.as_ref().map(|c| c.id() as i32),
            port: self.port,
        };
        throwaway::write_marker(&self.dir, &marker)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        if let Some(mut process) = self.process.take() {
            throwaway::stop(Pid::from_raw(process.id() as i32), Signal::SIGTERM);
            let _ = process.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
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
    let mut con = connect(url).await?;
    redis::cmd("PING").query_async::<String>(&mut con).await?;
    Ok(())
}

/// A connection, with a bound on the wait and a message that says where.
pub async fn connect(url: &str) -> Result<redis::aio::MultiplexedConnection> {
    let client =
        redis::Client::open(url).map_err(|e| anyhow!("invalid --redis-url '{url}': {e}"))?;
    tokio::time::timeout(
        Duration::from_secs(5),
        client.get_multiplexed_async_connection(),
    )
    .await
    .map_err(|_| anyhow!("no answer within 5 s"))
    .and_then(|r| r.map_err(anyhow::Error::from))
    .with_context(|| format!("cannot connect to Redis at {url} (is it running? check --redis-url)"))
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
            return Ok(());
        };
        if !self.used.load(Ordering::Relaxed) {
            return Ok(());
        }
        if self.keep {
            eprintln!("kept Redis keys {}*", self.key_prefix);
            return Ok(());
        }
        let mut con = connect(url).await?;
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
