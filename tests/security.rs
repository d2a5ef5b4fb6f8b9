//! The harness is a guest on the machine, often run as root: its throwaway servers let no other
//! local user in, it signals no process it cannot prove its own, writes no file through a link
//! another user could plant, shows no password to `ps` nor in what it prints or writes, and
//! cleans only what its dead runs left.
//!
//! The parts that need a second user (`nobody`) run when the tests run as root, as CI does.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::{
    block_on, create_database, outbox_lab, query_i64, run_tracked, scratch_dir, server_url,
    throwaway_dirs_of, Run,
};
use nix::sys::signal::{kill, Signal};
use nix::unistd::{geteuid, Pid, User};
use outbox_lab::harness::throwaway::{self, Marker, ProcessId, ServerProcess};
use outbox_lab::outbox::schema;
use outbox_lab::outbox::writer::{self, Ending};

/// `clean` looks at every throwaway directory: these tests take turns.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

fn is_root() -> bool {
    geteuid().is_root()
}

fn marker_of(dir: &Path) -> Marker {
    serde_json::from_slice(&std::fs::read(dir.join("outbox-lab-owner.json")).unwrap()).unwrap()
}

/// The TCP ports process `pid` listens on (its sockets' inodes, looked up in /proc/net/tcp*).
fn tcp_listen_ports(pid: i32) -> Vec<u16> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|fd| {
            let link = std::fs::read_link(fd.path()).ok()?;
            let link = link.to_string_lossy();
            Some(
                link.strip_prefix("socket:[")?
                    .trim_end_matches(']')
                    .to_string(),
            )
        })
        .collect();
    let mut ports = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        for line in std::fs::read_to_string(table)
            .unwrap_or_default()
            .lines()
            .skip(1)
        {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // local_address is HEXIP:HEXPORT, st 0A is LISTEN, the inode is field 9.
            if fields.get(3) == Some(&"0A") && inodes.iter().any(|i| fields.get(9) == Some(&&**i)) {
                let port = fields[1].rsplit(':').next().unwrap();
                ports.push(u16::from_str_radix(port, 16).unwrap());
            }
        }
    }
    ports
}

/// `program args` as user `nobody`: its exit status and what it printed.
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

fn clean(args: &[&str]) -> Run {
    Run::from(outbox_lab().arg("clean").args(args).output().unwrap())
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

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            found.extend(walk(&path));
        }
        found.push(path);
    }
    found
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
    if is_root() {
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

/// A process that exited and was reaped: its pid names nobody now.
fn dead_process() -> ProcessId {
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id() as i32;
    child.wait().unwrap();
    ProcessId { pid, start: 1 }
}

/// A `sleep` standing in for a server, working in `cwd`.
fn victim(cwd: &Path) -> Child {
    Command::new("sleep")
        .arg("300")
        .current_dir(cwd)
        .spawn()
        .unwrap()
}

/// A directory named like ours with `marker` in it (as raw JSON), owned by `owner`.
fn plant(name: &str, marker: &str, owner: Option<&User>) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "outbox-lab-pg-planted-{name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::create_dir_all(dir.join("data")).unwrap();
    std::fs::write(dir.join("outbox-lab-owner.json"), marker).unwrap();
    if let Some(user) = owner {
        for path in [
            dir.join("outbox-lab-owner.json"),
            dir.join("data"),
            dir.clone(),
        ] {
            nix::unistd::chown(&path, Some(user.uid), Some(user.gid)).unwrap();
        }
    }
    dir
}

fn server_marker(server: ServerProcess) -> String {
    serde_json::to_string(&Marker {
        owner: dead_process(),
        kept: false,
        server: Some(server),
    })
    .unwrap()
}

/// What a planting test leaves, taken away however the test ends (a panic included): planted
/// directories would otherwise confuse every later run on the machine.
#[derive(Default)]
struct Planted {
    victims: Vec<Child>,
    dirs: Vec<PathBuf>,
}

impl Drop for Planted {
    fn drop(&mut self) {
        for victim in &mut self.victims {
            let _ = victim.kill();
            let _ = victim.wait();
        }
        for dir in &self.dirs {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Markers anyone could plant in the temp dir make `clean` (and every run's orphan sweep) kill
/// nothing; a directory of ours whose server is proven ours is cleaned (the check bites).
#[test]
fn planted_markers_get_no_process_killed() {
    let _turn = one_at_a_time();
    let mut planted = Planted::default();
    let (victims, planted_dirs) = (&mut planted.victims, &mut planted.dirs);

    // Ours by owner, but the pid is not a server it started: the old format named any pid...
    let scratch = scratch_dir("security-victims");
    let old = victim(&scratch);
    let old_marker = format!(
        r#"{{"owner_pid":{},"kept":false,"server_pid":{},"port":1}}"#,
        dead_process().pid,
        old.id()
    );
    let old_dir = plant("old-format", &old_marker, None);
    std::fs::write(
        old_dir.join("data/postmaster.pid"),
        format!("{}\n", old.id()),
    )
    .unwrap();
    planted_dirs.push(old_dir);

    // ...and the new one names a live process that is not PostgreSQL.
    let stranger = victim(&scratch);
    let mut wrong_exe = ServerProcess::spawned(&stranger).unwrap();
    wrong_exe.exe = PathBuf::from("/usr/lib/postgresql/15/bin/postgres");
    planted_dirs.push(plant("wrong-exe", &server_marker(wrong_exe), None));

    // Owned by another user, with a marker that would otherwise prove its server.
    if is_root() {
        let nobody = User::from_name("nobody").unwrap().unwrap();
        let dir = plant("nobody", "{}", None);
        let perfect = victim(&dir);
        let marker = server_marker(ServerProcess::spawned(&perfect).unwrap());
        std::fs::write(dir.join("outbox-lab-owner.json"), marker).unwrap();
        for path in [
            dir.join("outbox-lab-owner.json"),
            dir.join("data"),
            dir.clone(),
        ] {
            nix::unistd::chown(&path, Some(nobody.uid), Some(nobody.gid)).unwrap();
        }
        planted_dirs.push(dir);
        victims.push(perfect);
    }
    victims.push(old);
    victims.push(stranger);

    // The control: ours, and its server provably the process that works in it.
    let control_dir = plant("control", "{}", None);
    std::fs::set_permissions(&control_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let mut control = victim(&control_dir);
    std::fs::write(
        control_dir.join("outbox-lab-owner.json"),
        server_marker(ServerProcess::spawned(&control).unwrap()),
    )
    .unwrap();

    let started = Instant::now();
    let cleaned = clean(&[]);
    assert_eq!(cleaned.code, 0, "{}", cleaned.stderr);
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "clean stalled for {:?}",
        started.elapsed()
    );
    for victim in victims.iter_mut() {
        assert!(
            victim.try_wait().unwrap().is_none(),
            "a planted marker got pid {} killed:\n{}",
            victim.id(),
            cleaned.stdout
        );
    }
    for dir in planted_dirs.iter() {
        assert!(dir.exists(), "{} removed", dir.display());
        assert!(
            cleaned.stdout.contains(&format!("left {}", dir.display())),
            "clean did not say it left {}:\n{}",
            dir.display(),
            cleaned.stdout
        );
    }
    // The control was ours: its server stopped (SIGINT), its directory gone.
    let ended = control.wait().unwrap();
    assert!(!ended.success(), "the control server was not signalled");
    assert!(!control_dir.exists(), "{}", cleaned.stdout);
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

/// `clean` while a `--keep` run is still going leaves it alone: the run finishes and keeps its
/// cluster; once its owner has ended, `clean` removes it.
#[test]
fn clean_leaves_a_live_run_alone() {
    let _turn = one_at_a_time();
    let results = scratch_dir("security-live");
    let mut child = outbox_lab()
        .args(["scenario", "retry-backoff", "--keep", "--format", "json"])
        .arg("--results-dir")
        .arg(&results)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = Pid::from_raw(child.id() as i32);
    let started = Instant::now();
    let dir = loop {
        assert!(started.elapsed() < Duration::from_secs(60), "no cluster");
        let dirs = throwaway_dirs_of("pg", child.id());
        if let Some(dir) = dirs.first() {
            if std::fs::read(dir.join("outbox-lab-owner.json"))
                .ok()
                .and_then(|m| serde_json::from_slice::<Marker>(&m).ok())
                .is_some_and(|m| m.server.is_some())
            {
                break dir.clone();
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    // Frozen mid-run, so it cannot finish while clean looks.
    kill(pid, Signal::SIGSTOP).unwrap();
    let cleaned = clean(&[]);
    kill(pid, Signal::SIGCONT).unwrap();
    assert!(
        cleaned
            .stdout
            .contains(&format!("left {}: its run is still going", dir.display())),
        "{}",
        cleaned.stdout
    );
    assert!(dir.exists());
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("kept the throwaway cluster running"),
        "{stderr}"
    );
    let server = marker_of(&dir).server.unwrap();
    assert!(server.process.is_running(), "kept, but not running");

    let cleaned = clean(&[]);
    assert!(
        cleaned
            .stdout
            .contains(&format!("removed {}", dir.display())),
        "{}",
        cleaned.stdout
    );
    assert!(!server.process.is_running());
}

/// Processes whose command line contains `needle`.
fn command_lines_with(needle: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(needle))
        .collect()
}

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
    let secret = secret_the_scan_finds();
    let secret = secret.as_str();
    let url = server_url().replacen("postgres@", &format!("postgres:{secret}@"), 1);
    assert!(url.contains(secret));
    let results = scratch_dir("security-argv");
    let mut child = outbox_lab()
        .args([
            "scenario",
            "retry-backoff",
            "--format",
            "json",
            "--results-dir",
        ])
        .arg(&results)
        .env("OUTBOX_LAB_DATABASE_URL", &url)
        .stdout(Stdio::null())
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
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(0), "{stderr}");
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
    assert!(
        relay_line.contains(" relay --database-url postgresql://postgres@"),
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

/// `clean --database-url` drops what dead runs left (and their slots) and nothing else: not a
/// live run's databases, not one someone is connected to, not the user's.
#[test]
fn clean_drops_only_dead_runs_databases() {
    let _turn = one_at_a_time();
    let tag = std::process::id();
    let (dead, live, busy, users) = (
        format!("outboxlab_dead_{tag}"),
        format!("outboxlab_live_{tag}"),
        format!("outboxlab_busy_{tag}"),
        format!("usersdb_{tag}"),
    );
    let admin_url = server_url().to_string();
    block_on(async {
        let config = outbox_lab::connect::parse_url(&admin_url).unwrap();
        let admin = outbox_lab::connect::postgres(&config).await.unwrap();
        for name in [&dead, &live, &busy, &users] {
            admin
                .batch_execute(&format!("CREATE DATABASE {name}"))
                .await
                .unwrap();
        }
        admin
            .batch_execute(&format!(
                "COMMENT ON DATABASE {dead} IS 'outbox-lab run deadrun{tag}';
                 COMMENT ON DATABASE {live} IS 'outbox-lab run liverun{tag}'"
            ))
            .await
            .unwrap();
        let mut in_dead = config.clone();
        in_dead.dbname(&dead);
        let slot = format!("outboxlab_left_{tag}");
        outbox_lab::connect::postgres(&in_dead)
            .await
            .unwrap()
            .batch_execute(&format!(
                "SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')"
            ))
            .await
            .unwrap();
        // The live run holds its named connection; someone works in the busy one.
        let mut holder = config.clone();
        holder.application_name(format!("outbox-lab run liverun{tag}"));
        let _holder = outbox_lab::connect::postgres(&holder).await.unwrap();
        let mut in_busy = config.clone();
        in_busy.dbname(&busy);
        let _busy = outbox_lab::connect::postgres(&in_busy).await.unwrap();
        // The slot's connection has closed; wait until the server has let it go.
        let sessions = format!("SELECT count(*) FROM pg_stat_activity WHERE datname = '{dead}'");
        let deadline = Instant::now() + Duration::from_secs(10);
        while admin
            .query_one(&sessions, &[])
            .await
            .unwrap()
            .get::<_, i64>(0)
            > 0
        {
            assert!(Instant::now() < deadline, "a session stays in {dead}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }

        let cleaned = clean(&["--database-url", &admin_url]);
        assert_eq!(cleaned.code, 0, "{}", cleaned.stderr);
        assert!(
            cleaned.stdout.contains(&format!("dropped database {dead}")),
            "{}",
            cleaned.stdout
        );
        let count = |sql: String| {
            let admin = &admin;
            async move { admin.query_one(&sql, &[]).await.unwrap().get::<_, i64>(0) }
        };
        let exists = |name: &str| {
            count(format!(
                "SELECT count(*) FROM pg_database WHERE datname = '{name}'"
            ))
        };
        assert_eq!(exists(&dead).await, 0);
        let slots = format!("SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{slot}'");
        assert_eq!(count(slots).await, 0);
        for name in [&live, &busy, &users] {
            assert_eq!(exists(name).await, 1, "{name} dropped:\n{}", cleaned.stdout);
        }
        drop((_holder, _busy));
        for name in [&live, &busy, &users] {
            admin
                .batch_execute(&format!("DROP DATABASE {name} WITH (FORCE)"))
                .await
                .unwrap();
        }
    });
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
/// its own, read here from /proc while the run lasts. Before, each inherited ours whole.
#[test]
fn servers_get_none_of_the_callers_environment() {
    if !is_root() {
        eprintln!("skipped: reading the servers' environment needs root when they run as postgres");
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
