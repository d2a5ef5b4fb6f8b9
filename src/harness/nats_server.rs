//! NATS JetStream for the broker scenarios: `--nats-url`, or else a private `nats-server -js`
//! in a [`throwaway`] directory, started on first use and stopped at the end ([`OnDemand`]);
//! and a private 3-node cluster ([`NatsCluster`]) for the scenario that kills its nodes. Here
//! what is NATS' own: starting its servers, its subject prefix, deleting this run's streams.
//!
//! nats-server has no Unix socket: the private one listens on 127.0.0.1, on a port it picks
//! itself (`port: -1`, told back in its ports file), and requires a random token that only its
//! 0600 configuration file and our children's environment hold. Any local user can reach the
//! port; none gets in without the token.
//!
//! On a private server the subjects carry the article's names (`outbox.event.orders`). On an
//! external one every stream and consumer is named `outboxlab_<run>_…` and every subject starts
//! with `outboxlab.<run>.`; those streams alone (their consumers with them) are deleted at the
//! end, so nothing of the user's is touched.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use futures_util::TryStreamExt;
use nix::sys::signal::Signal;
use nix::unistd::User;

use crate::connect;
use crate::error::Error;
use crate::harness::on_demand::{find_program, run_prefix, OnDemand, PrivateServer};
use crate::harness::ports;
use crate::harness::server::{write_owned, Server};
use crate::harness::throwaway::{self, RunDir};
use crate::wait;

/// nats-server with JetStream listens within a second of starting; this bounds a wedged start.
const START_TIMEOUT: Duration = Duration::from_secs(15);
/// The server's log, in our part of the run directory.
const LOG: &str = "nats.log";
/// Its configuration (the token in it), in our part of the run directory.
const CONFIG: &str = "nats.conf";
/// JetStream's store, in the server's part.
const STORE_DIR: &str = "jetstream";
/// How often a starting server is asked whether it is ready.
const READY_POLL: Duration = Duration::from_millis(10);

/// A private nats-server with JetStream, on 127.0.0.1 behind a token, run as the unprivileged
/// server user when we are root; dropping it stops it and removes its directory, unless kept.
struct NatsServer {
    server: Server,
    /// `nats://TOKEN@127.0.0.1:PORT`: what the run and its children connect with.
    url: String,
}

impl PrivateServer for NatsServer {
    const NAME: &'static str = "NATS";
    const NAMES: &'static str = "streams";
    const SEPARATOR: char = '_';
    const SETUP: &'static str = "install it with scripts/setup (apt-get install nats-server); \
                                 `scenario` can use a server of yours instead (--nats-url)";

    async fn start(keep: bool) -> Result<NatsServer> {
        let binary = find_nats_server()?;
        let run_as = throwaway::server_user()?;
        let mut server =
            Server::prepare("nats", "nats-server", Signal::SIGTERM, LOG, run_as.as_ref())?;
        let token = throwaway::random_secret();
        let ports_dir = server.run_dir().server_dir();
        let text = format!(
            "{}ports_file_dir: \"{}\"\n",
            config_common(server.run_dir(), "-1", &token),
            ports_dir.display()
        );
        let config = write_owned(server.run_dir(), CONFIG, 0o600, &text, run_as.as_ref())?;
        let mut url = None;
        let found = &mut url;
        let ready = async || {
            // The ports file appears once the server listens; then JetStream must answer.
            let Some(port) = listening_port(&ports_dir) else {
                return Ok(false);
            };
            let candidate = format!("nats://{token}@127.0.0.1:{port}");
            let answered = jetstream_answers(&candidate).await.is_ok();
            if answered {
                *found = Some(candidate);
            }
            Ok(answered)
        };
        server
            .start(
                server_command(&binary, &config),
                run_as.as_ref(),
                START_TIMEOUT,
                READY_POLL,
                ready,
            )
            .await?;
        server.set_kept(keep)?;
        let url = url.context("nats-server was ready without a port")?;
        Ok(NatsServer { server, url })
    }

    fn url(&self) -> String {
        self.url.clone()
    }

    fn kept(&mut self) -> Option<String> {
        let dir = self.server.run_dir().path();
        self.server.is_kept().then(|| {
            format!(
                "NATS server running in {}: {}, its token in {}",
                dir.display(),
                crate::secrets::without_secrets(&self.url),
                dir.join(CONFIG).display()
            )
        })
    }
}

/// `nats-server -c CONFIG`.
fn server_command(binary: &Path, config: &Path) -> Command {
    let mut cmd = Command::new(binary);
    cmd.arg("-c").arg(config);
    cmd
}

/// The nodes of a [`NatsCluster`]: the fewest that keep a quorum with one node down.
pub const CLUSTER_NODES: usize = 3;
/// A cluster is ready once an R3 stream can be created: its meta leader is elected and every
/// node has joined. Elections take seconds.
const CLUSTER_READY_TIMEOUT: Duration = Duration::from_secs(30);
/// The stream that proves the cluster ready; deleted at once.
const READY_STREAM: &str = "outboxlab_cluster_ready";

/// A private 3-node JetStream cluster (broker-cluster): each node a nats-server in a
/// [`throwaway`] directory of its own (so that a killed run's nodes are reaped one by one), on
/// 127.0.0.1 ports picked free before the start (routes name each other's, and a restarted node
/// takes its own again), the same token for clients, a random user and password on the
/// routes, a JetStream store each. Dropping it stops every node and removes its directory,
/// unless kept.
pub struct NatsCluster {
    nodes: Vec<ClusterNode>,
    binary: PathBuf,
    run_as: Option<User>,
    token: String,
}

/// One node of a [`NatsCluster`].
struct ClusterNode {
    /// Its `server_name`: what a stream's info names as its leader.
    name: String,
    server: Server,
    config: PathBuf,
    client_port: u16,
}

impl NatsCluster {
    /// Starts the nodes one after another, then waits until the cluster can hold an R3 stream;
    /// again on fresh ports if one of its ports was taken meanwhile.
    async fn start(binary: PathBuf, keep: bool) -> Result<NatsCluster> {
        ports::on_free_ports(async |ports| Self::start_on(binary.clone(), ports, keep).await).await
    }

    /// Starts the cluster on `ports`: the nodes' client ports, then their route ports.
    async fn start_on(
        binary: PathBuf,
        ports: [u16; 2 * CLUSTER_NODES],
        keep: bool,
    ) -> Result<NatsCluster> {
        let run_as = throwaway::server_user()?;
        let token = throwaway::random_secret();
        let (route_user, route_password) = (throwaway::random_secret(), throwaway::random_secret());
        let (client_ports, route_ports) = ports.split_at(CLUSTER_NODES);
        let routes: Vec<String> = route_ports
            .iter()
            .map(|port| format!("\"nats-route://{route_user}:{route_password}@127.0.0.1:{port}\""))
            .collect();
        let mut cluster = NatsCluster {
            nodes: Vec::with_capacity(CLUSTER_NODES),
            binary,
            run_as,
            token,
        };
        for (i, (&client_port, &route_port)) in client_ports.iter().zip(route_ports).enumerate() {
            let name = format!("n{i}");
            let server = Server::prepare(
                "nats-cluster",
                "nats-server",
                Signal::SIGTERM,
                LOG,
                cluster.run_as.as_ref(),
            )?;
            let text = format!(
                "{}server_name: \"{name}\"\n\
                 cluster {{\n  name: \"outboxlab\"\n  listen: \"127.0.0.1:{route_port}\"\n  \
                 authorization {{\n    user: \"{route_user}\"\n    password: \"{route_password}\"\n  }}\n  \
                 routes: [\n    {}\n  ]\n}}\n",
                config_common(server.run_dir(), &client_port.to_string(), &cluster.token),
                routes.join("\n    "),
            );
            let config = write_owned(
                server.run_dir(),
                CONFIG,
                0o600,
                &text,
                cluster.run_as.as_ref(),
            )?;
            cluster.nodes.push(ClusterNode {
                name,
                server,
                config,
                client_port,
            });
            cluster.start_node(i).await?;
            cluster.nodes[i].server.set_kept(keep)?;
        }
        cluster.wait_ready().await?;
        Ok(cluster)
    }

    /// Every node's URL with the token, comma-separated ([`connect::nats`] takes the list): a
    /// client connected with it fails over to another node.
    pub fn url(&self) -> String {
        self.nodes
            .iter()
            .map(|node| self.node_url(node))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn node_url(&self, node: &ClusterNode) -> String {
        format!("nats://{}@127.0.0.1:{}", self.token, node.client_port)
    }

    /// Kills node `name` with SIGKILL, as a crash would: its directory, store and ports stay
    /// for [`NatsCluster::restart`].
    pub async fn kill(&mut self, name: &str) -> Result<()> {
        let i = self.index(name)?;
        self.nodes[i].server.crash(START_TIMEOUT).await
    }

    /// Starts node `name` again, on its ports, with its store: ready once it lets a client in.
    pub async fn restart(&mut self, name: &str) -> Result<()> {
        let i = self.index(name)?;
        self.start_node(i).await
    }

    fn index(&self, name: &str) -> Result<usize> {
        self.nodes
            .iter()
            .position(|node| node.name == name)
            .ok_or_else(|| anyhow!("the cluster has no node named {name}"))
    }

    /// Starts node `i`: ready once it lets a client in with the token.
    async fn start_node(&mut self, i: usize) -> Result<()> {
        let url = self.node_url(&self.nodes[i]);
        let cmd = server_command(&self.binary, &self.nodes[i].config);
        let ready = async || Ok(jetstream_answers(&url).await.is_ok());
        self.nodes[i]
            .server
            .start(cmd, self.run_as.as_ref(), START_TIMEOUT, READY_POLL, ready)
            .await
    }

    /// Waits until an R3 stream can be created (and deletes it).
    async fn wait_ready(&self) -> Result<()> {
        let jetstream = async_nats::jetstream::new(connect::nats(&self.url()).await?);
        let created = wait::up_to(
            CLUSTER_READY_TIMEOUT,
            Duration::from_millis(100),
            async || {
                let config = async_nats::jetstream::stream::Config {
                    name: READY_STREAM.into(),
                    subjects: vec![READY_STREAM.into()],
                    num_replicas: CLUSTER_NODES,
                    ..Default::default()
                };
                Ok(jetstream.create_stream(config).await.ok().map(drop))
            },
        )
        .await?;
        if created.is_none() {
            bail!(
                "the {CLUSTER_NODES}-node NATS cluster could not hold a replicated stream within \
                 {CLUSTER_READY_TIMEOUT:?} (no JetStream leader elected)"
            );
        }
        jetstream
            .delete_stream(READY_STREAM)
            .await
            .map_err(|e| anyhow!("cannot delete JetStream stream {READY_STREAM}: {e}"))?;
        Ok(())
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        let Some(node) = self.nodes.first() else {
            return;
        };
        if node.server.is_kept() {
            crate::errln!(
                "kept the private NATS cluster running in {}: {}, the token in each node's {CONFIG}; \
                 remove it with `outbox-lab clean`",
                self.nodes
                    .iter()
                    .map(|n| n.server.run_dir().path().display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                crate::secrets::without_secrets(&self.url()),
            );
        }
    }
}

/// What every private server's configuration says: 127.0.0.1 only, on `port` (`-1`: one of
/// its choosing), the token required, JetStream stored in the server's part of the run
/// directory.
fn config_common(run: &RunDir, port: &str, token: &str) -> String {
    format!(
        "host: \"127.0.0.1\"\n\
         port: {port}\n\
         authorization {{\n  token: \"{token}\"\n}}\n\
         jetstream {{\n  store_dir: \"{store}\"\n  max_memory_store: 64MB\n  max_file_store: 1GB\n}}\n",
        store = run.server_dir().join(STORE_DIR).display(),
    )
}

/// The client port from the server's ports file (`nats-server_<pid>.ports`), once written.
fn listening_port(dir: &Path) -> Option<u16> {
    let entries = std::fs::read_dir(dir).ok()?;
    let ports_file = entries
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "ports"))?;
    let ports: serde_json::Value =
        serde_json::from_str(&throwaway::read_no_follow(&ports_file)).ok()?;
    let client = ports["nats"].as_array()?.first()?.as_str()?;
    client.rsplit(':').next()?.parse().ok()
}

fn find_nats_server() -> Result<PathBuf> {
    find_program("nats-server", &["/usr/sbin", "/usr/bin"], NatsServer::SETUP)
}

/// Connects with the token: the server is up, lets us in, and says JetStream is on (it
/// listens only once JetStream has started).
async fn jetstream_answers(url: &str) -> Result<()> {
    let client = connect::nats(url).await?;
    if !client.server_info().jetstream {
        bail!("nats-server runs without JetStream");
    }
    Ok(())
}

/// The NATS of a run (see [`OnDemand`]).
pub struct Nats {
    server: OnDemand<NatsServer>,
    /// Before every subject on an external server (`outboxlab.<run>.`); empty on the private
    /// one.
    subject_prefix: String,
}

impl Nats {
    pub fn new(external: Option<&str>, run_id: &str, keep: bool) -> Nats {
        Nats {
            server: OnDemand::new(external, run_id, keep),
            subject_prefix: run_prefix(external, run_id, '.'),
        }
    }

    /// The server's URL (the private one's carries its token), starting the private server on
    /// first use.
    pub async fn url(&self) -> Result<String> {
        self.server.url().await
    }

    /// A private [`NatsCluster`] of its own, started now and stopped when dropped: a scenario
    /// that kills nodes never runs on `--nats-url`'s server.
    pub async fn cluster(&self) -> Result<NatsCluster> {
        // nats-server missing is the environment's fault; a cluster that fails to start, ours.
        let binary = find_nats_server().map_err(|e| anyhow::Error::from(Error::Usage(e)))?;
        NatsCluster::start(binary, self.server.keep()).await
    }

    /// What every stream and consumer name of this run starts with (`outboxlab_<run>_` on an
    /// external server).
    pub fn name_prefix(&self) -> &str {
        self.server.prefix()
    }

    /// What every subject of this run starts with.
    pub fn subject_prefix(&self) -> &str {
        &self.subject_prefix
    }

    /// Deletes this run's streams (and so their consumers) from an external server; the
    /// private one goes away whole.
    pub async fn close(self) -> Result<()> {
        self.server.close(true, delete_streams).await
    }
}

/// Deletes the streams whose names start with `prefix` from the server at `url`.
async fn delete_streams(url: String, prefix: String) -> Result<()> {
    let jetstream = async_nats::jetstream::new(connect::nats(&url).await?);
    let names: Vec<String> = jetstream
        .stream_names()
        .try_collect()
        .await
        .map_err(|e| anyhow!("cannot list the NATS streams: {e}"))?;
    for name in names.iter().filter(|n| n.starts_with(&prefix)) {
        jetstream
            .delete_stream(name)
            .await
            .map_err(|e| anyhow!("cannot delete NATS stream {name}: {e}"))?;
    }
    Ok(())
}
