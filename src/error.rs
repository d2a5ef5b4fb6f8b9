//! The typed errors that decide how outbox-lab ends, and every exit status, in one place.
//!
//! An error is an [`anyhow::Error`] chain; what it means for the exit status is told by an
//! [`Error`] somewhere in it: [`exit_status`] looks for one (the innermost wins), and an error
//! without one is bad input or a broken environment ([`exit::USAGE`]). [`one_line`] renders the
//! chain on the single line that main prints, its secrets masked.

/// Exit statuses, in one place.
pub mod exit {
    /// Every check passed (also: the reader of stdout stopped early, as `| head` does).
    pub const OK: u8 = 0;
    /// The run worked and a check failed: the article's figure was not reproduced.
    pub const CHECK_FAILED: u8 = 1;
    /// Bad input or a broken environment (an unknown name, a bad URL, an unreachable server, a
    /// missing binary, a malformed file): nothing was measured.
    pub const USAGE: u8 = 2;
    /// The harness failed in the middle of a run, after the setup worked: a child process
    /// failed unexpectedly, the server went away.
    pub const HARNESS: u8 = 3;
    /// `verify` could not judge: the run was cut short by the user's `--time-limit` before it
    /// drained, and broke no safety invariant meanwhile (Jepsen's unknown).
    pub const INCONCLUSIVE: u8 = 4;
    /// Stopped by Ctrl-C or SIGTERM (after cleaning up).
    pub const INTERRUPTED: u8 = 130;
    /// The status of a child process that died at a crash point (`_exit(86)`), so that a crash
    /// is told apart from a failure. Never outbox-lab's own exit status.
    pub const CRASHED: u8 = 86;
}

/// An error that ends outbox-lab with its own exit status ([`Error::exit_status`]).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Ctrl-C or SIGTERM (the signal's name); the run cleaned up before it ended.
    #[error("interrupted by {0}; cleaned up")]
    Interrupted(&'static str),
    /// Bad input or a broken environment, also when found after something started. Most such
    /// errors need no tag: an untagged error is one.
    #[error(transparent)]
    Usage(anyhow::Error),
    /// The harness failed mid-run, after the setup worked ([`harness`] tags an error so).
    #[error(transparent)]
    Harness(anyhow::Error),
    /// The reader of standard output went away (`outbox-lab list | head -1`): not a failure,
    /// the command just stops.
    #[error("standard output was closed by its reader")]
    StdoutClosed,
}

impl Error {
    pub fn exit_status(&self) -> u8 {
        match self {
            Error::Interrupted(_) => exit::INTERRUPTED,
            Error::Usage(_) => exit::USAGE,
            Error::Harness(_) => exit::HARNESS,
            Error::StdoutClosed => exit::OK,
        }
    }

    /// The most specific [`Error`] in a chain: the first one, or the one inside it when a
    /// [`Error::Usage`] or [`Error::Harness`] wraps another.
    pub fn find(error: &anyhow::Error) -> Option<&Error> {
        let found = error.chain().find_map(|e| e.downcast_ref::<Error>())?;
        match found {
            Error::Usage(inner) | Error::Harness(inner) => Error::find(inner).or(Some(found)),
            _ => Some(found),
        }
    }
}

/// Tags a failure in the middle of a run: `.map_err(error::harness)`. Its message is unchanged.
pub fn harness(error: anyhow::Error) -> anyhow::Error {
    Error::Harness(error).into()
}

/// Maps an error chain to its exit status.
pub fn exit_status(error: &anyhow::Error) -> u8 {
    Error::find(error).map_or(exit::USAGE, Error::exit_status)
}

/// The message of an error, cause chain included, on one line, its secrets masked (a URL in
/// any message of the chain may carry a password).
pub fn one_line(error: &anyhow::Error) -> String {
    crate::secrets::redact(&format!("{error:#}").replace('\n', " "))
}

/// A command-line error of clap's (a bad value, a missing argument) on one line, without its
/// `error: ` prefix: the message, the possible values and the usage, joined; its secrets
/// masked (clap quotes the bad value, a URL with its password).
pub fn clap_one_line(error: &clap::Error) -> String {
    let text = error.render().to_string();
    let text = text.trim_start().trim_start_matches("error:");
    let lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    crate::secrets::redact(&lines.collect::<Vec<_>>().join(" "))
}

/// A line to standard error, secrets masked ([`errln!`](crate::errln)): the progress, notes and
/// errors outbox-lab tells the person running it. A standard error that is gone (closed, a pipe
/// whose reader left) is no reason to fail the run, so a failed write is dropped.
pub fn write_stderr(text: std::fmt::Arguments) {
    use std::io::Write as _;
    let line = crate::secrets::redact(&format!("{text}\n"));
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// `eprintln!` that neither panics when standard error is gone nor shows a secret.
#[macro_export]
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::error::write_stderr(format_args!($($arg)*))
    };
}

/// A write to standard output: a reader that went away is [`Error::StdoutClosed`].
pub fn stdout_write(result: std::io::Result<()>) -> anyhow::Result<()> {
    result.map_err(|e| match e.kind() {
        std::io::ErrorKind::BrokenPipe => Error::StdoutClosed.into(),
        _ => anyhow::Error::new(e).context("cannot write to standard output"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::anyhow;

    #[test]
    fn untagged_errors_are_usage_errors() {
        let e = anyhow!("unknown scenario 'x'").context("scenario");
        assert_eq!(exit_status(&e), exit::USAGE);
    }

    #[test]
    fn each_tag_has_its_status() {
        assert_eq!(exit_status(&Error::Interrupted("SIGINT").into()), 130);
        assert_eq!(exit_status(&harness(anyhow!("child died"))), 3);
        assert_eq!(exit_status(&Error::Usage(anyhow!("no")).into()), 2);
        assert_eq!(exit_status(&Error::StdoutClosed.into()), 0);
    }

    #[test]
    fn a_tag_is_found_under_context() {
        let e = harness(anyhow!("connection closed")).context("scenario x did not run");
        assert_eq!(exit_status(&e), exit::HARNESS);
        let e = anyhow::Error::from(Error::Interrupted("SIGTERM")).context("waiting");
        assert_eq!(exit_status(&e), exit::INTERRUPTED);
    }

    #[test]
    fn the_innermost_tag_wins() {
        let inner = anyhow::Error::from(Error::Usage(anyhow!("redis-server not found")));
        assert_eq!(exit_status(&harness(inner.context("starting Redis"))), 2);
        let closed = anyhow::Error::from(Error::StdoutClosed).context("printing");
        assert_eq!(exit_status(&harness(closed)), 0);
        let stopped = anyhow::Error::from(Error::Interrupted("SIGINT"));
        assert_eq!(exit_status(&harness(stopped)), 130);
    }

    #[test]
    fn a_tag_leaves_the_message_as_it_was() {
        let plain = || anyhow!("connection closed").context("scenario x did not run");
        assert_eq!(one_line(&harness(plain())), one_line(&plain()));
        assert_eq!(
            one_line(&harness(plain()).context("outer")),
            "outer: scenario x did not run: connection closed"
        );
    }

    /// Whatever error main prints, a password in it is masked.
    #[test]
    fn one_line_shows_no_password() {
        let e = anyhow!("refused").context("cannot connect to postgres://u:s3cret@h/db");
        assert_eq!(
            one_line(&e),
            "cannot connect to postgres://u:***@h/db: refused"
        );
    }

    #[test]
    fn one_line_joins_the_chain_on_one_line() {
        let e = anyhow!("line one\nline two").context("reading");
        assert_eq!(one_line(&e), "reading: line one line two");
    }

    #[test]
    fn a_broken_pipe_on_stdout_is_a_quiet_success() {
        let pipe = std::io::Error::from(std::io::ErrorKind::BrokenPipe);
        assert_eq!(exit_status(&stdout_write(Err(pipe)).unwrap_err()), 0);
        let full = std::io::Error::from(std::io::ErrorKind::StorageFull);
        let e = stdout_write(Err(full)).unwrap_err();
        assert_eq!(exit_status(&e), exit::USAGE);
        assert!(one_line(&e).starts_with("cannot write to standard output"));
    }

    #[test]
    fn a_clap_error_is_one_line() {
        use clap::Parser;
        #[derive(Debug, Parser)]
        struct Cli {
            #[arg(long, value_enum)]
            format: Option<crate::cmd::Format>,
            #[arg(long)]
            sink: String,
        }
        let e = Cli::try_parse_from(["x", "--sink", "s", "--format", "xml"]).unwrap_err();
        let line = clap_one_line(&e);
        assert!(!line.contains('\n'), "{line}");
        assert!(
            line.starts_with("invalid value 'xml' for '--format <FORMAT>'"),
            "{line}"
        );
        assert!(line.contains("[possible values: text, json]"), "{line}");
        let e = Cli::try_parse_from(["x"]).unwrap_err();
        let line = clap_one_line(&e);
        assert!(!line.contains('\n'), "{line}");
        assert!(line.contains("--sink <SINK>"), "{line}");
        let e = Cli::try_parse_from(["x", "--sink", "s", "--format", "redis://:pw@h"]);
        let line = clap_one_line(&e.unwrap_err());
        assert!(line.contains("'redis://:***@h'"), "{line}");
    }

    #[test]
    fn a_crash_is_none_of_our_own_statuses() {
        use exit::*;
        let ours = [OK, CHECK_FAILED, USAGE, HARNESS, INCONCLUSIVE, INTERRUPTED];
        assert!(!ours.contains(&CRASHED));
    }
}
