//! The designs explore runs: each a writer, a relay variant (and how many relays), a consumer
//! kind, the crash points on its path, the invariants it claims, and (for the deliberately broken
//! ones) the flaw the checker is expected to catch.

use crate::outbox::consumer::ConsumerKind;
use crate::outbox::crash::CrashPoint;
use crate::outbox::writer::DualWriteOrder;

/// The invariants are the judge's words, defined once.
pub use crate::judge::invariants::Invariant;

/// How the business side writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writer {
    /// Order and outbox rows in one transaction (two overlapping sessions).
    Outbox,
    /// The naive app: the order in the database, the event POSTed by the app itself.
    DualWrite(DualWriteOrder),
}

/// Which relay delivers the outbox.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
pub enum RelayVariant {
    /// The article's relay: lock, send, mark, commit.
    Lock,
    /// The article's relay with the head-of-line guard in its fetch.
    Guarded,
    /// Broken: marks the batch published and commits before sending.
    MarkFirst,
    /// Broken: `id > last_seen`, watermark stored in a table.
    StoredWatermark,
    /// Broken: a `claimed_at` lease and no fencing token: a relay paused past its lease still
    /// delivers what another relay re-claimed.
    ClaimLease,
    /// The lease with a fencing token, checked by the mark and by the consumer.
    ClaimLeaseFenced,
}

/// One combination the harness can run.
#[derive(Debug)]
pub struct Design {
    pub name: &'static str,
    pub summary: &'static str,
    pub writer: Writer,
    /// `None` for the dual writes: the app sends itself.
    pub relay: Option<RelayVariant>,
    /// Relays running at once (unpartitioned: they compete for rows with SKIP LOCKED).
    pub relays: u32,
    /// Rows per fetch.
    pub batch: i64,
    pub consumer: ConsumerKind,
    /// What the design guarantees; a violation of one of these fails the run (exit 1).
    pub claims: &'static [Invariant],
    /// The violation a deliberately broken design exists to show; not claimed. explore fails
    /// (exit 1) when a flaw is not shown: the checker would be blind to it.
    pub flaws: &'static [Invariant],
    /// A poison event: the outbox row the consumer rejects on every delivery, with no dead
    /// letter (the relay retries it forever). Stuck without any crash, such a design runs only
    /// the schedule without faults, since every run of it lasts the liveness bound.
    pub poison_without_dead_letter: Option<i64>,
}

use Invariant::{Duplicate, Ghost, Liveness, Lost, Order};

/// Every design, correct ones first.
pub const DESIGNS: [Design; 11] = [
    Design {
        name: "dual-write-commit-first",
        summary: "naive app: COMMIT the order, then POST the event",
        writer: Writer::DualWrite(DualWriteOrder::CommitFirst),
        relay: None,
        relays: 0,
        batch: 1,
        consumer: ConsumerKind::Naive,
        // One event per order: nothing the consumer could receive out of order.
        claims: &[Ghost, Duplicate, Liveness],
        flaws: &[Lost],
        poison_without_dead_letter: None,
    },
    Design {
        name: "dual-write-send-first",
        summary: "naive app: POST the event, then COMMIT the order",
        writer: Writer::DualWrite(DualWriteOrder::SendFirst),
        relay: None,
        relays: 0,
        batch: 1,
        consumer: ConsumerKind::Naive,
        claims: &[Lost, Duplicate, Liveness],
        flaws: &[Ghost],
        poison_without_dead_letter: None,
    },
    Design {
        name: "outbox-naive",
        summary: "outbox, the article's relay, naive consumer",
        writer: Writer::Outbox,
        relay: Some(RelayVariant::Lock),
        relays: 1,
        batch: 100,
        consumer: ConsumerKind::Naive,
        claims: &[Ghost, Lost, Liveness],
        flaws: &[Duplicate],
        poison_without_dead_letter: None,
    },
    Design {
        name: "outbox-idempotent",
        summary: "outbox, the article's relay, idempotent consumer",
        writer: Writer::Outbox,
        relay: Some(RelayVariant::Lock),
        relays: 1,
        batch: 100,
        consumer: ConsumerKind::Idempotent,
        claims: &[Ghost, Lost, Duplicate, Liveness],
        flaws: &[],
        poison_without_dead_letter: None,
    },
    Design {
        name: "outbox-idempotent-ordered",
        summary: "outbox, one relay with the head-of-line guard, idempotent consumer",
        writer: Writer::Outbox,
        relay: Some(RelayVariant::Guarded),
        relays: 1,
        batch: 100,
        consumer: ConsumerKind::Idempotent,
        claims: &[Ghost, Lost, Duplicate, Order, Liveness],
        flaws: &[],
        poison_without_dead_letter: None,
    },
    Design {
        name: "watermark-relay",
        summary: "broken: relay fetches id > stored watermark, idempotent consumer",
        writer: Writer::Outbox,
        relay: Some(RelayVariant::StoredWatermark),
        relays: 1,
        batch: 100,
        consumer: ConsumerKind::Idempotent,
        claims: &[Ghost, Duplicate, Order, Liveness],
        flaws: &[Lost],
        poison_without_dead_letter: None,
    },
    Design {
        name: "mark-before-send",
        summary: "broken: relay commits published_at, then sends, idempotent consumer",
        writer: Writer::Outbox,
        relay: Some(RelayVariant::MarkFirst),
        relays: 1,
        batch: 100,
        consumer: ConsumerKind::Idempotent,
        claims: &[Ghost, Duplicate, Order, Liveness],
        flaws: &[Lost],
        poison_without_dead_letter: None,
    },
    Design {
        name: "multi-relay-unpartitioned",
        summary: "broken: three article relays share the outbox, batch 1, idempotent consumer",
        writer: Writer::Outbox,
        relay: Some(RelayVariant::Lock),
        relays: 3,
        batch: 1,
        consumer: ConsumerKind::Idempotent,
        claims: &[Ghost, Lost, Duplicate, Liveness],
        flaws: &[Order],
        poison_without_dead_letter: None,
    },
    Design {
        name: "guarded-no-dead-letter",
        summary: "broken: the head-of-line guard, a poison event, no dead letter",
        writer: Writer::Outbox,
        relay: Some(RelayVariant::Guarded),
        relays: 1,
        batch: 100,
        consumer: ConsumerKind::Idempotent,
        claims: &[Ghost, Lost, Duplicate, Order],
        flaws: &[Liveness],
        // Order 1's first event: its second waits behind it forever.
        poison_without_dead_letter: Some(1),
    },
    Design {
        name: "claim-lease",
        summary: "broken: two relays under a claimed_at lease, no fencing token, naive consumer",
        writer: Writer::Outbox,
        relay: Some(RelayVariant::ClaimLease),
        relays: 2,
        batch: 100,
        consumer: ConsumerKind::Naive,
        claims: &[Ghost, Lost, Liveness],
        flaws: &[Duplicate],
        poison_without_dead_letter: None,
    },
    Design {
        name: "claim-lease-fenced",
        summary: "two relays under a lease with a fencing token (mark and consumer check it), \
                  naive consumer",
        writer: Writer::Outbox,
        relay: Some(RelayVariant::ClaimLeaseFenced),
        relays: 2,
        batch: 100,
        consumer: ConsumerKind::Naive,
        claims: &[Ghost, Lost, Liveness],
        flaws: &[],
        poison_without_dead_letter: None,
    },
];

impl Design {
    pub fn find(name: &str) -> Result<&'static Design, String> {
        DESIGNS.iter().find(|d| d.name == name).ok_or_else(|| {
            let known: Vec<&str> = DESIGNS.iter().map(|d| d.name).collect();
            format!("unknown design '{name}'; known: {}", known.join(", "))
        })
    }

    /// Its position in [`DESIGNS`]: a stable number for seeding its random schedules.
    pub fn index(&self) -> u64 {
        DESIGNS
            .iter()
            .position(|d| d.name == self.name)
            .expect("designs come from DESIGNS") as u64
    }

    pub fn claims(&self, invariant: Invariant) -> bool {
        self.claims.contains(&invariant)
    }

    /// The crash points its processes pass: the only ones a schedule may name for it (none for
    /// a design with a poison event, which is stuck without them).
    pub fn crash_points(&self) -> Vec<CrashPoint> {
        if self.poison_without_dead_letter.is_some() {
            return Vec::new();
        }
        let mut points = match self.writer {
            Writer::Outbox => vec![CrashPoint::WriterAfterInsertBeforeCommit],
            Writer::DualWrite(DualWriteOrder::CommitFirst) => {
                vec![CrashPoint::WriterAfterCommitBeforeSend]
            }
            Writer::DualWrite(DualWriteOrder::SendFirst) => {
                vec![CrashPoint::WriterAfterSendBeforeCommit]
            }
        };
        points.extend_from_slice(match self.relay {
            None => &[],
            Some(RelayVariant::Lock | RelayVariant::Guarded) => &[
                CrashPoint::RelayAfterFetchBeforeSend,
                CrashPoint::RelayAfterSendBeforeMark,
                CrashPoint::RelayAfterMarkBeforeCommit,
            ],
            Some(RelayVariant::MarkFirst) => &[
                CrashPoint::RelayAfterMarkBeforeCommit,
                CrashPoint::RelayAfterMarkBeforeSend,
            ],
            Some(RelayVariant::ClaimLease | RelayVariant::ClaimLeaseFenced) => &[
                CrashPoint::RelayAfterFetchBeforeSend,
                CrashPoint::RelayAfterSendBeforeMark,
            ],
            Some(RelayVariant::StoredWatermark) => &[
                CrashPoint::RelayAfterFetchBeforeSend,
                CrashPoint::RelayAfterSendBeforeMark,
            ],
        });
        points.extend([
            CrashPoint::ConsumerAfterEffectBeforeCommit,
            CrashPoint::ConsumerAfterCommitBeforeReply,
        ]);
        points
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// explore's self-test needs, for every invariant, a design built to break it; and no design
    /// both claims and exists to break the same invariant.
    #[test]
    fn every_invariant_is_some_designs_flaw() {
        for invariant in Invariant::ALL {
            assert!(
                DESIGNS.iter().any(|d| d.flaws.contains(&invariant)),
                "no design breaks {invariant}: the checker could be blind to it"
            );
        }
        for design in &DESIGNS {
            assert!(
                design.flaws.iter().all(|f| !design.claims(*f)),
                "{} claims its own flaw",
                design.name
            );
        }
    }
}
