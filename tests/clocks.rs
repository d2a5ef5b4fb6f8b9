//! Clocks stepped under the relays (`clock:step:relay`, `clock:step:db`): the article's relays,
//! whose leases and retries are the database's, keep every claim; a lease kept on the relay's
//! own clock is taken by a relay whose clock is ahead; and a step of the server's clock does
//! reach PostgreSQL (`now()`), while the judge's times stay the machine's.

use std::time::Duration;

use crate::common;

use common::verify::{example, our_relay, verify_alone};
use common::{assert_passed, block_on, scratch_dir, Run};
use outbox_lab::harness::db::{PgServer, ServerChoice};

fn verify_on_own_cluster(name: &str, args: &[&str]) -> Run {
    let results = scratch_dir(name);
    Run::from(verify_alone(&results, args).output().unwrap())
}

/// outbox-lab's relay (two of them) and the article's, each with relay 0's clock a minute ahead
/// and a minute behind, and the article's with the server's a minute ahead: each keeps every
/// claim, since its lock, its retries' due times and its marks are the database's, on one
/// clock; and every step fired (issue 46's "done when").
#[test]
fn relays_on_the_databases_clock_hold_when_clocks_step() {
    let relay = our_relay("");
    let article = example("article.py");
    for (name, relay, relays, nemesis) in [
        ("clock-ours-ahead", relay.as_str(), "2", "clock-step-relay"),
        (
            "clock-ours-behind",
            relay.as_str(),
            "2",
            "clock-step-relay-back",
        ),
        (
            "clock-article-ahead",
            article.as_str(),
            "1",
            "clock-step-relay",
        ),
        (
            "clock-article-behind",
            article.as_str(),
            "1",
            "clock-step-relay-back",
        ),
        (
            "clock-article-server",
            article.as_str(),
            "1",
            "clock-step-db",
        ),
    ] {
        let run = verify_on_own_cluster(
            name,
            &[
                "--relay-cmd",
                relay,
                "--relays",
                relays,
                "--nemesis",
                nemesis,
                "--events",
                "400",
            ],
        );
        assert_passed(&run);
        assert_eq!(run.metric("verify.faults_fired"), 1, "{name}");
        assert_eq!(run.metric("verify.delivered_distinct"), 400, "{name}");
    }
}

/// lease.py keeping its lease on its own clock, two relays, relay 0's clock a minute ahead:
/// relay 0 takes relay 1's live leases for expired and delivers what relay 1 is delivering:
/// the naive consumer ships events twice. The same relays keeping the lease on the server's
/// clock ship none twice: the check bites on whose clock, nothing else.
#[test]
fn a_lease_on_the_relays_own_clock_is_taken_by_a_relay_ahead() {
    let schema =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/relays/lease_schema.sql");
    let run = |clock: &str| {
        let relay = format!(
            "{} --lease-ms 2000 --lease-clock {clock}",
            example("lease.py")
        );
        verify_on_own_cluster(
            &format!("clock-lease-{clock}"),
            &[
                "--relay-cmd",
                &relay,
                "--relays",
                "2",
                "--consumer",
                "naive",
                "--schema",
                schema.to_str().unwrap(),
                "--insert-sql",
                "INSERT INTO lease_outbox (message_id, aggregate_id, aggregate_type, \
                 event_type, payload) VALUES ($1, $2, $3, $4, $5)",
                "--pending-sql",
                "SELECT count(*) FROM lease_outbox WHERE processed_at IS NULL",
                "--schedule",
                "clock:step:relay@250ms+60s",
                "--events",
                "400",
            ],
        )
    };
    let on_its_own = run("relay");
    assert_eq!(on_its_own.code, 1, "{}", on_its_own.stderr);
    assert_eq!(on_its_own.metric("verify.faults_fired"), 1);
    assert!(on_its_own.metric("verify.duplicate.violating") >= 1);
    assert_eq!(on_its_own.metric("verify.lost.violating"), 0);
    assert_passed(&run("db"));
}

/// The server's clock, stepped a minute ahead, moves PostgreSQL's `now()` by a minute at once
/// (libfaketime reaches it); the machine's clock does not move.
#[test]
fn a_step_of_the_servers_clock_reaches_postgresql() {
    block_on(async {
        let choice = ServerChoice {
            database_url: None,
            pg_bin: None,
            keep: false,
            commit_timestamps: false,
            fake_clock: true,
        };
        let server = PgServer::open(&choice, "clocks").await.unwrap();
        let db = server.create_database("clock").await.unwrap();
        let client = db.connect().await.unwrap();
        let ahead = async || {
            let row = client
                .query_one(
                    "SELECT extract(epoch FROM clock_timestamp())::float8 * 1000",
                    &[],
                )
                .await
                .unwrap();
            let server_ms: f64 = row.get(0);
            server_ms - chrono::Utc::now().timestamp_millis() as f64
        };
        let before = ahead().await;
        assert!(before.abs() < 2_000.0, "off by {before} ms before the step");
        let clock = server.clock().unwrap().as_ref().unwrap();
        assert_eq!(clock.step(60_000).unwrap(), 60_000);
        tokio::time::sleep(Duration::from_millis(50)).await;
        let after = ahead().await;
        assert!(
            (after - 60_000.0).abs() < 2_000.0,
            "off by {after} ms after"
        );
        drop(client);
        server.close().await.unwrap();
    });
}
