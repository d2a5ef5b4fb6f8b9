//! outbox-lab: a laboratory for the Transactional Outbox pattern on PostgreSQL.
//!
//! The folders are the architecture:
//! - [`outbox`]: the system under test — writer, relay (lock, claim, watermarks, CDC), sinks,
//!   consumers, and the named crash points where they die.
//! - [`harness`]: what sets the stage — throwaway PostgreSQL and Redis, the run's databases,
//!   child processes, the fault-injecting proxy.
//! - [`judge`]: what happened, counted from the database after the run, held against what the
//!   article expects.
//! - [`scenarios`]: the article's experiments, one file each, with their TOML files.
//! - [`explore`]: every crash point against every design, judged by an invariant checker.
//! - [`verify`]: anyone's relay under the same nemeses and checker; [`zoo`]: the outbox
//!   libraries people install, each under verify, side by side.
//! - [`report`]: tables, JSON/CSV, the report page and its plots, comparisons.
//! - [`ops`]: the actors as long-running processes, and outbox housekeeping.
//! - [`cmd`]: the command line, one file per subcommand.
//! - [`error`]: the typed errors that end a command, and every exit status.
//! - [`connect`]: connecting to PostgreSQL and Redis, for every part of the house; [`wait`]: the
//!   one bounded wait.
//! - [`secrets`]: the one redaction of passwords and tokens, for everything printed or written,
//!   and the form of a connection string that may stand on a command line.
//! - [`stats`]: the median and spread of a figure measured in several rounds.
//!
//! One scenario's path: `cmd` parses `scenario relay-crash`; `scenarios` loads its TOML, asks
//! `harness` for a database, starts `outbox` actors as child processes that die at a crash
//! point, `judge` counts the damage with SQL, and `report` prints and stores the result.

pub mod cmd;
pub mod connect;
pub mod error;
pub mod explore;
pub mod harness;
pub mod judge;
pub mod ops;
pub mod outbox;
pub mod report;
pub mod scenarios;
pub mod secrets;
pub mod stats;
pub mod verify;
pub mod wait;
pub mod zoo;
