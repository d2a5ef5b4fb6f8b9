//! The child's side: read the spec from the environment, arm the crash plan, run the role.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use tokio::io::AsyncReadExt;
use uuid::Uuid;

use super::role::{
    AmqpWorkerRole, ChildArgs, ChildSpec, ExploreRelayRole, ExploreWriterRole, JetStreamWorkerRole,
    KafkaWorkerRole, NaiveAppRole, Role, WriterRole, SPEC_ENV,
};
use super::REPORT_PREFIX;
use crate::connect;
use crate::harness::db::Database;
use crate::ops::logging::{self, LogFormat};
use crate::outbox::amqp_consumer::AmqpWorker;
use crate::outbox::consumer;
use crate::outbox::crash;
use crate::outbox::jetstream_consumer::JetStreamWorker;
use crate::outbox::kafka_consumer::KafkaWorker;
use crate::outbox::phases;
use crate::outbox::relay::cdc::{CdcConfig, CdcRelay};
use crate::outbox::relay::watermark::StoredWatermarkRelay;
use crate::outbox::relay::{drive, Until, RELAY_APPLICATION_NAME};
use crate::outbox::sink::HttpSink;
use crate::outbox::stream_consumer::StreamWorker;
use crate::outbox::writer::{self, Ending};

/// The child's side: reads its spec, arms its crash plan, and runs its role.
pub async fn run_role(args: ChildArgs) -> Result<()> {
    // A child must not outlive the run that started it: its parent armed SIGKILL on its death
    // before exec (harness/child/mod.rs).
    logging::init(LogFormat::Text);
    let spec = std::env::var(SPEC_ENV).with_context(|| {
        format!(
            "child {}: no {SPEC_ENV} (children are started by outbox-lab)",
            args.role
        )
    })?;
    let spec: ChildSpec = serde_json::from_str(&spec)
        .with_context(|| format!("child {}: unreadable {SPEC_ENV}", args.role))?;
    if let Some(plan) = spec.crash_at {
        crash::arm(plan, spec.crash_claim);
    }
    if let Some(plan) = spec.pause_at {
        crash::arm_pause(plan, spec.pause_claim);
    }
    let db = spec.database;
    let ended = perform(&db, spec.role).await;
    // What the role noted for notify-latency, now that nothing is timed any more.
    phases::print_held();
    ended
}

/// Runs the role.
async fn perform(db: &Database, role: Role) -> Result<()> {
    match role {
        Role::Writer(role) => write_orders(db, role).await,
        Role::NaiveApp(role) => {
            let mut client = db.connect().await?;
            let sink = HttpSink::new(&role.sink)?;
            let NaiveAppRole {
                customer_id,
                event_id,
                order,
                ending,
                ..
            } = role;
            writer::dual_write(&mut client, &sink, customer_id, event_id, order, ending).await?;
            Ok(())
        }
        Role::Relay(options) => {
            let mut relay = options.connect(&db.config()?).await?;
            let until = options.until();
            // A following relay stops, its last batch finished, once its stdin is closed: the
            // parent then reads all it printed. A draining one reads nothing: a read of stdin
            // left unfinished would hold the process at its exit.
            let ended = match options.follow {
                Some(_) => drive(&mut relay, until, stdin_closed()).await?,
                None => drive(&mut relay, until, std::future::pending()).await?,
            };
            ended.or_gave_up(&options.name)?;
            report(&relay.timings())
        }
        Role::CdcRelay(role) => {
            let config = CdcConfig {
                slot: role.slot,
                backoff_base: role.config.backoff_base,
                max_attempts: role.config.max_attempts as u32,
                heartbeat: role.heartbeat,
            };
            let mut connection = db.config()?;
            connection.application_name(format!("{RELAY_APPLICATION_NAME} {}", role.name));
            let sink = role.sink.connect(role.config.request_timeout).await?;
            CdcRelay::connect(&connection, sink, config, Some(role.name))
                .await?
                .follow()
                .await
        }
        Role::StreamWorker(role) => {
            // A worker restarted while its database restarts waits for it.
            let pool = consumer::pool(db.config()?, 1)?;
            let db =
                connect::patiently(connect::RECONNECT_PATIENCE, async || Ok(pool.get().await?))
                    .await?;
            let mut worker = StreamWorker {
                redis: connect::redis(&role.redis_url).await?,
                db,
                stream: role.stream,
                name: role.worker,
                kind: role.kind,
            };
            if role.follow {
                // The supervisor's sign that a consumer is ready, as the HTTP one's.
                announce(format_args!("listening {}", role.redis_url));
                return worker.follow(role.count).await;
            }
            let applied = worker.work(role.count).await?;
            println!("applied {applied}");
            Ok(())
        }
        Role::JetStreamWorker(role) => jetstream_worker(db, role).await,
        Role::AmqpWorker(role) => amqp_worker(db, role).await,
        Role::KafkaWorker(role) => kafka_worker(db, role).await,
        Role::Consumer(role) => {
            // A consumer restarted while its database restarts waits for it.
            connect::patiently(connect::RECONNECT_PATIENCE, async || db.connect().await).await?;
            let listener = tokio::net::TcpListener::bind(("127.0.0.1", role.port)).await?;
            // Serves until the parent kills it.
            let until_killed = std::future::pending();
            consumer::serve(
                listener,
                db.config()?,
                role.kind,
                role.faults,
                announce_listening,
                until_killed,
            )
            .await
        }
        Role::ExploreWriter(role) => explore_writer(db, role).await,
        Role::ExploreRelay(role) => explore_relay(db, role).await,
    }
}

/// The AMQP worker role: follows its queue.
async fn amqp_worker(db: &Database, role: AmqpWorkerRole) -> Result<()> {
    // A worker restarted while its database restarts waits for it.
    let pool = consumer::pool(db.config()?, 1)?;
    let pooled =
        connect::patiently(connect::RECONNECT_PATIENCE, async || Ok(pool.get().await?)).await?;
    let mut worker = AmqpWorker::connect(&role.amqp_url, pooled, role.kind).await?;
    // The supervisor's sign that a consumer is ready, as the HTTP one's (no password shown).
    announce(format_args!(
        "listening {}",
        crate::secrets::without_secrets(&role.amqp_url)
    ));
    worker.follow(&role.queue, role.batch).await
}

/// The Kafka worker role: drains its topic once, or follows it.
async fn kafka_worker(db: &Database, role: KafkaWorkerRole) -> Result<()> {
    // A worker restarted while its database restarts waits for it.
    let pool = consumer::pool(db.config()?, 1)?;
    let pooled =
        connect::patiently(connect::RECONNECT_PATIENCE, async || Ok(pool.get().await?)).await?;
    let mut worker = KafkaWorker::connect(&role.kafka_url, pooled, role.kind).await?;
    if role.follow {
        // The supervisor's sign that a consumer is ready, as the HTTP one's (no password shown).
        announce(format_args!(
            "listening {}",
            crate::secrets::without_secrets(&role.kafka_url)
        ));
        return worker.follow(&role.topic, role.batch).await;
    }
    let applied = worker.drain(&role.topic, role.batch).await?;
    println!("applied {applied}");
    Ok(())
}

/// The JetStream worker role: drains its durable consumer once, or follows it.
async fn jetstream_worker(db: &Database, role: JetStreamWorkerRole) -> Result<()> {
    // A worker restarted while its database restarts waits for it (JetStreamWorker::apply).
    let pool = consumer::pool(db.config()?, 1)?;
    let mut worker = JetStreamWorker::connect(
        &role.nats_url,
        &role.stream,
        &role.durable,
        pool,
        role.kind,
        role.follow,
    )
    .await?;
    if role.follow {
        // The supervisor's sign that a consumer is ready, as the HTTP one's (no token shown).
        announce(format_args!(
            "listening {}",
            crate::secrets::without_secrets(&role.nats_url)
        ));
        return worker.follow(role.batch).await;
    }
    let applied = worker.drain(role.batch).await?;
    println!("applied {applied}");
    Ok(())
}

/// The writer role: `orders` orders (or as many as fit in `duration`), paced if asked.
async fn write_orders(db: &Database, role: WriterRole) -> Result<()> {
    let mut client = db.connect().await?;
    let started = Instant::now();
    let until = role.duration.map(|d| started + d);
    for customer_id in 1.. {
        let done = match until {
            Some(until) => Instant::now() >= until,
            None => customer_id > i64::from(role.orders),
        };
        if done {
            break;
        }
        if let Some(interval) = role.interval {
            let at = writer::paced_offset(
                customer_id as u64 - 1,
                interval.as_millis() as u64,
                role.seed,
            );
            tokio::time::sleep_until((started + at).into()).await;
        }
        let order_id = writer::create_order_with_events(
            &mut client,
            customer_id,
            role.events_per_order,
            role.ending,
            role.delete_outbox,
        )
        .await?;
        if role.report_commits {
            phases::committed(order_id);
        }
    }
    Ok(())
}

/// An explore writer connects again at most this often before it gives up (and the
/// supervisor starts another).
const WRITER_RECONNECTS: u32 = 10;

/// Writes the orders not committed yet (a restarted writer retries only those). The outbox
/// writer connects again when its connection is lost (the database restarted, its session was
/// terminated) and goes on with what is not committed yet.
async fn explore_writer(db: &Database, args: ExploreWriterRole) -> Result<()> {
    let customers: Vec<i64> = (1..=i64::from(args.orders)).collect();
    let connect = async || {
        connect::patiently(connect::RECONNECT_PATIENCE, async || {
            db.connect_as(writer::WRITER_APPLICATION_NAME).await
        })
        .await
    };
    let Some((order, sink)) = args.dual_write else {
        let to = match args.insert_sql {
            Some(sql) => writer::EventsTo::Statement(sql),
            None => writer::EventsTo::Outbox,
        };
        for _ in 0..WRITER_RECONNECTS {
            let (mut first, mut second) = (connect().await?, connect().await?);
            let written = async {
                let todo = writer::uncommitted_customers(&first, &customers).await?;
                writer::write_overlapping_pairs(
                    &mut first,
                    &mut second,
                    &todo,
                    args.events_per_order,
                    &to,
                    args.overlap,
                    args.pace,
                    &mut |step| log_line(format_args!("{}", writer::write_step_line(&step))),
                )
                .await
            };
            match written.await {
                Err(e) if connect::lost_connection(&e) => {
                    log_line(format_args!("{}{e:#}", writer::SESSION_LOST))
                }
                written => return written,
            }
        }
        bail!("the writer lost its connection {WRITER_RECONNECTS} times");
    };
    let mut client = connect().await?;
    let todo = writer::uncommitted_customers(&client, &customers).await?;
    let sink = HttpSink::new(&sink)?;
    for customer in todo {
        // The same attempt lines as a relay's, for the history.
        log_line(format_args!("customer={customer} sending"));
        let sent = writer::dual_write(
            &mut client,
            &sink,
            customer,
            Uuid::new_v4(),
            order,
            Ending::Commit,
        )
        .await;
        match sent {
            Ok(_) => log_line(format_args!("customer={customer} sent")),
            Err(e) => {
                log_line(format_args!("customer={customer} failed: {e:#}"));
                // The request failed: end like a crashed request; the restart retries.
                return Err(e.context(format!("order of customer {customer}")));
            }
        }
    }
    Ok(())
}

fn log_line(line: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "[app] {line}");
    let _ = out.flush();
}

/// Resolves once the parent has closed the child's stdin.
async fn stdin_closed() {
    let mut input = Vec::new();
    let _ = tokio::io::stdin().read_to_end(&mut input).await;
}

/// Polls until stdin is closed and nothing is pending, or gives up at the deadline.
async fn explore_relay(db: &Database, role: ExploreRelayRole) -> Result<()> {
    let writer_done = Arc::new(AtomicBool::new(false));
    let flag = writer_done.clone();
    tokio::spawn(async move {
        stdin_closed().await;
        flag.store(true, Ordering::SeqCst);
    });
    let options = role.relay;
    let until = Until::Drained {
        idle: options.config.idle_poll,
        deadline: options.config.deadline,
        once: Some(&writer_done),
    };
    let ended = match role.stored_watermark {
        true => {
            let client =
                connect::patiently(connect::RECONNECT_PATIENCE, async || db.connect().await)
                    .await?;
            let sink = HttpSink::new(&options.sink.url)?;
            let mut relay = StoredWatermarkRelay::new(client, sink, options.name.clone());
            drive(&mut relay, until, std::future::pending()).await?
        }
        false => {
            let config = db.config()?;
            let mut relay = connect::patiently(connect::RECONNECT_PATIENCE, async || {
                options.connect(&config).await
            })
            .await?;
            drive(&mut relay, until, std::future::pending()).await?
        }
    };
    ended.or_gave_up(&options.name).map(drop)
}

/// The child's account for the parent ([`ChildRun::report`](super::ChildRun::report)).
fn report(account: &impl serde::Serialize) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{REPORT_PREFIX}{}", serde_json::to_string(account)?)?;
    out.flush()?;
    Ok(())
}

/// A consumer child prints `listening URL` once it serves; the parent reads that line.
fn announce_listening(addr: std::net::SocketAddr) {
    announce(format_args!("listening http://{addr}"));
}

/// One line on stdout, at once: what the parent waits for.
fn announce(line: std::fmt::Arguments) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}
