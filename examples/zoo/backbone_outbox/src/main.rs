//! backbone-outbox 3.19.0's own relay loop, `runner::run` (src/runner.rs:42) over
//! `relay::drain_once` (src/relay.rs:59): SELECT unpublished (no lock) ORDER BY occurred_at, id,
//! publish each, `UPDATE ... SET published_at = now() WHERE id = $1 AND published_at IS NULL`.
//! Ours: the publish closure (one HTTP/1.1 POST to outbox-lab's sink) and SIGTERM.
use std::time::Duration;

use backbone_outbox::runner::{run, RelayConfig};
use backbone_outbox::{OutboxError, OutboxRecord};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// POST one JSON body to `http://host:port/path`; Ok on a 2xx status line.
async fn post(url: &str, body: &[u8]) -> Result<(), String> {
    let rest = url.strip_prefix("http://").ok_or("only http:// sinks")?;
    let (hostport, path) = rest.split_once('/').map(|(h, p)| (h, format!("/{p}"))).unwrap_or((rest, "/".into()));
    let io = async {
        let mut s = tokio::net::TcpStream::connect(hostport).await?;
        let head = format!("POST {path} HTTP/1.1\r\nHost: {hostport}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
        s.write_all(head.as_bytes()).await?;
        s.write_all(body).await?;
        let mut resp = Vec::new();
        s.read_to_end(&mut resp).await?;
        Ok::<_, std::io::Error>(resp)
    };
    let resp = tokio::time::timeout(Duration::from_secs(2), io).await.map_err(|_| "timeout".to_string())?.map_err(|e| e.to_string())?;
    let status = String::from_utf8_lossy(&resp[..resp.len().min(12)]).to_string();
    if status.starts_with("HTTP/1.1 2") || status.starts_with("HTTP/1.0 2") { Ok(()) } else { Err(format!("sink answered {status}")) }
}

#[tokio::main]
async fn main() -> Result<(), OutboxError> {
    let db = std::env::var("OUTBOX_LAB_DATABASE_URL").expect("OUTBOX_LAB_DATABASE_URL");
    let sink = std::env::var("OUTBOX_LAB_HTTP_URL").expect("OUTBOX_LAB_HTTP_URL");
    let pool = sqlx::postgres::PgPoolOptions::new().max_connections(2).connect(&db).await?;
    let publish = move |rec: OutboxRecord| {
        let sink = sink.clone();
        async move {
            let body = serde_json::json!({
                "event_id": rec.id, "aggregate_id": rec.aggregate_id,
                "aggregate_type": rec.aggregate_type, "event_type": rec.event_type, "payload": rec.payload,
            });
            post(&sink, body.to_string().as_bytes()).await.map_err(OutboxError::Publish)
        }
    };
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).unwrap();
    let shutdown = async move { term.recv().await; };
    let cfg = RelayConfig { schema: "zoo".into(), batch: 50, poll_interval: Duration::from_millis(100) };
    // `run` returns Err on a database error (the library's `supervise` would restart it after 1..60 s;
    // under verify the process exits non-zero and verify restarts it).
    run(pool, cfg, publish, shutdown).await
}
