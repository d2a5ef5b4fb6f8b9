//! The claim design: a `claimed_at`/`claimed_by` lease written and committed before delivering,
//! so no transaction stays open while the sink answers; a crashed relay's rows wait for the
//! lease to expire (claim-vs-lock). The fenced claim (explore's claim-lease-fenced) also takes
//! a fencing token with each claim: its events carry it, and its mark counts only where the
//! row still holds it.

use anyhow::Result;
use tokio_postgres::types::ToSql;

use super::polling::Relay;
use super::sql::MARK_FAILED;
use super::{Pass, RelayDesign};

impl Relay {
    /// The lease: claim (committed), deliver outside any transaction, mark what was delivered.
    pub(super) async fn deliver_claimed_batch(&mut self) -> Result<Pass> {
        let lease_ms = self.config.lease.as_secs_f64() * 1000.0;
        let params: [&(dyn ToSql + Sync); 5] = [
            &self.config.max_attempts,
            &self.config.batch,
            &self.claimant,
            &lease_ms,
            &self.config.lease_clock.now(),
        ];
        let mut rows = self.client.query(&self.fetch, &params).await?;
        // UPDATE ... RETURNING has no order; deliver oldest first, as the lock design does.
        rows.sort_by_key(|row| row.get::<_, i64>("id"));
        // A failed row keeps its claim: it is retried once both its backoff and the lease ran out.
        let (outcome, delivered) = self.deliver(&rows, MARK_FAILED).await?;
        if !delivered.is_empty() {
            match self.config.design {
                RelayDesign::FencedClaim => {
                    let token: i64 = rows[0].get("claim_token");
                    self.client
                        .execute(&self.mark, &[&delivered, &token])
                        .await?
                }
                _ => {
                    self.client
                        .execute(&self.mark, &[&delivered, &self.claimant])
                        .await?
                }
            };
        }
        Ok(outcome)
    }
}
