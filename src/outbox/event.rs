//! The event as it travels from a sender (relay or naive app) to the consumer.

use serde::{Deserialize, Serialize};
use tokio_postgres::Row;
use uuid::Uuid;

/// One event on the wire, in the shape of the outbox row it came from. Only `event_id` and
/// `aggregate_id` are required (a relay of the user's may send the outbox row's columns by
/// their own names: `id` for `outbox_id`); unknown fields are ignored.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Event {
    pub event_id: Uuid,
    /// The outbox row's id; absent when the sender wrote no outbox (dual write).
    #[serde(default, alias = "id")]
    pub outbox_id: Option<i64>,
    #[serde(default)]
    pub aggregate_type: String,
    pub aggregate_id: String,
    /// Empty when the sender left it out (`verify` completes it from the outbox).
    #[serde(default)]
    pub event_type: String,
    #[serde(default)]
    pub payload: serde_json::Value,
    /// The fencing token of the claim it was sent under (claim-lease-fenced only): the
    /// consumer refuses it once it accepted a newer claim's delivery for the aggregate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<i64>,
}

impl Event {
    /// From a row with the columns of the relay's fetch query.
    pub fn from_outbox_row(row: &Row) -> Event {
        Event {
            outbox_id: Some(row.get("id")),
            event_id: row.get("event_id"),
            aggregate_type: row.get("aggregate_type"),
            aggregate_id: row.get("aggregate_id"),
            event_type: row.get("event_type"),
            payload: row.get("payload"),
            // Only the fenced claim returns it.
            fence: row.try_get("claim_token").ok(),
        }
    }
}
