//! Where a delivery's time goes (notify-latency): on request, the writer and the relay note the
//! moments of each event on this host's clock (microseconds since the epoch), and the scenario
//! reads them back beside the server's own times (the INSERT, the consumer's receipt). The
//! moments are held in memory and printed when the process ends its role ([`print_held`]):
//! printing each as it happens would wake the parent, which reads the output, in the middle of
//! the very delivery being timed. The lines are defined here once, for the processes that print
//! them and the one that reads them:
//!
//! - writer: `committed order=ID at_us=T`, right after its COMMIT returned;
//! - relay: `phase woken at_us=T` when its wait ends, `phase fetched at_us=T` when the rows of
//!   a non-empty fetch are in hand, `phase sending at_us=T ids=1,2` when the batch goes to the
//!   sink.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

/// The lines noted so far, printed by [`print_held`].
static HELD: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// This host's clock, in microseconds since the epoch (the clock PostgreSQL's
/// `clock_timestamp()` reads on the same host).
pub fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

fn hold(line: String) {
    HELD.lock().unwrap_or_else(|e| e.into_inner()).push(line);
}

/// Prints every line noted so far, on stdout (a child does so as its role ends).
pub fn print_held() {
    let held = std::mem::take(&mut *HELD.lock().unwrap_or_else(|e| e.into_inner()));
    for line in held {
        println!("{line}");
    }
}

/// Notes that the writer's COMMIT of an order has just returned.
pub fn committed(order_id: i64) {
    hold(format!("committed order={order_id} at_us={}", now_us()));
}

/// A relay's moment in a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayMoment {
    /// Its wait for work ended (a notification, or the fallback poll).
    Woken,
    /// A fetch returned rows.
    Fetched,
    /// The batch is handed to the sink.
    Sending,
}

impl RelayMoment {
    fn word(self) -> &'static str {
        match self {
            RelayMoment::Woken => "woken",
            RelayMoment::Fetched => "fetched",
            RelayMoment::Sending => "sending",
        }
    }
}

/// Notes a relay's moment (`ids`: the batch's outbox ids, for [`RelayMoment::Sending`]).
pub fn relay_moment(moment: RelayMoment, ids: &[i64]) {
    let at = now_us();
    let word = moment.word();
    if ids.is_empty() {
        hold(format!("phase {word} at_us={at}"));
    } else {
        let ids: Vec<String> = ids.iter().map(i64::to_string).collect();
        hold(format!("phase {word} at_us={at} ids={}", ids.join(",")));
    }
}

/// When the writer's COMMIT of each order returned, by order id, from its output.
pub fn read_committed<'a>(lines: impl Iterator<Item = &'a str>) -> HashMap<i64, i64> {
    lines
        .filter_map(|line| {
            let rest = line.strip_prefix("committed order=")?;
            let (order, at) = rest.split_once(" at_us=")?;
            Some((order.parse().ok()?, at.trim().parse().ok()?))
        })
        .collect()
}

/// A relay's moments for one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelayTimes {
    pub woken_us: i64,
    pub fetched_us: i64,
    pub sending_us: i64,
}

/// The relay's moments of each event it sent, by outbox id, from its output: each `sending`
/// line with the `woken` and `fetched` lines before it. An event sent twice keeps its first.
pub fn read_relay<'a>(lines: impl Iterator<Item = &'a str>) -> HashMap<i64, RelayTimes> {
    let (mut woken_us, mut fetched_us) = (None, None);
    let mut times = HashMap::new();
    for line in lines {
        let Some((word, rest)) = line
            .strip_prefix("phase ")
            .and_then(|phase| phase.split_once(" at_us="))
        else {
            continue;
        };
        let (at, ids) = rest.split_once(" ids=").unwrap_or((rest, ""));
        let Ok(at) = at.trim().parse::<i64>() else {
            continue;
        };
        match word {
            "woken" => woken_us = Some(at),
            "fetched" => fetched_us = Some(at),
            "sending" => {
                let (Some(woken_us), Some(fetched_us)) = (woken_us, fetched_us) else {
                    continue;
                };
                for id in ids.split(',').filter_map(|id| id.trim().parse().ok()) {
                    times.entry(id).or_insert(RelayTimes {
                        woken_us,
                        fetched_us,
                        sending_us: at,
                    });
                }
            }
            _ => {}
        }
    }
    times
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scenario reads the moments back as the writer and the relay note them.
    #[test]
    fn lines_read_back_as_printed() {
        let writer = [
            "committed order=7 at_us=100",
            "noise",
            "committed order=8 at_us=250",
        ];
        let committed = read_committed(writer.into_iter());
        assert_eq!(committed, HashMap::from([(7, 100), (8, 250)]));

        let relay = [
            "phase woken at_us=110",
            "[relay 0] outbox id=1 sending",
            "phase fetched at_us=130",
            "phase sending at_us=131 ids=1,2",
            "phase woken at_us=900",
            "phase woken at_us=1000",
            "phase fetched at_us=1020",
            "phase sending at_us=1021 ids=2,3",
        ];
        let times = read_relay(relay.into_iter());
        assert_eq!(times.len(), 3);
        assert_eq!(
            times[&2],
            RelayTimes {
                woken_us: 110,
                fetched_us: 130,
                sending_us: 131
            }
        );
        assert_eq!(times[&3].woken_us, 1000);
    }
}
