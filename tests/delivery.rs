//! The delivery scenarios (ordering, Redis Streams, latency, throughput) on a real PostgreSQL
//! and a real redis-server, asserting what they measured.

use crate::common;

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{assert_passed, scenario};

/// ordering-on-failure: the article's two receive orders, exactly.
#[test]
fn ordering_on_failure_sequences_match_the_article() {
    let run = scenario("ordering-on-failure", &[]);
    assert_eq!(
        run.code,
        0,
        "{}{}",
        run.stderr,
        run.failed_checks().join("\n")
    );
    assert_eq!(
        run.metric_str("unguarded.sequence"),
        "order1#2,order1#3,order2#1,order2#2,order2#3,order1#1"
    );
    assert_eq!(
        run.metric_str("guarded.sequence"),
        "order2#1,order2#2,order2#3,order1#1,order1#2,order1#3"
    );
    assert_eq!(run.metric("guarded.out_of_order"), 0);
}

/// multi-relay-ordering (fewer orders): one relay and partitioned relays never reorder, several
/// unpartitioned relays do (what the scenario exists to show), and every event arrives whatever
/// the layout.
#[test]
fn partitioned_relays_keep_per_order_sequence() {
    let run = scenario("multi-relay-ordering", &["--quick"]);
    // Its checks are the article's figures, none a speed target: all must pass.
    assert_passed(&run);
    for relays in [2, 4] {
        let reordered = run.metric(&format!("relays{relays}.unpartitioned.orders_out_of_order"));
        assert!(
            reordered > 0,
            "{relays} unpartitioned relays reordered nothing"
        );
    }
    for relays in [1, 2, 4] {
        assert_eq!(
            run.metric(&format!("relays{relays}.partitioned.orders_out_of_order")),
            0
        );
        for layout in ["partitioned", "unpartitioned"] {
            assert_eq!(
                run.metric(&format!("relays{relays}.{layout}.received")),
                60 * 3
            );
        }
    }
    assert_eq!(run.metric("relays1.unpartitioned.orders_out_of_order"), 0);
}

/// redis-stream: the article's XPENDING / XAUTOCLAIM / XINFO figures, and the idempotent
/// consumer ships nothing twice where a naive one does.
#[test]
fn redis_stream_recovers_pending_entries() {
    let run = scenario("redis-stream", &[]);
    assert_eq!(
        run.code,
        0,
        "{}{}",
        run.stderr,
        run.failed_checks().join("\n")
    );
    for (metric, expected) in [
        ("xlen", 3),
        ("pending_after_crash", 2),
        ("autoclaimed", 2),
        ("group.consumers", 2),
        ("group.pending", 2),
        ("group.lag", 1),
        ("pending_after_recovery", 0),
        ("idempotent.shipments", 3),
        ("idempotent.duplicate_shipments", 0),
        ("naive.duplicate_shipments", 2),
    ] {
        assert_eq!(run.metric(metric), expected, "{metric}");
    }
}

/// A redis-server of the test's own, with a key that outbox-lab must leave alone.
struct ExternalRedis {
    process: Child,
    url: String,
}

impl ExternalRedis {
    fn start() -> ExternalRedis {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let process = Command::new("redis-server")
            .args([
                "--bind",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server (run scripts/setup)");
        let redis = ExternalRedis {
            process,
            url: format!("redis://127.0.0.1:{port}/"),
        };
        let started = Instant::now();
        while redis.cli(&["PING"]) != "PONG" {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "redis-server did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        redis
    }

    fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-u", &self.url])
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

impl Drop for ExternalRedis {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// With --redis-url, only outboxlab:<run>:* keys are used, and they are gone afterwards.
#[test]
fn external_redis_keeps_user_keys_and_loses_ours() {
    let redis = ExternalRedis::start();
    redis.cli(&["SET", "user:data", "precious"]);
    let run = scenario("redis-stream", &["--redis-url", &redis.url]);
    assert_eq!(
        run.code,
        0,
        "{}{}",
        run.stderr,
        run.failed_checks().join("\n")
    );
    assert_eq!(run.metric("xlen"), 3);
    assert_eq!(redis.cli(&["GET", "user:data"]), "precious");
    assert_eq!(
        redis.cli(&["KEYS", "outbox*"]),
        "",
        "outbox-lab left keys behind"
    );
}

/// The Redis sink marks exactly what Redis acknowledged: in a batch across two streams, where
/// one stream key holds a string (every XADD to it answers WRONGTYPE), the other stream's
/// events are delivered (and appended) and only the bad stream's events fail. Before, the
/// pipeline counted as "whole or nothing": all failed, although the good XADDs landed.
#[test]
fn redis_sink_marks_each_acknowledged_xadd() {
    use outbox_lab::outbox::event::Event;
    use outbox_lab::outbox::sink::SinkOptions;
    use std::sync::Mutex;

    let redis = ExternalRedis::start();
    assert_eq!(redis.cli(&["SET", "outbox.event.payments", "x"]), "OK");
    let event = |n: i64, aggregate_type: &str| Event {
        event_id: uuid::Uuid::new_v4(),
        outbox_id: Some(n),
        aggregate_type: aggregate_type.to_string(),
        aggregate_id: format!("agg-{n}"),
        event_type: "Created".to_string(),
        payload: serde_json::json!({ "n": n }),
        fence: None,
    };
    let events = vec![
        event(1, "orders"),
        event(2, "payments"),
        event(3, "orders"),
        event(4, "payments"),
    ];
    let seen = Mutex::new(Vec::new());
    let results = common::block_on(async {
        let sink = SinkOptions::new(&redis.url)
            .connect(Duration::from_secs(5))
            .await
            .unwrap();
        sink.deliver(&events, |e| seen.lock().unwrap().push(e.outbox_id))
            .await
    });
    let delivered: Vec<bool> = results.iter().map(|r| r.is_ok()).collect();
    assert_eq!(delivered, vec![true, false, true, false], "{results:?}");
    for failed in [&results[1], &results[3]] {
        let error = failed.as_ref().unwrap_err().to_string();
        assert!(error.contains("WRONGTYPE"), "{error}");
    }
    assert_eq!(*seen.lock().unwrap(), vec![Some(1), Some(3)]);
    assert_eq!(redis.cli(&["XLEN", "outbox.event.orders"]), "2");
    assert_eq!(redis.cli(&["GET", "outbox.event.payments"]), "x");
}

/// batch-throughput (quick): every cell delivers every event (the scenario counts them from
/// Redis and the database, and stops otherwise), and batching pays, compared at one
/// concurrency: the article's two checks of it pass, by name (Redis at batch 100 at least 3
/// times batch 1; HTTP, one request at a time, a batch per request at least 3 times one event
/// per request). In-flight is its own axis (HTTP one request at a time at every size, 16 at a
/// time where a batch holds 16), the relay timed every event it delivered, and a batch per
/// request beats 16 events in flight too. Redis, NATS and RabbitMQ cells also run with 2
/// workers. Beside them the ceiling (db_only, the same relay delivering nowhere) at every
/// batch size and worker count, and each sink's fraction of it. The plateau's two checks
/// (batch 1000 at most 3 times batch 100 to Redis, at most twice to HTTP) are judged and not
/// held here: on --quick cells on a busy machine they fail (below); they are the only checks
/// allowed to fail. Speed targets are judged apart and do not decide the exit status.
#[test]
fn batch_throughput_batching_pays_at_one_concurrency() {
    // It keeps the cores busy: no test that judges a time runs beside it.
    let _benchmark = common::benchmark();
    // Three interleaved rounds, each cell's median: a --quick cell lasts tens of milliseconds,
    // and one stall of the machine (the suite runs 4 tests at once) took a single round's array
    // cell to 874 events/s against 633 one event per request (it makes 10,000 alone). The cells
    // of a batch per request get 5,000 events instead of --quick's 1,000 (half a second or so
    // each; every other sink's stay at 1,000): with 1,000, 20 runs on a busy machine read a
    // batch per request 3.8 times one event per request at worst, against the check's 3. (With
    // 5,000 to Redis too, a run beside a build and other runs delivered a batch of its twice,
    // which the scenario stops on.)
    let run = scenario(
        "batch-throughput",
        &[
            "--quick",
            "--set",
            "batch_sizes=[1, 100, 1000]",
            "--set",
            "runs=3",
            "--set",
            "max_events=5000",
            "--set",
            "max_events_by_sink={ db_only = 1000, redis = 1000, http = 1000, http_array = 5000, \
             nats = 1000, amqp = 1000, kafka = 1000 }",
        ],
    );
    // Batching pays by far more than the checks ask: 20 runs of these cells (the test's
    // parameters, sinks db_only, Redis and HTTP) beside `yes`, other runs and builds (load ~6):
    // Redis batch 100 18 to 76 times batch 1, a batch per request 9.5 to 39 times one event
    // per request (the checks ask 3). The plateau's ratios, on cells this short, follow the
    // machine's stalls: Redis batch 1000 0.7 to 2.9 times batch 100 (3 allowed), HTTP 0.6 to
    // 2.3 (2 allowed: 2 of 20 failed); with 1,000 events to the array cells too, Redis 1.3 to
    // 4.0 (5 of 20 failed). They are held where batch-throughput runs alone (`scenario all`),
    // on longer cells.
    const PLATEAU: [&str; 2] = [
        "redis: batch 1000 adds little over batch 100 (the plateau: far less than 10x)",
        "http: batch 1000 adds little over batch 100 (the plateau)",
    ];
    assert!(
        run.code == 0 || run.code == 1,
        "batch-throughput did not judge its figures (exit {}): {}",
        run.code,
        run.stderr
    );
    for check in [
        "redis: batch 100 is several times faster than batch 1",
        "http: batching pays when the batch travels in one request (array body, batch 100)",
    ] {
        run.assert_check_passed(check);
    }
    let failed = run.failed_check_names();
    assert!(
        failed.iter().all(|name| PLATEAU.contains(&name.as_str())),
        "failed: {failed:?}"
    );
    let json = run.json();
    let cells = &json["tables"][0];
    let column = |name: &str| {
        let columns = cells["columns"].as_array().unwrap();
        columns.iter().position(|c| c == name).unwrap()
    };
    let (sink, batch, in_flight) = (column("sink"), column("batch"), column("in_flight"));
    let mut http_cells: Vec<(&str, &str)> = cells["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|row| row[sink] == "http")
        .map(|row| {
            (
                row[batch].as_str().unwrap(),
                row[in_flight].as_str().unwrap(),
            )
        })
        .collect();
    http_cells.sort();
    let expected = [
        ("1", "1"),
        ("100", "1"),
        ("100", "16"),
        ("1000", "1"),
        ("1000", "16"),
    ];
    assert_eq!(http_cells, expected, "HTTP cells (batch, in flight)");
    // The ceiling at every batch size and worker count, and each sink's cell a fraction of the
    // ceiling of its batch size and workers: every cell measured (above 0), none implausible.
    // The relay delivering nowhere stays under a million events a second (PostgreSQL alone,
    // pgbench, did 90,000-128,000 here); a sink's cell does the ceiling's work and delivers,
    // so only the noise between two cells puts it above 1 of it: those 20 runs read at most
    // 2.1 (Redis at batch 1, 200 events), and 10 times the ceiling is a broken figure. The
    // ceiling read 187 to 73,560 events/s.
    let of_ceiling = |metric: &str| {
        let fraction = run.metric_f64(metric);
        assert!(fraction > 0.0 && fraction <= 10.0, "{metric}: {fraction}");
    };
    for size in [1, 100, 1000] {
        for workers in ["", ".workers2"] {
            let ceiling = format!("db_only.batch{size}{workers}.events_per_s");
            let rate = run.metric_f64(&ceiling);
            assert!(rate > 0.0 && rate < 1_000_000.0, "{ceiling}: {rate}");
            // The workers axis: every Redis size also with 2 workers (partitioned), each cell
            // checked by the scenario to have delivered and timed every event with that many.
            of_ceiling(&format!("redis.batch{size}{workers}.of_ceiling"));
        }
    }
    // The brokers too, with publish acks and publisher confirms, one and two workers.
    for sink in ["nats", "amqp"] {
        for workers in ["", ".workers2"] {
            of_ceiling(&format!("{sink}.batch100{workers}.of_ceiling"));
        }
    }
    of_ceiling("http.batch100.in_flight16.of_ceiling");
    // One commit of the consumer per batch instead of per event: medians of 3 rounds, measured
    // in 6 runs beside two CPU hogs and another scenario at 5.6 to 9.1 times one event per
    // request 16 at a time (6.0 on a quiet machine); those 20 runs 3.5 to 10.1 (2.6 at worst
    // with 1,000 events to the array cells): twice is a margin beyond that noise.
    let array = run.metric_f64("http_array.batch100.events_per_s");
    let per_event = run.metric_f64("http.batch100.in_flight16.events_per_s");
    assert!(
        array > 2.0 * per_event,
        "array {array}/s vs 16 in flight {per_event}/s"
    );
    let phases = &json["tables"][1];
    assert_eq!(
        phases["rows"].as_array().unwrap().len(),
        cells["rows"].as_array().unwrap().len(),
        "a phase split per cell"
    );
}

/// notify-latency (shortened): NOTIFY answers far sooner than 1 s polling, to HTTP and to
/// Redis, every timed event with its commit -> receipt; it idles with far fewer transactions
/// than 100 ms polling; and its trigger makes writers' commits queue up, which they never do
/// without it. Asserted as the mechanism (a queued commit seen at all), not as how often: that
/// share follows the machine's disk against its CPU (0.4 to 0.8 beside one CPU-bound job,
/// under 0.1 at times in a full test run). The scenario's checks pass, by name, but two of the
/// article's figures that a busy machine does not hold (below), which this test holds relative
/// to polling in the same run instead: they are the only checks allowed to fail.
#[test]
fn notify_beats_polling_on_latency_and_idle_cost() {
    let _timed = common::timed();
    let run = scenario("notify-latency", &["--quick"]);
    // 20 --quick runs beside `yes` and builds (load ~7; no batch-throughput: see common::timed)
    // and, for the last few, beside other tests' runs. NOTIFY's median is the scheduler's when
    // both cores are taken (each hop, the trigger, the relay, the consumer, waits for one): it
    // read 2-158 ms (median 16), over 20 ms in 7 of 20. Its idle transactions read 10 but once,
    // 23, beside a cargo build. 1 s polling's median is its timer's: 508-600 ms.
    const ONLY_ON_A_QUIET_MACHINE: [&str; 2] = [
        "NOTIFY: median a few ms (under 20), where polling's is tens or hundreds",
        "NOTIFY (1 s fallback) costs ~10 transactions per idle 10 s",
    ];
    assert!(run.code == 0 || run.code == 1, "{}", run.stderr);
    let failed = run.failed_check_names();
    assert!(
        failed
            .iter()
            .all(|name| ONLY_ON_A_QUIET_MACHINE.contains(&name.as_str())),
        "failed: {failed:?}"
    );
    for check in [
        "1 s polling: median latency ~ interval/2 (between 1/4 and 4/5 of it)",
        "1 s polling: worst latency ~ the interval (p95 at most the interval + 10%; median of 5 windows)",
        "100 ms polling: median latency ~ interval/2 (between 1/4 and 4/5 of it)",
        "100 ms polling costs ~100 transactions per idle 10 s (70 to 150)",
        "the NOTIFY trigger makes commits queue up (writers seen waiting for its lock)",
        "without the trigger no commit waits for that lock",
    ] {
        run.assert_check_passed(check);
    }
    let param = |name: &str| run.json()["params"][name].as_i64().unwrap();
    for mode in ["poll1000", "poll100"] {
        assert_eq!(run.metric(&format!("{mode}.samples")), param("orders"));
    }
    // NOTIFY far sooner than 1 s polling: its median (INSERT -> receipt) and each sink's commit
    // -> receipt under half 1 s polling's median in the same run. A relay NOTIFY does not wake
    // polls on its 1 s fallback and reads about all of it; those 20 runs read at most 0.28 of
    // it (the one beside another notify-latency run), 0.12 but for it; the commit -> receipt
    // under the former tenth failed 3 of them. 8 runs beside batch-throughput read up to 0.25.
    let poll_p50 = run.metric_f64("poll1000.p50_ms");
    let notify_p50 = run.metric_f64("notify.p50_ms");
    assert!(
        notify_p50 < poll_p50 / 2.0,
        "NOTIFY {notify_p50} ms, 1 s polling {poll_p50} ms"
    );
    for mode in ["notify", "notify_redis"] {
        assert_eq!(
            run.metric(&format!("{mode}.samples")),
            param("notify_events")
        );
        let commit_to_receipt = run.metric_f64(&format!("{mode}.commit_to_receipt_p50_ms"));
        assert!(
            commit_to_receipt < poll_p50 / 2.0,
            "{mode}: {commit_to_receipt} ms, 1 s polling {poll_p50} ms"
        );
    }
    // Idle, NOTIFY's 1 s fallback against 100 ms polling (those runs: 10, once 23, against
    // 70-110).
    assert!(run.metric("notify.idle_xacts_10s") < run.metric("poll100.idle_xacts_10s") / 2);
    assert!(run.metric("queued_looks.with_trigger") >= 1);
    assert_eq!(run.metric("queued_looks.without_trigger"), 0);
}

/// A relay with 2 workers (partitioned loops of one process): every event is delivered once and
/// marked published, each aggregate's events reach the stream in their order although the
/// aggregates are split between two connections, and the relay's timings add up both workers.
/// A worker count that cannot split aggregates (a partition of its own, the claim design) is
/// refused.
#[test]
fn relay_workers_split_aggregates_and_keep_their_order() {
    use outbox_lab::outbox::relay::{
        drive, Ended, OutboxRelay, Partition, RelayConfig, RelayDesign, RelayOptions,
    };
    use outbox_lab::outbox::schema;
    use outbox_lab::outbox::sink::SinkOptions;

    let redis = ExternalRedis::start();
    let db = common::create_database("delivery_relay_workers", schema::CREATE_OUTBOX);
    let (aggregates, per_aggregate) = (30, 5);
    let options = |config: RelayConfig| RelayOptions {
        name: "workers".into(),
        sink: SinkOptions::new(&redis.url),
        config,
        follow: None,
    };
    let workers = RelayConfig {
        batch: 7,
        workers: 2,
        ..RelayConfig::default()
    };
    common::block_on(async {
        let client = db.connect().await.unwrap();
        // Ids interleave the aggregates: event n of every aggregate, then event n + 1.
        client
            .batch_execute(&format!(
                "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
                 SELECT 'orders', 'order-' || a, 'E' || n, jsonb_build_object('n', n)
                   FROM generate_series(1, {per_aggregate}) n, generate_series(1, {aggregates}) a
                  ORDER BY n, a"
            ))
            .await
            .unwrap();
        let config = db.config().unwrap();
        for refused in [
            RelayConfig {
                partition: Some(Partition { index: 0, count: 2 }),
                ..workers.clone()
            },
            RelayConfig {
                design: RelayDesign::Claim,
                ..workers.clone()
            },
            RelayConfig {
                workers: 0,
                ..workers.clone()
            },
        ] {
            assert!(options(refused).connect(&config).await.is_err());
        }
        let options = options(workers.clone());
        let mut relay = options.connect(&config).await.unwrap();
        let ended = drive(&mut relay, options.until(), std::future::pending())
            .await
            .unwrap();
        let events = (aggregates * per_aggregate) as u64;
        assert_eq!(ended, Ended::Drained { sent: events }, "{}", relay.name());
        let timings = relay.timings();
        assert_eq!((timings.workers, timings.events), (2, events));
        let published: i64 = client
            .query_one(
                "SELECT count(*) FROM outbox WHERE published_at IS NOT NULL AND attempts = 1",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(published as u64, events);
    });
    // The stream, in the order Redis appended: each aggregate's E1, E2, ... in turn.
    let stream = redis.cli(&["XRANGE", "outbox.event.orders", "-", "+"]);
    let lines: Vec<&str> = stream.lines().collect();
    let mut seen: std::collections::HashMap<&str, u32> = std::collections::HashMap::new();
    let mut appended = 0;
    for (i, line) in lines.iter().enumerate() {
        if *line != "aggregate_id" {
            continue;
        }
        let (aggregate, event_type) = (lines[i + 1], lines[i + 3]);
        let n: u32 = event_type.trim_start_matches('E').parse().unwrap();
        let last = seen.entry(aggregate).or_insert(0);
        assert_eq!(n, *last + 1, "{aggregate}: E{n} after E{last}");
        *last = n;
        appended += 1;
    }
    assert_eq!(appended, aggregates * per_aggregate);
    assert!(seen.values().all(|&n| n == per_aggregate as u32));
}
