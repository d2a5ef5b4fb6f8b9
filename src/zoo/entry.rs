//! A zoo entry: `examples/zoo/<name>/zoo.toml`, what it says of its library (version, registry,
//! promise, design) and how `verify` runs the library's own loop (relay command, sink, schema,
//! insert, pending count), with the short run whose verdict the entry documents.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::ValueEnum;
use serde::Deserialize;

use super::cite::{self, Citation, CiteFile};
use super::Settings;
use crate::harness::replicated::Replication;
use crate::harness::run_as::RunAs;
use crate::judge::invariants::Invariant;
use crate::outbox::consumer::ConsumerKind;
use crate::verify::plan::{Options, VerifySink};

/// Where the zoo lives in a checkout.
pub const ZOO_DIR: &str = "examples/zoo";

/// `zoo.toml`, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryFile {
    library: String,
    version: String,
    /// PyPI, npm, crates.io, or reference (outbox-lab's own relays).
    registry: String,
    home: String,
    /// What the library's documentation promises, in its words.
    promise: String,
    /// Where its documentation promises nothing in words, what the zoo infers its promise from
    /// (`x-idempotent-key`: at-least-once); the verdict says so.
    #[serde(default)]
    promise_inferred: Option<String>,
    /// How its loop claims, sends and marks, from its source.
    design: String,
    /// Whether it promises per-aggregate order.
    #[serde(default)]
    order: bool,
    sink: String,
    relays: u32,
    /// The library inside its own documented constraints.
    relay_cmd: String,
    /// Where the entry's own settings cannot be made to fit a rule of the library's
    /// documentation in the worst case its runs produce: which, and why (its row says so).
    #[serde(default)]
    outside_its_rules: Option<String>,
    /// What its documentation says a crash costs and what it advises doing about it.
    #[serde(default)]
    recovery: Option<RecoveryFile>,
    /// A file of the entry's folder that exists once `scripts/setup --zoo` installed it.
    #[serde(default)]
    installed: Option<String>,
    #[serde(default)]
    schema: Option<String>,
    #[serde(default)]
    insert_sql: Option<String>,
    #[serde(default)]
    pending_sql: Option<String>,
    test: DocumentedFile,
    /// A second row, `<name>_outside`: settings its documentation warns against, which a
    /// finding needs.
    #[serde(default)]
    outside: Option<OutsideFile>,
    /// Every citation of the library's source that its prose makes, with a quote.
    #[serde(default)]
    cite: Vec<CiteFile>,
}

/// `[recovery]`: a crashed relay's events, as its documentation says they come back.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RecoveryFile {
    /// How long they wait without the action: `4h`, `10m`, `90s`.
    after: String,
    /// What the supervisor does when it restarts the relay, as the documentation advises (the
    /// entry's relay command does it).
    action: String,
    /// Why nothing undelivered is gone meanwhile: an event not delivered within verify's bound
    /// is late, not lost, only where the library keeps every undelivered row.
    kept: String,
}

/// `[outside]`: the entry run outside its library's documented constraints.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OutsideFile {
    /// Which settings, and the rule of the library's documentation they break.
    rules: String,
    relay_cmd: String,
    /// Copies at once, if not the entry's (a library meant to run alone, run twice).
    #[serde(default)]
    relays: Option<u32>,
    /// A DDL of its own (a queue's lease is the queue's), else the entry's.
    #[serde(default)]
    schema: Option<String>,
    test: DocumentedFile,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DocumentedFile {
    consumer: String,
    schedule: String,
    events: u32,
    broken: Vec<String>,
    /// Kinds that timing decides in this run (not promised, and not in `broken`): tolerated.
    #[serde(default)]
    may_break: Vec<String>,
    why: String,
}

/// One library of the zoo, ready to run.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Its folder's name.
    pub name: String,
    pub dir: PathBuf,
    pub library: String,
    pub version: String,
    pub registry: String,
    pub home: String,
    pub promise: String,
    /// `None`: the promise is quoted; else what the zoo infers it from.
    pub promise_inferred: Option<String>,
    pub design: String,
    pub sink: VerifySink,
    pub relays: u32,
    /// The relay command, `{entry}` and `{outbox_lab}` filled in.
    pub relay_cmd: String,
    /// Its settings outside the library's documented constraints, and the rule they break: the
    /// `_outside` row's, or an entry's whose settings cannot be made to fit.
    pub outside_rules: Option<String>,
    pub recovery: Option<Recovery>,
    pub installed: Option<PathBuf>,
    pub schema: Option<(String, String)>,
    pub insert_sql: Option<String>,
    pub pending_sql: Option<String>,
    /// The invariants its documentation promises: no ghost, none lost, liveness (at least
    /// once), and order where it says so. Duplicates are the consumer's to absorb.
    pub promises: Vec<Invariant>,
    pub documented: DocumentedRun,
    /// Its `[[cite]]`s: where its prose's claims about the library's source rest.
    pub citations: Vec<Citation>,
}

/// A documented recovery: a crashed relay's events come back `after` (the documentation's
/// words in `label`), sooner by `action`.
#[derive(Debug, Clone)]
pub struct Recovery {
    pub after: Duration,
    pub label: String,
    pub action: String,
    pub kept: String,
}

impl Recovery {
    fn from_file(file: RecoveryFile) -> Result<Recovery> {
        let bad = || {
            anyhow!(
                "[recovery] after = '{}': a duration like 4h, 10m or 90s",
                file.after
            )
        };
        let (number, unit_s) = match file.after.split_at(file.after.len().saturating_sub(1)) {
            (n, "h") => (n, 3600),
            (n, "m") => (n, 60),
            (n, "s") => (n, 1),
            _ => return Err(bad()),
        };
        let number: u64 = number.parse().map_err(|_| bad())?;
        Ok(Recovery {
            after: Duration::from_secs(number * unit_s),
            label: file.after,
            action: file.action,
            kept: file.kept,
        })
    }
}

/// The short run an entry documents, and the verdict it found.
#[derive(Debug, Clone)]
pub struct DocumentedRun {
    pub consumer: ConsumerKind,
    pub schedule: String,
    pub events: u32,
    pub broken: Vec<Invariant>,
    /// Broken in some runs and not in others, by timing alone: neither required nor a failure.
    pub may_break: Vec<Invariant>,
    pub why: String,
}

impl DocumentedRun {
    fn from_file(test: DocumentedFile) -> Result<DocumentedRun> {
        let consumer = ConsumerKind::from_str(&test.consumer, false)
            .map_err(|_| anyhow!("consumer '{}': naive or idempotent", test.consumer))?;
        let invariants = |names: &[String]| -> Result<Vec<Invariant>> {
            names.iter().map(|name| invariant(name)).collect()
        };
        let broken = invariants(&test.broken)?;
        let may_break = invariants(&test.may_break)?;
        if let Some(both) = may_break.iter().find(|i| broken.contains(i)) {
            bail!(
                "'{}' is in both broken and may_break: it breaks, or timing decides",
                both.name()
            );
        }
        Ok(DocumentedRun {
            consumer,
            schedule: test.schedule,
            events: test.events,
            broken,
            may_break,
            why: test.why,
        })
    }
}

/// The name of an entry's row outside its library's documented constraints: `txoutbox_outside`.
pub const OUTSIDE_SUFFIX: &str = "_outside";

impl Entry {
    /// The entries of `zoo_dir` (every folder with a zoo.toml), by name; `names` picks some.
    pub fn find(zoo_dir: &Path, names: &[String]) -> Result<Vec<Entry>> {
        let listing = std::fs::read_dir(zoo_dir).with_context(|| {
            format!(
                "cannot read the zoo at {}: run outbox-lab zoo from the project's checkout, or \
                 give --zoo-dir",
                zoo_dir.display()
            )
        })?;
        let mut dirs: Vec<PathBuf> = listing
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|path| path.join("zoo.toml").is_file())
            .collect();
        dirs.sort();
        let entries: Vec<Entry> = dirs
            .iter()
            .map(|dir| Entry::load(dir))
            .collect::<Result<Vec<_>>>()?
            .into_iter()
            .flatten()
            .collect();
        for name in names {
            if !entries.iter().any(|e| &e.name == name) {
                let known: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
                bail!("no zoo entry '{name}' (known: {})", known.join(", "));
            }
        }
        Ok(entries
            .into_iter()
            .filter(|e| names.is_empty() || names.contains(&e.name))
            .collect())
    }

    /// Reads `dir/zoo.toml`: its entry, and its `_outside` row if it has one.
    fn load(dir: &Path) -> Result<Vec<Entry>> {
        let path = dir.join("zoo.toml");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let file: EntryFile =
            toml::from_str(&text).map_err(|e| anyhow!("{}: {}", path.display(), e.message()))?;
        Entry::from_file(dir, file).with_context(|| path.display().to_string())
    }

    fn from_file(dir: &Path, file: EntryFile) -> Result<Vec<Entry>> {
        let name = dir
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| anyhow!("a zoo entry's folder name must be UTF-8"))?
            .to_string();
        let sink = VerifySink::from_str(&file.sink, false)
            .map_err(|_| anyhow!("sink '{}': http, redis, nats, amqp or kafka", file.sink))?;
        let dir_text = dir.display().to_string();
        let outbox_lab = std::env::current_exe().context("where is outbox-lab's own binary?")?;
        let fill = |relay_cmd: &str| {
            relay_cmd
                .replace("{entry}", &dir_text)
                .replace("{outbox_lab}", &outbox_lab.display().to_string())
        };
        let read_schema = |schema: &Option<String>| -> Result<Option<(String, String)>> {
            let Some(schema) = schema else {
                return Ok(None);
            };
            let path = dir.join(schema);
            let ddl = std::fs::read_to_string(&path)
                .with_context(|| format!("schema: cannot read {}", path.display()))?;
            Ok(Some((path.display().to_string(), ddl)))
        };
        if file.insert_sql.is_some() && file.pending_sql.is_none() {
            bail!("insert_sql needs pending_sql: what counts the events still to deliver");
        }
        let mut promises = vec![Invariant::Ghost, Invariant::Lost, Invariant::Liveness];
        if file.order {
            promises.push(Invariant::Order);
        }
        promises.sort();
        let inside = Entry {
            name: name.clone(),
            dir: dir.to_path_buf(),
            library: file.library,
            version: file.version,
            registry: file.registry,
            home: file.home,
            promise: file.promise,
            promise_inferred: file.promise_inferred,
            design: file.design,
            sink,
            relays: file.relays,
            relay_cmd: fill(&file.relay_cmd),
            outside_rules: file.outside_its_rules,
            recovery: file
                .recovery
                .map(Recovery::from_file)
                .transpose()
                .context("[recovery]")?,
            installed: file.installed.map(|path| dir.join(path)),
            schema: read_schema(&file.schema)?,
            insert_sql: file.insert_sql,
            pending_sql: file.pending_sql,
            promises,
            documented: DocumentedRun::from_file(file.test).context("[test]")?,
            citations: file
                .cite
                .into_iter()
                .map(Citation::from_file)
                .collect::<Result<_>>()?,
        };
        let mut rows = vec![inside.clone()];
        if let Some(outside) = file.outside {
            rows.push(Entry {
                name: format!("{name}{OUTSIDE_SUFFIX}"),
                relay_cmd: fill(&outside.relay_cmd),
                relays: outside.relays.unwrap_or(inside.relays),
                outside_rules: Some(outside.rules),
                schema: match outside.schema {
                    Some(_) => read_schema(&outside.schema)?,
                    None => inside.schema,
                },
                documented: DocumentedRun::from_file(outside.test).context("[outside.test]")?,
                ..inside
            });
        }
        Ok(rows)
    }

    /// Whether `scripts/setup --zoo` installed its library.
    pub fn is_installed(&self) -> bool {
        self.installed.as_ref().is_none_or(|path| path.exists())
    }

    /// What is wrong with its citations: a quote not on its lines in the installed package, a
    /// line past its file's end, a citation of its prose (README, FINDING, zoo.toml, adapter)
    /// that no `[[cite]]` declares, or a file not there (the package not installed).
    pub fn citation_problems(&self) -> Result<Vec<String>> {
        let mut problems = Vec::new();
        let root = cite::installed_root(&self.registry, &self.dir)?;
        for citation in self.citations.iter().filter(|c| c.upstream.is_none()) {
            let problem = match &root {
                Some(root) => citation.check(root),
                None => Some(format!("a {} entry has no package to cite", self.registry)),
            };
            problems.extend(problem.map(|p| format!("{}: {p}", citation.at())));
        }
        // A path of the entry's own folder (its README.md, its relay) or of the zoo's
        // (`examples/zoo/zoo_sink.py`) is the zoo's own file, not the library's: a library's
        // file of the same name as one of the entry's is not told apart.
        let own = |path: &str| {
            let zoo_file = path.strip_prefix(&format!("{ZOO_DIR}/"));
            self.dir.join(path).exists()
                || zoo_file.is_some_and(|f| self.dir.join("..").join(f).exists())
        };
        let mut prose = Vec::new();
        for file in self.prose_files()? {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("cannot read {}", file.display()))?;
            prose.extend(cite::in_prose(&file, &text, own));
        }
        for cited in cite::undeclared(prose, &self.citations) {
            problems.push(format!(
                "{}:{} in {}: no [[cite]] declares it",
                cited.path,
                cited.lines,
                cited
                    .file
                    .strip_prefix(&self.dir)
                    .unwrap_or(&cited.file)
                    .display()
            ));
        }
        Ok(problems)
    }

    /// The entry's own files that may cite its library: its docs, zoo.toml, and its adapter's
    /// source (not what the setup installed beside it).
    fn prose_files(&self) -> Result<Vec<PathBuf>> {
        const INSTALLED: [&str; 3] = [".venv", "node_modules", "target"];
        const PROSE: [&str; 8] = ["md", "toml", "py", "js", "rs", "sh", "sql", "in"];
        let mut files = Vec::new();
        let mut dirs = vec![self.dir.clone()];
        while let Some(dir) = dirs.pop() {
            let listing = std::fs::read_dir(&dir)
                .with_context(|| format!("cannot read {}", dir.display()))?;
            for path in listing.filter_map(|e| e.ok().map(|e| e.path())) {
                let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
                if path.is_dir() {
                    if !name.is_some_and(|n| INSTALLED.contains(&n.as_str())) {
                        dirs.push(path);
                    }
                } else if path
                    .extension()
                    .is_some_and(|e| PROSE.contains(&e.to_string_lossy().as_ref()))
                    && !path.ends_with("schema.sql")
                {
                    files.push(path);
                }
            }
        }
        files.sort();
        Ok(files)
    }

    /// What `verify` is told for one of its runs: every invariant judged (its promises are
    /// told apart in the table), `schedule` replayed as it is, or `nemeses` shrunk.
    pub fn options(
        &self,
        run: ZooRun,
        take: u32,
        settings: Settings,
        run_as: Option<&RunAs>,
    ) -> Options {
        Options {
            // The take before the name: PostgreSQL cuts names at 63 bytes, and a suffix after a
            // long entry's name was cut off (two takes, one database name).
            label: format!("zoo{}_{}_{}", run.take_number(take), self.name, run.label()),
            relay_cmd: self.relay_cmd.clone(),
            run_as: run_as.cloned(),
            relays: self.relays,
            nemeses: match run {
                ZooRun::NoFaults => vec!["none".into()],
                ZooRun::Failover => vec!["db-failover".into()],
                ZooRun::Clock(step) => vec![step.nemesis().into()],
                _ => Vec::new(),
            },
            schedule: match run {
                ZooRun::Documented => Some(self.documented.schedule.clone()),
                _ => None,
            },
            search: match run {
                ZooRun::Search => settings.search,
                _ => None,
            },
            events: match run {
                ZooRun::Documented => self.documented.events,
                _ => settings.events,
            },
            time_limit: settings.time_limit,
            consumer: run.consumer(self),
            // The search hunts broken promises (it stops at the first); the other runs judge
            // every invariant, their promises told apart in the table.
            claims: Some(match run {
                ZooRun::Search => self.promises.iter().map(|i| i.name().to_string()).collect(),
                _ => Invariant::ALL.map(|i| i.name().to_string()).to_vec(),
            }),
            schema: self.schema.clone(),
            pending_sql: self.pending_sql.clone(),
            insert_sql: self.insert_sql.clone(),
            external_server: settings.external_server,
            sink: self.sink,
            replication: match run {
                ZooRun::Failover => Some(Replication::Sync),
                _ => None,
            },
        }
    }
}

/// The runs the zoo makes of each entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZooRun {
    /// Every nemesis the sink allows, with the naive consumer (duplicates show).
    Naive,
    /// The same, with the idempotent consumer (duplicates absorbed).
    Idempotent,
    /// No fault: latency and throughput.
    NoFaults,
    /// The entry's documented schedule, its verdict held against the documented one.
    Documented,
    /// `--search N`: schedules drawn from the nemesis grammar with the naive consumer, until one
    /// breaks a promise, shrunk.
    Search,
    /// `--failover`: the database on a primary with a synchronous standby, failed over under
    /// the library (the idempotent consumer): the database loses nothing acknowledged, so what
    /// breaks is the library's (a relay that never reconnects, a position kept on the dead
    /// primary).
    Failover,
    /// `--clocks`: a wall clock stepped a minute under the library's relays, and nothing else
    /// (the naive consumer: a lease taken early shows as duplicates).
    Clock(ClockStep),
}

/// A wall clock the zoo's `--clocks` runs step by a minute, 250 ms into the run, for the rest of
/// it (verify's `clock-step-*` nemeses; monotonic clocks stay true).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClockStep {
    /// Relay 0's, a minute ahead: a lease it computes from its own clock is taken early.
    RelayAhead,
    /// Relay 0's, a minute behind: rows it compares with its own clock are not due yet.
    RelayBehind,
    /// The database server's, a minute ahead: leases held with `now()` expire under a sender.
    DbAhead,
}

impl ClockStep {
    pub const ALL: [ClockStep; 3] = [
        ClockStep::RelayAhead,
        ClockStep::RelayBehind,
        ClockStep::DbAhead,
    ];

    /// The steps a run can make: the server's clock only on the throwaway cluster (outbox-lab
    /// sets no clock of a server of the user's).
    pub fn available(external_server: bool) -> Vec<ClockStep> {
        ClockStep::ALL
            .into_iter()
            .filter(|step| !(external_server && *step == ClockStep::DbAhead))
            .collect()
    }

    /// verify's nemesis.
    pub fn nemesis(self) -> &'static str {
        match self {
            ClockStep::RelayAhead => "clock-step-relay",
            ClockStep::RelayBehind => "clock-step-relay-back",
            ClockStep::DbAhead => "clock-step-db",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            ClockStep::RelayAhead => "clock_relay_ahead",
            ClockStep::RelayBehind => "clock_relay_behind",
            ClockStep::DbAhead => "clock_db_ahead",
        }
    }

    /// How the table names it.
    pub fn describe(self) -> &'static str {
        match self {
            ClockStep::RelayAhead => "relay +60s",
            ClockStep::RelayBehind => "relay -60s",
            ClockStep::DbAhead => "db +60s",
        }
    }
}

impl ZooRun {
    pub const ALL: [ZooRun; 4] = [
        ZooRun::Documented,
        ZooRun::Naive,
        ZooRun::Idempotent,
        ZooRun::NoFaults,
    ];

    pub fn label(self) -> &'static str {
        match self {
            ZooRun::Naive => "naive",
            ZooRun::Idempotent => "idempotent",
            ZooRun::NoFaults => "no_faults",
            ZooRun::Documented => "documented",
            ZooRun::Search => "search",
            ZooRun::Failover => "failover",
            ZooRun::Clock(step) => step.label(),
        }
    }

    /// How many times it is made: the faulted runs and the clocks' `--runs` times, the others
    /// once.
    pub fn takes(self, settings: Settings) -> u32 {
        match self {
            ZooRun::Naive | ZooRun::Idempotent | ZooRun::Clock(_) => settings.runs.max(1),
            ZooRun::NoFaults | ZooRun::Documented | ZooRun::Search | ZooRun::Failover => 1,
        }
    }

    /// The `take`-th time in a database's name: nothing for the first, `2` after.
    pub fn take_number(self, take: u32) -> String {
        match take {
            1 => String::new(),
            n => n.to_string(),
        }
    }

    /// What tells the `take`-th time apart in names: nothing for the first, `_2` after.
    pub fn take_label(self, take: u32) -> String {
        match self.take_number(take) {
            n if n.is_empty() => n,
            n => format!("_{n}"),
        }
    }

    pub fn consumer(self, entry: &Entry) -> ConsumerKind {
        match self {
            ZooRun::Naive | ZooRun::Search | ZooRun::Clock(_) => ConsumerKind::Naive,
            ZooRun::Idempotent | ZooRun::NoFaults | ZooRun::Failover => ConsumerKind::Idempotent,
            ZooRun::Documented => entry.documented.consumer,
        }
    }
}

fn invariant(name: &str) -> Result<Invariant> {
    Invariant::named(name).ok_or_else(|| {
        anyhow!("broken: unknown invariant '{name}' (ghost, lost, duplicate, order, liveness)")
    })
}
