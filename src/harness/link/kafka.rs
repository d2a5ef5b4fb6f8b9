//! The links to a Kafka-protocol broker, two proxies on the Kafka wire (frames: a 4-byte
//! length, then a request or its response, in order on a connection):
//!
//! - [`KafkaLink`], the door of a broker that has no authentication of its own (the private
//!   tansu, in a network namespace of its own: [`netns`](crate::harness::netns)): on 127.0.0.1,
//!   the only way in, it admits a client once it has passed SASL PLAIN with the run's user and
//!   password, then passes its bytes both ways untouched. The broker advertises the link's
//!   address, so every client comes back through it. Before a client has authenticated it passes
//!   on ApiVersions alone (what a client asks first, which tells it the broker takes SASL),
//!   answers SaslHandshake (v1: PLAIN) and SaslAuthenticate itself, and closes the connection on
//!   anything else, as a Kafka broker requiring SASL does.
//! - [`KafkaProxy`], where a nemesis learns of each delivery (`kill:relay:on-delivery@N` with
//!   `verify --sink kafka`): a port per relay, so that it knows who sent what; every Produce
//!   request is a delivery, numbered over the run, held as it arrives (pause) or once the broker
//!   has answered it and before the answer goes back (kill, db-kill-backend), as the
//!   [`watch`](super::watch) contract says. The broker's answers that name brokers (Metadata,
//!   FindCoordinator, DescribeCluster) are rewritten to name the relay's port, so that the
//!   client, which connects to the brokers it is told of, stays on it.

use std::collections::VecDeque;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::Arc;

use anyhow::{anyhow, bail, Result};
use bytes::{Bytes, BytesMut};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{
    ApiKey, DescribeClusterResponse, FindCoordinatorResponse, MetadataResponse, ProduceRequest,
    RequestHeader, ResponseHeader, SaslAuthenticateRequest, SaslAuthenticateResponse,
    SaslHandshakeRequest, SaslHandshakeResponse,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

use super::watch::{DeliveryMoment, DeliveryWatch, RelayWatch};
use crate::connect;
use crate::harness::netns::Dialer;

/// A request larger than this before authentication is refused (a handshake is a few dozen
/// bytes; a stranger's huge length must not make us allocate it).
const MAX_UNAUTHENTICATED_REQUEST: usize = 64 * 1024;
/// The only SASL mechanism admitted.
const MECHANISM: &str = "PLAIN";

/// Who may pass: SASL PLAIN's user and password.
#[derive(Clone)]
pub struct Credentials {
    pub user: String,
    pub password: String,
}

/// A running proxy; dropping it stops accepting (connections already through go on until
/// either side closes).
pub struct KafkaLink {
    address: SocketAddr,
    accepting: JoinHandle<()>,
}

impl KafkaLink {
    /// Admits clients on `listener` who pass `credentials`, each to a connection of its own to
    /// `broker` inside the namespace `dialer` enters.
    pub fn start(
        listener: TcpListener,
        dialer: Dialer,
        broker: SocketAddr,
        credentials: Credentials,
    ) -> Result<KafkaLink> {
        let address = listener.local_addr()?;
        let credentials = Arc::new(credentials);
        let accepting = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let dialer = dialer.clone();
                let credentials = credentials.clone();
                tokio::spawn(async move {
                    let _ = admit(client, &dialer, broker, &credentials).await;
                });
            }
        });
        Ok(KafkaLink { address, accepting })
    }

    /// Where clients connect (127.0.0.1:PORT).
    pub fn address(&self) -> SocketAddr {
        self.address
    }
}

impl Drop for KafkaLink {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

/// One client: the SASL exchange, then its bytes and the broker's both ways. An error closes
/// the connection (a client that did not authenticate learns nothing else).
async fn admit(
    mut client: TcpStream,
    dialer: &Dialer,
    broker: SocketAddr,
    credentials: &Credentials,
) -> Result<()> {
    let mut upstream = dialer.connect(broker).await?;
    // A request goes on as it comes: Nagle's wait for an ACK would hold a Produce's last
    // segment for the receiver's delayed ACK (40 ms).
    client.set_nodelay(true)?;
    upstream.set_nodelay(true)?;
    let mut handshaken = false;
    loop {
        let request = read_frame(&mut client).await?;
        let mut body = request.clone();
        let api_key = i16::from_be_bytes([request[0], request[1]]);
        let version = i16::from_be_bytes([request[2], request[3]]);
        let key = ApiKey::try_from(api_key).map_err(|_| anyhow!("unknown API key {api_key}"))?;
        let header = RequestHeader::decode(&mut body, key.request_header_version(version))?;
        match key {
            ApiKey::ApiVersions => {
                write_frame(&mut upstream, &request).await?;
                let answer = read_frame(&mut upstream).await?;
                write_frame(&mut client, &answer).await?;
            }
            ApiKey::SaslHandshake if version >= 1 => {
                let asked = SaslHandshakeRequest::decode(&mut body, version)?;
                let known = asked.mechanism.as_str() == MECHANISM;
                let mut answer = SaslHandshakeResponse::default();
                answer.mechanisms = vec![StrBytes::from_static_str(MECHANISM)];
                if !known {
                    answer.error_code = ResponseError::UnsupportedSaslMechanism.code();
                }
                respond(&mut client, key, version, &header, &answer).await?;
                if !known {
                    bail!("SASL mechanism {} refused", asked.mechanism.as_str());
                }
                handshaken = true;
            }
            ApiKey::SaslAuthenticate if handshaken => {
                let asked = SaslAuthenticateRequest::decode(&mut body, version)?;
                let passed = plain_credentials_match(&asked.auth_bytes, credentials);
                let mut answer = SaslAuthenticateResponse::default();
                if !passed {
                    answer.error_code = ResponseError::SaslAuthenticationFailed.code();
                    answer.error_message = Some(StrBytes::from_static_str(
                        "Authentication failed: invalid username or password",
                    ));
                }
                respond(&mut client, key, version, &header, &answer).await?;
                if !passed {
                    bail!("SASL PLAIN refused");
                }
                break;
            }
            _ => bail!("{key:?} v{version} before authentication"),
        }
    }
    let (mut client_read, mut client_write) = client.into_split();
    let (mut upstream_read, mut upstream_write) = upstream.into_split();
    let requests = async {
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            let n = client_read.read(&mut chunk).await?;
            if n == 0 {
                return upstream_write.shutdown().await;
            }
            ack_at_once(client_read.as_ref());
            upstream_write.write_all(&chunk[..n]).await?;
        }
    };
    let answers = async {
        tokio::io::copy(&mut upstream_read, &mut client_write).await?;
        client_write.shutdown().await
    };
    tokio::try_join!(requests, answers)?;
    Ok(())
}

/// Acknowledges what `stream` has received at once, this time (Linux sets the flag back after
/// a while): rskafka writes a frame's length and its body apart, without TCP_NODELAY, so a
/// body smaller than a segment waits for the length's ACK, which a receiver would delay by 40
/// ms (batch 100's Produce requests took 45 ms each, tansu alone as much as through the links).
fn ack_at_once(stream: &TcpStream) {
    let on: libc::c_int = 1;
    // SAFETY: a socket of ours, an int option passed by pointer and size.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_QUICKACK,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// SASL PLAIN's message (`[authzid] NUL authcid NUL passwd`, RFC 4616) names `credentials`.
fn plain_credentials_match(message: &[u8], credentials: &Credentials) -> bool {
    let mut parts = message.split(|byte| *byte == 0);
    let (Some(_authzid), Some(user), Some(password), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    user == credentials.user.as_bytes() && password == credentials.password.as_bytes()
}

/// A Kafka frame's body (after its 4-byte length), bounded before authentication.
async fn read_frame(stream: &mut TcpStream) -> Result<Bytes> {
    let length = stream.read_u32().await? as usize;
    if !(4..=MAX_UNAUTHENTICATED_REQUEST).contains(&length) {
        bail!("a frame of {length} bytes before authentication");
    }
    let mut body = vec![0; length];
    stream.read_exact(&mut body).await?;
    Ok(Bytes::from(body))
}

async fn write_frame(stream: &mut TcpStream, body: &[u8]) -> Result<()> {
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(body);
    stream.write_all(&frame).await?;
    Ok(())
}

/// Answers the request `header` with `answer`, in the request's version.
async fn respond(
    client: &mut TcpStream,
    key: ApiKey,
    version: i16,
    header: &RequestHeader,
    answer: &impl Encodable,
) -> Result<()> {
    let mut body = BytesMut::new();
    let mut response_header = ResponseHeader::default();
    response_header.correlation_id = header.correlation_id;
    response_header.encode(&mut body, key.response_header_version(version))?;
    answer.encode(&mut body, version)?;
    write_frame(client, &body).await
}

/// A running delivery proxy; it stops (with every connection through it) when dropped.
pub struct KafkaProxy {
    relay_urls: Vec<String>,
    tasks: JoinSet<()>,
}

impl KafkaProxy {
    /// Listens for each of `relays` relays on a port of its own (127.0.0.1) and passes their
    /// connections on to the first broker of `upstream_url` (a `kafka://` URL; its credentials
    /// go on in each relay's URL, and through the proxy to the broker).
    pub async fn start(
        upstream_url: &str,
        watch: DeliveryWatch,
        relays: u32,
    ) -> Result<KafkaProxy> {
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
        let mut tasks = JoinSet::new();
        let mut relay_urls = Vec::new();
        for watch in RelayWatch::per_relay(watch, relays) {
            let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
            let port = listener.local_addr()?.port();
            relay_urls.push(format!("kafka://{credentials}127.0.0.1:{port}"));
            let way_in = WayIn {
                upstream: upstream.clone(),
                port,
                watch,
            };
            tasks.spawn(accept(listener, way_in));
        }
        Ok(KafkaProxy { relay_urls, tasks })
    }

    /// Where relay `index` produces.
    pub fn relay_url(&self, index: u32) -> &str {
        &self.relay_urls[index as usize]
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
    /// Its relay, and the Produce requests seen so far over every relay.
    watch: RelayWatch,
}

async fn accept(listener: TcpListener, way_in: WayIn) {
    let mut connections = JoinSet::new();
    while let Ok((client, _)) = listener.accept().await {
        while connections.try_join_next().is_some() {}
        let way_in = way_in.clone();
        connections.spawn(async move {
            if let Ok(server) = TcpStream::connect(&way_in.upstream).await {
                // As the link: no Nagle's wait on the way.
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                pass_on(client, server, &way_in).await;
            }
        });
    }
}

/// A request whose response is awaited: what it asked, in which version, and the delivery it
/// is (a Produce), with its bytes while a nemesis may wait for its answer.
struct Awaited {
    key: Option<ApiKey>,
    version: i16,
    delivery: Option<(u32, Vec<u8>)>,
}

/// One connection, both ways, until either side closes it (or sends what is not Kafka).
async fn pass_on(mut client: TcpStream, mut server: TcpStream, way_in: &WayIn) {
    let (mut from_client, mut from_server) = (Vec::new(), Vec::new());
    let mut chunk = vec![0u8; 64 * 1024];
    let mut reply_chunk = vec![0u8; 64 * 1024];
    let mut awaited: VecDeque<Awaited> = VecDeque::new();
    loop {
        tokio::select! {
            read = client.read(&mut chunk) => {
                let Ok(n @ 1..) = read else { return };
                ack_at_once(&client);
                from_client.extend_from_slice(&chunk[..n]);
                let mut passed = 0;
                while let Some(end) = frame_end(&from_client, passed) {
                    let request = &from_client[passed + 4..end];
                    let Some((key, version)) = api_of(request) else { return };
                    let mut delivery = None;
                    if key == Some(ApiKey::Produce) {
                        let number = way_in.watch.next_delivery();
                        way_in.watch.hold(number, DeliveryMoment::Sent, request).await;
                        // acks=0: no answer comes back.
                        if produce_acks(request, version) == Some(0) {
                            passed = end;
                            continue;
                        }
                        let answered = way_in.watch.watches(number, DeliveryMoment::Answered);
                        delivery = Some((number, if answered { request.to_vec() } else { Vec::new() }));
                    }
                    awaited.push_back(Awaited { key, version, delivery });
                    passed = end;
                }
                if server.write_all(&from_client[..passed]).await.is_err() {
                    return;
                }
                from_client.drain(..passed);
            }
            read = server.read(&mut reply_chunk) => {
                let Ok(n @ 1..) = read else { return };
                from_server.extend_from_slice(&reply_chunk[..n]);
                let mut parsed = 0;
                let mut out = Vec::new();
                while let Some(end) = frame_end(&from_server, parsed) {
                    let response = &from_server[parsed + 4..end];
                    let Some(request) = awaited.pop_front() else { return };
                    if let Some((number, bytes)) = &request.delivery {
                        // What came before this answer goes back first.
                        if client.write_all(&out).await.is_err() {
                            return;
                        }
                        out.clear();
                        way_in.watch.hold(*number, DeliveryMoment::Answered, bytes).await;
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
                if client.write_all(&out).await.is_err() {
                    return;
                }
                from_server.drain(..parsed);
            }
        }
    }
}

/// Where the frame starting at `at` ends, if it is all there.
fn frame_end(buf: &[u8], at: usize) -> Option<usize> {
    let length = buf.get(at..at + 4)?;
    let end = at + 4 + u32::from_be_bytes(length.try_into().ok()?) as usize;
    (buf.len() >= end).then_some(end)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_admits_the_user_and_password_and_nothing_else() {
        let credentials = Credentials {
            user: "outboxlab".into(),
            password: "s3cret".into(),
        };
        assert!(plain_credentials_match(
            b"\0outboxlab\0s3cret",
            &credentials
        ));
        assert!(plain_credentials_match(
            b"outboxlab\0outboxlab\0s3cret",
            &credentials
        ));
        for refused in [
            &b"\0outboxlab\0wrong"[..],
            b"\0other\0s3cret",
            b"\0outboxlab\0s3cret\0more",
            b"outboxlab\0s3cret",
            b"",
        ] {
            assert!(
                !plain_credentials_match(refused, &credentials),
                "{refused:?}"
            );
        }
    }
}
