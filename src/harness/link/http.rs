//! A TCP proxy between a relay and the HTTP consumer, run by the harness, that does to the
//! traffic what real networks do: adds latency, resets connections, and loses replies.
//!
//! The proxy sees bytes, not HTTP; it counts requests by the turn of the conversation (the
//! relay's first bytes after a reply, or on a new connection, start a request), which holds for
//! the relays' one-request-at-a-time keep-alive connections. Faults are planned like crash
//! points, by count (`reply-lost@2`: the reply to the second request), so runs reproduce
//! ([`faults`](super::faults), which records when each struck).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use super::faults::{self, Ending, FaultRecord, NetworkFault, ProxyFaults};
use super::watch::DeliveryMoment;

/// A running proxy; it stops (with every connection through it) when stopped or dropped.
pub struct Proxy {
    /// Where senders send to instead of the consumer, e.g. `http://127.0.0.1:41234`.
    pub url: String,
    /// Relay `i`'s own way in, so that its requests are known to be its.
    relay_urls: Vec<String>,
    record: FaultRecord,
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
        let record = FaultRecord::default();
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
                record: record.clone(),
            };
            tasks.spawn(accept(listener, way_in));
        }
        let url = urls.remove(0);
        Ok(Proxy {
            url,
            relay_urls: urls,
            record,
            tasks,
        })
    }

    /// Where relay `index` sends (the common way in when it has none of its own).
    pub fn relay_url(&self, index: u32) -> &str {
        self.relay_urls.get(index as usize).unwrap_or(&self.url)
    }

    /// Its requests, and the faults that struck them.
    pub fn record(&self) -> &FaultRecord {
        &self.record
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
    record: FaultRecord,
}

async fn accept(listener: TcpListener, way_in: WayIn) {
    let (faults, record) = (way_in.faults.clone(), way_in.record.clone());
    faults::accept(listener, &faults, &record, |client| {
        pass_on(client, way_in.clone())
    })
    .await;
}

/// One connection: the relay's side to the consumer and back, with the planned faults; the
/// relay's side, and how it ended.
async fn pass_on(mut client: TcpStream, way_in: WayIn) -> (TcpStream, Ending) {
    let Ok(mut server) = TcpStream::connect(way_in.upstream).await else {
        // The relay sees its connection close, as if the consumer were down.
        return (client, Ending::Closed);
    };
    // Each turn is passed on at once: Nagle's algorithm would hold a small write back for the
    // other side's delayed ACK (40 ms a request, here).
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let ending = forward(&mut client, &mut server, &way_in).await;
    (client, ending)
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
    let WayIn { faults, record, .. } = way_in;
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
                    let number = record.request();
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
                        record.reset();
                        return Ending::Reset;
                    }
                    if fault.is_some() {
                        record.struck(number);
                    }
                    match fault {
                        Some(NetworkFault::Reset) => {
                            record.reset();
                            return Ending::Reset;
                        }
                        Some(NetworkFault::Delay(held)) => tokio::time::sleep(held).await,
                        Some(NetworkFault::Refuse) => {
                            // All of it read, so that its rest is not taken for the next one.
                            let mut whole = match whole_turn {
                                true => request.1.clone(),
                                false => from_client[..n].to_vec(),
                            };
                            read_whole_request(client, &mut whole).await;
                            let refusal = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n";
                            if client.write_all(refusal).await.is_err() {
                                return Ending::Closed;
                            }
                            awaiting_request = true;
                            continue;
                        }
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
                    record.reply_lost();
                    return Ending::Silent;
                }
                if client.write_all(&from_server[..n]).await.is_err() {
                    return Ending::Closed;
                }
            }
        }
    }
}
