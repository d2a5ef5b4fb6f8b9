//! Deliveries watched for a nemesis (`kill:relay:on-delivery@N`): which deliveries the
//! nemeses wait for, and how a proxy that sees a delivery pass (the [`http`](super::http) proxy,
//! the [`resp`](super::resp) one) tells them of it and holds it until they have
//! struck, and no longer. A nemesis that cannot strike the N-th delivery (its relay was killed,
//! or has no database session, since it sent it) lets it go on at once and waits for the next
//! one it can strike, as a nemesis on the clock due while its target is between two processes
//! strikes the next process; several waiting at once are each told of every delivery.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

/// A proxy holds a delivery (or a lost reply's connection) this long at most.
pub const HOLD_LIMIT: Duration = Duration::from_secs(60);

/// Where in a delivery's passage a nemesis is told of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryMoment {
    /// It has arrived from the relay and is not passed on yet: it is in flight.
    Sent,
    /// The consumer has applied and committed it and answered; the answer is not passed back
    /// yet: the relay cannot know it was delivered.
    Answered,
}

/// A watched delivery, told to the nemeses; the proxy holds it until `done` is answered (with
/// the delivery number of the nemesis that struck) or dropped (none could strike: it goes on at
/// once, and they wait for the next).
#[derive(Debug)]
pub struct WatchedDelivery {
    /// Its number in the run, from 1, counted over every relay.
    pub number: u32,
    /// The deliveries the nemeses waiting at this moment are armed at (`N` of
    /// `on-delivery@N`): this one, or earlier ones they could not strike; in order.
    pub armed: Vec<u32>,
    pub moment: DeliveryMoment,
    /// The relay that sent it (the port it came through); `None` for any other sender.
    pub relay: Option<u32>,
    /// The event ids seen in it so far (every uuid in its bytes).
    pub event_ids: Vec<String>,
    pub done: oneshot::Sender<u32>,
}

/// How long a delivery was held on its way to the consumer, and what it carried: harness time,
/// which the relay's latency does not count.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Held {
    pub delivery: u32,
    pub held_ms: f64,
    pub event_ids: Vec<String>,
}

/// Which deliveries the nemeses watch, and where they are told.
#[derive(Debug, Clone)]
pub struct DeliveryWatch {
    /// The nemeses not struck yet: their delivery `N` and moment.
    waiting: Arc<Mutex<Vec<(u32, DeliveryMoment)>>>,
    tell: mpsc::UnboundedSender<WatchedDelivery>,
    /// The deliveries held on their way to the consumer (as they were sent).
    held: Arc<Mutex<Vec<Held>>>,
}

impl DeliveryWatch {
    /// Nemeses waiting for `watched` deliveries, told through `tell`.
    pub fn new(
        watched: Vec<(u32, DeliveryMoment)>,
        tell: mpsc::UnboundedSender<WatchedDelivery>,
    ) -> DeliveryWatch {
        DeliveryWatch {
            waiting: Arc::new(Mutex::new(watched)),
            tell,
            held: Arc::default(),
        }
    }

    /// The deliveries the nemeses waiting at `moment` are armed at, if delivery `number` is
    /// one of them or comes after it, earliest first.
    fn armed(&self, number: u32, moment: DeliveryMoment) -> Vec<u32> {
        let waiting = self.waiting.lock().expect("not poisoned");
        let mut armed: Vec<u32> = waiting
            .iter()
            .filter(|(at, m)| *m == moment && *at <= number)
            .map(|(at, _)| *at)
            .collect();
        armed.sort_unstable();
        armed
    }

    /// Whether a nemesis waits for delivery `number` at `moment`.
    pub fn watches(&self, number: u32, moment: DeliveryMoment) -> bool {
        !self.armed(number, moment).is_empty()
    }

    /// Tells the nemeses of delivery `number` at `moment` if they watch it, and holds it while
    /// they strike (at most [`HOLD_LIMIT`]); a delivery no nemesis can strike goes on at once.
    pub async fn hold(
        &self,
        number: u32,
        moment: DeliveryMoment,
        relay: Option<u32>,
        bytes: &[u8],
    ) {
        let armed = self.armed(number, moment);
        if armed.is_empty() {
            return;
        }
        let started = Instant::now();
        let (done, struck) = oneshot::channel();
        let event_ids = uuids_in(bytes);
        let delivery = WatchedDelivery {
            number,
            armed,
            moment,
            relay,
            event_ids: event_ids.clone(),
            done,
        };
        if self.tell.send(delivery).is_ok() {
            if let Ok(Ok(armed_at)) = tokio::time::timeout(HOLD_LIMIT, struck).await {
                let mut waiting = self.waiting.lock().expect("not poisoned");
                waiting.retain(|&watched| watched != (armed_at, moment));
            }
        }
        if moment == DeliveryMoment::Sent {
            let held_ms = started.elapsed().as_secs_f64() * 1000.0;
            let mut held = self.held.lock().expect("not poisoned");
            held.push(Held {
                delivery: number,
                held_ms,
                event_ids,
            });
        }
    }

    /// The deliveries held on their way to the consumer so far.
    pub fn held(&self) -> Vec<Held> {
        self.held.lock().expect("not poisoned").clone()
    }
}

/// What a proxy's way in for one relay knows of the watch: the relay, and the run's deliveries
/// counted over every relay (an `XADD`, a Produce: each proxy says what a delivery is).
#[derive(Clone)]
pub struct RelayWatch {
    relay: u32,
    watch: Arc<DeliveryWatch>,
    /// Deliveries seen so far, over every relay.
    deliveries: Arc<std::sync::atomic::AtomicU32>,
}

impl RelayWatch {
    /// One per relay, `0..relays`, sharing `watch` and one count of the deliveries.
    pub fn per_relay(watch: DeliveryWatch, relays: u32) -> Vec<RelayWatch> {
        let watch = Arc::new(watch);
        let deliveries = Arc::default();
        (0..relays)
            .map(|relay| RelayWatch {
                relay,
                watch: watch.clone(),
                deliveries: Arc::clone(&deliveries),
            })
            .collect()
    }

    pub fn relay(&self) -> u32 {
        self.relay
    }

    /// The next delivery's number in the run, from 1.
    pub fn next_delivery(&self) -> u32 {
        self.deliveries
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            + 1
    }

    /// Whether a nemesis waits for delivery `number` at `moment`.
    pub fn watches(&self, number: u32, moment: DeliveryMoment) -> bool {
        self.watch.watches(number, moment)
    }

    /// [`DeliveryWatch::hold`] for this relay's delivery `number`.
    pub async fn hold(&self, number: u32, moment: DeliveryMoment, bytes: &[u8]) {
        self.watch
            .hold(number, moment, Some(self.relay), bytes)
            .await;
    }
}

/// Every uuid written in `bytes` (as text: 8-4-4-4-12 hex digits), in order, once each.
pub fn uuids_in(bytes: &[u8]) -> Vec<String> {
    const TEXT_LEN: usize = 36;
    let is_hex = |b: &u8| b.is_ascii_hexdigit();
    let mut found: Vec<String> = Vec::new();
    let mut i = 0;
    while i + TEXT_LEN <= bytes.len() {
        // Not a piece of a longer run of hex digits and dashes.
        let bounded = (i == 0 || !is_hex(&bytes[i - 1]))
            && bytes
                .get(i + TEXT_LEN)
                .is_none_or(|b| !is_hex(b) && *b != b'-');
        // A 36-byte slice parses only in the hyphenated form.
        match uuid::Uuid::try_parse_ascii(&bytes[i..i + TEXT_LEN]) {
            Ok(id) if bounded => {
                let id = id.to_string();
                if !found.contains(&id) {
                    found.push(id);
                }
                i += TEXT_LEN;
            }
            _ => i += 1,
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The event ids a nemesis is told of: every uuid in a request, once, and nothing that
    /// only looks like part of one.
    #[test]
    fn uuids_are_found_in_a_request() {
        let a = "f59c3291-6609-4aa2-8fa0-a65c4876af75";
        let b = "4AAE9ED1-26C6-455A-9141-70E5AC065D64";
        // Only inside longer runs of hex digits and dashes: not ids.
        let c = "0c0ffee0-1111-4222-8333-944445555666";
        let d = "0d0ffee0-1111-4222-8333-944445555666";
        let body = format!(
            "POST /events HTTP/1.1\r\n\r\n[{{\"event_id\":\"{a}\"}},{{\"event_id\":\"{b}\"}},\
             {{\"event_id\":\"{a}\"}},\"0{a}\",\"{}\",\"7{c}\",\"{d}-9\"]",
            &a[..35]
        );
        assert_eq!(
            uuids_in(body.as_bytes()),
            vec![a.to_string(), b.to_lowercase()]
        );
    }
}
