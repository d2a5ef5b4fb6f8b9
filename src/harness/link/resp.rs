//! A proxy between the relays and the private Redis, where a nemesis learns of each delivery
//! (`kill:relay:on-delivery@N` with `verify --sink redis`). It listens on Unix sockets of its
//! own in a private directory, one per relay, so that it knows who sent what, and reads RESP
//! both ways: every XADD a relay sends is a delivery, numbered over the run; a watched one is
//! held as it arrives (pause), or once Redis has answered it and before the answer goes back
//! (kill, db-kill-backend), until the nemesis has struck. Replies come in the order of the
//! commands, so the N-th XADD's answer is found by counting them; an XADD inside MULTI is
//! delivered by its EXEC, and is counted there.

use std::collections::VecDeque;
use std::path::PathBuf;

use anyhow::{anyhow, Result};
use std::borrow::Cow;

use nix::unistd::User;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::task::JoinSet;

use super::watch::{DeliveryMoment, DeliveryWatch, RelayWatch};
use crate::harness::run_as;
use crate::harness::throwaway::RunDir;

/// A running Redis proxy; it stops (with every connection through it) and its directory goes
/// when it is dropped.
pub struct RedisProxy {
    dir: RunDir,
    relay_urls: Vec<String>,
    tasks: JoinSet<()>,
}

impl RedisProxy {
    /// Listens for each of `relays` relays on a socket of its own and passes connections on to
    /// the Redis at `upstream_url` (`redis+unix:///path`, as the private Redis listens);
    /// `client` (the user strangers' relays run as) may connect too.
    pub fn start(
        upstream_url: &str,
        watch: DeliveryWatch,
        relays: u32,
        client: Option<&User>,
    ) -> Result<RedisProxy> {
        let upstream =
            PathBuf::from(upstream_url.strip_prefix("redis+unix://").ok_or_else(|| {
                anyhow!("cannot watch deliveries to '{upstream_url}': not redis+unix://")
            })?);
        let dir = RunDir::create("redis-proxy", client)?;
        let mut tasks = JoinSet::new();
        let mut relay_urls = Vec::new();
        for watch in RelayWatch::per_relay(watch, relays) {
            let relay = watch.relay();
            let socket = dir.path().join(format!("relay-{relay}.sock"));
            let listener = UnixListener::bind(&socket)?;
            run_as::let_in(&socket, client)?;
            relay_urls.push(format!("redis+unix://{}", socket.display()));
            let way_in = WayIn {
                upstream: upstream.clone(),
                watch,
            };
            tasks.spawn(accept(listener, way_in));
        }
        Ok(RedisProxy {
            dir,
            relay_urls,
            tasks,
        })
    }

    /// Where relay `index` sends its commands.
    pub fn relay_url(&self, index: u32) -> &str {
        &self.relay_urls[index as usize]
    }
}

impl Drop for RedisProxy {
    fn drop(&mut self) {
        self.tasks.abort_all();
        let _ = std::fs::remove_dir_all(self.dir.path());
    }
}

/// One relay's socket: where it passes on to, and what it watches.
#[derive(Clone)]
struct WayIn {
    upstream: PathBuf,
    /// Its relay, and the XADDs seen so far over every relay.
    watch: RelayWatch,
}

async fn accept(listener: UnixListener, way_in: WayIn) {
    let mut connections = JoinSet::new();
    while let Ok((client, _)) = listener.accept().await {
        while connections.try_join_next().is_some() {}
        let way_in = way_in.clone();
        connections.spawn(async move {
            if let Ok(server) = UnixStream::connect(&way_in.upstream).await {
                pass_on(client, server, &way_in).await;
            }
        });
    }
}

/// The deliveries a reply answers (an XADD's, or an EXEC's of the XADDs it ran), with the
/// commands' bytes for the event ids.
type Answers = Option<(Vec<u32>, Vec<u8>)>;

/// One connection, both ways, until either side closes it.
async fn pass_on(mut client: UnixStream, mut server: UnixStream, way_in: &WayIn) {
    let (mut from_client, mut from_server) = (Vec::new(), Vec::new());
    let mut chunk = [0u8; 16 * 1024];
    let mut reply_chunk = [0u8; 16 * 1024];
    // One entry per command passed on, in order: what its reply answers.
    let mut awaiting: VecDeque<Answers> = VecDeque::new();
    // Inside MULTI: the XADDs queued, delivered by EXEC.
    let mut queued: Option<Vec<Vec<u8>>> = None;
    // A stream that is not RESP (or that we cannot follow) is passed on without watching.
    let mut lost_track = false;
    loop {
        tokio::select! {
            read = client.read(&mut chunk) => {
                let Ok(n @ 1..) = read else { return };
                from_client.extend_from_slice(&chunk[..n]);
                let mut passed = 0;
                while !lost_track {
                    let end = match value_end(&from_client, passed) {
                        Ok(Some(end)) => end,
                        Ok(None) => break,
                        Err(()) => { lost_track = true; break }
                    };
                    let command = &from_client[passed..end];
                    let delivers = match (command_name(command).as_deref(), &mut queued) {
                        (Some("MULTI"), None) => { queued = Some(Vec::new()); None }
                        (Some("EXEC"), Some(_)) => {
                            let xadds = queued.take().unwrap_or_default();
                            let numbers: Vec<u32> =
                                xadds.iter().map(|_| way_in.watch.next_delivery()).collect();
                            Some((numbers, Cow::Owned(xadds.concat())))
                        }
                        (Some("DISCARD"), Some(_)) => { queued = None; None }
                        (Some("XADD"), Some(xadds)) => { xadds.push(command.to_vec()); None }
                        (Some("XADD"), None) => {
                            Some((vec![way_in.watch.next_delivery()], Cow::Borrowed(command)))
                        }
                        _ => None,
                    };
                    if let Some((numbers, bytes)) = &delivers {
                        for &number in numbers {
                            way_in.watch.hold(number, DeliveryMoment::Sent, bytes).await;
                        }
                    }
                    // Its bytes are kept only while a nemesis may still wait for its answer.
                    let answered = |n: &u32| way_in.watch.watches(*n, DeliveryMoment::Answered);
                    let answers = delivers.filter(|(numbers, _)| numbers.iter().any(answered));
                    awaiting.push_back(answers.map(|(numbers, bytes)| {
                        (numbers, bytes.into_owned())
                    }));
                    passed = end;
                }
                if lost_track {
                    passed = from_client.len();
                }
                if server.write_all(&from_client[..passed]).await.is_err() {
                    return;
                }
                from_client.drain(..passed);
            }
            read = server.read(&mut reply_chunk) => {
                let Ok(n @ 1..) = read else { return };
                from_server.extend_from_slice(&reply_chunk[..n]);
                let mut parsed = 0;
                let mut written = 0;
                while !lost_track {
                    let end = match value_end(&from_server, parsed) {
                        Ok(Some(end)) => end,
                        Ok(None) => break,
                        Err(()) => { lost_track = true; break }
                    };
                    // A push (RESP3) answers no command.
                    let push = from_server[parsed] == b'>';
                    if !push {
                        if let Some(Some((numbers, bytes))) = awaiting.pop_front() {
                            // What came before this answer goes back first.
                            if client.write_all(&from_server[written..parsed]).await.is_err() {
                                return;
                            }
                            written = parsed;
                            for number in numbers {
                                way_in.watch.hold(number, DeliveryMoment::Answered, &bytes).await;
                            }
                        }
                    }
                    parsed = end;
                }
                if lost_track {
                    parsed = from_server.len();
                }
                if client.write_all(&from_server[written..parsed]).await.is_err() {
                    return;
                }
                from_server.drain(..parsed);
            }
        }
    }
}

/// The command's name, upper case: the first bulk string of an array, or the first word of an
/// inline command.
fn command_name(command: &[u8]) -> Option<String> {
    let name = match command.first()? {
        b'*' => {
            let header_end = find_crlf(command, 0)?;
            let bulk = header_end + 2;
            (command.get(bulk) == Some(&b'$')).then_some(())?;
            let len_end = find_crlf(command, bulk)?;
            let len: usize = std::str::from_utf8(&command[bulk + 1..len_end])
                .ok()?
                .parse()
                .ok()?;
            command.get(len_end + 2..len_end + 2 + len)?
        }
        _ => command.split(|b| b.is_ascii_whitespace()).next()?,
    };
    Some(String::from_utf8_lossy(name).to_ascii_uppercase())
}

/// Where `\r\n` starts at or after `from`.
fn find_crlf(buf: &[u8], from: usize) -> Option<usize> {
    buf.get(from..)?
        .windows(2)
        .position(|w| w == b"\r\n")
        .map(|i| from + i)
}

/// Where the RESP value (or inline command) starting at `at` ends: `Ok(None)` when it is not
/// all there yet, `Err` when it is not RESP.
fn value_end(buf: &[u8], at: usize) -> Result<Option<usize>, ()> {
    let Some(&kind) = buf.get(at) else {
        return Ok(None);
    };
    let Some(line) = find_crlf(buf, at) else {
        return Ok(None);
    };
    let after_line = line + 2;
    let number = || -> Result<i64, ()> {
        let text = std::str::from_utf8(&buf[at + 1..line]).map_err(drop)?;
        text.parse().map_err(drop)
    };
    match kind {
        b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(' => Ok(Some(after_line)),
        b'$' | b'!' | b'=' => {
            let len = number()?;
            if len < 0 {
                return Ok(Some(after_line));
            }
            let end = after_line + len as usize + 2;
            Ok((buf.len() >= end).then_some(end))
        }
        b'*' | b'~' | b'>' | b'%' | b'|' => {
            let count = number()?;
            let items = match kind {
                b'%' | b'|' => count.max(0) * 2,
                _ => count.max(0),
            };
            let mut end = after_line;
            for _ in 0..items {
                match value_end(buf, end)? {
                    Some(next) => end = next,
                    None => return Ok(None),
                }
            }
            // An attribute comes before the value it describes: they are one reply.
            match kind {
                b'|' => value_end(buf, end),
                _ => Ok(Some(end)),
            }
        }
        // An inline command (a client's): the line itself.
        _ if kind.is_ascii_alphabetic() => Ok(Some(after_line)),
        _ => Err(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Commands and replies are told apart whole, however they are cut; names are found.
    #[test]
    fn resp_values_end_where_they_end() {
        let xadd = b"*5\r\n$4\r\nxadd\r\n$1\r\ns\r\n$1\r\n*\r\n$1\r\nk\r\n$2\r\nv1\r\n";
        assert_eq!(value_end(xadd, 0), Ok(Some(xadd.len())));
        for cut in 0..xadd.len() {
            assert_eq!(value_end(&xadd[..cut], 0), Ok(None), "cut at {cut}");
        }
        assert_eq!(command_name(xadd).as_deref(), Some("XADD"));
        assert_eq!(command_name(b"PING\r\n").as_deref(), Some("PING"));
        let replies =
            b"$15\r\n1700000000000-0\r\n+OK\r\n*2\r\n:1\r\n$-1\r\n|1\r\n+a\r\n+b\r\n:7\r\n";
        let mut ends = Vec::new();
        let mut at = 0;
        while let Ok(Some(end)) = value_end(replies, at) {
            ends.push(end);
            at = end;
        }
        assert_eq!(ends, vec![22, 27, 40, 56]);
        assert_eq!(at, replies.len());
        assert_eq!(value_end(b"?bad\r\n", 0), Err(()));
    }
}
