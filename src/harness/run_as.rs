//! Who a stranger's relay runs as. A relay of the user's (`verify --relay-cmd`) or a zoo
//! library is code nobody here wrote: when outbox-lab runs as root it never runs as root, but as
//! an unprivileged user (`outbox-lab-relay`, created once, or `--run-as USER`), with supplementary
//! groups dropped, a minimal environment, and a home and temp dir of its own that only it can
//! read, removed after it. Only that user may enter the sockets it is given (the database link,
//! the Redis proxy): the relay's user group, and no other local user.
//!
//! Its working directory stays the one outbox-lab was started in, so that a relative path in
//! `--relay-cmd` means what the user meant; the paths it names are checked beforehand, so that a
//! relay the user cannot reach is one line saying so, not a relay that exits at once.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command as StdCommand;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use nix::unistd::{chown, geteuid, Uid, User};
use tokio::process::Command;

use super::throwaway::RunDir;

/// The user a stranger's relay runs as when outbox-lab runs as root and `--run-as` is not given.
pub const DEFAULT_USER: &str = "outbox-lab-relay";
/// The relay's PATH: the system's directories only (root's may hold directories it cannot
/// read, or tools of root's own).
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// How many times creating the user is tried: useradd fails while another holds /etc/passwd's
/// lock (a concurrent run creating the same user).
const USERADD_TRIES: u32 = 20;

/// An unprivileged user that strangers' relays run as.
#[derive(Debug, Clone)]
pub struct RunAs {
    user: Arc<User>,
}

impl RunAs {
    /// Who relays run as: nobody else (`None`) unless outbox-lab runs as root; then `named`,
    /// else [`DEFAULT_USER`], created if missing. Never root.
    pub fn resolve(named: Option<&str>) -> Result<Option<RunAs>> {
        if !geteuid().is_root() {
            if let Some(name) = named {
                let me = User::from_uid(geteuid())?
                    .map(|u| u.name)
                    .unwrap_or_default();
                if name != me {
                    bail!(
                        "--run-as {name}: only root can run a relay as another user; outbox-lab \
                         runs as {me}, and so does the relay (leave --run-as out)"
                    );
                }
            }
            return Ok(None);
        }
        let user = match named {
            Some(name) => User::from_name(name)?.with_context(|| {
                format!(
                    "--run-as {name}: no such user; create it (useradd --system {name}) or \
                     leave --run-as out to run relays as {DEFAULT_USER}"
                )
            })?,
            None => default_user()?,
        };
        if user.uid.is_root() {
            bail!(
                "--run-as {}: a stranger's relay never runs as root; name an unprivileged user",
                user.name
            );
        }
        Ok(Some(RunAs {
            user: Arc::new(user),
        }))
    }

    pub fn name(&self) -> &str {
        &self.user.name
    }

    pub fn user(&self) -> &User {
        &self.user
    }

    /// Fails, saying what to do, unless this user can reach every path `words` name (those
    /// that exist, relative ones from our working directory down): the program, its script,
    /// its interpreter.
    pub fn check_reachable(&self, words: &[String]) -> Result<()> {
        let cwd = std::env::current_dir()?;
        for word in words {
            let path = Path::new(word);
            if word.is_empty() || !path.exists() {
                continue;
            }
            let found = match path.is_absolute() {
                true => self.unreachable(Path::new("/"), path),
                // The relay keeps our working directory: a relative path is walked from it.
                false => self.unreachable(&cwd, path),
            };
            if let Some(why) = found {
                bail!(
                    "the relay runs as the unprivileged user {} (outbox-lab runs as root), who \
                     cannot reach {word}: {why}; make it readable by that user (a checkout \
                     outside /root), or name another with --run-as",
                    self.user.name
                );
            }
        }
        Ok(())
    }

    /// Why this user cannot reach `path` walked from `from` (every directory searchable, the
    /// file readable), symbolic links followed; `None` if it can.
    fn unreachable(&self, from: &Path, path: &Path) -> Option<String> {
        let mut walked = from.to_path_buf();
        let mut dirs = vec![walked.clone()];
        let components: Vec<_> = path.components().collect();
        for (i, component) in components.iter().enumerate() {
            walked.push(component);
            if i + 1 < components.len() {
                dirs.push(walked.clone());
            }
        }
        for dir in &dirs {
            if let Some(why) = self.lacks(dir, 0o1) {
                return Some(why);
            }
        }
        let real = fs::canonicalize(&walked).ok()?;
        if real != walked {
            for dir in real.ancestors().skip(1) {
                if let Some(why) = self.lacks(dir, 0o1) {
                    return Some(why);
                }
            }
        }
        let need = if real.is_dir() { 0o1 } else { 0o4 };
        self.lacks(&real, need)
    }

    /// Why this user (its own group, no other) lacks `bits` (r=4, x=1) on `path`, if it does.
    fn lacks(&self, path: &Path, bits: u32) -> Option<String> {
        let meta = fs::metadata(path).ok()?;
        let mode = meta.mode();
        let shift = if meta.uid() == self.user.uid.as_raw() {
            6
        } else if meta.gid() == self.user.gid.as_raw() {
            3
        } else {
            0
        };
        (mode >> shift & bits != bits).then(|| {
            format!(
                "{} is mode {:o}, owner uid {}",
                path.display(),
                mode & 0o7777,
                meta.uid()
            )
        })
    }

    /// Makes `cmd` run as this user, in a minimal environment with `home` as its HOME and
    /// TMPDIR. The rest of its environment is set after this (a cleared environment clears
    /// what was set before).
    pub fn confine(&self, cmd: &mut Command, home: &Path) {
        // std drops the supplementary groups (setgroups) when it changes the uid as root.
        cmd.env_clear()
            .uid(self.user.uid.as_raw())
            .gid(self.user.gid.as_raw())
            .env("PATH", PATH)
            .env("HOME", home)
            .env("TMPDIR", home)
            .env("USER", &self.user.name)
            .env("LOGNAME", &self.user.name)
            .env("LANG", "C.UTF-8");
    }

    /// A home for one relay process: only this user may enter it; removed when dropped.
    pub fn home(&self) -> Result<RelayHome> {
        Ok(RelayHome(RunDir::create("relay-home", Some(&self.user))?))
    }
}

/// Lets `client` (its group) connect to a socket of ours (mode 0660), or keeps it ours alone
/// (0600) when there is no client: no other local user may.
pub fn let_in(socket: &Path, client: Option<&User>) -> Result<()> {
    let group = client.map(|user| user.gid);
    if let Some(gid) = group {
        chown(socket, None::<Uid>, Some(gid))
            .with_context(|| format!("cannot give {} to group {gid}", socket.display()))?;
    }
    let mode = if group.is_some() { 0o660 } else { 0o600 };
    fs::set_permissions(socket, fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot set the mode of {}", socket.display()))
}

/// A relay's HOME and TMPDIR: the `server/` of a throwaway directory, owned by the relay's
/// user (0700), inside ours (0710, its group). Removed with it.
pub struct RelayHome(RunDir);

impl RelayHome {
    pub fn path(&self) -> PathBuf {
        self.0.server_dir()
    }
}

impl Drop for RelayHome {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(self.0.path());
    }
}

/// [`DEFAULT_USER`], created the first time (a system user of its own group, no home, no
/// login shell).
fn default_user() -> Result<User> {
    for _ in 0..USERADD_TRIES {
        if let Some(user) = User::from_name(DEFAULT_USER)? {
            return Ok(user);
        }
        let made = StdCommand::new("useradd")
            .args(["--system", "--user-group", "--no-create-home"])
            .args(["--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin"])
            .arg(DEFAULT_USER)
            .output()
            .context("cannot run useradd to create the relays' user")?;
        if made.status.success() {
            eprintln!(
                "outbox-lab: created the system user {DEFAULT_USER}: strangers' relays run as it, \
                 never as root (--run-as chooses another; userdel {DEFAULT_USER} removes it)"
            );
            continue;
        }
        // Another run may hold /etc/passwd's lock, or have just created the user.
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    User::from_name(DEFAULT_USER)?.with_context(|| {
        format!(
            "cannot create the user {DEFAULT_USER} that strangers' relays run as (useradd \
             failed): create it (useradd --system --user-group {DEFAULT_USER}) or name another \
             with --run-as"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::unistd::Gid;

    fn someone() -> RunAs {
        RunAs {
            user: Arc::new(User {
                uid: Uid::from_raw(54321),
                gid: Gid::from_raw(54321),
                ..User::from_uid(Uid::from_raw(0)).unwrap().unwrap()
            }),
        }
    }

    /// A path under a directory only its owner may enter is refused, naming that directory;
    /// one everybody can read is not.
    #[test]
    fn reachability_is_checked_on_every_directory() {
        let dir = std::env::temp_dir().join(format!("run-as-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir(&dir).unwrap();
        let inner = dir.join("private");
        fs::create_dir(&inner).unwrap();
        fs::write(inner.join("relay.py"), "").unwrap();
        fs::set_permissions(inner.join("relay.py"), fs::Permissions::from_mode(0o644)).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        fs::set_permissions(&inner, fs::Permissions::from_mode(0o755)).unwrap();
        let relay = inner.join("relay.py").display().to_string();
        someone()
            .check_reachable(std::slice::from_ref(&relay))
            .unwrap();
        fs::set_permissions(&inner, fs::Permissions::from_mode(0o700)).unwrap();
        let err = someone().check_reachable(&[relay]).unwrap_err().to_string();
        assert!(err.contains("mode 700"), "{err}");
        assert!(err.contains(&inner.display().to_string()), "{err}");
        fs::remove_dir_all(&dir).unwrap();
    }
}
