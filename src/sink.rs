//! Where senders deliver events: the HTTP consumer, over a keep-alive client.

use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Uri};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;

use crate::event::Event;

/// A delivery that has not been answered in this time counts as failed (and is retried).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// POSTs events as JSON to `<base>/events`; a 2xx answer is a delivery.
#[derive(Clone)]
pub struct HttpSink {
    uri: Uri,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl HttpSink {
    pub fn new(base_url: &str) -> Result<HttpSink> {
        let uri: Uri = format!("{}/events", base_url.trim_end_matches('/'))
            .parse()
            .with_context(|| format!("invalid sink URL '{base_url}'"))?;
        let client = Client::builder(TokioExecutor::new()).build_http();
        Ok(HttpSink { uri, client })
    }

    pub async fn send(&self, event: &Event) -> Result<()> {
        let body = serde_json::to_vec(event)?;
        let request = Request::post(self.uri.clone())
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))?;
        let response = tokio::time::timeout(REQUEST_TIMEOUT, self.client.request(request))
            .await
            .map_err(|_| anyhow!("no answer from {} within {REQUEST_TIMEOUT:?}", self.uri))?
            .map_err(|e| anyhow!("POST {}: {}", self.uri, error_chain(&e)))?;
        let status = response.status();
        // Read the body to the end so the connection can be reused.
        let _ = response.into_body().collect().await;
        if !status.is_success() {
            bail!("HTTP {status}");
        }
        Ok(())
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
