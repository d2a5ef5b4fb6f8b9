//! What the integration tests share: the binary, one throwaway cluster for the suite (each
//! test works in databases of its own on it), and reading a run's JSON result.

pub mod host;
pub mod verify;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use outbox_lab::harness::cluster::{Cluster, PgBinaries};
use outbox_lab::harness::db::Database;
use outbox_lab::harness::process::ProcessId;
use outbox_lab::harness::throwaway::Marker;
use outbox_lab::outbox::writer::{self, Ending};
use outbox_lab::wait;
use serde_json::Value;

static CLUSTER: OnceLock<Mutex<Option<Cluster>>> = OnceLock::new();
static URL: OnceLock<String> = OnceLock::new();

/// Statics are never dropped: stop the shared cluster when the test binary exits.
extern "C" fn stop_shared_cluster() {
    if let Some(cluster) = CLUSTER.get() {
        if let Ok(mut cluster) = cluster.lock() {
            cluster.take();
        }
    }
}

/// The maintenance URL of this test binary's throwaway cluster, started on first use.
pub fn server_url() -> &'static str {
    URL.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let bins = PgBinaries::find(None).expect("PostgreSQL binaries (run scripts/setup)");
        let cluster = runtime
            .block_on(Cluster::start(&bins, false, false))
            .expect("throwaway cluster");
        let url = cluster.url();
        CLUSTER
            .set(Mutex::new(Some(cluster)))
            .expect("started once");
        // SAFETY: registers a plain function; it runs once at process exit.
        unsafe { libc::atexit(stop_shared_cluster) };
        url
    })
}

/// Tests that run `clean`, or leave a server behind on purpose for the next run to remove, take
/// turns: every run sweeps what killed runs left and `clean` looks at every throwaway directory,
/// whichever test binary started them. A file lock (flock) in the target's tmp dir, so the turns
/// hold across the test binaries of this checkout as between the threads of one; it is let go
/// when the guard drops (a panicking test's too) or its process ends.
pub fn one_at_a_time() -> std::fs::File {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(dir).unwrap();
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("one-at-a-time.lock"))
        .expect("the turns' lock file");
    lock.lock().expect("a turn");
    lock
}

pub fn outbox_lab() -> Command {
    Command::new(env!("CARGO_BIN_EXE_outbox-lab"))
}

/// `scenario retry-backoff`, JSON results under `results`: a run long enough (its backoffs take
/// seconds) to be seen, signalled or killed while it runs. The caller sets its output and spawns.
pub fn long_run(results: &Path) -> Command {
    let mut run = outbox_lab();
    run.args([
        "scenario",
        "retry-backoff",
        "--format",
        "json",
        "--results-dir",
    ])
    .arg(results);
    run
}

/// `what` (the servers a SIGKILLed run left behind) has ended within 10 s: the next run reaped it.
pub fn assert_ended(what: &str, processes: &[ProcessId]) {
    let ended = wait::blocking_up_to(Duration::from_secs(10), Duration::from_millis(20), || {
        processes.iter().all(|p| !p.is_running())
    });
    assert!(
        ended.is_some(),
        "{what} of the killed run still running: {processes:?}"
    );
}

/// A directory of this call's own: tests run side by side, and two calls with one name (a
/// shared helper's results directory) must not empty each other's directory mid-run.
pub fn scratch_dir(name: &str) -> PathBuf {
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("{name}-{}-{call}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `command` to its end, output captured: its pid (to find what it made) and how it went.
pub fn run_tracked(command: &mut Command) -> (u32, Run) {
    let child = command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("outbox-lab runs");
    let pid = child.id();
    (pid, Run::from(child.wait_with_output().unwrap()))
}

/// Throwaway directories of `kind` (`pg`, `redis`) that the outbox-lab process `pid` created.
pub fn throwaway_dirs_of(kind: &str, pid: u32) -> Vec<PathBuf> {
    let prefix = format!("outbox-lab-{kind}-{pid}-");
    std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect()
}

/// A finished outbox-lab run.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn from(output: Output) -> Run {
        Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not one JSON document ({e}):\n{}\n{}",
                self.stdout, self.stderr
            )
        })
    }

    /// The table of a single-scenario JSON result whose title starts with `title`.
    pub fn table(&self, title: &str) -> Value {
        let json = self.json();
        let tables = json["tables"].as_array().unwrap();
        let found = tables
            .iter()
            .find(|t| t["title"].as_str().unwrap().starts_with(title));
        found.unwrap_or_else(|| panic!("no {title} table")).clone()
    }

    /// A metric of a single-scenario JSON result, as an integer.
    pub fn metric(&self, name: &str) -> i64 {
        let json = self.json();
        json["metrics"][name].as_i64().unwrap_or_else(|| {
            panic!(
                "metric {name} missing or not an integer in {}",
                json["metrics"]
            )
        })
    }

    pub fn metric_f64(&self, name: &str) -> f64 {
        self.json()["metrics"][name]
            .as_f64()
            .unwrap_or_else(|| panic!("metric {name} missing"))
    }

    pub fn metric_str(&self, name: &str) -> String {
        self.json()["metrics"][name]
            .as_str()
            .unwrap_or_else(|| panic!("metric {name} missing"))
            .into()
    }

    /// The check named `name` of a single-scenario JSON result passed (else the check, with
    /// its figure and bounds, and the run's stderr); a check of that name must exist.
    pub fn assert_check_passed(&self, name: &str) {
        let json = self.json();
        let checks = json["checks"].as_array().unwrap();
        let check = checks
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no check named {name:?} in {}", json["checks"]));
        assert_eq!(
            check["pass"],
            Value::Bool(true),
            "check failed: {check}\n{}",
            self.stderr
        );
    }

    /// The names of the checks that did not pass.
    pub fn failed_check_names(&self) -> Vec<String> {
        self.json()["checks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["pass"] != Value::Bool(true))
            .map(|c| c["name"].as_str().unwrap().to_string())
            .collect()
    }

    pub fn failed_checks(&self) -> Vec<String> {
        self.json()["checks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["pass"] != Value::Bool(true))
            .map(|c| c.to_string())
            .collect()
    }
}

/// The run worked and every check passed (else: its stderr, the failed checks and, for explore
/// and verify, how each fault went).
pub fn assert_passed(run: &Run) {
    if run.code == 0 {
        return;
    }
    let faults: Vec<String> = run.json()["tables"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| t["title"].as_str().is_some_and(|t| t.starts_with("faults")))
        .flat_map(|t| t["rows"].as_array().cloned().unwrap_or_default())
        .map(|row| row.to_string())
        .collect();
    panic!(
        "exit {}: {}{}\n{}",
        run.code,
        run.stderr,
        run.failed_checks().join("\n"),
        faults.join("\n")
    );
}

/// Exit 2 with a single line on stderr containing `needle`, and no JSON on stdout.
pub fn assert_usage_error(run: &Run, needle: &str) {
    assert_eq!(run.code, 2, "stderr: {}", run.stderr);
    assert_eq!(
        run.stderr.trim().lines().count(),
        1,
        "not one line: {}",
        run.stderr
    );
    assert!(
        run.stderr.contains(needle),
        "'{needle}' not in: {}",
        run.stderr
    );
    assert!(run.stdout.is_empty(), "stdout: {}", run.stdout);
}

/// `outbox-lab scenario NAME ARGS --format json` against this binary's cluster.
pub fn scenario(name: &str, args: &[&str]) -> Run {
    let results = scratch_dir(&format!("results-{name}"));
    run_json(&["scenario", name], &results, args)
}

/// `outbox-lab scenario NAME ARGS --format json` on a throwaway cluster of its own: for figures
/// of the whole cluster (its WAL), which the suite's other tests would move.
pub fn scenario_alone(name: &str, args: &[&str]) -> Run {
    let results = scratch_dir(&format!("results-{name}-alone"));
    let output = on_own_cluster(&["scenario", name], &results, args)
        .output()
        .expect("outbox-lab runs");
    Run::from(output)
}

/// `outbox-lab COMMAND --format json ARGS` on a throwaway cluster of its own (no
/// `--database-url`), results in `results`.
pub fn on_own_cluster(command: &[&str], results: &Path, args: &[&str]) -> Command {
    let mut run = outbox_lab();
    run.args(command)
        .args(["--format", "json", "--results-dir"])
        .arg(results)
        .args(args);
    run
}

/// `outbox-lab COMMAND --format json ARGS` against this binary's cluster, results in `results`.
pub fn run_json(command: &[&str], results: &Path, args: &[&str]) -> Run {
    let output = outbox_lab()
        .args(command)
        .args(["--format", "json", "--database-url", server_url()])
        .arg("--results-dir")
        .arg(results)
        .args(args)
        .output()
        .expect("outbox-lab runs");
    Run::from(output)
}

/// Runs `future` to completion on a runtime of its own (tests are plain functions).
pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(future)
}

/// Writes `orders` orders with their events, as the application would.
pub fn write_orders(db: &Database, orders: i64) {
    block_on(async {
        let mut client = db.connect().await.unwrap();
        for customer in 1..=orders {
            writer::create_order_with_events(&mut client, customer, 2, Ending::Commit, false)
                .await
                .unwrap();
        }
    });
}

/// A database of the test's own on the shared cluster, with `sql` applied (may be empty).
pub fn create_database(name: &str, sql: &str) -> Database {
    let server = server_url();
    block_on(async {
        let admin = outbox_lab::connect::postgres(&outbox_lab::connect::parse_url(server).unwrap())
            .await
            .unwrap();
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap();
        let db = Database {
            server_url: server.to_string(),
            name: name.to_string(),
        };
        db.connect()
            .await
            .unwrap()
            .batch_execute(sql)
            .await
            .unwrap();
        db
    })
}

/// Runs a query against a database of the shared cluster.
pub fn query_i64(dbname: &str, sql: &str) -> i64 {
    let db = Database {
        server_url: server_url().to_string(),
        name: dbname.to_string(),
    };
    block_on(async {
        let client = db.connect().await.expect("connect");
        client
            .query_one(sql, &[])
            .await
            .expect(sql)
            .get::<_, i64>(0)
    })
}

/// The histories a single-design `explore` run saved under `results`, one JSON document per
/// schedule, in the order they ran.
pub fn explore_histories(results: &Path, design: &str) -> Vec<Value> {
    let run_dir = std::fs::read_dir(results)
        .unwrap()
        .next()
        .expect("a run directory")
        .unwrap()
        .path();
    let text = std::fs::read_to_string(run_dir.join("history").join(format!("{design}.jsonl")))
        .expect("history saved");
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The pids whose `/proc/PID/FILE` (`cmdline`, `environ`: NUL-separated, read as text with the
/// NULs as spaces) satisfies `matches`.
pub fn processes_whose(file: &str, matches: impl Fn(i32, &str) -> bool) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| {
            let bytes = std::fs::read(format!("/proc/{pid}/{file}")).unwrap_or_default();
            matches(pid, &String::from_utf8_lossy(&bytes).replace('\0', " "))
        })
        .collect()
}

/// batch-throughput measures how fast the relay can go: it keeps both cores busy for a minute
/// or more, and a test that judges a time beside it judges that instead (notify-latency's
/// NOTIFY median read 7 to 133 ms beside it, over its 20 ms bound in 6 of 8 runs). The tests
/// that judge a time hold [`timed`] (shared: they run beside each other and the untimed tests,
/// as their margins were measured), batch-throughput's holds [`benchmark`] (none of them
/// beside it).
static BENCHMARK: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// Taken by a test that judges a time or a rate: no benchmark runs meanwhile.
pub fn timed() -> std::sync::RwLockReadGuard<'static, ()> {
    BENCHMARK.read().unwrap_or_else(|e| e.into_inner())
}

/// Taken by batch-throughput's test: no test that judges a time runs meanwhile.
pub fn benchmark() -> std::sync::RwLockWriteGuard<'static, ()> {
    BENCHMARK.write().unwrap_or_else(|e| e.into_inner())
}

/// Held by every test whose run holds a replication back (a failover's stopped walsender), one
/// at a time: a test that looks for walsenders left stopped sees no other test's held one.
pub static HOLDS_REPLICATION: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Takes [`HOLDS_REPLICATION`] (a test that failed holding it does not poison the others).
pub fn holding_replication() -> std::sync::MutexGuard<'static, ()> {
    HOLDS_REPLICATION.lock().unwrap_or_else(|e| e.into_inner())
}

/// The walsenders stopped by a signal (the failover's hold), by pid, but those in `before`.
pub fn stopped_walsenders_but(before: &[i32]) -> Vec<i32> {
    let stopped = processes_whose("stat", |_, stat| stat.contains(") T "));
    processes_whose("cmdline", |pid, cmdline| {
        cmdline.contains("walsender") && stopped.contains(&pid) && !before.contains(&pid)
    })
}

/// `outbox-lab scenario ARGS --format json` started in the background, once `ready` finds its
/// servers up (asked with the run's pid, for at most `limit`); the run is killed and the test
/// fails if they never are.
pub fn run_with_servers_up<T>(
    args: &[&str],
    results: &str,
    limit: Duration,
    mut ready: impl FnMut(u32) -> Option<T>,
) -> (std::process::Child, T) {
    let mut run = outbox_lab()
        .arg("scenario")
        .args(args)
        .args(["--format", "json", "--results-dir"])
        .arg(scratch_dir(results))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = run.id();
    let Some(found) = wait::blocking_up_to(limit, Duration::from_millis(20), || ready(pid)) else {
        let _ = run.kill();
        let _ = run.wait();
        panic!(
            "the servers of `outbox-lab scenario {}` never came up",
            args.join(" ")
        );
    };
    (run, found)
}

/// Kills a run with SIGKILL: it cannot stop what it started.
pub fn sigkill(mut run: std::process::Child) {
    kill(Pid::from_raw(run.id() as i32), Signal::SIGKILL).unwrap();
    run.wait().unwrap();
}

/// The owner's marker of a throwaway directory.
pub fn marker_of(dir: &Path) -> Marker {
    serde_json::from_slice(&std::fs::read(dir.join("outbox-lab-owner.json")).unwrap()).unwrap()
}

/// `outbox-lab clean ARGS` to its end.
pub fn clean(args: &[&str]) -> Run {
    Run::from(outbox_lab().arg("clean").args(args).output().unwrap())
}
