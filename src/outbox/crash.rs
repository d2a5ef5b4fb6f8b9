//! Named crash points: where a child process dies abruptly, and how the parent asks for it.
//!
//! A crash point is one line in the code path it interrupts (`crash::point(CrashPoint::X)`).
//! The parent chooses one (`NAME@N`) in the child's spec; the child dies with
//! `_exit(`[`CRASHED`]`)` the N-th time it passes that point: no destructors, no flush, no
//! COMMIT, like the article's `os._exit(1)` (a status of its own, so that the parent tells a
//! crash from a failure without reading the child's output). Counting passes (not
//! probabilities) makes every run reproducible.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::OnceLock;

use crate::error::exit::CRASHED;

/// Every place a child can be told to die. The names are stable: users and scenario files use them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashPoint {
    WriterAfterInsertBeforeCommit,
    WriterAfterCommitBeforeSend,
    WriterAfterSendBeforeCommit,
    RelayAfterFetchBeforeSend,
    RelayAfterSendBeforeMark,
    RelayAfterMarkBeforeCommit,
    RelayAfterMarkBeforeSend,
    CdcRelayAfterSendBeforeConfirm,
    ConsumerAfterEffectBeforeCommit,
    ConsumerAfterCommitBeforeReply,
    StreamWorkerAfterApplyBeforeAck,
}

impl CrashPoint {
    pub const ALL: [CrashPoint; 11] = [
        CrashPoint::WriterAfterInsertBeforeCommit,
        CrashPoint::WriterAfterCommitBeforeSend,
        CrashPoint::WriterAfterSendBeforeCommit,
        CrashPoint::RelayAfterFetchBeforeSend,
        CrashPoint::RelayAfterSendBeforeMark,
        CrashPoint::RelayAfterMarkBeforeCommit,
        CrashPoint::RelayAfterMarkBeforeSend,
        CrashPoint::CdcRelayAfterSendBeforeConfirm,
        CrashPoint::ConsumerAfterEffectBeforeCommit,
        CrashPoint::ConsumerAfterCommitBeforeReply,
        CrashPoint::StreamWorkerAfterApplyBeforeAck,
    ];

    pub fn name(self) -> &'static str {
        match self {
            CrashPoint::WriterAfterInsertBeforeCommit => "writer-after-insert-before-commit",
            CrashPoint::WriterAfterCommitBeforeSend => "writer-after-commit-before-send",
            CrashPoint::WriterAfterSendBeforeCommit => "writer-after-send-before-commit",
            CrashPoint::RelayAfterFetchBeforeSend => "relay-after-fetch-before-send",
            CrashPoint::RelayAfterSendBeforeMark => "relay-after-send-before-mark",
            CrashPoint::RelayAfterMarkBeforeCommit => "relay-after-mark-before-commit",
            CrashPoint::RelayAfterMarkBeforeSend => "relay-after-mark-before-send",
            CrashPoint::CdcRelayAfterSendBeforeConfirm => "cdc-relay-after-send-before-confirm",
            CrashPoint::ConsumerAfterEffectBeforeCommit => "consumer-after-effect-before-commit",
            CrashPoint::ConsumerAfterCommitBeforeReply => "consumer-after-commit-before-reply",
            CrashPoint::StreamWorkerAfterApplyBeforeAck => "stream-worker-after-apply-before-ack",
        }
    }

    /// The function whose path the point interrupts, for `outbox-lab crash-points`.
    pub fn location(self) -> &'static str {
        match self {
            CrashPoint::WriterAfterInsertBeforeCommit => {
                "writer::create_order_with_events, writer::write_overlapping_pairs"
            }
            CrashPoint::WriterAfterCommitBeforeSend | CrashPoint::WriterAfterSendBeforeCommit => {
                "writer::dual_write"
            }
            CrashPoint::RelayAfterFetchBeforeSend | CrashPoint::RelayAfterSendBeforeMark => {
                "relay::deliver_rows (lock and claim relays), relay::StoredWatermarkRelay"
            }
            CrashPoint::RelayAfterMarkBeforeCommit => {
                "relay::Relay::deliver_locked_batch, relay::Relay::deliver_marked_first_batch"
            }
            CrashPoint::RelayAfterMarkBeforeSend => "relay::Relay::deliver_marked_first_batch",
            CrashPoint::CdcRelayAfterSendBeforeConfirm => "cdc::CdcRelay::deliver",
            CrashPoint::ConsumerAfterEffectBeforeCommit
            | CrashPoint::ConsumerAfterCommitBeforeReply => "consumer::apply",
            CrashPoint::StreamWorkerAfterApplyBeforeAck => "stream_consumer::StreamWorker::work",
        }
    }

    /// What dying there leaves behind.
    pub fn meaning(self) -> &'static str {
        match self {
            CrashPoint::WriterAfterInsertBeforeCommit => {
                "order and outbox row inserted, transaction never committed"
            }
            CrashPoint::WriterAfterCommitBeforeSend => {
                "dual write: order committed, event never sent"
            }
            CrashPoint::WriterAfterSendBeforeCommit => {
                "dual write: event sent for an order that never commits"
            }
            CrashPoint::RelayAfterFetchBeforeSend => {
                "batch fetched (locked or claimed), nothing sent yet"
            }
            CrashPoint::RelayAfterSendBeforeMark => {
                "event delivered, published_at not written: it is sent again"
            }
            CrashPoint::RelayAfterMarkBeforeCommit => {
                "batch marked published, the marking transaction never commits"
            }
            CrashPoint::RelayAfterMarkBeforeSend => {
                "mark-before-send: batch marked published and committed, not sent: lost"
            }
            CrashPoint::CdcRelayAfterSendBeforeConfirm => {
                "event delivered, its transaction's end not confirmed to the slot: streamed again"
            }
            CrashPoint::ConsumerAfterEffectBeforeCommit => {
                "shipment written, consumer transaction never commits, no reply"
            }
            CrashPoint::ConsumerAfterCommitBeforeReply => {
                "shipment committed, the relay never hears back"
            }
            CrashPoint::StreamWorkerAfterApplyBeforeAck => {
                "stream entries applied, never acknowledged: they stay pending"
            }
        }
    }
}

impl fmt::Display for CrashPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for CrashPoint {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        CrashPoint::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| format!("unknown crash point '{s}' (see `outbox-lab crash-points`)"))
    }
}

/// `NAME@N`: die the N-th time the point is passed (`NAME` alone means the first time).
/// Travels to a child as its `NAME@N` text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct CrashPlan {
    pub point: CrashPoint,
    pub on_pass: u32,
}

impl CrashPlan {
    pub fn new(point: CrashPoint, on_pass: u32) -> CrashPlan {
        CrashPlan { point, on_pass }
    }
}

impl fmt::Display for CrashPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.point, self.on_pass)
    }
}

impl From<CrashPlan> for String {
    fn from(plan: CrashPlan) -> String {
        plan.to_string()
    }
}

impl TryFrom<String> for CrashPlan {
    type Error = String;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        text.parse()
    }
}

impl FromStr for CrashPlan {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (name, pass) = match s.split_once('@') {
            Some((name, pass)) => {
                let pass: u32 =
                    pass.parse().ok().filter(|n| *n >= 1).ok_or_else(|| {
                        format!("'{pass}' in '{s}' is not a pass count of 1 or more")
                    })?;
                (name, pass)
            }
            None => (s, 1),
        };
        Ok(CrashPlan::new(name.parse()?, pass))
    }
}

/// An armed crash or pause: where, and the claim it must take first when several processes
/// are armed with it (only the first to reach it fires).
struct Armed {
    plan: CrashPlan,
    claim: Option<PathBuf>,
    passes: AtomicU32,
    /// Another process took its claim first: it fires here no more.
    lost_the_claim: AtomicBool,
}

impl Armed {
    /// Whether this pass of `here` fires it: its N-th, and its claim taken here (a new file,
    /// which only one process can create).
    fn fires(&self, here: CrashPoint) -> bool {
        if self.plan.point != here || self.lost_the_claim.load(Ordering::SeqCst) {
            return false;
        }
        if self.passes.fetch_add(1, Ordering::SeqCst) + 1 != self.plan.on_pass {
            return false;
        }
        let Some(claim) = &self.claim else {
            return true;
        };
        let taken = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(claim)
            .is_ok();
        if !taken {
            self.lost_the_claim.store(true, Ordering::SeqCst);
            crate::errln!("crash point {here} reached, but another process took it first");
        }
        taken
    }
}

static CRASH: OnceLock<Armed> = OnceLock::new();
static PAUSE: OnceLock<Armed> = OnceLock::new();

fn armed(plan: CrashPlan, claim: Option<PathBuf>) -> Armed {
    Armed {
        plan,
        claim,
        passes: AtomicU32::new(0),
        lost_the_claim: AtomicBool::new(false),
    }
}

/// Arms the plan for this process; called once by a child at start. With `claim` (a path no
/// file is at), several processes are armed with it, and only the first to reach it dies: it
/// creates the file first.
pub fn arm(plan: CrashPlan, claim: Option<PathBuf>) {
    let _ = CRASH.set(armed(plan, claim));
}

/// Arms a pause (explore's `pause:ROLE:STEP@N+FOR` nemesis): on the N-th pass of the point the
/// process stops itself with SIGSTOP, and the parent, which sees it stopped, sends SIGCONT when
/// the pause is over. Stopping at a named point makes a pause reproducible, as a crash is.
/// `claim`: as [`arm`]'s.
pub fn arm_pause(plan: CrashPlan, claim: Option<PathBuf>) {
    let _ = PAUSE.set(armed(plan, claim));
}

/// Passes a crash point: stops here if this is the armed pause's N-th pass, and dies here if
/// this is the armed crash's N-th pass (each only if its claim, when it has one, is taken here).
pub fn point(here: CrashPoint) {
    if PAUSE.get().is_some_and(|pause| pause.fires(here)) {
        crate::errln!("pause point {here} reached: SIGSTOP");
        // SAFETY: raise only sends a signal to this process; it has no memory effects.
        unsafe { libc::raise(libc::SIGSTOP) };
    }
    let Some(crash) = CRASH.get() else { return };
    if crash.fires(here) {
        let pass = crash.plan.on_pass;
        // For a person reading the child's output; the parent knows by the exit status.
        crate::errln!("crash point {here} reached (pass {pass}): _exit({CRASHED})");
        // SAFETY: _exit ends the process at once; nothing after it runs, which is the point.
        unsafe { libc::_exit(i32::from(CRASHED)) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every name parses back to its point, and a typo is an error.
    #[test]
    fn names_round_trip_and_typos_are_rejected() {
        for p in CrashPoint::ALL {
            assert_eq!(p.name().parse::<CrashPoint>(), Ok(p));
        }
        assert!("relay-after-send".parse::<CrashPoint>().is_err());
        assert_eq!(
            "relay-after-send-before-mark@3".parse::<CrashPlan>(),
            Ok(CrashPlan::new(CrashPoint::RelayAfterSendBeforeMark, 3))
        );
        assert!("relay-after-send-before-mark@0"
            .parse::<CrashPlan>()
            .is_err());
    }
}
