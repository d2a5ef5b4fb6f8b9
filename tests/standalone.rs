//! `outbox-lab relay` and `outbox-lab consumer` as a user starts them by hand: they deliver a
//! workload written while they run, SIGTERM stops the relay after its batch (nothing lost,
//! nothing sent twice), and /metrics tells what happened.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Stdio};
use std::time::{Duration, Instant};

use common::{block_on, create_database, outbox_lab, query_i64, write_orders};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use outbox_lab::harness::db::Database;
use outbox_lab::harness::nats_server::Nats;
use outbox_lab::harness::rabbitmq_server::Amqp;
use outbox_lab::outbox::schema;

/// A fresh database of this test with the article's schema and the NOTIFY trigger.
fn fresh_database(name: &str) -> Database {
    let sql = [
        schema::CREATE_OUTBOX,
        schema::CREATE_CONSUMER,
        schema::NOTIFY_TRIGGER,
    ];
    create_database(name, &sql.join(";\n"))
}

/// Reads the child's stdout until a line contains `needle`; returns that line.
fn wait_for_line(out: &mut BufReader<ChildStdout>, needle: &str) -> String {
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "output ended before '{needle}'"
        );
        if line.contains(needle) {
            return line.trim().to_string();
        }
    }
}

fn start(args: &[&str]) -> (Child, BufReader<ChildStdout>) {
    let mut child = outbox_lab()
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    (child, out)
}

/// An idempotent consumer serving `POST /events` on a free port; its URL, the relay's sink.
fn start_http_consumer(database_url: &str) -> (Child, String) {
    let (consumer, mut out) = start(&[
        "consumer",
        "--listen",
        "127.0.0.1:0",
        "--database-url",
        database_url,
        "--idempotent",
    ]);
    let sink = url_after(&wait_for_line(&mut out, "listening "), "listening ");
    (consumer, sink)
}

/// `outbox-lab relay` on `database_url`, delivering to `sink`, with `flags`.
fn start_relay(database_url: &str, sink: &str, flags: &[&str]) -> (Child, BufReader<ChildStdout>) {
    let args = ["relay", "--database-url", database_url, "--sink", sink];
    start(&[&args[..], flags].concat())
}

fn url_after(line: &str, marker: &str) -> String {
    line.split(marker)
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

fn sigterm_and_wait(child: &mut Child) -> Option<i32> {
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    child.wait().unwrap().code()
}

/// GET `http://ADDR/PATH` with a plain socket (HTTP/1.0: the server closes when done).
fn http_get(url: &str) -> String {
    use std::io::{Read, Write};
    let rest = url.trim_start_matches("http://");
    let (addr, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

#[test]
fn standalone_relay_and_consumer_deliver_and_stop_cleanly() {
    let name = format!("standalone_{}", std::process::id());
    let db = fresh_database(&name);
    let url = db.url();

    let (mut consumer, sink) = start_http_consumer(&url);

    write_orders(&db, 100);
    let (mut relay, mut relay_out) = start_relay(
        &url,
        &sink,
        &[
            "--mode",
            "notify",
            "--interval-ms",
            "200",
            "--batch",
            "10",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
    );
    let metrics = url_after(&wait_for_line(&mut relay_out, "metrics on "), "metrics on ");
    // More orders while it runs: NOTIFY wakes it.
    let writer = {
        let db = db.clone();
        std::thread::spawn(move || write_orders(&db, 100))
    };
    let started = Instant::now();
    while query_i64(
        &name,
        "SELECT count(*) FROM outbox WHERE published_at IS NOT NULL",
    ) < 150
    {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the relay did not deliver"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let scraped = http_get(&metrics);
    assert!(
        scraped.contains("outbox_relay_delivered_total{relay=\"0\"}"),
        "{scraped}"
    );
    assert!(scraped.contains("outbox_dead_letters 0"), "{scraped}");

    // Stop mid-stream: the batch under way is finished and marked, nothing more.
    assert_eq!(sigterm_and_wait(&mut relay), Some(0));
    writer.join().unwrap();
    let published = query_i64(
        &name,
        "SELECT count(*) FROM outbox WHERE published_at IS NOT NULL",
    );
    let received = query_i64(&name, "SELECT count(*) FROM consumer.receipts");
    assert_eq!(
        published, received,
        "stopping the relay lost or repeated a delivery"
    );

    // A second relay (polling) delivers the rest.
    let (mut second, mut second_out) =
        start_relay(&url, &sink, &["--interval-ms", "50", "--name", "1"]);
    wait_for_line(&mut second_out, "delivering to");
    let started = Instant::now();
    while query_i64(
        &name,
        "SELECT count(*) FROM outbox WHERE published_at IS NULL",
    ) > 0
    {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the second relay did not finish"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(sigterm_and_wait(&mut second), Some(0));
    assert_eq!(sigterm_and_wait(&mut consumer), Some(0));

    // outbox-lab check judges the same database: clean.
    let check = outbox_lab()
        .args(["check", "--database-url", &url])
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&check.stdout);
    assert_eq!(check.status.code(), Some(0), "{report}");
    assert!(report.contains("clean"), "{report}");

    assert_eq!(query_i64(&name, "SELECT count(*) FROM outbox"), 400);
    assert_eq!(
        query_i64(&name, "SELECT count(*) FROM consumer.receipts"),
        400
    );
    assert_eq!(
        query_i64(
            &name,
            "SELECT count(DISTINCT event_id) FROM consumer.shipments"
        ),
        400
    );
    assert_eq!(
        query_i64(&name, "SELECT count(*) FROM consumer.shipments"),
        400
    );
}

/// `relay --http-body array`: each batch in one request, which the consumer applies in one
/// transaction. Every event arrives once, and the receipts were written by one transaction per
/// batch of 10 (their xmin), not one per event as with the default body.
#[test]
fn standalone_relay_posts_each_batch_in_one_request_with_http_body_array() {
    let name = format!("standalone_array_{}", std::process::id());
    let db = fresh_database(&name);
    let url = db.url();
    let (mut consumer, sink) = start_http_consumer(&url);
    write_orders(&db, 50);
    let (mut relay, mut relay_out) = start_relay(
        &url,
        &sink,
        &[
            "--http-body",
            "array",
            "--batch",
            "10",
            "--interval-ms",
            "50",
        ],
    );
    wait_for_line(&mut relay_out, "delivering to");
    let drained = outbox_lab::wait::blocking_up_to(
        Duration::from_secs(60),
        Duration::from_millis(20),
        || {
            query_i64(
                &name,
                "SELECT count(*) FROM outbox WHERE published_at IS NULL",
            ) == 0
        },
    );
    assert!(drained.is_some(), "the relay did not deliver every event");
    assert_eq!(sigterm_and_wait(&mut relay), Some(0));
    assert_eq!(sigterm_and_wait(&mut consumer), Some(0));
    let receipts = |what: &str| query_i64(&name, &format!("SELECT {what} FROM consumer.receipts"));
    assert_eq!(receipts("count(*)"), 100);
    assert_eq!(receipts("count(DISTINCT event_id)"), 100);
    // xid has no ordering for DISTINCT: its text has.
    let transactions = receipts("count(DISTINCT xmin::text)");
    assert!(
        transactions <= 10,
        "{transactions} transactions for 100 events"
    );
}

/// Through a broker — NATS JetStream (each publish acked; the consumer follows the stream it
/// creates) and RabbitMQ (each publish confirmed; the consumer takes from the queue it
/// declares) — acking what was applied; both processes take the broker's URL and credentials
/// from the environment, so no command line shows them, and neither prints them. SIGTERM stops
/// both cleanly.
#[test]
fn standalone_relay_and_consumer_through_the_brokers() {
    let nats = Nats::new(None, "standalone-test", false);
    let amqp = Amqp::new(None, "standalone-test", false);
    for (broker, url, ready) in [
        (
            "nats",
            block_on(nats.url()).unwrap(),
            "following JetStream stream outbox",
        ),
        (
            "amqp",
            block_on(amqp.url()).unwrap(),
            "taking from RabbitMQ queue outbox.event.orders",
        ),
    ] {
        relay_and_consumer_through(broker, &url, ready);
    }
    block_on(nats.close()).unwrap();
    block_on(amqp.close()).unwrap();
}

fn relay_and_consumer_through(broker: &str, broker_url: &str, ready: &str) {
    let name = format!("standalone_{broker}_{}", std::process::id());
    let db = fresh_database(&name);
    let url = db.url();
    let start_with = |args: &[&str], var: &str| {
        let mut child = outbox_lab()
            .args(args)
            .env(var, broker_url)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        (child, out)
    };
    let (mut consumer, mut consumer_out) = start_with(
        &["consumer", "--database-url", &url, "--idempotent"],
        "OUTBOX_LAB_BROKER_URL",
    );
    let following = wait_for_line(&mut consumer_out, ready);
    assert!(!following.contains('@'), "credentials shown: {following}");
    write_orders(&db, 50);
    let (mut relay, mut relay_out) = start_with(
        &["relay", "--database-url", &url, "--mode", "notify"],
        "OUTBOX_LAB_SINK_URL",
    );
    let delivering = wait_for_line(&mut relay_out, "delivering to");
    assert!(!delivering.contains('@'), "credentials shown: {delivering}");
    let started = Instant::now();
    while query_i64(&name, "SELECT count(*) FROM consumer.receipts") < 100 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{broker}: the consumer did not receive every event"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(sigterm_and_wait(&mut relay), Some(0), "{broker}");
    assert_eq!(sigterm_and_wait(&mut consumer), Some(0), "{broker}");
    assert_eq!(
        query_i64(
            &name,
            "SELECT count(*) FROM outbox WHERE published_at IS NULL"
        ),
        0
    );
    assert_eq!(
        query_i64(
            &name,
            "SELECT count(DISTINCT event_id) FROM consumer.shipments"
        ),
        100
    );
}

#[test]
fn standalone_relay_without_an_outbox_says_so() {
    let name = format!("standalone_empty_{}", std::process::id());
    let url = create_database(&name, "").url();
    let out = outbox_lab()
        .args([
            "relay",
            "--database-url",
            &url,
            "--sink",
            "http://127.0.0.1:9",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no outbox table"));
    let out = outbox_lab()
        .args([
            "consumer",
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            &url,
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--create-schema"));
    let out = outbox_lab()
        .args(["check", "--database-url", &url])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no outbox table"));
}
