//! Delivery latency as the article measures it: the consumer's `received_at` minus the outbox
//! row's `created_at` (one server clock for both), summarised with an HDR histogram.

use anyhow::Result;
use hdrhistogram::Histogram;
use tokio_postgres::Client;

use crate::judge::counts;
use crate::stats::median;

/// Latencies are recorded in microseconds, up to a minute, to 3 significant digits.
const HISTOGRAM_MAX_US: u64 = 60_000_000;

/// The windows a run's latencies are cut into for the windowed p95: consecutive runs of
/// deliveries, in receipt order. A whole-machine stall (a second or so on a busy 2-core machine)
/// delays the deliveries of one window, two if it straddles them; the median of five is the
/// third best, which that stall does not reach.
pub const WINDOWS: usize = 5;

/// The distribution of one run's deliveries.
#[derive(Debug, Clone)]
pub struct LatencySummary {
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// The median over the [`WINDOWS`] windows of each window's p95: the worst case of the
    /// relay's way of waking up, rather than what one stall of the machine did to a few
    /// deliveries. (The median needs no windows: a stall delays too few deliveries to move it
    /// far, and a window's median varies more than the median of all.)
    pub windowed_p95_ms: f64,
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
pub fn summarise(mut each_ms: Vec<(i64, f64)>) -> Result<LatencySummary> {
    // The windows follow the deliveries in receipt order, whatever order they came in.
    each_ms.sort_by_key(|&(seq, _)| seq);
    let all = histogram(&each_ms)?;
    let window_len = each_ms.len().div_ceil(WINDOWS).max(1);
    let windows = each_ms
        .chunks(window_len)
        .map(histogram)
        .collect::<Result<Vec<_>>>()?;
    let window_p95s: Vec<f64> = windows
        .iter()
        .map(|window| ms(window.value_at_quantile(0.95)))
        .collect();
    Ok(LatencySummary {
        p50_ms: ms(all.value_at_quantile(0.5)),
        p95_ms: ms(all.value_at_quantile(0.95)),
        p99_ms: ms(all.value_at_quantile(0.99)),
        max_ms: ms(all.max()),
        windowed_p95_ms: median(&window_p95s),
        samples: all.len(),
        each_ms,
    })
}

fn histogram(each_ms: &[(i64, f64)]) -> Result<Histogram<u64>> {
    let mut histogram = Histogram::<u64>::new_with_bounds(1, HISTOGRAM_MAX_US, 3)?;
    for (_, latency_ms) in each_ms {
        histogram.saturating_record((latency_ms * 1000.0).round().max(1.0) as u64);
    }
    Ok(histogram)
}

/// Microseconds as milliseconds, to the hundredth.
fn ms(us: u64) -> f64 {
    (us as f64 / 10.0).round() / 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One stall that delays a window's deliveries shows in the p95 of all samples, not in the
    /// windowed p95 (nor much in the median); a relay slow throughout shows in both.
    #[test]
    fn a_stall_in_one_window_does_not_move_the_windowed_figures() {
        let steady: Vec<(i64, f64)> = (0..50).map(|seq| (seq, (seq % 10) as f64 * 10.0)).collect();
        let mut stalled = steady.clone();
        for (_, latency_ms) in &mut stalled[10..14] {
            *latency_ms += 1000.0;
        }
        let (steady, stalled) = (summarise(steady).unwrap(), summarise(stalled).unwrap());
        assert!(stalled.p95_ms > 1000.0);
        assert_eq!(stalled.windowed_p95_ms, steady.windowed_p95_ms);
        assert!(stalled.p50_ms - steady.p50_ms <= 10.0);

        let slow: Vec<(i64, f64)> = (0..50).map(|seq| (seq, 1000.0 + seq as f64)).collect();
        assert!(summarise(slow).unwrap().windowed_p95_ms > 1000.0);
    }
}
