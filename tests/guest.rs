//! The harness is a guest on the machine, often run as root: its throwaway servers let no other
//! local user in, a server that never gets ready leaves nothing behind, and no file of ours is
//! written through a link another user could plant. What `clean` may kill and remove is
//! tests/clean.rs; no password shown, tests/secrets.rs and tests/masked_urls.rs.
//!
//! The parts that need a second user (`nobody`) run when the tests run as root, as CI does; as
//! another user they fail unless OUTBOX_LAB_SKIP_ROOT_TESTS=1 skips them, saying so.

use crate::common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::host::{as_nobody, command_lines_with, runs_as_root, tcp_listen_addresses, walk};
use common::verify::verify;
use common::{
    assert_passed, assert_usage_error, clean, marker_of, one_at_a_time, outbox_lab, run_tracked,
    scratch_dir, throwaway_dirs_of,
};
use nix::unistd::geteuid;
use outbox_lab::harness::throwaway;

/// The TCP ports process `pid` listens on.
fn tcp_listen_ports(pid: i32) -> Vec<u16> {
    tcp_listen_addresses(pid)
        .iter()
        .map(|address| u16::from_str_radix(address.rsplit(':').next().unwrap(), 16).unwrap())
        .collect()
}

/// Every file of ours in a run directory lies in a directory only we can write, and the part
/// the server user owns holds nothing of ours: no link planted there is ever followed.
fn assert_no_file_of_ours_in_their_directory(dir: &Path) {
    let me = geteuid().as_raw();
    let run_dir = std::fs::symlink_metadata(dir).unwrap();
    assert_eq!(run_dir.uid(), me, "{} is not ours", dir.display());
    assert_eq!(
        run_dir.mode() & 0o022,
        0,
        "{} writable by others",
        dir.display()
    );
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let meta = entry.metadata().unwrap();
        if meta.uid() != me {
            // The server user's own directory: nothing in it of ours.
            for inner in walk(&entry.path()) {
                let owner = std::fs::symlink_metadata(&inner).unwrap().uid();
                assert!(
                    owner != me || me == meta.uid(),
                    "{} is ours inside a directory of the server user",
                    inner.display()
                );
            }
        }
    }
}

/// The kept PostgreSQL and Redis of a finished run listen on no TCP port, let us in through
/// their sockets and keep every other user out; their files are laid out so that no link is
/// followed; `clean` removes them.
#[test]
fn throwaway_servers_let_no_other_user_in() {
    let _turn = one_at_a_time();
    let results = scratch_dir("security-kept");
    let (pid, run) = run_tracked(
        outbox_lab()
            .args(["scenario", "redis-stream", "--keep", "--format", "json"])
            .arg("--results-dir")
            .arg(&results),
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let (pg, redis) = (
        throwaway_dirs_of("pg", pid),
        throwaway_dirs_of("redis", pid),
    );
    assert_eq!((pg.len(), redis.len()), (1, 1), "{}", run.stderr);
    assert!(run.stderr.contains("kept the throwaway cluster running"));

    let pg_socket_dir = pg[0].join("server");
    let redis_socket = redis[0].join("server/redis.sock");
    for dir in [&pg[0], &redis[0]] {
        let server = marker_of(dir).server.expect("a server in the marker");
        assert!(server.process.is_running(), "{} not running", dir.display());
        assert_eq!(
            tcp_listen_ports(server.process.pid),
            Vec::<u16>::new(),
            "{} listens on TCP",
            dir.display()
        );
        assert_no_file_of_ours_in_their_directory(dir);
    }

    let psql_target = format!("host={} port=5432 user=postgres", pg_socket_dir.display());
    let psql_args = [psql_target.as_str(), "-tAc", "select 1"];
    let sock = redis_socket.to_str().unwrap();
    // We get in: the denials below are about who asks, not a dead server.
    let ours = Command::new("psql").args(psql_args).output().unwrap();
    assert!(
        ours.status.success(),
        "{}",
        String::from_utf8_lossy(&ours.stderr)
    );
    let ours = Command::new("redis-cli")
        .args(["-s", sock, "ping"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&ours.stdout).trim(), "PONG");
    if runs_as_root("user nobody kept out of the kept servers") {
        let (ok, said) = as_nobody("psql", &psql_args);
        assert!(
            !ok && said.contains("Permission denied"),
            "nobody got in: {said}"
        );
        let (_, said) = as_nobody("redis-cli", &["-s", sock, "ping"]);
        assert!(!said.contains("PONG"), "nobody got in: {said}");
    }

    let cleaned = clean(&[]);
    assert_eq!(cleaned.code, 0, "{}", cleaned.stderr);
    for dir in [&pg[0], &redis[0]] {
        assert!(!dir.exists(), "clean left {}", dir.display());
    }
}

/// A file of ours is never created through a link, nor over a file already there.
#[test]
fn files_are_never_created_through_a_link() {
    let dir = scratch_dir("security-links");
    let target = dir.join("precious");
    std::fs::write(&target, "keep me").unwrap();
    std::os::unix::fs::symlink(&target, dir.join("postgres.log")).unwrap();
    assert!(throwaway::create_new(&dir.join("postgres.log")).is_err());
    std::fs::write(dir.join("existing"), "keep me too").unwrap();
    assert!(throwaway::create_new(&dir.join("existing")).is_err());
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me");
    assert_eq!(
        std::fs::read_to_string(dir.join("existing")).unwrap(),
        "keep me too"
    );
    // Reading what the server user writes follows no link either.
    assert_eq!(throwaway::read_no_follow(&dir.join("postgres.log")), "");
    assert_eq!(throwaway::read_no_follow(&target), "keep me");
}

/// A postgres that never gets ready: killed with everything it started, not tried again, and
/// its directory removed; the run says what happened and exits 2.
#[test]
fn a_server_that_never_gets_ready_leaves_nothing() {
    let _turn = one_at_a_time();
    let bin = scratch_dir("security-wedged");
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let script = |name: &str, body: &str| {
        let path = bin.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    script("initdb", "exit 0");
    // A wedged server with helpers of its own, as a postmaster has.
    script(
        "postgres",
        "sleep 6001.25 & sleep 6001.25 & exec sleep 6001.25",
    );
    let started = Instant::now();
    let (pid, run) = run_tracked(
        outbox_lab()
            .args(["scenario", "dual-write", "--pg-bin"])
            .arg(&bin)
            .arg("--results-dir")
            .arg(scratch_dir("security-wedged-results"))
            .env("OUTBOX_LAB_START_TIMEOUT_S", "2"),
    );
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(
        run.stderr.contains("did not become ready"),
        "{}",
        run.stderr
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "retried: {:?}",
        started.elapsed()
    );
    let gone = outbox_lab::wait::blocking_up_to(
        Duration::from_secs(10),
        Duration::from_millis(20),
        || command_lines_with("sleep 6001.25").is_empty(),
    );
    assert!(gone.is_some(), "{:?}", command_lines_with("sleep 6001.25"));
    assert_eq!(throwaway_dirs_of("pg", pid), Vec::<PathBuf>::new());
}

/// Run as root (outbox-lab runs the relay as itself when it is not: then the test fails, or is
/// skipped with OUTBOX_LAB_SKIP_ROOT_TESTS=1): a stranger's relay runs as an unprivileged user
/// (not uid 0), with a HOME only it can enter and none of our environment, and still reaches
/// its database link and sink. A relay that needs root does not start, and `--run-as root` is
/// refused.
#[test]
fn a_strangers_relay_never_runs_as_root() {
    if !runs_as_root("a stranger's relay run as an unprivileged user") {
        return;
    }
    let relay = |check: &str| {
        format!("sh -c '{check} && exec examples/relays/article.py --batch 20 --mode notify'")
    };
    let confined = "test \"$(id -u)\" -ne 0 && test -O \"$HOME\" && \
                    test \"$(stat -c %a \"$HOME\")\" = 700 && test -z \"$CARGO_MANIFEST_DIR\"";
    let run = verify(&[
        "--relay-cmd",
        &relay(confined),
        "--events",
        "40",
        "--nemesis",
        "none",
    ]);
    assert_passed(&run);
    let as_root = relay("test \"$(id -u)\" -eq 0");
    let run = verify(&[
        "--relay-cmd",
        &as_root,
        "--events",
        "40",
        "--nemesis",
        "none",
    ]);
    assert_usage_error(&run, "exited by itself");
    let run = verify(&["--relay-cmd", &relay("true"), "--run-as", "root"]);
    assert_usage_error(&run, "never runs as root");
}
