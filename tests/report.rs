//! The report of a run: report.html of real `--quick` runs of the scenarios that draw a plot
//! (parsed here, and rendered by headless Chromium), `report` re-rendering from the saved JSON
//! without a database, `compare`, and the terminal habits (no progress noise in JSON,
//! completions). The other scenarios' sections are drawn by the same code from their tables,
//! checks and notes, and the scenarios themselves are tested once each, in the other files.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use common::{assert_usage_error, outbox_lab, scratch_dir, server_url, Run};

/// The scenarios that draw a plot, their plot, and what shortens them further (the page only
/// needs their tables; cleanup has no [quick] parameters).
const PLOTTED: [(&str, &str, &[&str]); 8] = [
    ("notify-latency", "latency-cdf", &[]),
    ("broker-dedup", "broker-dedup", &[]),
    ("kafka-retries", "kafka-retries", &[]),
    ("batch-throughput", "throughput-by-batch", &[]),
    ("multi-relay-ordering", "ordering-violations", &[]),
    (
        "cleanup",
        "cleanup-table-size",
        &["--set", "published=20000"],
    ),
    // On the suite's shared server: its crash is not run there (a cell says so).
    ("horizon", "horizon-outcomes", &[]),
    // On a cluster of its own on a clock of the run's, whichever server it is given.
    ("clock-skew", "clock-skew-outcomes", &[]),
];

/// The scenarios' results in one run directory, and its page, for the whole test binary.
struct QuickRun {
    dir: PathBuf,
    /// `outbox-lab report` of that directory, which wrote the page.
    run: Run,
    scenarios: Vec<String>,
    /// Each scenario's own run directory, with the page `scenario` wrote.
    runs: Vec<PathBuf>,
}

/// Runs the plotted scenarios at once (`--quick`, each its own run), gathers their JSON in one
/// run directory and writes its page with `outbox-lab report`: the page `scenario` writes for
/// those results (`report_rerenders_the_page_from_json_without_a_database` holds them equal).
fn quick_run() -> &'static QuickRun {
    static RUN: OnceLock<QuickRun> = OnceLock::new();
    RUN.get_or_init(|| {
        // batch-throughput among them keeps the cores busy: no test that judges a time beside.
        let _benchmark = common::benchmark();
        let runs: Vec<(String, PathBuf)> = std::thread::scope(|threads| {
            let running: Vec<_> = PLOTTED
                .iter()
                .map(|(scenario, _, args)| {
                    threads.spawn(move || {
                        let results = scratch_dir(&format!("report-{scenario}"));
                        let output = outbox_lab()
                            .args(["scenario", scenario, "--quick", "--format", "json"])
                            .args(["--database-url", server_url()])
                            .arg("--results-dir")
                            .arg(&results)
                            .args(*args)
                            .output()
                            .expect("outbox-lab runs");
                        let run = Run::from(output);
                        // 1 = a check missed (a timing check on a busy machine, or a figure of
                        // the shortened run): the page is still whole.
                        assert!(run.code == 0 || run.code == 1, "{scenario}: {}", run.stderr);
                        let run_id = std::fs::read_dir(&results)
                            .unwrap()
                            .next()
                            .expect("a run directory")
                            .unwrap()
                            .file_name();
                        (
                            scenario.to_string(),
                            results.join(run_id).join(format!("{scenario}.json")),
                        )
                    })
                })
                .collect();
            running.into_iter().map(|t| t.join().unwrap()).collect()
        });
        let first = runs[0].1.parent().unwrap().file_name().unwrap();
        let dir = scratch_dir("report-results").join(first);
        std::fs::create_dir_all(&dir).unwrap();
        for (scenario, json) in &runs {
            std::fs::copy(json, dir.join(format!("{scenario}.json"))).unwrap();
        }
        let run = outbox_lab_run(&["report", dir.to_str().unwrap()]);
        assert_eq!(run.code, 0, "stderr: {}", run.stderr);
        QuickRun {
            dir,
            run,
            scenarios: runs.iter().map(|(scenario, _)| scenario.clone()).collect(),
            runs: runs
                .iter()
                .map(|(_, json)| json.parent().unwrap().to_path_buf())
                .collect(),
        }
    })
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A copy of the gathered run's JSON results (nothing else) in a fresh `<parent>/<run-id>`.
fn copy_results(parent: &str) -> PathBuf {
    copy_results_of(&quick_run().dir, parent)
}

/// A copy of `original`'s JSON results (nothing else) in a fresh `<parent>/<run-id>`.
fn copy_results_of(original: &Path, parent: &str) -> PathBuf {
    let copy = scratch_dir(parent).join(original.file_name().unwrap());
    std::fs::create_dir_all(&copy).unwrap();
    for entry in std::fs::read_dir(original).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "json") {
            std::fs::copy(&path, copy.join(path.file_name().unwrap())).unwrap();
        }
    }
    copy
}

fn outbox_lab_run(args: &[&str]) -> Run {
    Run::from(outbox_lab().args(args).output().expect("outbox-lab runs"))
}

/// The page of a real run has the summary, a section per scenario, and each plot as an inline
/// SVG; it fetches nothing (no script, stylesheet link, image source or URL in its CSS).
#[test]
fn page_of_a_quick_run_has_every_section_and_plot() {
    let quick = quick_run();
    assert_eq!(quick.scenarios.len(), PLOTTED.len(), "{}", quick.run.stdout);
    let html = read(&quick.dir.join("report.html"));
    let dom = tl::parse(&html, tl::ParserOptions::default()).expect("the page parses as HTML");
    let parser = dom.parser();
    let attribute = |tag: &tl::HTMLTag, name: &str| {
        tag.attributes()
            .get(name)
            .flatten()
            .map(|v| v.as_utf8_str().into_owned())
            .unwrap_or_default()
    };

    assert!(dom.get_element_by_id("summary").is_some(), "no summary");
    let mut sections: Vec<String> = dom
        .query_selector("section.scenario")
        .expect("selector")
        .filter_map(|node| {
            node.get(parser)?
                .as_tag()
                .map(|t| attribute(t, "data-scenario"))
        })
        .collect();
    sections.sort();
    let mut scenarios = quick.scenarios.clone();
    scenarios.sort();
    assert_eq!(sections, scenarios);

    let mut plots = Vec::new();
    for node in dom.query_selector("figure.plot").expect("selector") {
        let figure = node.get(parser).unwrap().as_tag().unwrap();
        let id = attribute(figure, "data-plot");
        let svg = figure
            .query_selector(parser, "svg")
            .expect("selector")
            .count();
        assert_eq!(svg, 1, "plot {id} has no inline SVG");
        let shapes = ["polyline", "rect", "path"]
            .iter()
            .map(|s| figure.query_selector(parser, s).expect("selector").count())
            .sum::<usize>();
        assert!(shapes > 3, "plot {id} draws nothing");
        plots.push(id);
    }
    plots.sort();
    let mut expected: Vec<&str> = PLOTTED.iter().map(|(_, plot, _)| *plot).collect();
    expected.sort();
    assert_eq!(plots, expected, "plots in the page");

    for fetch in ["<script", "<link", "src=", "url(", "@import"] {
        assert!(
            !html.contains(fetch),
            "the page would fetch something: {fetch}"
        );
    }
    // The per-event latencies behind the CDF are kept, folded, with every sample.
    assert!(html.contains("latency of every event"));
}

/// Headless Chromium renders the page (scripts/check-report): every section and plot is in the
/// DOM it built, and it takes a screenshot. Chromium missing is a failure: scripts/setup --test
/// installs it.
#[test]
fn chromium_renders_every_section_and_plot() {
    let quick = quick_run();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/check-report");
    let output = Command::new(script)
        .arg(&quick.dir)
        .output()
        .expect("scripts/check-report runs");
    let run = Run::from(output);
    assert_eq!(
        run.code, 0,
        "stdout: {}\nstderr: {}",
        run.stdout, run.stderr
    );
    assert!(
        run.stdout.contains(&format!(
            "{} scenario sections, {} plots",
            PLOTTED.len(),
            PLOTTED.len()
        )),
        "{}",
        run.stdout
    );
    let screenshot = std::fs::metadata(quick.dir.join("report.png")).expect("report.png");
    assert!(
        screenshot.len() > 50_000,
        "a blank screenshot? {} bytes",
        screenshot.len()
    );
}

/// `report` prints the tables and rewrites the page from the JSON alone: with no database to
/// reach, the page is the very page the run wrote — `scenario` for one scenario's run, `report`
/// for the gathered ones.
#[test]
fn report_rerenders_the_page_from_json_without_a_database() {
    let quick = quick_run();
    let copy = copy_results("report-rerender");
    let run = Run::from(
        outbox_lab()
            .arg("report")
            .arg(&copy)
            .env(
                "OUTBOX_LAB_DATABASE_URL",
                "postgres://nobody@127.0.0.1:1/none",
            )
            .output()
            .unwrap(),
    );
    assert_eq!(run.code, 0, "stderr: {}", run.stderr);
    assert!(run.stdout.contains("== cleanup ("), "{}", run.stdout);
    assert!(run
        .stdout
        .contains("summary: the article's figures, measured"));
    assert!(run
        .stdout
        .contains(&format!("checks pass in {} scenarios", PLOTTED.len())));
    assert_eq!(
        read(&copy.join("report.html")),
        read(&quick.dir.join("report.html")),
        "the re-rendered page differs from the run's"
    );
    for run_dir in &quick.runs {
        let copy = copy_results_of(run_dir, "report-rerender-one");
        let run = outbox_lab_run(&["report", copy.to_str().unwrap()]);
        assert_eq!(run.code, 0, "stderr: {}", run.stderr);
        assert_eq!(
            read(&copy.join("report.html")),
            read(&run_dir.join("report.html")),
            "the re-rendered page differs from the one `scenario` wrote in {}",
            run_dir.display()
        );
    }
}

/// Several runs make one page, in the first run's directory: every scenario of every run on it
/// (how `scenario all` and `zoo` share one page).
#[test]
fn several_runs_make_one_page() {
    let quick = quick_run();
    let copies: Vec<PathBuf> = quick
        .runs
        .iter()
        .map(|run_dir| copy_results_of(run_dir, "report-several"))
        .collect();
    let mut args = vec!["report"];
    args.extend(copies.iter().map(|c| c.to_str().unwrap()));
    let run = outbox_lab_run(&args);
    assert_eq!(run.code, 0, "stderr: {}", run.stderr);
    assert!(run.stdout.contains(&format!(
        "checks pass in {} scenarios",
        quick.scenarios.len()
    )));
    let page = read(&copies[0].join("report.html"));
    for scenario in &quick.scenarios {
        assert!(
            page.contains(&format!("data-scenario=\"{scenario}\"")),
            "{scenario} not on the page"
        );
    }
}

/// A zoo's run directory joins scenarios' on one page (`report SCENARIO_RUN ZOO_RUN`): the
/// article's figures and the zoo's table, verdicts and checks side by side.
#[test]
fn a_zoo_run_and_a_scenario_run_make_one_page() {
    let quick = quick_run();
    let scenario = copy_results_of(&quick.runs[0], "report-with-zoo");
    let results = scratch_dir("report-zoo-results");
    let zoo = outbox_lab_run(&[
        "zoo",
        "--documented",
        "outbox_lab",
        "--format",
        "json",
        "--database-url",
        server_url(),
        "--results-dir",
        results.to_str().unwrap(),
    ]);
    assert_eq!(zoo.code, 0, "stderr: {}", zoo.stderr);
    let zoo_run = std::fs::read_dir(&results)
        .unwrap()
        .next()
        .expect("the zoo's run directory")
        .unwrap()
        .path();
    let zoo_copy = copy_results_of(&zoo_run, "report-with-zoo");
    let run = outbox_lab_run(&[
        "report",
        scenario.to_str().unwrap(),
        zoo_copy.to_str().unwrap(),
    ]);
    assert_eq!(run.code, 0, "stderr: {}", run.stderr);
    let page = read(&scenario.join("report.html"));
    assert!(page.contains(&format!("data-scenario=\"{}\"", quick.scenarios[0])));
    assert!(page.contains("data-scenario=\"zoo\""), "no zoo section");
    for zoo_text in [
        "outbox_lab",
        "keeps its promises",
        "zoo.outbox_lab.documented.broken",
    ] {
        assert!(page.contains(zoo_text), "'{zoo_text}' is not on the page");
    }
}

/// `compare` puts every metric of two runs side by side with the change from A to B.
#[test]
fn compare_shows_each_metric_of_two_runs_and_the_change() {
    let a = &quick_run().dir;
    let b = copy_results("report-compare");
    let metric = "relays1.unpartitioned.received";
    let path = b.join("multi-relay-ordering.json");
    let mut json: serde_json::Value = serde_json::from_str(&read(&path)).unwrap();
    let received = json["metrics"][metric].as_i64().unwrap();
    json["metrics"][metric] = (received * 2).into();
    std::fs::write(&path, serde_json::to_vec(&json).unwrap()).unwrap();

    let run = outbox_lab_run(&["compare", a.to_str().unwrap(), b.to_str().unwrap()]);
    assert_eq!(run.code, 0, "stderr: {}", run.stderr);
    let line = run
        .stdout
        .lines()
        .find(|l| l.contains(&format!(" {metric} ")))
        .unwrap_or_else(|| panic!("no {metric} row:\n{}", run.stdout));
    let cells: Vec<&str> = line.split('|').map(str::trim).collect();
    let (a_value, b_value) = (received.to_string(), (received * 2).to_string());
    assert_eq!(
        cells,
        [
            metric,
            a_value.as_str(),
            b_value.as_str(),
            &format!("+{received} (+100.0%)")
        ]
    );
    assert!(
        run.stdout.lines().any(|l| l.starts_with(" checks passed ")),
        "{}",
        run.stdout
    );
    assert!(run.stdout.lines().any(|l| l == "multi-relay-ordering"));
}

/// A missing directory, one without results, and a malformed result: one line, exit 2.
#[test]
fn compare_and_report_reject_a_bad_results_dir_with_exit_2() {
    let good = quick_run().dir.to_str().unwrap().to_string();
    let missing = scratch_dir("report-missing").join("no-such-run");
    let missing = missing.to_str().unwrap();
    assert_usage_error(
        &outbox_lab_run(&["compare", &good, missing]),
        "is not a results directory",
    );
    assert_usage_error(
        &outbox_lab_run(&["report", missing]),
        "is not a results directory",
    );

    let empty = scratch_dir("report-empty");
    assert_usage_error(
        &outbox_lab_run(&["compare", empty.to_str().unwrap(), &good]),
        "no scenario results",
    );

    let malformed = scratch_dir("report-malformed");
    std::fs::write(malformed.join("relay-crash.json"), "{\"scenario\": ").unwrap();
    assert_usage_error(
        &outbox_lab_run(&["compare", &good, malformed.to_str().unwrap()]),
        "relay-crash.json is not a scenario result",
    );
}

/// `--format json` on a terminal: the terminal gets the JSON document and nothing else (no
/// progress bar), and text output on a terminal with NO_COLOR has no colour codes.
#[test]
fn json_on_a_terminal_has_no_progress_noise() {
    let on_terminal = |args: &str, env: &[(&str, &str)]| {
        let results = scratch_dir("report-terminal");
        let command = format!(
            "{} scenario outbox-atomicity --database-url {} --results-dir {} {args}",
            env!("CARGO_BIN_EXE_outbox-lab"),
            server_url(),
            results.display()
        );
        // script(1) gives the run a pseudo-terminal for stdout and stderr alike.
        let output = Command::new("script")
            .args(["--quiet", "--return", "--command", &command, "/dev/null"])
            .envs(env.iter().copied())
            .output()
            .expect("script (util-linux) runs");
        Run::from(output)
    };

    let json = on_terminal("--format json", &[]);
    assert_eq!(json.code, 0, "{}", json.stdout);
    let text = json.stdout.replace("\r\n", "\n");
    let document: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("not only one JSON document on the terminal ({e}):\n{text:?}"));
    assert_eq!(document["scenario"], "outbox-atomicity");

    let plain = on_terminal("", &[("NO_COLOR", "1")]);
    assert_eq!(plain.code, 0, "{}", plain.stdout);
    assert!(plain.stdout.contains("checks pass"), "{}", plain.stdout);
    for colour in ["\x1b[3", "\x1b[9", "\x1b[1;3"] {
        assert!(
            !plain.stdout.contains(colour),
            "colour with NO_COLOR: {:?}",
            plain.stdout
        );
    }
}

/// Completion scripts for the three common shells name the subcommands.
#[test]
fn completions_print_for_bash_zsh_and_fish() {
    for shell in ["bash", "zsh", "fish"] {
        let run = outbox_lab_run(&["completions", shell]);
        assert_eq!(run.code, 0, "{shell}: {}", run.stderr);
        for subcommand in ["scenario", "report", "compare", "completions"] {
            assert!(
                run.stdout.contains(subcommand),
                "{shell} lacks {subcommand}"
            );
        }
    }
    let unknown = outbox_lab_run(&["completions", "tcsh"]);
    assert_eq!(unknown.code, 2, "{}", unknown.stderr);
    assert!(
        unknown.stderr.contains("invalid value 'tcsh'"),
        "{}",
        unknown.stderr
    );
}

/// `list` puts each scenario under its article section, in the article's order.
#[test]
fn list_groups_scenarios_by_article_section() {
    let run = outbox_lab_run(&["list"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let pitfalls = run
        .stdout
        .split("\n\n")
        .find(|block| block.starts_with("よくある落とし穴"))
        .unwrap_or_else(|| panic!("no pitfalls section:\n{}", run.stdout));
    assert!(pitfalls.contains("\n  watermark-gap "), "{pitfalls}");
    assert!(pitfalls.contains("\n  claim-vs-lock "), "{pitfalls}");
}
