//! Checks: what was measured against what the article reports. A check as a scenario file
//! states it ([`CheckSpec`]) is judged here into the report's [`CheckResult`].

use anyhow::{anyhow, bail, Result};
use evalexpr::{ContextWithMutableVariables, DefaultNumericTypes, HashMapContext, Value};
use serde::Deserialize;

pub use crate::report::CheckResult;
use crate::report::Metrics;

/// An expectation. Bounds are expressions over the parameters and the measured metrics
/// (`events + crash_after`, `without_index.buffers * 0.01`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckSpec {
    /// What the check verifies, in words.
    pub name: String,
    /// The measured metric it judges.
    pub metric: String,
    /// The article's figure, shown beside the measured one.
    pub article: Option<toml::Value>,
    /// Exact: the metric must equal this (figures that do not depend on timing).
    pub equals: Option<String>,
    /// Shape: lower and upper bounds (timing-dependent figures).
    pub at_least: Option<String>,
    pub at_most: Option<String>,
}

impl CheckSpec {
    /// The article's figure as shown beside the measured one.
    pub fn article_text(&self) -> Option<String> {
        self.article.as_ref().map(|figure| match figure {
            toml::Value::String(text) => text.clone(),
            other => other.to_string(),
        })
    }

    /// The names its bounds read (metrics or parameters).
    pub fn names_in_bounds(&self) -> Vec<String> {
        let bounds = [&self.equals, &self.at_least, &self.at_most];
        let trees = bounds
            .into_iter()
            .flatten()
            .filter_map(|expr| evalexpr::build_operator_tree::<DefaultNumericTypes>(expr).ok());
        trees
            .flat_map(|tree| {
                let names: Vec<String> = tree
                    .iter_variable_identifiers()
                    .map(str::to_string)
                    .collect();
                names
            })
            .collect()
    }

    /// Refuses a check without a bound, or with an expression that cannot be read.
    pub fn validate(&self) -> Result<()> {
        match (&self.equals, &self.at_least, &self.at_most) {
            (None, None, None) => bail!("needs equals, at_least or at_most"),
            (Some(_), Some(_), _) | (Some(_), _, Some(_)) => {
                bail!("equals cannot be combined with at_least/at_most")
            }
            _ => {}
        }
        for expr in [&self.equals, &self.at_least, &self.at_most]
            .into_iter()
            .flatten()
        {
            // Some mistakes ("events +") only show on evaluation: try it with every name = 1.
            let tree = evalexpr::build_operator_tree::<DefaultNumericTypes>(expr);
            let mut names = HashMapContext::<DefaultNumericTypes>::new();
            tree.and_then(|tree| {
                for name in tree.iter_variable_identifiers() {
                    names.set_value(name.to_string(), evalexpr::Value::Int(1))?;
                }
                tree.eval_with_context(&names)
            })
            .map_err(|e| anyhow!("cannot read expression '{expr}': {e}"))?;
        }
        Ok(())
    }
}

/// Judges every check against the measured metrics.
pub fn evaluate(
    checks: &[CheckSpec],
    params: &toml::Table,
    metrics: &Metrics,
) -> Result<Vec<CheckResult>> {
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
    Ok(checks
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
