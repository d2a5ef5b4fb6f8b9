//! outbox-lab's zoo entry for distributed 4.12.3: the library's own drain loop, unmodified,
//! `OutboxDrainRunner::run` (src/outbox_worker/drain.rs:158-204) over
//! `OutboxDispatcher::dispatch_batch` (src/outbox_worker/outbox_dispatch.rs:230-240) and
//! `publish_and_settle` (:351-401), on the library's Postgres outbox store
//! (`PostgresOutboxStore`): a claim that commits a lease (`FOR UPDATE SKIP LOCKED`, then
//! `status = 'in_flight'`, `claimed_by`, `claimed_until`, `attempts + 1`;
//! src/postgres_repo/mod.rs:223-314), publish, then a completion fenced by worker, attempt and an
//! unexpired lease (src/sqlx_repo/repo/outbox.rs:143-217).
//!
//! Ours: the `MessagePublisher` (one HTTP/1.1 POST of the message's payload, the event as the
//! writer put it, to outbox-lab's sink; a 2xx is `Ok`, anything else a retryable
//! `TransportError`, so the library releases the row or, at the attempt ceiling, fails it), the
//! pool, and SIGTERM/SIGINT as the runner's shutdown future.
//!
//! The dispatcher is built as the library's README builds its worker ("Publishing the Outbox":
//! `OutboxDispatcher::new(repo.outbox_store(), publisher, worker id, lease, max attempts)`), with
//! the drain's own worker id (`drain_worker_id()`, "drain:<pid>"), and handed to
//! `OutboxDrainRunner::new`.
//!
//! Settings (command-line arguments, all optional; the library's default in brackets):
//!   --lease-s N        the claim lease (README example 30 s, DEFAULT_DRAIN_LEASE 30 s)  [30]
//!   --max-attempts N   publish attempts before a row is failed (README example 5)      [5]
//!   --batch N          rows per pass (DEFAULT_DRAIN_BATCH_SIZE)                         [32]
//!   --poll-ms N        sleep after an under-full pass (DEFAULT_DRAIN_POLL_INTERVAL)     [1000]
//!   --timeout-ms N     one POST's time limit (ours)                                      [5000]
//! Environment (set by outbox-lab verify): OUTBOX_LAB_DATABASE_URL, OUTBOX_LAB_SINK_URL.
use std::time::Duration;

use distributed::bus::{Message, MessagePublisher, TransportError};
use distributed::{drain_worker_id, OutboxDispatcher, OutboxDrainRunner, PostgresOutboxStore};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// POST one JSON body to `http://host:port/path`; Ok on a 2xx status line.
async fn post(url: &str, body: &[u8], limit: Duration) -> Result<(), String> {
    let rest = url.strip_prefix("http://").ok_or("only http:// sinks")?;
    let (hostport, path) = match rest.split_once('/') {
        Some((h, p)) => (h, format!("/{p}")),
        None => (rest, "/".to_string()),
    };
    let io = async {
        let mut s = tokio::net::TcpStream::connect(hostport).await?;
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {hostport}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        s.write_all(head.as_bytes()).await?;
        s.write_all(body).await?;
        let mut resp = Vec::new();
        s.read_to_end(&mut resp).await?;
        Ok::<_, std::io::Error>(resp)
    };
    let resp = tokio::time::timeout(limit, io)
        .await
        .map_err(|_| "timeout".to_string())?
        .map_err(|e| e.to_string())?;
    let line = String::from_utf8_lossy(&resp[..resp.len().min(12)]).to_string();
    // "HTTP/1.x 2xx"
    if line.len() >= 10 && line.starts_with("HTTP/1.") && line.as_bytes()[9] == b'2' {
        Ok(())
    } else {
        Err(format!("sink answered {line:?}"))
    }
}

/// The publish function: the transport seam the library leaves to its user.
struct SinkPublisher {
    url: String,
    limit: Duration,
}

impl MessagePublisher for SinkPublisher {
    async fn publish(&self, message: Message) -> Result<(), TransportError> {
        post(&self.url, &message.payload, self.limit).await.map_err(TransportError::retryable)
    }
}

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

fn num(name: &str, default: u64) -> u64 {
    arg(name).map(|v| v.parse().unwrap_or_else(|_| panic!("{name}: not a number: {v}"))).unwrap_or(default)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let db = std::env::var("OUTBOX_LAB_DATABASE_URL").expect("OUTBOX_LAB_DATABASE_URL");
    let url = std::env::var("OUTBOX_LAB_SINK_URL")
        .or_else(|_| std::env::var("OUTBOX_LAB_HTTP_URL"))
        .expect("OUTBOX_LAB_SINK_URL");
    let publisher = SinkPublisher { url, limit: Duration::from_millis(num("--timeout-ms", 5000)) };

    let pool = sqlx::postgres::PgPoolOptions::new().max_connections(2).connect(&db).await?;
    let store = PostgresOutboxStore::new(pool.clone());
    let dispatcher = OutboxDispatcher::new(
        store,
        publisher,
        drain_worker_id(),
        Duration::from_secs(num("--lease-s", 30)),
        num("--max-attempts", 5) as u32,
    );
    let runner = OutboxDrainRunner::new(dispatcher)
        .with_batch_size(num("--batch", 32) as usize)
        .with_poll_interval(Duration::from_millis(num("--poll-ms", 1000)));

    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let shutdown = async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    };
    // `run` returns Ok when `shutdown` resolves; store errors back off inside it, they never end it.
    let res = runner.run(shutdown).await;
    pool.close().await;
    if let Err(e) = res {
        eprintln!("zoo-distributed-relay: {e}");
        std::process::exit(1);
    }
    Ok(())
}
