//! The README and docs/ stay true: every command in their `sh` blocks parses as written (its
//! subcommand, flags and values; its scenario, design and schedule names), the files they name
//! exist, and the README's "Where things are" table names every file and folder of src/.
//! Nothing is run: the commands are parsed with outbox-lab's own `Cli`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::Parser;
use outbox_lab::cmd::Cli;
use outbox_lab::explore::designs::Design;
use outbox_lab::explore::schedule::Schedule;
use outbox_lab::scenarios::Scenario;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and every docs/*.md, with their text.
fn pages() -> Vec<(String, String)> {
    let mut names = vec![PathBuf::from("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .map(|p| p.strip_prefix(root()).unwrap().to_path_buf())
        .collect();
    docs.sort();
    names.extend(docs);
    names
        .into_iter()
        .map(|name| {
            let text = std::fs::read_to_string(root().join(&name)).unwrap();
            (name.display().to_string(), text)
        })
        .collect()
}

/// The command lines of a page's `sh` blocks, continuation lines joined, with their line numbers.
fn sh_lines(text: &str) -> Vec<(usize, String)> {
    let mut lines = Vec::new();
    let mut in_sh = false;
    let mut pending: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        if line.starts_with("```") {
            in_sh = line.trim() == "```sh";
            continue;
        }
        if !in_sh {
            continue;
        }
        let (start, mut joined) = pending.take().unwrap_or((i + 1, String::new()));
        match line.strip_suffix('\\') {
            Some(head) => {
                joined.push_str(head);
                pending = Some((start, joined));
            }
            None => {
                joined.push_str(line);
                lines.push((start, joined));
            }
        }
    }
    lines
}

/// The commands of a shell line: its words up to a comment, split at `&&`, `|` and `;`, each
/// with the variables assigned before it; a redirection ends a command.
fn commands(line: &str) -> Vec<(BTreeMap<String, String>, Vec<String>)> {
    let words = shell_words::split(line).unwrap_or_else(|e| panic!("{line}: {e}"));
    let mut commands = Vec::new();
    let mut env = BTreeMap::new();
    let mut words_of_one: Vec<String> = Vec::new();
    let mut redirected = false;
    for word in words {
        if word.starts_with('#') {
            break;
        }
        if ["&&", "|", ";"].contains(&word.as_str()) {
            commands.push((std::mem::take(&mut env), std::mem::take(&mut words_of_one)));
            redirected = false;
            continue;
        }
        if redirected || word.starts_with('>') || word.starts_with("2>") {
            redirected = true;
            continue;
        }
        match word.split_once('=') {
            Some((name, value))
                if words_of_one.is_empty()
                    && !name.is_empty()
                    && name.chars().all(|c| c.is_ascii_uppercase() || c == '_') =>
            {
                env.insert(name.to_string(), value.to_string());
            }
            _ => words_of_one.push(word),
        }
    }
    commands.push((env, words_of_one));
    commands.retain(|(_, words)| !words.is_empty());
    commands
}

/// The arguments of an outbox-lab command (`cargo run [...] --` counts as one), or `None`.
fn outbox_lab_args(words: &[String]) -> Option<Vec<String>> {
    match words.first().map(String::as_str) {
        Some("outbox-lab") => Some(words.to_vec()),
        Some("cargo") if words.get(1).map(String::as_str) == Some("run") => {
            let rest = words.iter().position(|w| w == "--")?;
            let mut args = vec!["outbox-lab".to_string()];
            args.extend(words[rest + 1..].iter().cloned());
            Some(args)
        }
        _ => None,
    }
}

/// The value of `--flag VALUE` or `--flag=VALUE`, every time it is given.
fn values_of<'a>(args: &'a [String], flag: &str) -> Vec<&'a str> {
    let mut values = Vec::new();
    for (i, arg) in args.iter().enumerate() {
        if arg == flag {
            if let Some(value) = args.get(i + 1) {
                values.push(value.as_str());
            }
        } else if let Some(value) = arg.strip_prefix(flag).and_then(|v| v.strip_prefix('=')) {
            values.push(value);
        }
    }
    values
}

/// Parses one outbox-lab command as its `Cli` would, with `env` set meanwhile; then the names
/// clap does not know: the scenario, explore's designs and schedule.
fn check_command(args: &[String], env: &BTreeMap<String, String>) -> Result<(), String> {
    for (name, value) in env {
        std::env::set_var(name, value);
    }
    let parsed = Cli::try_parse_from(args);
    for name in env.keys() {
        std::env::remove_var(name);
    }
    if let Err(e) = parsed {
        use clap::error::ErrorKind::{DisplayHelp, DisplayVersion};
        if !matches!(e.kind(), DisplayHelp | DisplayVersion) {
            return Err(e.to_string());
        }
    }
    match args.get(1).map(String::as_str) {
        Some("scenario") => {
            let names = args[2..].iter().find(|a| !a.starts_with('-')).unwrap();
            for name in names.split(',') {
                if name != "all" && Scenario::find(name).is_none() {
                    return Err(format!("no scenario named {name}"));
                }
            }
        }
        Some("explore") => {
            for design in values_of(args, "--design") {
                Design::find(design)?;
            }
            for schedule in values_of(args, "--schedule") {
                schedule.parse::<Schedule>()?;
            }
        }
        Some("verify") => {
            // A relay command of outbox-lab's own parses as it will run: its placeholders
            // filled in, its database and sink in its environment, as verify hands them over.
            let filled = [
                ("{database_url}", "postgresql://u@h/db"),
                ("{dsn}", "host=h dbname=db"),
                ("{sink_url}", "http://127.0.0.1:1/"),
                ("{http_url}", "http://127.0.0.1:1/"),
                ("{redis_url}", "redis+unix:///tmp/redis.sock"),
                ("{nats_url}", "nats://127.0.0.1:4222"),
                ("{amqp_url}", "amqp://127.0.0.1:5672/%2f"),
                ("{name}", "relay-0"),
                ("{index}", "0"),
            ];
            for relay in values_of(args, "--relay-cmd") {
                let relay = filled
                    .iter()
                    .fold(relay.to_string(), |r, (from, to)| r.replace(from, to));
                let words = shell_words::split(&relay).map_err(|e| e.to_string())?;
                if words.first().map(String::as_str) == Some("outbox-lab") {
                    let env = BTreeMap::from([
                        (
                            "OUTBOX_LAB_DATABASE_URL".into(),
                            "postgresql://u@h/db".into(),
                        ),
                        ("OUTBOX_LAB_SINK_URL".into(), "http://127.0.0.1:1".into()),
                    ]);
                    check_command(&words, &env).map_err(|e| format!("--relay-cmd: {e}"))?;
                }
            }
        }
        _ => {}
    }
    Ok(())
}

#[test]
fn every_command_in_the_readme_and_docs_parses() {
    let mut checked = 0;
    let mut failures = Vec::new();
    for (page, text) in pages() {
        for (line_number, line) in sh_lines(&text) {
            for (env, words) in commands(&line) {
                let at = format!("{page}:{line_number}: {}", words.join(" "));
                if let Some(args) = outbox_lab_args(&words) {
                    checked += 1;
                    if let Err(e) = check_command(&args, &env) {
                        failures.push(format!("{at}\n  {}", e.trim().replace('\n', "\n  ")));
                    }
                } else if (words[0].starts_with("scripts/") || words[0].starts_with("examples/"))
                    && !root().join(&words[0]).is_file()
                {
                    failures.push(format!("{at}\n  no such file: {}", words[0]));
                }
            }
        }
    }
    assert!(checked > 30, "only {checked} outbox-lab commands found");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Every path in backquotes under src/, scenarios/, examples/, tests/ or scripts/ exists
/// (`` `src/judge/record.rs` ``; placeholders such as `scenarios/NAME.toml` aside).
#[test]
fn every_path_the_readme_and_docs_name_exists() {
    let mut failures = Vec::new();
    for (page, text) in pages() {
        for (i, quoted) in text.split('`').enumerate() {
            let is_path = ["src/", "scenarios/", "examples/", "tests/", "scripts/"]
                .iter()
                .any(|p| quoted.starts_with(p))
                && !quoted.contains(['*', ' ', '<'])
                && !quoted.contains(|c: char| c.is_ascii_uppercase()); // NAME, MODULE
            if i % 2 == 1 && is_path && !root().join(quoted).exists() {
                failures.push(format!("{page}: `{quoted}` does not exist"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The README's "Where things are" table names every file and folder under src/: each as
/// `src/DIR/NAME` anywhere in the table, or as `NAME` (`NAME/` for a folder) in the row of
/// `src/DIR/`. And what a folder's row names is in that folder.
#[test]
fn the_readmes_map_matches_the_tree() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let section = readme
        .split("\n## Where things are\n")
        .nth(1)
        .expect("a section 'Where things are'");
    let section = section.split("\n## ").next().unwrap();
    let rows: Vec<&str> = section.lines().filter(|l| l.starts_with("| `")).collect();
    let row_of = |dir: &str| {
        rows.iter()
            .find(|row| row.starts_with(&format!("| `{dir}/` |")))
            .copied()
    };
    let quoted = |text: &str| -> Vec<String> {
        text.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect()
    };
    let mut failures = Vec::new();
    let mut dirs = vec![PathBuf::from("src")];
    while let Some(dir) = dirs.pop() {
        let dir_name = dir.display().to_string();
        let row = row_of(&dir_name);
        let names_in_row = row.map(quoted).unwrap_or_default();
        let mut entries: Vec<_> = std::fs::read_dir(root().join(&dir))
            .unwrap()
            .map(|e| e.unwrap())
            .collect();
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let name = entry.file_name().to_string_lossy().to_string();
            let is_dir = entry.file_type().unwrap().is_dir();
            let full = format!("{dir_name}/{name}");
            let short = if is_dir { format!("{name}/") } else { name };
            if is_dir {
                dirs.push(dir.join(entry.file_name()));
            }
            let in_table = rows.iter().any(|row| {
                quoted(row)
                    .iter()
                    .any(|q| *q == full || *q == format!("{full}/"))
            });
            if !in_table && !names_in_row.contains(&short) {
                failures.push(format!("{full} is not in the README's map"));
            }
        }
        // What the row names as a file or folder of its own is there.
        for name in names_in_row.iter().skip(1) {
            let looks_like_entry = (name.ends_with(".rs") || name.ends_with('/'))
                && !name.contains(['*', ' '])
                && !name.starts_with("src/");
            if looks_like_entry && !root().join(&dir).join(name).exists() {
                failures.push(format!("the row of {dir_name}/ names {name}, not in it"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
