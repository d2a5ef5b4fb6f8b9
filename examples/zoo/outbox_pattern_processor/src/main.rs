//! outbox-lab's zoo entry for outbox-pattern-processor 0.4.0: the library's own loop, unmodified,
//! `OutboxProcessor::init_process` (src/outbox_processor.rs:40-87) over `one_shot_process`
//! (:159-196): lock up to `outbox_query_limit` partition keys (an INSERT into `outbox_lock` with a
//! `processing_until` lease, src/outbox_private_repository.rs:53-82), read the oldest pending row
//! of each locked partition (:24-50), send each with the library's own HTTP gateway
//! (src/http_notification_service.rs:15-81 over src/http_gateway.rs:13-23, reqwest), then in one
//! transaction mark the sent rows processed, count an attempt on the failed ones, and delete the
//! partitions' locks (src/outbox_private_repository.rs:85-104, :129-158, :161-216).
//!
//! Ours: the pool, the settings below, the library's own `Shutdown::signal` (SIGTERM/SIGINT) as
//! its graceful-shutdown future, and one line of wiring for the destination. The library sends
//! each row to the URL written in the row's `destinations` column, while outbox-lab gives each
//! relay its own sink URL (its fault proxy) at start: the writer's rows name the destination
//! `http://zoo-sink/events`, and the adapter sets HTTP_PROXY to OUTBOX_LAB_SINK_URL, which
//! reqwest's default client honours (a plain-HTTP forward proxy: the request reaches outbox-lab's
//! consumer as `POST http://zoo-sink/events`). The library's code path is unchanged. The same goes
//! for its tables: its SQL names them unqualified, and they live in the schema `zoo_opp` (beside
//! outbox-lab's own `outbox`), which the pool's sessions get as their search_path.
//!
//! Settings (command-line arguments, all optional; the library's default in brackets):
//!   --limit N          partitions per pass, with_outbox_query_limit            [50]
//!   --interval-s N     sleep after an empty pass, with_outbox_execution_interval_in_seconds [5]
//!   --in-flight-s N    the partition lock's lease, with_max_in_flight_interval_in_seconds [30]
//!   --timeout-ms N     with_http_timeout_in_millis, only when given           [3000]
//!   --failure-limit N  with_outbox_failure_limit                               [10]
//!   --failure-delay-s N with_delay_for_failure_attempt_in_seconds               [0]
//!   --schema NAME      the PostgreSQL schema of its tables (ours: search_path)  [zoo_opp]
//! Environment (set by outbox-lab verify): OUTBOX_LAB_DATABASE_URL, OUTBOX_LAB_SINK_URL.
use outbox_pattern_processor::outbox_processor::OutboxProcessor;
use outbox_pattern_processor::outbox_resources::OutboxProcessorResources;
use outbox_pattern_processor::shutdown::Shutdown;

fn arg(name: &str) -> Option<String> {
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        if a == name {
            return it.next();
        }
        if let Some(v) = a.strip_prefix(&format!("{name}=")) {
            return Some(v.to_string());
        }
    }
    None
}

fn num(name: &str) -> Option<u64> {
    arg(name).map(|v| v.parse().unwrap_or_else(|_| panic!("{name}: not a number: {v}")))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let db = std::env::var("OUTBOX_LAB_DATABASE_URL").expect("OUTBOX_LAB_DATABASE_URL");
    let sink = std::env::var("OUTBOX_LAB_SINK_URL")
        .or_else(|_| std::env::var("OUTBOX_LAB_HTTP_URL"))
        .expect("OUTBOX_LAB_SINK_URL");
    // The one piece of wiring: this relay's sink as the HTTP proxy of the library's client (read
    // by reqwest when the library builds it), set before any thread reads the environment.
    std::env::set_var("HTTP_PROXY", &sink);
    std::env::set_var("http_proxy", &sink);
    std::env::remove_var("NO_PROXY");
    std::env::remove_var("no_proxy");

    // The library's SQL names its tables `outbox`, `outbox_lock`, `outbox_cleaner_schedule`
    // unqualified, and outbox-lab's own schema already has an `outbox`: the library's tables live
    // in the schema `zoo_opp` (schema.sql), and the relay's sessions find them by search_path.
    let options: sqlx::postgres::PgConnectOptions = db.parse()?;
    let options = options.options([("search_path", arg("--schema").unwrap_or_else(|| "zoo_opp".into()))]);
    let pool = sqlx::postgres::PgPoolOptions::new().max_connections(4).connect_with(options).await?;

    let mut resources = OutboxProcessorResources::new(pool.clone(), None, None);
    if let Some(n) = num("--limit") {
        resources = resources.with_outbox_query_limit(n as u32);
    }
    if let Some(n) = num("--interval-s") {
        resources = resources.with_outbox_execution_interval_in_seconds(n);
    }
    if let Some(n) = num("--in-flight-s") {
        resources = resources.with_max_in_flight_interval_in_seconds(n);
    }
    if let Some(n) = num("--timeout-ms") {
        resources = resources.with_http_timeout_in_millis(n);
    }
    if let Some(n) = num("--failure-limit") {
        resources = resources.with_outbox_failure_limit(n as u32);
    }
    if let Some(n) = num("--failure-delay-s") {
        resources = resources.with_delay_for_failure_attempt_in_seconds(n);
    }

    let res = OutboxProcessor::new(resources)
        .with_graceful_shutdown(Shutdown::signal("zoo-opp-relay: stopping"))
        .init_process()
        .await;
    pool.close().await;
    if let Err(e) = &res {
        eprintln!("zoo-opp-relay: {e}");
        std::process::exit(1);
    }
    Ok(())
}
