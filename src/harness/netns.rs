//! A network namespace of its own for a private server that has no authentication of its own
//! (tansu, the Kafka-protocol broker, with its memory storage): started in a new namespace with
//! only its loopback up ([`in_own_network_namespace`]), nothing outside it can reach its port;
//! and the one way in, outbox-lab's ([`Dialer`]: a thread of ours that entered the namespace
//! and opens TCP connections there). Linux only, and root only: making a namespace and
//! entering another's take CAP_SYS_ADMIN.

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::mpsc;

use anyhow::{bail, Context, Result};
use nix::unistd::User;
use tokio::sync::oneshot;

/// Whether this process may make and enter network namespaces (it runs as root).
pub fn available() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Makes `cmd` start in a network namespace of its own, its loopback up, as `user` when given
/// (its privileges dropped after the namespace is made: making one takes root). Replaces what
/// [`as_server_user`](super::server::as_server_user) would set of the user, which std applies
/// before this hook runs.
pub fn in_own_network_namespace(cmd: &mut Command, user: Option<&User>) {
    let ids = user.map(|user| (user.uid.as_raw(), user.gid.as_raw()));
    // SAFETY: between fork and exec only async-signal-safe calls are made (unshare, socket,
    // ioctl, close, setgroups, setgid, setuid), on nothing allocated here.
    unsafe {
        cmd.pre_exec(move || {
            if libc::unshare(libc::CLONE_NEWNET) != 0 {
                return Err(io::Error::last_os_error());
            }
            loopback_up()?;
            if let Some((uid, gid)) = ids {
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(gid) != 0
                    || libc::setuid(uid) != 0
                {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

/// Brings `lo` up in this process' (new) network namespace: without it 127.0.0.1 is unreachable
/// there too. Async-signal-safe (see [`in_own_network_namespace`]).
fn loopback_up() -> io::Result<()> {
    // SAFETY: a zeroed ifreq is a valid one; the socket is closed on every path.
    unsafe {
        let socket = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if socket < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut request: libc::ifreq = std::mem::zeroed();
        request.ifr_name[0] = b'l' as libc::c_char;
        request.ifr_name[1] = b'o' as libc::c_char;
        let result = if libc::ioctl(socket, libc::SIOCGIFFLAGS, &mut request) == 0 {
            request.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            libc::ioctl(socket, libc::SIOCSIFFLAGS, &request)
        } else {
            -1
        };
        let error = io::Error::last_os_error();
        libc::close(socket);
        if result != 0 {
            return Err(error);
        }
    }
    Ok(())
}

type Request = (SocketAddr, oneshot::Sender<io::Result<TcpStream>>);

/// Opens TCP connections inside another process' network namespace: a thread of ours entered
/// it (`setns`) and makes each connection there, which stays in that namespace wherever it is
/// used. The thread ends with the last clone of the dialer.
#[derive(Clone)]
pub struct Dialer {
    requests: mpsc::Sender<Request>,
}

impl Dialer {
    /// A dialer into the network namespace of process `pid` (which must be running).
    pub fn into_namespace_of(pid: u32) -> Result<Dialer> {
        let path = format!("/proc/{pid}/ns/net");
        let namespace =
            std::fs::File::open(&path).with_context(|| format!("cannot open {path}"))?;
        let (requests, receive) = mpsc::channel::<Request>();
        let (entered, entering) = std::sync::mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name("netns-dialer".into())
            .spawn(move || {
                let result = nix::sched::setns(&namespace, nix::sched::CloneFlags::CLONE_NEWNET);
                let ok = result.is_ok();
                let _ = entered.send(result);
                if !ok {
                    return;
                }
                for (address, reply) in receive {
                    let _ = reply.send(TcpStream::connect(address));
                }
            })
            .context("cannot start the namespace's dialer")?;
        match entering.recv() {
            Ok(Ok(())) => Ok(Dialer { requests }),
            Ok(Err(e)) => bail!("cannot enter the network namespace of process {pid}: {e}"),
            Err(_) => bail!("the namespace's dialer ended at once"),
        }
    }

    /// A connection to `address` inside the namespace.
    pub async fn connect(&self, address: SocketAddr) -> io::Result<tokio::net::TcpStream> {
        let (reply, answer) = oneshot::channel();
        self.requests
            .send((address, reply))
            .map_err(|_| io::Error::other("the namespace's dialer has ended"))?;
        let stream = answer
            .await
            .map_err(|_| io::Error::other("the namespace's dialer has ended"))??;
        stream.set_nonblocking(true)?;
        tokio::net::TcpStream::from_std(stream)
    }
}
