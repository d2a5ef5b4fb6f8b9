//! RabbitMQ for the broker scenarios: `--amqp-url`, or else a private `rabbitmq-server` in
//! [`throwaway`] directories, started on first use and stopped at the end ([`OnDemand`]); here
//! what is RabbitMQ's own: starting it, its crash, the queues this run declared.
//!
//! The private broker is a node of its own (`outboxlab-<random>@localhost`) that shares nothing
//! with a system RabbitMQ: its mnesia and log directories, its configuration and Erlang cookie
//! are in its run directory, and Erlang's port mapper is a private `epmd` of ours (in a second
//! throwaway directory), not the system daemon that Erlang would otherwise start and leave
//! behind. Everything listens on 127.0.0.1 alone, on ports we pick: AMQP, the node's
//! distribution port and epmd's (epmd adds ::1, loopback too). The broker's only user has a
//! random name and password, known to its 0600 configuration file and our children's
//! environment; there is no guest.
//!
//! broker-confirms kills the broker with SIGKILL and starts it again ([`Amqp::crash_and_restart`]):
//! the same ports, directories and credentials, so durable queues and persistent messages come
//! back.
//!
//! On a private broker the queues carry the article's names (`outbox.event.orders`). On an
//! external one every queue is named `outboxlab_<run>_…`; AMQP cannot list queues, so the run
//! deletes at the end the ones it declared ([`Amqp::declare_queue`]), and nothing of the user's
//! is touched.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::outbox::sink::AmqpSink;
use anyhow::{anyhow, bail, Context, Result};
use lapin::options::QueueDeleteOptions;
use nix::sys::signal::Signal;
use nix::unistd::User;

use crate::connect;
use crate::error::Error;
use crate::harness::on_demand::{find_program, OnDemand, PrivateServer};
use crate::harness::server::{write_owned, Server};
use crate::harness::{ports, throwaway};

/// RabbitMQ 3.10 boots in 5 to 10 s on a busy 2-core machine (mnesia, the message stores);
/// this bounds a wedged start.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// epmd listens within milliseconds.
const EPMD_START_TIMEOUT: Duration = Duration::from_secs(10);
/// A SIGKILLed broker is gone at once; collecting it is bounded all the same.
const CRASH_TIMEOUT: Duration = Duration::from_secs(10);
/// The broker's log (its console output), in our part of its run directory.
const LOG: &str = "rabbitmq.log";
/// epmd's output, in our part of its run directory.
const EPMD_LOG: &str = "epmd.log";
/// Its configuration (the password in it), in our part of the run directory.
const CONFIG: &str = "rabbitmq.conf";
/// Its plugin list (none), in our part of the run directory.
const PLUGINS: &str = "enabled_plugins";
/// The node's Erlang cookie, in the run directory that is the node's HOME.
const COOKIE: &str = ".erlang.cookie";
/// The script that starts the broker, as Debian installs it.
const RABBITMQ_SERVER: &str = "/usr/lib/rabbitmq/bin/rabbitmq-server";
/// The virtual host of every URL: `/`, percent-encoded.
const VHOST: &str = "%2f";

/// A private rabbitmq-server and its epmd, on 127.0.0.1 behind random credentials, run as the
/// unprivileged server user when we are root; dropping it stops both (the broker first) and
/// removes their directories, unless kept.
struct RabbitServer {
    /// The `rabbitmq-server` script, leader of a process group that holds the Erlang VM;
    /// behind a lock for [`RabbitServer::crash_and_restart`].
    broker: tokio::sync::Mutex<Server>,
    /// The node's port mapper: dropped after the broker.
    epmd: Server,
    /// How the broker is started, again after a crash.
    launch: Launch,
    run_as: Option<User>,
    /// `amqp://USER:PASSWORD@127.0.0.1:PORT/%2f`: what the run and its children connect with.
    url: String,
}

/// The broker's command line and environment, the same at every start (nothing else of ours:
/// no ERL_FLAGS or RABBITMQ_* of the caller's changes the node, see [`as_server_user`](crate::harness::server::as_server_user)).
struct Launch {
    program: PathBuf,
    env: Vec<(&'static str, OsString)>,
}

impl Launch {
    fn command(&self) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd
    }
}

impl PrivateServer for RabbitServer {
    const NAME: &'static str = "RabbitMQ";
    const NAMES: &'static str = "queues";
    const SEPARATOR: char = '_';
    const SETUP: &'static str = "install it with scripts/setup (apt-get install rabbitmq-server); \
                                 `scenario` can use a broker of yours instead (--amqp-url)";

    async fn start(keep: bool) -> Result<RabbitServer> {
        if !Path::new(RABBITMQ_SERVER).is_file() {
            bail!("{RABBITMQ_SERVER} not found: {}", Self::SETUP);
        }
        let epmd_binary = find_program("epmd", &["/usr/bin"], Self::SETUP)?;
        ports::on_free_ports(async |ports| Self::start_on(&epmd_binary, ports, keep).await).await
    }

    fn url(&self) -> String {
        self.url.clone()
    }

    fn kept(&mut self) -> Option<String> {
        let broker = self.broker.get_mut();
        let dir = broker.run_dir().path();
        broker.is_kept().then(|| {
            format!(
                "RabbitMQ running in {} (its epmd in {}): {}, its password in {}",
                dir.display(),
                self.epmd.run_dir().path().display(),
                crate::secrets::without_secrets(&self.url),
                dir.join(CONFIG).display()
            )
        })
    }
}

impl RabbitServer {
    /// Starts epmd and the broker on `ports` (epmd's, AMQP's, the Erlang distribution's).
    async fn start_on(
        epmd_binary: &Path,
        [epmd_port, amqp_port, dist_port]: [u16; 3],
        keep: bool,
    ) -> Result<RabbitServer> {
        let run_as = throwaway::server_user()?;

        let mut epmd = Server::prepare("epmd", "epmd", Signal::SIGTERM, EPMD_LOG, run_as.as_ref())?;
        let mut cmd = Command::new(epmd_binary);
        // In the foreground (no -daemon): a process of ours, stopped with the broker.
        cmd.args(["-port", &epmd_port.to_string(), "-address", "127.0.0.1"]);
        let every = Duration::from_millis(10);
        let listens = async || Ok(std::net::TcpStream::connect(("127.0.0.1", epmd_port)).is_ok());
        epmd.start(cmd, run_as.as_ref(), EPMD_START_TIMEOUT, every, listens)
            .await?;
        epmd.set_kept(keep)?;

        let mut broker = Server::prepare(
            "rabbitmq",
            "rabbitmq-server",
            // The script's trap stops the node in order (rabbitmqctl stop's way).
            Signal::SIGTERM,
            LOG,
            run_as.as_ref(),
        )?;
        let user = format!("outboxlab-{}", &throwaway::random_secret()[..12]);
        let password = throwaway::random_secret();
        let run = broker.run_dir();
        let config = write_owned(
            run,
            CONFIG,
            0o600,
            &format!(
                "default_user = {user}\n\
                 default_pass = {password}\n\
                 listeners.tcp.1 = 127.0.0.1:{amqp_port}\n"
            ),
            run_as.as_ref(),
        )?;
        let plugins = write_owned(run, PLUGINS, 0o600, "[].\n", run_as.as_ref())?;
        // Erlang reads the cookie from $HOME and refuses one that others may read.
        write_owned(
            run,
            COOKIE,
            0o400,
            &throwaway::random_secret(),
            run_as.as_ref(),
        )?;
        let server_dir = run.server_dir();
        let node = format!("outboxlab-{}@localhost", &throwaway::random_secret()[..12]);
        let launch = Launch {
            program: PathBuf::from(RABBITMQ_SERVER),
            env: vec![
                ("HOME", run.path().into()),
                ("ERL_EPMD_PORT", epmd_port.to_string().into()),
                ("RABBITMQ_NODENAME", node.into()),
                ("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1".into()),
                ("RABBITMQ_NODE_PORT", amqp_port.to_string().into()),
                ("RABBITMQ_DIST_PORT", dist_port.to_string().into()),
                (
                    "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS",
                    // No busy waiting in Erlang's idle schedulers: on 2 cores an idle broker
                    // spun a core's fifth away from the cells measured beside it.
                    "-kernel inet_dist_use_interface {127,0,0,1} +sbwt none +sbwtdcpu none \
                     +sbwtdio none"
                        .into(),
                ),
                ("RABBITMQ_MNESIA_BASE", server_dir.join("mnesia").into()),
                ("RABBITMQ_LOG_BASE", server_dir.join("log").into()),
                // Its console output: our log, through the descriptor it inherits.
                ("RABBITMQ_LOGS", "-".into()),
                ("RABBITMQ_PID_FILE", server_dir.join("rabbitmq.pid").into()),
                ("RABBITMQ_CONFIG_FILE", config.into()),
                (
                    "RABBITMQ_ADVANCED_CONFIG_FILE",
                    server_dir.join("advanced.config").into(),
                ),
                ("RABBITMQ_ENABLED_PLUGINS_FILE", plugins.into()),
                // Not the system's /etc/rabbitmq/rabbitmq-env.conf (not a regular file: skipped).
                ("RABBITMQ_CONF_ENV_FILE", "/dev/null".into()),
            ],
        };
        let url = format!("amqp://{user}:{password}@127.0.0.1:{amqp_port}/{VHOST}");
        start_broker(&mut broker, &launch, run_as.as_ref(), &url).await?;
        broker.set_kept(keep)?;
        Ok(RabbitServer {
            broker: tokio::sync::Mutex::new(broker),
            epmd,
            launch,
            run_as,
            url,
        })
    }

    /// SIGKILL to the broker's process group (the Erlang VM in it), then the broker started
    /// again on the same ports, directories and credentials; how long until it let us in.
    async fn crash_and_restart(&self) -> Result<Duration> {
        let mut broker = self.broker.lock().await;
        broker.crash(CRASH_TIMEOUT).await?;
        let clock = Instant::now();
        start_broker(&mut broker, &self.launch, self.run_as.as_ref(), &self.url).await?;
        Ok(clock.elapsed())
    }
}

/// Starts the broker; it is ready once an AMQP connection with its credentials succeeds.
async fn start_broker(
    broker: &mut Server,
    launch: &Launch,
    run_as: Option<&User>,
    url: &str,
) -> Result<()> {
    let every = Duration::from_millis(100);
    let lets_in = async || Ok(connect::amqp(url).await.is_ok());
    broker
        .start(launch.command(), run_as, START_TIMEOUT, every, lets_in)
        .await
}

/// The RabbitMQ of a run (see [`OnDemand`]).
pub struct Amqp {
    server: OnDemand<RabbitServer>,
    /// The queues this run declared, deleted from an external broker at the end.
    declared: Mutex<Vec<String>>,
}

impl Amqp {
    pub fn new(external: Option<&str>, run_id: &str, keep: bool) -> Amqp {
        Amqp {
            server: OnDemand::new(external, run_id, keep),
            declared: Mutex::new(Vec::new()),
        }
    }

    /// The broker's URL, with its credentials, starting the private broker on first use.
    pub async fn url(&self) -> Result<String> {
        self.server.url().await
    }

    /// What every queue name of this run starts with (`outboxlab_<run>_` on an external
    /// broker).
    pub fn name_prefix(&self) -> &str {
        self.server.prefix()
    }

    /// Declares the durable queue `name` (this run's prefix before it) afresh, deleting what an
    /// earlier declaration held; returns its full name.
    pub async fn declare_queue(&self, name: &str) -> Result<String> {
        let full = format!("{}{name}", self.name_prefix());
        let connection = connect::amqp(&self.url().await?).await?;
        let channel = connection.create_channel().await?;
        AmqpSink::redeclare_queue(&channel, &full).await?;
        let _ = connection.close(200, "declared".into()).await;
        let mut declared = self.declared.lock().unwrap_or_else(|e| e.into_inner());
        if !declared.contains(&full) {
            declared.push(full.clone());
        }
        Ok(full)
    }

    /// Empties queue `full` (a name [`Amqp::declare_queue`] returned), keeping its definition.
    pub async fn purge_queue(&self, full: &str) -> Result<()> {
        let connection = connect::amqp(&self.url().await?).await?;
        let channel = connection.create_channel().await?;
        channel
            .queue_purge(full.into(), lapin::options::QueuePurgeOptions::default())
            .await
            .with_context(|| format!("cannot purge queue {full}"))?;
        let _ = connection.close(200, "purged".into()).await;
        Ok(())
    }

    /// Refuses `--amqp-url` (bad input: exit 2) where a scenario kills the broker: only the
    /// private one is ours to kill.
    pub fn require_private(&self) -> Result<()> {
        if self.server.is_external() {
            return Err(Error::Usage(anyhow!(
                "this scenario kills RabbitMQ: run it without --amqp-url (on a private \
                 rabbitmq-server)"
            ))
            .into());
        }
        Ok(())
    }

    /// Kills the private broker with SIGKILL and starts it again (same ports, directories,
    /// credentials); how long the restart took until it let us in.
    pub async fn crash_and_restart(&self) -> Result<Duration> {
        self.require_private()?;
        self.server.private().await?.crash_and_restart().await
    }

    /// Deletes the queues this run declared from an external broker (AMQP cannot list them);
    /// the private one goes away whole.
    pub async fn close(self) -> Result<()> {
        let declared = self
            .declared
            .into_inner()
            .unwrap_or_else(|e| e.into_inner());
        let made_names = !declared.is_empty();
        self.server
            .close(made_names, |url, _prefix| delete_queues(url, declared))
            .await
    }
}

/// Deletes the queues `names` from the broker at `url`.
async fn delete_queues(url: String, names: Vec<String>) -> Result<()> {
    let connection = connect::amqp(&url).await?;
    let channel = connection.create_channel().await?;
    for name in &names {
        channel
            .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
            .await
            .with_context(|| format!("cannot delete RabbitMQ queue {name}"))?;
    }
    let _ = connection.close(200, "done".into()).await;
    Ok(())
}
