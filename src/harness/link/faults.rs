//! What the delivery proxies ([`http`](super::http), [`kafka_proxy`](super::kafka_proxy)) do to
//! a relay's requests, as real networks do, and what they record of it: the faults planned by
//! request number (`reset@2`, `reply-lost@3`, `delay@4+2s`), the sink's outage (`net:down`), and
//! when each planned fault struck, for the history of a run; and how a connection ends under
//! them (reset, or kept silent after a lost reply). Each proxy says what a request is (an HTTP
//! request, a Kafka Produce).

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use super::watch::{DeliveryWatch, HOLD_LIMIT};
use crate::harness::nemesis::{format_duration, parse_duration, parse_ordinal};

/// What the proxy does to one request. The names are stable, like crash points'.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetworkFault {
    /// The connection is reset as the request arrives: it never reaches the consumer.
    Reset,
    /// The request reaches the consumer, which acts and commits; its reply is swallowed and the
    /// connection kept silent, so the relay only learns of it from its request timeout.
    ReplyLost,
    /// The request is held this long before it is passed on (longer than the sender's request
    /// timeout: it arrives after the sender gave up on it).
    Delay(Duration),
    /// The request is refused with an answer the sender should retry, and never passed on:
    /// HTTP 503; for a Kafka Produce NOT_LEADER_OR_FOLLOWER on every partition, as when a
    /// partition's leadership moves (the producer retries it, after the requests behind it).
    Refuse,
}

impl NetworkFault {
    pub fn name(self) -> &'static str {
        match self {
            NetworkFault::Reset => "reset",
            NetworkFault::ReplyLost => "reply-lost",
            NetworkFault::Delay(_) => "delay",
            NetworkFault::Refuse => "refuse",
        }
    }
}

/// `NAME@N` (`delay@N+FOR`): the fault hits the N-th request through the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(try_from = "String")]
pub struct FaultPlan {
    pub fault: NetworkFault,
    pub on_request: u32,
}

impl fmt::Display for FaultPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.fault.name(), self.on_request)?;
        match self.fault {
            NetworkFault::Delay(held) => write!(f, "+{}", format_duration(held)),
            _ => Ok(()),
        }
    }
}

impl FromStr for FaultPlan {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (name, number) = s
            .split_once('@')
            .ok_or_else(|| format!("'{s}' is not a network fault NAME@REQUEST"))?;
        let (number, held) = match number.split_once('+') {
            Some((number, held)) => (number, Some(held)),
            None => (number, None),
        };
        let fault = match (name, held) {
            ("reset", None) => NetworkFault::Reset,
            ("reply-lost", None) => NetworkFault::ReplyLost,
            ("refuse", None) => NetworkFault::Refuse,
            ("delay", Some(held)) => NetworkFault::Delay(parse_duration(held)?),
            ("delay", None) => return Err(format!("'{s}' needs how long: delay@REQUEST+FOR")),
            ("reset" | "reply-lost" | "refuse", Some(_)) => {
                return Err(format!("'{s}': only delay takes +FOR"))
            }
            _ => {
                return Err(format!(
                    "unknown network fault '{name}' (reset, reply-lost, delay, refuse)"
                ))
            }
        };
        let on_request = parse_ordinal(number, s, "request number")?;
        Ok(FaultPlan { fault, on_request })
    }
}

impl TryFrom<String> for FaultPlan {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

/// Everything the proxy does to the traffic.
#[derive(Debug, Clone, Default)]
pub struct ProxyFaults {
    /// Every request waits this long before it is passed on.
    pub latency: Duration,
    pub plans: Vec<FaultPlan>,
    /// The deliveries nemeses strike on.
    pub watch: Option<DeliveryWatch>,
    /// Set while the sink is down (`net:down@T+FOR`, a nemesis on the clock): every new
    /// connection and every request is reset.
    pub down: Arc<AtomicBool>,
}

impl ProxyFaults {
    /// The fault planned for request `number`, if any.
    pub fn on_request(&self, number: u32) -> Option<NetworkFault> {
        self.plans
            .iter()
            .find(|plan| plan.on_request == number)
            .map(|plan| plan.fault)
    }
}

/// What went through a proxy: requests, the faults that struck, and when.
#[derive(Debug, Default)]
struct Counters {
    requests: AtomicU32,
    resets: AtomicU32,
    replies_lost: AtomicU32,
    /// When each planned fault struck, by request number.
    struck: Mutex<BTreeMap<u32, Instant>>,
}

/// What the proxy counted, for the report.
#[derive(Debug, Clone, Copy)]
pub struct ProxyCounts {
    pub requests: u32,
    pub resets: u32,
    pub replies_lost: u32,
}

/// A proxy's record of its requests and faults, shared by its connections (cheap to clone).
#[derive(Debug, Clone, Default)]
pub struct FaultRecord(Arc<Counters>);

impl FaultRecord {
    /// A request arrives: its number through the proxy, from 1.
    pub fn request(&self) -> u32 {
        self.0.requests.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// A connection or request was reset (a planned reset, or the sink down).
    pub fn reset(&self) {
        self.0.resets.fetch_add(1, Ordering::SeqCst);
    }

    /// A reply was swallowed.
    pub fn reply_lost(&self) {
        self.0.replies_lost.fetch_add(1, Ordering::SeqCst);
    }

    /// The fault planned for request `number` strikes now.
    pub fn struck(&self, number: u32) {
        let mut struck = self.0.struck.lock().expect("not poisoned");
        struck.insert(number, Instant::now());
    }

    /// When the fault planned for request `on_request` struck (`None`: not reached).
    pub fn struck_at(&self, on_request: u32) -> Option<Instant> {
        let struck = self.0.struck.lock().expect("not poisoned");
        struck.get(&on_request).copied()
    }

    /// Whether a planned fault has struck yet.
    pub fn struck_any(&self) -> bool {
        !self.0.struck.lock().expect("not poisoned").is_empty()
    }

    pub fn counts(&self) -> ProxyCounts {
        ProxyCounts {
            requests: self.0.requests.load(Ordering::SeqCst),
            resets: self.0.resets.load(Ordering::SeqCst),
            replies_lost: self.0.replies_lost.load(Ordering::SeqCst),
        }
    }
}

/// How a proxied connection ended.
pub enum Ending {
    /// Either side closed it (or failed, or sent what the proxy does not understand): both are
    /// closed.
    Closed,
    /// A planned reset, or the sink down: the relay's side is reset.
    Reset,
    /// A reply was lost: the relay's side is kept silent until the relay gives up.
    Silent,
}

/// Each connection `listener` accepts, in a task of its own, until the listener's task is
/// dropped: passed on by `proxy` (which connects on, and gives the relay's side back with how
/// it ended), or, while the sink is down (`faults.down`), reset as it arrives.
pub async fn accept<F>(
    listener: TcpListener,
    faults: &ProxyFaults,
    record: &FaultRecord,
    proxy: impl Fn(TcpStream) -> F,
) where
    F: Future<Output = (TcpStream, Ending)> + Send + 'static,
{
    let mut connections = JoinSet::new();
    while let Ok((client, _)) = listener.accept().await {
        if faults.down.load(Ordering::SeqCst) {
            // The sink is down: the relay reads "connection reset by peer".
            record.reset();
            let _ = client.set_zero_linger();
            continue;
        }
        // Finished connections are reaped as new ones come, so the set stays small.
        while connections.try_join_next().is_some() {}
        let proxied = proxy(client);
        connections.spawn(async move {
            let (client, ending) = proxied.await;
            end(client, ending).await;
        });
    }
}

/// The relay's side of a connection, left as `ending` says.
async fn end(mut client: TcpStream, ending: Ending) {
    match ending {
        Ending::Closed => {}
        Ending::Reset => {
            // SO_LINGER 0 makes the close an RST: the relay reads "connection reset by peer".
            let _ = client.set_zero_linger();
        }
        Ending::Silent => {
            // What the relay sends on is read and dropped, until it closes the connection.
            let mut discard = [0u8; 4096];
            let _ = tokio::time::timeout(HOLD_LIMIT, async {
                while matches!(client.read(&mut discard).await, Ok(n) if n > 0) {}
            })
            .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fault plans parse back from their names, and a typo is an error.
    #[test]
    fn plans_round_trip_and_typos_are_rejected() {
        for fault in [
            NetworkFault::Reset,
            NetworkFault::ReplyLost,
            NetworkFault::Delay(Duration::from_millis(300)),
            NetworkFault::Refuse,
        ] {
            let plan = FaultPlan {
                fault,
                on_request: 3,
            };
            assert_eq!(plan.to_string().parse::<FaultPlan>(), Ok(plan));
        }
        assert!("reply-lost".parse::<FaultPlan>().is_err());
        assert!("reply-lots@2".parse::<FaultPlan>().is_err());
        assert!("reset@0".parse::<FaultPlan>().is_err());
        assert!("delay@2".parse::<FaultPlan>().is_err());
        assert!("reset@2+1s".parse::<FaultPlan>().is_err());
        assert!("refuse@2+1s".parse::<FaultPlan>().is_err());
    }
}
