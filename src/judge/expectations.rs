//! Checks: what was measured against what the article reports.

use anyhow::Result;
use evalexpr::{ContextWithMutableVariables, DefaultNumericTypes, HashMapContext, Value};
use serde::{Deserialize, Serialize};

use crate::report::Metrics;
use crate::scenarios::spec::{CheckSpec, Spec};

/// One judged expectation, as it appears in the output and in JSON.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckResult {
    pub name: String,
    pub metric: String,
    pub expected: String,
    pub actual: String,
    /// The article's own figure, where it printed one.
    pub article: Option<String>,
    pub pass: bool,
}

/// Judges every check of the spec against the measured metrics.
pub fn evaluate(spec: &Spec, params: &toml::Table, metrics: &Metrics) -> Result<Vec<CheckResult>> {
    let mut context = HashMapContext::<DefaultNumericTypes>::new();
    for (name, value) in params {
        if let Some(value) = toml_to_value(value) {
            context.set_value(name.clone(), value)?;
        }
    }
    for (name, value) in metrics.iter() {
        if let Some(value) = json_to_value(value) {
            context.set_value(name.clone(), value)?;
        }
    }
    Ok(spec
        .checks
        .iter()
        .map(|check| judge(check, &context, metrics))
        .collect())
}

fn judge(check: &CheckSpec, context: &HashMapContext, metrics: &Metrics) -> CheckResult {
    let eval =
        |expr: &String| evalexpr::eval_with_context(expr, context).map_err(|e| e.to_string());
    let measured = metrics.get(&check.metric).and_then(json_to_value);
    let actual = measured
        .as_ref()
        .map(show)
        .unwrap_or_else(|| "(not measured)".into());
    let article = check.article_text();
    let (expected, pass) = match (&check.equals, &check.at_least, &check.at_most) {
        (Some(expr), _, _) => match eval(expr) {
            Ok(want) => {
                let pass = measured.as_ref().is_some_and(|got| same(got, &want));
                (show(&want), pass)
            }
            Err(e) => (format!("error: {e}"), false),
        },
        (None, low, high) => {
            let low = low.as_ref().map(eval).transpose();
            let high = high.as_ref().map(eval).transpose();
            match (low, high) {
                (Ok(low), Ok(high)) => {
                    let got = measured.as_ref().and_then(number);
                    let above = |b: &Value| number(b).zip(got).is_some_and(|(b, g)| g >= b);
                    let below = |b: &Value| number(b).zip(got).is_some_and(|(b, g)| g <= b);
                    let pass = got.is_some()
                        && low.as_ref().is_none_or(above)
                        && high.as_ref().is_none_or(below);
                    let text = match (&low, &high) {
                        (Some(l), Some(h)) => format!("{} ..= {}", show(l), show(h)),
                        (Some(l), None) => format!(">= {}", show(l)),
                        (None, Some(h)) => format!("<= {}", show(h)),
                        (None, None) => unreachable!("validated on load"),
                    };
                    (text, pass)
                }
                (Err(e), _) | (_, Err(e)) => (format!("error: {e}"), false),
            }
        }
    };
    CheckResult {
        name: check.name.clone(),
        metric: check.metric.clone(),
        expected,
        actual,
        article,
        pass,
    }
}

fn number(value: &Value) -> Option<f64> {
    match value {
        Value::Int(i) => Some(*i as f64),
        Value::Float(f) => Some(*f),
        _ => None,
    }
}

fn same(got: &Value, want: &Value) -> bool {
    match (number(got), number(want)) {
        (Some(g), Some(w)) => (g - w).abs() < 1e-9,
        _ => got == want,
    }
}

fn show(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Float(f) => format!("{}", (f * 1000.0).round() / 1000.0),
        other => other.to_string(),
    }
}

fn toml_to_value(value: &toml::Value) -> Option<Value> {
    match value {
        toml::Value::Integer(i) => Some(Value::Int(*i)),
        toml::Value::Float(f) => Some(Value::Float(*f)),
        toml::Value::String(s) => Some(Value::String(s.clone())),
        toml::Value::Boolean(b) => Some(Value::Boolean(*b)),
        _ => None,
    }
}

fn json_to_value(value: &serde_json::Value) -> Option<Value> {
    match value {
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(i) => Some(Value::Int(i)),
            None => n.as_f64().map(Value::Float),
        },
        serde_json::Value::String(s) => Some(Value::String(s.clone())),
        serde_json::Value::Bool(b) => Some(Value::Boolean(*b)),
        _ => None,
    }
}
