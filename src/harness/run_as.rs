//! Who a stranger's relay runs as. A relay of the user's (`verify --relay-cmd`) or a zoo
//! library is code nobody here wrote: when outbox-lab runs as root it never runs as root, nor as
//! anyone another run or the machine's users are. Every lab (one `verify`, one run of a zoo
//! entry) claims a **uid and gid of its own** ([`RelayIdentity`]): a number of a range no user of
//! the machine has (no passwd or group entry), under a lock only root can take. With supplementary
//! groups dropped, no new privileges (a set-uid program gains nothing), a minimal environment, and
//! a home and temp dir that only it can enter, removed after it. Only that uid's group may enter
//! the sockets it is given (the database link, the Redis proxy).
//!
//! Why a uid per lab (not a cgroup or a PID namespace): it works on any Linux as root, and it is
//! what keeps runs apart, not only what ends them. A relay cannot read another run's relay's
//! `/proc/PID/environ` (its `PGPASSWORD`, its broker's token), signal it, or enter its link; and
//! everything a relay started, in its process group or not (`setsid`, a double fork), still runs
//! as that uid, so [`RelayIdentity::end_every_process`] ends it all at the end of every run: a
//! process of that uid, made to signal every process it may (`kill(-1)`), reaches exactly those.
//! A run killed before it could (SIGKILL) leaves its claim unlocked: the next lab to look finds
//! the uid's processes there and ends them, as orphans of a dead run.
//!
//! `--run-as USER` names a user instead: never root, never the user the servers run as, one that
//! runs nothing when the lab starts (its processes are all ended when each run ends), and one lab
//! at a time.
//!
//! Its working directory stays the one outbox-lab was started in, so that a relative path in
//! `--relay-cmd` means what the user meant; the paths it names are checked beforehand, so that a
//! relay the user cannot reach is one line saying so, not a relay that exits at once.

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::fcntl::{Flock, FlockArg};
use nix::unistd::{chown, geteuid, Gid, Group, Uid, User};
use tokio::process::Command;

use super::process::ProcessId;
use super::throwaway::{self, RunDir};

/// The first uid (and gid) of the range relays run as, one per lab: `0x7E000000`, far above
/// the ranges users, system users and containers' subordinate ids are given from.
pub const RELAY_UID_BASE: u32 = 0x7E00_0000;
/// How many labs may run relays at once on one machine.
const RELAY_UID_SLOTS: u32 = 1024;
/// Where the claims are kept: root's alone (a file per uid, locked while a lab holds it).
const CLAIMS_DIR: &str = "/run/outbox-lab";
/// What a relay of a uid of its own is called in its environment (`USER`, `LOGNAME`).
const RELAY_USER_NAME: &str = "outbox-lab-relay";
/// The relay's PATH: the system's directories only (root's may hold directories it cannot
/// read, or tools of root's own).
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Ending every process of a uid takes milliseconds; after this, what is left is reported.
const END_EVERY_PROCESS_LIMIT: Duration = Duration::from_secs(5);

/// Who strangers' relays run as, as chosen (each lab then claims its [`RelayIdentity`]).
#[derive(Debug, Clone)]
pub enum RunAs {
    /// A uid of its own for each lab (the default as root).
    OwnUid,
    /// `--run-as USER`.
    Named(Arc<User>),
}

impl RunAs {
    /// Who relays run as: nobody else (`None`) unless outbox-lab runs as root; then `named`,
    /// else a uid of its own per lab. Never root, nor the servers' user.
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
        let Some(name) = named else {
            return Ok(Some(RunAs::OwnUid));
        };
        let user = User::from_name(name)?.with_context(|| {
            format!(
                "--run-as {name}: no such user; create it (useradd --system {name}) or leave \
                 --run-as out to run each run's relays as a uid of their own"
            )
        })?;
        if user.uid.is_root() {
            bail!(
                "--run-as {name}: a stranger's relay never runs as root; name an unprivileged user"
            );
        }
        if let Some(server) = throwaway::server_user()? {
            if server.uid == user.uid {
                bail!(
                    "--run-as {name}: the throwaway servers run as {name}, and a relay must not \
                     reach their files or signal them; name another user, or leave --run-as out"
                );
            }
        }
        Ok(Some(RunAs::Named(Arc::new(user))))
    }

    /// The user `--run-as` named, if it named one (for the replay line).
    pub fn named(&self) -> Option<&str> {
        match self {
            RunAs::OwnUid => None,
            RunAs::Named(user) => Some(&user.name),
        }
    }

    /// Who the relay runs as, in words.
    pub fn describe(&self) -> String {
        match self {
            RunAs::OwnUid => format!(
                "a uid of its own, unique to the run ({RELAY_UID_BASE} and up, no user of the \
                 machine)"
            ),
            RunAs::Named(user) => format!("the user {}", user.name),
        }
    }

    /// The uid and gid whose rights decide what the relay may reach: a uid of its own owns
    /// nothing and is in no group, so any of the range stands for all.
    fn rights(&self) -> (Uid, Gid) {
        match self {
            RunAs::OwnUid => (Uid::from_raw(RELAY_UID_BASE), Gid::from_raw(RELAY_UID_BASE)),
            RunAs::Named(user) => (user.uid, user.gid),
        }
    }

    /// Fails, saying what to do, unless the relay can reach every path `words` name (those
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
                    "the relay runs as {} (outbox-lab runs as root), which cannot reach {word}: \
                     {why}; make it readable by every user (a checkout outside /root), or name \
                     a user who can with --run-as",
                    self.describe()
                );
            }
        }
        Ok(())
    }

    /// Why the relay cannot reach `path` walked from `from` (every directory searchable, the
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

    /// Why the relay (its own group, no other) lacks `bits` (r=4, x=1) on `path`, if it does.
    fn lacks(&self, path: &Path, bits: u32) -> Option<String> {
        let meta = fs::metadata(path).ok()?;
        let mode = meta.mode();
        let (uid, gid) = self.rights();
        let shift = if meta.uid() == uid.as_raw() {
            6
        } else if meta.gid() == gid.as_raw() {
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

    /// Claims who one lab's relays run as, for as long as the lab holds it (see the module's
    /// doc); ended, every process of it goes.
    pub fn claim(&self) -> Result<RelayIdentity> {
        let claims = claims_dir()?;
        match self {
            RunAs::OwnUid => claim_own_uid(&claims),
            RunAs::Named(user) => claim_named(&claims, user),
        }
    }
}

/// Who one lab's relays run as, claimed for the lab's life: a uid of its own (or the user
/// `--run-as` named), which no other lab has while this one holds it.
#[derive(Debug)]
pub struct RelayIdentity {
    user: User,
    /// Held locked while the lab lives: the claim file, root's alone.
    _claim: Flock<File>,
}

impl RelayIdentity {
    /// The relay's user (for a uid of its own, a user with no passwd entry, named
    /// [`RELAY_USER_NAME`] in its environment).
    pub fn user(&self) -> &User {
        &self.user
    }

    /// Makes `cmd` run as this identity, in a minimal environment with `home` as its HOME and
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

    /// A home for one relay process: only this identity may enter it; removed when dropped.
    pub fn home(&self) -> Result<RelayHome> {
        Ok(RelayHome(RunDir::create("relay-home", Some(&self.user))?))
    }

    /// How many processes run as this identity once the relays have stopped: those a relay
    /// started outside its process group (`setsid`, a double fork), counted once the groups
    /// killed with their relays are gone (the count holds for [`SETTLED`], within a second).
    pub fn leftovers(&self) -> usize {
        const SETTLED: Duration = Duration::from_millis(50);
        let started = Instant::now();
        let mut running = processes_of(self.user.uid).len();
        while running > 0 && started.elapsed() < Duration::from_secs(1) {
            std::thread::sleep(SETTLED);
            let now = processes_of(self.user.uid).len();
            if now == running {
                break;
            }
            running = now;
        }
        running
    }

    /// Ends every process running as this identity (whatever started it, in whichever group or
    /// session); how many were still running after [`END_EVERY_PROCESS_LIMIT`] (none, but for
    /// a process the kernel cannot end).
    pub fn end_every_process(&self) -> usize {
        end_every_process_of(self.user.uid, self.user.gid)
    }
}

impl Drop for RelayIdentity {
    fn drop(&mut self) {
        self.end_every_process();
    }
}

/// The claims' directory, made if missing: root's, 0700, not a link.
fn claims_dir() -> Result<PathBuf> {
    let dir = PathBuf::from(CLAIMS_DIR);
    match fs::create_dir(&dir) {
        Ok(()) => fs::set_permissions(&dir, fs::Permissions::from_mode(0o700))?,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(e).with_context(|| {
                format!("cannot create {CLAIMS_DIR}, where runs claim their relays' uids")
            })
        }
    }
    let meta = fs::symlink_metadata(&dir)?;
    if !meta.is_dir() || meta.uid() != 0 || meta.mode() & 0o077 != 0 {
        bail!(
            "{CLAIMS_DIR} is not root's own directory (owner uid {}, mode {:o}): remove it, \
             outbox-lab makes it anew",
            meta.uid(),
            meta.mode() & 0o7777
        );
    }
    Ok(dir)
}

/// The claim file at `path`, locked without waiting (`None`: another lab holds it), and
/// whether it was there before (an earlier lab's: the uid is one outbox-lab gave out).
fn lock_claim(path: &Path) -> Result<Option<(Flock<File>, bool)>> {
    let (file, existed) = match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
    {
        Ok(file) => (file, false),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let file = OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(path)
                .with_context(|| format!("cannot open {}", path.display()))?;
            (file, true)
        }
        Err(e) => return Err(e).with_context(|| format!("cannot create {}", path.display())),
    };
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(locked) => Ok(Some((locked, existed))),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
        Err((_, e)) => Err(e).with_context(|| format!("cannot lock {}", path.display())),
    }
}

/// Writes who holds the claim now (for a reader's eyes: the lock is what counts).
fn record_holder(claim: &mut Flock<File>) -> Result<()> {
    let holder = ProcessId::own();
    claim.set_len(0)?;
    writeln!(
        &mut **claim,
        "held by outbox-lab pid {} (start {})",
        holder.pid, holder.start
    )?;
    Ok(())
}

/// The first free uid of the range: one no user or group of the machine has, whose claim no
/// lab holds. A claim file found unlocked is an earlier lab's: whatever still runs as its uid
/// is that dead run's, and is ended first. A uid never claimed that has processes is someone
/// else's, and is passed over.
fn claim_own_uid(claims: &Path) -> Result<RelayIdentity> {
    for slot in 0..RELAY_UID_SLOTS {
        let uid = Uid::from_raw(RELAY_UID_BASE + slot);
        let gid = Gid::from_raw(RELAY_UID_BASE + slot);
        let path = claims.join(format!("relay-uid-{}", uid.as_raw()));
        let Some((mut claim, existed)) = lock_claim(&path)? else {
            continue;
        };
        if User::from_uid(uid)?.is_some() || Group::from_gid(gid)?.is_some() {
            continue;
        }
        if existed {
            end_every_process_of(uid, gid);
        } else if !processes_of(uid).is_empty() {
            continue;
        }
        record_holder(&mut claim)?;
        return Ok(RelayIdentity {
            user: User {
                name: RELAY_USER_NAME.to_string(),
                passwd: CString::default(),
                uid,
                gid,
                gecos: CString::default(),
                dir: PathBuf::from("/nonexistent"),
                shell: PathBuf::from("/usr/sbin/nologin"),
            },
            _claim: claim,
        });
    }
    bail!(
        "no uid left for the relays: {RELAY_UID_SLOTS} runs hold one now (claims in \
         {CLAIMS_DIR}); wait for some to end"
    )
}

/// `--run-as USER`, for one lab at a time, and only while the user runs nothing else: every
/// process of it is ended when each run ends.
fn claim_named(claims: &Path, user: &User) -> Result<RelayIdentity> {
    let path = claims.join(format!("run-as-{}", user.uid.as_raw()));
    let Some((mut claim, _)) = lock_claim(&path)? else {
        bail!(
            "--run-as {}: another run of outbox-lab runs its relays as {} now; wait for it, or \
             leave --run-as out (each run then has a uid of its own)",
            user.name,
            user.name
        );
    };
    let running = processes_of(user.uid);
    if !running.is_empty() {
        let pids: Vec<String> = running.iter().take(5).map(i32::to_string).collect();
        bail!(
            "--run-as {}: {} runs {} process(es) now (pid {}): outbox-lab ends every process of \
             the relays' user when a run ends, so it runs relays only as a user that runs \
             nothing else; leave --run-as out, or name an idle user",
            user.name,
            user.name,
            running.len(),
            pids.join(", ")
        );
    }
    record_holder(&mut claim)?;
    Ok(RelayIdentity {
        user: user.clone(),
        _claim: claim,
    })
}

/// The pids running as `uid` now (real, effective, saved or filesystem uid), zombies left out:
/// they run nothing.
fn processes_of(uid: Uid) -> Vec<i32> {
    let uid = uid.as_raw().to_string();
    let pids = fs::read_dir("/proc").into_iter().flatten().flatten();
    pids.filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let Ok(status) = fs::read_to_string(format!("/proc/{pid}/status")) else {
                return false;
            };
            let field = |name: &str| {
                status
                    .lines()
                    .find_map(|line| line.strip_prefix(name))
                    .unwrap_or("")
                    .to_string()
            };
            !field("State:").trim_start().starts_with('Z')
                && field("Uid:").split_whitespace().any(|u| u == uid)
        })
        .collect()
}

/// SIGKILL to every process of `uid`, again until none runs (a process forking meanwhile is
/// caught the next time); how many still ran at the limit.
fn end_every_process_of(uid: Uid, gid: Gid) -> usize {
    let started = Instant::now();
    loop {
        let running = processes_of(uid).len();
        if running == 0 {
            return 0;
        }
        if started.elapsed() > END_EVERY_PROCESS_LIMIT {
            crate::errln!(
                "outbox-lab: {running} process(es) of uid {uid} still run {:?} after SIGKILL",
                END_EVERY_PROCESS_LIMIT
            );
            return running;
        }
        signal_every_process_as(uid, gid);
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A child of ours becomes `uid` and sends SIGKILL to every process it may signal: exactly the
/// processes of `uid` (and not itself). It ends there, before any exec.
fn signal_every_process_as(uid: Uid, gid: Gid) {
    let mut signaller = std::process::Command::new("/nonexistent/outbox-lab-signaller");
    signaller
        .uid(uid.as_raw())
        .gid(gid.as_raw())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // SAFETY: kill and _exit are async-signal-safe; the child does nothing else before it ends.
    unsafe {
        signaller.pre_exec(|| {
            libc::kill(-1, libc::SIGKILL);
            libc::_exit(0)
        });
    }
    if let Ok(mut child) = signaller.spawn() {
        let _ = child.wait();
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

#[cfg(test)]
mod tests {
    use super::*;

    fn someone() -> RunAs {
        RunAs::Named(Arc::new(User {
            uid: Uid::from_raw(54321),
            gid: Gid::from_raw(54321),
            ..User::from_uid(Uid::from_raw(0)).unwrap().unwrap()
        }))
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
        for who in [someone(), RunAs::OwnUid] {
            who.check_reachable(std::slice::from_ref(&relay)).unwrap();
        }
        fs::set_permissions(&inner, fs::Permissions::from_mode(0o700)).unwrap();
        for who in [someone(), RunAs::OwnUid] {
            let err = who
                .check_reachable(std::slice::from_ref(&relay))
                .unwrap_err()
                .to_string();
            assert!(err.contains("mode 700"), "{err}");
            assert!(err.contains(&inner.display().to_string()), "{err}");
        }
        fs::remove_dir_all(&dir).unwrap();
    }
}
