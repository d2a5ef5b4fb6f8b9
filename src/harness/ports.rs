//! Ports of 127.0.0.1 for a server that must be told its ports before it binds them (nats-server,
//! RabbitMQ, the lab's consumer, which keeps one across restarts): drawn where nothing listens
//! and no outgoing connection takes one, and a start tried again when one was taken meanwhile.

use anyhow::Result;

/// `N` distinct ports of 127.0.0.1 where nothing listened a moment ago, for a server that must
/// be told its ports (all bound at once, then let go: another process may take one meanwhile,
/// and the server's start then fails: [`on_free_ports`] tries again). Drawn below the kernel's
/// ephemeral range where it leaves room ([`FIRST_PORT`] up): a port there is never the local
/// end of an outgoing connection, which every client on the machine opens by the thousand, so a
/// port kept for a consumer that restarts is not taken while it is down.
pub fn free_ports<const N: usize>() -> Result<[u16; N]> {
    let below_ephemeral = below_ephemeral_ports();
    let mut listeners = Vec::with_capacity(N);
    let mut draws = 0;
    while listeners.len() < N {
        draws += 1;
        let port = match &below_ephemeral {
            Some(range) if draws <= 1000 => {
                let width = u128::from(range.end - range.start);
                range.start + (uuid::Uuid::new_v4().as_u128() % width) as u16
            }
            _ => 0,
        };
        match std::net::TcpListener::bind(("127.0.0.1", port)) {
            Ok(listener) => listeners.push(listener),
            Err(e) if port == 0 => return Err(e.into()),
            Err(_) => {}
        }
    }
    let mut ports = [0; N];
    for (port, listener) in ports.iter_mut().zip(&listeners) {
        *port = listener.local_addr()?.port();
    }
    Ok(ports)
}

/// The lowest port [`free_ports`] draws.
const FIRST_PORT: u16 = 10_000;

/// [`FIRST_PORT`] up to the first port of the kernel's ephemeral range, when that is wide.
fn below_ephemeral_ports() -> Option<std::ops::Range<u16>> {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let first_ephemeral: u16 = range.split_whitespace().next()?.parse().ok()?;
    (first_ephemeral >= FIRST_PORT + 1000).then_some(FIRST_PORT..first_ephemeral)
}

/// A server told its ports is started this many times at most.
const PORT_TRIES: u32 = 3;

/// Starts a server that must be told its `N` ports on free ones ([`free_ports`]), and again on
/// fresh ones when it failed and one of its ports is taken now: probed free, then taken by
/// another process before the server bound it. At most [`PORT_TRIES`] times; the last error.
pub async fn on_free_ports<const N: usize, T>(
    mut start: impl AsyncFnMut([u16; N]) -> Result<T>,
) -> Result<T> {
    let mut tries = 1;
    loop {
        let ports = free_ports::<N>()?;
        match start(ports).await {
            Err(_) if tries < PORT_TRIES && any_taken(&ports) => tries += 1,
            started => return started,
        }
    }
}

/// Whether a process listens on one of `ports` of 127.0.0.1 now.
fn any_taken(ports: &[u16]) -> bool {
    ports
        .iter()
        .any(|&port| std::net::TcpListener::bind(("127.0.0.1", port)).is_err())
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::bail;

    /// A port taken between the probe and the bind: the server is started again on fresh
    /// ports. A start that fails with its ports still free is not tried again.
    #[tokio::test]
    async fn a_port_taken_before_the_bind_is_tried_again_on_fresh_ports() {
        let mut tries = 0;
        let mut squatter = None;
        let started = on_free_ports(async |[port]: [u16; 1]| {
            tries += 1;
            if tries == 1 {
                // Another process takes the port before the server binds it.
                squatter = Some(std::net::TcpListener::bind(("127.0.0.1", port))?);
                bail!("address already in use");
            }
            Ok(port)
        })
        .await
        .unwrap();
        assert_eq!(tries, 2);
        let taken = squatter.unwrap().local_addr().unwrap().port();
        assert_ne!(started, taken);

        let mut tries = 0;
        let failed = on_free_ports(async |_: [u16; 2]| -> Result<()> {
            tries += 1;
            bail!("broken for another reason")
        })
        .await;
        assert!(failed.is_err());
        assert_eq!(tries, 1);
    }

    /// No outgoing connection takes a port it gives: they are below the ephemeral range.
    #[test]
    fn free_ports_are_below_the_ephemeral_range() {
        let range = below_ephemeral_ports().expect("this machine's range leaves room");
        for _ in 0..20 {
            let ports = free_ports::<3>().unwrap();
            assert!(
                ports.iter().all(|p| range.contains(p)),
                "{ports:?} not in {range:?}"
            );
            assert!(ports[0] != ports[1] && ports[1] != ports[2] && ports[0] != ports[2]);
        }
    }
}
