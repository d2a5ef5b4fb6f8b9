//! Preparing a run before anything starts: a scenario's file read, the command line's
//! parameters applied over it and typed into its `Params`, the checks it can judge kept (a
//! misspelt name refused, one these parameters leave out noted).

use std::future::Future;
use std::path::Path;
use std::pin::Pin;

use anyhow::{bail, Result};

use super::{Ctx, Experiment, Outcome, Scenario};
use crate::scenarios::spec::Spec;

/// Parameters given on the command line, over the scenario file's defaults.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    /// `--quick`: apply the scenario file's `[quick]` table (a shorter run, for tests).
    pub quick: bool,
    /// `--set name=value`, `--events N`, ...
    pub values: Vec<(String, toml::Value)>,
    /// With `scenario all`, a value applies to the scenarios that have the parameter; alone, a
    /// scenario without it is an error.
    pub strict: bool,
}

/// A scenario with its file read and its parameters checked, ready to run.
pub struct Prepared {
    pub(super) scenario: Scenario,
    pub(super) spec: Spec,
    pub(super) params: toml::Table,
    pub(super) typed: Box<dyn Ready>,
    /// Checks of the file these parameters cannot judge, in words (the run's notes).
    pub(super) left_out: Vec<String>,
}

/// A scenario's typed and validated `Params`, behind a pointer: the experiment, ready to run.
pub(super) trait Ready {
    fn metrics(&self) -> Vec<String>;

    fn start<'a>(&'a self, ctx: &'a Ctx<'a>)
        -> Pin<Box<dyn Future<Output = Result<Outcome>> + 'a>>;
}

impl<P: Experiment> Ready for P {
    fn metrics(&self) -> Vec<String> {
        Experiment::metrics(self)
    }

    fn start<'a>(
        &'a self,
        ctx: &'a Ctx<'a>,
    ) -> Pin<Box<dyn Future<Output = Result<Outcome>> + 'a>> {
        Box::pin(self.run(ctx))
    }
}

/// The registry's `prepare` of a scenario whose parameters are `P`.
pub(super) fn prepare_as<P: Experiment>(
    spec: &Spec,
    params: &toml::Table,
) -> Result<Box<dyn Ready>> {
    let typed: P = spec.params(params)?;
    typed.validate()?;
    Ok(Box::new(typed))
}

/// The registry's `fits` of a scenario whose parameters are `P`.
pub(super) fn fits_as<P: Experiment>(params: &toml::Table) -> Result<(), String> {
    toml::Value::Table(params.clone())
        .try_into::<P>()
        .map(drop)
        .map_err(|e| e.message().trim().to_string())
}

/// Reads the file and validates the parameters before anything is started.
pub fn prepare(scenario: Scenario, dir: Option<&Path>, overrides: &Overrides) -> Result<Prepared> {
    let spec = scenario.spec(dir)?;
    let mut params = spec.params.clone();
    if overrides.quick {
        params.extend(spec.quick.clone());
    }
    let defaults = params.clone();
    for (key, value) in &overrides.values {
        match params.get_mut(key) {
            Some(slot) => {
                *slot = value.clone();
                // A value of the wrong type is the command line's fault (when the file's own
                // defaults fit): say which value, and what the scenario expected.
                let mut one = defaults.clone();
                one.insert(key.clone(), value.clone());
                if let (Ok(()), Err(e)) = ((scenario.0.fits)(&defaults), (scenario.0.fits)(&one)) {
                    let given = match value {
                        toml::Value::String(text) => text.clone(),
                        other => other.to_string(),
                    };
                    bail!(
                        "--set {key}={given} does not fit scenario {}: {e} (its default: {key} = {})",
                        scenario.name(),
                        defaults[key]
                    )
                }
            }
            None if overrides.strict => {
                let known: Vec<&String> = spec.params.keys().collect();
                bail!(
                    "scenario {} has no parameter {key} (its parameters: {known:?})",
                    scenario.name()
                )
            }
            None => {}
        }
    }
    let typed = (scenario.0.prepare)(&spec, &params)?;
    let measured = typed.metrics();
    let measured_by_default = match (scenario.0.prepare)(&spec, &defaults) {
        Ok(by_default) => by_default.metrics(),
        Err(_) => measured.clone(),
    };
    let mut spec = spec;
    let left_out = judgeable(
        scenario,
        &mut spec,
        &params,
        &measured,
        &measured_by_default,
    )?;
    Ok(Prepared {
        scenario,
        spec,
        params,
        typed,
        left_out,
    })
}

/// Keeps the checks and targets this run can judge. One naming a metric (or, in its bounds, a
/// name) that is neither reported by this run nor a parameter is refused before anything runs,
/// unless the file's own parameters would report it: then it is these parameters that leave it
/// out (`--set batch_sizes=[1,100]` measures no batch 1000), and it is set aside with a note,
/// returned. A misspelt name would otherwise be found only after the whole run.
fn judgeable(
    scenario: Scenario,
    spec: &mut Spec,
    params: &toml::Table,
    measured: &[String],
    measured_by_default: &[String],
) -> Result<Vec<String>> {
    let known = |metrics: &[String], name: &str| {
        metrics.iter().any(|m| m == name) || params.contains_key(name)
    };
    let mut left_out = Vec::new();
    for (kind, judged) in [("check", &mut spec.checks), ("target", &mut spec.targets)] {
        let mut kept = Vec::new();
        for check in std::mem::take(judged) {
            let names = std::iter::once(check.metric.clone()).chain(check.names_in_bounds());
            let Some(name) = names.into_iter().find(|name| !known(measured, name)) else {
                kept.push(check);
                continue;
            };
            if known(measured_by_default, &name) {
                left_out.push(format!(
                    "{kind} '{}' not judged: these parameters do not measure {name}",
                    check.name
                ));
                continue;
            }
            let mut near: Vec<&str> = measured
                .iter()
                .map(String::as_str)
                .filter(|m| m.split('.').next() == name.split('.').next())
                .collect();
            if near.is_empty() {
                near = measured.iter().map(String::as_str).collect();
            }
            bail!(
                "{}: {kind} '{}' names '{name}', which scenario {} does not report (its metrics: {})",
                spec.source,
                check.name,
                scenario.name(),
                near.join(", ")
            );
        }
        *judged = kept;
    }
    Ok(left_out)
}

/// Prepares every scenario of a run ([`prepare`]) before anything starts. A parameter that
/// none of them has is refused (with `scenario all`, a value applies only to the scenarios that
/// have it, so a misspelt name would otherwise be ignored).
pub fn prepare_all(
    selected: &[Scenario],
    dir: Option<&Path>,
    overrides: &Overrides,
) -> Result<Vec<Prepared>> {
    let prepared = selected
        .iter()
        .map(|s| prepare(*s, dir, overrides))
        .collect::<Result<Vec<_>>>()?;
    let has = |key: &String| prepared.iter().any(|p| p.spec.params.contains_key(key));
    if let Some((key, _)) = overrides.values.iter().find(|(key, _)| !has(key)) {
        let mut known: Vec<&str> = prepared
            .iter()
            .flat_map(|p| p.spec.params.keys().map(String::as_str))
            .collect();
        known.sort_unstable();
        known.dedup();
        bail!(
            "no scenario of this run has a parameter {key}: check its spelling (the parameters: {})",
            known.join(", ")
        );
    }
    Ok(prepared)
}

impl Prepared {
    pub fn scenario(&self) -> Scenario {
        self.scenario
    }

    /// Whether `scenario all` may run it beside others ([`Spec::side_by_side`]).
    pub fn side_by_side(&self) -> bool {
        self.spec.side_by_side
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every line of the registry has a distinct name, a scenario file naming it, and defaults
    /// (quick or not) that its `Params` read and validate.
    #[test]
    fn every_scenario_prepares_from_its_builtin_file() {
        let mut names: Vec<&str> = Scenario::ALL.iter().map(|s| s.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), Scenario::ALL.len(), "a name is listed twice");
        for &scenario in Scenario::ALL {
            for quick in [false, true] {
                let overrides = Overrides {
                    quick,
                    ..Overrides::default()
                };
                let prepared = prepare(scenario, None, &overrides)
                    .unwrap_or_else(|e| panic!("{}: {e:#}", scenario.name()));
                assert_eq!(prepared.scenario(), scenario);
                assert_eq!(Scenario::from_name(scenario.name()).unwrap(), scenario);
            }
        }
    }

    /// A scenario run side by side with others judges no duration or rate by an upper bound
    /// (a busy machine only lengthens them) and no rate by a lower one: its verdict cannot
    /// depend on its neighbours.
    #[test]
    fn side_by_side_scenarios_judge_no_time() {
        let timed = |name: &str| {
            ["_ms", "_per_s", "of_ceiling", "_xacts"]
                .iter()
                .any(|unit| name.ends_with(unit))
        };
        let mut side_by_side = 0;
        for &scenario in Scenario::ALL {
            let spec = scenario.spec(None).unwrap();
            if !spec.side_by_side {
                continue;
            }
            side_by_side += 1;
            for check in spec.checks.iter().chain(&spec.targets) {
                let reads_time = check.equals.is_some() && timed(&check.metric)
                    || check.at_most.is_some() && timed(&check.metric)
                    || check.at_least.is_some() && check.metric.ends_with("_per_s")
                    || check.names_in_bounds().iter().any(|name| timed(name));
                assert!(
                    !reads_time,
                    "{} runs side by side but '{}' judges a time",
                    scenario.name(),
                    check.name
                );
            }
        }
        assert!(side_by_side > 0, "no scenario runs side by side");
    }
}
