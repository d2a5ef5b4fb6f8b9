//! The writer: the business transaction that creates an order and, done right, its outbox row in
//! the same transaction; done wrong (dual write), sends the event itself.

use anyhow::Result;
use serde_json::json;
use tokio_postgres::{Client, Transaction};
use uuid::Uuid;

use crate::crash::{self, CrashPoint};
use crate::event::Event;
use crate::sink::HttpSink;

pub const INSERT_ORDER: &str =
    "INSERT INTO orders(customer_id, amount) VALUES ($1, 1200) RETURNING id";

pub const INSERT_OUTBOX: &str = "
INSERT INTO outbox(aggregate_type, aggregate_id, event_type, payload)
VALUES ('orders', $1, 'OrderCreated', $2)
RETURNING id, event_id";

/// How the business transaction ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Ending {
    Commit,
    Rollback,
}

/// The order of the two writes in the naive app.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DualWriteOrder {
    /// COMMIT the order, then POST the event.
    CommitFirst,
    /// POST the event, then COMMIT (or roll back) the order.
    SendFirst,
}

/// The event payload of an order, as the article writes it.
pub fn order_payload(order_id: i64) -> serde_json::Value {
    json!({ "order_id": order_id, "amount": "1200" })
}

/// The outbox way: the order and its event in one transaction; nothing is sent here.
pub async fn create_order_with_event(
    client: &mut Client,
    customer_id: i64,
    ending: Ending,
) -> Result<i64> {
    let tx = client.transaction().await?;
    let order_id: i64 = tx.query_one(INSERT_ORDER, &[&customer_id]).await?.get(0);
    tx.execute(
        INSERT_OUTBOX,
        &[&order_id.to_string(), &order_payload(order_id)],
    )
    .await?;
    crash::point(CrashPoint::WriterAfterInsertBeforeCommit);
    end(tx, ending).await?;
    Ok(order_id)
}

async fn end(tx: Transaction<'_>, ending: Ending) -> Result<()> {
    match ending {
        Ending::Commit => tx.commit().await?,
        Ending::Rollback => tx.rollback().await?,
    }
    Ok(())
}

/// The naive app of the article: INSERT the order and POST the event, as two separate writes.
pub async fn dual_write(
    client: &mut Client,
    sink: &HttpSink,
    customer_id: i64,
    event_id: Uuid,
    order: DualWriteOrder,
    ending: Ending,
) -> Result<i64> {
    let tx = client.transaction().await?;
    let order_id: i64 = tx.query_one(INSERT_ORDER, &[&customer_id]).await?.get(0);
    let event = Event {
        event_id,
        outbox_id: None,
        aggregate_type: "orders".into(),
        aggregate_id: order_id.to_string(),
        event_type: "OrderCreated".into(),
        payload: order_payload(order_id),
    };
    match order {
        DualWriteOrder::CommitFirst => {
            end(tx, ending).await?;
            crash::point(CrashPoint::WriterAfterCommitBeforeSend);
            sink.send(&event).await?;
        }
        DualWriteOrder::SendFirst => {
            sink.send(&event).await?;
            crash::point(CrashPoint::WriterAfterSendBeforeCommit);
            end(tx, ending).await?;
        }
    }
    Ok(order_id)
}
