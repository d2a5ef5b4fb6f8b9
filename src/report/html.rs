//! The report page, `results/<run-id>/report.html`: one self-contained file (inline CSS and SVG;
//! no script, no font or anything else fetched) with the run's summary and, per scenario, its
//! plots, tables, checks, notes and parameters. Every piece of text is escaped here, its secrets
//! masked. The page draws only what it is handed: each result's plots are drawn by what made it
//! (a scenario of the registry, explore, verify) and handed in by the command; this module lays
//! them out.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::report::plots::Plot;
use crate::report::{self, Report, Table};

/// The page's file name inside a run's directory.
pub const PAGE_FILE: &str = "report.html";

/// Tables longer than this are folded (click to open), so the page stays readable.
const FOLD_ROWS: usize = 25;

const STYLE: &str = "
body { font-family: system-ui, -apple-system, 'Segoe UI', 'Noto Sans', 'Noto Sans CJK JP',
       'Hiragino Sans', sans-serif; color: #1d1d1f; background: #fafafa; margin: 0; }
main { max-width: 1200px; margin: 0 auto; padding: 1.5rem 1.5rem 4rem; }
h1 { font-size: 1.6rem; margin-bottom: .2rem; }
h2 { font-size: 1.3rem; margin: 0; }
h3 { font-size: 1rem; margin: 1.4rem 0 .4rem; }
.meta, .section-name { color: #555; margin: .2rem 0; }
nav ol { columns: 3; padding-left: 1.2rem; }
nav a { color: #0b5cad; text-decoration: none; }
section { background: #fff; border: 1px solid #ddd; border-radius: 8px; padding: 1rem 1.4rem;
          margin: 1.4rem 0; }
.table { overflow-x: auto; margin: .3rem 0 .8rem; }
table { border-collapse: collapse; font-size: .85rem; }
th, td { border-bottom: 1px solid #e4e4e4; padding: .25rem .5rem; text-align: left;
         vertical-align: top; overflow-wrap: break-word; }
td:first-child, td.num, td.pass, td.fail { white-space: nowrap; }
th { background: #f0f0f3; font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.pass { color: #00734f; font-weight: 600; }
td.fail { color: #b3261e; font-weight: 700; }
.verdict { font-weight: 600; margin: .4rem 0; }
.verdict.pass { color: #00734f; }
.verdict.fail { color: #b3261e; }
figure { margin: 1rem 0; }
figcaption { font-weight: 600; margin-bottom: .3rem; }
figure svg { max-width: 100%; height: auto; border: 1px solid #eee; }
details { margin: .4rem 0; }
summary { cursor: pointer; color: #333; }
pre { background: #f6f6f6; padding: .6rem; overflow-x: auto; font-size: .8rem; }
";

/// Writes the page of `reports` into `dir` (a run's directory, whose name is the run id), each
/// result with the plots that `plots` draws of it.
pub fn write(
    dir: &Path,
    reports: &[Report],
    plots: impl Fn(&Report) -> Result<Vec<Plot>>,
) -> Result<PathBuf> {
    let run_id = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| dir.display().to_string());
    let path = dir.join(PAGE_FILE);
    report::write_run_file(&path, &page(&run_id, reports, plots)?, false)?;
    Ok(path)
}

/// The whole page as one HTML document.
fn page(
    run_id: &str,
    reports: &[Report],
    plots: impl Fn(&Report) -> Result<Vec<Plot>>,
) -> Result<String> {
    let mut out = String::new();
    let title = format!("outbox-lab run {run_id}");
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n<main>\n",
        escape(&title)
    );
    header(&mut out, run_id, reports);
    let _ = writeln!(out, "<section id=\"summary\">\n<h2>Summary</h2>");
    table(&mut out, &report::summary_table(reports));
    out.push_str("</section>\n");
    for report in reports {
        scenario(&mut out, report, plots(report)?)?;
    }
    out.push_str("</main>\n</body>\n</html>\n");
    Ok(out)
}

fn header(out: &mut String, run_id: &str, reports: &[Report]) {
    let checks: usize = reports.iter().map(|r| r.checks.len()).sum();
    let passed: usize = reports.iter().map(Report::passed_count).sum();
    let targets: usize = reports.iter().map(|r| r.targets.len()).sum();
    let met: usize = reports.iter().map(Report::met_count).sum();
    let _ = writeln!(
        out,
        "<header>\n<h1>outbox-lab run <code>{}</code></h1>",
        escape(run_id)
    );
    let _ = writeln!(
        out,
        "<p class=\"meta\">{} scenario{}, {passed} of {checks} checks pass; {met} of {targets} speed targets met.</p>",
        reports.len(),
        if reports.len() == 1 { "" } else { "s" }
    );
    if let Some(first) = reports.first() {
        let env = &first.environment;
        let _ = writeln!(
            out,
            "<p class=\"meta\">Started {} on {} ({}); outbox-lab {}.</p>",
            escape(&env.started_at),
            escape(&env.postgres_version),
            escape(&env.server),
            escape(&env.outbox_lab_version)
        );
    }
    out.push_str("<nav><ol>\n");
    for report in reports {
        let mark = if report.passed() {
            ""
        } else {
            " (not reproduced)"
        };
        let _ = writeln!(
            out,
            "<li><a href=\"#{}\">{}</a>{mark}</li>",
            escape(&anchor(&report.scenario)),
            escape(&report.scenario)
        );
    }
    out.push_str("</ol></nav>\n</header>\n");
}

fn scenario(out: &mut String, report: &Report, plots: Vec<Plot>) -> Result<()> {
    let _ = writeln!(
        out,
        "<section class=\"scenario\" id=\"{}\" data-scenario=\"{}\">",
        escape(&anchor(&report.scenario)),
        escape(&report.scenario)
    );
    let _ = writeln!(out, "<h2>{}</h2>", escape(&report.scenario));
    let _ = writeln!(
        out,
        "<p class=\"section-name\" lang=\"ja\">{}</p>",
        escape(&report.section)
    );
    let verdict = if report.passed() { "pass" } else { "fail" };
    let _ = writeln!(
        out,
        "<p class=\"verdict {verdict}\">{} ({} ms)</p>",
        escape(&report.verdict_line()),
        report.environment.elapsed_ms
    );
    for plot in plots {
        let _ = writeln!(
            out,
            "<figure class=\"plot\" data-plot=\"{}\">\n<figcaption>{}</figcaption>\n{}\n</figure>",
            escape(plot.id),
            escape(&plot.title),
            plot.svg
        );
    }
    for t in &report.tables {
        if t.detail || t.rows.len() > FOLD_ROWS {
            let _ = writeln!(
                out,
                "<details>\n<summary>{} ({} rows)</summary>",
                escape(&t.title),
                t.rows.len()
            );
            table(out, t);
            out.push_str("</details>\n");
        } else {
            let _ = writeln!(out, "<h3>{}</h3>", escape(&t.title));
            table(out, t);
        }
    }
    let _ = writeln!(out, "<h3>checks</h3>");
    table(out, &report.checks_table());
    if !report.targets.is_empty() {
        let targets = report.targets_table();
        let _ = writeln!(out, "<h3>{}</h3>", escape(&targets.title));
        table(out, &targets);
    }
    if !report.notes.is_empty() {
        let _ = writeln!(
            out,
            "<details>\n<summary>notes ({})</summary>\n<pre>{}</pre>\n</details>",
            report.notes.len(),
            escape(&report.notes.join("\n"))
        );
    }
    let params = serde_json::to_string_pretty(&report.params)?;
    let _ = writeln!(
        out,
        "<details>\n<summary>parameters</summary>\n<pre>{}</pre>\n</details>",
        escape(&params)
    );
    out.push_str("</section>\n");
    Ok(())
}

fn table(out: &mut String, table: &Table) {
    let numeric = table.numeric_columns();
    // Wide tables scroll inside their box instead of running off the page.
    out.push_str("<div class=\"table\"><table>\n<thead><tr>");
    for column in &table.columns {
        let _ = write!(out, "<th>{}</th>", escape(column));
    }
    out.push_str("</tr></thead>\n<tbody>\n");
    for row in &table.rows {
        out.push_str("<tr>");
        for (i, cell) in row.iter().enumerate() {
            let class = match cell.as_str() {
                "PASS" | "MET" => " class=\"pass\"",
                "FAIL" | "MISSED" => " class=\"fail\"",
                _ if numeric.get(i).copied().unwrap_or(false) => " class=\"num\"",
                _ => "",
            };
            // Long lists without spaces (receive orders) may break after a comma.
            let text = escape(cell).replace(',', ",<wbr>");
            let _ = write!(out, "<td{class}>{text}</td>");
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</tbody>\n</table></div>\n");
}

/// The id of a scenario's section.
fn anchor(scenario: &str) -> String {
    format!("scenario-{scenario}")
}

/// Text made safe for HTML content and attribute values, its secrets masked.
pub fn escape(text: &str) -> String {
    // Masked before the quotes of a libpq `password='...'` become `&#39;`, unseen by redact.
    let text = crate::secrets::redact(text);
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_quotes() {
        assert_eq!(
            escape(r#"<b class="x">Tom & 'Jerry'</b>"#),
            "&lt;b class=&quot;x&quot;&gt;Tom &amp; &#39;Jerry&#39;&lt;/b&gt;"
        );
    }
}
