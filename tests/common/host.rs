//! Looking at the machine the tests share with others: what a process listens on, which command
//! lines run, the files below a directory, and what another local user (`nobody`) can do.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use nix::unistd::{geteuid, User};

/// The local addresses (`HEXIP:HEXPORT` as in /proc/net/tcp*) that process `pid` listens on.
pub fn tcp_listen_addresses(pid: i32) -> Vec<String> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|fd| {
            let link = std::fs::read_link(fd.path()).ok()?;
            let inode = link.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?;
            Some(inode.to_string())
        })
        .collect();
    let mut found = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // st 0A is LISTEN; the inode is field 9.
            if fields.get(3) == Some(&"0A") && inodes.iter().any(|i| fields.get(9) == Some(&&**i)) {
                found.push(fields[1].to_string());
            }
        }
    }
    found
}

/// The processes working in `dir` (their cwd under it): a throwaway server and what it started.
pub fn processes_in(dir: &Path) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| cwd.starts_with(dir))
        })
        .collect()
}

/// `program args` as user `nobody`: whether it succeeded, and what it printed.
pub fn as_nobody(program: &str, args: &[&str]) -> (bool, String) {
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

/// The variable that lets a run that is not root skip what needs root, knowingly: set to 1,
/// each such test (or part of one) says on stderr that it was skipped; unset, it fails.
pub const SKIP_ROOT_TESTS: &str = "OUTBOX_LAB_SKIP_ROOT_TESTS";

/// Whether `what` (a check that needs root: another user's view, a relay run as another user,
/// the servers' environment) runs: as root (as .ci/run runs the tests), yes. As another user
/// the test fails, as a security check must not pass by not running, unless
/// `OUTBOX_LAB_SKIP_ROOT_TESTS=1` opts out: then no, said on stderr.
pub fn runs_as_root(what: &str) -> bool {
    if geteuid().is_root() {
        return true;
    }
    if std::env::var(SKIP_ROOT_TESTS).as_deref() == Ok("1") {
        eprintln!("SKIPPED ({SKIP_ROOT_TESTS}=1, not root): {what}");
        return false;
    }
    panic!(
        "{what} needs root and the tests do not run as root: run them as root (as .ci/run \
         does), or set {SKIP_ROOT_TESTS}=1 to skip it knowingly"
    );
}

/// Every file and directory below `dir`, depth first.
pub fn walk(dir: &Path) -> Vec<PathBuf> {
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

/// Processes whose command line contains `needle`.
pub fn command_lines_with(needle: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(needle))
        .collect()
}
