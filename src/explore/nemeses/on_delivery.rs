//! The nemeses on a delivery (`kill:relay:on-delivery@N`, ...): told by the proxy of each
//! delivery they wait for, they strike the relay that sent it while the proxy holds it, and
//! keep a paused relay from counting as drained until it is let go.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

use anyhow::Result;
use futures_util::stream::{FuturesUnordered, StreamExt};
use nix::sys::signal::Signal;
use tokio::sync::{mpsc, watch};

use super::Arena;
use crate::connect;
use crate::explore::schedule::{DeliveryStrike, Nemesis, Role, Schedule};
use crate::harness::foreign::relay_name;
use crate::harness::link::watch::WatchedDelivery;
use crate::harness::nemesis::{terminate_backends, Sessions};

/// The schedule's nemeses on a delivery: their index, what they do, on which delivery.
pub(super) fn on_delivery(
    schedule: &Schedule,
) -> impl Iterator<Item = (usize, DeliveryStrike, u32)> + '_ {
    schedule
        .nemeses
        .iter()
        .enumerate()
        .filter_map(|(i, n)| match *n {
            Nemesis::OnDelivery {
                strike,
                on_delivery,
            } => Some((i, strike, on_delivery)),
            _ => None,
        })
}

/// What keeps a relay of the user's from counting as drained: timed nemeses still to strike,
/// relays held paused by a nemesis on a delivery.
pub(super) struct Holding<'a> {
    /// (timed nemeses left, relays held)
    pub(super) state: Mutex<(bool, u32)>,
    pub(super) done: &'a watch::Sender<bool>,
}

impl Holding<'_> {
    pub(super) fn change(&self, change: impl FnOnce(&mut (bool, u32))) {
        let mut state = self.state.lock().expect("not poisoned");
        change(&mut state);
        self.done.send_replace(*state == (false, 0));
    }
}

/// Strikes the nemeses on a delivery as the proxy tells of each, on the relay that sent it;
/// the proxy holds the delivery while they strike, and lets it go on at once when none can.
pub(super) async fn strike_on_delivery(
    schedule: &Schedule,
    arena: &Arena<'_>,
    mut deliveries: mpsc::UnboundedReceiver<WatchedDelivery>,
    holding: &Holding<'_>,
) -> Result<()> {
    let mut left: Vec<_> = on_delivery(schedule).collect();
    // Why each nemesis could not strike the last delivery it was told of.
    let mut missed: BTreeMap<usize, String> = BTreeMap::new();
    let mut over = arena.over.clone();
    let mut resumes = FuturesUnordered::new();
    while !left.is_empty() {
        let delivery = tokio::select! {
            Some(delivery) = deliveries.recv() => delivery,
            Some(()) = resumes.next() => continue,
            _ = over.wait_for(|over| *over) => break,
        };
        // Not a relay's: dropped unanswered, it goes on, and the nemeses wait for the next.
        let Some(index) = delivery.relay else {
            continue;
        };
        // Each nemesis waiting for this delivery (or an earlier one), earliest first, until one
        // strikes; those struck meanwhile through another delivery are no longer in `left`.
        for &armed_at in &delivery.armed {
            let Some(k) = left.iter().position(|&(_, strike, number)| {
                number == armed_at && strike.moment() == delivery.moment
            }) else {
                continue;
            };
            let (i, strike, _) = left[k];
            let at = Instant::now();
            let struck = match strike {
                DeliveryStrike::Kill => arena
                    .live
                    .now(Role::Relay, index)
                    .filter(|(label, child)| {
                        let killed = child.signal(Signal::SIGKILL);
                        if killed {
                            arena.live.ended(Role::Relay, index, label);
                        }
                        killed
                    })
                    .map(|(label, _)| label),
                DeliveryStrike::Pause(hold) => {
                    let paused = arena.live.now(Role::Relay, index);
                    let paused = paused.filter(|(_, child)| child.signal(Signal::SIGSTOP));
                    paused.map(|(label, child)| {
                        holding.change(|(_, held)| *held += 1);
                        resumes.push(async move {
                            child.resume_after(hold).await;
                            holding.change(|(_, held)| *held -= 1);
                        });
                        label
                    })
                }
                DeliveryStrike::DbKillBackend => {
                    let ended = end_sessions(arena, index).await?;
                    ended.then(|| {
                        let label = arena.live.now(Role::Relay, index).map(|(l, _)| l);
                        let label = label.unwrap_or_else(|| relay_name(index));
                        format!("{label}'s sessions")
                    })
                }
            };
            let Some(label) = struck else {
                let why = match strike {
                    DeliveryStrike::DbKillBackend => "had no database session",
                    DeliveryStrike::Kill | DeliveryStrike::Pause(_) => "was not running",
                };
                let relay = relay_name(index);
                missed.insert(i, format!("delivery {}: {relay} {why}", delivery.number));
                continue;
            };
            let process = format!("{label} (delivery {})", delivery.number);
            let in_flight = delivery.event_ids.clone();
            arena.faults.struck_in_flight(i, process, at, in_flight);
            left.remove(k);
            let _ = delivery.done.send(armed_at);
            break;
        }
    }
    for (i, _, number) in left {
        let why = match missed.remove(&i) {
            Some(last) => format!("no delivery it could strike; the last, {last}"),
            None => format!("no delivery {number} or later came"),
        };
        arena.faults.not_reached(i, why);
    }
    // Every relay paused is let go before the run goes on.
    while resumes.next().await.is_some() {}
    Ok(())
}

/// Ends relay `index`'s database sessions, the backends its link serves now; whether it had
/// any. None (reconnecting), or a database that cannot be reached now (restarting), ends none.
async fn end_sessions(arena: &Arena<'_>, index: u32) -> Result<bool> {
    let backends = arena.links.relay(index).backends();
    if backends.is_empty() {
        return Ok(false);
    }
    let Ok(client) = arena.db.connect().await else {
        return Ok(false);
    };
    match terminate_backends(&client, &Sessions::Backends(backends)).await {
        Ok(ended) => Ok(ended > 0),
        Err(e) if connect::lost_connection(&e) => Ok(false),
        Err(e) => Err(e),
    }
}
