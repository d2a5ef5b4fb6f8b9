//! Kafka, on a private tansu broker: the kafka:// sink keeps each aggregate's events in one
//! partition, in order, the event id in a header too; the broker listens in a network
//! namespace of its own, reached only through outbox-lab's link, which lets no one in without
//! the run's SASL credentials; a SIGKILLed run's broker is removed by the next run; on an
//! external cluster a run makes prefixed topics only, and deletes them at its end; a relay
//! killed between Kafka's ack and its mark (the delivery proxy holds the ack) duplicates for the
//! naive consumer alone. verify through Kafka under every nemesis (our relay holds, a relay that
//! marks without publishing is caught) is in tests/verify.rs.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use common::host::{processes_in, tcp_listen_addresses};
use common::verify::{our_relay, our_relay_from_its_environment, verify};
use common::{
    assert_ended, assert_passed, block_on, outbox_lab, run_tracked, scenario, scratch_dir, sigkill,
    throwaway_dirs_of,
};
use outbox_lab::connect;
use outbox_lab::harness::kafka_server::Kafka;
use outbox_lab::harness::process::ProcessId;
use outbox_lab::outbox::event::Event;
use outbox_lab::outbox::sink::{partition_for_key, SinkOptions, EVENT_ID_HEADER, PARTITIONS};
use rskafka::client::partition::UnknownTopicHandling;

/// The private broker of `dir` listens in a network namespace of its own (on 127.0.0.1 there),
/// on nothing of the machine's.
fn assert_broker_is_out_of_reach(dir: &Path) {
    let processes = processes_in(dir);
    assert_eq!(processes.len(), 1, "tansu alone: {processes:?}");
    let pid = processes[0];
    let ours = std::fs::read_link("/proc/self/ns/net").unwrap();
    let its = std::fs::read_link(format!("/proc/{pid}/ns/net")).unwrap();
    assert_ne!(ours, its, "tansu shares our network namespace");
    assert_eq!(tcp_listen_addresses(pid), Vec::<String>::new());
    // /proc/PID/net/tcp is its namespace's table: the broker on 127.0.0.1:9092 (0x2384).
    let inside = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap();
    assert!(inside.contains("0100007F:2384"), "{inside}");
}

/// 5 orders' 6 events each, interleaved, produced in batches of 10 (one order's events across
/// batches, and several in one): every key's records are in the partition Kafka's clients
/// choose, in the order they were produced, each with its event id in a header. Without the
/// run's password, or with a wrong one, no client gets an answer; the broker itself is out of
/// reach. An external cluster gets prefixed topics alone, gone at the run's end.
#[test]
fn each_key_keeps_its_partition_and_order_and_nobody_gets_in_without_the_password() {
    block_on(async {
        let kafka = Kafka::new(None, "kafka-test", false);
        let url = kafka.url().await.unwrap();
        let topic = kafka
            .create_topic("outbox.event.orders", PARTITIONS)
            .await
            .unwrap();
        let dir = throwaway_dirs_of("kafka", std::process::id());
        assert_eq!(dir.len(), 1, "{dir:?}");
        assert_broker_is_out_of_reach(&dir[0]);

        let events: Vec<Event> = (0..30)
            .map(|i| Event {
                event_id: uuid::Uuid::new_v4(),
                outbox_id: Some(i),
                aggregate_type: "orders".into(),
                aggregate_id: format!("order-{}", i % 5),
                event_type: format!("step-{}", i / 5),
                payload: serde_json::Value::Null,
                fence: None,
            })
            .collect();
        let sink = SinkOptions::new(&url)
            .connect(Duration::from_secs(5))
            .await
            .unwrap();
        for batch in events.chunks(10) {
            let results = sink.deliver(batch, |_| {}).await;
            assert!(results.iter().all(Result::is_ok), "{results:?}");
        }

        let client = connect::kafka(&url).await.unwrap();
        // Per key: its partitions, and its event types in offset order.
        let mut keys: BTreeMap<String, (Vec<usize>, Vec<String>)> = BTreeMap::new();
        for partition in 0..PARTITIONS {
            let reader = client
                .partition_client(topic.as_str(), partition, UnknownTopicHandling::Error)
                .await
                .unwrap();
            let (records, _) = reader.fetch_records(0, 1..10_000_000, 1_000).await.unwrap();
            for record in records {
                let key = String::from_utf8(record.record.key.unwrap()).unwrap();
                let event: Event = serde_json::from_slice(&record.record.value.unwrap()).unwrap();
                assert_eq!(event.aggregate_id, key);
                assert_eq!(
                    record.record.headers[EVENT_ID_HEADER],
                    event.event_id.to_string().into_bytes()
                );
                let seen = keys.entry(key).or_default();
                seen.0.push(partition as usize);
                seen.1.push(event.event_type);
            }
        }
        assert_eq!(keys.len(), 5);
        let in_order: Vec<String> = (0..6).map(|step| format!("step-{step}")).collect();
        for (key, (partitions, types)) in &keys {
            let chosen = partition_for_key(key.as_bytes(), PARTITIONS as usize);
            assert!(
                partitions.iter().all(|p| *p == chosen),
                "{key}: {partitions:?}"
            );
            assert_eq!(types, &in_order, "{key}");
        }

        let port = url.rsplit(':').next().unwrap();
        let user = url["kafka://".len()..].split(':').next().unwrap();
        for intruder in [
            format!("kafka://127.0.0.1:{port}"),
            format!("kafka://{user}:wrong@127.0.0.1:{port}"),
        ] {
            let answered = async {
                connect::kafka(&intruder).await?.list_topics().await?;
                anyhow::Ok(())
            };
            assert!(answered.await.is_err(), "{intruder} got in");
        }

        // The same broker as another run's --kafka-url: its topics carry the run's prefix, and
        // go at its end; the private broker's topic stays.
        let external = Kafka::new(Some(&url), "run1", false);
        let theirs = external
            .create_topic("outbox.event.orders", PARTITIONS)
            .await
            .unwrap();
        assert_eq!(theirs, "outboxlab_run1_outbox.event.orders");
        external.close().await.unwrap();
        let names: Vec<String> = client
            .list_topics()
            .await
            .unwrap()
            .into_iter()
            .map(|t| t.name)
            .collect();
        assert!(!names.contains(&theirs), "{theirs} left behind");
        assert!(names.contains(&topic), "{topic} deleted");
        kafka.close().await.unwrap();
        assert!(!dir[0].exists(), "{} left behind", dir[0].display());
    });
}

/// A verify run SIGKILLed while its private broker runs leaves it behind, out of reach; the
/// next run removes it, verifies through Kafka, and leaves nothing of its own. The next run's
/// relay is verify's help example, `--sink {sink_url}` on its command line (no credentials
/// there): it takes the URL with them from its environment.
#[test]
fn a_sigkilled_runs_broker_is_removed_by_the_next_run() {
    let args = |results: &str, events: &str| {
        let relay = match events {
            "50" => our_relay(""),
            _ => our_relay_from_its_environment(),
        };
        let mut command = outbox_lab();
        command
            .args(["verify", "--relay-cmd", &relay, "--sink", "kafka"])
            .args(["--nemesis", "none", "--events", events, "--format", "json"])
            .arg("--results-dir")
            .arg(scratch_dir(results));
        command
    };
    let mut killed = args("kafka-killed", "20000")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = killed.id();
    let dir = outbox_lab::wait::blocking_up_to(
        Duration::from_secs(60),
        Duration::from_millis(50),
        || {
            let dir = throwaway_dirs_of("kafka", pid).into_iter().next()?;
            let log = std::fs::read_to_string(dir.join("tansu.log")).ok()?;
            log.contains("ready in").then_some(dir)
        },
    );
    let Some(dir) = dir else {
        let _ = killed.kill();
        panic!("no private Kafka broker came up");
    };
    assert_broker_is_out_of_reach(&dir);
    sigkill(killed);
    let left: Vec<ProcessId> = processes_in(&dir)
        .into_iter()
        .filter_map(ProcessId::of)
        .collect();
    assert!(!left.is_empty(), "a SIGKILLed run cannot stop its broker");

    let (next, run) = run_tracked(&mut args("kafka-next", "50"));
    assert_passed(&run);
    assert!(!dir.exists(), "{} left behind", dir.display());
    assert_ended("tansu", &left);
    let own = throwaway_dirs_of("kafka", next);
    assert!(own.is_empty(), "the passing run left {own:?}");
}

/// `kill:relay:on-delivery@3` through Kafka: the relay dies once the broker acked its 3rd
/// Produce, before the answer reached it (the proxy holds it), so it never marked those rows;
/// its successor produces them again. The naive consumer ships them twice, the idempotent one
/// once: duplicates that only the consumer can absorb.
#[test]
fn a_relay_killed_between_kafkas_ack_and_its_mark_duplicates_for_the_naive_consumer() {
    let relay = our_relay_from_its_environment();
    for consumer in ["naive", "idempotent"] {
        let run = verify(&[
            "--relay-cmd",
            &relay,
            "--sink",
            "kafka",
            "--consumer",
            consumer,
            "--schedule",
            "kill:relay:on-delivery@3",
            "--events",
            "100",
        ]);
        assert_eq!(
            run.metric("verify.faults_fired"),
            1,
            "{consumer}: {}",
            run.stderr
        );
        assert_eq!(run.metric("verify.lost.violating"), 0, "{consumer}");
        if consumer == "naive" {
            assert_eq!(run.code, 1, "{}", run.stderr);
            assert!(run.metric("verify.duplicate.violating") >= 1);
        } else {
            assert_passed(&run);
        }
    }
}

/// The network faults on the Kafka link, for the naive consumer. `net:reply-lost@2`: the broker
/// wrote the 2nd Produce and its answer was lost, so the relay, after its request timeout,
/// produced those records again: shipped twice. `net:reset@2`: the 2nd Produce never reached
/// the broker (its connection reset), so the relay's retry wrote them once: nothing twice.
/// `net:down` for a second: every connection refused, then the relay delivers everything. Each
/// fault fired; none lost anything.
#[test]
fn a_lost_produce_answer_duplicates_and_a_reset_or_an_outage_does_not() {
    let relay = our_relay_from_its_environment();
    for (schedule, duplicates) in [
        ("net:reply-lost@2", true),
        ("net:reset@2", false),
        ("net:down@1s+1s", false),
    ] {
        let run = verify(&[
            "--relay-cmd",
            &relay,
            "--sink",
            "kafka",
            "--consumer",
            "naive",
            "--schedule",
            schedule,
            "--events",
            "100",
        ]);
        let said = format!("{schedule}: {}", run.stderr);
        assert_eq!(run.metric("verify.faults_fired"), 1, "{said}");
        assert_eq!(run.metric("verify.lost.violating"), 0, "{said}");
        if duplicates {
            assert_eq!(run.code, 1, "{said}");
            assert!(run.metric("verify.duplicate.violating") >= 1, "{said}");
        } else {
            assert_passed(&run);
            assert_eq!(run.metric("verify.duplicate.violating"), 0, "{said}");
        }
    }
}

/// kafka-retries: a refused Produce, retried, keeps every order's events in order with one
/// request in flight and puts one order's later event first with five (order 2: its outbox ids
/// 5, 6, 4, as the proxy refused the 2nd request, records 3 and 4); the relay killed between
/// Kafka's ack and its mark duplicates 3 orders for the naive consumer and none for the
/// idempotent one.
#[test]
fn a_retried_produce_reorders_only_with_several_in_flight() {
    let run = scenario("kafka-retries", &[]);
    assert_passed(&run);
    assert_eq!(run.metric("in_flight1.orders_out_of_order"), 0);
    assert_eq!(run.metric("in_flight5.orders_out_of_order"), 1);
    assert_eq!(run.metric("in_flight5.records"), 60);
    assert_eq!(run.metric("crash.naive.orders_shipped_twice"), 3);
    assert_eq!(run.metric("crash.idempotent.orders_shipped_twice"), 0);
}
