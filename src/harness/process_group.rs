//! A child process that leads a process group of its own (a relay of the user's, a child of
//! ours, a throwaway server): whatever it starts stays in its group, and goes with it.
//!
//! The group is signalled only while its leader is our child and not yet reaped (running, or a
//! zombie): until then its pid, and so the group's id, cannot name anything else. So the end of
//! the leader is seen before it is reaped (a pidfd, readable once it has exited), the rest of
//! its group is killed then, and only then is the leader reaped.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::process::{Child, Command};

use crate::harness::process::processes;
use crate::wait;

/// How long processes sent SIGKILL may take to be gone (they are, within milliseconds).
const KILLED_GONE_LIMIT: Duration = Duration::from_secs(5);

/// A child of ours leading a process group of its own. Dropping it kills the group.
#[derive(Debug)]
pub struct GroupLeader {
    child: Child,
    /// Readable once the leader has exited, before it is reaped.
    exited: AsyncFd<OwnedFd>,
    /// The leader's pid: the group's id.
    group: Pid,
}

impl GroupLeader {
    /// Starts `cmd` as the leader of a new process group, killed if we drop it.
    pub fn spawn(cmd: &mut Command) -> io::Result<GroupLeader> {
        let child = cmd.process_group(0).kill_on_drop(true).spawn()?;
        let pid = child.id().expect("not waited for yet");
        // SAFETY: pidfd_open takes a pid and flags; it returns a new descriptor or -1. The pid
        // is our child's, not yet reaped: the descriptor is that process's.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor just opened, owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        // SAFETY: an OwnedFd stays open, the same descriptor, for as long as it is owned.
        let exited = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE)? };
        Ok(GroupLeader {
            child,
            exited,
            group: Pid::from_raw(pid as i32),
        })
    }

    /// The leader's pid while it has not been reaped.
    pub fn id(&self) -> Option<u32> {
        self.child.id()
    }

    /// The leader, for its pipes.
    pub fn child_mut(&mut self) -> &mut Child {
        &mut self.child
    }

    /// Resolves when the leader has ended, however (by itself, by a nemesis's SIGKILL, by a
    /// stop), the rest of its group killed before the leader is reaped. Cancel-safe.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        if self.child.id().is_some() {
            // The readiness is left set: a call cut short after this sees it again.
            drop(self.exited.readable().await?);
            self.signal_group(Signal::SIGKILL);
        }
        self.child.wait().await
    }

    /// SIGTERM to the group (SIGCONT first: a paused process cannot act on it), SIGKILL to the
    /// group once the leader has ended or after `grace`, whichever comes first; how the leader
    /// ended.
    pub async fn stop(&mut self, grace: Duration) -> io::Result<ExitStatus> {
        self.signal_group(Signal::SIGCONT);
        self.signal_group(Signal::SIGTERM);
        match tokio::time::timeout(grace, self.wait()).await {
            Ok(status) => status,
            Err(_) => {
                self.signal_group(Signal::SIGKILL);
                self.wait().await
            }
        }
    }

    /// Sends `signal` to the group, if the leader has not been reaped; whether it was sent.
    pub fn signal_group(&self, signal: Signal) -> bool {
        self.child.id().is_some() && killpg(self.group, signal).is_ok()
    }
}

impl Drop for GroupLeader {
    /// Whatever the leader started goes with it (kill_on_drop reaches only the leader).
    fn drop(&mut self) {
        self.signal_group(Signal::SIGKILL);
    }
}

/// SIGKILL to the group `leader` leads, then waits (boundedly) until none of its processes
/// runs: nothing of it writes any more. Only for a leader that is our child, ended or not, and
/// not yet reaped.
pub fn kill_group_and_wait(leader: u32) {
    let group = leader as i32;
    let _ = killpg(Pid::from_raw(group), Signal::SIGKILL);
    wait::blocking_up_to(KILLED_GONE_LIMIT, Duration::from_millis(2), || {
        !group_runs(group)
    });
}

/// Whether our child `pid` has ended, without reaping it: its pid (and so its group's id) stays
/// its own until it is waited for.
pub fn has_ended(pid: u32) -> io::Result<bool> {
    use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    match waitid(Id::Pid(Pid::from_raw(pid as i32)), flags) {
        Ok(WaitStatus::StillAlive) => Ok(false),
        Ok(_) => Ok(true),
        Err(e) => Err(e.into()),
    }
}

/// Whether a process of group `group` runs (zombies do not count: they write nothing).
fn group_runs(group: i32) -> bool {
    // After the command name: state, ppid, pgrp (proc(5) fields 3 to 5).
    processes().any(|(_, fields)| {
        fields.first().map(String::as_str) != Some("Z")
            && fields.get(2).and_then(|g| g.parse().ok()) == Some(group)
    })
}
