//! `outbox-lab compare A B`: two saved runs side by side (before and after a relay change, on
//! two machines), scenario by scenario, metric by metric, with the change from A to B.

use serde_json::Value;

use crate::report::{decimals, Report, Table};

/// One table per scenario of either run, in A's order then B's: its checks, then every metric
/// of either run (A's order, then those only B has).
pub fn compare(a: &[Report], b: &[Report]) -> Vec<Table> {
    let mut names: Vec<&str> = a.iter().map(|r| r.scenario.as_str()).collect();
    for r in b {
        if !names.contains(&r.scenario.as_str()) {
            names.push(&r.scenario);
        }
    }
    names
        .into_iter()
        .map(|name| {
            let find = |run: &'_ [Report]| run.iter().find(|r| r.scenario == name).cloned();
            scenario(name, find(a).as_ref(), find(b).as_ref())
        })
        .collect()
}

fn scenario(name: &str, a: Option<&Report>, b: Option<&Report>) -> Table {
    let mut table = Table::new(name, &["metric", "A", "B", "change"]);
    let passed = |r: Option<&Report>| {
        r.map(|r| Value::from(format!("{}/{}", r.passed_count(), r.checks.len())))
    };
    table.push(row("checks passed", passed(a), passed(b)));
    let met = |r: Option<&Report>| {
        r.filter(|r| !r.targets.is_empty())
            .map(|r| Value::from(format!("{}/{}", r.met_count(), r.targets.len())))
    };
    if a.is_some_and(|r| !r.targets.is_empty()) || b.is_some_and(|r| !r.targets.is_empty()) {
        table.push(row("targets met", met(a), met(b)));
    }
    let mut metrics: Vec<&String> = a
        .iter()
        .flat_map(|r| r.metrics.iter().map(|m| m.0))
        .collect();
    for (metric, _) in b.iter().flat_map(|r| r.metrics.iter()) {
        if !metrics.contains(&metric) {
            metrics.push(metric);
        }
    }
    for metric in metrics {
        let value = |r: Option<&Report>| r.and_then(|r| r.metrics.get(metric)).cloned();
        table.push(row(metric, value(a), value(b)));
    }
    table
}

fn row(metric: &str, a: Option<Value>, b: Option<Value>) -> Vec<String> {
    let show = |v: &Option<Value>| v.as_ref().map(text).unwrap_or_default();
    vec![metric.to_string(), show(&a), show(&b), change(&a, &b)]
}

/// `+12 (+4.1%)` for numbers, `=` when equal, `differs` for other values that differ.
fn change(a: &Option<Value>, b: &Option<Value>) -> String {
    match (a, b) {
        (None, None) => String::new(),
        (Some(_), None) => "only in A".into(),
        (None, Some(_)) => "only in B".into(),
        (Some(a), Some(b)) if a == b => "=".into(),
        (Some(a), Some(b)) => match (a.as_f64(), b.as_f64()) {
            (Some(x), Some(y)) if x != 0.0 => {
                format!("{} ({:+.1}%)", signed(y - x), (y - x) / x.abs() * 100.0)
            }
            (Some(x), Some(y)) => signed(y - x),
            _ => "differs".into(),
        },
    }
}

fn text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Number(n) if n.is_f64() => decimals(n.as_f64().unwrap_or_default(), 3),
        other => other.to_string(),
    }
}

fn signed(delta: f64) -> String {
    let text = decimals(delta, 3);
    if delta > 0.0 {
        format!("+{text}")
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_read_as_deltas() {
        let some = |v: Value| Some(v);
        assert_eq!(change(&some(8.into()), &some(8.into())), "=");
        assert_eq!(change(&some(200.into()), &some(250.into())), "+50 (+25.0%)");
        assert_eq!(
            change(&some(0.5.into()), &some(0.25.into())),
            "-0.25 (-50.0%)"
        );
        assert_eq!(change(&some(0.into()), &some(3.into())), "+3");
        assert_eq!(change(&some("a".into()), &some("b".into())), "differs");
        assert_eq!(change(&some(1.into()), &None), "only in A");
    }
}
