//! The consumer: an HTTP server (hyper) that turns each event into a shipment instruction.
//! `POST /events` (or any path) carries one event (the article's relay) or a JSON array of them (a batch per
//! request, applied in one transaction: one commit for the whole batch, each event applied as
//! its kind says).
//!
//! *Naive*: one shipment per delivery. *Idempotent*: records the event id in
//! `consumer.processed_events` in the same transaction as the shipment, and answers 200 to a
//! duplicate without shipping again. Every delivery is written to `consumer.receipts` in the
//! transaction of its side effect, so scenarios count deliveries from the database. Faults are
//! injected here on request: answer 500 to the next N requests, to the first delivery of one
//! outbox row, or to every delivery of one (a poison event) — those requests are logged as
//! receipts with `injected_fault` — or wait before answering (a slow sink). An event sent under
//! a fencing token (claim-lease-fenced) is refused (409) once a delivery under a newer token
//! was accepted for its aggregate.

use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use deadpool_postgres::{ClientWrapper, Manager, ManagerConfig, Pool, RecyclingMethod};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_postgres::types::ToSql;
use tokio_postgres::NoTls;

use crate::outbox::crash::{self, CrashPoint};
use crate::outbox::event::Event;

pub const RECORD_RECEIPT: &str = "
INSERT INTO consumer.receipts(event_id, outbox_id, order_id, event_type, injected_fault,
                              received_at)
VALUES ($1, $2, $3, $4, $5, $6)";

/// The naive consumer's side effect: a shipment for every delivery.
pub const CREATE_SHIPMENT: &str =
    "INSERT INTO consumer.shipments(order_id, event_id) VALUES ($1, $2)";

/// The idempotent consumer's side effect: the article's `INSERT INTO processed_events ... ON
/// CONFLICT DO NOTHING` and, only if that inserted a row (the event's first delivery), the
/// shipment; in one statement, so one round trip. Affects 1 row, or 0 for a duplicate.
pub const SHIP_FIRST_DELIVERY: &str = "
WITH first_delivery AS (
  INSERT INTO consumer.processed_events(event_id) VALUES ($2)
  ON CONFLICT DO NOTHING
  RETURNING event_id)
INSERT INTO consumer.shipments(order_id, event_id)
SELECT $1, event_id FROM first_delivery";

/// The consumer names its sessions so (`application_name`): the db-kill-backend nemesis finds
/// them by it.
pub const CONSUMER_APPLICATION_NAME: &str = "outbox-lab consumer";

/// The fence: the event's token is accepted if no newer one was accepted for its aggregate, and
/// becomes the aggregate's; in the delivery's transaction, so that two deliveries under
/// different tokens cannot both pass. No row back: the token is stale.
pub const ADVANCE_FENCE: &str = "
INSERT INTO consumer.fences AS f (aggregate_id, token) VALUES ($1, $2)
ON CONFLICT (aggregate_id) DO UPDATE SET token = EXCLUDED.token
 WHERE f.token <= EXCLUDED.token
RETURNING token";

/// The answer to a delivery under a stale fencing token (HTTP 409): nothing was done.
pub const STALE_FENCE: &str = "stale-fence";

/// The receipts of a batch delivered in one request, in batch order.
pub const RECORD_BATCH_RECEIPTS: &str = "
INSERT INTO consumer.receipts(event_id, outbox_id, order_id, event_type, injected_fault,
                              received_at)
SELECT event_id, outbox_id, order_id, event_type, false, $5
  FROM unnest($1::uuid[], $2::bigint[], $3::text[], $4::text[]) WITH ORDINALITY
       AS delivered(event_id, outbox_id, order_id, event_type, n)
 ORDER BY n";

/// [`CREATE_SHIPMENT`] for a batch: a shipment for every event in it.
pub const CREATE_BATCH_SHIPMENTS: &str = "
INSERT INTO consumer.shipments(order_id, event_id)
SELECT order_id, event_id
  FROM unnest($1::text[], $2::uuid[]) WITH ORDINALITY AS delivered(order_id, event_id, n)
 ORDER BY n";

/// [`SHIP_FIRST_DELIVERY`] for a batch: a shipment for each event delivered for the first time
/// (once, should the batch carry it twice).
pub const SHIP_BATCH_FIRST_DELIVERIES: &str = "
WITH delivered AS (
  SELECT DISTINCT ON (event_id) order_id, event_id, n
    FROM unnest($1::text[], $2::uuid[]) WITH ORDINALITY AS d(order_id, event_id, n)
   ORDER BY event_id, n),
first_delivery AS (
  INSERT INTO consumer.processed_events(event_id)
  SELECT event_id FROM delivered
  ON CONFLICT DO NOTHING
  RETURNING event_id)
INSERT INTO consumer.shipments(order_id, event_id)
SELECT delivered.order_id, delivered.event_id
  FROM delivered JOIN first_delivery USING (event_id)
 ORDER BY delivered.n";

/// How long a stopping consumer waits for requests under way.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// Connections the consumer keeps open: as many as a relay sends requests at once.
const POOL_SIZE: usize = 16;

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
pub enum ConsumerKind {
    /// One shipment per delivery: duplicates ship twice.
    Naive,
    /// Dedup by event_id in the same transaction as the shipment.
    Idempotent,
}

impl ConsumerKind {
    pub fn name(self) -> &'static str {
        match self {
            ConsumerKind::Naive => "naive",
            ConsumerKind::Idempotent => "idempotent",
        }
    }
}

/// Faults the consumer injects on purpose.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Faults {
    /// Answer 500 to this many requests, then behave.
    pub fail_next: u32,
    /// Answer 500 to the first delivery of the outbox row with this id.
    pub fail_first_delivery_of: Option<i64>,
    /// Answer 500 to every delivery of the outbox row with this id: a poison event.
    pub fail_every_delivery_of: Option<i64>,
    /// A slow sink: take this long over each delivery before handling it.
    pub delay: Duration,
}

struct State {
    pool: Pool,
    kind: ConsumerKind,
    fail_next: AtomicU32,
    fail_first_delivery_of: Option<i64>,
    failed_first_delivery: AtomicBool,
    fail_every_delivery_of: Option<i64>,
    delay: Duration,
}

impl State {
    /// Whether this request (carrying `events`) gets an injected 500.
    fn inject_fault(&self, events: &[Event]) -> bool {
        let take_one = |n: u32| n.checked_sub(1);
        if self
            .fail_next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, take_one)
            .is_ok()
        {
            return true;
        }
        let poison = |event: &Event| {
            event.outbox_id.is_some() && event.outbox_id == self.fail_every_delivery_of
        };
        if events.iter().any(poison) {
            return true;
        }
        events.iter().any(|event| {
            event.outbox_id.is_some() && event.outbox_id == self.fail_first_delivery_of
        }) && !self.failed_first_delivery.swap(true, Ordering::SeqCst)
    }
}

/// Serves until the process is killed; `on_ready` hears the address once requests are served.
pub async fn serve(
    listener: TcpListener,
    db: tokio_postgres::Config,
    kind: ConsumerKind,
    faults: Faults,
    on_ready: impl FnOnce(std::net::SocketAddr),
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    let pool = pool(db, POOL_SIZE)?;
    // Fail now, not at the first request, if the database is unreachable.
    drop(
        pool.get()
            .await
            .context("consumer cannot reach its database")?,
    );
    let state = Arc::new(State {
        pool,
        kind,
        fail_next: AtomicU32::new(faults.fail_next),
        fail_first_delivery_of: faults.fail_first_delivery_of,
        failed_first_delivery: AtomicBool::new(false),
        fail_every_delivery_of: faults.fail_every_delivery_of,
        delay: faults.delay,
    });
    on_ready(listener.local_addr()?);
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => accepted?,
            () = &mut shutdown => break,
        };
        while connections.try_join_next().is_some() {} // reap closed connections
                                                       // Each reply goes out at once, not held back by Nagle for an earlier segment's ACK.
        let _ = stream.set_nodelay(true);
        let state = state.clone();
        connections.spawn(async move {
            let service = service_fn(move |request| handle(state.clone(), request));
            // A relay that dies mid-request ends its connection: nothing to report.
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
    // Stopping: let requests under way finish (a keep-alive connection that stays idle is
    // dropped after the bound), so no delivery is cut between its commit and its reply.
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    Ok(())
}

async fn handle(
    state: Arc<State>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    // Any path: a relay of the user's posts where it likes (outbox-lab's own post to /events).
    if request.method() != Method::POST {
        return Ok(reply(StatusCode::METHOD_NOT_ALLOWED, "only POST"));
    }
    let body = match request.into_body().collect().await {
        Ok(body) => body.to_bytes(),
        Err(e) => return Ok(reply(StatusCode::BAD_REQUEST, &format!("bad body: {e}"))),
    };
    let delivery = match body.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'[') => serde_json::from_slice::<Vec<Event>>(&body).map(Delivery::Batch),
        _ => serde_json::from_slice::<Event>(&body).map(Delivery::One),
    };
    let delivery = match delivery {
        Ok(delivery) => delivery,
        Err(e) => return Ok(reply(StatusCode::BAD_REQUEST, &format!("bad event: {e}"))),
    };
    if !state.delay.is_zero() {
        // Not even a zero sleep otherwise: the timer rounds it up to its next tick (~1 ms).
        tokio::time::sleep(state.delay).await;
    }
    Ok(match handle_delivery(&state, &delivery).await {
        Ok(Some(STALE_FENCE)) => reply(StatusCode::CONFLICT, STALE_FENCE),
        Ok(Some(result)) => reply(StatusCode::OK, result),
        Ok(None) => reply(StatusCode::INTERNAL_SERVER_ERROR, "injected fault"),
        Err(e) => reply(StatusCode::INTERNAL_SERVER_ERROR, &format!("{e:#}")),
    })
}

/// What one request carries.
enum Delivery {
    One(Event),
    /// A batch, in the relay's order.
    Batch(Vec<Event>),
}

/// Answers one request: an injected fault (for every event it carries), or [`apply`] /
/// [`apply_batch`]. `None` when a fault was injected.
async fn handle_delivery(state: &State, delivery: &Delivery) -> Result<Option<&'static str>> {
    let conn = state.pool.get().await?;
    let events = match delivery {
        Delivery::One(event) => std::slice::from_ref(event),
        Delivery::Batch(events) => events.as_slice(),
    };
    if state.inject_fault(events) {
        for event in events {
            record_receipt(&conn, event, true).await?;
        }
        return Ok(None);
    }
    Ok(Some(match delivery {
        Delivery::One(event) => apply(&conn, state.kind, event).await?,
        Delivery::Batch(events) => apply_batch(&conn, state.kind, events).await?,
    }))
}

/// When a delivery is received, on the consumer's own clock (the machine's): not the database
/// server's, which a clock nemesis may step; the judge reads every time from clocks of ours.
fn received_now() -> chrono::DateTime<chrono::Utc> {
    chrono::Utc::now()
}

async fn record_receipt(client: &ClientWrapper, event: &Event, injected_fault: bool) -> Result<()> {
    let received_at = received_now();
    let params: [&(dyn ToSql + Sync); 6] = [
        &event.event_id,
        &event.outbox_id,
        &event.aggregate_id,
        &event.event_type,
        &injected_fault,
        &received_at,
    ];
    // Prepared once per pooled connection: a fresh prepare would cost a round trip per event.
    let statement = client.prepare_cached(RECORD_RECEIPT).await?;
    client.execute(&statement, &params).await?;
    Ok(())
}

/// One transaction: the receipt, and the side effect, for every delivery (naive) or only for
/// an event's first (idempotent, with the event id recorded in the same transaction). BEGIN and
/// the two statements go out together (pipelined): one round trip, then the COMMIT. Used for
/// HTTP deliveries and for the Redis stream's workers alike. A fenced event passes its fence
/// first, in the same transaction, or nothing is done ([`STALE_FENCE`]).
pub async fn apply(
    client: &ClientWrapper,
    kind: ConsumerKind,
    event: &Event,
) -> Result<&'static str> {
    let effect = match kind {
        ConsumerKind::Naive => CREATE_SHIPMENT,
        ConsumerKind::Idempotent => SHIP_FIRST_DELIVERY,
    };
    let effect = client.prepare_cached(effect).await?;
    let began = match event.fence {
        None => false,
        Some(token) => {
            client.batch_execute("BEGIN").await?;
            let fence = client
                .query_opt(ADVANCE_FENCE, &[&event.aggregate_id, &token])
                .await;
            if !matches!(fence, Ok(Some(_))) {
                let _ = client.batch_execute("ROLLBACK").await;
                return fence.map(|_| STALE_FENCE).map_err(Into::into);
            }
            true
        }
    };
    let written = tokio::try_join!(
        async {
            if !began {
                client.batch_execute("BEGIN").await?;
            }
            Ok(())
        },
        record_receipt(client, event, false),
        async {
            Ok(client
                .execute(&effect, &[&event.aggregate_id, &event.event_id])
                .await?)
        },
    );
    let shipped = match written {
        Ok((_, _, shipped)) => shipped,
        Err(e) => {
            // The connection goes back to the pool: it must not stay inside the transaction.
            let _ = client.batch_execute("ROLLBACK").await;
            return Err(e);
        }
    };
    crash::point(CrashPoint::ConsumerAfterEffectBeforeCommit);
    client.batch_execute("COMMIT").await?;
    crash::point(CrashPoint::ConsumerAfterCommitBeforeReply);
    // A duplicate is a success for the sender: an error would make the relay retry forever.
    Ok(if shipped == 1 {
        "shipped"
    } else {
        "duplicate-ignored"
    })
}

/// A batch in one transaction: the receipts, and the side effects as [`apply`] makes them for
/// each event (every delivery, or only each event's first). BEGIN and the two statements go out
/// together, then the COMMIT: two round trips and one commit for the whole batch.
pub async fn apply_batch(
    client: &ClientWrapper,
    kind: ConsumerKind,
    events: &[Event],
) -> Result<&'static str> {
    let effect = match kind {
        ConsumerKind::Naive => CREATE_BATCH_SHIPMENTS,
        ConsumerKind::Idempotent => SHIP_BATCH_FIRST_DELIVERIES,
    };
    let (receipts, effect) = tokio::try_join!(
        client.prepare_cached(RECORD_BATCH_RECEIPTS),
        client.prepare_cached(effect),
    )?;
    let event_ids: Vec<uuid::Uuid> = events.iter().map(|e| e.event_id).collect();
    let outbox_ids: Vec<Option<i64>> = events.iter().map(|e| e.outbox_id).collect();
    let order_ids: Vec<&str> = events.iter().map(|e| e.aggregate_id.as_str()).collect();
    let event_types: Vec<&str> = events.iter().map(|e| e.event_type.as_str()).collect();
    let received_at = received_now();
    let receipt_params: [&(dyn ToSql + Sync); 5] = [
        &event_ids,
        &outbox_ids,
        &order_ids,
        &event_types,
        &received_at,
    ];
    let effect_params: [&(dyn ToSql + Sync); 2] = [&order_ids, &event_ids];
    let written = tokio::try_join!(
        client.batch_execute("BEGIN"),
        client.execute(&receipts, &receipt_params),
        client.execute(&effect, &effect_params),
    );
    if let Err(e) = written {
        // The connection goes back to the pool: it must not stay inside the transaction.
        let _ = client.batch_execute("ROLLBACK").await;
        return Err(e.into());
    }
    crash::point(CrashPoint::ConsumerAfterEffectBeforeCommit);
    client.batch_execute("COMMIT").await?;
    crash::point(CrashPoint::ConsumerAfterCommitBeforeReply);
    Ok("applied")
}

/// A pool of connections to the consumer's database.
pub fn pool(mut db: tokio_postgres::Config, size: usize) -> Result<Pool> {
    // Every consumer's sessions, over HTTP or a broker, are ours by name: a nemesis on the
    // user's relays passes them over.
    db.application_name(CONSUMER_APPLICATION_NAME);
    let manager = Manager::from_config(
        db,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Ok(Pool::builder(manager).max_size(size).build()?)
}

fn reply(status: StatusCode, text: &str) -> Response<Full<Bytes>> {
    let body = serde_json::json!({ "result": text }).to_string();
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
}
