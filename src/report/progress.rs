//! Progress bars for the long steps of a run (loading 200,000 rows, throughput cells, latency
//! modes, scenario after scenario in `all`). They are drawn on stderr, and only for a person
//! watching: when stderr is a terminal, and neither `--quiet` nor `--format json` was given.
//! Everywhere else every bar is hidden, so stdout carries nothing but the results.
//! Colours come from the `console` crate, which honours `NO_COLOR`.

use std::borrow::Cow;
use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How often a bar without its own steps (a wait) is redrawn.
const TICK: Duration = Duration::from_millis(120);

/// Where the bars of a run go; cheap to share (clones draw on the same lines).
#[derive(Clone, Default)]
pub struct Progress {
    /// `None`: nobody watches, every bar is hidden.
    shown: Option<MultiProgress>,
}

impl Progress {
    /// Bars on stderr if `wanted` (no `--quiet`, text output) and stderr is a terminal.
    pub fn on_stderr(wanted: bool) -> Progress {
        let shown = (wanted && std::io::stderr().is_terminal())
            .then(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr()));
        Progress { shown }
    }

    /// No bars at all (tests, child processes).
    pub fn hidden() -> Progress {
        Progress::default()
    }

    /// A bar of `len` steps, labelled `what`; hidden when nobody watches. Finish it with
    /// `finish_and_clear` so the terminal keeps only the results.
    pub fn bar(&self, len: u64, what: impl Into<Cow<'static, str>>) -> ProgressBar {
        let Some(multi) = &self.shown else {
            return ProgressBar::hidden();
        };
        let style = ProgressStyle::with_template(
            "{spinner:.cyan} {msg:32!} [{bar:30.cyan/blue}] {human_pos}/{human_len} {elapsed}",
        )
        .expect("a valid template")
        .progress_chars("=> ");
        let bar = multi.add(ProgressBar::new(len).with_style(style).with_message(what));
        bar.enable_steady_tick(TICK);
        bar
    }

    /// Runs `print` (which writes to stdout) with the bars lifted off the terminal, so the two
    /// streams do not interleave on one screen.
    pub fn suspend<R>(&self, print: impl FnOnce() -> R) -> R {
        match &self.shown {
            Some(multi) => multi.suspend(print),
            None => print(),
        }
    }
}
