//! outbox-lab's zoo entry for backbone-outbox 3.19.0: the library's own relay loop, unmodified,
//! `runner::run` (src/runner.rs:42-67) over `relay::drain_once` (src/relay.rs:59-128):
//! SELECT unpublished rows (no lock, no transaction) ORDER BY occurred_at, id LIMIT batch, publish
//! each, then `UPDATE ... SET published_at = now() WHERE id = $1 AND published_at IS NULL`.
//!
//! Ours: the publish closure (one HTTP/1.1 POST to outbox-lab's sink, 2xx = delivered, anything
//! else `OutboxError::Publish` so the row stays pending), the pool, and SIGTERM/SIGINT as the
//! runner's `shutdown` future.
//!
//! Settings (command-line arguments, all optional):
//!   --batch N          rows per pass            (RelayConfig::batch, default 50)
//!   --poll-ms N        wait after an under-full pass (RelayConfig::poll_interval, default 100)
//!   --schema NAME      the producer schema       (default "zoo")
//!   --timeout-ms N     one POST's time limit     (default 5000)
//! Environment (set by outbox-lab verify): OUTBOX_LAB_DATABASE_URL, OUTBOX_LAB_SINK_URL.
use std::time::Duration;

use backbone_outbox::runner::{run, RelayConfig};
use backbone_outbox::{OutboxError, OutboxRecord};
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
async fn main() -> Result<(), OutboxError> {
    let db = std::env::var("OUTBOX_LAB_DATABASE_URL").expect("OUTBOX_LAB_DATABASE_URL");
    let sink = std::env::var("OUTBOX_LAB_SINK_URL")
        .or_else(|_| std::env::var("OUTBOX_LAB_HTTP_URL"))
        .expect("OUTBOX_LAB_SINK_URL");
    let limit = Duration::from_millis(num("--timeout-ms", 5000));
    let cfg = RelayConfig {
        schema: arg("--schema").unwrap_or_else(|| "zoo".into()),
        batch: num("--batch", 50) as i64,
        poll_interval: Duration::from_millis(num("--poll-ms", 100)),
    };

    // sqlx 0.8 reads outbox-lab's URL as it is: a percent-encoded host starting with '/' is a Unix
    // socket directory (sqlx-postgres src/options/parse.rs), and application_name is a known parameter.
    let pool = sqlx::postgres::PgPoolOptions::new().max_connections(2).connect(&db).await?;

    let publish = move |rec: OutboxRecord| {
        let sink = sink.clone();
        async move {
            let body = serde_json::json!({
                "event_id": rec.id, "aggregate_id": rec.aggregate_id,
                "aggregate_type": rec.aggregate_type, "event_type": rec.event_type,
                "payload": rec.payload,
            });
            post(&sink, body.to_string().as_bytes(), limit).await.map_err(OutboxError::Publish)
        }
    };

    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    let shutdown = async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    };
    // `run` returns Ok when `shutdown` resolves, and Err on a database error (the library's own
    // `supervise` would restart it after 1..60 s; under verify the process exits non-zero and
    // verify's supervisor restarts it, which is quicker and is what a deployment's does).
    let res = run(pool.clone(), cfg, publish, shutdown).await;
    pool.close().await;
    if let Err(e) = &res {
        eprintln!("zoo-backbone-relay: {e}");
    }
    res
}
