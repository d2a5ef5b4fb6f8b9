//! Looking at the machine the tests share with others: what a process listens on, and what
//! another local user (`nobody`) can do.

use std::os::unix::process::CommandExt;
use std::process::Command;

use nix::unistd::User;

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
