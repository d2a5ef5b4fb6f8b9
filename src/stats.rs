//! The statistics of a figure measured in several rounds: its median and its spread; and how a
//! figure is rounded for the table.

/// The median of a figure measured in several rounds (0 for none): one slow round on a shared
/// machine does not move it.
pub fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// The smallest and the largest of a figure's rounds (infinite for none): how far they spread
/// around the median.
pub fn min_max(values: &[f64]) -> (f64, f64) {
    values
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &v| {
            (lo.min(v), hi.max(v))
        })
}

/// Milliseconds to 0.1 ms.
pub fn round_ms(ms: f64) -> f64 {
    round_to(ms, 10.0)
}

/// `value` to the nearest 1 / `steps_per_unit`.
pub fn round_to(value: f64, steps_per_unit: f64) -> f64 {
    (value * steps_per_unit).round() / steps_per_unit
}
