//! One scenario over repeated runs (`scenario --repeat N`): each figure's min / median / max
//! and how many runs passed each check, the user's own way to see how stable a figure is.

use serde::Serialize;

use super::{decimals, CheckResult, Report, Table};
use crate::stats::{median, min_max};

/// One scenario over repeated runs (`--repeat`): each numeric metric's min / median / max, and
/// how many runs passed each check and met each target.
#[derive(Debug, Serialize)]
pub struct Spread {
    scenario: String,
    runs: usize,
    metrics: Vec<MetricSpread>,
    checks: Vec<Held>,
    targets: Vec<Held>,
}

#[derive(Debug, Serialize)]
struct MetricSpread {
    metric: String,
    min: f64,
    median: f64,
    max: f64,
}

/// How often a check (or target) held: `passed` of `runs`.
#[derive(Debug, Serialize)]
struct Held {
    name: String,
    metric: String,
    passed: usize,
    runs: usize,
}

impl Spread {
    /// The same scenario's reports, one per run.
    pub fn over<'a>(reports: impl Iterator<Item = &'a Report>) -> Spread {
        let reports: Vec<&Report> = reports.collect();
        let first = reports[0];
        let metrics = first
            .metrics
            .iter()
            .filter_map(|(name, _)| {
                let values: Vec<f64> = reports
                    .iter()
                    .filter_map(|r| r.metrics.get(name).and_then(serde_json::Value::as_f64))
                    .collect();
                let (min, max) = min_max(&values);
                (!values.is_empty()).then(|| MetricSpread {
                    metric: name.clone(),
                    min,
                    median: median(&values),
                    max,
                })
            })
            .collect();
        let held = |judged: fn(&Report) -> &[CheckResult]| {
            judged(first)
                .iter()
                .enumerate()
                .map(|(i, check)| Held {
                    name: check.name.clone(),
                    metric: check.metric.clone(),
                    passed: reports.iter().filter(|r| judged(r)[i].pass).count(),
                    runs: reports.len(),
                })
                .collect()
        };
        Spread {
            scenario: first.scenario.clone(),
            runs: reports.len(),
            metrics,
            checks: held(|r| r.checks.as_slice()),
            targets: held(|r| r.targets.as_slice()),
        }
    }

    pub fn render_text(&self) -> String {
        let mut figures = Table::new(
            format!("{} over {} runs", self.scenario, self.runs),
            &["metric", "min", "median", "max"],
        );
        for m in &self.metrics {
            figures.push(vec![
                m.metric.clone(),
                decimals(m.min, 3),
                decimals(m.median, 3),
                decimals(m.max, 3),
            ]);
        }
        let mut held = Table::new("", &["runs passed", "metric", "check"]);
        let rows = self.checks.iter().map(|c| (c, "check"));
        for (c, kind) in rows.chain(self.targets.iter().map(|t| (t, "target"))) {
            held.push(vec![
                format!("{} of {}", c.passed, c.runs),
                c.metric.clone(),
                format!("{kind}: {}", c.name),
            ]);
        }
        format!(
            "== {} ==\n\n{}\n\n{}",
            figures.title,
            figures.render(),
            held.render()
        )
    }
}
