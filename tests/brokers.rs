//! The message brokers: broker-dedup's exact counts on a private NATS JetStream, a private
//! nats-server that lets no one in without its token, and that no run leaves behind — a
//! SIGKILLed run's is removed by the next run; the nats:// sink with and without publish acks.
//! The same for RabbitMQ: broker-confirms' confirming relay loses nothing across a SIGKILL of
//! the broker; a private rabbitmq-server (and its epmd) that lets no one in without its
//! credentials, and that a SIGKILLed run leaves to the next one to remove; the amqp:// sink
//! with and without publisher confirms. broker-cluster on a private 3-node NATS cluster, whose
//! nodes a SIGKILLed run leaves to the next.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use common::{assert_passed, block_on, outbox_lab, run_tracked, scratch_dir, throwaway_dirs_of};
use nix::sys::signal::{kill, Signal};
use nix::unistd::{geteuid, Pid, User};
use outbox_lab::harness::nats_server::Nats;
use outbox_lab::harness::rabbitmq_server::Amqp;
use outbox_lab::harness::throwaway::{Marker, ProcessId};
use outbox_lab::outbox::event::Event;
use outbox_lab::outbox::sink::SinkOptions;
use outbox_lab::wait;

/// Every run reaps the brokers of killed runs: the tests take turns, so that one's sweep
/// does not remove the server another has just left behind on purpose.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// `outbox-lab scenario ARGS --format json` started in the background, once `ready` finds its
/// servers up (asked with the run's pid, for at most `limit`); the run is killed and the test
/// fails if they never are.
fn run_with_servers_up<T>(
    args: &[&str],
    results: &str,
    limit: Duration,
    mut ready: impl FnMut(u32) -> Option<T>,
) -> (std::process::Child, T) {
    let mut run = outbox_lab()
        .arg("scenario")
        .args(args)
        .args(["--format", "json", "--results-dir"])
        .arg(scratch_dir(results))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = run.id();
    let Some(found) = wait::blocking_up_to(limit, Duration::from_millis(20), || ready(pid)) else {
        let _ = run.kill();
        let _ = run.wait();
        panic!(
            "the servers of `outbox-lab scenario {}` never came up",
            args.join(" ")
        );
    };
    (run, found)
}

/// Kills a run with SIGKILL: it cannot stop what it started.
fn sigkill(mut run: std::process::Child) {
    kill(Pid::from_raw(run.id() as i32), Signal::SIGKILL).unwrap();
    run.wait().unwrap();
}

/// The server a run directory's marker records, once it does.
fn recorded_server(dir: &Path) -> Option<ProcessId> {
    let marker: Marker =
        serde_json::from_slice(&std::fs::read(dir.join("outbox-lab-owner.json")).ok()?).ok()?;
    Some(marker.server?.process)
}

/// The private server's pid and client port, once its run directory records it and it has
/// written its ports file.
fn ready_nats_server(dir: &Path) -> Option<(ProcessId, u16)> {
    let server = recorded_server(dir)?;
    let ports = std::fs::read_dir(dir.join("server"))
        .ok()?
        .flatten()
        .find(|e| e.file_name().to_string_lossy().ends_with(".ports"))?;
    let ports: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ports.path()).ok()?).ok()?;
    let port = ports["nats"][0]
        .as_str()?
        .rsplit(':')
        .next()?
        .parse()
        .ok()?;
    Some((server, port))
}

/// The local addresses (`HEXIP:HEXPORT` as in /proc/net/tcp*) that process `pid` listens on.
fn tcp_listen_addresses(pid: i32) -> Vec<String> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|fd| {
            let link = std::fs::read_link(fd.path()).ok()?;
            let inode = link.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?;
            Some(inode.to_string())
        })
        .collect();
    let mut found = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // st 0A is LISTEN; the inode is field 9.
            if fields.get(3) == Some(&"0A") && inodes.iter().any(|i| fields.get(9) == Some(&&**i)) {
                found.push(fields[1].to_string());
            }
        }
    }
    found
}

/// What the server answers a client that connects without credentials: its INFO line, then
/// the reply to CONNECT + PING.
fn connect_without_token(port: u16) -> (String, String) {
    let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut info = String::new();
    reader.read_line(&mut info).unwrap();
    (&stream)
        .write_all(b"CONNECT {\"verbose\":false,\"pedantic\":false}\r\nPING\r\n")
        .unwrap();
    let mut reply = String::new();
    let _ = reader.read_line(&mut reply);
    (info, reply)
}

/// `program args` as user `nobody`: whether it succeeded, and what it printed.
fn as_nobody(program: &str, args: &[&str]) -> (bool, String) {
    let nobody = User::from_name("nobody").unwrap().expect("user nobody");
    let out = Command::new(program)
        .args(args)
        .uid(nobody.uid.as_raw())
        .gid(nobody.gid.as_raw())
        .current_dir("/")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout),
    )
}

/// Checks the running private server of `dir` (pid, port): on 127.0.0.1 alone, its token in a
/// 0600 file, and no client in without the token, from us or (as root) from user `nobody`.
fn assert_nobody_gets_in(dir: &Path, server: ProcessId, port: u16) {
    // 127.0.0.1 is 0100007F in /proc/net/tcp.
    assert_eq!(
        tcp_listen_addresses(server.pid),
        vec![format!("0100007F:{port:04X}")],
        "nats-server listens elsewhere than 127.0.0.1:{port}"
    );
    let config = dir.join("nats.conf");
    let mode = std::fs::metadata(&config).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{} is not 0600", config.display());
    let (info, reply) = connect_without_token(port);
    assert!(info.contains("\"auth_required\":true"), "{info}");
    assert!(reply.contains("Authorization Violation"), "got in: {reply}");
    if geteuid().is_root() {
        let (read, said) = as_nobody("cat", &[config.to_str().unwrap()]);
        assert!(!read, "nobody read the token: {said}");
        let script = format!(
            "exec 3<>/dev/tcp/127.0.0.1/{port}; printf 'CONNECT {{}}\\r\\nPING\\r\\n' >&3; \
             timeout 2 cat <&3"
        );
        let (_, said) = as_nobody("bash", &["-c", &script]);
        assert!(
            said.contains("Authorization Violation") && !said.contains("PONG"),
            "nobody got in: {said}"
        );
    }
}

/// A run SIGKILLed while its nats-server runs leaves it behind (nothing else can run; it lets
/// no one in meanwhile); the next run removes it, reproduces broker-dedup's exact counts, and
/// leaves nothing of its own.
#[test]
fn broker_dedup_counts_and_no_nats_server_left_behind() {
    let _turn = one_at_a_time();
    // A long downtime keeps the killed run inside the scenario, its server up.
    let args = [
        "broker-dedup",
        "--set",
        "downtime_ms=30000",
        "--set",
        "covered_window_ms=60000",
    ];
    let (killed, (dir, (server, port))) =
        run_with_servers_up(&args, "brokers-killed", Duration::from_secs(60), |pid| {
            throwaway_dirs_of("nats", pid)
                .into_iter()
                .find_map(|dir| ready_nats_server(&dir).map(|ready| (dir, ready)))
        });
    assert_nobody_gets_in(&dir, server, port);
    sigkill(killed);
    assert!(
        server.is_running(),
        "a SIGKILLed run cannot stop its nats-server"
    );

    let (pid, run) = run_tracked(
        outbox_lab()
            .args(["scenario", "broker-dedup", "--format", "json"])
            .arg("--results-dir")
            .arg(scratch_dir("brokers-next")),
    );
    assert_passed(&run);
    let counts = [
        "covered.stream_messages",
        "covered.naive.shipments",
        "expired.stream_messages",
        "expired.naive.shipments",
    ]
    .map(|metric| run.metric(metric));
    assert_eq!(counts, [5, 5, 8, 8], "{}", run.stdout);
    let gone = wait::blocking_up_to(Duration::from_secs(10), Duration::from_millis(20), || {
        !server.is_running()
    });
    assert!(
        gone.is_some(),
        "nats-server {} of the killed run still runs",
        server.pid
    );
    assert!(!dir.exists(), "{} left behind", dir.display());
    let own: Vec<PathBuf> = throwaway_dirs_of("nats", pid);
    assert!(own.is_empty(), "the passing run left {own:?}");
}

/// The nats:// sink, publishing where no stream stores anything: with publish acks every event
/// fails (and is retried); fire-and-forget counts every one delivered — the mistake.
#[test]
fn fire_and_forget_counts_unstored_events_as_delivered() {
    let _turn = one_at_a_time();
    block_on(async {
        let nats = Nats::new(None, "brokers-test", false);
        let url = nats.url().await.unwrap();
        let events: Vec<Event> = (1..=3)
            .map(|i| Event {
                event_id: uuid::Uuid::new_v4(),
                outbox_id: Some(i),
                aggregate_type: "nowhere".into(),
                aggregate_id: i.to_string(),
                event_type: "OrderCreated".into(),
                payload: serde_json::Value::Null,
                fence: None,
            })
            .collect();
        for (publish_acks, delivered_expected) in [(true, 0), (false, events.len())] {
            let options = SinkOptions {
                publish_acks,
                ..SinkOptions::new(&url)
            };
            let sink = options.connect(Duration::from_secs(5)).await.unwrap();
            let delivered = AtomicUsize::new(0);
            let results = sink
                .deliver(&events, |_| {
                    delivered.fetch_add(1, Ordering::SeqCst);
                })
                .await;
            let ok = results.iter().filter(|r| r.is_ok()).count();
            assert_eq!(
                (ok, delivered.load(Ordering::SeqCst)),
                (delivered_expected, delivered_expected),
                "publish_acks={publish_acks}: {:?}",
                results.iter().map(|r| format!("{r:?}")).collect::<Vec<_>>()
            );
        }
        nats.close().await.unwrap();
    });
}

/// The processes working in `dir` (their cwd under it): a throwaway server and what it started.
fn processes_in(dir: &Path) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| cwd.starts_with(dir))
        })
        .collect()
}

/// The private broker's AMQP port and credentials, once its configuration is written and it
/// lets them in; with its epmd's run directory.
fn ready_rabbitmq(pid: u32) -> Option<(PathBuf, PathBuf, String)> {
    let dir = throwaway_dirs_of("rabbitmq", pid).into_iter().next()?;
    let epmd = throwaway_dirs_of("epmd", pid).into_iter().next()?;
    let config = std::fs::read_to_string(dir.join("rabbitmq.conf")).ok()?;
    let value = |key: &str| {
        config
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(" = ").map(str::to_string))
    };
    let url = format!(
        "amqp://{}:{}@{}/%2f",
        value("default_user")?,
        value("default_pass")?,
        value("listeners.tcp.1")?
    );
    block_on(outbox_lab::connect::amqp(&url)).ok()?;
    Some((dir, epmd, url))
}

/// Checks the running private broker of `dir` (and its epmd's `epmd_dir`): every process of
/// theirs listens on loopback alone, its configuration (password) and cookie are its own, and
/// no one gets in with other credentials (guest included).
fn assert_nobody_gets_into_rabbitmq(dir: &Path, epmd_dir: &Path, url: &str) {
    let processes = [processes_in(dir), processes_in(epmd_dir)].concat();
    assert!(processes.len() >= 3, "sh, beam.smp, epmd: {processes:?}");
    for pid in processes {
        for address in tcp_listen_addresses(pid) {
            // 127.0.0.1, or ::1 (epmd adds it), as /proc/net/tcp* write them.
            let host = address.split(':').next().unwrap();
            assert!(
                host == "0100007F" || host == "00000000000000000000000001000000",
                "pid {pid} listens on {address}"
            );
        }
    }
    for (file, mode) in [("rabbitmq.conf", 0o600), (".erlang.cookie", 0o400)] {
        let meta = std::fs::metadata(dir.join(file)).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, mode, "{file}");
    }
    let port = url.rsplit(':').next().unwrap().trim_end_matches("/%2f");
    let user = url["amqp://".len()..].split(':').next().unwrap();
    for intruder in ["guest:guest".to_string(), format!("{user}:wrong")] {
        let attempt = format!("amqp://{intruder}@127.0.0.1:{port}/%2f");
        assert!(
            block_on(outbox_lab::connect::amqp(&attempt)).is_err(),
            "{intruder} got in"
        );
    }
    if geteuid().is_root() {
        for file in ["rabbitmq.conf", ".erlang.cookie"] {
            let path = dir.join(file);
            let (read, said) = as_nobody("cat", &[path.to_str().unwrap()]);
            assert!(!read, "nobody read {file}: {said}");
        }
    }
}

/// A run SIGKILLed while its rabbitmq-server runs leaves it (and its epmd) behind, letting no
/// one in; the next run removes both, runs broker-confirms — the confirming relay loses
/// nothing across the broker's SIGKILL, the other loses some — and leaves nothing of its own.
#[test]
fn broker_confirms_loses_nothing_and_no_rabbitmq_left_behind() {
    let _turn = one_at_a_time();
    let (killed, (dir, epmd_dir, url)) = run_with_servers_up(
        &["broker-confirms", "--quick"],
        "rabbitmq-killed",
        Duration::from_secs(90),
        ready_rabbitmq,
    );
    assert_nobody_gets_into_rabbitmq(&dir, &epmd_dir, &url);
    sigkill(killed);
    let left: Vec<ProcessId> = [processes_in(&dir), processes_in(&epmd_dir)]
        .concat()
        .into_iter()
        .filter_map(ProcessId::of)
        .collect();
    assert!(
        !left.is_empty(),
        "a SIGKILLed run cannot stop its rabbitmq-server"
    );

    let (pid, run) = run_tracked(
        outbox_lab()
            .args(["scenario", "broker-confirms", "--quick", "--format", "json"])
            .arg("--results-dir")
            .arg(scratch_dir("rabbitmq-next")),
    );
    assert_passed(&run);
    assert_eq!(run.metric("confirms.lost"), 0, "{}", run.stdout);
    // The same count bites: the relay without confirms lost events in every round measured
    // (7 of 7, 400 to 673 of 1000-2000 each: what was published in the last moments before the
    // kill was not yet stored), although the scenario does not check it (timing).
    assert!(run.metric("no_confirms.lost") > 0, "{}", run.stdout);
    assert_eq!(run.metric("rounds"), 1, "{}", run.stdout);
    for gone in [&dir, &epmd_dir] {
        assert!(!gone.exists(), "{} left behind", gone.display());
    }
    let still = wait::blocking_up_to(Duration::from_secs(10), Duration::from_millis(20), || {
        left.iter().all(|p| !p.is_running()).then_some(())
    });
    assert!(
        still.is_some(),
        "processes of the killed run still run: {left:?}"
    );
    for kind in ["rabbitmq", "epmd"] {
        let own = throwaway_dirs_of(kind, pid);
        assert!(own.is_empty(), "the passing run left {own:?}");
    }
}

/// The amqp:// sink, publishing where no queue takes the messages: with confirms every event
/// fails (returned unroutable, and retried); without, every one counts as delivered — the
/// mistake. To a queue that exists, both deliver, and the messages carry the event ids. On an
/// external broker a run declares prefixed queues only, and deletes them at its end.
#[test]
fn amqp_sink_without_confirms_counts_unrouted_events_as_delivered() {
    let _turn = one_at_a_time();
    block_on(async {
        let amqp = Amqp::new(None, "brokers-test", false);
        let url = amqp.url().await.unwrap();
        let events = |aggregate_type: &str| -> Vec<Event> {
            (1..=3)
                .map(|i| Event {
                    event_id: uuid::Uuid::new_v4(),
                    outbox_id: Some(i),
                    aggregate_type: aggregate_type.into(),
                    aggregate_id: i.to_string(),
                    event_type: "OrderCreated".into(),
                    payload: serde_json::Value::Null,
                    fence: None,
                })
                .collect()
        };
        let queue = amqp.declare_queue("outbox.event.orders").await.unwrap();
        for (aggregate_type, confirms, delivered_expected) in [
            ("nowhere", true, 0),
            ("nowhere", false, 3),
            ("orders", true, 3),
            ("orders", false, 3),
        ] {
            let options = SinkOptions {
                publish_acks: confirms,
                ..SinkOptions::new(&url)
            };
            let sink = options.connect(Duration::from_secs(5)).await.unwrap();
            let delivered = AtomicUsize::new(0);
            let results = sink
                .deliver(&events(aggregate_type), |_| {
                    delivered.fetch_add(1, Ordering::SeqCst);
                })
                .await;
            let ok = results.iter().filter(|r| r.is_ok()).count();
            assert_eq!(
                (ok, delivered.load(Ordering::SeqCst)),
                (delivered_expected, delivered_expected),
                "{aggregate_type}, confirms={confirms}: {:?}",
                results.iter().map(|r| format!("{r:?}")).collect::<Vec<_>>()
            );
        }
        let connection = outbox_lab::connect::amqp(&url).await.unwrap();
        let channel = connection.create_channel().await.unwrap();
        let mut held = 0;
        while let Some(message) = channel
            .basic_get(queue.as_str().into(), Default::default())
            .await
            .unwrap()
        {
            let event: Event = serde_json::from_slice(&message.delivery.data).unwrap();
            let properties = &message.delivery.properties;
            assert_eq!(
                properties.message_id().as_ref().map(|id| id.to_string()),
                Some(event.event_id.to_string())
            );
            assert_eq!(*properties.delivery_mode(), Some(2), "not persistent");
            held += 1;
        }
        assert_eq!(held, 6);

        // The same broker as another run's --amqp-url: its queues carry the run's prefix, and
        // go at its end; the private broker's queue stays.
        let external = Amqp::new(Some(&url), "run1", false);
        let theirs = external.declare_queue("outbox.event.orders").await.unwrap();
        assert_eq!(theirs, "outboxlab_run1_outbox.event.orders");
        external.close().await.unwrap();
        // A passive declare fails on a queue that does not exist (and closes its channel).
        let exists = async |name: &str| {
            let options = lapin::options::QueueDeclareOptions {
                passive: true,
                ..Default::default()
            };
            let channel = connection.create_channel().await.unwrap();
            let args = lapin::types::FieldTable::default();
            channel
                .queue_declare(name.into(), options, args)
                .await
                .is_ok()
        };
        assert!(!exists(&theirs).await, "{theirs} left behind");
        assert!(exists(&queue).await, "{queue} deleted");
        amqp.close().await.unwrap();
    });
}

/// A run SIGKILLed while its 3-node cluster runs leaves the three nats-servers behind; the next
/// run removes them, and its acked relay loses nothing across the leader's death, while the
/// fire-and-forget relay, counted the same way, loses what the leaderless stream dropped (the
/// count bites). The failover is reported.
#[test]
fn broker_cluster_loses_nothing_with_acks_and_no_node_left_behind() {
    let _turn = one_at_a_time();
    let (killed, nodes) = run_with_servers_up(
        &["broker-cluster", "--quick"],
        "brokers-cluster-killed",
        Duration::from_secs(60),
        |pid| {
            let servers: Vec<(PathBuf, ProcessId)> = throwaway_dirs_of("nats-cluster", pid)
                .into_iter()
                .filter_map(|dir| recorded_server(&dir).map(|server| (dir, server)))
                .filter(|(_, server)| server.is_running())
                .collect();
            (servers.len() == 3).then_some(servers)
        },
    );
    for (_, server) in &nodes {
        // Its client port and its route port, both on 127.0.0.1 (0100007F) alone.
        let wait_listening =
            wait::blocking_up_to(Duration::from_secs(30), Duration::from_millis(20), || {
                let addresses = tcp_listen_addresses(server.pid);
                (addresses.len() == 2).then_some(addresses)
            });
        let addresses = wait_listening.expect("a node that listens on its two ports");
        assert!(
            addresses.iter().all(|a| a.starts_with("0100007F:")),
            "a node listens beyond 127.0.0.1: {addresses:?}"
        );
    }
    sigkill(killed);
    for (_, server) in &nodes {
        assert!(
            server.is_running(),
            "a SIGKILLed run cannot stop its nats-servers"
        );
    }

    let results = scratch_dir("brokers-cluster-next");
    let (pid, run) = run_tracked(
        outbox_lab()
            .args(["scenario", "broker-cluster", "--quick", "--format", "json"])
            .arg("--results-dir")
            .arg(&results),
    );
    assert_passed(&run);
    assert_eq!(run.metric("acked.lost"), 0, "{}", run.stdout);
    assert!(run.metric("fire_and_forget.lost") > 0, "{}", run.stdout);
    assert!(run.metric_f64("failover_ms") > 0.0, "{}", run.stdout);
    // The page shows each relay's failover as a timeline.
    let page = std::fs::read_dir(&results)
        .unwrap()
        .flatten()
        .map(|run_dir| run_dir.path().join("report.html"))
        .find(|page| page.exists())
        .expect("the run's page");
    let page = std::fs::read_to_string(page).unwrap();
    for plot in ["broker-cluster-acked", "broker-cluster-fire-and-forget"] {
        assert!(
            page.contains(&format!("data-plot=\"{plot}\"")),
            "no {plot} plot"
        );
    }
    for (dir, server) in &nodes {
        let gone = wait::blocking_up_to(Duration::from_secs(10), Duration::from_millis(20), || {
            !server.is_running()
        });
        assert!(
            gone.is_some(),
            "nats-server {} of the killed run still runs",
            server.pid
        );
        assert!(!dir.exists(), "{} left behind", dir.display());
    }
    let own: Vec<PathBuf> = throwaway_dirs_of("nats-cluster", pid);
    assert!(own.is_empty(), "the passing run left {own:?}");
}
