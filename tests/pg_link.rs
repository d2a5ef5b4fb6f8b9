//! The PostgreSQL link (`harness::link::postgres`) under real traffic, in this process, with
//! real clients (psycopg 3, psql) on the suite's cluster: a pipeline sending while it reads,
//! large values, a connection stuck mid-write reset, a lost answer in autocommit, a backend
//! that ends before its actor does, and who may come in.

use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use outbox_lab::harness::cluster::SUPERUSER;
use outbox_lab::harness::db::Database;
use outbox_lab::harness::link::postgres::{PgLink, PgProxy};
use tokio::process::{Child, Command};

use crate::common::{block_on, create_database};

/// Debian's python3, where python3-psycopg (psycopg 3) is installed.
const PYTHON: &str = "/usr/bin/python3";

/// psycopg's pipeline: every statement sent before any result is read, so both ways are full
/// at once (3000 statements of 4 kB, each answered with 20 kB).
const PIPELINE: &str = r#"
import sys, psycopg
param = "p" * 4000
with psycopg.connect(sys.argv[1], autocommit=True) as conn:
    with conn.pipeline():
        cursors = [conn.execute("SELECT %s::text, repeat('x', 20000)", (param,))
                   for _ in range(3000)]
    rows = [c.fetchone() for c in cursors]
    assert all(len(a) == 4000 and len(b) == 20000 for a, b in rows)
    print(len(rows))
"#;
/// 0.55 s direct on this 2-core machine; through the link it must not hang (it did, forever).
const PIPELINE_LIMIT: Duration = Duration::from_secs(60);
/// Done when under 10 s: asserted at 30 s, room for a machine busy with other builds.
const PIPELINE_BOUND: Duration = Duration::from_secs(30);

/// Reads a whole 150 MB value (psycopg holds it in its own process, not ours).
const LARGE_VALUE: &str = r#"
import sys, psycopg
with psycopg.connect(sys.argv[1]) as conn:
    value, = conn.execute("SELECT repeat('x', 150 * 1024 * 1024)").fetchone()
    print(len(value))
"#;
/// Three readers of 150 MB each finish within this (about 1 s each direct).
const LARGE_VALUES_LIMIT: Duration = Duration::from_secs(120);
/// The link's own memory per connection is a few tens of kB: the test process may grow by
/// this much while 3 × 150 MB pass (it grew by more than 450 MB when the link gathered each
/// message whole); the rest of the margin is the runtime's and other tests' allocations.
const LARGE_VALUES_GROWTH: u64 = 100 * 1024 * 1024;
/// How often the test reads its own resident memory while the values pass.
const RSS_SAMPLE: Duration = Duration::from_millis(10);

/// Asks for 200 MB in rows of 1 kB and never reads them: the backend blocks writing
/// (ClientWrite) once the sockets on the way are full, the link with a write pending.
const STUCK_READER: &str = r#"
import sys, time, psycopg
conn = psycopg.connect(sys.argv[1])
conn.pgconn.send_query(b"SELECT repeat('x', 1024) FROM generate_series(1, 200 * 1024)")
time.sleep(300)
"#;
/// Connects and stays idle, its connection untouched, until it is killed.
const IDLE_CLIENT: &str = r#"
import sys, time, psycopg
conn = psycopg.connect(sys.argv[1])
time.sleep(300)
"#;
/// Three INSERTs in autocommit, a statement each, until one's answer is lost.
const AUTOCOMMIT_INSERTS: &str = r#"
import sys, psycopg
conn = psycopg.connect(sys.argv[1], autocommit=True)
for n in (1, 2, 3):
    try:
        conn.execute("INSERT INTO answered (n) VALUES (%s)", (n,))
        print(f"insert {n} answered")
    except psycopg.OperationalError:
        print(f"insert {n} lost")
        break
"#;
/// BEGIN, INSERT, COMMIT (psycopg's transaction, committed as the block ends).
const EXPLICIT_INSERT: &str = r#"
import sys, psycopg
with psycopg.connect(sys.argv[1]) as conn:
    conn.execute("INSERT INTO answered (n) VALUES (10)")
"#;
const AUTOCOMMIT_SELECT: &str = r#"
import sys, psycopg
with psycopg.connect(sys.argv[1], autocommit=True) as conn:
    print(conn.execute("SELECT count(*) FROM answered").fetchone()[0])
"#;
/// A client's session of a few statements ends within this (well under a second idle).
const CLIENT_LIMIT: Duration = Duration::from_secs(60);

/// How long the backend may take to block writing, and to be gone once its link is reset:
/// each is well under a second on an idle machine.
const BACKEND_PATIENCE: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(50);

/// `script` run by Debian's python3 with `args`, killed when dropped.
fn python(script: &str, args: &[&str]) -> Child {
    Command::new(PYTHON)
        .arg("-c")
        .arg(script)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("Debian's python3 runs")
}

/// `child`'s output once it ended by itself within `limit`; the test fails if it did not.
async fn ended_within(child: Child, limit: Duration, what: &str) -> Output {
    match tokio::time::timeout(limit, child.wait_with_output()).await {
        Ok(output) => output.expect("its output"),
        Err(_) => panic!("{what} did not end within {limit:?}: it hangs"),
    }
}

/// The output of a python run that must have succeeded.
fn succeeded(output: &Output, what: &str) -> String {
    assert!(
        output.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// This process's resident memory, in bytes.
fn resident() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb * 1024
}

/// `db` as an actor reaches it through `link`: a URL for libpq.
fn through(link: &PgLink, db: &Database) -> String {
    link.database(db).unwrap().url()
}

/// `sql` run by psql through `link` as `user` on `database`.
async fn psql(link: &PgLink, user: &str, database: &str, sql: &str) -> Output {
    let psql = Command::new("psql")
        .args(["-h", &link.host, "-p", &link.port.to_string()])
        .args(["-U", user, "-d", database, "-Atc", sql])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("psql runs");
    ended_within(psql, CLIENT_LIMIT, "psql").await
}

/// The rows of `table`, counted on the server directly.
async fn rows(db: &Database, table: &str) -> i64 {
    let client = db.connect().await.unwrap();
    let sql = format!("SELECT count(*) FROM {table}");
    client.query_one(&sql, &[]).await.unwrap().get(0)
}

/// The wait event of backend `pid` (`None` when it has none, or is gone: see `exists`).
async fn backend_state(db: &Database, pid: i32) -> Option<Option<String>> {
    let client = db.connect().await.unwrap();
    let row = client
        .query_opt(
            "SELECT wait_event FROM pg_stat_activity WHERE pid = $1",
            &[&pid],
        )
        .await
        .unwrap();
    row.map(|row| row.get(0))
}

/// psycopg's pipeline sends while it reads: the link pumps each way on its own, so a full
/// socket one way never stops the other (through one loop both ways, it hung forever: both
/// sockets full, the backend in ClientWrite).
#[test]
fn a_pipeline_sending_while_it_reads_goes_through() {
    let db = create_database("pg_link_pipeline", "");
    block_on(async {
        let proxy = PgProxy::start(&db.config().unwrap(), 1, None)
            .await
            .unwrap();
        let url = through(proxy.link(0), &db);
        let started = Instant::now();
        let output = ended_within(python(PIPELINE, &[&url]), PIPELINE_LIMIT, "the pipeline").await;
        let took = started.elapsed();
        println!("3000 pipelined statements through the link in {took:?}");
        assert_eq!(succeeded(&output, "the pipeline").trim(), "3000");
        assert!(took < PIPELINE_BOUND, "{took:?}");
    });
}

/// Set in the process of its own that [`large_values_pass_without_the_link_holding_them`]
/// measures in.
const MEASURED_ALONE: &str = "OUTBOX_LAB_TEST_MEASURED_ALONE";

/// Three connections each read a 150 MB value through one link: it streams the server's
/// messages and keeps none whole, so this process (the link's) hardly grows. Resident memory is
/// the process's: the test runs again in a process of its own, where no other test of the suite
/// allocates beside it (beside them it read +209 MB once).
#[test]
fn large_values_pass_without_the_link_holding_them() {
    if std::env::var_os(MEASURED_ALONE).is_none() {
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "pg_link::large_values_pass_without_the_link_holding_them",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(MEASURED_ALONE, "1")
            .status()
            .unwrap();
        assert!(status.success(), "measured alone: {status}");
        return;
    }
    let db = create_database("pg_link_large", "");
    block_on(async {
        let proxy = PgProxy::start(&db.config().unwrap(), 1, None)
            .await
            .unwrap();
        let url = through(proxy.link(0), &db);
        let before = resident();
        let mut readers: Vec<Child> = (0..3).map(|_| python(LARGE_VALUE, &[&url])).collect();
        let mut peak = before;
        let started = Instant::now();
        loop {
            peak = peak.max(resident());
            let running = readers.iter_mut().any(|r| r.try_wait().unwrap().is_none());
            if !running {
                break;
            }
            assert!(started.elapsed() < LARGE_VALUES_LIMIT, "the readers hang");
            tokio::time::sleep(RSS_SAMPLE).await;
        }
        for reader in readers {
            let output = reader.wait_with_output().await.unwrap();
            let read = succeeded(&output, "a reader of 150 MB");
            assert_eq!(read.trim(), (150 * 1024 * 1024).to_string());
        }
        let growth = peak.saturating_sub(before);
        println!(
            "3 x 150 MB through the link: resident {} MB before, peak {} MB (+{} MB)",
            before >> 20,
            peak >> 20,
            growth >> 20
        );
        assert!(growth < LARGE_VALUES_GROWTH, "grew by {} MB", growth >> 20);
    });
}

/// A reset ends a connection even while the link is stuck writing to an actor that does not
/// read: the backend, blocked in ClientWrite, sees its client gone and ends.
#[test]
fn a_reset_ends_a_connection_stuck_mid_write() {
    let db = create_database("pg_link_stuck", "");
    block_on(async {
        let proxy = PgProxy::start(&db.config().unwrap(), 1, None)
            .await
            .unwrap();
        let link = proxy.link(0);
        let url = through(link, &db);
        let _reader = python(STUCK_READER, &[&url]);
        let started = Instant::now();
        let pid = loop {
            if let Some(&pid) = link.backends().first() {
                if backend_state(&db, pid).await == Some(Some("ClientWrite".into())) {
                    break pid;
                }
            }
            assert!(
                started.elapsed() < BACKEND_PATIENCE,
                "the backend never blocked writing"
            );
            tokio::time::sleep(POLL).await;
        };
        assert_eq!(link.reset(), 1);
        let reset = Instant::now();
        while backend_state(&db, pid).await.is_some() {
            assert!(
                reset.elapsed() < BACKEND_PATIENCE,
                "backend {pid} still there {:?} after its link was reset",
                reset.elapsed()
            );
            tokio::time::sleep(POLL).await;
        }
    });
}

/// A relay in autocommit ends each write with its ReadyForQuery: losing the 2nd such answer
/// loses it after the server committed (the row is there, the client saw its connection
/// break). An explicit transaction is one committing answer, its COMMIT's; a read is none.
#[test]
fn a_write_in_autocommit_is_a_committing_answer() {
    let db = create_database("pg_link_autocommit", "CREATE TABLE answered (n int)");
    block_on(async {
        let proxy = PgProxy::start(&db.config().unwrap(), 3, None)
            .await
            .unwrap();
        let (autocommit, explicit, read) = (proxy.link(0), proxy.link(1), proxy.link(2));
        autocommit.lose_commit(2);
        let inserts = python(AUTOCOMMIT_INSERTS, &[&through(autocommit, &db)]);
        let output = ended_within(inserts, CLIENT_LIMIT, "the inserts").await;
        let said = succeeded(&output, "the inserts");
        assert_eq!(
            said.lines().collect::<Vec<_>>(),
            ["insert 1 answered", "insert 2 lost"]
        );
        // The 2nd committed all the same; the 3rd never ran.
        assert_eq!(rows(&db, "answered").await, 2);
        let (_, backend) = autocommit.commit_lost(2).expect("the 2nd answer lost");
        assert!(backend.is_some());
        assert_eq!(autocommit.committing_answers(), 2);
        assert_eq!(autocommit.commits_lost(), 1);

        let insert = python(EXPLICIT_INSERT, &[&through(explicit, &db)]);
        succeeded(
            &ended_within(insert, CLIENT_LIMIT, "BEGIN, INSERT, COMMIT").await,
            "BEGIN, INSERT, COMMIT",
        );
        assert_eq!(rows(&db, "answered").await, 3);
        assert_eq!(explicit.committing_answers(), 1);

        let select = python(AUTOCOMMIT_SELECT, &[&through(read, &db)]);
        let output = ended_within(select, CLIENT_LIMIT, "the SELECT").await;
        assert_eq!(succeeded(&output, "the SELECT").trim(), "3");
        assert_eq!(read.committing_answers(), 0);
    });
}

/// A link that admits only one role to one database answers anyone else with its own FATAL
/// error, which the client shows, and the server never sees them; the one admitted comes in.
#[test]
fn a_link_admits_only_its_role_to_its_database() {
    let name = "pg_link_admission";
    let db = create_database(name, "");
    block_on(async {
        let proxy = PgProxy::start(&db.config().unwrap(), 1, None)
            .await
            .unwrap();
        let link = proxy.link(0);
        link.admit_only(SUPERUSER, name);
        // A role the server does not know, and one it would let in to a database it has.
        for (user, database) in [("stranger", name), (SUPERUSER, "postgres")] {
            let output = psql(link, user, database, "SELECT 1").await;
            let said = String::from_utf8_lossy(&output.stderr);
            assert!(!output.status.success(), "{user} came in to {database}");
            let refusal = format!(
                "FATAL:  outbox-lab's link admits only role {SUPERUSER} to database {name} \
                 (asked: role {user}, database {database})"
            );
            assert!(said.contains(&refusal), "{said}");
        }
        assert_eq!(link.refusals(), 2);
        assert_eq!(link.refused().len(), 2);
        // No backend ever served the link: the server never heard of them.
        assert!(!link.ever_connected());

        let output = psql(link, SUPERUSER, name, "SELECT 1").await;
        assert_eq!(succeeded(&output, "the role admitted").trim(), "1");
        assert!(link.ever_connected());
        assert_eq!(link.refusals(), 2);
    });
}

/// A backend that ends (pg_terminate_backend) serves its link no more at once, though its
/// actor, idle, has not yet closed its side: a nemesis looking for the actor's sessions does
/// not find a pid that is gone.
#[test]
fn a_backend_that_ends_is_no_longer_the_links() {
    let db = create_database("pg_link_ended", "");
    block_on(async {
        let proxy = PgProxy::start(&db.config().unwrap(), 1, None)
            .await
            .unwrap();
        let link = proxy.link(0);
        let _idle = python(IDLE_CLIENT, &[&through(link, &db)]);
        let started = Instant::now();
        let pid = loop {
            if let Some(&pid) = link.backends().first() {
                break pid;
            }
            assert!(started.elapsed() < BACKEND_PATIENCE, "no backend came");
            tokio::time::sleep(POLL).await;
        };
        let client = db.connect().await.unwrap();
        client
            .execute("SELECT pg_terminate_backend($1)", &[&pid])
            .await
            .unwrap();
        let terminated = Instant::now();
        while !link.backends().is_empty() {
            assert!(
                terminated.elapsed() < BACKEND_PATIENCE,
                "backend {pid} still the link's {:?} after it ended",
                terminated.elapsed()
            );
            tokio::time::sleep(POLL).await;
        }
        assert_eq!(link.reset(), 1, "the idle actor's side is still open");
    });
}
