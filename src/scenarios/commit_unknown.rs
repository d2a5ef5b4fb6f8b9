//! commit-unknown (beyond the article: the indeterminate COMMIT, Jepsen's `info`): the
//! application's COMMIT reaches the server and commits, and its answer is lost on the way back
//! (the writer's [database link](crate::harness::link::postgres) drops it and cuts the
//! connection). The application cannot know whether its order exists. Three applications, each
//! with the idempotent consumer behind the article's relay:
//!
//! - `no_retry` gives up on the error: the orders it believes failed exist, and ship;
//! - `retry` runs the business transaction again: the order and its event are written twice,
//!   under two event ids, and the idempotent consumer (dedup by `event_id`) ships both;
//! - `idempotency_key` retries with a unique client request id on the order: the retry finds
//!   the first commit, and writes nothing twice.
//!
//! And the relay's side: the relay's mark COMMIT answer is lost (`relay_mark_lost`); the rows it
//! marked stay marked, and nothing is delivered again, even to the naive consumer.

use anyhow::{bail, Result};
use serde::Deserialize;
use tokio_postgres::Client;

use super::{metric_names, Ctx, Experiment, Outcome};
use crate::connect;
use crate::harness::child::ChildEnd;
use crate::harness::db::Database;
use crate::harness::link::postgres::{PgLink, PgProxy};
use crate::judge::counts;
use crate::outbox::consumer::{ConsumerKind, Faults};
use crate::outbox::relay::{RelayConfig, RelayDesign};
use crate::outbox::writer::{self, Ending, INSERT_ORDER, INSERT_OUTBOX};
use crate::report::Table;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// Orders the application is asked for, one event each, one request at a time.
    pub requests: u32,
    /// The COMMITs on the application's link whose answer is lost, by their number there.
    pub commits_lost: Vec<u32>,
    /// Events written before the relay starts, for the relay's side.
    pub relay_events: u32,
    /// The relay's batch: a COMMIT marks this many.
    pub relay_batch: i64,
    /// The relay's COMMITs (one per pass: fetch, send, mark) whose answer is lost.
    pub relay_commits_lost: Vec<u32>,
    /// The relay's design: the article's `lock` (send, then mark and COMMIT); `mark-before-send`
    /// (mark and COMMIT, then send) loses the batches whose COMMIT answer was lost.
    #[serde(default)]
    pub relay_design: RelayDesign,
}

/// How the application meets a COMMIT it cannot know the outcome of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Application {
    /// Gives up: reports the order failed.
    NoRetry,
    /// Runs the business transaction again.
    Retry,
    /// Runs it again under the request's key: an order already there is not written twice.
    IdempotencyKey,
}

impl Application {
    const ALL: [Application; 3] = [
        Application::NoRetry,
        Application::Retry,
        Application::IdempotencyKey,
    ];

    fn name(self) -> &'static str {
        match self {
            Application::NoRetry => "no_retry",
            Application::Retry => "retry",
            Application::IdempotencyKey => "idempotency_key",
        }
    }
}

/// An application retries a request this many times at most.
const MAX_TRIES: u32 = 3;

/// What each case measures, in the table's order: the lost answers (the link's count), what
/// [`CASE_FIGURES`] counts, and the events lost (the judge's).
const FIGURES: [&str; 6] = [
    "commits_lost",
    "orders",
    "orders_believed_failed",
    "orders_shipped_twice",
    "shipments",
    "lost",
];
/// The relay's side.
const RELAY_FIGURES: [&str; 4] = ["commits_lost", "received", "redelivered", "lost"];

/// The application's own record of each request: what it believes became of it.
const CREATE_BELIEFS: &str = "
CREATE TABLE app_requests (
  request_id bigint PRIMARY KEY,
  believed   text   NOT NULL CHECK (believed IN ('committed', 'failed'))
)";
const RECORD_BELIEF: &str = "INSERT INTO app_requests(request_id, believed) VALUES ($1, $2)";

/// The client's request id on the order, unique: the idempotency key.
const ADD_IDEMPOTENCY_KEY: &str = "ALTER TABLE orders ADD COLUMN request_id bigint UNIQUE";
/// The order, once per request: nothing comes back when the request's order is there already.
const INSERT_ORDER_ONCE: &str = "
INSERT INTO orders(customer_id, amount, request_id) VALUES ($1, 1200, $1)
ON CONFLICT (request_id) DO NOTHING
RETURNING id";

/// A request is its customer's: the orders of each request, and what was shipped for them.
const CASE_FIGURES: &str = "
WITH shipped AS (
  SELECT o.customer_id AS request_id, count(*) AS shipments
    FROM consumer.shipments s JOIN orders o ON s.order_id = o.id::text
   GROUP BY o.customer_id)
SELECT (SELECT count(*) FROM orders) AS orders,
       (SELECT count(*) FROM app_requests a JOIN shipped s USING (request_id)
         WHERE a.believed = 'failed') AS orders_believed_failed,
       (SELECT count(*) FROM shipped WHERE shipments >= 2) AS orders_shipped_twice,
       (SELECT count(*) FROM consumer.shipments) AS shipments";

impl Experiment for Params {
    fn metrics(&self) -> Vec<String> {
        let mut metrics = metric_names(Application::ALL.map(Application::name), &FIGURES);
        metrics.extend(metric_names(["relay_mark_lost"], &RELAY_FIGURES));
        metrics
    }

    fn validate(&self) -> Result<()> {
        let mut lost = self.commits_lost.clone();
        lost.sort_unstable();
        if lost.is_empty() || lost[0] == 0 || lost.last() > Some(&self.requests) {
            bail!(
                "commits_lost must name COMMITs 1..={} (the requests'), at least one",
                self.requests
            );
        }
        // A retry's own COMMIT is the next one: were it lost too, a request would be written
        // three times, and the counts no longer one per lost answer.
        if lost.windows(2).any(|w| w[1] < w[0] + 2) {
            bail!("commits_lost must be at least 2 apart (a retry's COMMIT is the next one)");
        }
        if self.relay_commits_lost.is_empty() || self.relay_commits_lost.contains(&0) {
            bail!("relay_commits_lost must name at least one COMMIT, from 1");
        }
        let passes = self
            .relay_events
            .div_ceil(self.relay_batch.clamp(1, i64::from(u32::MAX)) as u32);
        if self.relay_batch < 1 || self.relay_commits_lost.iter().any(|&n| n > passes) {
            bail!(
                "relay_commits_lost must hit the relay's passes that mark a batch (1..={passes} \
                 with {} events in batches of {})",
                self.relay_events,
                self.relay_batch
            );
        }
        Ok(())
    }

    async fn run(&self, ctx: &Ctx<'_>) -> Result<Outcome> {
        run(ctx, self).await
    }
}

pub async fn run(ctx: &Ctx<'_>, params: &Params) -> Result<Outcome> {
    let mut outcome = Outcome::default();
    let columns: Vec<&str> = ["application", "requests"]
        .into_iter()
        .chain(FIGURES)
        .collect();
    let mut summary = Table::new(
        "the application's COMMIT answer lost: what it believes, what shipped",
        &columns,
    );
    for application in Application::ALL {
        let name = application.name();
        let db = ctx.database(name).await?;
        let client = db.connect().await?;
        client.batch_execute(CREATE_BELIEFS).await?;
        if application == Application::IdempotencyKey {
            client.batch_execute(ADD_IDEMPOTENCY_KEY).await?;
        }
        let proxy = PgProxy::start(&db.config()?, 1, None).await?;
        let link = proxy.link(0);
        for &n in &params.commits_lost {
            link.lose_commit(n);
        }
        for request in 1..=i64::from(params.requests) {
            let believed = serve_request(&db, link, application, request).await?;
            client
                .execute(RECORD_BELIEF, &[&request, &believed])
                .await?;
        }
        let commits_lost = lost_answers(link, &params.commits_lost);
        drop(proxy);

        let consumer = ctx
            .start_consumer(&db, ConsumerKind::Idempotent, &Faults::default())
            .await?;
        let relay = ctx
            .run_relay(&db, &consumer.url, "0", &RelayConfig::default(), None)
            .await?
            .expect(|e| *e == ChildEnd::Ok, "the relay")?;
        consumer.stop().await?;
        outcome
            .notes
            .extend(relay.log_lines().map(|l| format!("[{name}] {l}")));

        let figures = client.query_one(CASE_FIGURES, &[]).await?;
        let lost = counts::one_row(&client, counts::DELIVERIES)
            .await?
            .get::<_, i64>("lost");
        let mut row = vec![name.to_string(), params.requests.to_string()];
        for figure in FIGURES {
            let value = match figure {
                "commits_lost" => commits_lost,
                "lost" => lost,
                counted => figures.get::<_, i64>(counted),
            };
            outcome.metrics.set(format!("{name}.{figure}"), value);
            row.push(value.to_string());
        }
        summary.push(row);
    }
    outcome.tables.push(summary);
    relay_mark_lost(ctx, params, &mut outcome).await?;
    Ok(outcome)
}

/// One request of the application, through its link: what it believes became of it.
async fn serve_request(
    db: &Database,
    link: &PgLink,
    application: Application,
    request: i64,
) -> Result<&'static str> {
    let through = link.database(db)?.config()?;
    for _ in 0..MAX_TRIES {
        let mut client = connect::postgres(&through).await?;
        match create_order(&mut client, application, request).await {
            Ok(()) => return Ok("committed"),
            // The connection broke at COMMIT: committed or not, the application cannot tell.
            Err(e) if connect::lost_connection(&e) => {
                if application == Application::NoRetry {
                    return Ok("failed");
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok("failed")
}

/// The business transaction: the order and its event, one COMMIT (with the idempotency key, no
/// order if the request's is there already).
async fn create_order(client: &mut Client, application: Application, request: i64) -> Result<()> {
    let tx = client.transaction().await?;
    let order_id: Option<i64> = match application {
        Application::IdempotencyKey => tx
            .query_opt(INSERT_ORDER_ONCE, &[&request])
            .await?
            .map(|row| row.get(0)),
        _ => Some(tx.query_one(INSERT_ORDER, &[&request]).await?.get(0)),
    };
    if let Some(id) = order_id {
        let payload = writer::order_payload(id);
        let event_type = writer::event_type(1);
        tx.execute(INSERT_OUTBOX, &[&id.to_string(), &event_type, &payload])
            .await?;
    }
    tx.commit().await?;
    Ok(())
}

/// How many of the planned answers were lost.
fn lost_answers(link: &PgLink, planned: &[u32]) -> i64 {
    planned
        .iter()
        .filter(|&&n| link.commit_lost(n).is_some())
        .count() as i64
}

/// The relay's mark COMMIT answer lost: the relay reconnects and fetches again; what its mark
/// committed is not pending, so nothing is delivered twice (to the naive consumer, which would
/// ship it twice).
async fn relay_mark_lost(ctx: &Ctx<'_>, params: &Params, outcome: &mut Outcome) -> Result<()> {
    let name = "relay_mark_lost";
    let db = ctx.database(name).await?;
    let client = db.connect().await?;
    ctx.run_writer(&db, params.relay_events, Ending::Commit, None)
        .await?
        .expect(|e| *e == ChildEnd::Ok, "the writer")?;
    let proxy = PgProxy::start(&db.config()?, 1, None).await?;
    let link = proxy.link(0);
    for &n in &params.relay_commits_lost {
        link.lose_commit(n);
    }
    let consumer = ctx
        .start_consumer(&db, ConsumerKind::Naive, &Faults::default())
        .await?;
    let config = RelayConfig {
        batch: params.relay_batch,
        design: params.relay_design,
        ..RelayConfig::default()
    };
    let through = link.database(&db)?;
    let relay = ctx
        .run_relay(&through, &consumer.url, "0", &config, None)
        .await?
        .expect(|e| *e == ChildEnd::Ok, "the relay")?;
    consumer.stop().await?;
    let commits_lost = lost_answers(link, &params.relay_commits_lost);
    drop(proxy);
    outcome
        .notes
        .extend(relay.log_lines().map(|l| format!("[{name}] {l}")));
    let row = counts::one_row(&client, counts::DELIVERIES).await?;
    let received: i64 = row.get("received");
    let distinct: i64 = row.get("distinct_events");
    let lost: i64 = row.get("lost");
    let m = &mut outcome.metrics;
    m.set(format!("{name}.commits_lost"), commits_lost);
    m.set(format!("{name}.received"), received);
    m.set(format!("{name}.redelivered"), received - distinct);
    m.set(format!("{name}.lost"), lost);
    let mut table = Table::new(
        "the relay's mark COMMIT answer lost (naive consumer)",
        &["events", "commits_lost", "received", "redelivered", "lost"],
    );
    table.push(vec![
        params.relay_events.to_string(),
        commits_lost.to_string(),
        received.to_string(),
        (received - distinct).to_string(),
        lost.to_string(),
    ]);
    outcome.tables.push(table);
    Ok(())
}
