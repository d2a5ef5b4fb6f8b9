//! A TCP proxy between a relay and the HTTP consumer, run by the harness, that does to the
//! traffic what real networks do: adds latency, resets connections, and loses replies.
//!
//! The proxy sees bytes, not HTTP; it counts requests by the turn of the conversation (the
//! relay's first bytes after a reply, or on a new connection, start a request), which holds for
//! the relays' one-request-at-a-time keep-alive connections. Faults are planned like crash
//! points, by count (`reply-lost@2`: the reply to the second request), so runs reproduce.
//! Each planned fault records when it struck, for the history of a run.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use super::watch::{DeliveryMoment, DeliveryWatch, HOLD_LIMIT};
use crate::harness::nemesis::{format_duration, parse_duration};

/// What the proxy does to one request. The names are stable, like crash points'.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetworkFault {
    /// The connection is reset as the request arrives: it never reaches the consumer.
    Reset,
    /// The request reaches the consumer, which acts and commits; its reply is swallowed and the
    /// connection kept silent, so the relay only learns of it from its request timeout.
    ReplyLost,
    /// The request is held this long before it is passed on (longer than the sender's request
    /// timeout: it arrives after the sender gave up on it).
    Delay(Duration),
}

impl NetworkFault {
    pub fn name(self) -> &'static str {
        match self {
            NetworkFault::Reset => "reset",
            NetworkFault::ReplyLost => "reply-lost",
            NetworkFault::Delay(_) => "delay",
        }
    }
}

/// `NAME@N` (`delay@N+FOR`): the fault hits the N-th request through the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(try_from = "String")]
pub struct FaultPlan {
    pub fault: NetworkFault,
    pub on_request: u32,
}

impl fmt::Display for FaultPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.fault.name(), self.on_request)?;
        match self.fault {
            NetworkFault::Delay(held) => write!(f, "+{}", format_duration(held)),
            _ => Ok(()),
        }
    }
}

impl FromStr for FaultPlan {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (name, number) = s
            .split_once('@')
            .ok_or_else(|| format!("'{s}' is not a network fault NAME@REQUEST"))?;
        let (number, held) = match number.split_once('+') {
            Some((number, held)) => (number, Some(held)),
            None => (number, None),
        };
        let fault = match (name, held) {
            ("reset", None) => NetworkFault::Reset,
            ("reply-lost", None) => NetworkFault::ReplyLost,
            ("delay", Some(held)) => NetworkFault::Delay(parse_duration(held)?),
            ("delay", None) => return Err(format!("'{s}' needs how long: delay@REQUEST+FOR")),
            ("reset" | "reply-lost", Some(_)) => {
                return Err(format!("'{s}': only delay takes +FOR"))
            }
            _ => {
                return Err(format!(
                    "unknown network fault '{name}' (reset, reply-lost, delay)"
                ))
            }
        };
        let on_request =
            number.parse().ok().filter(|n| *n >= 1).ok_or_else(|| {
                format!("'{number}' in '{s}' is not a request number of 1 or more")
            })?;
        Ok(FaultPlan { fault, on_request })
    }
}

impl TryFrom<String> for FaultPlan {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

/// Everything the proxy does to the traffic.
#[derive(Debug, Clone, Default)]
pub struct ProxyFaults {
    /// Every request waits this long before it is passed on.
    pub latency: Duration,
    pub plans: Vec<FaultPlan>,
    /// The deliveries nemeses strike on.
    pub watch: Option<DeliveryWatch>,
    /// Set while the sink is down (`net:down@T+FOR`, a nemesis on the clock): every new
    /// connection and every request is reset.
    pub down: Arc<AtomicBool>,
}

impl ProxyFaults {
    fn on_request(&self, number: u32) -> Option<NetworkFault> {
        self.plans
            .iter()
            .find(|plan| plan.on_request == number)
            .map(|plan| plan.fault)
    }
}

/// What went through the proxy.
#[derive(Debug, Default)]
struct Counters {
    requests: AtomicU32,
    resets: AtomicU32,
    replies_lost: AtomicU32,
    /// When each planned fault struck, by request number.
    struck: Mutex<BTreeMap<u32, Instant>>,
}

/// What the proxy counted, for the report.
#[derive(Debug, Clone, Copy)]
pub struct ProxyCounts {
    pub requests: u32,
    pub resets: u32,
    pub replies_lost: u32,
}

/// A running proxy; it stops (with every connection through it) when stopped or dropped.
pub struct Proxy {
    /// Where senders send to instead of the consumer, e.g. `http://127.0.0.1:41234`.
    pub url: String,
    /// Relay `i`'s own way in, so that its requests are known to be its.
    relay_urls: Vec<String>,
    counters: Arc<Counters>,
    /// The listeners' tasks; the connections end with them.
    tasks: JoinSet<()>,
}

impl Proxy {
    /// Listens on free loopback ports — one for any sender, and one for each of `relays`
    /// relays — and passes connections on to `upstream_url` (`http://host:port`).
    pub async fn start(upstream_url: &str, faults: ProxyFaults, relays: u32) -> Result<Proxy> {
        let authority = upstream_url
            .parse::<hyper::Uri>()
            .ok()
            .and_then(|uri| uri.authority().map(|a| a.to_string()))
            .ok_or_else(|| anyhow!("cannot proxy '{upstream_url}': not http://host:port"))?;
        let upstream = tokio::net::lookup_host(&authority)
            .await?
            .next()
            .with_context(|| format!("cannot resolve {authority}"))?;
        let counters = Arc::new(Counters::default());
        let faults = Arc::new(faults);
        let mut tasks = JoinSet::new();
        let mut urls = Vec::new();
        for sender in std::iter::once(None).chain((0..relays).map(Some)) {
            let listener = TcpListener::bind("127.0.0.1:0").await?;
            urls.push(format!("http://{}", listener.local_addr()?));
            let way_in = WayIn {
                upstream,
                sender,
                faults: faults.clone(),
                counters: counters.clone(),
            };
            tasks.spawn(accept(listener, way_in));
        }
        let url = urls.remove(0);
        Ok(Proxy {
            url,
            relay_urls: urls,
            counters,
            tasks,
        })
    }

    /// Where relay `index` sends (the common way in when it has none of its own).
    pub fn relay_url(&self, index: u32) -> &str {
        self.relay_urls.get(index as usize).unwrap_or(&self.url)
    }

    /// When the fault planned for request `on_request` struck (`None`: not reached).
    pub fn struck_at(&self, on_request: u32) -> Option<Instant> {
        let struck = self.counters.struck.lock().expect("not poisoned");
        struck.get(&on_request).copied()
    }

    /// Whether a planned fault has struck yet.
    pub fn struck_any(&self) -> bool {
        !self
            .counters
            .struck
            .lock()
            .expect("not poisoned")
            .is_empty()
    }

    pub fn counts(&self) -> ProxyCounts {
        ProxyCounts {
            requests: self.counters.requests.load(Ordering::SeqCst),
            resets: self.counters.resets.load(Ordering::SeqCst),
            replies_lost: self.counters.replies_lost.load(Ordering::SeqCst),
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        // The connections live in the accept tasks' JoinSets: they end with them.
        self.tasks.abort_all();
    }
}

/// One listener of the proxy: where it passes on to, whose requests come through it, and what
/// is done to them.
#[derive(Clone)]
struct WayIn {
    upstream: SocketAddr,
    sender: Option<u32>,
    faults: Arc<ProxyFaults>,
    counters: Arc<Counters>,
}

async fn accept(listener: TcpListener, way_in: WayIn) {
    let mut connections = JoinSet::new();
    while let Ok((client, _)) = listener.accept().await {
        if way_in.faults.down.load(Ordering::SeqCst) {
            // The sink is down: the relay reads "connection reset by peer".
            way_in.counters.resets.fetch_add(1, Ordering::SeqCst);
            let _ = client.set_zero_linger();
            continue;
        }
        // Finished connections are reaped as new ones come, so the set stays small.
        while connections.try_join_next().is_some() {}
        connections.spawn(pass_on(client, way_in.clone()));
    }
}

/// How a proxied connection ended.
enum Ending {
    /// Either side closed it (or failed): both are closed.
    Closed,
    /// A planned reset: the relay's side is reset.
    Reset,
    /// A reply was lost: the relay's side is kept silent until the relay gives up.
    Hold,
}

/// One connection: the relay's side to the consumer and back, with the planned faults.
async fn pass_on(mut client: TcpStream, way_in: WayIn) {
    let Ok(mut server) = TcpStream::connect(way_in.upstream).await else {
        return; // the relay sees its connection close, as if the consumer were down
    };
    // Each turn is passed on at once: Nagle's algorithm would hold a small write back for the
    // other side's delayed ACK (40 ms a request, here).
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    match forward(&mut client, &mut server, &way_in).await {
        Ending::Closed => {}
        Ending::Reset => {
            // SO_LINGER 0 makes the close an RST: the relay reads "connection reset by peer".
            let _ = client.set_zero_linger();
        }
        Ending::Hold => {
            drop(server);
            let mut discard = [0u8; 4096];
            let _ = tokio::time::timeout(HOLD_LIMIT, async {
                while matches!(client.read(&mut discard).await, Ok(n) if n > 0) {}
            })
            .await;
        }
    }
}

/// Bytes of a request kept for the event ids a nemesis is told of.
const REQUEST_KEPT: usize = 64 * 1024;
/// How long a watched request's rest (its body) is waited for before the nemesis is told.
const REQUEST_REST: Duration = Duration::from_millis(100);

/// Reads on until `request` holds an HTTP request's headers and its `Content-Length` body, or
/// [`REQUEST_REST`] has passed (a sender may write its headers and body apart).
async fn read_whole_request(client: &mut TcpStream, request: &mut Vec<u8>) {
    let whole = |request: &[u8]| {
        let Some(headers) = request.windows(4).position(|w| w == b"\r\n\r\n") else {
            return false;
        };
        let text = String::from_utf8_lossy(&request[..headers]).to_ascii_lowercase();
        let length = text
            .lines()
            .find_map(|line| line.strip_prefix("content-length:"))
            .and_then(|value| value.trim().parse::<usize>().ok())
            .unwrap_or(0);
        request.len() >= headers + 4 + length
    };
    let mut chunk = [0u8; 16 * 1024];
    let _ = tokio::time::timeout(REQUEST_REST, async {
        while !whole(request) && request.len() < REQUEST_KEPT {
            match client.read(&mut chunk).await {
                Ok(n @ 1..) => request.extend_from_slice(&chunk[..n]),
                _ => break,
            }
        }
    })
    .await;
}

async fn forward(client: &mut TcpStream, server: &mut TcpStream, way_in: &WayIn) -> Ending {
    let WayIn {
        faults, counters, ..
    } = way_in;
    let mut from_client = [0u8; 16 * 1024];
    let mut from_server = [0u8; 16 * 1024];
    let mut awaiting_request = true;
    let mut fault = None;
    // With nemeses on a delivery: the request being passed on, its number and its first bytes.
    let mut request = (0, Vec::new());
    loop {
        tokio::select! {
            read = client.read(&mut from_client) => {
                let Ok(n @ 1..) = read else { return Ending::Closed };
                // This turn's bytes read so far are all in `request` (read on for a nemesis).
                let mut whole_turn = false;
                if !awaiting_request && faults.watch.is_some() && request.1.len() < REQUEST_KEPT {
                    request.1.extend_from_slice(&from_client[..n]);
                }
                if awaiting_request {
                    awaiting_request = false;
                    let number = counters.requests.fetch_add(1, Ordering::SeqCst) + 1;
                    if let Some(watch) = &faults.watch {
                        request = (number, from_client[..n].to_vec());
                        whole_turn = true;
                        let moment = DeliveryMoment::Sent;
                        if watch.watches(number, moment) {
                            // The nemesis is told what the request carries: all of it.
                            read_whole_request(client, &mut request.1).await;
                        }
                        watch.hold(number, moment, way_in.sender, &request.1).await;
                    }
                    fault = faults.on_request(number);
                    if faults.down.load(Ordering::SeqCst) {
                        counters.resets.fetch_add(1, Ordering::SeqCst);
                        return Ending::Reset;
                    }
                    if fault.is_some() {
                        let mut struck = counters.struck.lock().expect("not poisoned");
                        struck.insert(number, Instant::now());
                    }
                    match fault {
                        Some(NetworkFault::Reset) => {
                            counters.resets.fetch_add(1, Ordering::SeqCst);
                            return Ending::Reset;
                        }
                        Some(NetworkFault::Delay(held)) => tokio::time::sleep(held).await,
                        _ => {}
                    }
                }
                tokio::time::sleep(faults.latency).await;
                let passing = if whole_turn { &request.1[..] } else { &from_client[..n] };
                if server.write_all(passing).await.is_err() {
                    return Ending::Closed;
                }
            }
            read = server.read(&mut from_server) => {
                let Ok(n @ 1..) = read else { return Ending::Closed };
                if !awaiting_request {
                    if let Some(watch) = &faults.watch {
                        let moment = DeliveryMoment::Answered;
                        watch.hold(request.0, moment, way_in.sender, &request.1).await;
                    }
                }
                awaiting_request = true;
                if fault == Some(NetworkFault::ReplyLost) {
                    counters.replies_lost.fetch_add(1, Ordering::SeqCst);
                    return Ending::Hold;
                }
                if client.write_all(&from_server[..n]).await.is_err() {
                    return Ending::Closed;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fault plans parse back from their names, and a typo is an error.
    #[test]
    fn plans_round_trip_and_typos_are_rejected() {
        for fault in [
            NetworkFault::Reset,
            NetworkFault::ReplyLost,
            NetworkFault::Delay(Duration::from_millis(300)),
        ] {
            let plan = FaultPlan {
                fault,
                on_request: 3,
            };
            assert_eq!(plan.to_string().parse::<FaultPlan>(), Ok(plan));
        }
        assert!("reply-lost".parse::<FaultPlan>().is_err());
        assert!("reply-lots@2".parse::<FaultPlan>().is_err());
        assert!("reset@0".parse::<FaultPlan>().is_err());
        assert!("delay@2".parse::<FaultPlan>().is_err());
        assert!("reset@2+1s".parse::<FaultPlan>().is_err());
    }
}
