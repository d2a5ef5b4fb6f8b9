//! Scenario files (`scenarios/NAME.toml`): a scenario's parameters and the article's figures,
//! as data. The copies in the repository are built into the binary; `--scenarios-dir` reads
//! them from a directory instead, so a user can change a parameter or an expectation.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use serde::Deserialize;

use crate::judge::expectations::CheckSpec;

/// One scenario file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    pub name: String,
    /// The article's section the scenario reproduces (Japanese, as in the article).
    pub section: String,
    /// One line for `outbox-lab list`.
    pub summary: String,
    /// No check or target of it reads a duration with an upper bound or counts what happens
    /// within a window of time, and nothing it measures depends on its neighbours (it shares
    /// the server and the brokers with them, under names of its own, but not the server's
    /// transaction horizon or its WAL): `scenario all` runs it side by side with the others
    /// like it. The others run one at a time after them, the machine theirs alone.
    #[serde(default)]
    pub side_by_side: bool,
    /// Defaults of the scenario's parameters; some can be overridden on the command line.
    #[serde(default)]
    pub params: toml::Table,
    /// Parameters for `--quick`: a shorter run of the same experiment (tests use it).
    #[serde(default)]
    pub quick: toml::Table,
    /// What the article reports, compared with what was measured.
    #[serde(default, rename = "check")]
    pub checks: Vec<CheckSpec>,
    /// outbox-lab's own speed targets: judged like checks and shown apart (MET / MISSED); they
    /// decide the exit status only with `--strict-targets`.
    #[serde(default, rename = "target")]
    pub targets: Vec<CheckSpec>,
    /// Where it was read from, for error messages.
    #[serde(skip)]
    pub source: String,
}

impl Spec {
    /// Reads `NAME.toml` from `dir`, or the built-in copy.
    pub fn load(name: &str, builtin: &str, dir: Option<&Path>) -> Result<Spec> {
        let (source, text) = match dir {
            Some(dir) => {
                let path: PathBuf = dir.join(format!("{name}.toml"));
                let text = std::fs::read_to_string(&path)
                    .with_context(|| format!("cannot read scenario file {}", path.display()))?;
                (path.display().to_string(), text)
            }
            None => (
                format!("scenarios/{name}.toml (built in)"),
                builtin.to_string(),
            ),
        };
        let mut spec: Spec = toml::from_str(&text).map_err(|e| {
            let line = e.span().map(|s| text[..s.start].lines().count().max(1));
            let at = line.map(|l| format!(" line {l}:")).unwrap_or_default();
            anyhow!(
                "malformed scenario file {source}:{at} {}",
                e.message().trim()
            )
        })?;
        spec.source = source;
        if spec.name != name {
            bail!(
                "scenario file {} names scenario '{}', expected '{name}'",
                spec.source,
                spec.name
            );
        }
        if let Some(unknown) = spec.quick.keys().find(|k| !spec.params.contains_key(*k)) {
            bail!(
                "malformed scenario file {}: [quick] sets '{unknown}', which is not in [params]",
                spec.source
            );
        }
        let judged = spec.checks.iter().map(|c| ("check", c));
        for (kind, check) in judged.chain(spec.targets.iter().map(|t| ("target", t))) {
            check.validate().with_context(|| {
                format!(
                    "malformed scenario file {}: {kind} '{}'",
                    spec.source, check.name
                )
            })?;
        }
        Ok(spec)
    }

    /// The parameters as the scenario's typed struct.
    pub fn params<T: serde::de::DeserializeOwned>(&self, params: &toml::Table) -> Result<T> {
        toml::Value::Table(params.clone())
            .try_into()
            .map_err(|e: toml::de::Error| {
                anyhow!(
                    "malformed scenario file {}: [params]: {}",
                    self.source,
                    e.message().trim()
                )
            })
    }
}
