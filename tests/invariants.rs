//! The one definition of each invariant, on real PostgreSQL: each bites on the damage it
//! names and on nothing else, the scenarios' figures count the same rows, and `outbox-lab
//! check` on a live database takes a row a relay still owes for pending, not lost, names a
//! duplicate shipment, and judges a consumer's tables in a database of their own.

use crate::common;

use std::time::Duration;

use common::{block_on, create_database, outbox_lab, query_i64, write_orders};
use outbox_lab::explore::checker;
use outbox_lab::harness::db::Database;
use outbox_lab::judge::counts;
use outbox_lab::judge::invariants::{self, Invariant, Moment};
use outbox_lab::outbox::schema;
use tokio_postgres::Client;

/// Three orders, order 1 with two events, all delivered once and in order, all marked
/// published: every invariant holds.
const DELIVERED: &str = "
INSERT INTO orders(customer_id, amount) SELECT n, 10 FROM generate_series(1, 3) n;
INSERT INTO outbox(aggregate_type, aggregate_id, event_type, payload, published_at)
VALUES ('orders', '1', 'OrderCreated', '{}', now()),
       ('orders', '1', 'OrderUpdated2', '{}', now()),
       ('orders', '2', 'OrderCreated', '{}', now()),
       ('orders', '3', 'OrderCreated', '{}', now());
INSERT INTO consumer.shipments(order_id, event_id)
SELECT aggregate_id, event_id FROM outbox ORDER BY id;
INSERT INTO consumer.receipts(event_id, outbox_id, order_id, event_type, injected_fault)
SELECT event_id, id, aggregate_id, event_type, false FROM outbox ORDER BY id";

/// Order 1's receipts rewritten: its second event received before its first (the shipments,
/// untouched, are in order: the order check reads the receipts).
const RECEIVED_ORDER_1_BACKWARDS: &str = "
DELETE FROM consumer.receipts WHERE order_id = '1';
INSERT INTO consumer.receipts(event_id, outbox_id, order_id, event_type, injected_fault)
SELECT event_id, id, aggregate_id, event_type, false FROM outbox WHERE aggregate_id = '1'
 ORDER BY id DESC";

fn database(name: &str, damage: &str) -> Database {
    let name = format!("invariants_{name}_{}", std::process::id());
    let sql = [
        schema::CREATE_OUTBOX,
        schema::CREATE_CONSUMER,
        DELIVERED,
        damage,
    ];
    create_database(&name, &sql.join(";\n"))
}

async fn offending(client: &Client, invariant: Invariant, moment: Moment) -> Vec<String> {
    invariants::offending(client, invariant, moment)
        .await
        .unwrap()
}

/// Each invariant, on a database with exactly its damage, names what broke it; the others hold.
#[test]
fn each_invariant_bites_on_its_own_damage_and_nothing_else() {
    let cases: [(&str, &str, Invariant, &[&str]); 7] = [
        (
            "ghost",
            // The naive app sent order 7's event; its COMMIT never came.
            "INSERT INTO consumer.shipments(order_id, event_id) VALUES ('7', gen_random_uuid())",
            Invariant::Ghost,
            &["order 7"],
        ),
        (
            "lost_marked",
            // Marked published (mark-before-send), never sent.
            "INSERT INTO outbox(aggregate_type, aggregate_id, event_type, payload, published_at)
             VALUES ('orders', '3', 'OrderUpdated2', '{}', now())",
            Invariant::Lost,
            &["outbox 5"],
        ),
        (
            "lost_dual_write",
            // The naive app committed order 4 and died before sending (no outbox row).
            "INSERT INTO orders(customer_id, amount) VALUES (4, 10)",
            Invariant::Lost,
            &["order 4"],
        ),
        (
            "duplicate",
            "INSERT INTO consumer.shipments(order_id, event_id)
             SELECT aggregate_id, event_id FROM outbox WHERE id = 3",
            Invariant::Duplicate,
            &["outbox 3"],
        ),
        (
            "duplicate_by_business_key",
            // The naive app sent order 2's OrderCreated again under a fresh event id: no event
            // id has two shipments, the order has two for one event.
            "INSERT INTO consumer.shipments(order_id, event_id)
             VALUES ('2', '00000000-0000-0000-0000-000000000002');
             INSERT INTO consumer.receipts(event_id, outbox_id, order_id, event_type, injected_fault)
             VALUES ('00000000-0000-0000-0000-000000000002', NULL, '2', 'OrderCreated', false)",
            Invariant::Duplicate,
            &["order 2 OrderCreated"],
        ),
        (
            "order",
            // The consumer received order 1's second event before its first.
            RECEIVED_ORDER_1_BACKWARDS,
            Invariant::Order,
            &["order 1"],
        ),
        (
            "redelivered_in_order",
            // A redelivery of order 1's first event after its second is a duplicate, not a
            // reordering: the first effects are in order.
            "INSERT INTO consumer.shipments(order_id, event_id)
             SELECT aggregate_id, event_id FROM outbox WHERE id = 1",
            Invariant::Duplicate,
            &["outbox 1"],
        ),
    ];
    let clean = database("clean", "");
    block_on(async {
        let client = clean.connect().await.unwrap();
        let violations = checker::check(&client, None).await.unwrap();
        assert!(violations.is_empty(), "clean: {violations:?}");
    });
    for (name, damage, invariant, expected) in cases {
        let db = database(name, damage);
        block_on(async {
            let client = db.connect().await.unwrap();
            let violations = checker::check(&client, None).await.unwrap();
            let broken: Vec<Invariant> = violations.keys().copied().collect();
            assert_eq!(broken, [invariant], "{name}: {violations:?}");
            assert_eq!(violations[&invariant], expected, "{name}");
        });
    }
}

/// A stuck run (the supervisor's verdict) is a liveness violation naming the rows still owed,
/// which are not lost (the run never recovered); a drained run with the same row lost it.
#[test]
fn liveness_is_the_supervisors_verdict_after_recovery() {
    let owed = "INSERT INTO outbox(aggregate_type, aggregate_id, event_type, payload)
                VALUES ('orders', '3', 'OrderUpdated2', '{}')";
    let db = database("liveness", owed);
    block_on(async {
        let client = db.connect().await.unwrap();
        let why = "not drained within 3 s";
        let stuck = checker::check(&client, Some(why)).await.unwrap();
        assert_eq!(
            stuck.get(&Invariant::Liveness).map(Vec::as_slice),
            Some(&[why.to_string(), "outbox 5".to_string()][..])
        );
        assert_eq!(stuck.len(), 1, "{stuck:?}");
        let drained = checker::check(&client, None).await.unwrap();
        assert_eq!(
            drained.get(&Invariant::Lost).map(Vec::as_slice),
            Some(&["outbox 5".to_string()][..])
        );
        assert_eq!(drained.len(), 1, "{drained:?}");
    });
}

/// Damage of every kind at once: the scenarios' figures count exactly the invariants' rows.
#[test]
fn scenario_figures_count_the_invariants_rows() {
    let db = database(
        "figures",
        &format!(
            "INSERT INTO consumer.shipments(order_id, event_id) VALUES ('7', gen_random_uuid());
         INSERT INTO orders(customer_id, amount) VALUES (4, 10);
         INSERT INTO outbox(aggregate_type, aggregate_id, event_type, payload, published_at)
         VALUES ('orders', '3', 'OrderUpdated2', '{{}}', now()),
                ('orders', '3', 'OrderUpdated3', '{{}}', NULL);
         INSERT INTO consumer.shipments(order_id, event_id)
         SELECT aggregate_id, event_id FROM outbox, generate_series(1, 2) WHERE id = 3;
         {RECEIVED_ORDER_1_BACKWARDS}"
        ),
    );
    block_on(async {
        let client = db.connect().await.unwrap();
        let after = Moment::AfterRecovery;
        assert_eq!(
            offending(&client, Invariant::Lost, after).await,
            ["order 4", "outbox 5", "outbox 6"]
        );
        assert_eq!(
            offending(&client, Invariant::Duplicate, after).await,
            ["outbox 3"]
        );

        let deliveries = counts::one_row(&client, counts::DELIVERIES).await.unwrap();
        assert_eq!(deliveries.get::<_, i64>("lost"), 3);
        assert_eq!(deliveries.get::<_, i64>("orders_shipped_twice"), 1);
        assert_eq!(deliveries.get::<_, i64>("duplicate_shipments"), 2);
        let dual_write = counts::one_row(&client, counts::DUAL_WRITE).await.unwrap();
        assert_eq!(dual_write.get::<_, i64>("ghost_shipments"), 1);
        assert_eq!(dual_write.get::<_, i64>("orders_without_shipment"), 1);
        let reversals = counts::one_row(&client, counts::REVERSALS).await.unwrap();
        assert_eq!(reversals.get::<_, i64>("reversals"), 1);
        assert_eq!(reversals.get::<_, i64>("orders_out_of_order"), 1);
        let lost_ids = counts::ids(&client, counts::LOST_IDS, &[]).await.unwrap();
        assert_eq!(lost_ids, [5, 6]);
        assert_eq!(
            counts::count(&client, counts::ORDERS_WITHOUT_EVENT)
                .await
                .unwrap(),
            1
        );
        assert_eq!(
            counts::count(&client, counts::UNPUBLISHED).await.unwrap(),
            1
        );
        let all_received: bool = client
            .query_one(counts::ALL_RECEIVED, &[])
            .await
            .unwrap()
            .get(0);
        assert!(!all_received);
    });
}

/// Jepsen's "maybe": on a live database an undelivered row no relay has marked is pending (it
/// will be sent, maybe again), not lost; `check` says so and exits 0. After recovery the same
/// row is lost. Marked published without a shipment, it is lost either way: `check` exits 1.
#[test]
fn a_row_a_relay_still_owes_is_pending_on_a_live_database() {
    let owed = "INSERT INTO outbox(aggregate_type, aggregate_id, event_type, payload)
                VALUES ('orders', '3', 'OrderUpdated2', '{}')";
    let db = database("pending", owed);
    block_on(async {
        let client = db.connect().await.unwrap();
        assert!(offending(&client, Invariant::Lost, Moment::Live)
            .await
            .is_empty());
        assert_eq!(
            offending(&client, Invariant::Lost, Moment::AfterRecovery).await,
            ["outbox 5"]
        );
    });
    let check = |db: &Database| {
        let out = outbox_lab()
            .args(["check", "--database-url", &db.url()])
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, report) = check(&db);
    assert_eq!(code, Some(0), "{report}");
    assert!(report.contains("1 outbox rows are pending"), "{report}");
    assert!(report.contains("clean"), "{report}");

    block_on(async {
        let client = db.connect().await.unwrap();
        client
            .batch_execute("UPDATE outbox SET published_at = now() WHERE id = 5")
            .await
            .unwrap();
    });
    let (code, report) = check(&db);
    assert_eq!(code, Some(1), "{report}");
    let lost = report
        .lines()
        .find(|l| l.trim_start().starts_with("lost"))
        .unwrap_or_else(|| panic!("no lost row:\n{report}"));
    assert!(lost.contains("outbox 5"), "{report}");
    assert!(!report.contains("pending"), "{report}");
}

/// `check` names what a naive consumer did to a redelivered event: a duplicate shipment.
#[test]
fn check_reports_a_duplicate_shipment() {
    let name = format!("invariants_check_dup_{}", std::process::id());
    let db = create_database(
        &name,
        &[schema::CREATE_OUTBOX, schema::CREATE_CONSUMER].join(";\n"),
    );
    write_orders(&db, 1);
    block_on(async {
        let client = db.connect().await.unwrap();
        client
            .batch_execute(
                "UPDATE outbox SET published_at = clock_timestamp();
                 INSERT INTO consumer.shipments(order_id, event_id)
                 SELECT aggregate_id, event_id FROM outbox, generate_series(1, 2)",
            )
            .await
            .unwrap();
    });
    let out = outbox_lab()
        .args(["check", "--database-url", &db.url()])
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert!(
        report.contains("duplicate") && report.contains("outbox 1"),
        "{report}"
    );
}

/// The several-hosts setup: orders and outbox in the application's database, the consumer's
/// tables in its own. `check --consumer-database-url` judges them together: clean when every
/// event was shipped once, a ghost when the consumer shipped an order the application never
/// committed; judged on the application's database alone, the same shipments look lost.
#[test]
fn check_judges_a_consumer_in_another_database() {
    let tag = std::process::id();
    let shop = create_database(
        &format!("invariants_check_shop_{tag}"),
        schema::CREATE_OUTBOX,
    );
    let shipping = create_database(
        &format!("invariants_check_shipping_{tag}"),
        schema::CREATE_CONSUMER,
    );
    write_orders(&shop, 2);
    let events: Vec<(String, uuid::Uuid)> = block_on(async {
        let client = shop.connect().await.unwrap();
        client
            .batch_execute("UPDATE outbox SET published_at = clock_timestamp()")
            .await
            .unwrap();
        let rows = client
            .query("SELECT aggregate_id, event_id FROM outbox", &[])
            .await
            .unwrap();
        rows.iter().map(|r| (r.get(0), r.get(1))).collect()
    });
    let ship = |sql: &str| {
        block_on(async {
            shipping
                .connect()
                .await
                .unwrap()
                .batch_execute(sql)
                .await
                .unwrap()
        })
    };
    for (order, event) in &events {
        ship(&format!(
            "INSERT INTO consumer.shipments(order_id, event_id) VALUES ('{order}', '{event}')"
        ));
    }
    let check = |extra: &[&str]| {
        let out = outbox_lab()
            .args(["check", "--database-url", &shop.url()])
            .args(extra)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.code(), text)
    };
    let (code, report) = check(&["--consumer-database-url", &shipping.url()]);
    assert_eq!(code, Some(0), "{report}");

    // Alone, the application's database has no consumer tables: said in one line, exit 2.
    let (code, report) = check(&[]);
    assert_eq!(code, Some(2), "{report}");
    assert!(report.contains("consumer.shipments"), "{report}");

    ship("INSERT INTO consumer.shipments(order_id, event_id) VALUES ('999999', gen_random_uuid())");
    let (code, report) = check(&["--consumer-database-url", &shipping.url()]);
    assert_eq!(code, Some(1), "{report}");
    assert!(report.contains("order 999999"), "{report}");
    // Nothing was written to either database: the copies were temporary, dropped as `check`'s
    // session ends (the server finishes that a moment after the process has exited).
    let copies = "SELECT count(*) FROM pg_tables WHERE tablename IN ('orders', 'outbox')";
    let gone = outbox_lab::wait::blocking_up_to(
        Duration::from_secs(10),
        Duration::from_millis(20),
        || query_i64(&shipping.name, copies) == 0,
    );
    assert!(
        gone.is_some(),
        "{} copies left",
        query_i64(&shipping.name, copies)
    );
}
