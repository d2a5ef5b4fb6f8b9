//! Delivery latency as the article measures it: the consumer's `received_at` minus the outbox
//! row's `created_at` (one server clock for both), summarised with an HDR histogram.

use anyhow::Result;
use hdrhistogram::Histogram;
use tokio_postgres::Client;

use crate::judge::counts;

/// Latencies are recorded in microseconds, up to a minute, to 3 significant digits.
const HISTOGRAM_MAX_US: u64 = 60_000_000;

/// The distribution of one run's deliveries.
#[derive(Debug, Clone)]
pub struct LatencySummary {
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub samples: u64,
    /// Every delivery's latency, by receipt `seq`, for tables and plots.
    pub each_ms: Vec<(i64, f64)>,
}

/// Every delivery the consumer received in this database.
pub async fn measure(client: &Client) -> Result<LatencySummary> {
    let rows = client.query(counts::LATENCIES_MS, &[]).await?;
    summarise(
        rows.iter()
            .map(|row| (row.get("seq"), row.get("latency_ms")))
            .collect(),
    )
}

/// The distribution of latencies measured some other way (by receipt `seq`, in ms). A latency
/// under a microsecond counts as one (a phase can even be negative: the histogram's floor).
pub fn summarise(each_ms: Vec<(i64, f64)>) -> Result<LatencySummary> {
    let mut histogram = Histogram::<u64>::new_with_bounds(1, HISTOGRAM_MAX_US, 3)?;
    for (_, latency_ms) in &each_ms {
        histogram.saturating_record((latency_ms * 1000.0).round().max(1.0) as u64);
    }
    let ms = |us: u64| (us as f64 / 10.0).round() / 100.0;
    Ok(LatencySummary {
        p50_ms: ms(histogram.value_at_quantile(0.5)),
        p95_ms: ms(histogram.value_at_quantile(0.95)),
        p99_ms: ms(histogram.value_at_quantile(0.99)),
        max_ms: ms(histogram.max()),
        samples: histogram.len(),
        each_ms,
    })
}
