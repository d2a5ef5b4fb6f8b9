//! broker-dedup (ブローカーの重複排除に頼れるか): the relay-crash experiment with NATS
//! JetStream. The relay publishes `crash_after` events, each acked by the stream, and dies
//! before marking them; after `downtime_ms` a new relay publishes every event again, with the
//! same `Nats-Msg-Id`. A stream whose duplicate window covers the downtime drops the repeats:
//! it holds each event once and even a naive consumer ships once. A window shorter than the
//! downtime has forgotten the ids: the repeats are stored, and the naive consumer ships them.

use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use async_nats::jetstream::stream;
use serde::Deserialize;

use super::{metric_names, Ctx, Experiment, Outcome, CHILD_TIMEOUT};
use crate::harness::child::role::JetStreamWorkerRole;
use crate::harness::child::{ChildCommand, ChildEnd};
use crate::judge::counts;
use crate::outbox::consumer::ConsumerKind;
use crate::outbox::crash::{CrashPlan, CrashPoint};
use crate::outbox::jetstream_consumer::DURABLE;
use crate::outbox::relay::RelayConfig;
use crate::outbox::sink::NatsSink;
use crate::outbox::writer::Ending;
use crate::report::plots::{self, Bar, Plot};
use crate::report::{Report, Table};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// Orders written, each with one event.
    pub events: u32,
    /// The first relay dies after this many publishes were acked (its batch: nothing more is
    /// in flight when it dies).
    pub crash_after: u32,
    /// How long no relay runs between the crash and the restart.
    pub downtime_ms: u64,
    /// The duplicate window of the stream in the case where it covers the downtime.
    pub covered_window_ms: u64,
    /// The duplicate window of the stream in the case where it is shorter than the downtime.
    pub expired_window_ms: u64,
}

/// The two cases: the duplicate window covers the relay's downtime, or it has expired.
const CASES: [&str; 2] = ["covered", "expired"];
/// The consumer that shows what the stream let through: one shipment per message.
const KIND: ConsumerKind = ConsumerKind::Naive;
/// The worker fetches this many messages at a time.
const FETCH_BATCH: usize = 100;

impl Params {
    fn window_ms(&self, case: &str) -> u64 {
        match case {
            "covered" => self.covered_window_ms,
            _ => self.expired_window_ms,
        }
    }
}

impl Experiment for Params {
    fn metrics(&self) -> Vec<String> {
        let mut metrics = metric_names(CASES, &["stream_messages"]);
        let consumers = CASES.map(|case| format!("{case}.{}", KIND.name()));
        metrics.extend(metric_names(consumers, &counts::DELIVERY_FIGURES));
        metrics
    }

    fn validate(&self) -> Result<()> {
        super::check_crash_after(self.events, self.crash_after)?;
        // 0 would be JetStream's default window (2 minutes), not "no window".
        if self.expired_window_ms == 0 {
            bail!("expired_window_ms must be at least 1 (0 is JetStream's default, 2 minutes)");
        }
        if self.expired_window_ms >= self.downtime_ms {
            bail!(
                "expired_window_ms {} must be shorter than downtime_ms {}",
                self.expired_window_ms,
                self.downtime_ms
            );
        }
        if self.covered_window_ms <= self.downtime_ms {
            bail!(
                "covered_window_ms {} must be longer than downtime_ms {}",
                self.covered_window_ms,
                self.downtime_ms
            );
        }
        Ok(())
    }

    async fn run(&self, ctx: &Ctx<'_>) -> Result<Outcome> {
        run(ctx, self).await
    }

    fn plots(report: &Report) -> Result<Vec<Plot>> {
        shipments_per_window(report)
    }
}

/// What the stream held and what the naive consumer shipped, per duplicate window, against the
/// events written: equal when the window covered the downtime, more when it had expired.
fn shipments_per_window(report: &Report) -> Result<Vec<Plot>> {
    let figure = |name: &str| report.metrics.get(name).and_then(|v| v.as_f64());
    let Some(events) = report.params.get("events").and_then(|v| v.as_f64()) else {
        return Ok(Vec::new());
    };
    let mut bars = Vec::new();
    for case in CASES {
        for (metric, what) in [
            ("stream_messages", "messages in the stream"),
            ("naive.shipments", "shipments"),
        ] {
            let Some(value) = figure(&format!("{case}.{metric}")) else {
                return Ok(Vec::new());
            };
            bars.push(Bar {
                label: format!("window {case}: {what}"),
                value,
                text: format!("{value:.0} for {events:.0} events"),
                colour: if value > events {
                    plots::BAD
                } else {
                    plots::GOOD
                },
            });
        }
    }
    Ok(vec![Plot {
        id: "broker-dedup",
        title: "JetStream's duplicate window: what the stream held and the naive consumer shipped"
            .into(),
        svg: plots::horizontal_bars(&bars, "messages, shipments")?,
    }])
}

pub async fn run(ctx: &Ctx<'_>, params: &Params) -> Result<Outcome> {
    let nats_url = ctx.nats_url().await?;
    let jetstream = async_nats::jetstream::new(crate::connect::nats(&nats_url).await?);
    let mut outcome = Outcome::default();
    let mut summary = counts::ConsumerComparison::new(
        "the same crash, per duplicate window (naive consumer)",
        &["duplicate_window_ms", "stream_messages"],
        &[
            "received",
            "distinct_events",
            "shipments",
            "orders_shipped_twice",
        ],
    )
    .heading("received", "messages applied");
    for case in CASES {
        let window_ms = params.window_ms(case);
        let db = ctx.database(case).await?;
        let client = db.connect().await?;
        // A stream per case, deleted after it: the two would claim the same subjects.
        let name = format!("{}outbox_{case}", ctx.nats_name_prefix());
        let subjects = NatsSink::subject(ctx.nats_subject_prefix(), ">");
        let config = stream::Config {
            duplicate_window: Duration::from_millis(window_ms),
            ..NatsSink::stream_config(&name, ctx.nats_subject_prefix())
        };
        let mut created = NatsSink::create_fresh_stream(&jetstream, config).await?;

        ctx.run_writer(&db, params.events, Ending::Commit, None)
            .await?
            .expect(|e| *e == ChildEnd::Ok, "the writer")?;
        // The first relay's batch is what it publishes before it dies: nothing else in flight.
        let first = RelayConfig {
            batch: i64::from(params.crash_after),
            ..RelayConfig::default()
        };
        let crash = CrashPlan::new(CrashPoint::RelayAfterSendBeforeMark, params.crash_after);
        let crashed = ctx
            .run_relay(&db, &nats_url, "0", &first, Some(crash))
            .await?
            .expect(|e| matches!(e, ChildEnd::Crashed { .. }), "the first relay")?;
        tokio::time::sleep(Duration::from_millis(params.downtime_ms)).await;
        ctx.run_relay(&db, &nats_url, "1", &RelayConfig::default(), None)
            .await?
            .expect(|e| *e == ChildEnd::Ok, "the restarted relay")?;
        outcome.notes.push(format!(
            "[{case}] relay 0 {} after {} acked publishes, before marking published; relay 1 \
             started {} ms later and published all {} events again",
            crashed.end, params.crash_after, params.downtime_ms, params.events
        ));

        let info = created
            .info()
            .await
            .map_err(|e| anyhow!("cannot read JetStream stream {name}: {e}"))?;
        let stream_messages = info.state.messages as i64;
        outcome
            .metrics
            .set(format!("{case}.stream_messages"), stream_messages);
        let mut table = Table::new(
            format!("JetStream stream {name} ({case})"),
            &["field", "value"],
        );
        for (field, value) in [
            ("subjects", subjects.clone()),
            ("duplicate_window_ms", window_ms.to_string()),
            ("messages", info.state.messages.to_string()),
            ("first_seq", info.state.first_sequence.to_string()),
            ("last_seq", info.state.last_sequence.to_string()),
        ] {
            table.push(vec![field.into(), value]);
        }
        outcome.tables.push(table);

        let worker = JetStreamWorkerRole {
            nats_url: nats_url.clone(),
            stream: name.clone(),
            durable: format!("{}{DURABLE}", ctx.nats_name_prefix()),
            kind: KIND,
            batch: FETCH_BATCH,
            follow: false,
        };
        ChildCommand::new(&db, worker)
            .run(CHILD_TIMEOUT)
            .await?
            .expect(|e| *e == ChildEnd::Ok, "the JetStream worker")?;
        jetstream
            .delete_stream(&name)
            .await
            .map_err(|e| anyhow!("cannot delete JetStream stream {name}: {e}"))?;

        let shipments = client.query(counts::SHIPMENTS_PER_ORDER, &[]).await?;
        outcome.tables.push(Table::from_rows(
            format!("shipments per order ({case}, naive consumer)"),
            &shipments,
        ));
        let row = counts::one_row(&client, counts::DELIVERIES).await?;
        outcome
            .metrics
            .set_row(&format!("{case}.{}", KIND.name()), &row);
        summary.push(
            case,
            vec![window_ms.to_string(), stream_messages.to_string()],
            &row,
        );
    }
    outcome.tables.insert(0, summary.table());
    Ok(outcome)
}
