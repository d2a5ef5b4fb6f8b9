//! A URL's password never shows when it goes wrong: a malformed database URL, a sink or broker
//! URL that is refused or does not answer, a failed HTTP delivery's log line and last_error —
//! each names the URL with its password masked. The rest of no password shown is
//! tests/secrets.rs.

use crate::common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{block_on, create_database, outbox_lab, query_i64, run_tracked, scratch_dir};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use outbox_lab::outbox::schema;
use outbox_lab::outbox::writer::{self, Ending};

/// The password the printed-secret tests give; their URLs point at nothing that answers.
const SHOWN_NOWHERE: &str = "Pw0fTheSecretsTest";

/// `outbox-lab ARGS` (with `env` set) to its end: exit 2, one line on stderr holding `needle`
/// and not the password.
fn fails_without_showing_the_password(args: &[&str], env: &[(&str, &str)], needle: &str) {
    let mut command = outbox_lab();
    command.args(args).stdin(Stdio::null());
    for (var, value) in env {
        command.env(var, value);
    }
    let started = Instant::now();
    let (_, run) = run_tracked(&mut command);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{args:?} took long"
    );
    assert_eq!(run.code, 2, "{args:?} {env:?}: {}", run.stderr);
    let shown = run.stderr.clone() + &run.stdout;
    assert!(
        !shown.contains(SHOWN_NOWHERE),
        "{args:?} {env:?} shows the password: {shown}"
    );
    assert!(
        run.stderr.contains(needle),
        "{args:?} {env:?}: '{needle}' not in {}",
        run.stderr
    );
}

/// A malformed database URL (a port that is no number) is refused with its password masked, by
/// check, relay and verify, whether it came from --database-url or OUTBOX_LAB_DATABASE_URL.
#[test]
fn a_malformed_database_url_shows_no_password() {
    let url = format!("postgres://u:{SHOWN_NOWHERE}@127.0.0.1:notaport/db");
    let masked = "invalid --database-url 'postgres://u:***@127.0.0.1:notaport/db'";
    let results = scratch_dir("security-malformed");
    let results = results.to_str().unwrap();
    let commands: [&[&str]; 3] = [
        &["check"],
        &["relay", "--sink", "http://127.0.0.1:1/"],
        &["verify", "--relay-cmd", "sh", "--results-dir", results],
    ];
    for command in commands {
        let given = [command, &["--database-url", &url]].concat();
        fails_without_showing_the_password(&given, &[], masked);
        let from_env = [("OUTBOX_LAB_DATABASE_URL", url.as_str())];
        fails_without_showing_the_password(command, &from_env, masked);
    }
}

/// The standalone relay's sink that does not answer, and the consumer's broker URL that is
/// refused, are named with the password masked; the relay names its own flag, --sink.
#[test]
fn unusable_broker_urls_show_no_password() {
    let db = create_database(
        &format!("security_sink_{}", std::process::id()),
        schema::CREATE_OUTBOX,
    );
    let database_url = db.url();
    let sink = format!("redis://:{SHOWN_NOWHERE}@127.0.0.1:1");
    let relay = ["relay", "--database-url", &database_url];
    let refused = "cannot deliver to --sink (or OUTBOX_LAB_SINK_URL): cannot connect to Redis at \
                   redis://:***@127.0.0.1:1";
    fails_without_showing_the_password(&[&relay[..], &["--sink", &sink]].concat(), &[], refused);
    fails_without_showing_the_password(&relay, &[("OUTBOX_LAB_SINK_URL", &sink)], refused);
    let consumer = ["consumer", "--database-url", &database_url];
    let bad_value = "invalid value 'redis://:***@127.0.0.1:1' for '--from <URL>'";
    fails_without_showing_the_password(
        &[&consumer[..], &["--from", &sink]].concat(),
        &[],
        bad_value,
    );
    fails_without_showing_the_password(
        &consumer,
        &[("OUTBOX_LAB_BROKER_URL", &sink)],
        "'redis://:***@127.0.0.1:1'",
    );
}

/// The standalone relay's HTTP delivery that fails logs the sink's URL with its password
/// masked, and records it so in the row's last_error.
#[test]
fn a_failed_http_delivery_shows_no_password() {
    let name = format!("security_http_{}", std::process::id());
    let db = create_database(&name, schema::CREATE_OUTBOX);
    block_on(async {
        let mut client = db.connect().await.unwrap();
        writer::create_order_with_events(&mut client, 1, 1, Ending::Commit, false)
            .await
            .unwrap();
    });
    let sink = format!("http://u:{SHOWN_NOWHERE}@127.0.0.1:1/");
    let mut relay = outbox_lab()
        .args(["relay", "--database-url", &db.url(), "--sink", &sink])
        .args(["--interval-ms", "50"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = std::io::BufRead::lines(std::io::BufReader::new(relay.stdout.take().unwrap()));
    let (sender, failures) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            let _ = sender.send(line);
        }
    });
    let mut seen = Vec::new();
    let failed = loop {
        match failures.recv_timeout(Duration::from_secs(20)) {
            Ok(line) if line.contains(" failed: ") => break line,
            Ok(line) => seen.push(line),
            Err(e) => {
                let _ = relay.kill();
                panic!("no failed delivery ({e}); the relay printed {seen:?}");
            }
        }
    };
    kill(Pid::from_raw(relay.id() as i32), Signal::SIGTERM).unwrap();
    let ended = relay.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&ended.stderr);
    for line in seen.iter().chain([&failed]) {
        assert!(!line.contains(SHOWN_NOWHERE), "the password in: {line}");
    }
    assert!(
        failed.contains("POST http://u:***@127.0.0.1:1/events"),
        "{failed}"
    );
    assert!(!stderr.contains(SHOWN_NOWHERE), "{stderr}");
    let recorded = "SELECT count(*) FROM outbox WHERE last_error IS NOT NULL";
    assert_eq!(query_i64(&name, recorded), 1);
    let leaked = format!("SELECT count(*) FROM outbox WHERE last_error LIKE '%{SHOWN_NOWHERE}%'");
    assert_eq!(query_i64(&name, &leaked), 0);
}
