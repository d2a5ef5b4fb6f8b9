//! A proxy on the PostgreSQL wire between each actor (a relay, the writer) and its database,
//! so that the harness sees the system through its connections, not through the names the
//! actors choose: which server backend serves which actor is read from the BackendKeyData
//! message of each connection (the backend's pid), whatever `application_name` the actor sets.
//! It does to the link what real networks do: cuts its connections (`dbnet:reset`), black-holes
//! it for a while (`dbnet:partition`), and loses a committing answer after the server committed
//! (`dbnet:commit-lost`: Jepsen's indeterminate operation, the client cannot know). It may let
//! in only one role to one database ([`PgLink::admit_only`]).
//!
//! Each actor has a way in of its own: a Unix socket in a private directory (0700, ours) when
//! the server listens on one, else a loopback TCP port. Authentication passes through
//! untouched (SCRAM included: the proxy reads no password); an SSLRequest or GSSENCRequest is
//! answered 'N', so the actor talks in the clear to the proxy, which talks in the clear to the
//! server (a server that demands TLS cannot be reached through it). After the startup message
//! each way is pumped on its own, so that a full socket one way never stops the other (a
//! pipelining client sends while it reads), and every fault acts at once, a write pending or
//! not. The server's side is read as the protocol's typed messages as they stream by
//! ([`ServerSide`]); the actor's side is passed on as it comes, its messages counted that the
//! server answers with a ReadyForQuery ([`ClientSide`]).
//!
//! Memory per connection, whatever the size of the messages: a 16 KiB buffer each way (the
//! server's with room for the 75 bytes it may hold back), and a few hundred bytes of state.

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::unistd::User;
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};
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
/// A startup message's protocol version: the major in the high 16 bits (3.0 and 3.2 are 3).
const PROTOCOL_MAJOR: i32 = 3;
/// A startup packet longer than this is not PostgreSQL's (libpq's own limit is 10 000).
const MAX_STARTUP_LEN: usize = 10_000;
/// The socket's name carries a port number; the directory being private, any will do.
const SOCKET_PORT_BASE: u16 = 6000;

/// Each way of a connection reads at most this much at a time.
const CHUNK: usize = 16 * 1024;
/// A message's header: its type byte, then its length (which counts itself, not the type).
const HEADER_LEN: usize = 5;
/// The most of a CommandComplete's tag read: the server's own are shorter (its
/// COMPLETION_TAG_BUFSIZE is 64); a longer message passes unread.
const TAG_KEPT: usize = 64;
/// A ReadyForQuery: its header and its status byte.
const READY_LEN: usize = HEADER_LEN + 1;
/// The most of the server's bytes held back at once: a writing CommandComplete, then the
/// ReadyForQuery that may end its transaction.
const HELD_MAX: usize = HEADER_LEN + TAG_KEPT + READY_LEN;

/// The server's messages the link reads.
const BACKEND_KEY_DATA: u8 = b'K';
const COMMAND_COMPLETE: u8 = b'C';
const READY_FOR_QUERY: u8 = b'Z';
const ERROR_RESPONSE: u8 = b'E';
const COPY_IN_RESPONSE: u8 = b'G';
/// ReadyForQuery's status outside a transaction block ('T' in one, 'E' in a failed one).
const IDLE: u8 = b'I';
/// The actor's messages the server answers with a ReadyForQuery: Query, Sync, FunctionCall.
const ASK_READY: [u8; 3] = [b'Q', b'S', b'F'];
/// The server sends a ReadyForQuery unasked once, when the session is ready.
const STARTUP_READY: u64 = 1;

/// CommandComplete tags: those that answer a commit (a COMMIT of a failed transaction answers
/// `ROLLBACK`), and those that begin or end a transaction block otherwise.
const COMMITTING_TAGS: [&[u8]; 2] = [b"COMMIT", b"COMMIT PREPARED"];
const BLOCK_BEGINS: [&[u8]; 2] = [b"BEGIN", b"START TRANSACTION"];
const BLOCK_ENDS: [&[u8]; 2] = [b"ROLLBACK", b"PREPARE TRANSACTION"];
/// The commands whose tag (its first word) says they wrote; `COPY` too after a CopyInResponse
/// (a COPY FROM).
const WRITING_COMMANDS: [&[u8]; 4] = [b"INSERT", b"UPDATE", b"DELETE", b"MERGE"];
const COPY: &[u8] = b"COPY";

/// SQLSTATE invalid_authorization_specification: who asked is not admitted.
const NOT_ADMITTED: &str = "28000";
/// A link remembers this many of its last refusals.
const REFUSALS_KEPT: usize = 8;

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
    /// Its Unix socket, where it has one.
    socket: Option<PathBuf>,
    /// Where its new connections go: re-pointed at a failover, as a virtual IP is.
    upstream: Mutex<Upstream>,
    /// The connections open now, by their number: the backend's pid once it is known.
    open: Mutex<BTreeMap<u64, Option<i32>>>,
    connections: AtomicU64,
    /// Raised by [`PgLink::reset`]: every connection open then is cut.
    cut: watch::Sender<u64>,
    /// Set while the link is partitioned.
    partitioned: watch::Sender<bool>,
    /// Committing answers the server has sent through this link ([`ServerSide`]).
    committing: AtomicU32,
    /// The committing answers to be lost, by their number on this link.
    lose: Mutex<Vec<u32>>,
    /// When each lost answer was lost, and the backend that had committed.
    lost: Mutex<BTreeMap<u32, (Instant, Option<i32>)>>,
    /// A backend was seen on this link (an actor authenticated through it).
    ever_connected: watch::Sender<bool>,
    /// The only role and database a session may be started for, when set.
    admitted: Mutex<Option<(String, String)>>,
    /// Connections refused, and why the last few were.
    refusals: AtomicU64,
    refused: Mutex<VecDeque<String>>,
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
            let (host, port, socket, listener) = match &dir {
                Some(dir) => {
                    let port = SOCKET_PORT_BASE + i as u16;
                    let path = dir.path().join(format!(".s.PGSQL.{port}"));
                    let listener = UnixListener::bind(&path)
                        .with_context(|| format!("cannot listen on {}", path.display()))?;
                    run_as::let_in(&path, client)?;
                    let host = dir.path().to_string_lossy().into_owned();
                    (host, port, Some(path), Either::Left(listener))
                }
                None => {
                    let listener = TcpListener::bind("127.0.0.1:0").await?;
                    let port = listener.local_addr()?.port();
                    ("127.0.0.1".to_string(), port, None, Either::Right(listener))
                }
            };
            let link = Arc::new(PgLink {
                host,
                port,
                socket,
                upstream: Mutex::new(upstream.clone()),
                open: Mutex::new(BTreeMap::new()),
                connections: AtomicU64::new(0),
                cut: watch::channel(0).0,
                partitioned: watch::channel(false).0,
                committing: AtomicU32::new(0),
                lose: Mutex::new(Vec::new()),
                lost: Mutex::new(BTreeMap::new()),
                ever_connected: watch::channel(false).0,
                admitted: Mutex::new(None),
                refusals: AtomicU64::new(0),
                refused: Mutex::new(VecDeque::new()),
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

    /// Keeps link `i` ours alone: the client the proxy let in may not connect to it (the
    /// writer's link, beside the relays'). A TCP link is open to every local user: what keeps
    /// it is [`PgLink::admit_only`], and the admitted role's password.
    pub fn ours_alone(&self, i: usize) -> Result<()> {
        match &self.links[i].socket {
            Some(socket) => run_as::let_in(socket, None),
            None => Ok(()),
        }
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

    /// Black-holes the link for `hold`, however long: nothing passes either way on open
    /// connections (a write pending included), and new ones hang, until it heals (then what was
    /// held goes on, as TCP retransmits). Healed also when the future is dropped (a run that
    /// ends).
    pub async fn partition(&self, hold: Duration) {
        struct Heal<'a>(&'a watch::Sender<bool>);
        impl Drop for Heal<'_> {
            fn drop(&mut self) {
                self.0.send_replace(false);
            }
        }
        self.partitioned.send_replace(true);
        let _heal = Heal(&self.partitioned);
        tokio::time::sleep(hold).await;
    }

    /// The `n`-th committing answer through this link will be lost: the server commits, the
    /// answer is dropped and the actor's connection cut.
    pub fn lose_commit(&self, n: u32) {
        self.lose.lock().expect("not poisoned").push(n);
    }

    /// When the `n`-th committing answer was lost, and the backend that committed.
    pub fn commit_lost(&self, n: u32) -> Option<(Instant, Option<i32>)> {
        self.lost.lock().expect("not poisoned").get(&n).copied()
    }

    /// How many committing answers this link has lost so far.
    pub fn commits_lost(&self) -> usize {
        self.lost.lock().expect("not poisoned").len()
    }

    /// The committing answers the server sent through this link so far: a COMMIT's, or the end
    /// of an implicit transaction that wrote (autocommit); see [`ServerSide`].
    pub fn committing_answers(&self) -> u32 {
        self.committing.load(Ordering::SeqCst)
    }

    /// From now on, only `user` may start a session through this link, and only to `database`
    /// (by the startup message's `user` and `database`): anyone else is answered with a FATAL
    /// error and never reaches the server. Anyone may by default.
    pub fn admit_only(&self, user: &str, database: &str) {
        let mut admitted = self.admitted.lock().expect("not poisoned");
        *admitted = Some((user.to_string(), database.to_string()));
    }

    /// How many connections the link refused ([`PgLink::admit_only`]).
    pub fn refusals(&self) -> u64 {
        self.refusals.load(Ordering::SeqCst)
    }

    /// What the link answered the last few connections it refused, oldest first.
    pub fn refused(&self) -> Vec<String> {
        let refused = self.refused.lock().expect("not poisoned");
        refused.iter().cloned().collect()
    }

    async fn healed(&self) {
        let mut partitioned = self.partitioned.subscribe();
        let _ = partitioned.wait_for(|p| !*p).await;
    }

    /// Backend `pid` serves connection `number`.
    fn serving(&self, number: u64, pid: i32) {
        self.open
            .lock()
            .expect("not poisoned")
            .insert(number, Some(pid));
        self.ever_connected.send_replace(true);
    }

    /// Connection `number`'s backend has closed its side: it serves the connection no more,
    /// while the actor has yet to close its own.
    fn unserved(&self, number: u64) {
        if let Some(backend) = self.open.lock().expect("not poisoned").get_mut(&number) {
            *backend = None;
        }
    }

    /// Counts a committing answer from `backend`; whether it is to be lost.
    fn committed(&self, backend: Option<i32>) -> bool {
        let n = self.committing.fetch_add(1, Ordering::SeqCst) + 1;
        let lose = self.lose.lock().expect("not poisoned").contains(&n);
        if lose {
            let mut lost = self.lost.lock().expect("not poisoned");
            lost.insert(n, (Instant::now(), backend));
        }
        lose
    }

    /// Why the startup `packet` is refused, if it is: it asks for a role or a database other
    /// than those admitted.
    fn refusal(&self, packet: &[u8]) -> Option<String> {
        let admitted = self.admitted.lock().expect("not poisoned");
        let (user, database) = admitted.as_ref()?;
        let asked_user = startup_parameter(packet, "user");
        let asked_database = startup_parameter(packet, "database").or(asked_user);
        if asked_user == Some(user.as_bytes()) && asked_database == Some(database.as_bytes()) {
            return None;
        }
        let named = |asked: Option<&[u8]>| {
            asked.map_or("none".into(), |name| {
                String::from_utf8_lossy(name).into_owned()
            })
        };
        Some(format!(
            "outbox-lab's link admits only role {user} to database {database} (asked: role {}, \
             database {})",
            named(asked_user),
            named(asked_database)
        ))
    }

    fn refuse(&self, why: &str) {
        self.refusals.fetch_add(1, Ordering::SeqCst);
        let mut refused = self.refused.lock().expect("not poisoned");
        if refused.len() == REFUSALS_KEPT {
            refused.pop_front();
        }
        refused.push_back(why.to_string());
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

/// One connection, until either side closes it, its committing answer is lost, or the link
/// cuts it (at whatever point: the startup, a partition, a write pending).
async fn serve(client: Wire, link: &PgLink, number: u64) -> Result<()> {
    let mut cut = link.cut.subscribe();
    tokio::select! {
        served = session(client, link, number) => served,
        _ = cut.changed() => Ok(()),
    }
}

/// The startup phase (the actor admitted, or refused), then both ways.
async fn session(mut client: Wire, link: &PgLink, number: u64) -> Result<()> {
    // A partitioned link: a new connection hangs until it heals.
    link.healed().await;
    let Some(startup) = startup(&mut client).await? else {
        return Ok(());
    };
    let code = i32::from_be_bytes(startup[4..8].try_into()?);
    if code != CANCEL_REQUEST {
        if let Some(why) = link.refusal(&startup) {
            link.refuse(&why);
            // The actor reads it, then the connection closed; the server never hears of it.
            client.write_all(&fatal(NOT_ADMITTED, &why)).await?;
            return Ok(());
        }
    }
    let upstream = link.upstream.lock().expect("not poisoned").clone();
    let mut server = upstream.connect().await?;
    server.write_all(&startup).await?;
    if code == CANCEL_REQUEST {
        // The server answers a cancel by closing: nothing to pass back.
        let _ = server.read(&mut [0u8; 1]).await;
        return Ok(());
    }
    both_ways(client, server, link, number).await
}

/// How the server's side of a connection ended.
enum Ending {
    /// The server closed it (its last bytes passed on).
    Closed,
    /// A committing answer was lost: the connection is to be cut.
    AnswerLost,
}

/// Both ways at once, each pumped on its own; a side that closes closes its way only (what the
/// other way still carries goes on), and the connection ends when both have.
async fn both_ways(client: Wire, server: Wire, link: &PgLink, number: u64) -> Result<()> {
    let (mut client_read, mut client_write) = tokio::io::split(client);
    let (mut server_read, mut server_write) = tokio::io::split(server);
    let asked = AtomicU64::new(STARTUP_READY);
    let up = to_server(&mut client_read, &mut server_write, link, &asked);
    let down = to_actor(&mut server_read, &mut client_write, link, number, &asked);
    tokio::pin!(up, down);
    let (mut up_done, mut down_done) = (false, false);
    while !(up_done && down_done) {
        tokio::select! {
            ended = &mut up, if !up_done => {
                ended?;
                up_done = true;
            }
            ended = &mut down, if !down_done => match ended? {
                Ending::Closed => {
                    link.unserved(number);
                    down_done = true;
                }
                // The answer and whatever follows are dropped; the actor's connection is cut
                // (the server, seeing its client gone, ends the backend).
                Ending::AnswerLost => return Ok(()),
            },
        }
    }
    Ok(())
}

/// The actor's side to the server, counting what the server owes a ReadyForQuery for (before
/// it passes on: the server cannot answer sooner).
async fn to_server(
    from: &mut ReadHalf<Wire>,
    to: &mut WriteHalf<Wire>,
    link: &PgLink,
    asked: &AtomicU64,
) -> io::Result<()> {
    let mut partitioned = link.partitioned.subscribe();
    let mut requests = ClientSide::default();
    let mut buffer = vec![0u8; CHUNK];
    loop {
        let n = from.read(&mut buffer).await?;
        if n == 0 {
            let _ = partitioned.wait_for(|p| !*p).await;
            return to.shutdown().await;
        }
        asked.fetch_add(requests.read(&buffer[..n]), Ordering::SeqCst);
        pass_on(to, &buffer[..n], &mut partitioned).await?;
    }
}

/// The server's side to the actor, read as it streams by ([`ServerSide`]): the bytes it holds
/// back wait at the front of the buffer for what follows, at most [`HELD_MAX`].
async fn to_actor(
    from: &mut ReadHalf<Wire>,
    to: &mut WriteHalf<Wire>,
    link: &PgLink,
    number: u64,
    asked: &AtomicU64,
) -> io::Result<Ending> {
    let mut partitioned = link.partitioned.subscribe();
    let mut answers = ServerSide::new();
    let mut buffer = vec![0u8; HELD_MAX + CHUNK];
    let mut held = 0;
    let mut backend_known = false;
    loop {
        let n = from.read(&mut buffer[held..]).await?;
        if n == 0 {
            // The server's last word, whole or not: nothing follows to decide on.
            pass_on(to, &buffer[..held], &mut partitioned).await?;
            let _ = partitioned.wait_for(|p| !*p).await;
            to.shutdown().await?;
            return Ok(Ending::Closed);
        }
        let read = held + n;
        let verdict = answers.read(
            &buffer[held..read],
            asked.load(Ordering::SeqCst),
            &mut |backend| link.committed(backend),
        );
        if let (false, Some(pid)) = (backend_known, answers.backend) {
            link.serving(number, pid);
            backend_known = true;
        }
        match verdict {
            Verdict::Pass { held: still_held } => {
                pass_on(to, &buffer[..read - still_held], &mut partitioned).await?;
                buffer.copy_within(read - still_held..read, 0);
                held = still_held;
            }
            Verdict::Lose { dropped } => {
                pass_on(to, &buffer[..read - dropped], &mut partitioned).await?;
                return Ok(Ending::AnswerLost);
            }
        }
    }
}

/// Writes `bytes` to `to` while the link is not partitioned: a partition that begins while a
/// write is pending holds the rest until it heals.
async fn pass_on(
    to: &mut WriteHalf<Wire>,
    mut bytes: &[u8],
    partitioned: &mut watch::Receiver<bool>,
) -> io::Result<()> {
    while !bytes.is_empty() {
        let _ = partitioned.wait_for(|p| !*p).await;
        tokio::select! {
            // Cancel-safe: a write that lost the race wrote nothing.
            written = to.write(bytes) => match written? {
                0 => return Err(io::ErrorKind::WriteZero.into()),
                n => bytes = &bytes[n..],
            },
            _ = partitioned.wait_for(|p| *p) => {}
        }
    }
    Ok(())
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

/// The value of `key` in a startup message (protocol 3: NUL-terminated names and values, an
/// empty name last); `None` in any other packet.
fn startup_parameter<'a>(packet: &'a [u8], key: &str) -> Option<&'a [u8]> {
    let code = i32::from_be_bytes(packet.get(4..8)?.try_into().ok()?);
    if code >> 16 != PROTOCOL_MAJOR {
        return None;
    }
    let mut fields = packet[8..].split(|byte| *byte == 0);
    while let (Some(name), Some(value)) = (fields.next(), fields.next()) {
        if name.is_empty() {
            break;
        }
        if name == key.as_bytes() {
            return Some(value);
        }
    }
    None
}

/// A FATAL ErrorResponse: 'E', its length, then its fields (severity, localized and not; the
/// SQLSTATE `code`; the `message`), each NUL-terminated, and a NUL that ends them.
fn fatal(code: &str, message: &str) -> Vec<u8> {
    let mut fields = Vec::new();
    for (field, value) in [
        (b'S', "FATAL"),
        (b'V', "FATAL"),
        (b'C', code),
        (b'M', message),
    ] {
        fields.push(field);
        fields.extend_from_slice(value.as_bytes());
        fields.push(0);
    }
    fields.push(0);
    let len = u32::try_from(fields.len() + 4).expect("a short message");
    let mut response = vec![ERROR_RESPONSE];
    response.extend_from_slice(&len.to_be_bytes());
    response.extend(fields);
    response
}

/// The actor's side of a connection, read as it streams by for the messages the server
/// answers with a ReadyForQuery ([`ASK_READY`]).
#[derive(Default)]
struct ClientSide {
    /// The header of the next message, as far as it has come.
    header: [u8; HEADER_LEN],
    header_read: usize,
    /// What is still to come of the body of the message passing.
    body_left: usize,
}

impl ClientSide {
    /// Reads the actor's next `bytes`: how many ReadyForQuery they ask for.
    fn read(&mut self, bytes: &[u8]) -> u64 {
        let mut asked = 0;
        let mut at = 0;
        while at < bytes.len() {
            if self.body_left > 0 {
                let take = self.body_left.min(bytes.len() - at);
                self.body_left -= take;
                at += take;
                continue;
            }
            let take = (HEADER_LEN - self.header_read).min(bytes.len() - at);
            self.header[self.header_read..self.header_read + take]
                .copy_from_slice(&bytes[at..at + take]);
            self.header_read += take;
            at += take;
            if self.header_read == HEADER_LEN {
                self.header_read = 0;
                self.body_left = body_len(&self.header);
                asked += u64::from(ASK_READY.contains(&self.header[0]));
            }
        }
        asked
    }
}

/// The body's length, from a message's header (its length counts itself).
fn body_len(header: &[u8; HEADER_LEN]) -> usize {
    let len = u32::from_be_bytes(header[1..].try_into().expect("4 bytes"));
    (len as usize).saturating_sub(4)
}

/// What may pass of the server's bytes read so far.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// All but the last `held` (they wait for what follows).
    Pass { held: usize },
    /// All but the last `dropped`: a committing answer to lose, and everything after it. The
    /// connection is then cut.
    Lose { dropped: usize },
}

/// The server's side of a connection, read as it streams by: each message's header (its type
/// and length), then its body, passed on as it comes; of the bodies that matter only their
/// start is kept (a BackendKeyData's pid, a CommandComplete's tag, a ReadyForQuery's status).
///
/// It finds the committing answers, after which the server has committed: a CommandComplete
/// `COMMIT` or `COMMIT PREPARED`, and the ReadyForQuery 'I' that ends an implicit transaction
/// (autocommit) that wrote: an INSERT, UPDATE, DELETE, MERGE or COPY FROM completed since the
/// last ReadyForQuery, with no ErrorResponse and no BEGIN since. So that an answer can be lost
/// whole, it holds back a CommandComplete until its tag is read, a ReadyForQuery until its
/// status is, and a writing CommandComplete of an implicit transaction until the next message:
/// when that is the ReadyForQuery 'I', both are the committing answer; when anything else, the
/// CommandComplete passes and the answer is the ReadyForQuery. A writing CommandComplete is
/// held only while the server owes a ReadyForQuery (the actor sent a Query or a Sync it has not
/// answered): an actor that flushed without a Sync waits for it before it sends anything more.
struct ServerSide {
    /// The header of the next message, as far as it has come.
    header: [u8; HEADER_LEN],
    header_read: usize,
    /// The message whose body is passing: its type, and what is still to come of its body.
    kind: u8,
    body_left: usize,
    /// The start of that body, where it matters.
    kept: [u8; TAG_KEPT],
    kept_len: usize,
    /// That message is held back until it is read whole.
    holding: bool,
    /// How many of the bytes read last are held back.
    held: usize,
    /// A writing CommandComplete is held back until the next message.
    write_held: bool,
    /// In a transaction block (after BEGIN, until it ends).
    in_block: bool,
    /// The implicit transaction going on has written.
    wrote: bool,
    /// A CopyInResponse came since the last CommandComplete: that COPY is a COPY FROM.
    copy_in: bool,
    /// ReadyForQuery messages read.
    ready: u64,
    /// The backend's pid, once its BackendKeyData is read.
    backend: Option<i32>,
}

impl ServerSide {
    fn new() -> ServerSide {
        ServerSide {
            header: [0; HEADER_LEN],
            header_read: 0,
            kind: 0,
            body_left: 0,
            kept: [0; TAG_KEPT],
            kept_len: 0,
            holding: false,
            held: 0,
            write_held: false,
            in_block: false,
            wrote: false,
            copy_in: false,
            ready: 0,
            backend: None,
        }
    }

    /// Reads the server's next `bytes`; `asked` is how many ReadyForQuery the actor has asked
    /// for so far, and `lose(backend)` counts a committing answer and says whether to lose it.
    fn read(
        &mut self,
        bytes: &[u8],
        asked: u64,
        lose: &mut impl FnMut(Option<i32>) -> bool,
    ) -> Verdict {
        let mut at = 0;
        while at < bytes.len() {
            if self.header_read < HEADER_LEN {
                let take = (HEADER_LEN - self.header_read).min(bytes.len() - at);
                self.header[self.header_read..self.header_read + take]
                    .copy_from_slice(&bytes[at..at + take]);
                self.header_read += take;
                self.held += take;
                at += take;
                if self.header_read < HEADER_LEN {
                    continue;
                }
                self.begin_message();
            } else {
                let take = self.body_left.min(bytes.len() - at);
                self.keep(&bytes[at..at + take]);
                if self.holding {
                    self.held += take;
                }
                self.body_left -= take;
                at += take;
            }
            if self.body_left == 0 {
                self.header_read = 0;
                if self.end_message(asked) && lose(self.backend) {
                    return Verdict::Lose {
                        dropped: self.held + bytes.len() - at,
                    };
                }
                if !self.write_held {
                    self.held = 0;
                }
            }
        }
        Verdict::Pass { held: self.held }
    }

    /// A message's header is read: whether it is held back, and what it says already.
    fn begin_message(&mut self) {
        self.kind = self.header[0];
        self.body_left = body_len(&self.header);
        self.kept_len = 0;
        self.holding = match self.kind {
            COMMAND_COMPLETE => self.body_left <= TAG_KEPT,
            READY_FOR_QUERY => self.body_left == 1,
            _ => false,
        };
        if !self.holding {
            // It passes, and a writing CommandComplete held before it.
            self.held = 0;
            self.write_held = false;
        } else if self.write_held && self.kind != READY_FOR_QUERY {
            // The writing CommandComplete held did not end its transaction: it passes.
            self.held = HEADER_LEN;
            self.write_held = false;
        }
        match self.kind {
            // The implicit transaction is rolled back.
            ERROR_RESPONSE => self.wrote = false,
            COPY_IN_RESPONSE => self.copy_in = true,
            _ => {}
        }
    }

    /// Keeps the start of a body that matters.
    fn keep(&mut self, body: &[u8]) {
        if matches!(
            self.kind,
            BACKEND_KEY_DATA | COMMAND_COMPLETE | READY_FOR_QUERY
        ) {
            let take = body.len().min(TAG_KEPT - self.kept_len);
            self.kept[self.kept_len..self.kept_len + take].copy_from_slice(&body[..take]);
            self.kept_len += take;
        }
    }

    /// A message is read whole: whether it is a committing answer.
    fn end_message(&mut self, asked: u64) -> bool {
        match self.kind {
            BACKEND_KEY_DATA if self.kept_len >= 4 => {
                let pid = self.kept[..4].try_into().expect("4 bytes");
                self.backend = Some(i32::from_be_bytes(pid));
                false
            }
            COMMAND_COMPLETE if self.holding => self.command_complete(asked),
            READY_FOR_QUERY if self.holding => {
                self.ready += 1;
                let idle = self.kept[0] == IDLE;
                let committing = idle && self.wrote;
                self.in_block = !idle;
                self.wrote = false;
                self.write_held = false;
                self.copy_in = false;
                committing
            }
            _ => false,
        }
    }

    /// A CommandComplete's tag is read: what it says of the transaction; whether it answers a
    /// commit.
    fn command_complete(&mut self, asked: u64) -> bool {
        let copied_in = std::mem::take(&mut self.copy_in);
        let body = &self.kept[..self.kept_len];
        let tag = body.strip_suffix(&[0]).unwrap_or(body);
        let command = tag.split(|byte| *byte == b' ').next().unwrap_or(tag);
        if COMMITTING_TAGS.contains(&tag) {
            self.in_block = false;
            self.wrote = false;
            return true;
        }
        if BLOCK_BEGINS.contains(&tag) || BLOCK_ENDS.contains(&tag) {
            self.in_block = BLOCK_BEGINS.contains(&tag);
            self.wrote = false;
        } else if !self.in_block
            && (WRITING_COMMANDS.contains(&command) || (command == COPY && copied_in))
        {
            self.wrote = true;
            self.write_held = asked > self.ready;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut message = vec![kind];
        message.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
        message.extend_from_slice(body);
        message
    }

    fn complete(tag: &str) -> Vec<u8> {
        message(COMMAND_COMPLETE, format!("{tag}\0").as_bytes())
    }

    fn ready(status: u8) -> Vec<u8> {
        message(READY_FOR_QUERY, &[status])
    }

    /// The session ready: BackendKeyData (pid 4242), ReadyForQuery idle.
    fn started() -> Vec<u8> {
        let key = [4242i32.to_be_bytes(), 7i32.to_be_bytes()].concat();
        [message(BACKEND_KEY_DATA, &key), ready(IDLE)].concat()
    }

    /// An extended-protocol statement's answer up to its CommandComplete: ParseComplete,
    /// BindComplete, NoData.
    fn extended(tag: &str) -> Vec<u8> {
        [
            message(b'1', b""),
            message(b'2', b""),
            message(b'n', b""),
            complete(tag),
        ]
        .concat()
    }

    /// What passes of the server's `stream` read `chunk` bytes at a time, as [`to_actor`] reads
    /// it (a ReadyForQuery always owed), the committing answers numbered in `lose` lost: the
    /// bytes passed, the committing answers, whether the connection is cut.
    fn pump(stream: &[u8], chunk: usize, lose: &[u32]) -> (Vec<u8>, u32, bool) {
        let mut side = ServerSide::new();
        let (mut passed, mut held, mut answers) = (Vec::new(), Vec::new(), 0);
        for piece in stream.chunks(chunk) {
            held.extend_from_slice(piece);
            let mut answer = |_| {
                answers += 1;
                lose.contains(&answers)
            };
            match side.read(piece, u64::MAX, &mut answer) {
                Verdict::Pass { held: still } => {
                    assert!(still <= HELD_MAX, "{still} bytes held");
                    passed.extend(held.drain(..held.len() - still));
                }
                Verdict::Lose { dropped } => {
                    passed.extend_from_slice(&held[..held.len() - dropped]);
                    return (passed, answers, true);
                }
            }
        }
        passed.extend(held);
        (passed, answers, false)
    }

    /// `stream` passes whole and unchanged whichever way it is cut into reads, with `answers`
    /// committing answers in it.
    fn passes_with(stream: &[u8], answers: u32) {
        for chunk in 1..=stream.len() {
            assert_eq!(pump(stream, chunk, &[]), (stream.to_vec(), answers, false));
        }
    }

    /// Losing committing answer `n` of `stream` passes `before` (whichever way it is cut into
    /// reads), then cuts.
    fn loses(stream: &[u8], n: u32, before: &[u8]) {
        for chunk in 1..=stream.len() {
            assert_eq!(
                pump(stream, chunk, &[n]),
                (before.to_vec(), n, true),
                "{chunk}"
            );
        }
    }

    /// An explicit transaction is answered by its COMMIT, lost with what follows it.
    #[test]
    fn an_explicit_commit_is_one_committing_answer() {
        let begun = [started(), complete("BEGIN"), ready(b'T')].concat();
        let inserted = [begun, extended("INSERT 0 1"), ready(b'T')].concat();
        let stream = [inserted.clone(), complete("COMMIT"), ready(IDLE)].concat();
        passes_with(&stream, 1);
        loses(&stream, 1, &inserted);
        let prepared = [started(), complete("COMMIT PREPARED"), ready(IDLE)].concat();
        passes_with(&prepared, 1);
    }

    /// A write in autocommit ends with its ReadyForQuery 'I', after the server committed: its
    /// CommandComplete and ReadyForQuery are lost together.
    #[test]
    fn a_write_in_autocommit_is_answered_by_its_ready_for_query() {
        let first = [started(), extended("INSERT 0 1"), ready(IDLE)].concat();
        let second = [extended("UPDATE 3"), ready(IDLE)].concat();
        let stream = [first.clone(), second].concat();
        passes_with(&stream, 2);
        let before_second = [first.clone(), message(b'1', b""), message(b'2', b"")].concat();
        loses(&stream, 2, &[before_second, message(b'n', b"")].concat());
        // Two statements of one simple Query are one implicit transaction: its last
        // CommandComplete and the ReadyForQuery are the answer.
        let two = [
            started(),
            complete("DELETE 1"),
            complete("MERGE 2"),
            ready(IDLE),
        ]
        .concat();
        passes_with(&two, 1);
        loses(&two, 1, &[started(), complete("DELETE 1")].concat());
        // A notice between them: the CommandComplete has passed, the ReadyForQuery is lost.
        let notice = message(b'N', b"SNOTICE\0\0");
        let noticed = [
            started(),
            complete("INSERT 0 1"),
            notice.clone(),
            ready(IDLE),
        ]
        .concat();
        passes_with(&noticed, 1);
        loses(
            &noticed,
            1,
            &[started(), complete("INSERT 0 1"), notice].concat(),
        );
        let copied_in = [message(COPY_IN_RESPONSE, &[0, 0, 0]), complete("COPY 2")].concat();
        passes_with(&[started(), copied_in, ready(IDLE)].concat(), 1);
    }

    /// Reads, failures and what commits nothing are no committing answer.
    #[test]
    fn reads_and_failures_are_no_committing_answer() {
        let error = message(ERROR_RESPONSE, b"SERROR\0C23505\0\0");
        let row = message(b'D', &[b'x'; 40_000]);
        let read = [
            message(b'T', b"..."),
            row,
            complete("SELECT 1"),
            ready(IDLE),
        ]
        .concat();
        let failed_commit = [
            complete("BEGIN"),
            extended("INSERT 0 1"),
            error.clone(),
            ready(b'E'),
            complete("ROLLBACK"),
            ready(IDLE),
        ]
        .concat();
        let failed_write = [extended("INSERT 0 1"), error, ready(IDLE)].concat();
        let copied_out = [
            message(b'H', &[0, 0, 0]),
            message(b'd', b"1\n"),
            message(b'c', b""),
            complete("COPY 1"),
            ready(IDLE),
        ]
        .concat();
        // A write in a transaction block is the COMMIT's, not an answer of its own.
        let in_block = [complete("BEGIN"), complete("INSERT 0 1"), ready(b'T')].concat();
        let stream = [
            started(),
            read,
            failed_commit,
            failed_write,
            copied_out,
            in_block,
        ]
        .concat();
        for chunk in [1, 2, 5, 7, 4096, stream.len()] {
            assert_eq!(pump(&stream, chunk, &[]), (stream.clone(), 0, false));
        }
    }

    /// A writing CommandComplete is not held when no ReadyForQuery is owed: the actor flushed
    /// without a Sync, and waits for it.
    #[test]
    fn a_write_is_not_held_when_no_ready_for_query_is_owed() {
        let mut side = ServerSide::new();
        let mut never = |_| panic!("no committing answer yet");
        let startup = started();
        assert_eq!(
            side.read(&startup, STARTUP_READY, &mut never),
            Verdict::Pass { held: 0 }
        );
        assert_eq!(side.backend, Some(4242));
        let inserted = complete("INSERT 0 1");
        assert_eq!(
            side.read(&inserted, STARTUP_READY, &mut never),
            Verdict::Pass { held: 0 }
        );
        // The Sync sent later: its ReadyForQuery is the committing answer.
        let mut lose = |backend| backend == Some(4242);
        let dropped = READY_LEN;
        assert_eq!(
            side.read(&ready(IDLE), STARTUP_READY + 1, &mut lose),
            Verdict::Lose { dropped }
        );
    }

    /// The actor's Query, Sync and FunctionCall ask for a ReadyForQuery, whatever the reads.
    #[test]
    fn the_actors_requests_for_ready_are_counted() {
        let stream = [
            message(b'Q', b"SELECT 1\0"),
            message(b'P', b"\0INSERT\0\0\0"),
            message(b'd', &[b'S'; 300]),
            message(b'S', b""),
            message(b'F', &[0; 10]),
        ]
        .concat();
        for chunk in 1..=stream.len() {
            let mut side = ClientSide::default();
            let asked: u64 = stream.chunks(chunk).map(|piece| side.read(piece)).sum();
            assert_eq!(asked, 3, "{chunk}");
        }
    }

    /// A startup message's parameters, and the FATAL error a refused one is answered with.
    #[test]
    fn startup_parameters_and_the_refusal_are_the_protocols() {
        let mut packet = vec![0, 0, 0, 0];
        packet.extend_from_slice(&(PROTOCOL_MAJOR << 16).to_be_bytes());
        packet.extend_from_slice(b"user\0relay\0replication\0true\0\0");
        assert_eq!(startup_parameter(&packet, "user"), Some(&b"relay"[..]));
        assert_eq!(
            startup_parameter(&packet, "replication"),
            Some(&b"true"[..])
        );
        assert_eq!(startup_parameter(&packet, "database"), None);
        let mut cancel = vec![0, 0, 0, 16];
        cancel.extend_from_slice(&CANCEL_REQUEST.to_be_bytes());
        cancel.extend_from_slice(b"user\0relay\0");
        assert_eq!(startup_parameter(&cancel, "user"), None);

        let error = fatal(NOT_ADMITTED, "no");
        let body = b"SFATAL\0VFATAL\0C28000\0Mno\0\0";
        assert_eq!(error, message(ERROR_RESPONSE, body));
    }
}
