//! The result of a scenario run: metrics, tables (table.rs), checks, and how they are shown
//! (psql-like tables on a terminal, one JSON document with `--format json`, the summary of a
//! run), stored in a run's directory (`results/<run-id>/<scenario>.json` and one CSV per
//! table, through run_dir.rs) and read back (`outbox-lab report`, `outbox-lab compare`). This
//! model is the bottom layer: the judge, the scenarios, explore and verify fill it in, and it
//! imports none of them (the page, [`html`], is handed each result's plots).

pub mod compare;
pub mod html;
pub mod plots;
pub mod progress;
mod run_dir;
mod spread;
mod table;

pub use run_dir::{create_run_dir, write_run_file};
pub use spread::Spread;
pub use table::Table;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use serde::{Deserialize, Serialize};
use tokio_postgres::types::Type;
use tokio_postgres::Row;

/// Flat map of dotted metric names to numbers or strings, in the order they were measured.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Metrics(serde_json::Map<String, serde_json::Value>);

impl Metrics {
    pub fn set(&mut self, name: impl Into<String>, value: impl Into<serde_json::Value>) {
        self.0.insert(name.into(), value.into());
    }

    /// Every numeric or boolean (as 0/1) column of `row` as `<prefix>.<column>` (or
    /// `<column>` when the prefix is empty).
    pub fn set_row(&mut self, prefix: &str, row: &Row) {
        for (i, column) in row.columns().iter().enumerate() {
            let name = match prefix {
                "" => column.name().to_string(),
                _ => format!("{prefix}.{}", column.name()),
            };
            let value: Option<serde_json::Value> = match *column.type_() {
                Type::INT8 => row.get::<_, Option<i64>>(i).map(Into::into),
                Type::INT4 => row.get::<_, Option<i32>>(i).map(Into::into),
                Type::FLOAT8 => row.get::<_, Option<f64>>(i).map(Into::into),
                Type::BOOL => row.get::<_, Option<bool>>(i).map(|b| i64::from(b).into()),
                _ => None,
            };
            if let Some(value) = value {
                self.set(name, value);
            }
        }
    }

    pub fn get(&self, name: &str) -> Option<&serde_json::Value> {
        self.0.get(name)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &serde_json::Value)> {
        self.0.iter()
    }
}

/// One judged expectation, as it appears in the output and in JSON (judged by
/// [`crate::judge::expectations`]).
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

/// Where and with what the run happened.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Environment {
    pub postgres_version: String,
    pub outbox_lab_version: String,
    pub started_at: String,
    pub elapsed_ms: u64,
    pub server: String,
}

/// One scenario's result: the JSON contract of docs/report.md.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    pub scenario: String,
    pub section: String,
    pub params: serde_json::Value,
    pub metrics: Metrics,
    pub tables: Vec<Table>,
    pub checks: Vec<CheckResult>,
    /// outbox-lab's own speed targets, judged like checks; they decide the exit status only with
    /// `--strict-targets` (absent from results saved before targets were apart).
    #[serde(default)]
    pub targets: Vec<CheckResult>,
    /// What the actors printed that a reader wants to see (the relay's log lines, errors).
    pub notes: Vec<String>,
    pub environment: Environment,
}

impl Report {
    /// Whether every check passed (the article's figures; targets aside).
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.pass)
    }

    pub fn passed_count(&self) -> usize {
        self.checks.iter().filter(|c| c.pass).count()
    }

    /// Whether every speed target was met.
    pub fn targets_met(&self) -> bool {
        self.targets.iter().all(|t| t.pass)
    }

    pub fn met_count(&self) -> usize {
        self.targets.iter().filter(|t| t.pass).count()
    }

    /// "12 of 12 checks pass", and ", 2 of 3 targets met" where the scenario has targets.
    pub fn verdict_line(&self) -> String {
        let mut line = format!(
            "{} of {} checks pass",
            self.passed_count(),
            self.checks.len()
        );
        if !self.targets.is_empty() {
            line += &format!(
                ", {} of {} targets met",
                self.met_count(),
                self.targets.len()
            );
        }
        line
    }

    /// The terminal form: tables, notes, then one line per check.
    pub fn render_text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "== {} ({}) ==\n", self.scenario, self.section);
        for table in &self.tables {
            if table.detail {
                let _ = writeln!(
                    out,
                    "{}: {} rows, in the CSV file and report.html\n",
                    table.title,
                    table.rows.len()
                );
            } else {
                let _ = writeln!(out, "{}\n{}\n", table.title, table.render());
            }
        }
        for note in &self.notes {
            let _ = writeln!(out, "{note}");
        }
        if !self.notes.is_empty() {
            out.push('\n');
        }
        let _ = writeln!(out, "{}", self.checks_table().render());
        if !self.targets.is_empty() {
            let _ = writeln!(out, "\n{}", self.targets_table().render());
        }
        let _ = writeln!(
            out,
            "{}: {} ({} ms)",
            self.scenario,
            self.verdict_line(),
            self.environment.elapsed_ms
        );
        out
    }

    /// A line per check: the metric, measured, expected, the article's figure.
    pub fn checks_table(&self) -> Table {
        judged_table("checks", &self.checks, ["PASS", "FAIL"])
    }

    /// A line per speed target, as [`Report::checks_table`], MET or MISSED.
    pub fn targets_table(&self) -> Table {
        judged_table(
            "speed targets (outbox-lab's own)",
            &self.targets,
            TARGET_VERDICTS,
        )
    }

    /// `<dir>/<scenario>.json` and `<dir>/<scenario>.<n>-<table>.csv` ([`write_run_file`]).
    pub fn write_files(&self, dir: &Path) -> Result<()> {
        create_run_dir(dir)?;
        let json = dir.join(format!("{}.json", self.scenario));
        write_run_file(&json, &serde_json::to_string_pretty(self)?, false)?;
        for (n, table) in self.tables.iter().enumerate() {
            let path = dir.join(format!(
                "{}.{}-{}.csv",
                self.scenario,
                n + 1,
                slug(&table.title)
            ));
            let mut csv = csv::Writer::from_writer(Vec::new());
            csv.write_record(&table.columns)?;
            for row in &table.rows {
                csv.write_record(row)?;
            }
            let text = String::from_utf8(csv.into_inner()?)?;
            write_run_file(&path, &text, false)?;
        }
        Ok(())
    }
}

/// The scenario results saved in a run's directory (`results/<run-id>`), in the order they ran.
pub fn read_run(dir: &Path) -> Result<Vec<Report>> {
    if !dir.is_dir() {
        bail!(
            "{} is not a results directory (give results/<run-id>)",
            dir.display()
        );
    }
    let entries =
        std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))?;
    let mut paths: Vec<PathBuf> = entries
        .map(|entry| entry.map(|e| e.path()))
        .collect::<std::io::Result<_>>()
        .with_context(|| format!("cannot read {}", dir.display()))?;
    paths.retain(|p| p.extension().is_some_and(|e| e == "json"));
    if paths.is_empty() {
        bail!(
            "no scenario results (*.json) in {}: give a directory written by `outbox-lab scenario`",
            dir.display()
        );
    }
    let mut reports = paths
        .iter()
        .map(|path| {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            serde_json::from_str::<Report>(&text)
                .with_context(|| format!("{} is not a scenario result", path.display()))
        })
        .collect::<Result<Vec<_>>>()?;
    reports.sort_by(|a, b| a.environment.started_at.cmp(&b.environment.started_at));
    Ok(reports)
}

/// How a target's outcome reads: MET or MISSED (a check's: PASS or FAIL).
pub const TARGET_VERDICTS: [&str; 2] = ["MET", "MISSED"];

/// A line per judged expectation: the verdict, the metric, measured, expected, the article's
/// figure, and what it shows.
fn judged_table(title: &str, judged: &[CheckResult], [yes, no]: [&str; 2]) -> Table {
    let mut table = Table::new(
        title,
        &[
            "result",
            "metric",
            "measured",
            "expected",
            "article",
            "what it shows",
        ],
    );
    for c in judged {
        table.push(vec![
            if c.pass { yes } else { no }.into(),
            c.metric.clone(),
            c.actual.clone(),
            c.expected.clone(),
            c.article.clone().unwrap_or_default(),
            c.name.clone(),
        ]);
    }
    table
}

/// The run's summary table, its count of passed checks and of met targets.
pub fn summary(reports: &[Report]) -> String {
    let checks: usize = reports.iter().map(|r| r.checks.len()).sum();
    let passed: usize = reports.iter().map(Report::passed_count).sum();
    let targets: usize = reports.iter().map(|r| r.targets.len()).sum();
    let met: usize = reports.iter().map(Report::met_count).sum();
    let table = summary_table(reports);
    format!(
        "{}\n{}\n{passed} of {checks} checks pass in {} scenarios; {met} of {targets} speed targets met",
        table.title,
        table.render(),
        reports.len()
    )
}

/// One table for a whole run: each article figure beside what was expected and measured, and
/// every failed check; a scenario with neither gets one line with its count of passed checks.
/// Speed targets follow, MET or MISSED.
pub fn summary_table(reports: &[Report]) -> Table {
    let mut table = Table::new(
        "summary: the article's figures, measured",
        &[
            "scenario",
            "metric",
            "article figure",
            "expected",
            "measured",
            "check",
        ],
    );
    for report in reports {
        let verdict = |pass: bool| if pass { "PASS" } else { "FAIL" }.to_string();
        let mut rows: Vec<Vec<String>> = report
            .checks
            .iter()
            .filter(|c| c.article.is_some() || !c.pass)
            .map(|c| {
                vec![
                    c.metric.clone(),
                    c.article.clone().unwrap_or_default(),
                    c.expected.clone(),
                    c.actual.clone(),
                    verdict(c.pass),
                ]
            })
            .collect();
        if rows.is_empty() {
            rows.push(vec![
                "(every check)".into(),
                String::new(),
                String::new(),
                format!("{} of {} pass", report.passed_count(), report.checks.len()),
                verdict(report.passed()),
            ]);
        }
        // Every target, apart from the checks by its verdict's words.
        let [met, missed] = TARGET_VERDICTS;
        rows.extend(report.targets.iter().map(|t| {
            vec![
                t.metric.clone(),
                "(target)".into(),
                t.expected.clone(),
                t.actual.clone(),
                if t.pass { met } else { missed }.into(),
            ]
        }));
        for (n, row) in rows.into_iter().enumerate() {
            // The name once per scenario: the rows below it belong to it.
            let name = if n == 0 {
                report.scenario.clone()
            } else {
                String::new()
            };
            table.push([vec![name], row].concat());
        }
    }
    table
}

/// `v` with at most `places` decimals and no trailing zeros: 2.5, 2, 0.125.
pub fn decimals(v: f64, places: usize) -> String {
    let text = format!("{v:.places$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    }
}

fn slug(title: &str) -> String {
    let mut slug = String::new();
    for c in title.chars() {
        if c.is_ascii_alphanumeric() {
            slug.push(c.to_ascii_lowercase());
        } else if !slug.ends_with('-') {
            slug.push('-');
        }
    }
    slug.trim_matches('-').to_string()
}
