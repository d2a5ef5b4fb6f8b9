//! No password shows anywhere: not on a command line (the scenario's children, verify's
//! relays), not in what verify prints nor in any file of its run, not in the environment of a
//! server outbox-lab starts. A URL's password in errors and logs is tests/masked_urls.rs.

use crate::common;

use std::os::unix::fs::MetadataExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::host::{command_lines_with, runs_as_root, walk};
use common::{long_run, one_at_a_time, outbox_lab, scratch_dir, server_url};

/// How many processes `parent` has right now.
fn children_of(parent: u32) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter(|stat| {
            // The parent pid is the second field after the command name.
            let fields: Vec<&str> = stat
                .rsplit(')')
                .next()
                .unwrap_or("")
                .split_whitespace()
                .collect();
            fields.get(1) == Some(&parent.to_string().as_str())
        })
        .count()
}

/// A password of this test's own, numeric (a `sleep` argument below): other runs may scan at
/// once. The scan of command lines is shown to find it in a plain argument (the check bites).
fn secret_the_scan_finds() -> String {
    let secret = format!(
        "{}{:09}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos()
    );
    let mut control = Command::new("sleep").arg(&secret).spawn().unwrap();
    let started = Instant::now();
    while command_lines_with(&secret).is_empty() && started.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        command_lines_with(&secret).len(),
        1,
        "the scan misses a plain argument (control: {:?})",
        control.try_wait()
    );
    let _ = control.kill();
    let _ = control.wait();
    secret
}

/// A password given in OUTBOX_LAB_DATABASE_URL never shows on a command line, although the
/// scenario's children connect with it; the scan finds an argument that does (the check bites).
#[test]
fn children_never_show_a_password() {
    let _turn = one_at_a_time();
    // Its run (retry-backoff, whose checks judge the retries' gaps) must pass.
    let _timed = common::timed();
    let secret = secret_the_scan_finds();
    let secret = secret.as_str();
    let url = server_url().replacen("postgres@", &format!("postgres:{secret}@"), 1);
    assert!(url.contains(secret));
    let results = scratch_dir("security-argv");
    let mut child = long_run(&results)
        .env("OUTBOX_LAB_DATABASE_URL", &url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut children_seen = 0;
    while child.try_wait().unwrap().is_none() {
        let shown = command_lines_with(secret);
        assert_eq!(shown, Vec::<String>::new(), "a password on a command line");
        children_seen = children_seen.max(children_of(child.id()));
        std::thread::sleep(Duration::from_millis(2));
    }
    // The run's JSON (its few lines fit the pipe) says which check failed, if one did.
    let (mut stdout, mut stderr) = (String::new(), String::new());
    std::io::Read::read_to_string(child.stdout.as_mut().unwrap(), &mut stdout).unwrap();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    let failed: Vec<String> = serde_json::from_str::<serde_json::Value>(&stdout)
        .ok()
        .and_then(|run| run["checks"].as_array().cloned())
        .unwrap_or_default()
        .into_iter()
        .filter(|check| check["pass"] == false)
        .map(|check| check.to_string())
        .collect();
    assert_eq!(
        child.wait().unwrap().code(),
        Some(0),
        "{stderr}{}",
        failed.join("\n")
    );
    assert!(children_seen > 0, "no child seen: the scan proved nothing");
}

/// `verify` against a server whose URL carries a password (in OUTBOX_LAB_DATABASE_URL): the
/// relay's command line gets `{database_url}` without it (the relay connects all the same, with
/// the variables), no child's command line shows it, and neither does the output nor any file
/// of the run, whose directory is the owner's alone (0700, files 0600).
#[test]
fn a_verify_run_shows_no_password() {
    let _turn = one_at_a_time();
    let secret = secret_the_scan_finds();
    let secret = secret.as_str();
    let url = server_url().replacen("postgres@", &format!("postgres:{secret}@"), 1);
    // Names this run's relays, so that the scan knows it saw them.
    let marker = format!("secretless{}", std::process::id());
    let relay = format!(
        "'{}' relay --database-url {{database_url}} --sink {{sink_url}} --mode notify \
         --interval-ms 50 --name {{name}}-{marker}",
        env!("CARGO_BIN_EXE_outbox-lab")
    );
    let results = scratch_dir("security-verify");
    let mut child = outbox_lab()
        .args(["verify", "--relay-cmd", &relay, "--events", "20"])
        .args(["--nemesis", "none", "--format", "json", "--results-dir"])
        .arg(&results)
        .env("OUTBOX_LAB_DATABASE_URL", &url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Read while it runs: a full pipe would stall it.
    let readers = [
        read_to_end_in_thread(child.stdout.take().unwrap()),
        read_to_end_in_thread(child.stderr.take().unwrap()),
    ];
    let started = Instant::now();
    let mut relay_lines = Vec::new();
    while child.try_wait().unwrap().is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "verify did not end"
        );
        let shown = command_lines_with(secret);
        assert_eq!(shown, Vec::<String>::new(), "a password on a command line");
        // The relays' own, not verify's with the template.
        let relays = command_lines_with(&marker).into_iter();
        relay_lines.extend(relays.filter(|l| !l.contains("{database_url}")));
        std::thread::sleep(Duration::from_millis(2));
    }
    let [stdout, stderr] = readers.map(|r| r.join().unwrap());
    assert_eq!(child.wait().unwrap().code(), Some(0), "{stderr}");
    let relay_line = relay_lines
        .first()
        .unwrap_or_else(|| panic!("no relay seen: the scan proved nothing\n{stderr}"));
    // The relays' own role (with a password of its own, in its environment only: none after
    // the user name), not the server's.
    assert!(
        relay_line.contains(" relay --database-url postgresql://outboxlab_")
            && relay_line.contains("_relay@"),
        "{relay_line}"
    );
    for (what, text) in [("stdout", &stdout), ("stderr", &stderr)] {
        assert!(!text.contains(secret), "the password on {what}: {text}");
    }

    let run_dir = std::fs::read_dir(&results)
        .unwrap()
        .next()
        .expect("a run directory")
        .unwrap()
        .path();
    let files = walk(&run_dir);
    for name in ["verify.json", "report.html", "verify.jsonl"] {
        assert!(
            files.iter().any(|f| f.ends_with(name)),
            "no {name} in {files:?}"
        );
    }
    for path in std::iter::once(&run_dir).chain(&files) {
        let mode = std::fs::symlink_metadata(path).unwrap().mode() & 0o777;
        let private = if path.is_dir() { 0o700 } else { 0o600 };
        assert_eq!(mode, private, "{} is {mode:o}", path.display());
        if path.is_file() {
            let text = std::fs::read_to_string(path).unwrap();
            assert!(!text.contains(secret), "the password in {}", path.display());
        }
    }
}

/// A credential the user wrote into `--relay-cmd` itself (their command line, their choice) is
/// still masked in everything verify prints and writes: the notes, the params, the replay line,
/// the history and the page.
#[test]
fn a_credential_inside_the_relay_command_is_masked_in_the_results() {
    let secret = "Pw0fTheRelayCommand";
    let relay = format!(
        "env MY_BROKER=amqp://me:{secret}@127.0.0.1:1/x '{}' relay --database-url \
         {{database_url}} --sink {{sink_url}} --mode notify --interval-ms 50 --name {{name}}",
        env!("CARGO_BIN_EXE_outbox-lab")
    );
    let results = scratch_dir("security-relay-cmd");
    let output = outbox_lab()
        .args(["verify", "--relay-cmd", &relay, "--events", "20"])
        .args(["--schedule", "net:reset@5", "--format", "json"])
        .args(["--database-url", server_url(), "--results-dir"])
        .arg(&results)
        .output()
        .unwrap();
    let run = common::Run::from(output);
    assert!(run.code == 0 || run.code == 1, "{}", run.stderr);
    for (what, text) in [("stdout", &run.stdout), ("stderr", &run.stderr)] {
        assert!(!text.contains(secret), "the password on {what}: {text}");
    }
    assert!(run.stdout.contains("amqp://me:***@"), "{}", run.stdout);
    let files = walk(&results);
    assert!(
        files.iter().any(|f| f.ends_with("verify.json")),
        "{files:?}"
    );
    for path in files.iter().filter(|p| p.is_file()) {
        let text = std::fs::read_to_string(path).unwrap();
        assert!(!text.contains(secret), "the password in {}", path.display());
    }
}

/// Reads `output` to its end on a thread of its own.
fn read_to_end_in_thread(
    mut output: impl std::io::Read + Send + 'static,
) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = output.read_to_string(&mut text);
        text
    })
}

/// The processes working in a throwaway directory of the outbox-lab process `run` (its servers:
/// each works in its directory), with whether their environment holds `needle`.
fn servers_of(run: u32, needle: &str) -> Vec<(String, bool)> {
    let infix = format!("-{run}-");
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter(|e| {
            std::fs::read_link(e.path().join("cwd")).is_ok_and(|cwd| {
                let cwd = cwd.to_string_lossy().into_owned();
                cwd.contains("/outbox-lab-") && cwd.contains(&infix)
            })
        })
        // A child forked but not yet exec'd is still outbox-lab, with its environment: not a
        // server yet.
        .filter(|e| {
            let ours = std::fs::canonicalize(env!("CARGO_BIN_EXE_outbox-lab")).ok();
            std::fs::read_link(e.path().join("exe")).ok() != ours
        })
        .filter_map(|e| {
            let environ = std::fs::read(e.path().join("environ")).ok()?;
            let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
            let holds = String::from_utf8_lossy(&environ).contains(needle);
            Some((comm.trim().to_string(), holds))
        })
        .collect()
}

/// Secrets in the caller's environment (the sink URL's password, anything else) never reach
/// a server outbox-lab starts (PostgreSQL, Redis, NATS): each gets a minimal environment of
/// its own, read here from /proc while the run lasts. Before, each inherited ours whole. Run as
/// root: the servers run as postgres, whose environment only root reads (as another user the
/// test fails, or is skipped with OUTBOX_LAB_SKIP_ROOT_TESTS=1).
#[test]
fn servers_get_none_of_the_callers_environment() {
    if !runs_as_root("reading the servers' environment (they run as postgres)") {
        return;
    }
    let secret = "s3cretXYZ";
    let relay = format!(
        "{} relay --mode notify --interval-ms 50",
        env!("CARGO_BIN_EXE_outbox-lab")
    );
    for sink in ["redis", "nats"] {
        let mut run = outbox_lab()
            .args(["verify", "--relay-cmd", &relay, "--sink", sink])
            .args(["--nemesis", "kill", "--events", "100", "--format", "json"])
            .arg("--results-dir")
            .arg(scratch_dir("security-environment"))
            .env(
                "OUTBOX_LAB_SINK_URL",
                format!("http://u:{secret}@127.0.0.1:9/"),
            )
            .env("SOME_SECRET", secret)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut seen = std::collections::BTreeMap::new();
        let started = Instant::now();
        while run.try_wait().unwrap().is_none() && started.elapsed() < Duration::from_secs(120) {
            for (server, holds) in servers_of(run.id(), secret) {
                *seen.entry(server).or_insert(false) |= holds;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = run.kill();
        let output = run.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{sink}: {stderr}");
        let server = if sink == "redis" {
            "redis-server"
        } else {
            "nats-server"
        };
        for expected in ["postgres", server] {
            assert!(
                seen.contains_key(expected),
                "{sink}: no {expected} seen in {seen:?}"
            );
        }
        let leaking: Vec<&String> = seen.iter().filter(|(_, h)| **h).map(|(s, _)| s).collect();
        assert!(
            leaking.is_empty(),
            "{sink}: the secret is in the environment of {leaking:?}"
        );
    }
}
