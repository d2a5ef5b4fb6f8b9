//! The actors' log lines. Events carry the actor as a field (`relay = "0"`); a process with no
//! subscriber (the scenario runner itself) prints none. Text is the article's form,
//! `[relay 0] outbox id=1 failed: HTTP 500`, which scenarios read back from their children;
//! `--log-format json` gives one JSON object per line for log collectors. Either way, a line's
//! secrets are masked ([`crate::secrets::redact`]): a failure may quote a URL with its password.

use std::fmt;

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The fields that name an actor, in the order they are looked for.
const ACTORS: [&str; 2] = ["relay", "consumer"];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// `[relay 0] message`, as the article prints it.
    #[default]
    Text,
    /// One JSON object per line: timestamp, level, fields.
    Json,
}

/// Installs the subscriber that prints the actors' events on stdout: ours, and the libraries'
/// warnings and errors (a client library's "connected" is not an actor's line, and a parent
/// reading its child's first line must not get it).
pub fn init(format: LogFormat) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let ours = tracing_subscriber::filter::Targets::new()
        .with_target(env!("CARGO_CRATE_NAME"), tracing::Level::TRACE)
        .with_default(tracing::Level::WARN);
    let layer = tracing_subscriber::fmt::layer().with_writer(|| RedactedStdout);
    let layer = match format {
        LogFormat::Text => layer.event_format(ArticleLine).boxed(),
        LogFormat::Json => layer.json().with_current_span(false).boxed(),
    };
    // A second init (not expected) keeps the first subscriber.
    let _ = tracing_subscriber::registry()
        .with(layer.with_filter(ours))
        .try_init();
}

/// Standard output, its secrets masked. The fmt layer writes each event whole, in one write,
/// so no URL is split between two.
struct RedactedStdout;

impl std::io::Write for RedactedStdout {
    fn write(&mut self, event: &[u8]) -> std::io::Result<usize> {
        let shown = crate::secrets::redact(&String::from_utf8_lossy(event));
        std::io::stdout().lock().write_all(shown.as_bytes())?;
        Ok(event.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stdout().flush()
    }
}

/// `[relay 0] message`.
struct ArticleLine;

impl<S, N> FormatEvent<S, N> for ArticleLine
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut fields = Fields::default();
        event.record(&mut fields);
        match fields.actor {
            Some((actor, name)) => writeln!(writer, "[{actor} {name}] {}", fields.message),
            None => writeln!(writer, "{}", fields.message),
        }
    }
}

#[derive(Default)]
struct Fields {
    actor: Option<(&'static str, String)>,
    message: String,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.record_str(field, &format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_string();
        } else if let Some(actor) = ACTORS.into_iter().find(|a| *a == field.name()) {
            self.actor = Some((actor, value.to_string()));
        }
    }
}
