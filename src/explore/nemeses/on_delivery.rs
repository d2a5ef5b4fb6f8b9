//! The nemeses on a delivery (`kill:relay:on-delivery@N`, ...): told by the proxy of each
//! delivery they wait for, they strike the relay that sent it while the proxy holds it, and
//! keep a paused relay from counting as drained until it is let go.

use std::sync::Mutex;
use std::time::Instant;

use anyhow::Result;
use futures_util::stream::{FuturesUnordered, StreamExt};
use nix::sys::signal::Signal;
use tokio::sync::watch;

use super::Arena;
use crate::explore::schedule::{DeliveryStrike, Nemesis, Role, Schedule};
use crate::harness::foreign::relay_name;
use crate::harness::nemesis::terminate_backends;

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
/// the proxy holds the delivery until it is done.
pub(super) async fn strike_on_delivery(
    schedule: &Schedule,
    arena: &Arena<'_>,
    holding: &Holding<'_>,
) -> Result<()> {
    let mut left: Vec<_> = on_delivery(schedule).collect();
    let taken = arena.deliveries.lock().expect("not poisoned").take();
    let (Some(mut deliveries), false) = (taken, left.is_empty()) else {
        return Ok(());
    };
    let mut over = arena.over.clone();
    let mut resumes = FuturesUnordered::new();
    while !left.is_empty() {
        let delivery = tokio::select! {
            Some(delivery) = deliveries.recv() => delivery,
            Some(()) = resumes.next() => continue,
            _ = over.wait_for(|over| *over) => break,
        };
        let Some(k) = left.iter().position(|&(_, strike, number)| {
            number == delivery.number && strike.moment() == delivery.moment
        }) else {
            continue;
        };
        let (i, strike, _) = left.remove(k);
        let Some(index) = delivery.relay else {
            continue; // not a relay's: nothing to strike
        };
        let at = Instant::now();
        let in_flight = delivery.event_ids.clone();
        let fired = |process: String| {
            let process = format!("{process} (delivery {})", delivery.number);
            arena
                .faults
                .struck_in_flight(i, process, at, in_flight.clone());
        };
        match strike {
            DeliveryStrike::Kill => {
                if let Some((label, child)) = arena.live.now(Role::Relay, index) {
                    if child.signal(Signal::SIGKILL) {
                        arena.live.ended(Role::Relay, index, &label);
                        fired(label);
                    }
                }
            }
            DeliveryStrike::Pause(hold) => {
                if let Some((label, child)) = arena.live.now(Role::Relay, index) {
                    if child.signal(Signal::SIGSTOP) {
                        fired(label);
                        holding.change(|(_, held)| *held += 1);
                        resumes.push(async move {
                            child.resume_after(hold).await;
                            holding.change(|(_, held)| *held -= 1);
                        });
                    }
                }
            }
            DeliveryStrike::DbKillBackend => {
                let client = arena.db.connect().await?;
                for sessions in arena.relay_sessions.of(index) {
                    if terminate_backends(&client, &sessions).await? > 0 {
                        let label = arena.live.now(Role::Relay, index).map(|(l, _)| l);
                        let label = label.unwrap_or_else(|| relay_name(index));
                        fired(format!("{label}'s sessions"));
                        break;
                    }
                }
            }
        }
        let _ = delivery.done.send(());
    }
    // Every relay paused is let go before the run goes on.
    while resumes.next().await.is_some() {}
    Ok(())
}
