//! A relay of the user's, in any language (`outbox-lab verify --relay-cmd`): its command
//! template and the values it is filled with, the environment it gets, and its process — run
//! in a process group of its own, so that a stop reaches whatever it started, with the last
//! lines it printed kept for the verdict.
//!
//! The template is split as a shell splits words (quotes, backslashes), but no shell runs it:
//! the first word is the program, so that a kill or pause nemesis hits the relay itself. A
//! relay that needs a pipeline is written `sh -c '...'`.
//!
//! When outbox-lab runs as root, the relay runs as the lab's [`RelayIdentity`] (a uid of its
//! own) in a home of its own, and can gain no privilege (no new privileges: a set-uid program
//! runs as the relay).
//!
//! A command line is readable by every local user, so a value filled into one never carries a
//! credential (the private NATS server's token, RabbitMQ's password): it is in the environment
//! only.

use std::collections::VecDeque;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use nix::sys::signal::Signal;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::Command;
use tokio::task::JoinHandle;

use super::nemesis::OwnChild;
use super::process_group::GroupLeader;
use super::run_as::{RelayHome, RelayIdentity, RunAs};
use crate::secrets::without_secrets;

/// The placeholders a template may hold, each also given in the environment.
pub const PLACEHOLDERS: [(&str, &str, &str); 10] = [
    (
        "database_url",
        "OUTBOX_LAB_DATABASE_URL",
        "postgresql://USER@... of the database holding the outbox; the password is in the \
         variable only (and PGPASSWORD)",
    ),
    (
        "dsn",
        "OUTBOX_LAB_DSN",
        "the same in libpq's keyword form (host=... port=... dbname=...); the password is in \
         the variable only (and PGPASSWORD)",
    ),
    (
        "sink_url",
        "OUTBOX_LAB_SINK_URL",
        "where to deliver: the consumer's HTTP URL (through the fault proxy), or the broker's",
    ),
    (
        "http_url",
        "OUTBOX_LAB_HTTP_URL",
        "the consumer's HTTP URL (the same as sink_url with --sink http)",
    ),
    (
        "redis_url",
        "OUTBOX_LAB_REDIS_URL",
        "the Redis' URL (empty but with --sink redis)",
    ),
    (
        "nats_url",
        "OUTBOX_LAB_NATS_URL",
        "nats://127.0.0.1:PORT (empty but with --sink nats); the token is in the variable only",
    ),
    (
        "amqp_url",
        "OUTBOX_LAB_AMQP_URL",
        "amqp://127.0.0.1:PORT/%2f (empty but with --sink amqp); the user and password are in \
         the variable only",
    ),
    (
        "kafka_url",
        "OUTBOX_LAB_KAFKA_URL",
        "kafka://127.0.0.1:PORT (empty but with --sink kafka); SASL PLAIN's user and password \
         are in the variable only",
    ),
    (
        "name",
        "OUTBOX_LAB_RELAY_NAME",
        "relay-0, relay-1, ...: which copy this is",
    ),
    (
        "index",
        "OUTBOX_LAB_RELAY_INDEX",
        "0, 1, ...: the same as a number (for a partition i/N)",
    ),
];

/// Lines of a relay's output kept for the verdict (the rest is not read).
const TAIL_LINES: usize = 20;
/// Bytes kept of one line (a longer one is cut, ending in "…"): a relay may print anything.
const LINE_BYTES: usize = 500;
/// Bytes kept of all the lines together: they end up in one error message.
const TAIL_BYTES: usize = 4000;
/// How long an ended relay's output is still read.
const OUTPUT_DRAIN: Duration = Duration::from_millis(500);

/// `--relay-cmd`, checked: split into words, placeholders known, the program found.
#[derive(Debug, Clone)]
pub struct RelayTemplate {
    pub text: String,
    words: Vec<String>,
    /// Who it runs as, when not as outbox-lab itself (which is root): each lab claims its own
    /// [`RelayIdentity`] of it.
    pub run_as: Option<RunAs>,
}

/// What a template's placeholders stand for in one run (`name` and `index` are per relay).
#[derive(Debug, Clone)]
pub struct Endpoints {
    pub database_url: String,
    pub dsn: String,
    /// libpq's own variables (PGHOST, PGPORT, PGUSER, PGDATABASE, PGPASSWORD), so that a relay
    /// reading them runs unchanged.
    pub libpq_env: Vec<(String, String)>,
    pub sink_url: String,
    pub http_url: String,
    pub redis_url: String,
    /// With its token.
    pub nats_url: String,
    /// With its user and password.
    pub amqp_url: String,
    /// With its user and password.
    pub kafka_url: String,
}

impl RelayTemplate {
    /// Checks the template without running it: an unknown `{placeholder}`, a program that is
    /// not there, or a path `run_as` cannot reach is an error that says so.
    pub fn parse(text: &str, run_as: Option<RunAs>) -> Result<RelayTemplate> {
        let words = shell_words::split(text)
            .map_err(|e| anyhow!("--relay-cmd '{text}' does not parse: {e}"))?;
        let Some(program) = words.first() else {
            bail!("--relay-cmd is empty: give the command that starts your relay");
        };
        for word in &words {
            for name in placeholders_in(word) {
                if !PLACEHOLDERS.iter().any(|(known, _, _)| *known == name) {
                    let known: Vec<String> = PLACEHOLDERS
                        .iter()
                        .map(|(p, _, _)| format!("{{{p}}}"))
                        .collect();
                    bail!(
                        "--relay-cmd: unknown placeholder {{{name}}} (known: {})",
                        known.join(", ")
                    );
                }
            }
        }
        if !program_exists(program) {
            bail!(
                "--relay-cmd: program '{program}' not found (not on PATH, or not an executable \
                 file)"
            );
        }
        if let Some(run_as) = &run_as {
            run_as.check_reachable(&words)?;
        }
        Ok(RelayTemplate {
            text: text.to_string(),
            words,
            run_as,
        })
    }

    /// The command for relay `index`, its placeholders filled in, the values also in its
    /// environment, killed if we die ([`RelayTemplate::spawn`] starts it leading a process group
    /// of its own), as `identity` in `home` if there is one.
    fn command(
        &self,
        endpoints: &Endpoints,
        index: u32,
        confined: Option<(&RelayIdentity, &RelayHome)>,
    ) -> Command {
        let name = relay_name(index);
        let index = index.to_string();
        let values: [(&str, &str); 10] = [
            ("database_url", &endpoints.database_url),
            ("dsn", &endpoints.dsn),
            ("sink_url", &endpoints.sink_url),
            ("http_url", &endpoints.http_url),
            ("redis_url", &endpoints.redis_url),
            ("nats_url", &endpoints.nats_url),
            ("amqp_url", &endpoints.amqp_url),
            ("kafka_url", &endpoints.kafka_url),
            ("name", &name),
            ("index", &index),
        ];
        let fill = |word: &str| {
            values.iter().fold(word.to_string(), |word, (p, value)| {
                word.replace(&format!("{{{p}}}"), &without_secrets(value))
            })
        };
        let mut cmd = Command::new(fill(&self.words[0]));
        if let Some((identity, home)) = confined {
            identity.confine(&mut cmd, &home.path());
        }
        cmd.args(self.words[1..].iter().map(|w| fill(w)));
        for ((placeholder, var, _), (filled, value)) in PLACEHOLDERS.iter().zip(values) {
            debug_assert_eq!(placeholder, &filled);
            cmd.env(var, value);
        }
        cmd.envs(endpoints.libpq_env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
                // A set-uid program the relay runs gains nothing: it stays the relay.
                nix::sys::prctl::set_no_new_privs()?;
                Ok(())
            });
        }
        cmd
    }

    /// The program it runs (its first word).
    pub fn program(&self) -> &str {
        &self.words[0]
    }

    /// Starts relay `index`, as `identity` (the lab's, when outbox-lab runs as root), with
    /// `env` beside what it is told (a wall clock of the run's).
    pub fn spawn(
        &self,
        endpoints: &Endpoints,
        index: u32,
        identity: Option<&RelayIdentity>,
        env: &[(String, String)],
    ) -> Result<ForeignRelay> {
        let home = identity.map(RelayIdentity::home).transpose()?;
        let confined = identity.zip(home.as_ref());
        let mut command = self.command(endpoints, index, confined);
        command.envs(env.iter().map(|(k, v)| (k, v)));
        let mut process = GroupLeader::spawn(&mut command).with_context(|| match &self.run_as {
            Some(run_as) => format!(
                "cannot start --relay-cmd '{}' as {}",
                self.text,
                run_as.describe()
            ),
            None => format!("cannot start --relay-cmd '{}'", self.text),
        })?;
        let pid = process.id().context("the relay ended before it was seen")?;
        let tail = Tail::default();
        let child = process.child_mut();
        let readers = [
            child
                .stdout
                .take()
                .map(|o| Box::new(o) as Box<dyn AsyncRead + Send + Unpin>),
            child
                .stderr
                .take()
                .map(|o| Box::new(o) as Box<dyn AsyncRead + Send + Unpin>),
        ]
        .into_iter()
        .flatten()
        .map(|output| tokio::spawn(keep_tail(output, tail.clone())))
        .collect();
        Ok(ForeignRelay {
            own: OwnChild::spawned(pid),
            process,
            _home: home,
            tail,
            readers,
            started: Instant::now(),
        })
    }
}

/// `relay-0`, `relay-1`, ...
pub fn relay_name(index: u32) -> String {
    format!("relay-{index}")
}

/// The last lines a relay printed, readable while it runs and after.
#[derive(Debug, Clone, Default)]
pub struct Tail(Arc<Mutex<VecDeque<String>>>);

impl Tail {
    pub fn lines(&self) -> Vec<String> {
        self.0
            .lock()
            .expect("not poisoned")
            .iter()
            .cloned()
            .collect()
    }

    /// Keeps `line` (cut to [`LINE_BYTES`]), the oldest lines going beyond [`TAIL_LINES`] or
    /// [`TAIL_BYTES`].
    fn push(&self, line: &[u8]) {
        let line = String::from_utf8_lossy(line);
        let line = line.strip_suffix('\r').unwrap_or(&line);
        let line = match line.len() > LINE_BYTES {
            true => {
                let mut end = LINE_BYTES;
                while !line.is_char_boundary(end) {
                    end -= 1;
                }
                format!("{}…", &line[..end])
            }
            false => line.to_string(),
        };
        let mut tail = self.0.lock().expect("not poisoned");
        tail.push_back(line);
        while tail.len() > TAIL_LINES || tail.iter().map(String::len).sum::<usize>() > TAIL_BYTES {
            tail.pop_front();
        }
    }
}

/// A running relay of the user's.
pub struct ForeignRelay {
    /// The relay's process, leading the group of whatever it starts.
    process: GroupLeader,
    /// Proven ours when spawned: what a nemesis signals.
    own: Option<OwnChild>,
    tail: Tail,
    /// The tasks reading its stdout and stderr into the tail.
    readers: Vec<JoinHandle<()>>,
    pub started: Instant,
    /// Its HOME and TMPDIR when it runs as another user: removed after it (a field dropped
    /// after `process`, whose drop kills its group).
    _home: Option<RelayHome>,
}

impl ForeignRelay {
    /// The process a nemesis may signal.
    pub fn own(&self) -> Option<OwnChild> {
        self.own
    }

    /// Resolves when it has ended, and whatever it started with it (cancel-safe).
    /// Its last lines are all in the tail then (read to the end of its output, or for at most
    /// [`OUTPUT_DRAIN`]).
    pub async fn exited(&mut self) -> Result<ExitStatus> {
        let status = self.process.wait().await?;
        for reader in std::mem::take(&mut self.readers) {
            let _ = tokio::time::timeout(OUTPUT_DRAIN, reader).await;
        }
        Ok(status)
    }

    /// SIGTERM to its group, SIGKILL to the group once it has ended or after `grace`; how it
    /// ended.
    pub async fn stop(mut self, grace: Duration) -> Result<ExitStatus> {
        Ok(self.process.stop(grace).await?)
    }

    /// The last lines it printed (stdout and stderr, as they came).
    pub fn tail(&self) -> Tail {
        self.tail.clone()
    }
}

/// Keeps the last lines of `output` in `tail`, holding no more of a line than is kept.
async fn keep_tail(output: impl AsyncRead + Unpin, tail: Tail) {
    let mut output = BufReader::new(output);
    let mut line = Vec::new();
    loop {
        let chunk = match output.fill_buf().await {
            Ok([]) | Err(_) => break,
            Ok(chunk) => chunk,
        };
        let newline = chunk.iter().position(|b| *b == b'\n');
        let part = &chunk[..newline.unwrap_or(chunk.len())];
        // One byte beyond what is kept: enough to tell that the line was cut.
        let room = (LINE_BYTES + 1).saturating_sub(line.len());
        line.extend_from_slice(&part[..part.len().min(room)]);
        let used = newline.map_or(chunk.len(), |at| at + 1);
        output.consume(used);
        if newline.is_some() {
            tail.push(&std::mem::take(&mut line));
        }
    }
    if !line.is_empty() {
        tail.push(&line);
    }
}

/// The `{name}`s in a word.
fn placeholders_in(word: &str) -> Vec<&str> {
    let mut found = Vec::new();
    let mut rest = word;
    while let Some(open) = rest.find('{') {
        let Some(len) = rest[open + 1..].find('}') else {
            break;
        };
        found.push(&rest[open + 1..open + 1 + len]);
        rest = &rest[open + 1 + len + 1..];
    }
    found
}

/// A path to an executable file, or a name found on PATH.
fn program_exists(program: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let executable = |path: &std::path::Path| {
        path.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        return executable(std::path::Path::new(program));
    }
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| executable(&dir.join(program))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_are_checked() {
        let t = RelayTemplate::parse("sh -c 'echo {name} {database_url}'", None).unwrap();
        assert_eq!(t.words, ["sh", "-c", "echo {name} {database_url}"]);
        let err = |t: &str| RelayTemplate::parse(t, None).unwrap_err().to_string();
        assert!(err("sh {bogus}").contains("unknown placeholder {bogus}"));
        assert!(err("no-such-relay-xyz --x").contains("not found"));
        assert!(err("sh 'unclosed").contains("does not parse"));
        assert!(err("").contains("empty"));
    }

    /// A relay's kept lines are bounded each and together: a 10 MB line (multibyte, no
    /// newline at its end) and many long lines keep at most what fits an error message.
    #[tokio::test]
    async fn the_tail_is_bounded() {
        let tail = Tail::default();
        let mut output = b"first\r\n".to_vec();
        output.extend("é".repeat(5_000_000).as_bytes());
        keep_tail(&output[..], tail.clone()).await;
        let lines = tail.lines();
        assert_eq!(lines[0], "first");
        assert!(
            lines[1].len() <= LINE_BYTES + "…".len(),
            "{}",
            lines[1].len()
        );
        assert!(lines[1].ends_with("é…"));

        let tail = Tail::default();
        let output = format!("{}\n", "x".repeat(LINE_BYTES)).repeat(50);
        keep_tail(output.as_bytes(), tail.clone()).await;
        let lines = tail.lines();
        assert!(lines.iter().all(|l| l.len() == LINE_BYTES));
        assert!(lines.iter().map(String::len).sum::<usize>() <= TAIL_BYTES);
        assert_eq!(lines.len(), TAIL_BYTES / LINE_BYTES);
    }
}
