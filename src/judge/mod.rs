//! The judge: the invariants, each defined once ([`invariants`]: ghost, lost, duplicate, order,
//! liveness), what happened, counted from the database after the run ([`counts`]), latency
//! summaries ([`latency`]), plans read with EXPLAIN ([`explain`]), the scenarios' expected
//! figures held against what was measured ([`expectations`]), judging a consumer whose tables
//! live in another database ([`two_databases`]), and what it records of a foreign relay's run
//! for itself ([`record`]).

pub mod counts;
pub mod expectations;
pub mod explain;
pub mod invariants;
pub mod latency;
pub mod record;
pub mod two_databases;
