//! Directories of throwaway servers (the PostgreSQL cluster, the Redis server): created under the
//! temp dir with a marker naming the run that owns them, and removed with their server.
//!
//! A run killed with SIGKILL cannot clean up; the marker lets the next run find what it left
//! (owner gone) and remove it. `--keep` marks a directory kept: only `outbox-lab clean` removes it.

use std::fs;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

/// Every throwaway directory's name starts with this.
const DIR_PREFIX: &str = "outbox-lab-";
/// The marker file that makes a directory ours.
const MARKER: &str = "outbox-lab-owner.json";
/// A fast shutdown takes milliseconds; after this the server is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// Who owns a throwaway directory and what runs in it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Marker {
    /// The outbox-lab process that created it; when it is gone, so is the directory.
    pub owner_pid: i32,
    /// Left running on purpose (`--keep`).
    pub kept: bool,
    /// The server's process, once started.
    pub server_pid: Option<i32>,
    pub port: u16,
}

/// Creates `<tmp>/outbox-lab-<kind>-<pid>-<nanos>` (mode 0700) with its marker.
pub fn create_dir(kind: &str) -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!(
        "{DIR_PREFIX}{kind}-{}-{:x}",
        std::process::id(),
        chrono::Utc::now().timestamp_nanos_opt().unwrap_or_default()
    ));
    fs::create_dir(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o700))?;
    write_marker(
        &dir,
        &Marker {
            owner_pid: own_pid(),
            kept: false,
            server_pid: None,
            port: 0,
        },
    )?;
    Ok(dir)
}

pub fn write_marker(dir: &Path, marker: &Marker) -> Result<()> {
    fs::write(dir.join(MARKER), serde_json::to_vec(marker)?)
        .with_context(|| format!("cannot write the marker in {}", dir.display()))
}

fn own_pid() -> i32 {
    std::process::id() as i32
}

/// Stops the server recorded in `dir` (or PostgreSQL's, from its pid file) and removes `dir`.
pub fn remove(dir: &Path) {
    let marker = read_marker(dir);
    let postmaster = fs::read_to_string(dir.join("data/postmaster.pid")).unwrap_or_default();
    let pids = [
        marker.and_then(|m| m.server_pid),
        postmaster
            .lines()
            .next()
            .and_then(|l| l.trim().parse().ok()),
    ];
    for pid in pids.into_iter().flatten() {
        stop(Pid::from_raw(pid), Signal::SIGINT);
    }
    let _ = fs::remove_dir_all(dir);
}

fn read_marker(dir: &Path) -> Option<Marker> {
    serde_json::from_slice(&fs::read(dir.join(MARKER)).ok()?).ok()
}

/// Our directories under the temp dir, with their markers.
fn ours() -> Vec<(PathBuf, Marker)> {
    fs::read_dir(std::env::temp_dir())
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(DIR_PREFIX))
        .filter_map(|e| Some((e.path(), read_marker(&e.path())?)))
        .collect()
}

/// Removes directories whose owning run died without cleaning up.
pub fn remove_orphans() {
    for (dir, marker) in ours() {
        if !marker.kept && !is_alive(Pid::from_raw(marker.owner_pid)) {
            remove(&dir);
            eprintln!(
                "removed a throwaway server left by an earlier run: {}",
                dir.display()
            );
        }
    }
}

/// `outbox-lab clean`: removes every directory no live run is using, kept ones included.
pub fn clean() -> Vec<PathBuf> {
    let mut removed = Vec::new();
    for (dir, marker) in ours() {
        let in_use = marker.owner_pid != own_pid() && is_alive(Pid::from_raw(marker.owner_pid));
        if marker.kept || !in_use {
            remove(&dir);
            removed.push(dir);
        }
    }
    removed
}

/// Asks a server to stop with `signal`, and kills it if it has not gone after STOP_TIMEOUT.
pub fn stop(pid: Pid, signal: Signal) {
    if kill(pid, signal).is_err() {
        return;
    }
    let started = Instant::now();
    while is_alive(pid) && started.elapsed() < STOP_TIMEOUT {
        std::thread::sleep(Duration::from_millis(5));
    }
    if is_alive(pid) {
        let _ = kill(pid, Signal::SIGKILL);
    }
}

/// True while the process exists and is not a zombie.
pub fn is_alive(pid: Pid) -> bool {
    if kill(pid, None).is_err() {
        return false;
    }
    // A zombie still answers kill(0); its state letter in /proc says it has exited.
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    !stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .trim_start()
        .starts_with('Z')
}

/// A port nothing listens on right now (the server may still lose a race for it: callers retry).
pub fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("cannot find a free port")?;
    Ok(listener.local_addr()?.port())
}

/// The last non-empty line of a log or an error output.
pub fn last_line(text: &str) -> String {
    text.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
        .to_string()
}
