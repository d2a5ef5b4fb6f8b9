//! `outbox-lab zoo`: every entry of examples/zoo reproduces the verdict its zoo.toml documents
//! (its library's own loop, installed by `scripts/setup --test`, under its documented
//! schedule), a wrong documented verdict fails, the full run makes the table, every citation of
//! an entry's prose holds in its installed package, and bad input is one line and exit 2.

use crate::common;

use std::path::{Path, PathBuf};

use common::{assert_passed, assert_usage_error, outbox_lab, run_json, scratch_dir, Run};

fn zoo_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/zoo")
}

/// `outbox-lab zoo ARGS --format json` on this test binary's cluster, the zoo at `zoo`.
fn zoo(zoo: &Path, args: &[&str]) -> Run {
    let results = scratch_dir("zoo-results");
    let zoo = zoo.display().to_string();
    let mut all = vec!["--zoo-dir", zoo.as_str()];
    all.extend_from_slice(args);
    run_json(&["zoo"], &results, &all)
}

/// The entry ran its documented run (installed: scripts/setup --test installs the zoo) and
/// broke exactly what its zoo.toml says.
fn reproduces_its_documented_verdict(name: &str) {
    let run = zoo(&zoo_dir(), &["--documented", name]);
    let row = &run.table("the zoo")["rows"][0];
    assert!(
        !row[9].as_str().unwrap().starts_with("not installed"),
        "{name} is not installed here: scripts/setup --zoo"
    );
    assert_passed(&run);
    assert_eq!(run.metric(&format!("zoo.{name}.documented.reproduced")), 1);
    // An outside row says so where its verdict stands, and so does an entry whose own settings
    // cannot be made to fit (`outside_its_rules`); an entry inside its rules does not.
    let verdict = row[9].as_str().unwrap();
    let toml = std::fs::read_to_string(zoo_dir().join(name).join("zoo.toml"));
    let outside = name.ends_with("_outside")
        || toml.is_ok_and(|toml| toml.contains("\noutside_its_rules = "));
    assert_eq!(
        outside,
        verdict.contains("OUTSIDE ITS DOCUMENTED RULES"),
        "{verdict}"
    );
}

/// One test per entry, by its folder's name.
macro_rules! entries {
    ($($name:ident),* $(,)?) => {
        const ENTRIES: &[&str] = &[$(stringify!($name)),*];
        mod documented {
            $(
                #[test]
                fn $name() {
                    super::reproduces_its_documented_verdict(stringify!($name));
                }
            )*
        }
    };
}

entries!(
    outbox_lab,
    article,
    txoutbox,
    txoutbox_outside,
    faststream_outbox,
    faststream_outbox_outside,
    faststream_outbox_kafka,
    nodii,
    nats_outbox,
    pg_transactional_outbox,
    pg_boss,
    pg_boss_outside,
    backbone_outbox,
    backbone_outbox_outside,
    sqlxmq,
    outbox_pattern_processor,
    distributed_outbox,
    graphile_worker,
    django_outbox_pattern,
    django_jaiminho,
);

/// A new entry gets its test: every folder with a zoo.toml is in [`ENTRIES`], and so is its
/// `_outside` row where it has one.
#[test]
fn every_entry_is_tested() {
    let mut found: Vec<String> = std::fs::read_dir(zoo_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("zoo.toml").is_file())
        .flat_map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            let toml = std::fs::read_to_string(p.join("zoo.toml")).unwrap();
            let outside = toml
                .contains("\n[outside]\n")
                .then(|| format!("{name}_outside"));
            std::iter::once(name).chain(outside)
        })
        .collect();
    found.sort();
    let mut tested: Vec<String> = ENTRIES.iter().map(|s| s.to_string()).collect();
    tested.sort();
    assert_eq!(found, tested);
}

/// A zoo of its own: copies of entries, `edit` applied to each zoo.toml.
fn zoo_copy(name: &str, entries: &[&str], edit: impl Fn(&str) -> String) -> PathBuf {
    let dir = scratch_dir(name);
    for entry in entries {
        let to = dir.join(entry);
        std::fs::create_dir_all(&to).unwrap();
        let toml = std::fs::read_to_string(zoo_dir().join(entry).join("zoo.toml")).unwrap();
        std::fs::write(to.join("zoo.toml"), edit(&toml)).unwrap();
    }
    dir
}

/// The documented verdict bites: the reference relay documented as holding under a kill on
/// a delivery (it duplicates for the naive consumer) fails its check, exit 1.
#[test]
fn a_wrong_documented_verdict_fails() {
    let dir = zoo_copy("zoo-wrong", &["outbox_lab"], |toml| {
        toml.replace("broken = [\"duplicate\"]", "broken = []")
    });
    let run = zoo(&dir, &["--documented"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!(run.metric("zoo.outbox_lab.documented.reproduced"), 0);
    assert_eq!(run.failed_checks().len(), 1, "{:?}", run.failed_checks());
}

/// The whole zoo on one entry, each faulted run made twice (`--runs 2`): the faulted runs
/// (naive: the duplicate found in both, broken again under its smallest schedule alone, with a
/// replay line; idempotent: none), and the run without faults for latency and throughput. An
/// entry that is not installed is a row saying so; the others run.
#[test]
fn the_zoo_table_judges_each_entry_and_says_what_is_not_installed() {
    let dir = zoo_copy("zoo-table", &["outbox_lab", "article"], |toml| {
        match toml.contains("article.py") {
            // Its library "not installed": the file it names is not there.
            true => format!("installed = \"no-such-file\"\n{toml}"),
            false => toml.to_string(),
        }
    });
    // The reference relay's command names {entry} nowhere: the copy runs it as it is.
    let run = zoo(
        &dir,
        &["--events", "200", "--time-limit", "60s", "--runs", "2"],
    );
    assert_passed(&run);
    let rows = run.table("the zoo")["rows"].clone();
    let article = rows.as_array().unwrap().iter().find(|r| r[0] == "article");
    assert_eq!(
        article.unwrap()[9],
        "not installed: scripts/setup --zoo",
        "{rows}"
    );
    let ours = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r[0] == "outbox_lab")
        .unwrap();
    // Duplicates: with the naive consumer only (2 of its 4 runs), and not a promise of an
    // at-least-once relay. Order, promised by no relay of two, may break under a kill too:
    // timing decides how often, and `*` says it is not promised.
    assert_eq!(ours[6], "2/4", "{ours}");
    assert!(ours[5].as_str().unwrap().ends_with("/4*"), "{ours}");
    let verdict = ours[9].as_str().unwrap();
    assert!(verdict == "keeps its promises (promise quoted)", "{ours}");
    let findings = run.table("findings")["rows"].clone();
    let duplicate = findings
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f[1] == "duplicate")
        .unwrap_or_else(|| panic!("{findings}"));
    let replay = duplicate[5].as_str().unwrap();
    assert!(
        replay.starts_with("outbox-lab verify --relay-cmd") && replay.contains("--consumer naive"),
        "{findings}"
    );
    assert_eq!(duplicate[6], "2/2", "{duplicate}");
    assert!(
        duplicate[7] != "0/2",
        "the duplicate never broke again alone: {duplicate}"
    );
    assert_eq!(run.metric("zoo.outbox_lab.duplicate.broken_runs"), 2);
    // The run without faults: its 200 events within the run (p50 <= p99 <= the span from the
    // first commit to the last receipt, 200 events at events_per_s rounded to a whole one), and
    // plausible for a relay woken by NOTIFY (its fallback poll every 50 ms) delivering one
    // event per request: 20 such runs (`verify --nemesis none`, 2 relays, 200 events) beside
    // `yes`, other scenarios and builds, load 5-8, read p50 17-164 ms and 66-260 events/s. A
    // median of a second is a relay polling every 2 s instead; 5,000 events/s is twice what
    // two relays posting one event at a time could do (batch-throughput: 600-1,100 each).
    let figure = |name: &str| run.metric_f64(&format!("zoo.outbox_lab.no_faults.{name}"));
    let (p50, p99, per_s) = (
        figure("latency.p50_ms"),
        figure("latency.p99_ms"),
        figure("events_per_s"),
    );
    assert!((1.0..5_000.0).contains(&per_s), "{per_s} events/s");
    let span_ms = 1000.0 * 200.0 / (per_s - 0.5);
    assert!(
        0.0 < p50 && p50 <= p99 && p99 <= span_ms,
        "p50 {p50}, p99 {p99} ms over {span_ms:.0} ms"
    );
    assert!(p50 < 1_000.0, "p50 {p50} ms");
}

/// `--search N`: a search per entry hunting its promises, in a table of its own. The relay that
/// marks before it sends (as the article's entry, in a copy) loses events within seed 1's
/// first draws: the search row says what broke, where, and how to replay it.
#[test]
fn the_search_finds_a_broken_promise_and_says_how_to_replay_it() {
    let relay = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/relays/mark_before_send.py");
    let dir = zoo_copy("zoo-search", &["article"], |toml| {
        toml.replace(
            "{entry}/../../relays/article.py",
            &relay.display().to_string(),
        )
    });
    let run = zoo(&dir, &["--documented", "--search", "10", "--events", "200"]);
    assert_eq!(run.metric("zoo.article.search.found"), 1);
    let row = run.table("search")["rows"][0].clone();
    assert_eq!(row[0], "article", "{row}");
    assert_eq!(row[1], "1", "{row}");
    assert!(row[3].as_str().unwrap().contains("lost"), "{row}");
    assert!(row[5].as_str().unwrap().contains("--schedule"), "{row}");
    // The verdict column carries what the search found, with its schedule.
    let verdict = run.table("the zoo")["rows"][0][9].clone();
    let verdict = verdict.as_str().unwrap();
    assert!(
        verdict.starts_with("BREAKS ITS PROMISE") && verdict.contains("(search: "),
        "{verdict}"
    );
}

#[test]
fn bad_input_is_one_line_and_exit_2() {
    let run = zoo(&zoo_dir(), &["no_such_entry"]);
    assert_usage_error(&run, "no zoo entry 'no_such_entry'");
    let dir = zoo_copy("zoo-malformed", &["outbox_lab"], |toml| {
        toml.replace("relays = 2", "relays = \"two\"")
    });
    let run = zoo(&dir, &[]);
    assert_usage_error(&run, "zoo.toml");
    let dir = zoo_copy("zoo-both", &["outbox_lab"], |toml| {
        toml.replace("may_break = [\"order\"]", "may_break = [\"duplicate\"]")
    });
    let run = zoo(&dir, &[]);
    assert_usage_error(&run, "in both broken and may_break");
    let dir = zoo_copy("zoo-none-installed", &["outbox_lab"], |toml| {
        format!("installed = \"no-such-file\"\n{toml}")
    });
    let run = zoo(&dir, &[]);
    assert_usage_error(&run, "scripts/setup --zoo");
    let empty = scratch_dir("zoo-empty");
    let run = zoo(&empty, &[]);
    assert_usage_error(&run, "no zoo entry in");
    let listed = outbox_lab()
        .args(["zoo", "--list", "--zoo-dir"])
        .arg(zoo_dir())
        .output()
        .unwrap();
    assert!(listed.status.success());
    assert!(String::from_utf8_lossy(&listed.stdout).contains("outbox-lab relay"));
}

/// `--failover`: each entry's database failed over under it (synchronous standby), in a table
/// of its own: the article's relay reconnects, loses nothing and ships no ghost.
#[test]
fn the_failover_table_judges_each_entry_after_a_promotion() {
    let _alone = common::holding_replication();
    let run = zoo(&zoo_dir(), &["--documented", "--failover", "article"]);
    assert_passed(&run);
    let row = run.table("failover")["rows"][0].clone();
    assert_eq!(row[0], "article", "{row}");
    assert_eq!(row[8], "survived", "{row}");
    for invariant in ["ghost", "lost", "duplicate", "liveness"] {
        assert_eq!(run.metric(&format!("zoo.article.failover.{invariant}")), 0);
    }
    assert_eq!(run.metric("zoo.article.failover.acknowledged_lost"), 0);
}

/// `--clocks`: each entry under relay 0's clock a minute ahead and behind and the server's a
/// minute ahead. The article's relay keeps its leases and due times on the server's clock, one
/// clock: nothing breaks. nats-outbox compares `scheduled_at`, stamped on the writer's clock,
/// with its relay's (relay/polling.py): its relay a minute behind sends nothing written after
/// the step, and its verdict names the step that broke its promise; the server's step moves
/// neither clock of that comparison.
#[test]
fn the_clocks_table_shows_what_a_step_of_each_clock_breaks() {
    // On throwaway clusters of the zoo's own: the server's clock is stepped there only.
    let results = scratch_dir("zoo-clocks");
    let output = outbox_lab()
        .args(["zoo", "--format", "json", "--results-dir"])
        .arg(&results)
        .args(["--documented", "--clocks", "article", "nats_outbox"])
        .output()
        .expect("outbox-lab runs");
    let run = Run::from(output);
    assert_passed(&run);
    let rows = run.table("clocks")["rows"].clone();
    let row = |entry: &str, step: &str| {
        let rows = rows.as_array().unwrap();
        let found = rows.iter().find(|r| r[0] == entry && r[1] == step);
        found
            .unwrap_or_else(|| panic!("no {entry} {step} row in {rows:?}"))
            .clone()
    };
    for step in ["relay +60s", "relay -60s", "db +60s"] {
        let article = row("article", step);
        assert_eq!(
            (&article[2], &article[3]),
            (&"nothing".into(), &"yes".into()),
            "{article}"
        );
    }
    let behind = row("nats_outbox", "relay -60s");
    assert_eq!(behind[3], "yes", "{behind}");
    assert!(behind[2].as_str().unwrap().contains("lost*"), "{behind}");
    assert!(
        behind[4]
            .as_str()
            .unwrap()
            .contains("--schedule \"clock:step:relay@250ms-60s\""),
        "{behind}"
    );
    assert!(run.metric("zoo.nats_outbox.clock_relay_behind.lost") >= 1);
    // Its own writer stamps scheduled_at with the writer's clock, as the insert does ($6): the
    // server's step moves neither side of its comparison.
    assert_eq!(run.metric("zoo.nats_outbox.clock_db_ahead.lost"), 0);
    assert_eq!(run.metric("zoo.article.clock_relay_ahead.duplicate"), 0);
    let verdicts = run.table("the zoo")["rows"].clone();
    let verdict = |entry: &str| {
        let rows = verdicts.as_array().unwrap();
        rows.iter().find(|r| r[0] == entry).unwrap()[9]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(verdict("article"), "keeps its promises (promise quoted)");
    assert!(
        verdict("nats_outbox").starts_with("BREAKS ITS PROMISE (clock:step:relay@250ms-60s): lost"),
        "{}",
        verdict("nats_outbox")
    );
}

/// A documented recovery honoured: graphile-worker without its supervisor's action
/// (`--no-force-unlock`) loses a killed worker's jobs for verify's bound, as its docs say (4
/// hours); with its `[recovery]` declared that is late, not a broken promise, and without the
/// declaration the same run breaks its promise, named with the documented schedule.
#[test]
fn a_recovery_longer_than_the_run_is_late_not_lost() {
    let dir = scratch_dir("zoo-recovery");
    let toml = std::fs::read_to_string(zoo_dir().join("graphile_worker/zoo.toml")).unwrap();
    let without_action = toml
        .replace("--poll-ms 500\"", "--poll-ms 500 --no-force-unlock\"")
        .replace(
            "broken = [\"duplicate\"]",
            "broken = [\"lost\", \"liveness\"]\nmay_break = [\"duplicate\"]",
        );
    // The same entry, its [recovery] left out.
    let recovery = without_action.find("[recovery]\n").unwrap();
    let test = without_action.find("[test]\n").unwrap();
    let undeclared = format!("{}{}", &without_action[..recovery], &without_action[test..]);
    for (name, toml) in [("late", &without_action), ("broken", &undeclared)] {
        let entry = dir.join(name);
        std::fs::create_dir_all(&entry).unwrap();
        std::fs::write(entry.join("zoo.toml"), toml).unwrap();
        for file in ["relay.js", "schema.sql", "node_modules"] {
            let from = zoo_dir().join("graphile_worker").join(file);
            std::os::unix::fs::symlink(from, entry.join(file)).unwrap();
        }
    }
    let run = zoo(&dir, &["--documented"]);
    assert_passed(&run);
    let rows = run.table("the zoo")["rows"].clone();
    let verdict = |name: &str| {
        let row = rows.as_array().unwrap().iter().find(|r| r[0] == name);
        row.unwrap_or_else(|| panic!("{rows}"))[9]
            .as_str()
            .unwrap()
            .to_string()
    };
    let late = verdict("late");
    assert!(
        late.starts_with(
            "keeps its promises; late within its documented recovery (4h): lost, liveness"
        ),
        "{late}"
    );
    let broken = verdict("broken");
    assert!(
        broken.starts_with(
            "BREAKS ITS PROMISE (documented: kill:relay:on-delivery@4): lost, liveness"
        ),
        "{broken}"
    );
}

/// `outbox-lab zoo --citations NAMES` against the zoo at `dir`: its exit code and output.
fn citations(dir: &Path, names: &[&str]) -> (i32, String) {
    let out = outbox_lab()
        .args(["zoo", "--citations", "--zoo-dir"])
        .arg(dir)
        .args(names)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

/// Every citation of every entry's prose is a `[[cite]]` whose quote is on its lines in the
/// package `scripts/setup --test` installed (a package not installed fails it too).
#[test]
fn every_citation_holds_in_the_installed_package() {
    let entries: Vec<&str> = ENTRIES
        .iter()
        .copied()
        .filter(|e| !e.ends_with("_outside"))
        .collect();
    let (code, out) = citations(&zoo_dir(), &entries);
    assert_eq!(code, 0, "{out}");
}

/// The check bites: a citation moved a line, one past its file's end, and a citation of the
/// prose that no `[[cite]]` declares each fail it, one line each.
#[test]
fn a_wrong_citation_fails() {
    let dir = zoo_copy("zoo-cite", &["graphile_worker"], |toml| {
        toml.replace("worker.js:288\"", "worker.js:287\"")
            .replace("lib.js:363-371\"", "lib.js:363-471\"")
            + "\n# see graphile-worker/dist/main.js:12\n"
    });
    // What the copy reads besides its zoo.toml: its DDL, and the installed package.
    for file in ["schema.sql", "node_modules"] {
        let entry = zoo_dir().join("graphile_worker").join(file);
        std::os::unix::fs::symlink(entry, dir.join("graphile_worker").join(file)).unwrap();
    }
    let (code, out) = citations(&dir, &["graphile_worker"]);
    assert_eq!(code, 1, "{out}");
    for wrong in [
        "'completeJob(job);' is not on graphile-worker/dist/worker.js:287",
        "graphile-worker/dist/lib.js has 448 lines, not 471",
        "main.js:12 in zoo.toml: no [[cite]] declares it",
    ] {
        assert!(out.contains(wrong), "{wrong}\n{out}");
    }
}
