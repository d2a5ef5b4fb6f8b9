//! `clean`, and every run's orphan sweep, as a guest on the machine: markers anyone could plant
//! get no process killed, a live run is left alone, and `clean --database-url` drops what dead
//! runs left and nothing else.
//!
//! The parts that need a second user (`nobody`) run when the tests run as root, as CI does; as
//! another user they fail unless OUTBOX_LAB_SKIP_ROOT_TESTS=1 skips them, saying so.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::host::runs_as_root;
use common::{
    block_on, clean, marker_of, one_at_a_time, outbox_lab, scratch_dir, server_url,
    throwaway_dirs_of,
};
use nix::sys::signal::{kill, Signal};
use nix::unistd::{Pid, User};
use outbox_lab::harness::process::ProcessId;
use outbox_lab::harness::throwaway::{Marker, ServerProcess};

/// A process that exited and was reaped: its pid names nobody now.
fn dead_process() -> ProcessId {
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id() as i32;
    child.wait().unwrap();
    ProcessId { pid, start: 1 }
}

/// A `sleep` standing in for a server, working in `cwd`.
fn victim(cwd: &Path) -> Child {
    let mut sleep = Command::new("sleep");
    sleep.arg("300").current_dir(cwd);
    // SIGINT as a server takes it, whatever this test inherited: a shell without job control
    // starts its background jobs with SIGINT ignored, and `sleep` would outlive clean's stop.
    unsafe {
        sleep.pre_exec(|| {
            nix::sys::signal::signal(Signal::SIGINT, nix::sys::signal::SigHandler::SigDfl)
                .map(drop)
                .map_err(std::io::Error::from)
        });
    }
    sleep.spawn().unwrap()
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
    if runs_as_root("a marker in a directory owned by user nobody") {
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

/// `clean --database-url` drops what dead runs left (their databases, slots and relays' roles)
/// and nothing else: not a live run's databases or roles, not one someone is connected to, not
/// the user's (a role named like ours without a run's comment is not provably ours).
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
                 COMMENT ON DATABASE {live} IS 'outbox-lab run liverun{tag}';
                 CREATE ROLE {dead}_relay; CREATE ROLE {dead}_writer IN ROLE {dead}_relay;
                 COMMENT ON ROLE {dead}_relay IS 'outbox-lab run deadrun{tag}';
                 COMMENT ON ROLE {dead}_writer IS 'outbox-lab run deadrun{tag}';
                 CREATE ROLE {live}_relay;
                 COMMENT ON ROLE {live}_relay IS 'outbox-lab run liverun{tag}';
                 CREATE ROLE outboxlab_users_{tag};"
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
        let role = |name: String| {
            count(format!(
                "SELECT count(*) FROM pg_roles WHERE rolname = '{name}'"
            ))
        };
        for dropped in [format!("{dead}_relay"), format!("{dead}_writer")] {
            assert!(
                cleaned.stdout.contains(&format!("dropped role {dropped}")),
                "{}",
                cleaned.stdout
            );
            assert_eq!(role(dropped).await, 0);
        }
        let kept = [format!("{live}_relay"), format!("outboxlab_users_{tag}")];
        for name in &kept {
            assert_eq!(
                role(name.clone()).await,
                1,
                "{name} dropped:\n{}",
                cleaned.stdout
            );
        }
        drop((_holder, _busy));
        for name in [&live, &busy, &users] {
            admin
                .batch_execute(&format!("DROP DATABASE {name} WITH (FORCE)"))
                .await
                .unwrap();
        }
        for name in kept {
            admin
                .batch_execute(&format!("DROP ROLE {name}"))
                .await
                .unwrap();
        }
    });
}
