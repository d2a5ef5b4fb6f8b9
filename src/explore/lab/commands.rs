//! The children of our designs: the writer (spreading its workload over the nemeses' window)
//! and the relays (the design's variant, armed to log every attempt for the checker).

use std::time::Duration;

use super::{Lab, Relays};
use crate::explore::designs::{RelayVariant, Writer};
use crate::explore::schedule::Schedule;
use crate::harness::child::role::{ExploreRelayRole, ExploreWriterRole};
use crate::harness::child::ChildCommand;
use crate::harness::db::Database;
use crate::outbox::relay::{RelayConfig, RelayDesign, RelayOptions};
use crate::outbox::sink::SinkOptions;

/// Relays give up draining after this long and end with an error.
const RELAY_DEADLINE: Duration = Duration::from_secs(20);
/// A failed delivery is retried after 10 ms, 20 ms, 40 ms, ...: quick enough for a consumer that
/// is being restarted, slow enough not to spin.
const RELAY_BACKOFF: Duration = Duration::from_millis(10);
/// High enough that no event becomes a dead letter while a crashed consumer restarts.
const RELAY_MAX_ATTEMPTS: i32 = 20;
/// How often an idle relay polls.
const RELAY_IDLE_POLL: Duration = Duration::from_millis(5);
/// The claim designs' lease: shorter than the pause nemeses' holds, longer than any delivery.
const CLAIM_LEASE: Duration = Duration::from_millis(250);
/// A delivery unanswered this long failed (a lost or delayed reply): short, so that a network
/// nemesis costs a run half a second, not the default five.
const RELAY_REQUEST_TIMEOUT: Duration = Duration::from_millis(500);
/// The writer spreads its workload until this long after the last nemesis on the clock is
/// over: every nemesis strikes while events are being written.
const WRITING_AFTER_NEMESES: Duration = Duration::from_millis(250);

impl Lab<'_> {
    /// The writer, reaching its database at `database` (through its link); a dual write sends
    /// to `sink` itself.
    pub(super) fn writer_command(
        &self,
        database: &Database,
        sink: &str,
        schedule: &Schedule,
    ) -> ChildCommand<ExploreWriterRole> {
        // The relays may drain faster than the nemeses come: the workload is spread until they
        // are over, so that each strikes while events are written and relayed.
        let window = schedule
            .clock_over_at()
            .map_or(Duration::ZERO, |over| over + WRITING_AFTER_NEMESES);
        let role = ExploreWriterRole {
            orders: self.workload.orders,
            events_per_order: self.workload.events_per_order,
            overlap: self.workload.overlap,
            pace: window / self.workload.orders.div_ceil(2).max(1),
            dual_write: match self.design.writer {
                Writer::Outbox => None,
                Writer::DualWrite(order) => Some((order, sink.to_string())),
            },
            insert_sql: match &self.relays {
                Relays::Foreign(foreign) => foreign.insert_sql.clone(),
                Relays::Ours => None,
            },
        };
        ChildCommand::new(database, role)
    }

    /// Relay `index`, reaching its database at `database` (through its link), delivering to
    /// `sink`.
    pub(super) fn relay_command(
        &self,
        database: &Database,
        index: u32,
        sink: &str,
    ) -> ChildCommand<ExploreRelayRole> {
        let variant = self
            .design
            .relay
            .expect("only designs with relays start relays");
        let config = RelayConfig {
            design: match variant {
                RelayVariant::MarkFirst => RelayDesign::MarkBeforeSend,
                RelayVariant::ClaimLease => RelayDesign::Claim,
                RelayVariant::ClaimLeaseFenced => RelayDesign::FencedClaim,
                _ => RelayDesign::Lock,
            },
            lease: CLAIM_LEASE,
            batch: self.design.batch,
            max_attempts: match self.design.poison_without_dead_letter {
                // No dead letter: a row is retried for ever.
                Some(_) => i32::MAX,
                None => RELAY_MAX_ATTEMPTS,
            },
            backoff_base: RELAY_BACKOFF,
            idle_poll: RELAY_IDLE_POLL,
            deadline: RELAY_DEADLINE,
            head_of_line_guard: variant == RelayVariant::Guarded,
            request_timeout: RELAY_REQUEST_TIMEOUT,
            // Every attempt in the log: the history the checker audits.
            log_attempts: true,
            ..RelayConfig::default()
        };
        let relay = RelayOptions {
            name: format!("r{index}"),
            sink: SinkOptions::new(sink),
            config,
            follow: None,
        };
        let role = ExploreRelayRole {
            stored_watermark: variant == RelayVariant::StoredWatermark,
            relay,
        };
        ChildCommand::new(database, role)
    }
}
