//! Directories of throwaway servers (the PostgreSQL cluster, the Redis server): created under the
//! temp dir with a marker naming the run that owns them and the server that runs in them, and
//! removed with their server. Also what a server is given when it starts: a fresh secret (its
//! ports are [`super::ports`]').
//!
//! A run killed with SIGKILL cannot clean up; the marker lets the next run find what it left
//! (owner gone) and remove it. `--keep` marks a directory kept: only `outbox-lab clean` removes it.
//!
//! Anyone can create `/tmp/outbox-lab-*`, so nothing found there is trusted: a directory counts
//! as ours only when we own it and its marker, and a process is signalled only when its start
//! time, executable and working directory prove it is the server that directory started.
//!
//! Layout: the run directory is ours (0700, or 0710 with the server user's group so that user
//! can reach its own subdirectory) and holds only files we create — the marker and the server's
//! log, written through a descriptor the server inherits. The server's files live in `server/`,
//! owned by the server user; we never write there, so no link that user plants is followed.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use nix::sys::signal::Signal;
use nix::unistd::{chown, geteuid, User};
use serde::{Deserialize, Serialize};

use super::process::ProcessId;

/// Every throwaway directory's name starts with this.
const DIR_PREFIX: &str = "outbox-lab-";
/// The marker file that makes a directory ours.
const MARKER: &str = "outbox-lab-owner.json";
/// The server's own subdirectory (owned by the server user).
const SERVER_DIR: &str = "server";
/// The unprivileged user servers run as when outbox-lab runs as root.
pub const SERVER_USER: &str = "postgres";

/// The server a directory started: enough to prove a pid is still that server.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ServerProcess {
    pub process: ProcessId,
    /// The executable, canonical.
    pub exe: PathBuf,
}

impl ServerProcess {
    /// Records a server we just spawned (its exec has happened when `spawn` returns).
    pub fn spawned(child: &std::process::Child) -> Result<ServerProcess> {
        let pid = child.id() as i32;
        let process = ProcessId::of(pid).context("the server exited as it started")?;
        let exe = fs::read_link(format!("/proc/{pid}/exe"))
            .with_context(|| format!("cannot read the executable of pid {pid}"))?;
        Ok(ServerProcess { process, exe })
    }

    /// What `pid` is now: gone, provably this directory's server, or something else.
    fn identify(&self, dir: &Path) -> Identity {
        if !self.process.is_running() {
            return Identity::Gone;
        }
        let pid = self.process.pid;
        let exe = fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
        let cwd = fs::read_link(format!("/proc/{pid}/cwd")).unwrap_or_default();
        if exe != self.exe {
            return Identity::Stranger(format!("pid {pid} runs {}", exe.display()));
        }
        if !cwd.starts_with(dir) {
            return Identity::Stranger(format!("pid {pid} works in {}", cwd.display()));
        }
        Identity::Proven
    }
}

enum Identity {
    Gone,
    Proven,
    Stranger(String),
}

/// Who owns a throwaway directory and what runs in it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Marker {
    /// The outbox-lab process that created it; when it is gone, so is the directory.
    pub owner: ProcessId,
    /// Left running on purpose (`--keep`).
    pub kept: bool,
    /// The server, once started.
    pub server: Option<ServerProcess>,
}

/// A throwaway directory of this run.
#[derive(Debug)]
pub struct RunDir {
    path: PathBuf,
}

impl RunDir {
    /// Creates `<tmp>/outbox-lab-<kind>-<pid>-<nanos>` with its marker, and `server/` inside it
    /// for `server_user` (ourselves when `None`).
    pub fn create(kind: &str, server_user: Option<&User>) -> Result<RunDir> {
        let path = std::env::temp_dir().join(format!(
            "{DIR_PREFIX}{kind}-{}-{:x}",
            std::process::id(),
            chrono::Utc::now().timestamp_nanos_opt().unwrap_or_default()
        ));
        // create_dir fails on anything already there, a planted link included.
        fs::create_dir(&path).with_context(|| format!("cannot create {}", path.display()))?;
        let run = RunDir { path };
        let result = (|| {
            fs::set_permissions(&run.path, fs::Permissions::from_mode(0o700))?;
            let server = run.server_dir();
            fs::create_dir(&server)?;
            fs::set_permissions(&server, fs::Permissions::from_mode(0o700))?;
            if let Some(user) = server_user {
                // The server user may enter (not list) our directory to reach its own.
                chown(&run.path, None, Some(user.gid))?;
                fs::set_permissions(&run.path, fs::Permissions::from_mode(0o710))?;
                chown(&server, Some(user.uid), Some(user.gid))?;
            }
            run.write_marker(&Marker {
                owner: ProcessId::own(),
                kept: false,
                server: None,
            })
        })();
        if let Err(e) = result {
            let _ = fs::remove_dir_all(&run.path);
            return Err(e).with_context(|| format!("cannot prepare {}", run.path.display()));
        }
        Ok(run)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The server's own directory (its data, its socket).
    pub fn server_dir(&self) -> PathBuf {
        self.path.join(SERVER_DIR)
    }

    /// Creates a new file of ours (mode 0600), never following a link, never reusing a file.
    /// A file of ours opened to append (created if missing), never through a link: a server's
    /// log, which a restarted server goes on writing.
    pub fn append_file(&self, name: &str) -> Result<File> {
        let path = self.path.join(name);
        OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .with_context(|| format!("cannot open {}", path.display()))
    }

    pub fn write_marker(&self, marker: &Marker) -> Result<()> {
        // A new file renamed over the old one: the marker is never half written.
        let temp = self.path.join(format!("{MARKER}.{}", std::process::id()));
        let _ = fs::remove_file(&temp);
        let mut file = create_new(&temp)?;
        file.write_all(&serde_json::to_vec(marker)?)?;
        fs::rename(&temp, self.path.join(MARKER))
            .with_context(|| format!("cannot write the marker in {}", self.path.display()))
    }
}

/// Creates `path` as a new file, mode 0600: fails on anything already there, links included.
pub fn create_new(path: &Path) -> Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))
}

/// Reads a file the server user may have replaced, without following a link.
pub fn read_no_follow(path: &Path) -> String {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path);
    let mut text = String::new();
    if let Ok(mut file) = file {
        let _ = std::io::Read::read_to_string(&mut file, &mut text);
    }
    text
}

/// The user servers run as: none (ourselves) unless we are root.
pub fn server_user() -> Result<Option<User>> {
    if !geteuid().is_root() {
        return Ok(None);
    }
    match User::from_name(SERVER_USER)? {
        Some(user) => Ok(Some(user)),
        None => bail!(
            "running as root, and PostgreSQL refuses root: create the system user 'postgres' \
             (apt-get install postgresql does) or run as an unprivileged user"
        ),
    }
}

/// A directory under the temp dir that carries our name, and what we make of it.
enum Found {
    /// Ours, with its marker.
    Ours(PathBuf, Marker),
    /// Named like ours but not provably ours: left alone.
    NotOurs(PathBuf, String),
}

fn found() -> Vec<Found> {
    let me = geteuid().as_raw();
    fs::read_dir(std::env::temp_dir())
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(DIR_PREFIX))
        .map(|e| {
            let dir = e.path();
            match read_marker(&dir, me) {
                Ok(marker) => Found::Ours(dir, marker),
                Err(why) => Found::NotOurs(dir, why),
            }
        })
        .collect()
}

/// The marker of `dir`, when the directory and the marker are both ours (owned by `uid`, not
/// links, not writable by anyone else).
fn read_marker(dir: &Path, uid: u32) -> std::result::Result<Marker, String> {
    let meta = fs::symlink_metadata(dir).map_err(|e| e.to_string())?;
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o022 != 0 {
        return Err(format!(
            "not a directory of ours (owner uid {}, mode {:o})",
            meta.uid(),
            meta.mode() & 0o7777
        ));
    }
    let path = dir.join(MARKER);
    let meta = fs::symlink_metadata(&path).map_err(|_| "no marker".to_string())?;
    if !meta.is_file() || meta.uid() != uid {
        return Err(format!("marker owned by uid {}", meta.uid()));
    }
    serde_json::from_str(&read_no_follow(&path)).map_err(|e| format!("unreadable marker: {e}"))
}

/// Stops the server of a directory we found (only once proven to be its server) and removes the
/// directory; `Err` says why it was left alone.
fn remove_found(dir: &Path, marker: &Marker) -> std::result::Result<(), String> {
    if let Some(server) = &marker.server {
        match server.identify(dir) {
            Identity::Gone => {}
            Identity::Stranger(why) => {
                return Err(format!("its server is not provably ours ({why})"));
            }
            // SIGINT: PostgreSQL's fast shutdown, and a clean stop for Redis too.
            Identity::Proven => server.process.stop(Signal::SIGINT),
        }
    }
    fs::remove_dir_all(dir).map_err(|e| format!("cannot remove it: {e}"))
}

/// Removes directories whose owning run died without cleaning up (kept ones stay).
pub fn remove_orphans() {
    for found in found() {
        let Found::Ours(dir, marker) = found else {
            continue;
        };
        if marker.kept || marker.owner.is_running() {
            continue;
        }
        // One left alone is not this run's business: `outbox-lab clean` says why.
        if remove_found(&dir, &marker).is_ok() {
            crate::errln!(
                "removed {} left by an earlier run: {}",
                what_it_held(&dir),
                dir.display()
            );
        }
    }
}

/// What a throwaway directory held, by its kind (`outbox-lab-<kind>-<pid>-<nanos>`), in words.
fn what_it_held(dir: &Path) -> String {
    let name = dir.file_name().unwrap_or_default().to_string_lossy();
    let kind = name
        .strip_prefix(DIR_PREFIX)
        .and_then(|rest| rest.rsplitn(3, '-').nth(2))
        .unwrap_or("");
    match kind {
        "pg" => "a throwaway PostgreSQL cluster".into(),
        "pg-standby" => "a throwaway PostgreSQL standby".into(),
        "redis" => "a throwaway Redis server".into(),
        "nats" | "nats-cluster" => "a throwaway NATS server".into(),
        "rabbitmq" => "a throwaway RabbitMQ node".into(),
        "epmd" => "a throwaway Erlang port mapper".into(),
        "kafka" => "a throwaway Kafka broker".into(),
        "pg-link" => "a run's database links (their sockets)".into(),
        "redis-proxy" => "a run's Redis proxy (its socket)".into(),
        "relay-home" => "a relay's home directory".into(),
        other => format!("a throwaway directory ({other})"),
    }
}

/// What `outbox-lab clean` did with one directory.
pub enum Cleaned {
    Removed(PathBuf),
    /// Its run is still going: never touched.
    InUse(PathBuf),
    Left(PathBuf, String),
}

/// `outbox-lab clean`: removes every directory of ours whose run has ended, kept ones included.
pub fn clean() -> Vec<Cleaned> {
    found()
        .into_iter()
        .map(|found| match found {
            Found::NotOurs(dir, why) => Cleaned::Left(dir, why),
            Found::Ours(dir, marker) if marker.owner.is_running() => Cleaned::InUse(dir),
            Found::Ours(dir, marker) => match remove_found(&dir, &marker) {
                Ok(()) => Cleaned::Removed(dir),
                Err(why) => Cleaned::Left(dir, why),
            },
        })
        .collect()
}

/// 244 random bits, hex: a fresh secret (a token, a password, a cookie) for every server.
pub fn random_secret() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
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

#[cfg(test)]
mod tests {
    use super::*;

    /// What an earlier run left is named by what it held, not all "a throwaway server".
    #[test]
    fn leftovers_are_named_by_their_kind() {
        let held = |name: &str| what_it_held(&std::env::temp_dir().join(name));
        assert_eq!(
            held("outbox-lab-pg-123-18ef"),
            "a throwaway PostgreSQL cluster"
        );
        assert_eq!(
            held("outbox-lab-pg-link-123-18ef"),
            "a run's database links (their sockets)"
        );
        assert_eq!(
            held("outbox-lab-relay-home-9-a"),
            "a relay's home directory"
        );
        assert_eq!(held("outbox-lab-odd-9-a"), "a throwaway directory (odd)");
    }
}
