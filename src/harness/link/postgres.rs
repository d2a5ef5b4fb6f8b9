//! A proxy on the PostgreSQL wire between each actor (a relay, the writer) and its database,
//! so that the harness sees the system through its connections, not through the names the
//! actors choose: which server backend serves which actor is read from the BackendKeyData
//! message of each connection (the backend's pid), whatever `application_name` the actor sets.
//! It does to the link what real networks do: cuts its connections (`dbnet:reset`), black-holes
//! it for a while (`dbnet:partition`), and loses a COMMIT's answer after the server committed
//! (`dbnet:commit-lost`: Jepsen's indeterminate operation, the client cannot know).
//!
//! Each actor has a way in of its own: a Unix socket in a private directory (0700, ours) when
//! the server listens on one, else a loopback TCP port. Authentication passes through
//! untouched (SCRAM included: the proxy reads no password); an SSLRequest or GSSENCRequest is
//! answered 'N', so the actor talks in the clear to the proxy, which talks in the clear to the
//! server (a server that demands TLS cannot be reached through it). After the startup message
//! the server's side is read as the protocol's typed messages, to find BackendKeyData and the
//! CommandComplete `COMMIT`; the actor's side is passed on as it comes.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::unistd::User;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_postgres::config::Host;
use tokio_postgres::Config;
use tokio_util::either::Either;

use crate::harness::db::Database;
use crate::harness::run_as;
use crate::harness::throwaway::RunDir;

/// The startup phase's special requests (their "protocol version" field).
const SSL_REQUEST: i32 = 80_877_103;
const GSSENC_REQUEST: i32 = 80_877_104;
const CANCEL_REQUEST: i32 = 80_877_102;
/// A startup packet longer than this is not PostgreSQL's (libpq's own limit is 10 000).
const MAX_STARTUP_LEN: usize = 10_000;
/// The socket's name carries a port number; the directory being private, any will do.
const SOCKET_PORT_BASE: u16 = 6000;
/// A partition is healed after this long at most, whatever was asked.
const MAX_PARTITION: Duration = Duration::from_secs(60);

/// Both ends of a link are a Unix socket or a TCP connection.
type Wire = Either<UnixStream, TcpStream>;

/// Where the proxy passes connections on to.
#[derive(Debug, Clone)]
enum Upstream {
    Unix(PathBuf),
    Tcp(String, u16),
}

impl Upstream {
    fn of(config: &Config) -> Upstream {
        let port = config.get_ports().first().copied().unwrap_or(5432);
        match config.get_hosts().first() {
            Some(Host::Unix(dir)) => Upstream::Unix(dir.join(format!(".s.PGSQL.{port}"))),
            Some(Host::Tcp(name)) => Upstream::Tcp(name.clone(), port),
            None => Upstream::Tcp("localhost".into(), port),
        }
    }

    async fn connect(&self) -> std::io::Result<Wire> {
        Ok(match self {
            Upstream::Unix(path) => Either::Left(UnixStream::connect(path).await?),
            Upstream::Tcp(host, port) => {
                let stream = TcpStream::connect((host.as_str(), *port)).await?;
                let _ = stream.set_nodelay(true);
                Either::Right(stream)
            }
        })
    }
}

/// The proxy of a run: one link per actor; its connections end and its directory goes when it
/// is dropped.
pub struct PgProxy {
    links: Vec<Arc<PgLink>>,
    tasks: JoinSet<()>,
    /// The private directory of its sockets, removed with it.
    dir: Option<RunDir>,
}

/// One actor's link to its database: where it connects, and what is known and done there.
#[derive(Debug)]
pub struct PgLink {
    /// The host the actor is given: the private socket directory, or `127.0.0.1`.
    pub host: String,
    pub port: u16,
    /// Where its new connections go: re-pointed at a failover, as a virtual IP is.
    upstream: Mutex<Upstream>,
    /// The connections open now, by their number: the backend's pid once it is known.
    open: Mutex<BTreeMap<u64, Option<i32>>>,
    connections: AtomicU64,
    /// Raised by [`PgLink::reset`]: every connection open then is cut.
    cut: watch::Sender<u64>,
    /// Set while the link is partitioned.
    partitioned: watch::Sender<bool>,
    /// COMMITs the server has answered through this link.
    commits: AtomicU32,
    /// The COMMITs whose answer is to be lost, by their number on this link.
    lose_commits: Mutex<Vec<u32>>,
    /// When each lost COMMIT answer was lost, and the backend that had committed.
    lost: Mutex<BTreeMap<u32, (Instant, Option<i32>)>>,
    /// A backend was seen on this link (an actor authenticated through it).
    ever_connected: watch::Sender<bool>,
}

impl PgProxy {
    /// Starts `links` links to the server `config` names (its first host and port); on a Unix
    /// socket, `client` (the user strangers' relays run as) may connect too.
    pub async fn start(config: &Config, links: usize, client: Option<&User>) -> Result<PgProxy> {
        let upstream = Upstream::of(config);
        let mut tasks = JoinSet::new();
        let mut made = Vec::new();
        let dir = match upstream {
            Upstream::Unix(_) => Some(RunDir::create("pg-link", client)?),
            Upstream::Tcp(..) => None,
        };
        for i in 0..links {
            let (host, port, listener) = match &dir {
                Some(dir) => {
                    let port = SOCKET_PORT_BASE + i as u16;
                    let path = dir.path().join(format!(".s.PGSQL.{port}"));
                    let listener = UnixListener::bind(&path)
                        .with_context(|| format!("cannot listen on {}", path.display()))?;
                    run_as::let_in(&path, client)?;
                    let host = dir.path().to_string_lossy().into_owned();
                    (host, port, Either::Left(listener))
                }
                None => {
                    let listener = TcpListener::bind("127.0.0.1:0").await?;
                    let port = listener.local_addr()?.port();
                    ("127.0.0.1".to_string(), port, Either::Right(listener))
                }
            };
            let link = Arc::new(PgLink {
                host,
                port,
                upstream: Mutex::new(upstream.clone()),
                open: Mutex::new(BTreeMap::new()),
                connections: AtomicU64::new(0),
                cut: watch::channel(0).0,
                partitioned: watch::channel(false).0,
                commits: AtomicU32::new(0),
                lose_commits: Mutex::new(Vec::new()),
                lost: Mutex::new(BTreeMap::new()),
                ever_connected: watch::channel(false).0,
            });
            tasks.spawn(accept(listener, link.clone()));
            made.push(link);
        }
        Ok(PgProxy {
            links: made,
            tasks,
            dir,
        })
    }

    /// Link `i`.
    pub fn link(&self, i: usize) -> &PgLink {
        &self.links[i]
    }

    /// Re-points every link at the server `config` names (a promoted standby), as a virtual IP
    /// or a pgbouncer is at a failover: the connections open now are cut, and the actors that
    /// connect again, with the same URL, reach the new server. Its way in is of the same kind
    /// (a socket for a socket): the actors' URLs do not change.
    pub fn repoint(&self, config: &Config) -> Result<()> {
        let upstream = Upstream::of(config);
        for link in &self.links {
            let mut current = link.upstream.lock().expect("not poisoned");
            if matches!(*current, Upstream::Unix(_)) != matches!(upstream, Upstream::Unix(_)) {
                bail!("a link is re-pointed at a server of the same kind (socket or TCP) only");
            }
            *current = upstream.clone();
            drop(current);
            link.reset();
        }
        Ok(())
    }
}

impl Drop for PgProxy {
    fn drop(&mut self) {
        self.tasks.abort_all();
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir.path());
        }
    }
}

impl PgLink {
    /// `db` as an actor reaches it through this link.
    pub fn database(&self, db: &Database) -> Result<Database> {
        db.through(&self.host, self.port)
    }

    /// The pids of the server backends serving this link's open connections now.
    pub fn backends(&self) -> Vec<i32> {
        let open = self.open.lock().expect("not poisoned");
        open.values().flatten().copied().collect()
    }

    /// Whether an actor ever had a session through this link.
    pub fn ever_connected(&self) -> bool {
        *self.ever_connected.borrow()
    }

    /// Cuts every connection open now (the actor sees it closed, the server a client gone);
    /// how many.
    pub fn reset(&self) -> usize {
        let open = self.open.lock().expect("not poisoned").len();
        self.cut.send_modify(|generation| *generation += 1);
        open
    }

    /// Black-holes the link for `hold`: nothing passes either way on open connections, and new
    /// ones hang, until it heals (then what was held goes on, as TCP retransmits). Healed also
    /// when the future is dropped (a run that ends).
    pub async fn partition(&self, hold: Duration) {
        struct Heal<'a>(&'a watch::Sender<bool>);
        impl Drop for Heal<'_> {
            fn drop(&mut self) {
                self.0.send_replace(false);
            }
        }
        self.partitioned.send_replace(true);
        let _heal = Heal(&self.partitioned);
        tokio::time::sleep(hold.min(MAX_PARTITION)).await;
    }

    /// The `n`-th COMMIT answered through this link will be lost: the server commits, the
    /// answer is dropped and the actor's connection cut.
    pub fn lose_commit(&self, n: u32) {
        self.lose_commits.lock().expect("not poisoned").push(n);
    }

    /// When the `n`-th COMMIT's answer was lost, and the backend that committed it.
    pub fn commit_lost(&self, n: u32) -> Option<(Instant, Option<i32>)> {
        self.lost.lock().expect("not poisoned").get(&n).copied()
    }

    /// How many COMMIT answers this link has lost so far.
    pub fn commits_lost(&self) -> usize {
        self.lost.lock().expect("not poisoned").len()
    }

    /// COMMITs the server answered through this link so far.
    pub fn commits(&self) -> u32 {
        self.commits.load(Ordering::SeqCst)
    }

    async fn healed(&self) {
        let mut partitioned = self.partitioned.subscribe();
        let _ = partitioned.wait_for(|p| !*p).await;
    }

    /// Counts an answered COMMIT; whether its answer is to be lost.
    fn committed(&self, backend: Option<i32>) -> bool {
        let n = self.commits.fetch_add(1, Ordering::SeqCst) + 1;
        let lose = self.lose_commits.lock().expect("not poisoned").contains(&n);
        if lose {
            let mut lost = self.lost.lock().expect("not poisoned");
            lost.insert(n, (Instant::now(), backend));
        }
        lose
    }
}

async fn accept(listener: Either<UnixListener, TcpListener>, link: Arc<PgLink>) {
    let mut connections = JoinSet::new();
    loop {
        let client = match &listener {
            Either::Left(unix) => unix.accept().await.map(|(s, _)| Either::Left(s)),
            Either::Right(tcp) => tcp.accept().await.map(|(s, _)| {
                let _ = s.set_nodelay(true);
                Either::Right(s)
            }),
        };
        let Ok(client) = client else { return };
        while connections.try_join_next().is_some() {}
        let link = link.clone();
        connections.spawn(async move {
            let number = link.connections.fetch_add(1, Ordering::SeqCst);
            link.open.lock().expect("not poisoned").insert(number, None);
            let _ = serve(client, &link, number).await;
            link.open.lock().expect("not poisoned").remove(&number);
        });
    }
}

/// One connection: the startup phase, then both ways until either side closes it or the link
/// cuts it.
async fn serve(mut client: Wire, link: &PgLink, number: u64) -> Result<()> {
    let mut cut = link.cut.subscribe();
    // A partitioned link: a new connection hangs until it heals.
    link.healed().await;
    let Some(startup) = startup(&mut client).await? else {
        return Ok(());
    };
    let upstream = link.upstream.lock().expect("not poisoned").clone();
    let mut server = upstream.connect().await?;
    server.write_all(&startup).await?;
    if i32::from_be_bytes(startup[4..8].try_into()?) == CANCEL_REQUEST {
        // The server answers a cancel by closing: nothing to pass back.
        let _ = server.read(&mut [0u8; 1]).await;
        return Ok(());
    }
    let mut from_client = vec![0u8; 16 * 1024];
    let mut from_server = Vec::with_capacity(16 * 1024);
    let mut chunk = vec![0u8; 16 * 1024];
    loop {
        tokio::select! {
            read = client.read(&mut from_client) => {
                let n = read?;
                if n == 0 {
                    return Ok(());
                }
                link.healed().await;
                server.write_all(&from_client[..n]).await?;
            }
            read = server.read(&mut chunk) => {
                let n = read?;
                if n == 0 {
                    return Ok(());
                }
                from_server.extend_from_slice(&chunk[..n]);
                let (whole, lose) = messages(&from_server, link, number);
                link.healed().await;
                client.write_all(&from_server[..whole]).await?;
                if lose {
                    // The COMMIT's answer and whatever follows are dropped; the actor's
                    // connection is cut (the server, seeing its client gone, ends the backend).
                    return Ok(());
                }
                from_server.drain(..whole);
            }
            _ = cut.changed() => return Ok(()),
        }
    }
}

/// Reads the startup phase of a connection, answering 'N' to requests for TLS or GSSAPI
/// encryption; the startup (or cancel) packet to pass on, `None` if the actor went away.
async fn startup(client: &mut Wire) -> Result<Option<Vec<u8>>> {
    loop {
        let mut head = [0u8; 8];
        if client.read_exact(&mut head).await.is_err() {
            return Ok(None);
        }
        let len = i32::from_be_bytes(head[..4].try_into()?) as usize;
        if !(8..=MAX_STARTUP_LEN).contains(&len) {
            bail!("not a PostgreSQL startup packet ({len} bytes)");
        }
        let code = i32::from_be_bytes(head[4..].try_into()?);
        let mut packet = head.to_vec();
        packet.resize(len, 0);
        client.read_exact(&mut packet[8..]).await?;
        match code {
            SSL_REQUEST | GSSENC_REQUEST => client.write_all(b"N").await?,
            _ => return Ok(Some(packet)),
        }
    }
}

/// Reads the whole messages at the start of `bytes` (the server's side): a BackendKeyData's pid
/// is recorded for connection `number`, and a CommandComplete `COMMIT` counted. The bytes to
/// pass on (up to the first COMMIT whose answer is to be lost, then `true`).
fn messages(bytes: &[u8], link: &PgLink, number: u64) -> (usize, bool) {
    let mut at = 0;
    while bytes.len() >= at + 5 {
        let kind = bytes[at];
        let len = u32::from_be_bytes(bytes[at + 1..at + 5].try_into().expect("4 bytes")) as usize;
        let end = at + 1 + len;
        if len < 4 || bytes.len() < end {
            break;
        }
        let body = &bytes[at + 5..end];
        match kind {
            b'K' if body.len() >= 4 => {
                let pid = i32::from_be_bytes(body[..4].try_into().expect("4 bytes"));
                let mut open = link.open.lock().expect("not poisoned");
                open.insert(number, Some(pid));
                link.ever_connected.send_replace(true);
            }
            b'C' if body == b"COMMIT\0" => {
                let backend = link
                    .open
                    .lock()
                    .expect("not poisoned")
                    .get(&number)
                    .copied();
                if link.committed(backend.flatten()) {
                    return (at, true);
                }
            }
            _ => {}
        }
        at = end;
    }
    (at, false)
}
