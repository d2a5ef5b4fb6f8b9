//! The Kafka delivery proxy, where a nemesis learns of each delivery (`kill:relay:on-delivery@N`
//! with `verify --sink kafka`), in front of the broker's [door](super::kafka): a port per relay,
//! so that it knows who sent what; every Produce request is a delivery, numbered over the run,
//! held as it arrives (pause) or once the broker has answered it and before the answer goes
//! back (kill, db-kill-backend), as the [`watch`](super::watch) contract says. The network
//! faults are the HTTP proxy's ([`faults`](super::faults)), the N-th Produce their request N:
//! `reset@N` resets the connection as it arrives (it never reaches the broker, nor does what
//! follows it), `reply-lost@N` passes it on and swallows the broker's answer, keeping the
//! connection silent (the producer learns of it only from its request timeout), `delay@N+FOR`
//! holds it (and the connection behind it) that long, `refuse@N` answers it NOT_LEADER_OR_FOLLOWER
//! itself (the producer retries it, after the requests behind it if several were in flight); while the sink is down (`net:down`) every
//! connection and every request is reset. The broker's
//! answers that name brokers (Metadata, FindCoordinator, DescribeCluster) are rewritten to name
//! the relay's port, so that the client, which connects to the brokers it is told of, stays on
//! it.

use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use anyhow::{anyhow, Result};
use bytes::{Bytes, BytesMut};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{
    ApiKey, DescribeClusterResponse, FindCoordinatorResponse, MetadataResponse, ProduceRequest,
    ProduceResponse, RequestHeader, ResponseHeader,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use super::faults::{self, Ending, FaultRecord, NetworkFault, ProxyFaults};
use super::kafka::{ack_at_once, frame_end};
use super::watch::{DeliveryMoment, RelayWatch};
use crate::connect;

/// A running delivery proxy; it stops (with every connection through it) when dropped.
pub struct KafkaProxy {
    relay_urls: Vec<String>,
    record: FaultRecord,
    tasks: JoinSet<()>,
}

impl KafkaProxy {
    /// Listens for each of `relays` relays on a port of its own (127.0.0.1) and passes their
    /// connections on to the first broker of `upstream_url` (a `kafka://` URL; its credentials
    /// go on in each relay's URL, and through the proxy to the broker), doing `faults` to them.
    pub async fn start(upstream_url: &str, faults: ProxyFaults, relays: u32) -> Result<KafkaProxy> {
        let upstream = connect::kafka_url(upstream_url)
            .map_err(|e| anyhow!("cannot watch deliveries to a Kafka URL: {e}"))?
            .brokers
            .into_iter()
            .next()
            .ok_or_else(|| anyhow!("a Kafka URL without a broker"))?;
        let credentials = upstream_url
            .strip_prefix("kafka://")
            .and_then(|rest| rest.rsplit_once('@'))
            .map(|(userinfo, _)| format!("{userinfo}@"))
            .unwrap_or_default();
        let record = FaultRecord::default();
        let mut watches = match faults.watch.clone() {
            Some(watch) => RelayWatch::per_relay(watch, relays)
                .into_iter()
                .map(Some)
                .collect(),
            None => vec![None; relays as usize],
        };
        let faults = Arc::new(faults);
        let mut tasks = JoinSet::new();
        let mut relay_urls = Vec::new();
        for watch in watches.drain(..) {
            let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
            let port = listener.local_addr()?.port();
            relay_urls.push(format!("kafka://{credentials}127.0.0.1:{port}"));
            let way_in = WayIn {
                upstream: upstream.clone(),
                port,
                watch,
                faults: faults.clone(),
                record: record.clone(),
            };
            tasks.spawn(accept(listener, way_in));
        }
        Ok(KafkaProxy {
            relay_urls,
            record,
            tasks,
        })
    }

    /// Where relay `index` produces.
    pub fn relay_url(&self, index: u32) -> &str {
        &self.relay_urls[index as usize]
    }

    /// Its Produce requests, and the faults that struck them.
    pub fn record(&self) -> &FaultRecord {
        &self.record
    }
}

impl Drop for KafkaProxy {
    fn drop(&mut self) {
        self.tasks.abort_all();
    }
}

/// One relay's port: where it passes on to, and what it watches.
#[derive(Clone)]
struct WayIn {
    upstream: String,
    /// Its own port, which the broker's answers are made to name.
    port: u16,
    /// Its relay's share of the deliveries the nemeses wait for, if any.
    watch: Option<RelayWatch>,
    faults: Arc<ProxyFaults>,
    /// The Produce requests over every relay (numbered there), and the faults that struck.
    record: FaultRecord,
}

async fn accept(listener: TcpListener, way_in: WayIn) {
    let (faults, record) = (way_in.faults.clone(), way_in.record.clone());
    faults::accept(listener, &faults, &record, |client| {
        proxied(client, way_in.clone())
    })
    .await;
}

/// One connection through the proxy: the relay's side, and how it ended.
async fn proxied(mut client: TcpStream, way_in: WayIn) -> (TcpStream, Ending) {
    let Ok(server) = TcpStream::connect(&way_in.upstream).await else {
        return (client, Ending::Closed);
    };
    // As the link: no Nagle's wait on the way.
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let ending = pass_on(&mut client, server, &way_in).await;
    (client, ending)
}

/// A request whose response is awaited: what it asked, in which version, and the delivery it
/// is (a Produce), with its bytes while a nemesis may wait for its answer, and whether its
/// answer is to be lost; or a refused one's answer, the proxy's own, waiting for its turn.
#[derive(Default)]
struct Awaited {
    key: Option<ApiKey>,
    version: i16,
    delivery: Option<(u32, Vec<u8>)>,
    reply_lost: bool,
    refusal: Option<Vec<u8>>,
}

impl Awaited {
    /// A request the proxy answered itself with `refusal` (a whole frame).
    fn answered(refusal: Vec<u8>) -> Awaited {
        Awaited {
            refusal: Some(refusal),
            ..Awaited::default()
        }
    }
}

/// The proxy's own answers whose turn has come (nothing awaited from the broker before them),
/// added to `out`.
fn refusals_due(awaited: &mut VecDeque<Awaited>, out: &mut Vec<u8>) {
    while let Some(refusal) = awaited.front_mut().and_then(|a| a.refusal.take()) {
        out.extend_from_slice(&refusal);
        awaited.pop_front();
    }
}

/// One connection, both ways, until either side closes it (or sends what is not Kafka), or a
/// fault ends it.
async fn pass_on(client: &mut TcpStream, mut server: TcpStream, way_in: &WayIn) -> Ending {
    let WayIn { faults, record, .. } = way_in;
    let (mut from_client, mut from_server) = (Vec::new(), Vec::new());
    let mut chunk = vec![0u8; 64 * 1024];
    let mut reply_chunk = vec![0u8; 64 * 1024];
    let mut awaited: VecDeque<Awaited> = VecDeque::new();
    loop {
        tokio::select! {
            read = client.read(&mut chunk) => {
                let Ok(n @ 1..) = read else { return Ending::Closed };
                ack_at_once(client);
                from_client.extend_from_slice(&chunk[..n]);
                let mut passed = 0;
                while let Some(end) = frame_end(&from_client, passed) {
                    let request = &from_client[passed + 4..end];
                    let Some((key, version)) = api_of(request) else { return Ending::Closed };
                    if faults.down.load(Ordering::SeqCst) {
                        record.reset();
                        return Ending::Reset;
                    }
                    let mut delivery = None;
                    let mut reply_lost = false;
                    if key == Some(ApiKey::Produce) {
                        let number = record.request();
                        if let Some(watch) = &way_in.watch {
                            watch.hold(number, DeliveryMoment::Sent, request).await;
                        }
                        let fault = faults.on_request(number);
                        if fault.is_some() {
                            record.struck(number);
                        }
                        match fault {
                            Some(NetworkFault::Reset) => {
                                // What came before it on the connection goes on; it does not.
                                let _ = server.write_all(&from_client[..passed]).await;
                                record.reset();
                                return Ending::Reset;
                            }
                            Some(NetworkFault::Delay(held)) => tokio::time::sleep(held).await,
                            Some(NetworkFault::ReplyLost) => reply_lost = true,
                            Some(NetworkFault::Refuse) => {
                                let Some(refusal) = refused(request, version) else {
                                    return Ending::Closed;
                                };
                                // Answers go back in the order of the requests: after those
                                // still awaited from the broker, or at once.
                                match awaited.is_empty() {
                                    true => {
                                        if client.write_all(&refusal).await.is_err() {
                                            return Ending::Closed;
                                        }
                                    }
                                    false => awaited.push_back(Awaited::answered(refusal)),
                                }
                                from_client.drain(passed..end);
                                continue;
                            }
                            None => {}
                        }
                        // acks=0: no answer comes back.
                        if produce_acks(request, version) == Some(0) {
                            passed = end;
                            continue;
                        }
                        let answered = way_in
                            .watch
                            .as_ref()
                            .is_some_and(|watch| watch.watches(number, DeliveryMoment::Answered));
                        delivery = Some((number, if answered { request.to_vec() } else { Vec::new() }));
                    }
                    awaited.push_back(Awaited { key, version, delivery, reply_lost, refusal: None });
                    passed = end;
                }
                tokio::time::sleep(faults.latency).await;
                if server.write_all(&from_client[..passed]).await.is_err() {
                    return Ending::Closed;
                }
                from_client.drain(..passed);
            }
            read = server.read(&mut reply_chunk) => {
                let Ok(n @ 1..) = read else { return Ending::Closed };
                from_server.extend_from_slice(&reply_chunk[..n]);
                let mut parsed = 0;
                let mut out = Vec::new();
                while let Some(end) = frame_end(&from_server, parsed) {
                    let response = &from_server[parsed + 4..end];
                    refusals_due(&mut awaited, &mut out);
                    let Some(request) = awaited.pop_front() else { return Ending::Closed };
                    if let Some((number, bytes)) = &request.delivery {
                        // What came before this answer goes back first.
                        if client.write_all(&out).await.is_err() {
                            return Ending::Closed;
                        }
                        out.clear();
                        if let Some(watch) = &way_in.watch {
                            watch.hold(*number, DeliveryMoment::Answered, bytes).await;
                        }
                        if request.reply_lost {
                            record.reply_lost();
                            return Ending::Silent;
                        }
                    }
                    match naming_this_port(response, &request, way_in.port) {
                        Some(rewritten) => {
                            out.extend_from_slice(&(rewritten.len() as u32).to_be_bytes());
                            out.extend_from_slice(&rewritten);
                        }
                        None => out.extend_from_slice(&from_server[parsed..end]),
                    }
                    parsed = end;
                }
                refusals_due(&mut awaited, &mut out);
                if client.write_all(&out).await.is_err() {
                    return Ending::Closed;
                }
                from_server.drain(..parsed);
            }
        }
    }
}

/// A request's API (None: one this proxy does not know, passed on all the same) and version.
fn api_of(request: &[u8]) -> Option<(Option<ApiKey>, i16)> {
    let key = i16::from_be_bytes([*request.first()?, *request.get(1)?]);
    let version = i16::from_be_bytes([*request.get(2)?, *request.get(3)?]);
    Some((ApiKey::try_from(key).ok(), version))
}

/// A Produce request's `acks`, if it decodes.
fn produce_acks(request: &[u8], version: i16) -> Option<i16> {
    let mut body = Bytes::copy_from_slice(request);
    RequestHeader::decode(&mut body, ApiKey::Produce.request_header_version(version)).ok()?;
    Some(ProduceRequest::decode(&mut body, version).ok()?.acks)
}

/// The answer to a Produce the proxy refuses, as a whole frame: every partition of `request`
/// answered NOT_LEADER_OR_FOLLOWER, nothing written, as when a partition's leadership moves
/// (a producer looks the leader up again and retries it). None if it does not decode.
fn refused(request: &[u8], version: i16) -> Option<Vec<u8>> {
    let mut body = Bytes::copy_from_slice(request);
    let header =
        RequestHeader::decode(&mut body, ApiKey::Produce.request_header_version(version)).ok()?;
    let produce = ProduceRequest::decode(&mut body, version).ok()?;
    let not_leader = ResponseError::NotLeaderOrFollower.code();
    let topics = produce.topic_data.iter().map(|topic| {
        let partitions = topic.partition_data.iter().map(|partition| {
            PartitionProduceResponse::default()
                .with_index(partition.index)
                .with_error_code(not_leader)
                .with_base_offset(-1)
        });
        TopicProduceResponse::default()
            .with_name(topic.name.clone())
            .with_topic_id(topic.topic_id)
            .with_partition_responses(partitions.collect())
    });
    let answer = ProduceResponse::default().with_responses(topics.collect());
    let header_version = ApiKey::Produce.response_header_version(version);
    let mut out = BytesMut::new();
    ResponseHeader::default()
        .with_correlation_id(header.correlation_id)
        .encode(&mut out, header_version)
        .ok()?;
    answer.encode(&mut out, version).ok()?;
    let mut frame = (out.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(&out);
    Some(frame)
}

/// The broker's answer that names brokers, rewritten to name 127.0.0.1 and `port` (the relay's
/// own); None for any other answer (or one that does not decode), passed back as it is.
fn naming_this_port(response: &[u8], request: &Awaited, port: u16) -> Option<Vec<u8>> {
    let key = request.key?;
    let version = request.version;
    let header_version = key.response_header_version(version);
    let mut body = Bytes::copy_from_slice(response);
    let header = ResponseHeader::decode(&mut body, header_version).ok()?;
    let host = || StrBytes::from_static_str("127.0.0.1");
    let port = i32::from(port);
    let mut out = BytesMut::new();
    header.encode(&mut out, header_version).ok()?;
    match key {
        ApiKey::Metadata => {
            let mut answer = MetadataResponse::decode(&mut body, version).ok()?;
            for broker in &mut answer.brokers {
                (broker.host, broker.port) = (host(), port);
            }
            answer.encode(&mut out, version).ok()?;
        }
        ApiKey::FindCoordinator => {
            let mut answer = FindCoordinatorResponse::decode(&mut body, version).ok()?;
            // One coordinator before version 4, a list of them since.
            if version < 4 {
                (answer.host, answer.port) = (host(), port);
            }
            for coordinator in &mut answer.coordinators {
                (coordinator.host, coordinator.port) = (host(), port);
            }
            answer.encode(&mut out, version).ok()?;
        }
        ApiKey::DescribeCluster => {
            let mut answer = DescribeClusterResponse::decode(&mut body, version).ok()?;
            for broker in &mut answer.brokers {
                (broker.host, broker.port) = (host(), port);
            }
            answer.encode(&mut out, version).ok()?;
        }
        _ => return None,
    }
    Some(out.to_vec())
}
