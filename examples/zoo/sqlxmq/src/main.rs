//! outbox-lab's zoo entry for sqlxmq 0.6.0: the library's own job runner, unmodified,
//! `JobRegistry::runner(&pool)` (src/registry.rs:117-125) `.run()` (src/runner.rs:262-275): a
//! LISTEN task on the `mq` channel (`start_listener`, :353-375) that wakes `main_loop`
//! (:472-498), which calls `mq_poll` (`poll_and_dispatch`, :399-470;
//! migrations/20220208120856_fix_concurrent_poll.up.sql) and spawns each polled job;
//! `keep_job_alive` (:500-514) pushes the job's `attempt_at` on while it runs, and
//! `CurrentJob::complete` (:151-155) deletes it (`mq_delete`, :122-131).
//!
//! Ours: the one registered job, `zoo_relay`, whose body is the publish function (one HTTP/1.1
//! POST of the job's JSON payload to outbox-lab's sink; a 2xx completes the job, anything else
//! returns an error and leaves it to sqlxmq's retry), the pool, and SIGTERM/SIGINT, which stop the
//! runner as the crate's own `examples/graceful-shutdown.rs` does (`stop`, then
//! `wait_jobs_finish`).
//!
//! The writer spawns the jobs in its own transaction with the statement `JobBuilder::spawn`
//! runs (src/spawn.rs:119-135): see zoo.toml's insert_sql.
//!
//! Settings (command-line arguments, all optional):
//!   --min N --max N    the runner's concurrency (JobRunnerOptions::set_concurrency; the
//!                      library's default is 16 and 32)
//!   --timeout-ms N     one POST's time limit     (default 5000)
//!   --drain-ms N       how long SIGTERM waits for running jobs (default 5000)
//! Environment (set by outbox-lab verify): OUTBOX_LAB_DATABASE_URL, OUTBOX_LAB_SINK_URL.
use std::error::Error;
use std::time::Duration;

use sqlxmq::{job, CurrentJob, JobRegistry};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Where the job body delivers (the registry's context).
#[derive(Clone)]
struct Sink {
    url: String,
    limit: Duration,
}

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

/// The job: deliver its payload (the event, as the writer put it), then complete it. An error
/// leaves the job in `mq_msgs`; sqlxmq polls it again once its backoff has passed.
/// The attributes are the defaults the writer's spawn statement also uses (zoo.toml insert_sql):
/// channel "outbox" (the aggregate id is the channel's argument), ordered, 4 retries, 1 s backoff.
#[job(name = "zoo_relay", channel_name = "outbox", ordered, retries = 4, backoff_secs = 1)]
async fn zoo_relay(mut job: CurrentJob, sink: Sink) -> Result<(), Box<dyn Error + Send + Sync + 'static>> {
    let body = job.raw_json().ok_or("job without a JSON payload")?.to_owned();
    post(&sink.url, body.as_bytes(), sink.limit).await?;
    job.complete().await?;
    Ok(())
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
async fn main() -> Result<(), Box<dyn Error>> {
    let db = std::env::var("OUTBOX_LAB_DATABASE_URL").expect("OUTBOX_LAB_DATABASE_URL");
    let url = std::env::var("OUTBOX_LAB_SINK_URL")
        .or_else(|_| std::env::var("OUTBOX_LAB_HTTP_URL"))
        .expect("OUTBOX_LAB_SINK_URL");
    let sink = Sink { url, limit: Duration::from_millis(num("--timeout-ms", 5000)) };

    // sqlx 0.8 reads outbox-lab's URL as it is: a percent-encoded host starting with '/' is a Unix
    // socket directory, and application_name is a known parameter (both pool and listener use it).
    let pool = sqlx::postgres::PgPoolOptions::new().max_connections(10).connect(&db).await?;

    let mut registry = JobRegistry::new(&[zoo_relay]);
    registry.set_error_handler(|name, e| eprintln!("zoo-sqlxmq-relay: job {name} failed: {e}"));
    registry.set_context(sink);
    let mut runner = registry.runner(&pool);
    if arg("--min").is_some() || arg("--max").is_some() {
        runner.set_concurrency(num("--min", 16) as usize, num("--max", 32) as usize);
    }
    let mut handle = runner.run().await?;

    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    // As examples/graceful-shutdown.rs: stop polling, then let the running jobs finish.
    handle.stop().await;
    handle.wait_jobs_finish(Duration::from_millis(num("--drain-ms", 5000))).await;
    pool.close().await;
    Ok(())
}
