//! The HTTP sink: POSTs to the outbox-lab consumer over a keep-alive client, one event per
//! request as the article posts them, or a batch per request ([`HttpBody`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Uri};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use tokio::sync::Semaphore;

use super::{all_delivered, all_failed, SinkOptions, DEFAULT_REQUEST_TIMEOUT};
use crate::outbox::event::Event;

/// What an HTTP request carries (`relay --http-body`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
pub enum HttpBody {
    /// One event, as the article's relay posts them: the consumer commits once per event.
    Event,
    /// The batch as a JSON array, in batch order: the consumer applies it in one transaction
    /// (idempotent per event) and the answer covers every event in it.
    Array,
}

/// POSTs events as JSON to `<base>/events`, one per request or a batch as an array
/// ([`HttpBody`]); a 2xx answer is a delivery of everything the request carried.
#[derive(Clone)]
pub struct HttpSink {
    /// Read by [`check_url`](super::check_url): a URL without a host is refused.
    pub(super) uri: Uri,
    client: Client<HttpConnector, Full<Bytes>>,
    in_flight: usize,
    body: HttpBody,
    request_timeout: Duration,
}

impl HttpSink {
    pub fn new(base_url: &str) -> Result<HttpSink> {
        let uri: Uri = format!("{}/events", base_url.trim_end_matches('/'))
            .parse()
            .with_context(|| format!("invalid sink URL '{}'", crate::secrets::redact(base_url)))?;
        let mut connector = HttpConnector::new();
        // Each request goes out at once, not held back by Nagle for an earlier segment's ACK.
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Ok(HttpSink {
            uri,
            client,
            in_flight: 1,
            body: HttpBody::Event,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
        })
    }

    /// The sink `options` describe; nothing connects before the first request.
    pub(super) fn with_options(options: &SinkOptions, request_timeout: Duration) -> Result<Self> {
        Ok(HttpSink {
            in_flight: options.in_flight.max(1),
            body: options.http_body,
            request_timeout,
            ..HttpSink::new(&options.url)?
        })
    }

    /// Where it POSTs, its password masked: for messages, log lines and `last_error`.
    fn shown_uri(&self) -> String {
        crate::secrets::redact(&self.uri.to_string())
    }

    pub async fn send(&self, event: &Event) -> Result<()> {
        self.post(serde_json::to_vec(event)?).await
    }

    /// POSTs a JSON body; Ok on a 2xx answer.
    async fn post(&self, body: Vec<u8>) -> Result<()> {
        let request = Request::post(self.uri.clone())
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))?;
        let response = tokio::time::timeout(self.request_timeout, self.client.request(request))
            .await
            .map_err(|_| {
                anyhow!(
                    "no answer from {} within {:?}",
                    self.shown_uri(),
                    self.request_timeout
                )
            })?
            .map_err(|e| anyhow!("POST {}: {}", self.shown_uri(), error_chain(&e)))?;
        let status = response.status();
        // Read the body to the end so the connection can be reused.
        let _ = response.into_body().collect().await;
        if !status.is_success() {
            bail!("HTTP {status}");
        }
        Ok(())
    }

    /// The batch in one request (an array body): delivered or failed as a whole. Otherwise one
    /// event after another; or, with `in_flight` > 1, aggregates side by side and each
    /// aggregate's events still one after another, so per-aggregate order holds.
    pub(super) async fn deliver(
        &self,
        events: &[Event],
        on_delivered: impl Fn(&Event),
    ) -> Vec<Result<()>> {
        if self.body == HttpBody::Array {
            let sent = match serde_json::to_vec(events) {
                Ok(body) => self.post(body).await,
                Err(e) => Err(e.into()),
            };
            return match sent {
                Ok(()) => all_delivered(events, on_delivered),
                Err(e) => all_failed(events, &format!("{e:#}")),
            };
        }
        if self.in_flight <= 1 {
            let mut results = Vec::with_capacity(events.len());
            for event in events {
                let result = self.send(event).await;
                if result.is_ok() {
                    on_delivered(event);
                }
                results.push(result);
            }
            return results;
        }
        let mut by_aggregate: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, event) in events.iter().enumerate() {
            by_aggregate
                .entry(event.aggregate_id.as_str())
                .or_default()
                .push(i);
        }
        let permits = Arc::new(Semaphore::new(self.in_flight));
        let mut tasks = tokio::task::JoinSet::new();
        for indexes in by_aggregate.into_values() {
            let sink = self.clone();
            let permits = permits.clone();
            let group: Vec<(usize, Event)> = indexes
                .into_iter()
                .map(|i| (i, events[i].clone()))
                .collect();
            tasks.spawn(async move {
                let _permit = permits.acquire_owned().await.expect("never closed");
                let mut results = Vec::with_capacity(group.len());
                for (i, event) in group {
                    results.push((i, sink.send(&event).await));
                }
                results
            });
        }
        let mut results: Vec<Option<Result<()>>> = events.iter().map(|_| None).collect();
        while let Some(done) = tasks.join_next().await {
            for (i, result) in done.unwrap_or_default() {
                if result.is_ok() {
                    on_delivered(&events[i]);
                }
                results[i] = Some(result);
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(anyhow!("delivery task failed"))))
            .collect()
    }
}

/// "client error (Connect): tcp connect error: Connection refused (os error 111)".
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
