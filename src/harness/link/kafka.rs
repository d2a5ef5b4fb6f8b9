//! The door of a Kafka-protocol broker that has no authentication of its own (the private
//! tansu, in a network namespace of its own: [`netns`](crate::harness::netns)), on the Kafka
//! wire (frames: a 4-byte length, then a request or its response, in order on a connection):
//! [`KafkaLink`], on 127.0.0.1, the only way in, admits a client once it has passed SASL PLAIN
//! with the run's user and password, then passes its bytes both ways untouched. The broker
//! advertises the link's address, so every client comes back through it. Before a client has
//! authenticated it passes on ApiVersions alone (what a client asks first, which tells it the
//! broker takes SASL), answers SaslHandshake (v1: PLAIN) and SaslAuthenticate itself, and closes
//! the connection on anything else, as a Kafka broker requiring SASL does. The delivery proxy in
//! front of it, per relay, is [`kafka_proxy`](super::kafka_proxy); the wire's framing is here,
//! for both.
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use anyhow::{anyhow, bail, Result};
use bytes::{Bytes, BytesMut};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{
    ApiKey, RequestHeader, ResponseHeader, SaslAuthenticateRequest, SaslAuthenticateResponse,
    SaslHandshakeRequest, SaslHandshakeResponse,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

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
pub(super) fn ack_at_once(stream: &TcpStream) {
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

/// Where the frame starting at `at` ends, if it is all there.
pub(super) fn frame_end(buf: &[u8], at: usize) -> Option<usize> {
    let length = buf.get(at..at + 4)?;
    let end = at + 4 + u32::from_be_bytes(length.try_into().ok()?) as usize;
    (buf.len() >= end).then_some(end)
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
