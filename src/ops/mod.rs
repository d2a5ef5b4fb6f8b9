//! Operating an outbox outside the scenarios: the relay and consumer as long-running processes
//! ([`standalone`]) with their [`logging`], and the daily [`partitions`] of `outbox_p` with their
//! guarded cleanup (`outbox-lab prune`).

pub mod logging;
pub mod partitions;
pub mod standalone;
