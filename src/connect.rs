//! Connecting to the servers, for every part of outbox-lab: PostgreSQL (a connection string
//! parsed, a connection opened, one that hands over LISTEN notifications), Redis, NATS, AMQP
//! (RabbitMQ) and Kafka — each
//! bounded in time, each failure saying where it tried and what to check.

use std::str::FromStr;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use tokio_postgres::tls::NoTlsStream;
use tokio_postgres::{AsyncMessage, Client, Config, Connection, NoTls, Notification, Socket};

use crate::secrets;

/// A server that has not answered in this time is reported unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// `bytes` as a URL component: unreserved characters as they are, every other byte `%XX` (a
/// socket directory as a URL's host, as libpq reads it; a user name, a password).
pub fn percent_encode(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|&b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Parses a connection string (URL or key=value form) with a message that says what to fix
/// (the password masked). Without a password of its own it takes `PGPASSWORD`'s, as libpq
/// does: a child whose command line names the database without its password gets it so.
pub fn parse_url(url: &str) -> Result<Config> {
    let mut config = Config::from_str(url)
        .map_err(|e| anyhow!("invalid --database-url '{}': {e}", secrets::redact(url)))?;
    if config.get_password().is_none() {
        if let Some(password) = std::env::var_os("PGPASSWORD") {
            config.password(password.as_encoded_bytes());
        }
    }
    Ok(config)
}

/// Connects, with a bound on the wait, and drives the connection on a task.
pub async fn postgres(config: &Config) -> Result<Client> {
    let (client, connection) = open(config).await?;
    tokio::spawn(async move {
        // The connection ends when the client is dropped, or when the server goes: both expected.
        let _ = connection.await;
    });
    Ok(client)
}

/// How long an actor waits for its database to come back (a server restarting after a crash)
/// before it gives up: a bound, so that a server that is gone for good ends the actor.
pub const RECONNECT_PATIENCE: Duration = Duration::from_secs(15);

/// Tries `attempt` (a connection and what is set up on it) until it works, every 50 ms for at
/// most `limit`: an actor waits for its database to come back, as a service would; after the
/// limit, the last error.
pub async fn patiently<T>(
    limit: Duration,
    mut attempt: impl AsyncFnMut() -> Result<T>,
) -> Result<T> {
    let mut last = None;
    let done = crate::wait::up_to(limit, Duration::from_millis(50), async || {
        match attempt().await {
            Ok(value) => Ok(Some(value)),
            Err(e) => {
                last = Some(e);
                Ok(None)
            }
        }
    })
    .await?;
    done.ok_or_else(|| {
        last.expect("up_to tries at least once")
            .context(format!("still failing after {limit:?}"))
    })
}

/// Whether `error` means the connection is gone (the server ended the session, crashed or is
/// restarting: SQLSTATE class 57), rather than a statement failing on a live one.
pub fn lost_connection(error: &anyhow::Error) -> bool {
    error.chain().any(|e| {
        e.downcast_ref::<tokio_postgres::Error>().is_some_and(|e| {
            e.is_closed() || e.code().is_some_and(|code| code.code().starts_with("57P"))
        })
    })
}

/// Connects and forwards the connection's notifications (LISTEN/NOTIFY) to the receiver; the
/// receiver ends when the connection does.
pub async fn postgres_listening(
    config: &Config,
) -> Result<(Client, UnboundedReceiver<Notification>)> {
    let (client, mut connection) = open(config).await?;
    let (sender, receiver) = unbounded_channel();
    tokio::spawn(async move {
        // poll_message drives the connection and hands over what the server sends unasked.
        while let Some(message) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            match message {
                Ok(AsyncMessage::Notification(n)) => {
                    if sender.send(n).is_err() {
                        break;
                    }
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
    });
    Ok((client, receiver))
}

async fn open(config: &Config) -> Result<(Client, Connection<Socket, NoTlsStream>)> {
    let mut config = config.clone();
    config.connect_timeout(CONNECT_TIMEOUT);
    tokio::time::timeout(CONNECT_TIMEOUT, config.connect(NoTls))
        .await
        .map_err(|_| anyhow!("no answer within {CONNECT_TIMEOUT:?}"))
        .and_then(|r| r.map_err(anyhow::Error::from))
        .with_context(|| format!("cannot connect to PostgreSQL at {}", describe(&config)))
}

fn describe(config: &Config) -> String {
    let host = config
        .get_hosts()
        .first()
        .map(|h| match h {
            tokio_postgres::config::Host::Tcp(h) => h.clone(),
            tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
        })
        .unwrap_or_else(|| "localhost".into());
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!("{host}:{port} (is the server running? check --database-url)")
}

/// A connection, with a bound on the wait and a message that says where (the password
/// masked). Which flag gave the URL is for the caller to say.
pub async fn redis(url: &str) -> Result<redis::aio::MultiplexedConnection> {
    let shown = secrets::redact(url);
    let client =
        redis::Client::open(url).map_err(|e| anyhow!("invalid Redis URL '{shown}': {e}"))?;
    tokio::time::timeout(
        Duration::from_secs(5),
        client.get_multiplexed_async_connection(),
    )
    .await
    .map_err(|_| anyhow!("no answer within 5 s"))
    .and_then(|r| r.map_err(anyhow::Error::from))
    .with_context(|| format!("cannot connect to Redis at {shown} (is it running?)"))
}

/// A NATS connection, with a bound on the wait and a message that says where (its token or
/// password masked; which flag gave the URL is for the caller to say). The URL's user part is
/// the credentials: `TOKEN@` or `USER:PASSWORD@` (async-nats reads neither from the URL
/// itself). Several URLs, separated by commas, are the nodes of one cluster (the first one's
/// credentials for all): the client connects to one and fails over to the others.
pub async fn nats(url: &str) -> Result<async_nats::Client> {
    let addrs = url
        .split(',')
        .map(|one| one.trim().parse::<async_nats::ServerAddr>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow!("invalid NATS URL '{}': {e}", secrets::redact(url)))?;
    let mut options = async_nats::ConnectOptions::new().connection_timeout(CONNECT_TIMEOUT);
    options = match (addrs[0].username(), addrs[0].password()) {
        (Some(user), Some(password)) => options.user_and_password(user.into(), password.into()),
        (Some(token), None) => options.token(token.into()),
        _ => options,
    };
    tokio::time::timeout(CONNECT_TIMEOUT, options.connect(addrs))
        .await
        .map_err(|_| anyhow!("no answer within 5 s"))
        .and_then(|r| r.map_err(anyhow::Error::from))
        .with_context(|| {
            format!(
                "cannot connect to NATS at {} (is it running?)",
                secrets::redact(url)
            )
        })
}

/// An AMQP connection (`amqp://USER:PASSWORD@HOST:PORT/%2f`), with a bound on the wait and a
/// message that says where (the password masked; which flag gave the URL is for the caller to
/// say).
pub async fn amqp(url: &str) -> Result<lapin::Connection> {
    let uri: lapin::uri::AMQPUri = url
        .parse()
        .map_err(|e| anyhow!("invalid AMQP URL '{}': {e}", secrets::redact(url)))?;
    tokio::time::timeout(
        CONNECT_TIMEOUT,
        lapin::Connection::connect_uri(uri, lapin::ConnectionProperties::default()),
    )
    .await
    .map_err(|_| anyhow!("no answer within 5 s"))
    .and_then(|r| r.map_err(anyhow::Error::from))
    .with_context(|| {
        format!(
            "cannot connect to RabbitMQ at {} (is it running?)",
            secrets::redact(url)
        )
    })
}

/// A Kafka-protocol client (`kafka://[USER:PASSWORD@]HOST:PORT[,HOST:PORT…]`: its bootstrap
/// brokers; with a user, SASL PLAIN), with a bound on the wait and a message that says where
/// (the password masked). rskafka connects to the brokers the bootstrap one advertises.
pub async fn kafka(url: &str) -> Result<rskafka::client::Client> {
    let shown = secrets::redact(url);
    let KafkaUrl {
        brokers,
        credentials,
    } = kafka_url(url).map_err(|e| anyhow!("invalid Kafka URL '{shown}': {e}"))?;
    let anonymous = credentials.is_none();
    let mut builder = rskafka::client::ClientBuilder::new(brokers);
    if let Some((username, password)) = credentials {
        builder = builder.sasl_config(rskafka::client::SaslConfig::Plain(
            rskafka::client::Credentials { username, password },
        ));
    }
    tokio::time::timeout(CONNECT_TIMEOUT, builder.build())
        .await
        .map_err(|_| anyhow!("no answer within 5 s"))
        .and_then(|r| r.map_err(anyhow::Error::from))
        .with_context(|| match anonymous {
            // A broker that asks for SASL closes the connection of a client that does not
            // authenticate: say so, since the URL most likely came from a command line.
            true => format!(
                "cannot connect to Kafka at {shown} (is it running? the URL names no SASL user \
                 and password: a broker that asks for them, as outbox-lab's own does, closes \
                 the connection; verify gives them in OUTBOX_LAB_KAFKA_URL and \
                 OUTBOX_LAB_SINK_URL, never on a command line)"
            ),
            false => format!("cannot connect to Kafka at {shown} (is it running?)"),
        })
}

/// What a Kafka URL names.
pub struct KafkaUrl {
    /// The bootstrap brokers, `HOST:PORT` each.
    pub brokers: Vec<String>,
    /// SASL PLAIN's user and password, if it names them.
    pub credentials: Option<(String, String)>,
}

/// A Kafka URL's bootstrap brokers and its SASL PLAIN user and password, if it names them
/// (percent-encoded, as in any URL).
pub fn kafka_url(url: &str) -> Result<KafkaUrl, String> {
    let rest = url
        .strip_prefix("kafka://")
        .ok_or("not a kafka:// URL")?
        .trim_end_matches('/');
    let (userinfo, hosts) = match rest.rsplit_once('@') {
        Some((userinfo, hosts)) => (Some(userinfo), hosts),
        None => (None, rest),
    };
    let credentials = match userinfo {
        None => None,
        Some(userinfo) => {
            let (user, password) = userinfo
                .split_once(':')
                .ok_or("a user without a password (give USER:PASSWORD@)")?;
            let decode = |part: &str| {
                percent_encoding::percent_decode_str(part)
                    .decode_utf8()
                    .map(|decoded| decoded.into_owned())
                    .map_err(|_| format!("'{part}' is not UTF-8 once percent-decoded"))
            };
            Some((decode(user)?, decode(password)?))
        }
    };
    let brokers: Vec<String> = hosts.split(',').map(|h| h.trim().to_string()).collect();
    for broker in &brokers {
        match broker.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {}
            _ => return Err(format!("'{broker}' is not HOST:PORT")),
        }
    }
    Ok(KafkaUrl {
        brokers,
        credentials,
    })
}
