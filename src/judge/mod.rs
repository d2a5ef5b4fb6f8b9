//! The judge: the invariants, each defined once ([`invariants`]: ghost, lost, duplicate, order,
//! liveness), what happened, counted from the database after the run ([`counts`]), latency
//! summaries ([`latency`]), plans read with EXPLAIN ([`explain`]), and the scenarios' expected
//! figures held against what was measured ([`expectations`]).

pub mod counts;
pub mod expectations;
pub mod explain;
pub mod invariants;
pub mod latency;
